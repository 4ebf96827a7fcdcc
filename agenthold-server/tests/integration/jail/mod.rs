//! The jail: the command must not leave it, although agenthold runs as root (issue 3, item 7; E2: no
//! NET_ADMIN, no NET_RAW). Every escape attempt runs inside the jail, where it must fail, and, as a
//! control, as root with full capabilities in a throwaway network and mount namespace that the test
//! creates (`unshare --net --mount`), where it must work: a probe that fails everywhere proves nothing.
//! Probes that would change the host if they worked (writes to system directories, signals) run only in
//! the jail; their controls ask the kernel without changing anything (`test -w` is access(2)).
//!
//! The command runs in its own PID namespace (pid 1 there is agenthold's `__jail-init`): host pids mean
//! nothing inside, so probes aimed at host processes get their pids from the test. Started by root
//! without sudo, the command is uid 0 without capabilities; what protects the host then is tested here
//! too: read-only system directories and kernel settings, the data directory (CA key, master key) and the
//! `--secrets` file hidden, secret values scrubbed from the environment, host processes out of sight, and
//! root-owned files writable in the working directory only.
//!
//! Issue 9: [`session`] (R1: own session, the relayed pty), [`view`] (R2: the allowlisted view, no host
//! socket, private /tmp and home, `--share-home`), [`reach`] (R3: every data dir, the key files and the
//! `--log` file out of reach, the log append-only).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::support::{API, Env, PYTHON, Run, status_field};

mod reach;
mod session;
mod view;

/// `out/` in the test's directory, writable by everyone (the sudo caller cannot write the test's
/// directory itself): for files the command writes.
fn writable_dir(env: &Env) -> PathBuf {
    let dir = env.path("out");
    if !dir.is_dir() {
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    dir
}

/// The uid and gid the tests give agenthold as its sudo caller (`nobody`/`nogroup` on Debian).
const CALLER: &str = "65534";

/// One escape attempt: a name, a shell command that exits 0 when the attempt worked, and whether the
/// control (full root in a throwaway namespace) is expected to succeed.
struct Probe {
    name: String,
    sh: String,
    control: bool,
}

fn probe(name: impl Into<String>, sh: impl Into<String>) -> Probe {
    Probe {
        name: name.into(),
        sh: sh.into(),
        control: true,
    }
}

/// A probe without a meaningful control, or one that would change the host if it worked there: it runs
/// only in the jail.
fn probe_jail_only(name: impl Into<String>, sh: impl Into<String>) -> Probe {
    Probe {
        name: name.into(),
        sh: sh.into(),
        control: false,
    }
}

/// What the probes did: exit code and the first 300 bytes of output, by name.
type Results = BTreeMap<String, (i32, String)>;

/// A shell script that runs every probe in order and prints `probe NAME RC OUTPUT` for each.
fn probe_script(probes: &[Probe]) -> String {
    probe_script_of(&probes.iter().collect::<Vec<_>>())
}

fn probe_script_of(probes: &[&Probe]) -> String {
    let mut script = String::new();
    for p in probes {
        script += &format!(
            "out=$( ( {} ) 2>&1 </dev/null ); rc=$?\n\
             printf 'probe %s %s %s\\n' {} \"$rc\" \"$(printf %s \"$out\" | tr '\\n' ' ' | head -c 300)\"\n",
            p.sh, p.name
        );
    }
    script
}

fn parse_results(stdout: &str) -> Results {
    stdout
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("probe ")?.splitn(3, ' ');
            let name = words.next()?.to_owned();
            let rc = words.next()?.parse().ok()?;
            Some((name, (rc, words.next().unwrap_or_default().to_owned())))
        })
        .collect()
}

/// Runs `probes` inside the jail of `run` (which must succeed as a whole).
async fn in_jail(env: &Env, run: Run<'_>, probes: &[Probe]) -> Results {
    let path = env.path("probes.sh");
    std::fs::write(&path, probe_script(probes)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run.output(&["sh", &path.display().to_string()]).await;
    out.expect_code(0);
    let results = parse_results(&out.stdout);
    assert_eq!(results.len(), probes.len(), "not every probe reported: {out:#?}");
    results
}

/// Runs the probes that have a control as root with every capability in a new network and mount
/// namespace (mounts private), with a scratch file bound over /etc/resolv.conf so that no probe touches the
/// host's. Jail-only probes never run here.
async fn in_control(env: &Env, probes: &[Probe]) -> Results {
    let probes: Vec<&Probe> = probes.iter().filter(|p| p.control).collect();
    let path = env.path("control.sh");
    let scratch = env.path("control-resolv.conf");
    std::fs::write(&scratch, "nameserver 192.0.2.53\n").unwrap();
    let script = format!(
        "ip link set lo up && mount --bind {} /etc/resolv.conf || exit 99\n{}",
        scratch.display(),
        probe_script_of(&probes)
    );
    std::fs::write(&path, script).unwrap();
    let out = tokio::process::Command::new("unshare")
        .args(["--net", "--mount", "--propagation", "private", "--fork", "sh"])
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "control setup failed: {out:?}");
    parse_results(&stdout)
}

