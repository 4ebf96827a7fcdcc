//! The tunnel listener's budgets (E20, S2): an agent flooding its tunnel port from inside its sandbox
//! (connections held with half a hello, bogus hellos as fast as it can) costs the runtime at most its
//! budget of connections, and another agent's sandboxd still (re)connects and keeps its tunnel.

use std::time::Duration;

use agenthold_core::sandbox::ExecRequest;
use agenthold_sandbox::tunnel::TunnelStatus;

use crate::support::*;

/// Open file descriptors of this process (the runtime under test runs in it).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// The flood, from inside the attacking sandbox, for 20 s: rounds of 50 new connections that send half a
/// hello and stay open (closed by the flooder after 10 s) and 50 bogus hellos on connections closed at
/// once. Prints how many of each it made.
const FLOOD: &str = r#"
import os, socket, time
host, port = os.environ["AGENTHOLD_TUNNEL"].rsplit(":", 1)
addr = (host, int(port))
half = b"AGENTHOLD-TUNNEL 1 " + os.environ["AGENTHOLD_AGENT"].encode() + b" "
held, opened, bogus = [], 0, 0
end = time.time() + 20
while time.time() < end:
    for i in range(50):
        try:
            s = socket.create_connection(addr, timeout=2)
            s.sendall(half)
            held.append((time.time(), s))
            opened += 1
        except OSError:
            pass
    for i in range(50):
        try:
            s = socket.create_connection(addr, timeout=2)
            s.sendall(b"AGENTHOLD-TUNNEL 1 x " + b"0" * 64 + b"\n")
            s.close()
            bogus += 1
        except OSError:
            pass
    now, kept = time.time(), []
    for t, s in held:
        if now - t > 10:
            s.close()
        else:
            kept.append((t, s))
    held = kept
print(opened, bogus)
"#;

// covers: E20, S2
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_tunnel_flood_is_bounded_and_another_agents_tunnel_reconnects() {
    let env = Env::start().await;
    env.guard(async {
        let attacker = env.sandbox(None).await;
        let victim = env.sandbox(None).await;
        assert!(
            env.tunnel_comes_up(&victim).await,
            "the victim's tunnel does not come up"
        );
        let baseline = open_fds();
        let flooding = std::sync::atomic::AtomicBool::new(true);
        let flood = async {
            let request = ExecRequest {
                argv: vec!["python3".into(), "-c".into(), FLOOD.into()],
                timeout: Some(Duration::from_secs(90)),
                ..ExecRequest::default()
            };
            let out = env.runtime.exec_request(&attacker, request).await;
            flooding.store(false, std::sync::atomic::Ordering::SeqCst);
            Out::from(out.expect("exec"))
        };
        let victim_side = async {
            // Let the flood build up, then restart the victim: its new boot must connect during the flood.
            tokio::time::sleep(Duration::from_secs(6)).await;
            env.runtime.stop(&victim).await.unwrap();
            env.runtime.start(&victim).await.unwrap();
            wait_for(Duration::from_secs(14), || async {
                env.runtime.tunnel_status(&victim) == TunnelStatus::Connected
            })
            .await
        };
        let sampler = async {
            let mut peak = 0;
            while flooding.load(std::sync::atomic::Ordering::SeqCst) {
                peak = peak.max(open_fds());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            peak
        };
        let (out, reconnected, peak) = tokio::join!(flood, victim_side, sampler);
        let out = out.ok();
        eprintln!(
            "flood: {} (held, bogus); descriptors {baseline} -> {peak}",
            out.stdout.trim()
        );
        assert!(
            reconnected.is_some(),
            "the victim's sandboxd did not reconnect during the flood"
        );
        assert!(
            peak < baseline + 200,
            "descriptors grew from {baseline} to {peak} during the flood"
        );
        // The counters show the flood, cut down to the attacker's budget; the victim's listener refused
        // nothing.
        let limits = agenthold_sandbox::tunnel::TunnelLimits::default();
        let counters = env.runtime.agent_tunnel_counters(&attacker);
        eprintln!(
            "attacker: {counters:?}\nvictim: {:?}",
            env.runtime.agent_tunnel_counters(&victim)
        );
        assert!(counters.refused_over_limit > 1000, "{counters:?}");
        assert!(counters.open <= limits.per_agent as u64, "{counters:?}");
        let theirs = env.runtime.agent_tunnel_counters(&victim);
        assert_eq!(theirs.refused_over_limit, 0, "{theirs:?}");
        assert!(theirs.authenticated >= 2, "both boots authenticated: {theirs:?}");
        env.sh(&victim, &format!("curl -sS -m 10 https://{ALLOWED}/ >/dev/null"))
            .await
            .ok();
        // The attacker's own sandboxd gets its tunnel back once the flood ends.
        assert!(
            env.tunnel_comes_up(&attacker).await,
            "the attacker's own tunnel did not come back"
        );
    })
    .await;
}
