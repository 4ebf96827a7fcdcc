//! Streams through an intercepted connection: server-sent events arrive event by event, a
//! multi-gigabyte download does not grow the gateway's memory, a WebSocket upgrade works after injection.

use std::time::{Duration, Instant};

use super::{
    API_SECRET, World, assert_placeholder, eventually, printed, record_header, script, secret_value,
};
use crate::support::{API, entries_for, read_log, status_field, wait_exit};

/// The `expect` part of an upstream's config: the quiet, WebSocket routes check the injected header.
fn expect(value: &str) -> serde_json::Value {
    serde_json::json!({"expect": {"header": "Authorization", "value": format!("Bearer {value}")}})
}

// covers: E13 (server-sent events reach the client event by event through interception, HTTP/1.1 and h2)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn server_sent_events_arrive_one_by_one() {
    let world = World::new().await;
    let value = secret_value("sse");
    let upstream = world.upstream(&[API], None, expect(&value)).await;
    let tags = ["h1", "h2"];
    let files: Vec<_> = tags
        .iter()
        .map(|t| world.path(&format!("events-{t}.txt")))
        .collect();
    let mut sh = String::new();
    for (tag, file) in tags.iter().zip(&files) {
        let flag = if *tag == "h1" { "--http1.1" } else { "--http2" };
        sh += &format!(
            "curl -sS -N -m 30 --noproxy '*' {flag} 'https://{API}/sse?events=3&tag={tag}' > {}\n",
            file.display()
        );
    }
    let mut child = world
        .run()
        .secrets(API_SECRET)
        .env("API_TOKEN", &value)
        .map(API, 443, upstream.addr)
        .spawn(&["sh", "-c", &sh]);
    for (tag, file) in tags.iter().zip(&files) {
        for event in 1..=2u32 {
            let want = format!("data: event-{event}\n");
            let arrived = eventually(Duration::from_secs(15), || {
                std::fs::read_to_string(file).is_ok_and(|t| t.contains(&want))
            })
            .await;
            assert!(
                arrived,
                "{tag}: event {event} did not reach the client; upstream: {:#?}",
                upstream.records()
            );
            // The upstream has sent this event and is holding the response open until told to go on.
            let records = upstream.records();
            let sent: Vec<_> = records
                .iter()
                .filter(|r| r["tag"] == *tag && r["sse_sent"].is_u64())
                .collect();
            assert_eq!(sent.len(), event as usize, "{tag}: {records:#?}");
            assert!(
                !records.iter().any(|r| r["tag"] == *tag && r["sse_done"] == true),
                "{tag}: already done"
            );
            let text = std::fs::read_to_string(file).unwrap();
            assert!(!text.contains(&format!("event-{}", event + 1)), "{tag}: {text:?}");
            upstream.go(tag, event);
        }
    }
    assert_eq!(wait_exit(&mut child).await, Some(0));
    for (tag, file) in tags.iter().zip(&files) {
        let text = std::fs::read_to_string(file).unwrap();
        assert_eq!(text.matches("data: event-").count(), 3, "{tag}: {text:?}");
    }
    let requests = upstream.requests("/sse");
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(
            record_header(r, "authorization"),
            Some(format!("Bearer {value}").as_str()),
            "{r}"
        );
    }
    assert!(!upstream.records().iter().any(|r| r["sse_timeout"].is_u64()));
}

/// Bytes the download test streams: large enough that buffering any real part of it would show.
const DOWNLOAD_BYTES: u64 = 2 << 30;
/// The most resident memory the agenthold process may use meanwhile.
const RSS_LIMIT_KIB: u64 = 200 * 1024;

// covers: E13 (a multi-gigabyte download through interception completes with bounded gateway memory)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn large_download_streams_with_bounded_memory() {
    let world = World::new().await;
    let value = secret_value("big");
    let upstream = world.upstream(&[API], None, expect(&value)).await;
    let log = world.path("log.jsonl");
    let sh = format!(
        "curl -sS -m 240 --noproxy '*' -o /dev/null -w 'size=%{{size_download}}\\nstatus=%{{http_code}}\\n' \
         'https://{API}/big?bytes={DOWNLOAD_BYTES}'"
    );
    let started = Instant::now();
    let mut child = world
        .run()
        .secrets(API_SECRET)
        .env("API_TOKEN", &value)
        .map(API, 443, upstream.addr)
        .log(&log)
        .spawn(&["sh", "-c", &sh]);
    let pid = child.id().unwrap();
    let (mut peak, mut samples) = (0u64, 0u32);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the download did not finish in 300 s"
        );
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status"))
            && let Some(rss) = status_field(&text, "VmRSS")
        {
            let kib: u64 = rss.trim_end_matches("kB").trim().parse().unwrap();
            peak = peak.max(kib);
            samples += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let elapsed = started.elapsed();
    let mut stdout = String::new();
    tokio::io::AsyncReadExt::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout)
        .await
        .unwrap();
    assert!(status.success(), "{status}: {stdout}");
    let vars = printed(&stdout);
    assert_eq!(vars["status"], "200", "{stdout}");
    assert_eq!(vars["size"], DOWNLOAD_BYTES.to_string(), "{stdout}");
    assert!(samples >= 5, "too few RSS samples ({samples}) in {elapsed:?}");
    assert!(
        peak < RSS_LIMIT_KIB,
        "agenthold's RSS peaked at {peak} KiB during a {DOWNLOAD_BYTES}-byte download"
    );
    eprintln!("download: {DOWNLOAD_BYTES} bytes in {elapsed:?}, peak RSS {peak} KiB over {samples} samples");
    let requests = upstream.requests("/big");
    assert_eq!(requests.len(), 1);
    assert_eq!(
        record_header(&requests[0], "authorization"),
        Some(format!("Bearer {value}").as_str())
    );
    let log = read_log(&log);
    let entry = entries_for(&log, API)
        .into_iter()
        .find(|e| e["kind"] == "http")
        .unwrap();
    assert_eq!(entry["bytes_down"], DOWNLOAD_BYTES, "{entry}");
    assert_eq!(entry["secret_injected"], true, "{entry}");
}