/// Every probe must fail in the jail; those with a control must work there.
async fn assert_all_fail_inside(env: &Env, run: Run<'_>, probes: &[Probe]) {
    let jail = in_jail(env, run, probes).await;
    let control = in_control(env, probes).await;
    let mut problems = Vec::new();
    for p in probes {
        let (rc, out) = &jail[&p.name];
        if *rc == 0 {
            problems.push(format!("{}: SUCCEEDED inside the jail ({})", p.name, p.sh));
        } else {
            eprintln!("jail  {:<24} rc={rc} {out}", p.name);
        }
        if p.control {
            let (rc, out) = &control[&p.name];
            if *rc != 0 {
                problems.push(format!(
                    "{}: the control failed too (rc={rc}: {out}): the probe proves nothing",
                    p.name
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The host's network namespace bound onto a file in the test's directory (like `ip netns` does under
/// /run/netns, which the jail hides): a handle on the host's namespace. Unmounted when dropped, also when
/// the test fails.
struct HostNetnsFile {
    path: std::path::PathBuf,
}

impl HostNetnsFile {
    fn bind(env: &Env) -> Self {
        let path = env.path("host-netns");
        std::fs::write(&path, "").unwrap();
        let status = std::process::Command::new("mount")
            .arg("--bind")
            .arg(format!("/proc/{}/ns/net", std::process::id()))
            .arg(&path)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "bind the host's network namespace to {}",
            path.display()
        );
        Self { path }
    }
}

impl Drop for HostNetnsFile {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.path).status();
    }
}

// covers: issue 3 item 7 (no setns back to the host's network namespace) R2 (mounts below the working
// directory are not part of the jail's view)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn cannot_setns_back_to_the_host_network_namespace() {
    let env = Env::new().await;
    // Host processes the command could aim at: this test (root, in the host's namespaces). Inside, its
    // /proc entry does not even exist (own PID namespace); pid 1 and $PPID are the jail's own init, in
    // the sandbox's namespace. The bound namespace file below the working directory is not shown (the
    // jail binds the working directory without what is mounted below it), so the test hands the command
    // the handle as its stdin: then only the missing capability stops setns. Probes name it `$NETNS`
    // (the bound file in the control).
    let me = std::process::id();
    let host_netns = HostNetnsFile::bind(&env);
    let file = host_netns.path.display().to_string();
    let handle = format!("${{NETNS:-{file}}}");
    let probes = [
        probe(
            "nsenter_host_netns_handle",
            format!("nsenter --net={handle} true"),
        ),
        probe_jail_only(
            "userns_then_nsenter",
            in_user_namespace(&format!("nsenter --net={handle} true")),
        ),
        probe(
            "nsenter_net_test",
            format!("nsenter --net=/proc/{me}/ns/net true"),
        ),
        probe("nsenter_target_test", format!("nsenter -t {me} -n true")),
        probe("nsenter_all_test", format!("nsenter -t {me} -a true")),
        probe("open_test_netns", format!("exec 3</proc/{me}/ns/net")),
        probe("nsenter_net_parent", "nsenter --net=/proc/$PPID/ns/net true"),
        probe_jail_only("nsenter_net_pid1", "nsenter --net=/proc/1/ns/net true"),
        probe_jail_only("nsenter_target_1", "nsenter -t 1 -n true"),
    ];
    let script = env.path("setns-probes.sh");
    std::fs::write(&script, probe_script(&probes)).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let control = in_control(&env, &probes).await;
    for caller in [false, true] {
        let who = if caller { "sudo caller" } else { "root" };
        let out = run_as(&env, caller).sh(&format!("stat -f -c %T {file}")).await;
        out.expect_code(0);
        assert_ne!(
            out.stdout, "nsfs\n",
            "{who}: a mount below the working directory is visible"
        );
        let mut cmd = run_as(&env, caller).command(&[
            "sh",
            "-c",
            &format!(
                "exec 7<&0; export NETNS=/proc/self/fd/7; stat -L -f -c %T $NETNS; sh {}",
                script.display()
            ),
        ]);
        cmd.stdin(std::fs::File::open(&host_netns.path).unwrap());
        let out = crate::support::finish(cmd.spawn().unwrap()).await;
        out.expect_code(0);
        assert!(
            out.stdout.starts_with("nsfs\n"),
            "{who}: the handle did not arrive: {out:#?}"
        );
        let jail = parse_results(&out.stdout);
        let mut problems = Vec::new();
        for p in &probes {
            if jail[&p.name].0 == 0 {
                problems.push(format!("{who}: {}: SUCCEEDED inside the jail ({})", p.name, p.sh));
            }
            if p.control && control[&p.name].0 != 0 {
                problems.push(format!("{}: the control failed too: proves nothing", p.name));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}

// covers: E2 (no NET_ADMIN: addresses, routes, links, sysctls and nftables stay as agenthold made them)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn cannot_change_addresses_routes_links_or_rules() {
    let env = Env::new().await;
    let probes = [
        probe("ip_route_add", "ip route add 10.99.0.0/24 dev lo"),
        probe("ip_addr_add", "ip addr add 10.99.0.1/32 dev lo"),
        probe("ip_link_add", "ip link add ahx0 type veth peer name ahx1"),
        probe("sysctl_ip_forward", "echo 1 > /proc/sys/net/ipv4/ip_forward"),
        probe("nft_add_table", "nft add table inet agenthold_jail_probe"),
        probe("ip_link_set", "ip link set lo down"),
        probe_jail_only("ip_route_del_default", "ip route del default"),
    ];
    assert_all_fail_inside(&env, env.run(), &probes).await;
}

// covers: E2 (no NET_RAW: neither raw IP nor packet sockets)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn cannot_open_raw_or_packet_sockets() {
    let env = Env::new().await;
    let py = |s: &str| format!("{PYTHON} -c 'import socket; socket.socket({s})'");
    let probes = [
        probe(
            "raw_icmp",
            py("socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP"),
        ),
        probe(
            "raw_tcp",
            py("socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP"),
        ),
        probe("packet_raw", py("socket.AF_PACKET, socket.SOCK_RAW, 0")),
        probe("packet_dgram", py("socket.AF_PACKET, socket.SOCK_DGRAM, 0")),
    ];
    assert_all_fail_inside(&env, env.run(), &probes).await;
    assert_all_fail_inside(&env, as_caller(env.run()), &probes).await;
}

// covers: E2 E9 (the resolver cannot be swapped: resolv.conf is a read-only bind that stays put)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn cannot_unmount_rewrite_or_cover_resolv_conf() {
    let env = Env::new().await;
    let other = env.path("other-resolv.conf");
    std::fs::write(&other, "nameserver 192.0.2.53\n").unwrap();
    // In this order, so that the control never writes to the host's own resolv.conf: it writes to the
    // scratch file bound over it, and unmounts only afterwards.
    let probes = [
        probe(
            "append_resolv",
            "echo 'nameserver 192.0.2.53' >> /etc/resolv.conf",
        ),
        probe("truncate_resolv", ": > /etc/resolv.conf"),
        probe("remount_resolv_rw", "mount -o remount,bind,rw /etc/resolv.conf"),
        probe(
            "bind_over_resolv",
            format!("mount --bind {} /etc/resolv.conf", other.display()),
        ),
        probe("umount_resolv", "umount /etc/resolv.conf"),
        probe("umount_lazy_resolv", "umount -l /etc/resolv.conf"),
        probe("tmpfs_over_etc", "mount -t tmpfs x /etc"),
        probe_jail_only("umount_run", "umount /run"),
        probe_jail_only("mount_new_proc", "mount -t proc proc /proc"),
    ];
    assert_all_fail_inside(&env, env.run(), &probes).await;
    // Still the gateway's, still read-only (EROFS, not a permission error: the file is root's).
    let out = env
        .run()
        .sh("cat /etc/resolv.conf; echo x >> /etc/resolv.conf")
        .await;
    assert!(
        out.stdout.starts_with("nameserver 10.") && !out.stdout.contains("192.0.2.53"),
        "{out:#?}"
    );
    assert!(out.stderr.contains("Read-only file system"), "{out:#?}");
}

/// A listening Unix socket that is removed again when dropped (also when the test fails).
struct DummySocket {
    path: std::path::PathBuf,
    _listener: std::os::unix::net::UnixListener,
}

impl DummySocket {
    fn bind(path: &Path) -> Self {
        let _ = std::fs::remove_file(path);
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        Self {
            path: path.to_owned(),
            _listener: listener,
        }
    }
}

impl Drop for DummySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

// covers: S1 (no Docker socket: host daemons' sockets under /run are out of reach)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn host_daemon_sockets_under_run_are_hidden() {
    let env = Env::new().await;
    // A socket of our own, so the check never depends on what this machine runs.
    let name = format!("agenthold-it-{}-{}.sock", std::process::id(), env.https.port());
    let dummy = Path::new("/run").join(&name);
    let _listener = DummySocket::bind(&dummy);
    let dummy_str = dummy.display().to_string();
    let me = std::process::id();
    let mut probes = vec![
        probe("dummy_socket", format!("test -S {dummy_str}")),
        probe("dummy_via_var_run", format!("test -S /var/run/{name}")),
        probe(
            "dummy_via_test_root",
            format!("test -S /proc/{me}/root{dummy_str}"),
        ),
        probe(
            "dummy_via_parent_root",
            format!("test -S /proc/$PPID/root{dummy_str}"),
        ),
        probe(
            "dummy_connect",
            format!("{PYTHON} -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"{dummy_str}\")'"),
        ),
        probe("test_root", format!("ls /proc/{me}/root/")),
        probe("test_cwd", format!("ls /proc/{me}/cwd/")),
        probe_jail_only("dummy_via_pid1_root", format!("test -S /proc/1/root{dummy_str}")),
    ];
    for (probe_name, path) in [
        ("docker_sock", "/run/docker.sock"),
        ("var_docker_sock", "/var/run/docker.sock"),
        ("containerd_sock", "/run/containerd/containerd.sock"),
    ] {
        if Path::new(path).exists() {
            probes.push(probe(probe_name, format!("test -S {path}")));
        } else {
            eprintln!("{path} does not exist on this machine: only the dummy socket is checked for it");
        }
    }
    assert_all_fail_inside(&env, env.run(), &probes).await;
    assert_all_fail_inside(&env, as_caller(env.run()), &probes).await;
}

/// `run` as if agenthold had been started through sudo by uid/gid [`CALLER`].
fn as_caller(run: Run<'_>) -> Run<'_> {
    run.env("SUDO_UID", CALLER).env("SUDO_GID", CALLER)
}

/// `env.run()`, as the sudo caller or not.
fn run_as(env: &Env, caller: bool) -> Run<'_> {
    if caller { as_caller(env.run()) } else { env.run() }
}

// covers: E2 (no capabilities, empty bounding set, no_new_privs), as root and as the sudo caller
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn capabilities_are_gone_and_no_new_privs_is_set() {
    let env = Env::new().await;
    for caller in [false, true] {
        let who = if caller { "sudo caller" } else { "root" };
        let out = run_as(&env, caller).output(&["cat", "/proc/self/status"]).await;
        out.expect_code(0);
        let status = out.stdout;
        for key in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(
                status_field(&status, key),
                Some("0000000000000000"),
                "{who}: {key}\n{status}"
            );
        }
        assert_eq!(status_field(&status, "NoNewPrivs"), Some("1"), "{who}\n{status}");
    }
}

// covers: E2 (setuid binaries and sudo gain nothing under no_new_privs)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn setuid_binaries_gain_nothing() {
    let env = Env::new().await;
    // A setuid-root copy of grep that reports its own credentials.
    let suid = env.path("suid-grep");
    std::fs::copy("/usr/bin/grep", &suid).unwrap();
    std::os::unix::fs::chown(&suid, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let report = format!("{} -E '^(Uid|CapEff)' /proc/self/status", suid.display());
    // Control: outside, the same binary run by the same unprivileged user becomes root.
    let control = tokio::process::Command::new("setpriv")
        .args([
            "--reuid",
            CALLER,
            "--regid",
            CALLER,
            "--clear-groups",
            "sh",
            "-c",
            &report,
        ])
        .output()
        .await
        .unwrap();
    let control = String::from_utf8_lossy(&control.stdout).into_owned();
    let euid = |s: &str| {
        status_field(s, "Uid")
            .and_then(|u| u.split_whitespace().nth(1))
            .map(str::to_owned)
    };
    assert_eq!(
        euid(&control).as_deref(),
        Some("0"),
        "control: the setuid copy does not work here: {control}"
    );
    assert_ne!(
        status_field(&control, "CapEff"),
        Some("0000000000000000"),
        "control: {control}"
    );

    let sudo = Path::new("/usr/bin/sudo").exists();
    if !sudo {
        eprintln!("sudo is not installed: checking the setuid copy, su and mount only");
    }
    for caller in [false, true] {
        let who = if caller { "sudo caller" } else { "root" };
        let mut probes = vec![
            probe_jail_only("su_root", "su -c true root"),
            probe_jail_only("setuid_mount", "mount -t tmpfs x /mnt"),
        ];
        if sudo {
            probes.push(probe_jail_only("sudo", "sudo -n true"));
        }
        assert_all_fail_inside(&env, run_as(&env, caller), &probes).await;
        let out = run_as(&env, caller).sh(&report).await;
        out.expect_code(0);
        let expected_euid = if caller { CALLER } else { "0" };
        assert_eq!(
            euid(&out.stdout).as_deref(),
            Some(expected_euid),
            "{who}: {out:#?}"
        );
        assert_eq!(
            status_field(&out.stdout, "CapEff"),
            Some("0000000000000000"),
            "{who}: {out:#?}"
        );
    }
}

// covers: E2 E3 E9 (DNS and the default route both point at the gateway)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn resolv_conf_and_default_route_point_at_the_gateway() {
    let env = Env::new().await;
    let out = env
        .run()
        .sh("cat /etc/resolv.conf; echo ---; ip route show default; echo ---; ip -o -4 addr")
        .await;
    out.expect_code(0);
    let mut parts = out.stdout.split("---\n");
    let (resolv, route, addrs) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let nameservers: Vec<_> = resolv
        .lines()
        .filter_map(|l| l.strip_prefix("nameserver "))
        .map(str::trim)
        .collect();
    assert_eq!(nameservers.len(), 1, "{resolv}");
    let gateway = nameservers[0];
    assert!(
        route.starts_with(&format!("default via {gateway} ")),
        "route {route:?} vs nameserver {gateway}"
    );
    assert!(!gateway.starts_with("127."), "{resolv}");
    let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap();
    assert!(
        !host_resolv.contains(&format!("nameserver {gateway}\n")),
        "the host's resolver leaked in"
    );
    // The sandbox has only loopback and its veth, on the gateway's subnet.
    let prefix = gateway.rsplit_once('.').unwrap().0;
    for line in addrs.lines().filter(|l| !l.contains(" lo ")) {
        assert!(
            line.contains(&format!("inet {prefix}.")),
            "an address off the gateway's subnet: {line}"
        );
    }
}

