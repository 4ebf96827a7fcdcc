//! Attacks from inside a sandbox (ARCHITECTURE.md §4.4): every host address, another agent's sandbox and
//! gateway address, the gateway's own ports, the metadata address, UDP, ICMP, spoofed sources, routes, raw
//! sockets, capabilities; then the resource limits (a fork loop against the PID limit, an allocation
//! beyond the memory limit).

use std::time::Duration;

use agenthold_core::sandbox::ExecRequest;
use agenthold_core::{AgentId, SandboxSpec};
use sandboxd::contract::SANDBOXD;

use crate::probe::{CANARY_BANNER, Canary, Outcome, Probe, host_addresses, primary_v4};
use crate::support::*;

/// What agent B's listener answers; seeing it anywhere in A means A reached B.
const B_BANNER: &str = "B-LISTENER";

/// A listener inside a sandbox on TCP 8000 and 8443 and UDP 8001 that logs every peer to
/// `/tmp/listener.hits` and answers with [`B_BANNER`].
const LISTENER: &str = r#"
import select, socket
def log(line):
    with open("/tmp/listener.hits", "a") as f:
        f.write(line + "\n")
tcp = []
for port in (8000, 8443):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64); tcp.append(s)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 8001))
open("/tmp/listener.ready", "w").write("ready")
while True:
    ready, _, _ = select.select(tcp + [u], [], [])
    for s in ready:
        if s is u:
            data, peer = u.recvfrom(1500); log("udp %s" % peer[0]); u.sendto(b"B-LISTENER", peer)
        else:
            c, peer = s.accept(); log("tcp %s" % peer[0])
            try:
                c.sendall(b"B-LISTENER\n")
            finally:
                c.close()
"#;

/// Start [`LISTENER`] in `agent` and check it records a local connection (so silence later means
/// something).
pub async fn start_listener(env: &Env, agent: &AgentId) {
    env.runtime
        .write_file(agent, "/tmp/listener.py", LISTENER.as_bytes())
        .await
        .unwrap();
    env.sh(agent, "nohup python3 /tmp/listener.py >/tmp/listener.log 2>&1 &")
        .await
        .ok();
    let ready = wait_for(Duration::from_secs(10), || async {
        env.sh(agent, "test -f /tmp/listener.ready").await.code == 0
    });
    assert!(ready.await.is_some(), "the listener in {agent} does not start");
    let control =
        "python3 -c \"import socket; print(socket.create_connection(('127.0.0.1', 8000)).recv(64))\"";
    let out = env.sh(agent, control).await.ok();
    assert!(out.stdout.contains(B_BANNER), "{out}");
    assert_eq!(listener_hits(env, agent).await, vec!["tcp 127.0.0.1".to_owned()]);
}

/// Peers the listener in `agent` has seen.
pub async fn listener_hits(env: &Env, agent: &AgentId) -> Vec<String> {
    let out = env
        .sh(agent, "cat /tmp/listener.hits 2>/dev/null; true")
        .await
        .ok();
    out.stdout.lines().map(str::to_owned).collect()
}

fn find<'a>(outcomes: &'a [Outcome], kind: &str, host: &str, port: u16) -> &'a Outcome {
    outcomes
        .iter()
        .find(|o| o.kind == kind && o.host == host && o.port == port)
        .unwrap_or_else(|| panic!("no outcome for {kind} {host}:{port}"))
}

