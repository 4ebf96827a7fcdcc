//! What every test needs: its own environment (data dir, loopback upstreams, `TestDns`), a builder for
//! `agenthold run` pointed at them, and checks of the host's namespaces, links and nftables tables.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthold_testsupport::{EchoServer, TestCa, TestDns};
use tokio::process::{Child, Command};
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Allowed in most tests; mapped to the loopback upstreams (443 → HTTPS echo, 80 → HTTP echo).
pub(crate) const API: &str = "api.example.test";
/// Mapped to the same upstreams as [`API`] but not allowed unless a test says so.
pub(crate) const OTHER: &str = "other.example.test";
/// Known to `TestDns` (198.51.100.7), never mapped, never allowed: the upstream must never be asked.
pub(crate) const DENIED: &str = "denied.example.test";
/// Unknown everywhere (`TestDns` answers NXDOMAIN for it).
pub(crate) const UNLISTED: &str = "unlisted.example.test";
/// Python from the distribution: the pyenv shim on PATH lives under /root, which the sudo caller
/// (uid 65534) cannot read.
pub(crate) const PYTHON: &str = "/usr/bin/python3";
/// The field names of a `--log` line, exactly (issue 3, items 6 and 7).
pub(crate) const CONTRACT_FIELDS: [&str; 13] = [
    "time",
    "agent",
    "kind",
    "host",
    "port",
    "method",
    "path",
    "status",
    "decision",
    "reason",
    "secret_injected",
    "bytes_up",
    "bytes_down",
];
/// No run in these tests takes more than a few seconds; a hung one fails the test instead of the suite.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// Held shared by every test while its runs are alive, exclusively by the one test that must see stale
/// namespaces survive until *its* next run (any run removes the stale namespaces of killed runs).
static RUNS: RwLock<()> = RwLock::const_new(());

/// One test's world: a data dir (0755, so the sudo caller can read the CA in it), an HTTPS and an HTTP
/// echo server on loopback, and a `TestDns` that knows [`DENIED`].
pub(crate) struct Env {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) https: EchoServer,
    pub(crate) http: EchoServer,
    pub(crate) dns: TestDns,
    /// The upstream CA, PEM (for `--dangerous-upstream-ca` and the clients' `--cacert`).
    pub(crate) ca: PathBuf,
    _shared: Option<RwLockReadGuard<'static, ()>>,
    _exclusive: Option<RwLockWriteGuard<'static, ()>>,
    /// The same, across processes (another copy of this binary): see [`RunsFileLock`].
    _across_processes: RunsFileLock,
}

impl Env {
    /// A fresh environment; other tests may run agenthold at the same time.
    pub(crate) async fn new() -> Self {
        agenthold_testsupport::require_root();
        let shared = RUNS.read().await;
        Self::build(Some(shared), None).await
    }

    /// A fresh environment while no other test runs agenthold.
    pub(crate) async fn exclusive() -> Self {
        agenthold_testsupport::require_root();
        let exclusive = RUNS.write().await;
        Self::build(None, Some(exclusive)).await
    }

    async fn build(
        shared: Option<RwLockReadGuard<'static, ()>>,
        exclusive: Option<RwLockWriteGuard<'static, ()>>,
    ) -> Self {
        agenthold_testsupport::init_tracing();
        let across_processes = RunsFileLock::acquire(exclusive.is_some()).await;
        let dir = tempfile::Builder::new()
            .prefix("agenthold-it-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let ca = Arc::new(TestCa::new());
        let https = EchoServer::https_with_ca(Arc::clone(&ca), &[API, OTHER]).await;
        let http = EchoServer::http().await;
        let dns = TestDns::start([(DENIED, vec![IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7))])], 60).await;
        let ca_path = dir.path().join("upstream-ca.pem");
        std::fs::write(&ca_path, ca.pem()).unwrap();
        std::fs::set_permissions(&ca_path, std::fs::Permissions::from_mode(0o644)).unwrap();
        Self {
            dir,
            https,
            http,
            dns,
            ca: ca_path,
            _shared: shared,
            _exclusive: exclusive,
            _across_processes: across_processes,
        }
    }

    /// `name` inside the test's directory.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA path as a string, for command lines.
    pub(crate) fn ca_str(&self) -> String {
        self.ca.display().to_string()
    }

    /// `agenthold run` with this environment's data dir, DNS upstream, upstream CA and name mappings.
    pub(crate) fn run(&self) -> Run<'_> {
        Run {
            env: self,
            flags: Vec::new(),
            vars: Vec::new(),
            data_dir: self.path("data"),
        }
    }

    /// Questions `TestDns` received for `name`.
    pub(crate) fn dns_queries_for(&self, name: &str) -> usize {
        self.dns.queries().iter().filter(|q| q.name == name).count()
    }

    /// Paths the HTTPS echo server received with SNI `sni`.
    pub(crate) fn https_paths(&self, sni: &str) -> Vec<String> {
        let requests = self.https.requests();
        requests
            .into_iter()
            .filter(|r| r.sni.as_deref() == Some(sni))
            .map(|r| r.path)
            .collect()
    }

    /// Paths the HTTP echo server received with `Host: host`.
    pub(crate) fn http_paths(&self, host: &str) -> Vec<String> {
        let requests = self.http.requests();
        requests
            .into_iter()
            .filter(|r| r.host == host)
            .map(|r| r.path)
            .collect()
    }
}