// covers: issue 3 item 7 (started through sudo, the command runs as the invoking user)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn runs_as_the_sudo_caller() {
    let env = Env::new().await;
    let script = format!(
        "echo uid=$(id -u) gid=$(id -g) groups=$(id -G); grep -E '^(Uid|Gid|Groups):' /proc/self/status; \
         curl -sS -m 10 --noproxy '*' --cacert {ca} https://{API}/as-caller",
        ca = env.ca_str()
    );
    let out = env
        .run()
        .allow(API)
        .env("SUDO_UID", CALLER)
        .env("SUDO_GID", CALLER)
        .sh(&script)
        .await;
    out.expect_code(0);
    assert!(
        out.stdout
            .contains(&format!("uid={CALLER} gid={CALLER} groups={CALLER}\n")),
        "{out:#?}"
    );
    let all = format!("{CALLER}\t{CALLER}\t{CALLER}\t{CALLER}");
    assert_eq!(status_field(&out.stdout, "Uid"), Some(all.as_str()), "{out:#?}");
    assert_eq!(status_field(&out.stdout, "Gid"), Some(all.as_str()), "{out:#?}");
    assert_eq!(status_field(&out.stdout, "Groups"), Some(CALLER), "{out:#?}");
    assert!(
        out.stdout.contains("upstream-ok"),
        "the caller's traffic does not get through: {out:#?}"
    );
    // Without sudo variables it stays uid 0 (without capabilities: see the other tests).
    let out = env.run().sh("id -u").await;
    assert_eq!(out.stdout.trim(), "0", "{out:#?}");
}