/// A WebSocket client on a raw TLS socket (trusting the jail's bundle through SSL_CERT_FILE): upgrade
/// with the placeholder in Authorization, two text frames, a close. Prints what it got.
const WS_CLIENT_PY: &str = r#"
import base64, os, socket, ssl, struct, sys
host, path = sys.argv[1], sys.argv[2]
ctx = ssl.create_default_context()
ctx.set_alpn_protocols(["http/1.1"])
s = ctx.wrap_socket(socket.create_connection((host, 443), timeout=10), server_hostname=host)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer %s\r\n\r\n"
           % (path, host, key, os.environ["API_KEY"])).encode())
f = s.makefile("rb")
print("STATUS=" + f.readline().decode().split()[1])
while f.readline() not in (b"\r\n", b""):
    pass
def send(op, data):
    mask = os.urandom(4)
    s.sendall(bytes([0x80 | op, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
def recv():
    head = f.read(2)
    n = head[1] & 0x7F
    if n == 126:
        n = struct.unpack(">H", f.read(2))[0]
    return head[0] & 0x0F, f.read(n)
for i, word in enumerate(("hello", "world")):
    send(1, word.encode())
    op, data = recv()
    print("FRAME%d=%d %s" % (i, op, data.decode()))
send(8, b"")
print("CLOSE=%d" % recv()[0])
"#;

/// Runs the WebSocket client against an `upstream.py` that accepts `alpn`; returns what it printed, the
/// upstream's records and the placeholder.
async fn websocket_through(
    alpn: &[&str],
) -> (
    std::collections::BTreeMap<String, String>,
    Vec<serde_json::Value>,
    String,
) {
    let world = World::new().await;
    let value = secret_value("ws");
    let mut config = expect(&value);
    config["alpn"] = serde_json::json!(alpn);
    let upstream = world.upstream(&[API], None, config).await;
    let client = script(&world, "ws_client.py", WS_CLIENT_PY);
    let out = world
        .run()
        .secrets(API_SECRET)
        .env("API_TOKEN", &value)
        .map(API, 443, upstream.addr)
        .sh(&format!(
            "echo \"API_KEY=$API_KEY\"; /usr/bin/python3 {client} {API} /ws"
        ))
        .await;
    let vars = printed(&out.stdout);
    assert!(!out.stdout.contains(&value), "{out:#?}");
    let records = upstream.records();
    let expected_auth = format!("Bearer {value}");
    for r in records.iter().filter(|r| r["path"].is_string()) {
        assert_eq!(
            record_header(r, "authorization"),
            Some(expected_auth.as_str()),
            "{r}"
        );
    }
    (vars, records, out.stderr)
}

#[track_caller]
fn assert_websocket_worked(
    vars: &std::collections::BTreeMap<String, String>,
    records: &[serde_json::Value],
    stderr: &str,
) {
    assert_placeholder(vars.get("API_KEY").map_or("", String::as_str));
    assert_eq!(
        vars.get("STATUS").map(String::as_str),
        Some("101"),
        "{vars:#?} {records:#?} {stderr}"
    );
    assert_eq!(vars["FRAME0"], "1 echo:hello authorized", "{vars:#?}");
    assert_eq!(vars["FRAME1"], "1 echo:world authorized", "{vars:#?}");
    assert_eq!(vars["CLOSE"], "8", "{vars:#?}");
    let upgrades: Vec<_> = records.iter().filter(|r| r["upgrade"] == true).collect();
    assert_eq!(upgrades.len(), 1, "{records:#?}");
    assert_eq!(upgrades[0]["authorized"], true, "{records:#?}");
    let texts: Vec<_> = records.iter().filter_map(|r| r["ws_text"].as_str()).collect();
    assert_eq!(texts, ["hello", "world", ""], "{records:#?}");
}

// covers: E13 (a WebSocket upgrade works through interception, with the secret injected into the upgrade)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn websocket_upgrade_works_after_injection() {
    let (vars, records, stderr) = websocket_through(&["http/1.1"]).await;
    assert_websocket_worked(&vars, &records, &stderr);
}

// covers: E13 (a WebSocket upgrade to an upstream that also speaks h2, as most real ones do: the echo
// upstream is hyper with ALPN h2 and http/1.1, so it shows what a real server would get)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn websocket_upgrade_reaches_an_h2_capable_upstream_as_http1_upgrade() {
    let world = World::new().await;
    let value = secret_value("ws2");
    let client = script(&world, "ws_client.py", WS_CLIENT_PY);
    let out = world
        .run()
        .secrets(API_SECRET)
        .env("API_TOKEN", &value)
        .sh(&format!("/usr/bin/python3 {client} {API} /ws-h2"))
        .await;
    let seen = world.echoed(API);
    assert_eq!(seen.len(), 1, "{seen:#?} {out:#?}");
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {value}").as_str())
    );
    // A server can only switch protocols on an HTTP/1.1 request that still carries its Upgrade header; the
    // gateway must not send an upgrade over a pooled h2 connection (offer only http/1.1 for it).
    assert_eq!(
        (seen[0].version.as_str(), seen[0].header("upgrade")),
        ("HTTP/1.1", Some("websocket")),
        "the upgrade request reached the upstream as: {:#?}",
        seen[0]
    );
}
