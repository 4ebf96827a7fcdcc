//! Timeouts and upstream failures (E4, E7): silent, half-sent and slow clients are cut at the sniff timeout,
//! idle connections at the idle timeout, and an upstream that refuses the connection is a 502 (plain HTTP,
//! absolute form, CONNECT) or a closed connection (TLS), logged as an upstream failure.

use std::time::Duration;

use agenthold_egress::Timeouts;
use agenthold_egress::log::{Decision, LogKind};
use serde_json::{Value, json};

use super::harness::{BLOCKED_ORIG, Harness, Setup, allow};

const SHORT: Timeouts = Timeouts {
    sniff: Duration::from_secs(1),
    connect: Duration::from_secs(1),
    idle: Duration::from_secs(2),
};

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// When the gateway closed the connection, asserted to lie in `[low, high]` seconds.
fn closed_within(what: &str, r: &Value, low: f64, high: f64) -> f64 {
    let after = r["closed_after"]
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: never closed: {r}"));
    assert!(
        after >= low && after <= high,
        "{what}: closed after {after:.2} s, expected {low}–{high} s: {r}"
    );
    after
}

// covers: E4, E7
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn silent_half_sent_and_slow_clients_are_cut_at_the_sniff_timeout() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"])).timeouts(SHORT)).await;
    let (gw, explicit) = (h.gw(0).to_string(), h.config.explicit_port.to_string());
    let head = hex("GET / HTTP/1.1\r\nHost: api.test\r\n\r\n");
    let absolute = hex("GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n");
    let (silent, half_hello, loris, explicit_silent, explicit_loris, non_web) = tokio::join!(
        h.py(0, &["cut", BLOCKED_ORIG, "443", "", "", "0.2", "6"]),
        h.py(
            0,
            &["cut", BLOCKED_ORIG, "443", "hello:api.test:40", "", "0.2", "6"]
        ),
        // One byte every 200 ms: the whole head would take 7 s.
        h.py(0, &["cut", BLOCKED_ORIG, "80", "", &head, "0.2", "6"]),
        h.py(0, &["cut", &gw, &explicit, "", "", "0.2", "6"]),
        h.py(0, &["cut", &gw, &explicit, "", &absolute, "0.2", "6"]),
        // A port where the server may speak first: after a short wait the connection is decided as other TCP
        // (here: an address nobody resolved, refused under the allowlist).
        h.py(0, &["cut", BLOCKED_ORIG, "5432", "", "", "0.2", "6"]),
    );
    let t = [
        closed_within("silent on 443", &silent, 0.9, 2.0),
        closed_within("half a ClientHello", &half_hello, 0.9, 2.0),
        closed_within("slow-loris head on 80", &loris, 0.9, 2.0),
        closed_within("silent on the explicit proxy", &explicit_silent, 0.9, 2.5),
        closed_within("slow-loris head on the explicit proxy", &explicit_loris, 0.9, 2.5),
        closed_within("silent on 5432", &non_web, 0.2, 0.9),
    ];
    eprintln!("closed after (s): {t:.2?}");
    assert!(
        loris["sent"].as_u64().unwrap() < 30,
        "the head was cut before it was complete: {loris}"
    );
    assert_eq!(h.web("api.test").total(), 0, "no partial request went upstream");
    // Control: a prompt client on the same ports is served.
    let ok = h
        .py(
            0,
            &[
                "session",
                BLOCKED_ORIG,
                "80",
                &json!(["GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"]).to_string(),
                "sequential",
            ],
        )
        .await;
    assert_eq!(ok[0]["status"], 200, "{ok}");
    h.close().await;
}