/// A shell command that runs `script` as root of a new user namespace with its own mount namespace, the
/// one way left to get capabilities (over that namespace only): with uid 0 mapped when the kernel allows
/// it (the sudo caller), else unmapped (uid 0 may not map itself without CAP_SETFCAP). Exits 0 if either
/// way `script` did.
fn in_user_namespace(script: &str) -> String {
    let quoted = script.replace('\'', r"'\''");
    format!(
        "unshare --user --map-root-user --mount sh -c '{quoted}' || unshare --user --mount sh -c '{quoted}'"
    )
}

/// A name no other test or run uses: `agenthold-test-<test pid>-<this test's HTTPS port>`.
fn unique_name(env: &Env) -> String {
    format!("agenthold-test-{}-{}", std::process::id(), env.https.port())
}

/// Host paths a test might have planted if a probe worked: removed when dropped, also when it fails.
struct RemoveOnDrop(Vec<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for path in &self.0 {
            if path.is_dir() && !path.is_symlink() {
                let _ = std::fs::remove_dir_all(path);
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// The read-only directories of the jail that are real directories here. Written out again on purpose
/// rather than read from `src/jail/view.rs` `SYSTEM`: a directory dropped from that list fails this test.
fn read_only_dirs() -> Vec<&'static str> {
    real_dirs(&[
        "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys",
    ])
}

/// Host directories outside the jail's allowlist (R2) that are real directories here: absent inside or
/// empty on the read-only root. (`/root`, the home of root, is a private one inside: see `view.rs`.)
fn hidden_dirs() -> Vec<&'static str> {
    real_dirs(&[
        "/boot",
        "/srv",
        "/mnt",
        "/media",
        "/home",
        "/var/lib",
        "/var/spool",
        "/var/cache",
        "/var/log",
        "/var/mail",
        "/var/opt",
        "/var/backups",
        "/var/local",
    ])
}

fn real_dirs(dirs: &[&'static str]) -> Vec<&'static str> {
    dirs.iter()
        .copied()
        .filter(|d| std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir()))
        .collect()
}

/// Whether this process (root, all capabilities) may write `path` as far as the kernel says (access(2)).
fn host_may_write(path: &Path) -> bool {
    nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// `/etc` → `etc`, `/var/lib` → `var_lib`: a probe name.
fn probe_name(prefix: &str, path: &str) -> String {
    let mut name = String::from(prefix);
    for c in path.chars() {
        name.push(if c.is_ascii_alphanumeric() { c } else { '_' });
    }
    name
}

/// Panics listing every probe of `names` that worked in the jail, or whose output contains none of
/// `errors` (the kernel's reason: it shows what stopped the probe).
#[track_caller]
fn assert_failed_with(jail: &Results, names: &[String], errors: &[&str]) {
    let wrong: Vec<String> = names
        .iter()
        .filter_map(|n| {
            let (rc, out) = &jail[n];
            (*rc == 0 || !errors.iter().any(|e| out.contains(e))).then(|| format!("{n}: rc={rc} {out}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "expected each to fail with one of {errors:?}:\n{}",
        wrong.join("\n")
    );
}

// covers: issue 3 item 7 (root without sudo cannot plant files in system directories: a cron job,
// /etc/ld.so.preload or a profile would later run with full privileges)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn root_without_sudo_cannot_write_system_directories() {
    let env = Env::new().await;
    let unique = unique_name(&env);
    // Directories to write into: every read-only and every hidden one (and a deeper one) the host itself
    // may write.
    let mut dirs: Vec<String> = read_only_dirs()
        .into_iter()
        .chain(hidden_dirs())
        .filter(|d| *d != "/sys")
        .map(str::to_owned)
        .collect();
    dirs.extend(
        [
            "/usr/local/bin",
            "/etc/cron.d",
            "/var/lib/dpkg",
            "/var/spool/cron",
        ]
        .into_iter()
        .filter(|d| Path::new(d).is_dir())
        .map(str::to_owned),
    );
    dirs.retain(|d| host_may_write(Path::new(d)));
    assert!(
        dirs.iter().any(|d| d == "/etc") && dirs.iter().any(|d| d == "/usr"),
        "{dirs:?}"
    );
    let planted: Vec<PathBuf> = dirs.iter().map(|d| Path::new(d).join(&unique)).collect();
    let mut cleanup: Vec<PathBuf> = planted.clone();
    cleanup.extend([
        Path::new("/etc").join(format!("{unique}.d")),
        Path::new("/usr/local/bin").join(format!("{unique}.lnk")),
    ]);
    let _cleanup = RemoveOnDrop(cleanup.clone());

    // The command is uid 0, owner of these directories: what must stop it is the read-only mount.
    let mut probes = vec![probe_jail_only("uid_is_not_0", "test \"$(id -u)\" != 0")];
    let (mut writes, mut access) = (Vec::new(), Vec::new());
    for (dir, file) in dirs.iter().zip(&planted) {
        // Control: root may write there (asked, not done).
        access.push(probe_name("writable", dir));
        probes.push(probe(probe_name("writable", dir), format!("test -w {dir}")));
        // In the jail only: a real write of a new, unique file.
        writes.push(probe_name("create", dir));
        probes.push(probe_jail_only(
            probe_name("create", dir),
            format!("echo planted > {}", file.display()),
        ));
    }
    let more = [
        ("mkdir_etc", format!("mkdir /etc/{unique}.d")),
        (
            "symlink_usr",
            format!("ln -s /bin/true /usr/local/bin/{unique}.lnk"),
        ),
        // The same mode again: nothing changes, even if it worked.
        (
            "chmod_etc_passwd",
            "chmod \"$(stat -c %a /etc/passwd)\" /etc/passwd".to_owned(),
        ),
        ("remount_etc_rw", "mount -o remount,bind,rw /etc".to_owned()),
        ("umount_etc", "umount /etc".to_owned()),
        (
            "userns_umount_etc",
            in_user_namespace(&format!("umount /etc; echo planted > /etc/{unique}")),
        ),
        (
            "userns_remount_etc_rw",
            in_user_namespace(&format!(
                "mount -o remount,bind,rw /etc && echo planted > /etc/{unique}"
            )),
        ),
    ];
    for (name, sh) in more {
        probes.push(probe_jail_only(name, sh));
    }
    let jail = in_jail(&env, env.run(), &probes).await;
    let control = in_control(&env, &probes).await;
    let mut problems: Vec<String> = probes
        .iter()
        .filter(|p| jail[&p.name].0 == 0)
        .map(|p| format!("{}: SUCCEEDED inside the jail ({})", p.name, p.sh))
        .collect();
    problems.extend(
        access
            .iter()
            .filter(|n| control[*n].0 != 0)
            .map(|n| format!("{n}: the control cannot write either: proves nothing")),
    );
    let left: Vec<_> = cleanup.iter().filter(|p| p.symlink_metadata().is_ok()).collect();
    assert!(
        problems.is_empty() && left.is_empty(),
        "{}\nplanted on the host: {left:?}",
        problems.join("\n")
    );
    // Below a read-only directory the mount says no; a hidden one is either absent or an empty
    // directory of the read-only root.
    let system = read_only_dirs();
    let (mut read_only, mut hidden) = (Vec::new(), Vec::new());
    for (dir, name) in dirs.iter().zip(writes) {
        if system.iter().any(|s| Path::new(dir).starts_with(s)) {
            read_only.push(name);
        } else {
            hidden.push(name);
        }
    }
    assert_failed_with(&jail, &read_only, &["Read-only file system"]);
    assert_failed_with(
        &jail,
        &hidden,
        &[
            "Read-only file system",
            "No such file or directory",
            "Directory nonexistent",
        ],
    );
}

/// Mount points below the jail's read-only and hidden directories that are writable on the host.
fn writable_submounts() -> Vec<String> {
    let roots: Vec<&str> = read_only_dirs().into_iter().chain(hidden_dirs()).collect();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // Skip escaped names (spaces…): the probes are shell words.
        .filter(|p| !p.contains('\\'))
        // Skip the mounts of containers other tests start and remove meanwhile: they may be gone by the
        // time the control runs (the jail makes them read-only like the rest).
        .filter(|p| {
            !p.contains("/overlay2/") && !p.contains("/docker/containers/") && !p.contains("/docker/netns/")
        })
        .filter(|p| {
            roots
                .iter()
                .any(|r| p.strip_prefix(r).is_some_and(|rest| rest.starts_with('/')))
        })
        .filter(|p| host_may_write(Path::new(p)) || host_may_write(&Path::new(p).join("cgroup.procs")))
        .map(str::to_owned)
        .collect();
    points.sort();
    points.dedup();
    points
}

// covers: issue 3 item 7 (read-only system directories: everything mounted below them too)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn read_only_directories_cover_what_is_mounted_below_them() {
    let env = Env::new().await;
    let points = writable_submounts();
    if points.is_empty() {
        eprintln!("nothing is mounted below the read-only directories on this machine: nothing to check");
        return;
    }
    let probes: Vec<Probe> = points
        .iter()
        // The mount point itself, or (cgroup file systems) the file that moves processes between cgroups.
        .map(|p| {
            probe(
                probe_name("writable", p),
                format!("test -w {p} || test -w {p}/cgroup.procs"),
            )
        })
        .collect();
    assert_all_fail_inside(&env, env.run(), &probes).await;
}

/// Kernel settings the command could use (core_pattern runs a program as full root on the next crash).
const SYSCTLS: [&str; 2] = ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/swappiness"];

// covers: issue 3 item 7 (root without sudo cannot change kernel settings)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn root_without_sudo_cannot_change_kernel_settings() {
    let env = Env::new().await;
    let before: Vec<String> = SYSCTLS
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let mut probes = Vec::new();
    let mut writes = Vec::new();
    for file in SYSCTLS {
        probes.push(probe(probe_name("writable", file), format!("test -w {file}")));
        // In the jail only, a real write, of the value it has: nothing changes even if it worked.
        writes.push(probe_name("write", file));
        probes.push(probe_jail_only(
            probe_name("write", file),
            format!("v=$(cat {file}) && printf '%s\\n' \"$v\" > {file}"),
        ));
    }
    probes.push(probe_jail_only(
        "sysctl_w_swappiness",
        "sysctl -w vm.swappiness=\"$(cat /proc/sys/vm/swappiness)\"",
    ));
    // Other kernel interfaces, asked only (never written), where the host has them writable.
    for file in [
        "/proc/sysrq-trigger",
        "/proc/sys/kernel/modprobe",
        "/proc/sys/fs/suid_dumpable",
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/sys/kernel/profiling",
        "/sys/power/state",
    ] {
        if Path::new(file).exists() && host_may_write(Path::new(file)) {
            probes.push(probe(probe_name("writable", file), format!("test -w {file}")));
        }
    }
    let jail = in_jail(&env, env.run(), &probes).await;
    let control = in_control(&env, &probes).await;
    let after: Vec<String> = SYSCTLS
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    for ((file, was), now) in SYSCTLS.iter().zip(&before).zip(&after) {
        if was != now {
            // Put it back before failing.
            let _ = std::fs::write(file, was);
        }
    }
    assert_eq!(before, after, "kernel settings changed during the run (restored)");
    let mut problems = Vec::new();
    for p in &probes {
        if jail[&p.name].0 == 0 {
            problems.push(format!("{}: SUCCEEDED inside the jail ({})", p.name, p.sh));
        }
        if p.control && control[&p.name].0 != 0 {
            problems.push(format!("{}: the control failed too: proves nothing", p.name));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_failed_with(&jail, &writes, &["Read-only file system"]);
}

/// Writes `text` to `path` with `mode`.
fn write_mode(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

// covers: E10 E14 (the CA key and master keys stay with agenthold) E12 (the secrets file stays with it)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn root_without_sudo_cannot_read_keys_or_the_secrets_file() {
    let env = Env::new().await;
    // A first run creates the data dir and the CA (egress/ca.key, 0600, root's: uid 0 may read it).
    env.run().output(&["true"]).await.expect_code(0);
    let data = env.path("data");
    let ca_key = data.join("egress/ca.key");
    let key_pem = std::fs::read_to_string(&ca_key).unwrap();
    assert!(key_pem.contains("PRIVATE KEY"), "{}", ca_key.display());
    // `agenthold run` creates no master key (the server does, E10): put one where it would live, and one
    // where `secrets.master_key_file` points.
    let unique = unique_name(&env);
    let master_key = format!("master-key-{unique}");
    let master = data.join("master.key");
    write_mode(&master, &master_key, 0o600);
    let elsewhere_dir = env.path("keys");
    std::fs::create_dir(&elsewhere_dir).unwrap();
    let elsewhere = elsewhere_dir.join("master.key");
    let elsewhere_key = format!("configured-master-key-{unique}");
    write_mode(&elsewhere, &elsewhere_key, 0o600);
    let value = format!("secret-value-{unique}");
    let secrets = env.path("secrets.yaml");
    let yaml =
        format!("- name: api\n  value: {value}\n  env: API_KEY\n  hosts: [{API}]\n  header: Authorization\n");
    write_mode(&secrets, &yaml, 0o600);
    // Controls: copies with the same owner and mode, not hidden, are readable in the jail.
    let (key_copy, secrets_copy) = (env.path("ca.key.copy"), env.path("secrets.copy.yaml"));
    write_mode(&key_copy, &key_pem, 0o600);
    write_mode(&secrets_copy, &yaml, 0o600);

    let (d, k, m, e, s) = (
        data.display(),
        ca_key.display(),
        master.display(),
        elsewhere.display(),
        secrets.display(),
    );
    let probes = [
        probe_jail_only("read_ca_key", format!("test -s {k}")),
        probe_jail_only("list_data_dir", format!("ls -A {d}/egress | grep -q .")),
        probe_jail_only("read_master_key", format!("test -s {m}")),
        probe_jail_only("read_configured_master_key", format!("test -s {e}")),
        probe_jail_only("read_secrets_file", format!("test -s {s}")),
        probe_jail_only("via_pid1_root", format!("test -s /proc/1/root{k}")),
        probe_jail_only(
            "userns_umount_data_dir",
            in_user_namespace(&format!("umount {d}; test -s {k}")),
        ),
        probe_jail_only(
            "userns_umount_secrets",
            in_user_namespace(&format!("umount {s}; test -s {s}")),
        ),
        // A copy of the working directory's mount without what covers the data dir: a bind that is not
        // recursive, or an overlay on it (the kernel refuses both: the covers are locked).
        probe_jail_only(
            "userns_bind_under_cover",
            in_user_namespace(&format!(
                "mkdir -p /tmp/peek && mount --bind {w} /tmp/peek && test -s /tmp/peek/data/egress/ca.key",
                w = env.dir.path().display()
            )),
        ),
        probe_jail_only(
            "userns_overlay_under_cover",
            in_user_namespace(&format!(
                "mkdir -p /tmp/peek /tmp/empty && mount -t overlay x -o lowerdir={w}:/tmp/empty /tmp/peek \
                 && test -s /tmp/peek/data/egress/ca.key",
                w = env.dir.path().display()
            )),
        ),
    ];
    let run = || {
        env.run()
            .extra_flag("--secrets", &secrets)
            .env("AGENTHOLD_SECRETS_MASTER_KEY_FILE", &e.to_string())
    };
    for caller in [false, true] {
        let run = if caller { as_caller(run()) } else { run() };
        let who = if caller { "sudo caller" } else { "root" };
        let jail = in_jail(&env, run, &probes).await;
        let worked: Vec<_> = jail.iter().filter(|(_, (rc, _))| *rc == 0).collect();
        assert!(worked.is_empty(), "{who}: read what is hidden: {worked:?}");
    }
    // As root: the copies are readable (only hiding protects the originals), and whatever the command
    // prints of the originals holds nothing secret.
    let out = run()
        .sh(&format!(
            "cat {kc} >/dev/null && cat {sc} >/dev/null && echo controls-ok; cat {k} {m} {e} {s}; ls -A {d}",
            kc = key_copy.display(),
            sc = secrets_copy.display(),
        ))
        .await;
    out.expect_code(0);
    assert!(out.stdout.starts_with("controls-ok\n"), "{out:#?}");
    for secret in [key_pem.as_str(), &master_key, &elsewhere_key, &value] {
        let first_line = secret.lines().nth(1).unwrap_or(secret);
        assert!(
            !out.stdout.contains(first_line),
            "the jail read {first_line:?}: {out:#?}"
        );
    }
    assert_eq!(out.stdout, "controls-ok\n", "hidden paths show content: {out:#?}");
}

// covers: E12 (the command sees placeholders, never values) E10 (nor the master key)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn secret_values_stay_out_of_the_command_environment() {
    let env = Env::new().await;
    let unique = unique_name(&env);
    let value = format!("env-secret-{unique}");
    let master = "bWFzdGVyLWtleS1mb3ItdGhlLWludGVncmF0aW9uLXQ=";
    let secrets = env.path("secrets.yaml");
    write_mode(
        &secrets,
        &format!(
            "- name: api\n  value_env: AGENTHOLD_IT_TOKEN\n  env: API_KEY\n  hosts: [{API}]\n  header: Authorization\n"
        ),
        0o600,
    );
    // Every process of the jail, pid 1 included: their environment and command line.
    let script = "echo API_KEY=$API_KEY; echo ---; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do \
                  tr '\\0' '\\n' < $f; echo; done";
    for caller in [false, true] {
        let who = if caller { "sudo caller" } else { "root" };
        let run = run_as(&env, caller)
            .extra_flag("--secrets", &secrets)
            .env("AGENTHOLD_IT_TOKEN", &value)
            .env("AGENTHOLD_IT_EMBEDS", &format!("prefix:{value}:suffix"))
            .env("AGENTHOLD_MASTER_KEY", master)
            .env("AGENTHOLD_IT_VISIBLE", "visible");
        let out = run.sh(script).await;
        out.expect_code(0);
        // Control: agenthold's environment does reach the command.
        assert!(
            out.stdout.contains("\nAGENTHOLD_IT_VISIBLE=visible\n"),
            "{who}: {out:#?}"
        );
        let placeholder = out
            .stdout
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("API_KEY="))
            .unwrap_or("");
        assert!(
            placeholder.starts_with("agenthold-placeholder-"),
            "{who}: {out:#?}"
        );
        for (what, needle) in [
            ("the secret's value", value.as_str()),
            ("the master key", master),
            ("AGENTHOLD_IT_TOKEN", "AGENTHOLD_IT_TOKEN="),
            ("AGENTHOLD_IT_EMBEDS", "AGENTHOLD_IT_EMBEDS="),
            ("AGENTHOLD_MASTER_KEY", "AGENTHOLD_MASTER_KEY="),
        ] {
            assert!(
                !out.stdout.contains(needle),
                "{who}: {what} reached the jail: {out:#?}"
            );
        }
    }
}

// covers: issue 3 item 7 (the command cannot see or signal host processes: own PID namespace)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn cannot_see_or_signal_host_processes() {
    let env = Env::new().await;
    // A host process of the test's own, with a unique command line.
    let marker = format!("600.{}{}", std::process::id(), env.https.port());
    let mut victim = tokio::process::Command::new("sleep")
        .arg(&marker)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let host = victim.id().unwrap();
    let me = std::process::id();
    // Controls on the host: the victim can be signalled and found by its command line.
    let alive = |pid: u32| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()), None).is_ok()
    };
    assert!(alive(host));
    let pgrep = std::process::Command::new("pgrep")
        .args(["-f", &marker])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&pgrep.stdout).trim(), host.to_string());
    let probes = [
        probe_jail_only("signal0_host_process", format!("kill -0 {host}")),
        probe_jail_only("sigterm_host_process", format!("kill -TERM {host}")),
        probe_jail_only("proc_host_process", format!("test -e /proc/{host}")),
        probe_jail_only("pgrep_host_process", format!("pgrep -f {marker}")),
        probe_jail_only("signal0_test", format!("kill -0 {me}")),
        probe_jail_only("proc_test", format!("test -e /proc/{me}")),
    ];
    for caller in [false, true] {
        let who = if caller { "sudo caller" } else { "root" };
        let jail = in_jail(&env, run_as(&env, caller), &probes).await;
        let worked: Vec<_> = jail.iter().filter(|(_, (rc, _))| *rc == 0).collect();
        assert!(worked.is_empty(), "{who}: reached a host process: {worked:?}");
        assert!(alive(host), "{who}: the host process was killed from the jail");
        // What the jail does see: its own processes only, its init as pid 1, nothing of agenthold's.
        let out = run_as(&env, caller)
            .sh("kill -0 $$ && echo self-ok; ps -eo pid=,args=")
            .await;
        out.expect_code(0);
        let mut lines = out.stdout.lines();
        assert_eq!(lines.next(), Some("self-ok"), "{who}: {out:#?}");
        let ps: Vec<(u32, &str)> = lines
            .filter_map(|l| {
                let (pid, args) = l.trim().split_once(' ')?;
                Some((pid.parse().ok()?, args.trim()))
            })
            .collect();
        assert!(
            ps.iter()
                .any(|(pid, args)| *pid == 1 && args.contains("__jail-init")),
            "{who}: pid 1 is not the jail's init: {ps:?}"
        );
        assert!(ps.len() <= 4, "{who}: more than init, sh and ps: {ps:?}");
        assert!(
            ps.iter().all(|(_, args)| !args.contains(&marker)
                && !args.contains("agenthold run")
                && !args.contains("__jail ")),
            "{who}: a process from outside the jail: {ps:?}"
        );
    }
    victim.kill().await.unwrap();
}