/// The `agenthold` binary with a clean environment: no sudo variables (tests that simulate sudo set
/// them), no proxy variables, warnings only.
pub(crate) fn agenthold() -> Command {
    clean(Command::new(AGENTHOLD))
}

/// The `agenthold` binary under test.
pub(crate) const AGENTHOLD: &str = env!("CARGO_BIN_EXE_agenthold");

/// `cmd` with the environment of [`agenthold`]: for a wrapper that ends up executing agenthold.
pub(crate) fn clean(mut cmd: Command) -> Command {
    for var in [
        "SUDO_UID",
        "SUDO_GID",
        "SUDO_USER",
        "SUDO_COMMAND",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("AGENTHOLD_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// One `agenthold run` being put together.
pub(crate) struct Run<'a> {
    env: &'a Env,
    flags: Vec<OsString>,
    vars: Vec<(String, String)>,
    data_dir: PathBuf,
}

impl Run<'_> {
    /// `--allow ENTRY`.
    pub(crate) fn allow(mut self, entry: &str) -> Self {
        self.flags.extend(["--allow".into(), entry.into()]);
        self
    }

    /// `--data-dir DIR` instead of the environment's own.
    pub(crate) fn data_dir(mut self, dir: &Path) -> Self {
        dir.clone_into(&mut self.data_dir);
        self
    }

    /// `--report-only`.
    pub(crate) fn report_only(mut self) -> Self {
        self.flags.push("--report-only".into());
        self
    }

    /// `--log FILE`.
    pub(crate) fn log(mut self, file: &Path) -> Self {
        self.flags.extend(["--log".into(), file.into()]);
        self
    }

    /// `--share-home`.
    pub(crate) fn share_home(mut self) -> Self {
        self.flags.push("--share-home".into());
        self
    }

    /// An environment variable for agenthold itself (e.g. `SUDO_UID`).
    pub(crate) fn env(mut self, key: &str, value: &str) -> Self {
        self.vars.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The arguments of `agenthold` (from `run` on), `-- command…` last.
    pub(crate) fn args(&self, command: &[&str]) -> Vec<OsString> {
        let env = self.env;
        let https = env.https.addr();
        let http = env.http.addr();
        let mut args: Vec<OsString> = vec![
            "run".into(),
            "--data-dir".into(),
            self.data_dir.clone().into(),
            "--dns-upstream".into(),
            env.dns.addr().to_string().into(),
            "--dangerous-upstream-ca".into(),
            env.ca.clone().into(),
        ];
        for name in [API, OTHER] {
            args.push("--dangerous-connect-to".into());
            args.push(format!("{name}:443={https}").into());
            args.push("--dangerous-connect-to".into());
            args.push(format!("{name}:80={http}").into());
        }
        args.extend(self.flags.iter().cloned());
        args.push("--".into());
        args.extend(command.iter().map(OsString::from));
        args
    }

    /// `WRAPPER… agenthold run …` (e.g. `setsid -w -c`), with the environment and working directory of
    /// [`Run::command`].
    pub(crate) fn wrapped(&self, wrapper: &[&str], command: &[&str]) -> Command {
        let (program, rest) = wrapper.split_first().expect("a wrapper program");
        let mut cmd = clean(Command::new(program));
        cmd.args(rest)
            .arg(AGENTHOLD)
            .args(self.args(command))
            .current_dir(self.env.dir.path());
        for (key, value) in &self.vars {
            cmd.env(key, value);
        }
        cmd
    }

    /// The whole command line, `-- command…` last, started in the test's directory (the jail shows the
    /// working directory, writable, and hides the rest of /tmp).
    pub(crate) fn command(&self, command: &[&str]) -> Command {
        let mut cmd = agenthold();
        cmd.args(self.args(command)).current_dir(self.env.dir.path());
        for (key, value) in &self.vars {
            cmd.env(key, value);
        }
        cmd
    }

    /// Starts the run.
    pub(crate) fn spawn(&self, command: &[&str]) -> Child {
        self.command(command).spawn().expect("start agenthold")
    }

    /// Runs to the end and collects what it printed.
    pub(crate) async fn output(&self, command: &[&str]) -> Outcome {
        finish(self.spawn(command)).await
    }

    /// [`Run::output`] of `sh -c SCRIPT`.
    pub(crate) async fn sh(&self, script: &str) -> Outcome {
        self.output(&["sh", "-c", script]).await
    }
}

/// How a finished `agenthold` process ended.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// agenthold's pid (its namespaces are named `ahr-<pid>-…`).
    pub(crate) pid: u32,
    /// Its exit code (`None` if a signal killed agenthold itself).
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Outcome {
    /// Panics, showing everything, unless the exit code is `code`.
    #[track_caller]
    pub(crate) fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, Some(code), "exit code; {self:#?}");
        self
    }
}

