//! Policies change at run time (E8): the next connection and the next DNS query are decided by the new
//! policy, measured from inside the sandbox; report-only mode lets through what an allowlist would refuse and
//! says so in the log (E16).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agenthold_core::policy::{NetworkPolicy, PolicyMode};
use agenthold_egress::log::{Decision, LogKind};
use serde_json::{Value, json};

use super::harness::{BLOCKED_ORIG, Harness, Setup, allow, get};

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Runs the sandbox's DNS and TLS retry loops (until the outcome is `expect`) while the policy changes to
/// `next` after a moment; returns the delay from the change to the first such outcome, per loop.
async fn flip(h: &Harness, expect: &str, next: NetworkPolicy) -> [(f64, u64); 2] {
    let dns_target = format!("{},evil.test", h.gw(0));
    let tls_target = format!("{BLOCKED_ORIG},443,evil.test,{}", h.ca_file());
    let dns = h.py(0, &["until", "dns", &dns_target, expect, "8"]);
    let tls = h.py(0, &["until", "tls", &tls_target, expect, "8"]);
    let change = async {
        // Long enough for both loops to have started and seen the old policy a few times.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let at = now();
        h.policy.set(h.id(0).clone(), next);
        at
    };
    let (dns, tls, at) = tokio::join!(dns, tls, change);
    let delay = |what: &str, r: &Value| {
        let first = r["first"]
            .as_f64()
            .unwrap_or_else(|| panic!("{what}: never {expect}: {r}"));
        let before = r["before"].as_u64().unwrap();
        assert!(before >= 1, "{what}: the loop never saw the old policy: {r}");
        assert!(
            first >= at - 0.01,
            "{what}: {expect} before the change ({first} < {at})"
        );
        (first - at, before)
    };
    [delay("dns", &dns), delay("tls", &tls)]
}

// covers: E8
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn policy_changes_decide_the_next_connection_and_query_within_a_second() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;

    let granted = flip(&h, "ok", allow(&["api.test", "evil.test"])).await;
    for (what, (delay, _)) in ["DNS", "TLS"].iter().zip(granted) {
        assert!(delay < 1.0, "{what} allowed {delay:.3} s after the change");
    }
    let revoked = flip(&h, "denied", allow(&["api.test"])).await;
    for (what, (delay, _)) in ["DNS", "TLS"].iter().zip(revoked) {
        assert!(delay < 1.0, "{what} still allowed {delay:.3} s after the change");
    }
    eprintln!(
        "policy change → first decision by the new policy: granted {granted:?}, revoked {revoked:?} (s, tries before)"
    );
    assert!(
        h.web("evil.test").https.requests().len() >= 2,
        "the granted phase reached evil.test"
    );
    h.close().await;
}

// covers: E8
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn a_kept_alive_connection_is_decided_again_after_a_policy_change() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;
    let mut conn = h.py_interactive(0, &["steps", BLOCKED_ORIG, "80"]);
    let limit = Duration::from_secs(5);
    assert_eq!(conn.next(limit).await["ready"], true);
    let request = json!(get("/before", "api.test")).to_string();
    conn.send(&request).await;
    assert_eq!(conn.next(limit).await["status"], 200);
    h.set_policy(0, allow(&["other.test"]));
    conn.send(&json!(get("/after", "api.test")).to_string()).await;
    let after = conn.next(limit).await;
    assert_eq!(
        after["status"], 403,
        "the same connection, the next request, the new policy: {after}"
    );
    h.set_policy(0, allow(&["api.test"]));
    conn.send(&json!(get("/again", "api.test")).to_string()).await;
    assert_eq!(conn.next(limit).await["status"], 200);
    let paths: Vec<String> = h
        .web("api.test")
        .http
        .requests()
        .into_iter()
        .map(|r| r.path)
        .collect();
    assert_eq!(paths, ["/before", "/again"]);
    h.close().await;
}

