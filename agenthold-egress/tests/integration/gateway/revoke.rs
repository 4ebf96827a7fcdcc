//! A policy change closes what it now denies (E21): open spliced TLS, CONNECT tunnels and other TCP to a
//! host the new policy refuses are closed within a second and logged `revoked`; what it still allows, and
//! other agents' connections, stay open.

use std::time::Duration;

use agenthold_egress::log::{Decision, LogKind, Phase};

use super::harness::{BLOCKED_ORIG, Harness, Setup, allow};

// covers: E21
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn a_policy_change_closes_open_connections_it_denies_within_a_second() {
    let h = Harness::start(
        Setup::new()
            .agents(2)
            .policy(allow(&["api.test", "ssh.test:22", "evil.test"]))
            .tcp("ssh.test", 22),
    )
    .await;
    let ca = h.ca_file();
    let proxy = h.explicit(0);
    let ssh = h.resolve(0, "ssh.test").await.to_string();
    let mut spliced = h.py_interactive(
        0,
        &["hold", "tls", BLOCKED_ORIG, "443", "api.test", &ca, "", "20"],
    );
    let mut tunnel = h.py_interactive(
        0,
        &["hold", "tls", "api.test", "443", "api.test", &ca, &proxy, "20"],
    );
    let mut tcp = h.py_interactive(0, &["many", "tcp", &ssh, "22", "1"]);
    let mut kept = h.py_interactive(
        0,
        &["hold", "tls", BLOCKED_ORIG, "443", "evil.test", &ca, "", "20"],
    );
    let mut other = h.py_interactive(
        1,
        &["hold", "tls", BLOCKED_ORIG, "443", "api.test", &ca, "", "20"],
    );
    for held in [&mut spliced, &mut tunnel, &mut kept, &mut other] {
        let ready = held.next(Duration::from_secs(5)).await;
        assert_eq!(ready["ready"], true, "{ready}");
    }
    assert_eq!(tcp.next(Duration::from_secs(5)).await["held"], 1);
    // Long-lived connections show in the log before they close (E16): an `open` entry each, a second in.
    let long_lived = [
        (LogKind::Tls, "api.test"),
        (LogKind::Connect, "api.test"),
        (LogKind::Tcp, "ssh.test"),
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while long_lived
        .iter()
        .any(|(kind, host)| h.opened(0, *kind, host).is_empty())
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (kind, host) in long_lived {
        assert_eq!(
            h.opened(0, kind, host).len(),
            1,
            "{kind:?} {host}: {:#?}",
            h.log(0)
        );
    }

    // api.test and ssh.test are no longer allowed for agent 0; evil.test still is.
    let changed = std::time::Instant::now();
    h.set_policy(0, allow(&["evil.test"]));
    let limit = Duration::from_secs(3);
    let timed = |next| async move {
        let r: serde_json::Value = next.await;
        (r, changed.elapsed())
    };
    let ((spliced, t1), (tunnel, t2)) = tokio::join!(timed(spliced.next(limit)), timed(tunnel.next(limit)));
    for (what, r, took) in [("spliced TLS", &spliced, t1), ("CONNECT tunnel", &tunnel, t2)] {
        assert!(r["closed_after"].is_f64(), "{what} stayed open: {r}");
        assert!(
            took < Duration::from_secs(1),
            "{what} closed {took:?} after the policy change"
        );
    }
    tcp.send("count").await;
    assert_eq!(tcp.next(limit).await["held"], 0, "the SSH connection stayed open");
    // The connection the new policy still allows, and the other agent's, are open.
    for held in [&mut kept, &mut other] {
        held.send("close").await;
        assert_eq!(held.next(limit).await["closed_by"], "client");
    }
    for (kind, host) in [
        (LogKind::Tls, "api.test"),
        (LogKind::Connect, "api.test"),
        (LogKind::Tcp, "ssh.test"),
    ] {
        let closed = h.wait_entries(0, kind, host, 1).await;
        assert!(
            closed.iter().any(|e| e.decision == Decision::Denied
                && e.reason.as_ref().map(ToString::to_string).as_deref() == Some("revoked")
                && e.phase == Some(Phase::Closed)),
            "{kind:?} {host}: {closed:#?}"
        );
    }
    let evil = h.wait_entries(0, LogKind::Tls, "evil.test", 1).await;
    assert_eq!(evil[0].decision, Decision::Allowed, "{evil:#?}");
    h.close().await;
}