/// Waits (at most [`RUN_TIMEOUT`]) for `child` to end and collects its output.
pub(crate) async fn finish(child: Child) -> Outcome {
    let pid = child.id().expect("a running child has a pid");
    let output = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .expect("agenthold did not finish in time (killed)")
        .expect("wait for agenthold");
    Outcome {
        pid,
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Waits for `child` to exit (at most 10 s) and returns its exit code (`None` when killed by a signal).
pub(crate) async fn wait_exit(child: &mut Child) -> Option<i32> {
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("agenthold did not exit within 10 s")
        .expect("wait for agenthold");
    status.code()
}

/// Waits (at most 10 s) until `path` exists and is not empty; returns its contents.
pub(crate) async fn wait_for_file(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.trim().is_empty()
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear within 10 s",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`wait_for_file`] for a file that the command of `child` writes: panics with agenthold's output if it
/// exits first.
pub(crate) async fn wait_for_file_from(path: &Path, child: &mut Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.trim().is_empty()
        {
            return text;
        }
        if let Some(status) = child.try_wait().expect("poll agenthold") {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = tokio::io::AsyncReadExt::read_to_string(&mut pipe, &mut stderr).await;
            }
            panic!(
                "agenthold ended ({status}) before {} appeared; stderr:\n{stderr}",
                path.display()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear within 10 s",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether process `pid` exists and is not a zombie (an orphan's zombie waits for a reaper that may
/// never come: it runs nothing).
pub(crate) fn process_alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) STATE …`: comm may contain spaces and parentheses, the state follows the last ')'.
    let state = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some(Some('Z' | 'X')) | None)
}

/// Waits (at most `within`) until process `pid` is gone; returns whether it is.
pub(crate) async fn wait_gone(pid: i32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while process_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// The pid written (as the first word) in `path`.
pub(crate) async fn read_pid(path: &Path) -> i32 {
    let text = wait_for_file(path).await;
    text.split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .expect("a pid in the file")
}

/// Every line of a `--log` file, parsed.
pub(crate) fn read_log(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Log entries whose `host` is `host`.
/// One-shot entries and long-lived connections' closing entries for `host` (the `phase: open` entry a
/// connection writes when it starts is left out).
pub(crate) fn entries_for<'a>(log: &'a [serde_json::Value], host: &str) -> Vec<&'a serde_json::Value> {
    log.iter()
        .filter(|e| e["host"] == host && e["phase"] != "open")
        .collect()
}

/// The value of `Key:` in a `/proc/PID/status` dump.
pub(crate) fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':').map(str::trim))
}

/// Names in `ip netns list` that start with `ahr-<pid>-` (the namespaces of one `agenthold run`).
pub(crate) fn namespaces_of(pid: u32) -> Vec<String> {
    let prefix = format!("ahr-{pid}-");
    ip_netns_list()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Every name in `ip netns list`.
pub(crate) fn ip_netns_list() -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    assert!(
        out.status.success(),
        "ip netns list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The run's tag (`ahr-<pid>-<tag>-…`, interfaces `ahg<tag>`/`ahs<tag>`) from `ip -o link` printed inside.
pub(crate) fn sandbox_tag(ip_link_output: &str) -> Option<String> {
    ip_link_output.split([' ', ':', '@']).find_map(|word| {
        let tag = word.strip_prefix("ahs")?;
        (tag.len() == 6 && tag.chars().all(|c| c.is_ascii_alphanumeric())).then(|| tag.to_owned())
    })
}

/// The host's veth interfaces and nftables tables at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostSnapshot {
    pub(crate) veths: BTreeSet<String>,
    pub(crate) nft_tables: BTreeSet<String>,
}

impl HostSnapshot {
    pub(crate) fn take() -> Self {
        let link = std::process::Command::new("ip")
            .args(["-o", "link", "show", "type", "veth"])
            .output();
        let link = link.expect("ip link");
        let veths = String::from_utf8_lossy(&link.stdout)
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|name| name.split('@').next().unwrap_or(name).to_owned())
            .collect();
        let nft = std::process::Command::new("nft")
            .args(["list", "tables"])
            .output()
            .expect("nft list tables");
        assert!(
            nft.status.success(),
            "nft list tables: {}",
            String::from_utf8_lossy(&nft.stderr)
        );
        let nft_tables = String::from_utf8_lossy(&nft.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        Self { veths, nft_tables }
    }

    /// Panics unless run `pid` (tag `tag`) left nothing behind: no `ahr-<pid>-*` namespace, no host link
    /// of its veth pair (nor any `ahg*`/`ahs*` link: they never belong on the host), and no nftables
    /// table on the host that was not there before and looks like the run's (`agenthold`, the gateway's
    /// table, which belongs in the gateway namespace). Other test suites on this machine may add links
    /// and tables of their own meanwhile (the Docker runtime's `agenthold_host` among them), so only the
    /// run's names are compared strictly; the counts are in the message.
    #[track_caller]
    pub(crate) fn assert_left_nothing(&self, pid: u32, tag: Option<&str>) {
        let namespaces = namespaces_of(pid);
        assert!(
            namespaces.is_empty(),
            "namespaces of run {pid} remain: {namespaces:?}"
        );
        if let Some(tag) = tag {
            let all = ip_netns_list();
            assert!(
                !all.iter().any(|n| n.contains(tag)),
                "a namespace with tag {tag} remains: {all:?}"
            );
        }
        let after = Self::take();
        let ours: Vec<_> = after
            .veths
            .iter()
            .filter(|v| v.starts_with("ahg") || v.starts_with("ahs") || tag.is_some_and(|t| v.contains(t)))
            .collect();
        assert!(
            ours.is_empty(),
            "agenthold links on the host: {ours:?} (host veths before: {}, after: {})",
            self.veths.len(),
            after.veths.len()
        );
        let new_tables: Vec<_> = after.nft_tables.difference(&self.nft_tables).collect();
        let ours: Vec<_> = new_tables
            .iter()
            .filter(|t| {
                t.split_whitespace().last() == Some(RUN_TABLE)
                    || t.contains("ahr")
                    || tag.is_some_and(|g| t.contains(g))
            })
            .collect();
        assert!(
            ours.is_empty(),
            "new agenthold nftables tables on the host: {ours:?} (tables before: {}, after: {})",
            self.nft_tables.len(),
            after.nft_tables.len()
        );
    }
}

// The command runs in its own PID namespace: the pids it sees (`$$`, `$!`) mean nothing on the host. The
// helpers below find the host's view of the jail's processes through the host's /proc: the jail is the
// PID namespace of those descendants of `agenthold run` that are not in agenthold's own, and a process's
// pid inside it is the last number of the `NSpid:` line of its /proc/PID/status.

/// A process as the host sees it: its pid in the host's PID namespace and its start time, so that a pid
/// reused by another process is never mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostProcess {
    /// The pid in the host's PID namespace.
    pub(crate) pid: i32,
    /// Start time in clock ticks after boot (field 22 of /proc/PID/stat).
    start: u64,
}

/// State, parent pid and start time of host process `pid`, from /proc/PID/stat.
fn proc_stat(pid: i32) -> Option<(char, i32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) STATE PPID …`: comm may contain spaces and parentheses, the rest follows the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, ppid, start))
}

impl HostProcess {
    /// Host process `pid` as it is now, if it exists.
    pub(crate) fn of(pid: i32) -> Option<Self> {
        proc_stat(pid).map(|(_, _, start)| Self { pid, start })
    }

    /// Whether it still runs: same pid, same start time, not a zombie.
    pub(crate) fn alive(&self) -> bool {
        proc_stat(self.pid).is_some_and(|(_, _, start)| start == self.start) && process_alive(self.pid)
    }

    /// Waits (at most `within`) until it no longer runs; returns whether it is gone.
    pub(crate) async fn wait_gone(&self, within: Duration) -> bool {
        // A reused pid keeps `wait_gone` waiting: then the start time tells.
        wait_gone(self.pid, within).await || !self.alive()
    }

    /// Its command line (empty once it is gone).
    pub(crate) fn cmdline(&self) -> Vec<String> {
        let raw = std::fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        if !self.alive() {
            return Vec::new();
        }
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }

    /// SIGKILL, only if it is still this process (cleanup after a failed check).
    pub(crate) fn kill(&self) {
        if self.alive() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Every pid in the host's /proc.
fn host_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The PID namespace of host process `pid` (`pid:[INODE]`).
pub(crate) fn pid_namespace(pid: i32) -> Option<String> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    Some(link.to_string_lossy().into_owned())
}

/// The PID namespace of the jail of the `agenthold run` whose pid is `agenthold`, once its init runs.
pub(crate) fn jail_pid_namespace(agenthold: u32) -> Option<String> {
    let agenthold = i32::try_from(agenthold).ok()?;
    let own = pid_namespace(agenthold)?;
    let parents: Vec<(i32, i32)> = host_pids()
        .into_iter()
        .filter_map(|pid| Some((pid, proc_stat(pid)?.1)))
        .collect();
    let mut generation = vec![agenthold];
    while !generation.is_empty() {
        let children: Vec<i32> = parents
            .iter()
            .filter(|(_, ppid)| generation.contains(ppid))
            .map(|(pid, _)| *pid)
            .collect();
        for child in &children {
            if let Some(ns) = pid_namespace(*child).filter(|ns| *ns != own) {
                return Some(ns);
            }
        }
        generation = children;
    }
    None
}

/// Every process in PID namespace `ns` now, with its pid inside the namespace.
pub(crate) fn processes_in_pid_namespace(ns: &str) -> Vec<(i32, HostProcess)> {
    host_pids()
        .into_iter()
        .filter(|pid| pid_namespace(*pid).as_deref() == Some(ns))
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let inner = status_field(&status, "NSpid")?
                .split_whitespace()
                .last()?
                .parse()
                .ok()?;
            Some((inner, HostProcess::of(pid)?))
        })
        .collect()
}

