//! A request for another host on a connection opened for a rule host (Host ≠ SNI): 421 and no secret,
//! whatever way the other host is written (Host header, h2 `:authority`, absolute-form URI, a second
//! Host line).

use super::{TWO_SECRETS, World, printed, script, secret_value};
use crate::support::{API, OTHER, read_log};

/// Requests with `http.client` on one intercepted connection to `argv[1]` (new connection after a
/// failure): the Host it sends is given per request. Prints `LABEL=STATUS BODY`.
const HOSTS_PY: &str = r#"
import http.client, os, ssl, sys
host, other = sys.argv[1], sys.argv[2]
key = os.environ["API_KEY"]
ctx = ssl.create_default_context()
ctx.set_alpn_protocols(["http/1.1"])
conn = http.client.HTTPSConnection(host, 443, context=ctx, timeout=10)
def req(label, target, hosts):
    global conn
    try:
        conn.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
        for h in hosts:
            conn.putheader("Host", h)
        conn.putheader("Authorization", "Bearer " + key)
        conn.endheaders()
        r = conn.getresponse()
        body = r.read().decode(errors="replace").strip().replace("\n", " ")
        print("%s=%d %s" % (label, r.status, body[:100]))
    except Exception as e:
        print("%s=error %s" % (label, type(e).__name__))
        conn = http.client.HTTPSConnection(host, 443, context=ctx, timeout=10)
for spec in sys.argv[3:]:
    label, target, hosts = spec.split("|")
    req(label, target.replace("HOST", host).replace("OTHER", other),
        [h.replace("HOST", host).replace("OTHER", other) for h in hosts.split(",")])
"#;

// covers: E13 (Host ≠ SNI on an intercepted connection: 421 and no secret, for curl over HTTP/1.1 and h2
// and for a second request on a connection whose first request was fine)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn host_other_than_sni_gets_421_and_no_secret() {
    let world = World::new().await;
    let value = secret_value("sni");
    let log = world.path("log.jsonl");
    let hosts = script(&world, "hosts.py", HOSTS_PY);
    let mut sh = String::new();
    for flag in ["--http1.1", "--http2"] {
        sh += &format!(
            "echo \"curl{flag}=$(curl -sS -m 10 --noproxy '*' {flag} -H 'Host: {OTHER}' -H \"Authorization: Bearer $API_KEY\" \
             -w ' %{{http_code}}' https://{API}/curl-mismatch | tr -d '\\n')\"\n"
        );
    }
    sh += &format!(
        "/usr/bin/python3 {hosts} {API} {OTHER} 'first|/first|HOST' 'second|/second|OTHER' 'third|/third|HOST' \
         'port|/port|HOST:443'\n"
    );
    let out = world
        .run()
        .secrets(TWO_SECRETS)
        .env("API_TOKEN", &value)
        .env("B_TOKEN", "b")
        .log(&log)
        .sh(&sh)
        .await;
    out.expect_code(0);
    let vars = printed(&out.stdout);
    for label in ["curl--http1.1", "curl--http2", "second"] {
        assert!(vars[label].contains("421"), "{label}: {out:#?}");
    }
    for label in ["first", "third", "port"] {
        assert!(vars[label].starts_with("200 "), "{label}: {out:#?}");
    }
    let seen = world.echo.requests();
    let paths: Vec<&str> = seen.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/first", "/third", "/port"], "{seen:#?}");
    for r in &seen {
        assert_eq!(r.sni.as_deref(), Some(API));
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {value}").as_str())
        );
    }
    let log = read_log(&log);
    let mismatches: Vec<_> = log.iter().filter(|e| e["reason"] == "host_mismatch").collect();
    assert_eq!(mismatches.len(), 3, "{log:#?}");
    assert!(
        mismatches
            .iter()
            .all(|e| e["status"] == 421 && e["secret_injected"] == false),
        "{log:#?}"
    );
}

/// Sends the `hosts.py` requests `specs` to an HTTP/1.1 upstream for api.example.test (over h1 the Host
/// lines go upstream as they are; an h2 upstream gets `:authority` from the gateway's URI); returns the
/// client's output and the upstream's records.
async fn smuggle(specs: &[&str]) -> (String, Vec<serde_json::Value>, String) {
    let world = World::new().await;
    let value = secret_value("smuggle");
    let upstream = world.upstream(&[API], None, serde_json::json!({})).await;
    let hosts = script(&world, "hosts.py", HOSTS_PY);
    let mut args = vec!["/usr/bin/python3", hosts.as_str(), API, OTHER];
    args.extend_from_slice(specs);
    let out = world
        .run()
        .secrets(TWO_SECRETS)
        .env("API_TOKEN", &value)
        .env("B_TOKEN", "b")
        .map(API, 443, upstream.addr)
        .output(&args)
        .await;
    out.expect_code(0);
    (out.stdout, upstream.requests("/"), format!("Bearer {value}"))
}

/// Panics if a request reached the upstream with the secret and any Host line other than the SNI.
#[track_caller]
fn assert_no_secret_with_another_host(client: &str, records: &[serde_json::Value], secret: &str) {
    for r in records {
        let hosts: Vec<&str> = r["headers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h[0] == "host")
            .filter_map(|h| h[1].as_str())
            .collect();
        let injected = super::record_header(r, "authorization") == Some(secret);
        assert!(
            !injected || hosts == [API],
            "the secret went upstream with Host lines {hosts:?}: {r}; client: {client}"
        );
    }
}

// covers: E13 (Host ≠ SNI in absolute form: `GET https://api… HTTP/1.1` with `Host: other…` must not
// take the secret to an upstream that reads `Host: other…`; a CDN that routes by Host would hand it to
// another tenant. The gateway decides by the URI and sends the Host it decided by.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn absolute_form_request_with_another_host_header_gets_no_secret() {
    let (client, records, secret) = smuggle(&["absolute|https://HOST/absolute|OTHER"]).await;
    assert_no_secret_with_another_host(&client, &records, &secret);
}

// covers: E13 (two Host lines, the SNI first or second: the gateway must not inject and forward both,
// letting the upstream pick the other; RFC 9112 §3.2 would answer 400, refusing or keeping only the
// decided host are both safe)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn duplicate_host_headers_get_no_secret() {
    let (client, records, secret) =
        smuggle(&["double|/double|HOST,OTHER", "reverse|/reverse|OTHER,HOST"]).await;
    assert_no_secret_with_another_host(&client, &records, &secret);
}
