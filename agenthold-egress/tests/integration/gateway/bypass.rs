//! The allowlist holds on every path (E23): bytes that are TLS are decided by SNI and bytes that are HTTP by
//! Host, whatever the port and the timing, and a connection is never spliced unread after it showed TLS or
//! HTTP. Each test attacks from a sandbox namespace with an allowlist that names `api.test` only, aiming
//! at the address the agent resolved for `api.test` (so a fallback to "the name resolved for this
//! address" would let it through) and asking for `evil.test`, whose upstreams count every request.

use agenthold_egress::log::{Decision, LogKind};

use super::harness::{BANNER, Harness, Setup, allow};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Requests that some lenient server reads as a request for evil.test, each a way the old sniffer took for
/// "other TCP" (and spliced under the resolved name) or that a parser could disagree on.
const EVIL_HEADS: &[&[u8]] = &[
    b"\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    b"\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    b"GET  / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    b"GET /  HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    b"GET\t/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    b" GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    b"get / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    b"GET / http/1.1\r\nHost: evil.test\r\n\r\n",
    b"GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    b"GET /\r\nHost: evil.test\r\n\r\n",
    b"GET / HTTP/1.1\nHost: evil.test\n\n",
    b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
];

// covers: E23 (HTTP on port 80 in every shape a lenient server accepts: decided by Host or refused, never
// spliced under the name resolved for the address)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn http_in_any_shape_is_decided_by_host() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;
    let addr = h.resolve(0, "api.test").await.to_string();
    for head in EVIL_HEADS {
        let r = h
            .py(0, &["raw", &addr, "80", &hex(head), "no", "100000", "1.5"])
            .await;
        let text = r["received"].as_str().unwrap_or_default();
        assert!(
            !text.contains("evil.test\""),
            "{:?} reached evil.test: {r}",
            String::from_utf8_lossy(head)
        );
    }
    assert_eq!(h.web("evil.test").total(), 0, "a request reached evil.test");
    // The control: a leading empty line is fine for a request to the allowed host (RFC 9112 §2.2).
    let ok = h
        .py(
            0,
            &[
                "raw",
                &addr,
                "80",
                &hex(b"\r\nGET /ok HTTP/1.1\r\nHost: api.test\r\n\r\n"),
                "no",
                "20",
                "3",
            ],
        )
        .await;
    assert!(
        ok["received"].as_str().unwrap().starts_with("HTTP/1.1 200"),
        "{ok}"
    );
    // Nothing was decided by the resolved name: no TCP entry at all.
    assert!(h.log(0).iter().all(|e| e.kind != LogKind::Tcp), "{:#?}", h.log(0));
    let evil = h.entries(0, LogKind::Http, "evil.test");
    assert!(evil.iter().all(|e| e.decision == Decision::Denied), "{evil:#?}");
    h.close().await;
}

