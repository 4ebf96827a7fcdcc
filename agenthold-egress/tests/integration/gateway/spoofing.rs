//! Forged names (E4, E5): a connection is decided by the name it carries (SNI, every request's `Host`) and
//! goes where that name resolves on the gateway, never to the address the client aimed at.

use agenthold_egress::log::{Decision, LogKind};
use serde_json::{Value, json};

use super::harness::{Harness, PUBLIC, Setup, allow, get};

/// The echo JSON inside a `client.py https` or `session` answer.
fn echoed(answer: &Value) -> Value {
    assert_eq!(answer["status"], 200, "{answer}");
    serde_json::from_str(answer["body"].as_str().unwrap()).unwrap()
}

// covers: E4, E5
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn forged_sni_and_host_reach_the_named_upstream_never_the_address() {
    let h = Harness::start(Setup::new()).await;
    // The addresses the gateway's DNS hands out for the two names (learnt while the policy is open).
    let api_addr = h.resolve(0, "api.test").await.to_string();
    let evil_addr = h.resolve(0, "evil.test").await.to_string();
    assert_ne!(api_addr, evil_addr);
    h.set_policy(0, allow(&["api.test"]));
    let ca = h.ca_file();
    let (api, evil) = (h.web("api.test"), h.web("evil.test"));

    // SNI api.test aimed at evil.test's address, and at a public address: both reach api.test's upstream.
    for target in [evil_addr.as_str(), PUBLIC] {
        let answer = h
            .py(0, &["https", target, "443", "api.test", &ca, "/forged-sni"])
            .await;
        let json = echoed(&answer);
        assert_eq!(json["sni"], "api.test", "{target}");
        assert_eq!(answer["subject"], "commonName=api.test", "{target}: {answer}");
    }
    assert_eq!(api.https.requests().len(), 2);
    // Host api.test aimed at evil.test's address: api.test's plain upstream answers.
    let plain = h
        .py(
            0,
            &[
                "session",
                &evil_addr,
                "80",
                &json!([get("/forged-host", "api.test")]).to_string(),
                "sequential",
            ],
        )
        .await;
    assert_eq!(echoed(&plain[0])["host"], "api.test");
    assert_eq!(api.http.requests().len(), 1);

    // The converse: evil.test's name aimed at api.test's (allowed) address is refused.
    let answer = h.py(0, &["https", &api_addr, "443", "evil.test", &ca, "/"]).await;
    assert!(answer["error"].is_string(), "{answer}");
    let plain = h
        .py(
            0,
            &[
                "session",
                &api_addr,
                "80",
                &json!([get("/", "evil.test")]).to_string(),
                "sequential",
            ],
        )
        .await;
    assert_eq!(plain[0]["status"], 403, "{plain}");
    assert_eq!(evil.total(), 0, "nothing reached evil.test");
    assert_eq!(
        (api.https.requests().len(), api.http.requests().len()),
        (2, 1),
        "nor api.test's upstream"
    );
    let tls = h.wait_entries(0, LogKind::Tls, "evil.test", 1).await;
    assert_eq!(
        (
            tls[0].decision,
            tls[0].reason.as_ref().map(ToString::to_string).as_deref()
        ),
        (Decision::Denied, Some("not_in_allowlist"))
    );

    // With the open policy the converse connects, and to evil.test's own upstream, not to the one behind
    // the address the client aimed at.
    h.set_policy(0, agenthold_core::policy::NetworkPolicy::open());
    let answer = h
        .py(0, &["https", &api_addr, "443", "evil.test", &ca, "/open"])
        .await;
    assert_eq!(echoed(&answer)["sni"], "evil.test");
    let plain = h
        .py(
            0,
            &[
                "session",
                &api_addr,
                "80",
                &json!([get("/open", "evil.test")]).to_string(),
                "sequential",
            ],
        )
        .await;
    assert_eq!(echoed(&plain[0])["host"], "evil.test");
    assert_eq!((evil.https.requests().len(), evil.http.requests().len()), (1, 1));
    assert_eq!((api.https.requests().len(), api.http.requests().len()), (2, 1));
    h.close().await;
}

