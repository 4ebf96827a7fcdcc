//! The request log (E16, E17): one entry per DNS query, TLS and TCP connection, CONNECT tunnel and HTTP
//! request, with its fields and byte counts; spliced connections recorded when they close; the newest
//! `log_keep` entries kept per agent; a live stream.

use std::time::Duration;

use agenthold_egress::log::{Decision, LogEntry, LogKind};

use super::harness::{BANNER, BLOCKED_ORIG, Harness, Setup, allow};

const BODY: usize = 10_000;

/// `n` lies in `[low, low + slack]`.
fn near(what: &str, n: u64, low: usize, slack: usize) {
    let low = low as u64;
    assert!(
        n >= low && n <= low + slack as u64,
        "{what}: {n} not in [{low}, {}]",
        low + slack as u64
    );
}

// covers: E16
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn every_kind_is_logged_with_its_fields_and_bytes() {
    let h = Harness::start(
        Setup::new()
            .policy(allow(&["api.test", "ssh.test:22"]))
            .tcp("ssh.test", 22)
            .log_keep(32),
    )
    .await;
    let mut live = h.gateway.log().subscribe();
    let body = h.file("body.bin");
    std::fs::write(&body, vec![b'a'; BODY]).unwrap();
    let data = format!("@{}", body.display());
    let proxy = h.proxy_url(0);

    // http: method, path without the query string, status, body bytes each way.
    let http = h
        .curl(
            0,
            &[
                "--data-binary",
                &data,
                "http://api.test/upload?token=secret-value",
            ],
        )
        .await;
    assert_eq!(http.echo()["body"].as_str().unwrap().len(), BODY);
    let e = &h.entries(0, LogKind::Http, "api.test")[0];
    assert_eq!(
        (e.port, e.method.as_deref(), e.path.as_deref(), e.status),
        (Some(80), Some("POST"), Some("/upload"), Some(200))
    );
    assert_eq!(
        (e.decision, e.reason.as_ref().map(ToString::to_string).as_deref()),
        (Decision::Allowed, None)
    );
    assert_eq!(
        (e.bytes_up, e.bytes_down),
        (BODY as u64, http.body.len() as u64),
        "{e:?}"
    );

    // tls: spliced, logged when the connection closes; bytes are the TLS stream's.
    let tls = h
        .curl(0, &["--data-binary", &data, "https://api.test/tls-upload"])
        .await;
    tls.echo();
    let e = &h.wait_entries(0, LogKind::Tls, "api.test", 1).await[0];
    assert_eq!(
        (e.port, e.method.as_deref(), e.path.as_deref(), e.status),
        (Some(443), None, None, None),
        "{e:?}"
    );
    assert_eq!(e.decision, Decision::Allowed);
    near("tls bytes_up", e.bytes_up, BODY, 4096);
    near("tls bytes_down", e.bytes_down, tls.body.len(), 4096);

    // connect: the tunnel's bytes (the CONNECT exchange itself excluded).
    let connect = h
        .curl_env(
            0,
            &[("HTTPS_PROXY", &proxy)],
            &["--data-binary", &data, "https://api.test/tunnel"],
        )
        .await;
    connect.echo();
    let e = &h.wait_entries(0, LogKind::Connect, "api.test", 1).await[0];
    assert_eq!(
        (e.port, e.method.as_deref(), e.status),
        (Some(443), Some("CONNECT"), Some(200)),
        "{e:?}"
    );
    near("connect bytes_up", e.bytes_up, BODY, 4096);
    near("connect bytes_down", e.bytes_down, connect.body.len(), 4096);

    // tcp: decided by the resolved name; exact bytes (nothing but the payload crosses). The payload starts
    // with a byte no request line can start with, so it is other TCP at once (E23: a run of token
    // characters could still become a request line, and is not spliced until it cannot).
    let addr = h.resolve(0, "ssh.test").await.to_string();
    let payload = format!("{{{}", "x".repeat(4999));
    let hex: String = payload.bytes().map(|b| format!("{b:02x}")).collect();
    let expect = (BANNER.len() + payload.len()).to_string();
    let raw = h.py(0, &["raw", &addr, "22", &hex, "no", &expect]).await;
    assert_eq!(
        raw["received"].as_str().unwrap().len(),
        BANNER.len() + payload.len(),
        "{raw}"
    );
    let e = &h.wait_entries(0, LogKind::Tcp, "ssh.test", 1).await[0];
    assert_eq!((e.port, e.decision), (Some(22), Decision::Allowed), "{e:?}");
    assert_eq!(
        (e.bytes_up, e.bytes_down),
        (5000, (BANNER.len() + 5000) as u64),
        "{e:?}"
    );

    // dns: query type as method, response code as status; allowed and refused.
    let gw = h.gw(0).to_string();
    h.py(0, &["dns", &gw, "evil.test", "TXT", "udp"]).await;
    let e = &h.entries(0, LogKind::Dns, "ssh.test")[0];
    assert_eq!(
        (e.port, e.method.as_deref(), e.status, e.decision),
        (Some(53), Some("A"), Some(0), Decision::Allowed),
        "{e:?}"
    );
    let e = &h.entries(0, LogKind::Dns, "evil.test")[0];
    assert_eq!(
        (e.method.as_deref(), e.status, e.decision),
        (Some("TXT"), Some(3), Decision::Denied),
        "{e:?}"
    );
    assert_eq!(
        e.reason.as_ref().map(ToString::to_string).as_deref(),
        Some("not_in_allowlist")
    );

    // A refused request carries its status and reason.
    h.curl(0, &["-x", &proxy, "http://evil.test/denied?q=1"]).await;
    let e = &h.entries(0, LogKind::Http, "evil.test")[0];
    assert_eq!(
        (
            e.status,
            e.path.as_deref(),
            e.decision,
            e.reason.as_ref().map(ToString::to_string).as_deref()
        ),
        (
            Some(403),
            Some("/denied"),
            Decision::Denied,
            Some("not_in_allowlist")
        )
    );

    // A spliced connection is logged when it closes, not before.
    let before = h.entries(0, LogKind::Tls, "api.test").len();
    let ca = h.ca_file();
    let mut held = h.py_interactive(
        0,
        &["hold", "tls", BLOCKED_ORIG, "443", "api.test", &ca, "", "10"],
    );
    assert_eq!(held.next(Duration::from_secs(5)).await["ready"], true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        h.entries(0, LogKind::Tls, "api.test").len(),
        before,
        "logged while still open"
    );
    held.close().await;
    assert_eq!(held.next(Duration::from_secs(5)).await["closed_by"], "client");
    let e = h
        .wait_entries(0, LogKind::Tls, "api.test", before + 1)
        .await
        .pop()
        .unwrap();
    assert!(e.bytes_up > 0 && e.bytes_down > 0, "{e:?}");

    // Every entry: JSON line with the contract's fields, no query string anywhere, no secret.
    let log = h.log(0);
    for e in &log {
        let line = e.to_json_line();
        assert!(!line.contains("secret-value") && !line.contains("q=1"), "{line}");
        let back: LogEntry = serde_json::from_str(&line).unwrap();
        assert_eq!(&back, e);
        assert!(e.time.ends_with('Z') && e.time.len() == 24, "{}", e.time);
        assert!(e.port.is_some() && e.host.is_some(), "{e:?}");
    }
    // The live stream saw the same entries. (Not necessarily in the same order: entries recorded at the
    // same moment by two tasks, the A and AAAA queries of one lookup say, may be published in the other
    // order.)
    let mut streamed = Vec::new();
    while let Ok(e) = live.try_recv() {
        streamed.push(e.to_json_line());
    }
    let mut snapshot: Vec<String> = log.iter().map(LogEntry::to_json_line).collect();
    let summary = |lines: &[String]| {
        lines
            .iter()
            .map(|l| l.chars().take(140).collect::<String>())
            .collect::<Vec<_>>()
    };
    let (ordered_stream, ordered_snapshot) = (summary(&streamed), summary(&snapshot));
    streamed.sort();
    snapshot.sort();
    assert!(
        streamed == snapshot,
        "stream {ordered_stream:#?}\nsnapshot {ordered_snapshot:#?}"
    );

    // log_keep: 40 more requests on one connection; the newest 32 entries stay.
    let urls: Vec<String> = (0..40).map(|n| format!("http://api.test/n/{n}")).collect();
    let mut args: Vec<&str> = vec!["-o", "/dev/null"];
    args.extend(urls.iter().map(String::as_str));
    h.curl(0, &args).await;
    let log = h.log(0);
    assert_eq!(log.len(), 32);
    let paths: Vec<String> = log.iter().map(|e| e.path.clone().unwrap_or_default()).collect();
    let expected: Vec<String> = (8..40).map(|n| format!("/n/{n}")).collect();
    assert_eq!(paths, expected);
    h.close().await;
}