// covers: E23 (a client that waits past the first-bytes wait on an allowed port, then sends a ClientHello
// or a request for another host: decided by its SNI or Host, as if it had spoken at once)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn a_client_that_waits_is_still_decided_by_sni_and_host() {
    let h = Harness::start(
        Setup::new()
            .policy(allow(&["api.test:8443", "api.test:8080", "ssh.test:2222"]))
            .also("api.test", 8443, true)
            .also("api.test", 8080, false)
            .also("evil.test", 8443, true)
            .also("evil.test", 8080, false)
            .tcp("ssh.test", 2222),
    )
    .await;
    let addr = h.resolve(0, "api.test").await.to_string();
    let request = |host: &str| hex(format!("GET /late HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
    let (tls_evil, http_evil, http_ok) = tokio::join!(
        h.py(0, &["late", &addr, "8443", "0.8", "hello:evil.test"]),
        h.py(0, &["late", &addr, "8080", "0.8", &request("evil.test")]),
        h.py(0, &["late", &addr, "8080", "0.8", &request("api.test")]),
    );
    assert!(
        tls_evil["closed"] == true && tls_evil["after"] == "",
        "{tls_evil}"
    );
    assert!(
        http_evil["after"].as_str().unwrap().starts_with("HTTP/1.1 403"),
        "{http_evil}"
    );
    assert!(
        http_ok["after"].as_str().unwrap().starts_with("HTTP/1.1 200"),
        "{http_ok}"
    );
    assert_eq!(h.web("evil.test").total(), 0, "a late request reached evil.test");
    let tls = h.entries(0, LogKind::Tls, "evil.test");
    assert_eq!(tls.len(), 1, "{:#?}", h.log(0));
    assert_eq!(
        tls[0].reason.as_ref().map(ToString::to_string).as_deref(),
        Some("not_in_allowlist")
    );

    // A server that speaks first (SSH-like): after its greeting, a ClientHello for another name or an HTTP
    // request is refused, never spliced to the greeting server's address.
    let ssh = h.resolve(0, "ssh.test").await.to_string();
    let (hello, http, ssh_ok) = tokio::join!(
        h.py(0, &["late", &ssh, "2222", "0.8", "hello:evil.test"]),
        h.py(0, &["late", &ssh, "2222", "0.8", &request("evil.test")]),
        h.py(0, &["late", &ssh, "2222", "0.8", &hex(b"SSH-2.0-client\r\n")]),
    );
    for (what, r) in [("hello", &hello), ("http", &http)] {
        assert_eq!(r["before"], BANNER, "{what}: {r}");
        assert!(r["closed"] == true && r["after"] == "", "{what}: {r}");
    }
    assert_eq!(ssh_ok["after"], "SSH-2.0-client\r\n", "{ssh_ok}");
    let refused: Vec<_> = h
        .entries(0, LogKind::Tcp, "ssh.test")
        .into_iter()
        .filter(|e| e.decision == Decision::Denied)
        .collect();
    assert_eq!(refused.len(), 2, "{:#?}", h.log(0));
    h.close().await;
}

// covers: E23 (the bytes inside a CONNECT tunnel are decided like a transparent connection's: a ClientHello
// must name the CONNECT host, HTTP is decided per request by its Host)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn connect_tunnels_are_decided_by_what_they_carry() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;
    let gw = h.gw(0).to_string();
    let port = h.config.explicit_port.to_string();
    let evil_get = hex(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n");
    let api_get = hex(b"GET /in-tunnel HTTP/1.1\r\nHost: api.test\r\n\r\n");
    let (fronted, http_evil, http_ok) = tokio::join!(
        h.py(0, &["tunnel", &gw, &port, "api.test:443", "hello:evil.test"]),
        h.py(0, &["tunnel", &gw, &port, "api.test:80", &evil_get]),
        h.py(0, &["tunnel", &gw, &port, "api.test:80", &api_get]),
    );
    assert_eq!(fronted["status"], 200, "{fronted}");
    assert!(
        fronted["closed"] == true && fronted["received"] == "",
        "{fronted}"
    );
    assert!(
        http_evil["received"]
            .as_str()
            .unwrap()
            .starts_with("HTTP/1.1 403"),
        "{http_evil}"
    );
    assert!(
        http_ok["received"].as_str().unwrap().starts_with("HTTP/1.1 200"),
        "{http_ok}"
    );
    assert_eq!(h.web("evil.test").total(), 0);
    let mismatch: Vec<_> = h
        .entries(0, LogKind::Connect, "evil.test")
        .into_iter()
        .filter(|e| e.reason.as_ref().map(ToString::to_string).as_deref() == Some("host_mismatch"))
        .collect();
    assert_eq!(mismatch.len(), 1, "{:#?}", h.log(0));
    h.close().await;
}

// covers: E23 (`Upgrade` is carried only to `websocket`: an h2c or other upgrade is served as a plain
// request, never turned into a raw tunnel)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn only_websocket_upgrades_become_tunnels() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;
    let h2c = h.curl(0, &["--http2", "http://api.test/h2c"]).await;
    assert_eq!(h2c.code, 0, "{h2c:?}");
    let seen = h.web("api.test").http.requests();
    let last = seen.last().unwrap();
    assert_eq!(last.header("upgrade"), None, "{last:#?}");
    assert_eq!(last.header("http2-settings"), None, "{last:#?}");
    let addr = h.resolve(0, "api.test").await.to_string();
    let raw = b"GET /tcp HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n";
    let r = h.py(0, &["raw", &addr, "80", &hex(raw), "no", "20", "3"]).await;
    assert!(r["received"].as_str().unwrap().starts_with("HTTP/1.1 200"), "{r}");
    let last = h.web("api.test").http.requests().pop().unwrap();
    assert_eq!(
        (last.path.as_str(), last.header("upgrade")),
        ("/tcp", None),
        "{last:#?}"
    );
    h.close().await;
}

// covers: E23 (a ClientHello that offers Encrypted Client Hello under an allowlist is decided by its outer
// SNI and logged `ech_offered`: the name it really wants is hidden from the gateway)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn encrypted_client_hello_is_logged() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;
    let addr = h.resolve(0, "api.test").await.to_string();
    let (ech, evil) = tokio::join!(
        h.py(0, &["late", &addr, "443", "0", "ech-hello:api.test", "1"]),
        h.py(0, &["late", &addr, "443", "0", "ech-hello:evil.test", "1"]),
    );
    assert!(
        ech.get("error").is_none() && evil["closed"] == true,
        "{ech} {evil}"
    );
    let api = h.wait_entries(0, LogKind::Tls, "api.test", 1).await;
    assert_eq!(
        (
            api[0].decision,
            api[0].reason.as_ref().map(ToString::to_string).as_deref()
        ),
        (Decision::Allowed, Some("ech_offered")),
        "{api:#?}"
    );
    let denied = h.entries(0, LogKind::Tls, "evil.test");
    assert_eq!(denied[0].decision, Decision::Denied, "{denied:#?}");
    h.close().await;
}
