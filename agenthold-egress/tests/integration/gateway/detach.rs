//! Detaching an agent (the sandbox is stopped or removed): its open connections are closed at once, new
//! connections and queries find nothing, other agents are untouched, and attaching it again serves it again
//! (E3, E16).

use std::time::{Duration, Instant};

use agenthold_egress::log::LogKind;

use super::harness::{BLOCKED_ORIG, Harness, Setup, allow};

// covers: E3, E16
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn detach_closes_open_connections_and_refuses_new_ones() {
    let h = Harness::start(Setup::new().agents(2).policy(allow(&["api.test"]))).await;
    let ca = h.ca_file();
    let proxy = h.explicit(0);
    let mut spliced = h.py_interactive(
        0,
        &["hold", "tls", BLOCKED_ORIG, "443", "api.test", &ca, "", "10"],
    );
    let mut tunnel = h.py_interactive(
        0,
        &["hold", "tls", "api.test", "443", "api.test", &ca, &proxy, "10"],
    );
    let mut plain = h.py_interactive(0, &["hold", "http", BLOCKED_ORIG, "80", "api.test", "", "", "10"]);
    let mut other = h.py_interactive(
        1,
        &["hold", "tls", BLOCKED_ORIG, "443", "api.test", &ca, "", "10"],
    );
    for held in [&mut spliced, &mut tunnel, &mut plain, &mut other] {
        assert_eq!(held.next(Duration::from_secs(5)).await["ready"], true);
    }
    let served = h.web("api.test").total();
    assert_eq!(served, 4);

    let detached = Instant::now();
    h.gateway.detach(h.id(0));
    let limit = Duration::from_secs(3);
    let (spliced, tunnel, plain) = tokio::join!(spliced.next(limit), tunnel.next(limit), plain.next(limit));
    for (what, closed) in [
        ("spliced TLS", &spliced),
        ("CONNECT tunnel", &tunnel),
        ("kept-alive HTTP", &plain),
    ] {
        let after = closed["closed_after"]
            .as_f64()
            .unwrap_or_else(|| panic!("{what} not closed: {closed}"));
        assert!(after < 10.0, "{what}: {closed}");
    }
    let took = detached.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "open connections closed {took:?} after detach"
    );

    // New connections and queries: nothing listens for agent 0 any more.
    let gw = h.gw(0).to_string();
    let (https, http, explicit, dns) = tokio::join!(
        h.py(0, &["https", BLOCKED_ORIG, "443", "api.test", &ca, "/after"]),
        h.curl(
            0,
            &["-H", "Host: api.test", &format!("http://{BLOCKED_ORIG}/after")]
        ),
        h.curl(0, &["-x", &h.proxy_url(0), "http://api.test/after"]),
        h.py(0, &["dns", &gw, "api.test", "A", "udp"]),
    );
    assert!(
        https["error"].as_str().unwrap_or_default().contains("Refused"),
        "{https}"
    );
    assert_eq!(http.code, 7, "connection refused: {http:?}");
    assert_eq!(explicit.code, 7, "connection refused: {explicit:?}");
    assert!(dns["error"].is_string(), "{dns}");
    assert_eq!(
        h.web("api.test").total(),
        served,
        "nothing reached the upstream after detach"
    );
    // The closed connections were logged as they ended.
    assert!(
        h.entries(0, LogKind::Tls, "api.test").len() == 1
            && h.entries(0, LogKind::Connect, "api.test").len() == 1
    );

    // The other agent's connection is still open and its new connections still work.
    h.curl(1, &["https://api.test/still"]).await.echo();
    other.close().await;
    assert_eq!(
        other.next(Duration::from_secs(3)).await["closed_by"],
        "client",
        "agent 1's connection stayed open"
    );

    // Attached again (a reconcile), on fresh sockets: served again, DNS included.
    h.reattach(0).await;
    h.curl(0, &["https://api.test/reattached"]).await.echo();
    h.close().await;
}