// covers: issue 3 item 7 R2 (writable on purpose: the working directory, on the host; /tmp, /var/tmp and
// the home, privately)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn working_directory_stays_writable_and_tmp_is_private() {
    let env = Env::new().await;
    let cwd = env.path("workdir");
    std::fs::create_dir(&cwd).unwrap();
    std::fs::set_permissions(&cwd, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = format!(
        "echo relative > in-cwd && echo absolute > {c}/by-path && mkdir sub && echo nested > sub/file \
         && echo tmp=$(mktemp /tmp/agenthold-it-XXXXXX) && echo vartmp=$(mktemp /var/tmp/agenthold-it-XXXXXX) \
         && test -w \"$HOME\" && echo home-ok",
        c = cwd.display()
    );
    let out = env.run().output_in(&cwd, &["sh", "-c", &script]).await;
    let created: Vec<PathBuf> = out
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("tmp=").or_else(|| l.strip_prefix("vartmp=")))
        .map(PathBuf::from)
        .collect();
    let _cleanup = RemoveOnDrop(created.clone());
    out.expect_code(0);
    assert!(out.stdout.ends_with("home-ok\n"), "{out:#?}");
    for (file, text) in [
        ("in-cwd", "relative\n"),
        ("by-path", "absolute\n"),
        ("sub/file", "nested\n"),
    ] {
        assert_eq!(std::fs::read_to_string(cwd.join(file)).unwrap(), text, "{file}");
    }
    assert_eq!(created.len(), 2, "{out:#?}");
    for file in &created {
        assert!(
            file.starts_with("/tmp") || file.starts_with("/var/tmp"),
            "{}",
            file.display()
        );
        assert!(!file.exists(), "{} reached the host", file.display());
    }
}