// covers: E4, E7
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"])).timeouts(SHORT)).await;
    let ca = h.ca_file();
    let proxy = h.explicit(0);
    let mut spliced = h.py_interactive(0, &["hold", "tls", BLOCKED_ORIG, "443", "api.test", &ca, "", "8"]);
    let mut tunnel = h.py_interactive(
        0,
        &["hold", "tls", "api.test", "443", "api.test", &ca, &proxy, "8"],
    );
    let mut plain = h.py_interactive(0, &["hold", "http", BLOCKED_ORIG, "80", "api.test", "", "", "8"]);
    for held in [&mut spliced, &mut tunnel, &mut plain] {
        let ready = held.next(Duration::from_secs(5)).await;
        assert_eq!(
            (ready["ready"].as_bool(), ready["status"].as_u64()),
            (Some(true), Some(200)),
            "{ready}"
        );
    }
    let limit = Duration::from_secs(6);
    let (spliced, tunnel, plain) = tokio::join!(spliced.next(limit), tunnel.next(limit), plain.next(limit));
    let t = [
        closed_within("idle spliced TLS", &spliced, 1.8, 3.5),
        closed_within("idle CONNECT tunnel", &tunnel, 1.8, 3.5),
        // A kept-alive plain HTTP connection waits for its next request head: the idle timeout bounds it
        // (the sniff timeout may bound it earlier).
        closed_within("idle kept-alive HTTP", &plain, 0.9, 3.5),
    ];
    eprintln!("idle closed after (s): {t:.2?}");
    let tls = h.wait_entries(0, LogKind::Tls, "api.test", 1).await;
    assert!(tls[0].bytes_up > 0 && tls[0].bytes_down > 0, "{tls:?}");
    h.wait_entries(0, LogKind::Connect, "api.test", 1).await;
    h.close().await;
}

// covers: E7, E16
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn refused_upstreams_answer_502_and_are_logged_as_upstream_failures() {
    let h = Harness::start(
        Setup::new()
            .policy(allow(&["api.test", "down.test", "slow.test"]))
            .refused("down.test", 80)
            .refused("down.test", 443)
            .stalled("slow.test", 80)
            .stalled("slow.test", 443)
            .timeouts(SHORT),
    )
    .await;
    let proxy = h.proxy_url(0);
    let plain = h.curl(0, &["http://down.test/x"]).await;
    let absolute = h.curl(0, &["-x", &proxy, "http://down.test/x"]).await;
    for (what, r) in [("transparent", &plain), ("absolute-form", &absolute)] {
        assert_eq!(r.status, 502, "{what}: {r:?}");
        assert!(
            r.body.contains("upstream failed") && r.body.contains("refused"),
            "{what}: {r:?}"
        );
    }
    let connect = h
        .py(
            0,
            &[
                "session",
                &h.gw(0).to_string(),
                &h.config.explicit_port.to_string(),
                &json!(["CONNECT down.test:443 HTTP/1.1\r\nHost: down.test:443\r\n\r\n"]).to_string(),
                "sequential",
            ],
        )
        .await;
    assert_eq!(connect[0]["status"], 502, "{connect}");
    assert!(
        connect[0]["body"].as_str().unwrap().contains("refused"),
        "{connect}"
    );
    let tls = h.curl(0, &["https://down.test/"]).await;
    assert_eq!(tls.code, 35, "the TLS connection is closed: {tls:?}");

    // An upstream that never answers the handshake: the connect timeout (1 s here) ends the wait.
    let started = std::time::Instant::now();
    let (slow_plain, slow_absolute, slow_tls) = tokio::join!(
        h.curl(0, &["http://slow.test/x"]),
        h.curl(0, &["-x", &proxy, "http://slow.test/x"]),
        h.curl(0, &["https://slow.test/"]),
    );
    let took = started.elapsed();
    for (what, r) in [("transparent", &slow_plain), ("absolute-form", &slow_absolute)] {
        assert_eq!(r.status, 502, "{what}: {r:?}");
        assert!(r.body.contains("timed out"), "{what}: {r:?}");
    }
    assert_eq!(slow_tls.code, 35, "{slow_tls:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );

    let failures = [
        (LogKind::Http, 2, Some(502)),
        (LogKind::Connect, 1, Some(502)),
        (LogKind::Tls, 1, None),
    ];
    for (kind, count, status) in failures {
        let entries = h.wait_entries(0, kind, "down.test", count).await;
        for e in entries {
            // Allowed by the policy, failed upstream: the reason says so, the decision stays "allowed".
            assert_eq!((e.decision, e.status), (Decision::Allowed, status), "{e:?}");
            assert!(
                e.reason
                    .as_ref()
                    .map(ToString::to_string)
                    .as_deref()
                    .unwrap_or_default()
                    .starts_with("upstream:"),
                "{e:?}"
            );
        }
    }
    h.close().await;
}