// covers: E16, E17
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn the_default_configuration_keeps_the_newest_5000_entries_per_agent() {
    // A 5100-query burst is far beyond the default DNS budget (burst 400): raised, as this test is about
    // the log, not the budget (`resolver.rs` tests that).
    let setup = Setup::new().agents(2).policy(allow(&["api.test"])).egress(|c| {
        c.dns_agent_burst = 10_000;
        c.dns_gateway_burst = 20_000;
    });
    let h = Harness::start(setup).await;
    // The seeds' defaults are what the harness bound and what the gateway was configured with.
    let c = &h.config;
    assert_eq!(
        (c.proxy_port, c.explicit_port, c.dns_port, c.log_keep),
        (15001, 15002, 15053, 5000)
    );
    h.curl(
        1,
        &[
            "-x",
            "http://{}:15002".replace("{}", &h.gw(1).to_string()).as_str(),
            "http://api.test/b",
        ],
    )
    .await
    .echo();

    let flood = h
        .py(0, &["flood", &h.gw(0).to_string(), "qN.flood.test", "5100"])
        .await;
    assert_eq!(flood["answered"], 5100, "{flood}");
    let log = h.log(0);
    assert_eq!(log.len(), 5000);
    assert_eq!(log[0].host.as_deref(), Some("q100.flood.test"));
    assert_eq!(log[4999].host.as_deref(), Some("q5099.flood.test"));
    // Per agent: agent 1's entry survives agent 0's flood.
    assert_eq!(h.entries(1, LogKind::Http, "api.test").len(), 1);
    assert!(h.dns.queries().is_empty(), "denied names never went upstream");
    h.close().await;
}
