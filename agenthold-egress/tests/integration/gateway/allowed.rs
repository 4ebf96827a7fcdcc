//! Allowed names pass on every path a sandbox has (E4, E5, E7): the transparent proxy (TLS spliced, plain
//! HTTP) and the explicit proxy (CONNECT, absolute-form HTTP), with curl and with Python's standard library.

use agenthold_egress::log::{Decision, LogKind};

use super::harness::{Harness, Setup, allow};

// covers: E4, E5
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn allowed_names_pass_the_transparent_proxy_spliced_and_plain() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;

    // HTTPS with the name resolved by the sandbox's own resolver (glibc → resolv.conf → .2).
    let tls = h.curl(0, &["-v", "https://api.test/tls?q=1"]).await;
    let json = tls.echo();
    assert_eq!(json["scheme"], "https");
    assert_eq!(
        json["sni"], "api.test",
        "the upstream itself terminated the client's TLS"
    );
    assert_eq!(json["path"], "/tls?q=1");
    // Spliced, not intercepted: the client verified the upstream's own chain, from the test CA (curl trusts
    // nothing else here), for the name it asked.
    assert!(
        tls.stderr.contains("issuer: CN=agenthold test CA"),
        "{}",
        tls.stderr
    );
    assert!(tls.stderr.contains("subject: CN=api.test"), "{}", tls.stderr);

    let plain = h.curl(0, &["http://api.test/plain"]).await;
    let json = plain.echo();
    assert_eq!(
        (json["scheme"].as_str(), json["host"].as_str()),
        (Some("http"), Some("api.test"))
    );
    assert_eq!(json["path"], "/plain");

    // Python: urllib over HTTPS (certificate checked against the test CA) and over plain HTTP.
    let ca = h.ca_file();
    let py = h.py(0, &["urllib", "https://api.test/py-tls", &ca, ""]).await;
    assert_eq!(py["status"], 200, "{py}");
    let echoed: serde_json::Value = serde_json::from_str(py["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        (echoed["sni"].as_str(), echoed["path"].as_str()),
        (Some("api.test"), Some("/py-tls"))
    );
    let py = h.py(0, &["urllib", "http://api.test/py-plain", &ca, ""]).await;
    assert_eq!(py["status"], 200, "{py}");

    let api = h.web("api.test");
    let paths =
        |s: &agenthold_testsupport::EchoServer| s.requests().into_iter().map(|r| r.path).collect::<Vec<_>>();
    assert_eq!(paths(&api.https), ["/tls?q=1", "/py-tls"]);
    assert_eq!(paths(&api.http), ["/plain", "/py-plain"]);
    assert_eq!(h.web("evil.test").total(), 0);

    let tls_entries = h.wait_entries(0, LogKind::Tls, "api.test", 2).await;
    assert!(
        tls_entries
            .iter()
            .all(|e| e.decision == Decision::Allowed && e.port == Some(443)),
        "{tls_entries:#?}"
    );
    let http_entries = h.entries(0, LogKind::Http, "api.test");
    assert_eq!(http_entries.len(), 2, "{http_entries:#?}");
    assert!(
        http_entries
            .iter()
            .all(|e| e.status == Some(200) && e.port == Some(80))
    );
    h.close().await;
}

// covers: E7, E5
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn allowed_names_pass_the_explicit_proxy_with_connect_and_absolute_form() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;
    let proxy = h.proxy_url(0);

    // HTTPS_PROXY, as every sandbox has it: curl tunnels with CONNECT.
    let tunnel = h
        .curl_env(0, &[("HTTPS_PROXY", &proxy)], &["-v", "https://api.test/connect"])
        .await;
    let json = tunnel.echo();
    assert_eq!(
        (json["sni"].as_str(), json["path"].as_str()),
        (Some("api.test"), Some("/connect"))
    );
    assert!(
        tunnel.stderr.contains("CONNECT api.test:443"),
        "{}",
        tunnel.stderr
    );
    assert!(
        tunnel.stderr.contains("issuer: CN=agenthold test CA"),
        "{}",
        tunnel.stderr
    );

    // Absolute-form plain HTTP.
    let absolute = h
        .curl(0, &["-v", "-x", &proxy, "http://api.test/absolute?x=1"])
        .await;
    let json = absolute.echo();
    assert_eq!(
        (json["host"].as_str(), json["path"].as_str()),
        (Some("api.test"), Some("/absolute?x=1"))
    );
    assert!(
        absolute.stderr.contains("GET http://api.test/absolute?x=1"),
        "{}",
        absolute.stderr
    );
    // The explicit proxy's own headers never reach the upstream.
    assert!(
        h.web("api.test").http.requests()[0]
            .header("proxy-connection")
            .is_none()
    );

    // Python through the proxy, both schemes.
    let ca = h.ca_file();
    for url in ["https://api.test/py-connect", "http://api.test/py-absolute"] {
        let py = h.py(0, &["urllib", url, &ca, &proxy]).await;
        assert_eq!(py["status"], 200, "{url}: {py}");
    }

    let connects = h.wait_entries(0, LogKind::Connect, "api.test", 2).await;
    assert!(
        connects
            .iter()
            .all(|e| e.decision == Decision::Allowed && e.status == Some(200) && e.port == Some(443)),
        "{connects:#?}"
    );
    assert_eq!(h.entries(0, LogKind::Http, "api.test").len(), 2);
    assert!(
        h.entries(0, LogKind::Tls, "api.test").is_empty(),
        "nothing went the transparent way"
    );
    assert_eq!(
        (
            h.web("api.test").https.requests().len(),
            h.web("api.test").http.requests().len()
        ),
        (2, 2)
    );
    h.close().await;
}
