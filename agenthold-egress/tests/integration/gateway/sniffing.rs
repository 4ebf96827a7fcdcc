//! The ClientHello as a sniffer might not expect it (E4): split over two TLS records, or sent one byte per
//! TCP segment. The gateway still decides by its SNI (never falling back to the address, never treating it
//! as another protocol).

use agenthold_egress::log::{Decision, LogKind};

use super::harness::{BLOCKED_ORIG, Harness, Setup, allow};

// covers: E4
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn a_split_client_hello_is_still_decided_by_its_sni() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;
    for how in ["records", "bytes"] {
        let (api, evil) = tokio::join!(
            h.py(0, &["split-hello", BLOCKED_ORIG, "443", "api.test", how]),
            h.py(0, &["split-hello", BLOCKED_ORIG, "443", "evil.test", how]),
        );
        assert!(api["closed_after"].is_number(), "{how}: {api}");
        assert_eq!(evil["received"], 0, "{how}: {evil}");
    }
    // api.test: allowed and dialled (its upstream then refuses our minimal hello); evil.test: refused.
    let api = h.wait_entries(0, LogKind::Tls, "api.test", 2).await;
    assert!(api.iter().all(|e| e.decision == Decision::Allowed), "{api:#?}");
    let evil = h.entries(0, LogKind::Tls, "evil.test");
    assert_eq!(evil.len(), 2, "{:#?}", h.log(0));
    assert!(
        evil.iter()
            .all(|e| e.reason.as_ref().map(ToString::to_string).as_deref() == Some("not_in_allowlist")),
        "{evil:#?}"
    );
    let other: Vec<_> = h
        .log(0)
        .into_iter()
        .filter(|e| !matches!(e.host.as_deref(), Some("api.test" | "evil.test")))
        .collect();
    assert!(
        other.is_empty(),
        "decided by something other than the SNI: {other:#?}"
    );
    h.close().await;
}
