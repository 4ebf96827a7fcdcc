//! Budgets (E20): one agent exhausting its connection budget, with CONNECT tunnels (which the old cap did
//! not count) and transparent connections, never starves another agent; the gateway counts what it refused.

use std::time::Duration;

use agenthold_egress::Limits;

use super::harness::{Harness, Setup, allow};

const PER_AGENT: usize = 24;

// covers: E20
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn one_agent_at_its_budget_never_starves_another() {
    let h = Harness::start(
        Setup::new()
            .agents(2)
            .policy(allow(&["api.test", "ssh.test:22"]))
            .tcp("ssh.test", 22)
            .limits(Limits {
                connections: 40,
                connections_per_agent: PER_AGENT,
                requests_per_agent: 8,
            }),
    )
    .await;
    let gw = h.gw(0).to_string();
    let port = h.config.explicit_port.to_string();
    // Agent 0 opens far more tunnels than its budget and holds them.
    let mut tunnels = h.py_interactive(0, &["many", "connect", &gw, &port, "60", "ssh.test:22"]);
    let held = tunnels.next(Duration::from_secs(20)).await;
    assert_eq!(
        held["held"], PER_AGENT,
        "tunnels count against the budget: {held}"
    );
    // Its next connections are refused at once, transparent ones included.
    let refused = h.curl(0, &["-m", "3", "https://api.test/more"]).await;
    assert_ne!(refused.code, 0, "{refused:?}");
    // The other agent is served, while agent 0 is at its budget (the gateway-wide limit of 40 keeps a
    // reserve of 5 that agent 0, over its fair share, cannot take).
    h.curl(1, &["https://api.test/other"]).await.echo();
    let mut other = h.py_interactive(
        1,
        &[
            "many",
            "connect",
            &h.gw(1).to_string(),
            &port,
            "30",
            "ssh.test:22",
        ],
    );
    let other_held = other.next(Duration::from_secs(20)).await;
    assert_eq!(other_held["held"], 40 - PER_AGENT, "{other_held}");
    let a0 = h.gateway.agent_stats(h.id(0)).unwrap();
    assert_eq!(a0.connections, PER_AGENT, "{a0:?}");
    assert!(a0.refused_connections >= 36, "{a0:?}");
    let total = h.gateway.stats();
    assert_eq!((total.connections, total.connection_limit), (40, 40), "{total:?}");
    // Released, agent 0 is served again.
    other.send("done").await;
    tunnels.send("done").await;
    let (_, _) = tokio::join!(
        other.next(Duration::from_secs(5)),
        tunnels.next(Duration::from_secs(5))
    );
    drop((other, tunnels));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while h.gateway.stats().connections > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.curl(0, &["https://api.test/again"]).await.echo();
    h.close().await;
}