// covers: issue 3 item 7 R2 (the working directory stays writable, also below a directory the jail
// hides; its siblings there stay out of reach)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn working_directory_below_a_read_only_directory_stays_writable() {
    let env = Env::new().await;
    let cwd = tempfile::Builder::new()
        .prefix("agenthold-it-cwd-")
        .tempdir_in("/var/lib")
        .unwrap();
    let c = cwd.path().display();
    let sibling = Path::new("/var/lib").join(unique_name(&env));
    let _cleanup = RemoveOnDrop(vec![sibling.clone()]);
    let probes = [
        probe_jail_only("relative", "echo x > relative"),
        probe_jail_only("absolute", format!("echo x > {c}/absolute")),
        probe_jail_only("after_cd", format!("cd {c} && echo x > after-cd")),
        probe_jail_only("test_w", format!("test -w {c}")),
    ];
    // The script lives in the working directory: the test's own directory is not in the jail's view.
    let path = cwd.path().join("cwd-probes.sh");
    std::fs::write(&path, probe_script(&probes)).unwrap();
    let out = env
        .run()
        .output_in(
            cwd.path(),
            &[
                "sh",
                "-c",
                &format!("sh {}; echo x > {}", path.display(), sibling.display()),
            ],
        )
        .await;
    assert!(
        sibling.symlink_metadata().is_err(),
        "the jail wrote {} (read-only)",
        sibling.display()
    );
    assert!(out.stderr.contains("Read-only file system"), "{out:#?}");
    let results = parse_results(&out.stdout);
    let failed: Vec<_> = results.iter().filter(|(_, (rc, _))| *rc != 0).collect();
    assert!(
        failed.is_empty() && results.len() == probes.len(),
        "the working directory is not writable: {failed:?}"
    );
}