// covers: E1, E3, E6, S2, S4
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn nothing_but_the_gateway_answers_a_sandbox() {
    let env = Env::start().await;
    env.guard(async {
        // Open policy: whatever is refused here is refused by the address guard and the datapath, not by an
        // allowlist (E6: "whatever the policy").
        let open = SandboxSpec {
            policy: agenthold_core::NetworkPolicy::default(),
            ..spec()
        };
        let a = env.sandbox(Some(open.clone())).await;
        let b = env.sandbox(Some(open)).await;
        start_listener(&env, &b).await;
        let (net_a, net_b, b_ip) = (network(&a).await, network(&b).await, container(&b).await.ip);
        let canary = Canary::start(3).await;
        let addrs = host_addresses();
        canary.self_test(primary_v4(&addrs)).await;
        let b_log_before = env.runtime.request_log(&b).len();

        let mut probes = Vec::new();
        let bridge_v4: Vec<_> = addrs
            .iter()
            .filter(|h| h.iface == net_a.bridge && h.addr.is_ipv4())
            .collect();
        assert!(
            bridge_v4.is_empty(),
            "E1: the host has an IPv4 address on the agent bridge: {bridge_v4:?}"
        );
        for h in &addrs {
            let target = h.as_seen_from_sandbox();
            for port in &canary.tcp_ports {
                probes.push(Probe::tcp(&target, *port, "hello\n"));
            }
            probes.push(Probe::udp(&target, canary.udp_port));
            probes.push(Probe::icmp(&target));
        }
        let tunnel_hello = sandboxd::contract::tunnel::hello(b.as_str(), &"0".repeat(64));
        let via_b = "GET http://allowed.test/via-b HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
        for port in [8000, 8443, 22, 80] {
            probes.push(Probe::tcp(b_ip, port, "hello\n"));
        }
        probes.push(Probe::udp(b_ip, 8001));
        probes.push(Probe::icmp(b_ip));
        for (port, payload) in [
            (15001, "hello\n"),
            (15002, via_b),
            (15003, tunnel_hello.as_str()),
            (15053, ""),
            (80, ""),
        ] {
            probes.push(Probe::tcp(net_b.gateway, port, payload));
            probes.push(Probe::tcp(holder_addr(net_b.subnet), port, payload));
        }
        probes.push(Probe::udp(net_b.gateway, 15053));
        probes.push(Probe::icmp(net_b.gateway));
        let own = net_a.gateway;
        for port in [15001, 15053, 22, 8080] {
            probes.push(Probe::tcp(own, port, ""));
        }
        probes.push(Probe::tcp(
            own,
            15002,
            "GET http://allowed.test/control HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        ));
        probes.push(Probe::tcp(own, 15003, "AGENTHOLD-TUNNEL 1 nobody x\n"));
        probes.push(Probe::udp(own, 15053));
        probes.push(Probe::udp(own, 123));
        probes.push(Probe::icmp(own));
        probes.push(Probe::tcp(
            "169.254.169.254",
            80,
            "GET /latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n",
        ));
        probes.push(Probe::udp("169.254.169.254", 123));
        probes.push(Probe::icmp("169.254.169.254"));
        probes.push(Probe::icmp("127.0.0.1"));
        let outcomes = crate::probe::run(&env.runtime, &a, &probes, Duration::from_secs(3)).await;
        let report: Vec<String> = outcomes.iter().map(ToString::to_string).collect();
        let report = report.join("\n");
        eprintln!("probes from {a}:\n{report}");

        // Positive controls: the probe machinery sees answers where there must be some.
        assert!(
            find(&outcomes, "icmp", "127.0.0.1", 0).reply,
            "ICMP control:\n{report}"
        );
        let explicit = find(&outcomes, "tcp", &own.to_string(), 15002);
        assert!(
            explicit.data.starts_with("HTTP/1.1 200"),
            "explicit proxy control: {explicit}"
        );
        let tunnel = find(&outcomes, "tcp", &own.to_string(), 15003);
        assert!(tunnel.data.starts_with("ERR"), "tunnel control: {tunnel}");

        // Nothing else answered, whatever the address, port or protocol.
        assert!(
            canary.hits().is_empty(),
            "the host was reached: {:?}\n{report}",
            canary.hits()
        );
        assert!(
            listener_hits(&env, &b).await.len() == 1,
            "agent B was reached: {:?}",
            listener_hits(&env, &b).await
        );
        for o in &outcomes {
            let control =
                o.host == own.to_string() && (o.port == 15002 || o.port == 15003) || o.host == "127.0.0.1";
            if control {
                continue;
            }
            for marker in [CANARY_BANNER, B_BANNER, "ERR", "OK\n", "200 OK", "upstream-ok"] {
                assert!(!o.data.contains(marker), "{o}\n{report}");
            }
            assert!(!o.reply, "a reply came back: {o}\n{report}");
        }
        for port in [15001, 15053, 22, 8080] {
            let o = find(&outcomes, "tcp", &own.to_string(), port);
            assert!(!o.connected, "the gateway's port {port} answers directly: {o}");
        }
        let b_log = env.runtime.request_log(&b);
        assert_eq!(
            b_log.len(),
            b_log_before,
            "A's traffic was attributed to B: {b_log:#?}"
        );
        let a_log = env.runtime.request_log(&a);
        assert!(
            a_log.iter().any(|e| e.host.as_deref() == Some("169.254.169.254")
                && e.reason.as_ref().map(ToString::to_string).as_deref() == Some("blocked_address")),
            "E6: the metadata address is refused as such: {a_log:#?}"
        );
        let (out, _) = (
            env.sh(
                &a,
                "curl -sS -m 5 -o /dev/null -w '%{http_code}' http://169.254.169.254/latest/",
            )
            .await,
            (),
        );
        assert_eq!(
            out.stdout, "403",
            "explicit proxy to the metadata address:\n{out}"
        );
    })
    .await;
}

/// The sandbox is no endpoint of the engine's: it starts with loopback only (network `none`) and the runtime
/// plugs it into its network after every start, also after one made outside agenthold (`docker stop` and
/// `docker start`), which the event watcher sees. It has `.1`, a default route via `.2`, and no IPv6.
// covers: E1, E2
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn the_runtime_plugs_the_sandbox_in_at_every_start() {
    let env = Env::start().await;
    env.guard(async {
        let a = env.sandbox(None).await;
        let net = network(&a).await;
        let facts = container(&a).await;
        let hc = host_config(&a).await;
        assert_eq!(hc.network_mode.as_deref(), Some("none"), "no engine endpoint");
        assert_eq!(facts.ip, nth(net.subnet, 1), "the sandbox is .1");
        let inside = "ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1; ip -6 -o addr show dev eth0; \
                      cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6; ip route show default";
        let out = env.sh(&a, inside).await.ok();
        let lines: Vec<&str> = out.stdout.lines().map(str::trim).collect();
        assert_eq!(
            lines,
            [
                "lo",
                "eth0",
                "1",
                &format!("default via {} dev eth0", net.gateway)
            ],
            "interfaces, IPv6 and route:\n{out}"
        );
        let curl = format!("curl -sS -m 5 --noproxy '*' -o /dev/null -w '%{{http_code}}' https://{ALLOWED}/");
        assert_eq!(env.sh(&a, &curl).await.stdout, "200", "egress once created");

        let name = format!("agenthold-{a}");
        let stopped = host("docker", &["stop", "-t", "1", &name]);
        assert!(stopped.status.success(), "{stopped:?}");
        let started = host("docker", &["start", &name]);
        assert!(started.status.success(), "{started:?}");
        let plugged = wait_for(Duration::from_secs(30), || async {
            env.sh(&a, "ip -o -4 addr show dev eth0").await.code == 0
        });
        assert!(
            plugged.await.is_some(),
            "a sandbox started outside agenthold is not plugged in again"
        );
        assert_eq!(container(&a).await.ip, nth(net.subnet, 1));
        assert_eq!(
            env.sh(&a, &curl).await.stdout,
            "200",
            "egress after a start outside agenthold"
        );
    })
    .await;
}

/// The boot token's directory is a host directory the sandbox can write in (sandboxd deletes the token
/// there). Root in the sandbox plants a link at the token's name, and other files, and opens the
/// directory's mode; the runtime's next boot replaces the link instead of writing through it, closes the
/// directory again, and the sandbox boots with the new token. The removal takes the directory with it.
// covers: S2
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_link_planted_in_the_boot_directory_is_never_followed() {
    use std::os::unix::fs::PermissionsExt as _;

    let env = Env::start().await;
    env.guard(async {
        let a = env.sandbox(None).await;
        let boot_dir = env.dir.path().join("run").join("boot").join(a.as_str());
        let entries = |dir: &std::path::Path| -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        let left = env.sh(&a, "ls -A /.agenthold/boot.d").await.ok();
        assert_eq!(left.stdout, "", "sandboxd deletes the token once read");
        assert!(entries(&boot_dir).is_empty(), "nor is it left on the host");

        let victim_dir = tempfile::tempdir().unwrap();
        let victim = victim_dir.path().join("victim");
        std::fs::write(&victim, "original").unwrap();
        let plant = format!(
            "ln -s {v} /.agenthold/boot.d/token && ln -s {v} /.agenthold/boot.d/.agenthold-x && \
             chmod 777 /.agenthold/boot.d && echo junk > /.agenthold/boot.d/junk",
            v = victim.display()
        );
        env.sh(&a, &plant).await.ok();
        env.runtime.stop(&a).await.unwrap();
        env.runtime.start(&a).await.unwrap();
        assert!(
            env.tunnel_comes_up(&a).await,
            "the sandbox did not boot with its new token"
        );
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "original",
            "written through the link"
        );
        assert!(
            !std::fs::symlink_metadata(&victim)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let mode = std::fs::metadata(&boot_dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the directory is closed again at the boot");
        // The token replaced the link and was deleted once read; what else was planted stays, harmless.
        assert_eq!(entries(&boot_dir), [".agenthold-x", "junk"]);

        env.runtime.remove(&a).await.unwrap();
        assert!(!boot_dir.exists(), "the directory goes with the sandbox");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original");
    })
    .await;
}

// covers: E2, S1
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_sandbox_has_no_network_privileges() {
    let env = Env::start().await;
    env.guard(async {
        let a = env.sandbox(None).await;
        let b = env.sandbox(None).await;
        let (net_a, net_b) = (network(&a).await, network(&b).await);
        let spoofed = nth(net_b.subnet, 9);

        let out = env
            .sh(&a, "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status")
            .await
            .ok();
        for line in out.stdout.lines().filter(|l| l.starts_with("Cap")) {
            let caps = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
            for (bit, name) in [
                (12, "NET_ADMIN"),
                (13, "NET_RAW"),
                (21, "SYS_ADMIN"),
                (19, "SYS_PTRACE"),
            ] {
                assert_eq!(caps & (1 << bit), 0, "{name} in {line}");
            }
        }
        assert!(out.stdout.contains("NoNewPrivs:\t1"), "{out}");

        for cmd in [
            format!("ip addr add {spoofed}/{} dev eth0", net_b.subnet.prefix_len()),
            format!("ip route add 172.17.0.0/16 via {}", net_a.gateway),
            format!("ip route replace default via {}", holder_addr(net_a.subnet)),
            "ip link set eth0 down".to_owned(),
        ] {
            let out = env.sh(&a, &cmd).await;
            assert!(
                out.code != 0 && out.stderr.contains("Operation not permitted"),
                "{cmd}:\n{out}"
            );
        }
        let out = env.sh(&a, "ip route show default").await.ok();
        assert_eq!(
            out.stdout.trim(),
            format!("default via {} dev eth0", net_a.gateway),
            "E2: route via .2"
        );
        // The sandbox's resolv.conf (the runtime's, mounted read-only) names `.2`, and so does its
        // `--dns`: queries end at the gateway's resolver (E9), which answers unlisted names with NXDOMAIN.
        let hc = host_config(&a).await;
        assert_eq!(
            hc.dns,
            Some(vec![net_a.gateway.to_string()]),
            "E2: the sandbox's DNS server is .2"
        );
        let out = env
            .sh(
                &a,
                "grep nameserver /etc/resolv.conf; getent hosts not-listed.example; echo rc=$?",
            )
            .await;
        assert!(out.stdout.contains("rc=2"), "an unlisted name resolved:\n{out}");
        let log = env.runtime.request_log(&a);
        assert!(
            log.iter()
                .any(|e| e.host.as_deref() == Some("not-listed.example")),
            "not seen by the gateway: {log:#?}"
        );

        let program = format!(
            r#"
import socket, struct
def attempt(name, f):
    try:
        f(); print(name, "ALLOWED")
    except OSError as e:
        print(name, "refused", e.errno)
attempt("raw-ip", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW))
attempt("raw-tcp", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)))
def transparent():
    s = socket.socket(); s.setsockopt(socket.SOL_IP, 19, 1)  # IP_TRANSPARENT
attempt("ip-transparent", transparent)
# IP_FREEBIND needs no privilege: bind another agent's address and try to talk to our gateway with it.
def freebind_udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setsockopt(socket.SOL_IP, 15, 1)
    s.bind(("{spoofed}", 0)); s.settimeout(2)
    q = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"\x07allowed\x04test\x00" + struct.pack("!HH", 1, 1)
    s.sendto(q, ("{gw}", 53)); s.recv(512)
def freebind_tcp():
    s = socket.socket(); s.setsockopt(socket.SOL_IP, 15, 1)
    s.bind(("{spoofed}", 0)); s.settimeout(2); s.connect(("{gw}", 15002))
attempt("spoof-udp", freebind_udp)
attempt("spoof-tcp", freebind_tcp)
"#,
            gw = net_a.gateway
        );
        let out = python(&env.runtime, &a, &program).await.ok();
        for name in [
            "raw-ip",
            "raw-tcp",
            "packet",
            "ip-transparent",
            "spoof-udp",
            "spoof-tcp",
        ] {
            assert!(out.stdout.contains(&format!("{name} refused")), "{name}:\n{out}");
        }

        let facts = container(&a).await;
        let inspect = docker().await.inspect_container(&facts.id, None).await.unwrap();
        let hc = inspect.host_config.unwrap();
        assert_eq!(hc.privileged, Some(false));
        assert!(
            hc.cap_drop
                .unwrap_or_default()
                .iter()
                .any(|c| c.contains("NET_RAW"))
        );
        assert!(hc.cap_add.unwrap_or_default().is_empty());
        assert!(
            hc.security_opt
                .unwrap_or_default()
                .iter()
                .any(|o| o.starts_with("no-new-privileges"))
        );
        let mounts = inspect.mounts.unwrap_or_default();
        assert!(
            mounts
                .iter()
                .all(|m| !m.source.as_deref().unwrap_or_default().contains("docker.sock")),
            "{mounts:?}"
        );
        let sandboxd = mounts.iter().find(|m| m.destination.as_deref() == Some(SANDBOXD));
        assert_eq!(
            sandboxd.and_then(|m| m.rw),
            Some(false),
            "sandboxd is mounted read-only: {mounts:?}"
        );
        let out = env
            .sh(
                &a,
                &format!(
                    "ls /var/run/docker.sock /run/docker.sock; \
                     grep ' {SANDBOXD} ' /proc/self/mountinfo"
                ),
            )
            .await;
        assert!(
            out.stderr.matches("No such file").count() == 2,
            "no Docker socket:\n{out}"
        );
        assert!(
            out.stdout.contains(&format!("{SANDBOXD} ro,")),
            "sandboxd read-only inside:\n{out}"
        );
    })
    .await;
}