// covers: E8
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn allowlist_entries_decide_by_name_port_and_subdomain() {
    let h = Harness::start(
        Setup::new()
            .web(&[
                "api.test",
                "web.test",
                "wild.test",
                "a.wild.test",
                "b.a.wild.test",
            ])
            .policy(allow(&["api.test:443", "web.test", "*.wild.test"])),
    )
    .await;
    let cases = [
        ("https://api.test/", true),
        ("http://api.test/", false),
        ("https://web.test/", true),
        ("http://web.test/", true),
        ("https://a.wild.test/", true),
        ("http://b.a.wild.test/", true),
        ("https://wild.test/", false),
        ("http://wild.test/", false),
    ];
    for (url, allowed) in cases {
        // The name may not resolve when refused: aim at an address of our choosing then.
        let (host, port) = url
            .split_once("://")
            .map(|(scheme, rest)| {
                (
                    rest.trim_end_matches('/'),
                    if scheme == "https" { 443 } else { 80 },
                )
            })
            .unwrap();
        let connect_to = format!("{host}:{port}:{BLOCKED_ORIG}:{port}");
        let r = h.curl(0, &["--connect-to", &connect_to, url]).await;
        assert_eq!(r.status == 200, allowed, "{url}: {r:?}");
    }
    // DNS follows the same entries, whatever the port.
    let gw = h.gw(0).to_string();
    for (name, resolves) in [
        ("api.test", true),
        ("web.test", true),
        ("a.wild.test", true),
        ("wild.test", false),
    ] {
        let answer = h.py(0, &["dns", &gw, name, "A", "udp"]).await;
        assert_eq!(answer["rcode"] == 0, resolves, "{name}: {answer}");
    }
    assert_eq!(h.web("wild.test").total(), 0);
    assert_eq!(h.web("api.test").http.requests().len(), 0);
    h.close().await;
}

// covers: E8, E16
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn report_only_lets_unlisted_hosts_through_and_logs_why() {
    let report_only = NetworkPolicy::parse(PolicyMode::ReportOnly, &["api.test"]).unwrap();
    let h = Harness::start(
        Setup::new()
            .policy(report_only)
            .record("real.test", &["93.184.216.40"]),
    )
    .await;
    let proxy = h.proxy_url(0);

    // A name the upstream resolves (the sandbox gets its public address and never connects to it).
    let real = h
        .py(0, &["dns", &h.gw(0).to_string(), "real.test", "A", "udp"])
        .await;
    assert_eq!(real["addrs"][0], "93.184.216.40", "{real}");

    h.curl(0, &["https://evil.test/tls"]).await.echo();
    h.curl(0, &["http://evil.test/plain"]).await.echo();
    h.curl(0, &["-x", &proxy, "http://evil.test/absolute"])
        .await
        .echo();
    h.curl_env(0, &[("HTTPS_PROXY", &proxy)], &["https://evil.test/connect"])
        .await
        .echo();
    h.curl(0, &["https://api.test/listed"]).await.echo();
    assert_eq!(h.web("evil.test").total(), 4);
    // Report-only never re-opens what the address guard refuses.
    let blocked = h
        .curl(0, &["-x", &proxy, "http://169.254.169.254/latest/meta-data/"])
        .await;
    assert_eq!(blocked.status, 403, "{blocked:?}");

    let reported = Some("report_only:not_in_allowlist");
    for (kind, host, count) in [
        (LogKind::Dns, "real.test", 1),
        (LogKind::Tls, "evil.test", 1),
        (LogKind::Http, "evil.test", 2),
        (LogKind::Connect, "evil.test", 1),
    ] {
        let entries = h.wait_entries(0, kind, host, count).await;
        for e in &entries {
            assert_eq!(
                (e.decision, e.reason.as_ref().map(ToString::to_string).as_deref()),
                (Decision::Allowed, reported),
                "{e:?}"
            );
        }
    }
    for e in h.wait_entries(0, LogKind::Tls, "api.test", 1).await {
        assert_eq!(
            (e.decision, e.reason.as_ref().map(ToString::to_string).as_deref()),
            (Decision::Allowed, None),
            "{e:?}"
        );
    }
    let metadata = h.entries(0, LogKind::Http, "169.254.169.254");
    assert_eq!(
        (
            metadata[0].decision,
            metadata[0].reason.as_ref().map(ToString::to_string).as_deref()
        ),
        (Decision::Denied, Some("blocked_address"))
    );
    h.close().await;
}

// covers: E8, E16
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn report_only_reason_survives_a_synthetic_dns_answer() {
    let report_only = NetworkPolicy::parse(PolicyMode::ReportOnly, &["api.test"]).unwrap();
    let h = Harness::start(Setup::new().policy(report_only)).await;
    h.resolve(0, "evil.test").await;
    let entry = h.entries(0, LogKind::Dns, "evil.test").remove(0);
    let reason = entry.reason.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(reason.starts_with("report_only:not_in_allowlist"), "{entry:?}");
    h.close().await;
}