// covers: issue 3 item 7 R2: started by root without sudo, the command is uid 0 without capabilities, and
// the working directory is writable on purpose: root-owned files there are writable too (and nowhere
// else, see `view.rs`); through sudo it runs as the caller and may not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn root_without_sudo_writes_root_owned_files_only_in_the_working_directory() {
    let env = Env::new().await;
    let victim = env.path("root-owned.conf");
    write_mode(&victim, "original\n", 0o644);
    let (planted, planted_by_caller) = (env.path("planted"), env.path("planted-by-caller"));
    let script = |file: &Path| {
        format!(
            "echo appended >> {v} && chmod 0600 {v} && chmod 0644 {v} && touch {f} && stat -c %u {f}",
            v = victim.display(),
            f = file.display()
        )
    };
    // Root without sudo: the working directory is its to write, root's files in it included.
    let out = env.run().sh(&script(&planted)).await;
    out.expect_code(0);
    assert_eq!(out.stdout, "0\n", "{out:#?}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original\nappended\n");
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&planted).unwrap()),
        0
    );
    // Through sudo the command is the caller, and root's files are out of reach.
    let out = as_caller(env.run()).sh(&script(&planted_by_caller)).await;
    assert_ne!(out.code, Some(0), "{out:#?}");
    assert!(out.stderr.contains("Permission denied"), "{out:#?}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original\nappended\n");
    assert!(!planted_by_caller.exists());
}