// covers: S1
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn pid_and_memory_limits_hold() {
    let env = Env::start().await;
    env.guard(async {
        let spec = SandboxSpec {
            pids: Some(64),
            memory_bytes: Some(128 * 1024 * 1024),
            ..spec()
        };
        let a = env.sandbox(Some(spec)).await;
        let facts = container(&a).await;
        let hc = host_config(&a).await;
        assert_eq!((hc.pids_limit, hc.memory), (Some(64), Some(128 * 1024 * 1024)));

        // A bounded fork loop: the PID limit stops it with EAGAIN, and the sandbox survives.
        let program = r#"
import os, time
children, refused = [], None
for i in range(200):
    try:
        pid = os.fork()
    except OSError as e:
        refused = e.errno; break
    if pid == 0:
        time.sleep(20); os._exit(0)
    children.append(pid)
print("forked", len(children), "refused", refused)
for pid in children:
    os.kill(pid, 9)
for pid in children:
    os.waitpid(pid, 0)
"#;
        let out = python(&env.runtime, &a, program).await.ok();
        let forked: usize = out.stdout.split_whitespace().nth(1).unwrap().parse().unwrap();
        let held = forked < 64 && out.stdout.contains("refused 11");
        assert!(held, "the PID limit did not hold (EAGAIN = 11):\n{out}");
        let max = env.sh(&a, "cat /sys/fs/cgroup/pids/pids.max").await.stdout;
        eprintln!("fork loop: {} (pids.max {})", out.stdout.trim(), max.trim());
        env.sh(&a, "echo alive").await.ok();

        // Memory: writing 512 MiB under a 128 MiB limit (no swap) gets the writer OOM-killed.
        let request = ExecRequest {
            argv: vec![
                "python3".into(),
                "-c".into(),
                "x = b'\\x01' * (512 << 20); print(len(x))".into(),
            ],
            timeout: Some(Duration::from_secs(60)),
            ..ExecRequest::default()
        };
        let out: Out = env.runtime.exec_request(&a, request).await.unwrap().into();
        assert_eq!(out.code, 137, "allocating beyond the limit:\n{out}");
        let out = env
            .sh(
                &a,
                "cd /sys/fs/cgroup/memory; cat memory.limit_in_bytes memory.failcnt; \
                 grep oom_kill memory.oom_control",
            )
            .await
            .ok();
        eprintln!("memory after the OOM kill: {}", out.stdout.replace('\n', " "));
        assert!(out.stdout.starts_with("134217728\n"), "{out}");
        let killed = out
            .stdout
            .lines()
            .any(|l| l.starts_with("oom_kill ") && l != "oom_kill 0");
        assert!(killed, "the OOM kill is reported:\n{out}");
        assert_eq!(env.sh(&a, "echo alive").await.ok().stdout.trim(), "alive");
        assert_eq!(
            container(&a).await.started_at,
            facts.started_at,
            "the sandbox was not restarted"
        );
    })
    .await;
}