/// The host's view of the process whose pid is `ns_pid` inside the jail of the `agenthold run` whose pid
/// is `agenthold`; waits (at most 10 s) for it to appear.
pub(crate) async fn jail_process(agenthold: u32, ns_pid: i32) -> HostProcess {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = jail_pid_namespace(agenthold).and_then(|ns| {
            processes_in_pid_namespace(&ns)
                .into_iter()
                .find_map(|(inner, process)| (inner == ns_pid).then_some(process))
        });
        if let Some(process) = found {
            return process;
        }
        assert!(
            Instant::now() < deadline,
            "no process {ns_pid} in the jail of agenthold {agenthold} within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`jail_process`] for the pid the command wrote (as the first word) into `path`.
pub(crate) async fn jail_process_from_file(agenthold: u32, path: &Path) -> HostProcess {
    jail_process(agenthold, read_pid(path).await).await
}

impl Run<'_> {
    /// `FLAG VALUE`, for flags without a builder of their own (e.g. `--secrets FILE`).
    pub(crate) fn extra_flag(mut self, flag: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        self.flags.push(flag.into());
        self.flags.push(value.as_ref().to_owned());
        self
    }

    /// [`Run::output`] with agenthold (and so the command) started in working directory `dir`.
    pub(crate) async fn output_in(&self, dir: &Path, command: &[&str]) -> Outcome {
        let mut cmd = self.command(command);
        cmd.current_dir(dir);
        finish(cmd.spawn().expect("start agenthold")).await
    }
}

/// The nftables table `agenthold run` puts in its gateway namespace (agenthold-egress `nft::TABLE`).
const RUN_TABLE: &str = "agenthold";

/// [`RUNS`] across processes: an flock on a file in /tmp, shared by every test while its runs are alive,
/// exclusive for the test that must see stale namespaces survive. Two copies of this binary at once (or
/// another engineer's run of it) would otherwise remove each other's stale namespaces. Released when
/// dropped (the file is closed).
pub(crate) struct RunsFileLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl RunsFileLock {
    const PATH: &str = "/tmp/agenthold-server-integration.lock";

    async fn acquire(exclusive: bool) -> Self {
        tokio::task::spawn_blocking(move || {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(Self::PATH)
                .unwrap_or_else(|e| panic!("open {}: {e}", Self::PATH));
            let how = if exclusive {
                nix::fcntl::FlockArg::LockExclusive
            } else {
                nix::fcntl::FlockArg::LockShared
            };
            let lock = nix::fcntl::Flock::lock(file, how)
                .unwrap_or_else(|(_, e)| panic!("lock {}: {e}", Self::PATH));
            Self { _lock: lock }
        })
        .await
        .expect("lock task")
    }
}