// covers: E4
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn every_request_on_a_keep_alive_connection_is_decided_on_its_own_host() {
    let h = Harness::start(
        Setup::new()
            .web(&["api.test", "evil.test", "other.test"])
            .policy(allow(&["api.test", "other.test"])),
    )
    .await;
    let addr = PUBLIC.to_owned();
    let session = |requests: Vec<String>, how: &'static str| {
        let requests = json!(requests).to_string();
        let addr = addr.clone();
        let h = &h;
        async move { h.py(0, &["session", &addr, "80", &requests, how]).await }
    };
    let (api, evil, other) = (h.web("api.test"), h.web("evil.test"), h.web("other.test"));

    // Allowed first, then a forbidden Host on the same connection.
    let r = session(vec![get("/1", "api.test"), get("/2", "evil.test")], "sequential").await;
    assert_eq!(echoed(&r[0])["path"], "/1");
    assert_eq!(r[1]["status"], 403, "{r}");
    assert!(r[1]["body"].as_str().unwrap().contains("not_in_allowlist"), "{r}");
    assert_eq!(api.http.requests().len(), 1);

    // The reverse: forbidden first. The refusal does not poison (nor pin) the connection: the next request
    // is decided on its own Host.
    let r = session(vec![get("/3", "evil.test"), get("/4", "api.test")], "sequential").await;
    assert_eq!(r[0]["status"], 403, "{r}");
    assert_eq!(echoed(&r[1])["path"], "/4");

    // Pipelined in one write (only the first head is sniffed before the HTTP server takes over): every
    // request is still decided.
    let r = session(
        vec![
            get("/5", "api.test"),
            get("/6", "evil.test"),
            get("/7", "api.test"),
        ],
        "pipelined",
    )
    .await;
    assert_eq!(echoed(&r[0])["path"], "/5");
    assert_eq!(r[1]["status"], 403, "{r}");
    assert_eq!(echoed(&r[2])["path"], "/7");

    // Two allowed hosts alternating on one connection: each request reaches its own upstream (the
    // connection is not pinned to the first host).
    let r = session(
        vec![
            get("/8", "api.test"),
            get("/9", "other.test"),
            get("/10", "api.test"),
        ],
        "sequential",
    )
    .await;
    let hosts: Vec<Value> = r
        .as_array()
        .unwrap()
        .iter()
        .map(|a| echoed(a)["host"].clone())
        .collect();
    assert_eq!(hosts, [json!("api.test"), json!("other.test"), json!("api.test")]);

    // An absolute-form request line on the transparent path names its host too. As the first request (the
    // one sniffed), a Host that disagrees with it is malformed: closed without an answer. Later on the
    // connection, the request line's host wins over Host, for the decision and for the dial alike.
    let absolute = |uri_host: &str, host: &str, path: &str| {
        format!("GET http://{uri_host}{path} HTTP/1.1\r\nHost: {host}\r\n\r\n")
    };
    let r = session(vec![absolute("evil.test", "api.test", "/11")], "sequential").await;
    assert_eq!(r[0]["error"], "closed", "{r}");
    let r = session(
        vec![
            get("/12", "api.test"),
            absolute("evil.test", "api.test", "/13"),
            absolute("api.test", "evil.test", "/14"),
        ],
        "sequential",
    )
    .await;
    assert_eq!(echoed(&r[0])["path"], "/12");
    assert_eq!(r[1]["status"], 403, "{r}");
    // Decided, and dialled, as api.test (which Host header it carried there: see the last test).
    assert_eq!(echoed(&r[2])["path"], "/14", "{r}");

    assert_eq!(evil.total(), 0, "evil.test's upstream saw nothing");
    let paths =
        |s: &agenthold_testsupport::EchoServer| s.requests().into_iter().map(|r| r.path).collect::<Vec<_>>();
    assert_eq!(
        paths(&api.http),
        ["/1", "/4", "/5", "/7", "/8", "/10", "/12", "/14"]
    );
    assert_eq!(paths(&other.http), ["/9"]);
    let denied = h.entries(0, LogKind::Http, "evil.test");
    assert_eq!(denied.len(), 4, "{denied:#?}");
    assert!(
        denied
            .iter()
            .all(|e| e.decision == Decision::Denied && e.status == Some(403))
    );
    let malformed = h.entries(0, LogKind::Http, PUBLIC);
    assert_eq!(
        (
            malformed.len(),
            malformed[0].reason.as_ref().map(ToString::to_string).as_deref()
        ),
        (1, Some("malformed")),
        "{malformed:#?}"
    );
    h.close().await;
}

// covers: E4, E5
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn the_upstream_sees_only_the_host_a_request_was_decided_by() {
    // On a shared address (a CDN, a virtual-hosting server) the Host header picks the site: a request
    // decided as api.test must not arrive there saying `Host: evil.test`, nor carrying both.
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;
    let mismatch = "GET http://api.test/mismatch HTTP/1.1\r\nHost: evil.test\r\n\r\n";
    let twice = "GET /twice HTTP/1.1\r\nHost: api.test\r\nHost: evil.test\r\n\r\n";
    let twice_absolute =
        "GET http://api.test/twice-absolute HTTP/1.1\r\nHost: api.test\r\nHost: evil.test\r\n\r\n";
    let explicit_port = h.config.explicit_port.to_string();
    let explicit = h
        .py(
            0,
            &[
                "each",
                &h.gw(0).to_string(),
                &explicit_port,
                &json!([mismatch, twice_absolute]).to_string(),
            ],
        )
        .await;
    let transparent = h
        .py(
            0,
            &[
                "session",
                PUBLIC,
                "80",
                &json!([get("/first", "api.test"), mismatch, twice, twice_absolute]).to_string(),
                "sequential",
            ],
        )
        .await;
    // As the first request of a transparent connection, the same heads are refused (the sniffer's rules).
    let first = h
        .py(
            0,
            &["session", PUBLIC, "80", &json!([twice]).to_string(), "sequential"],
        )
        .await;
    assert_eq!(first[0]["error"], "closed", "{first}");

    let requests = h.web("api.test").http.requests();
    assert!(
        requests.iter().any(|r| r.path == "/first"),
        "control: {requests:?}"
    );
    for r in &requests {
        let hosts: Vec<&str> = r
            .headers
            .iter()
            .filter(|(n, _)| n == "host")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(
            hosts,
            ["api.test"],
            "{} reached api.test's upstream with these Host headers (explicit: {explicit}, transparent: {transparent})",
            r.path
        );
    }
    h.close().await;
}
