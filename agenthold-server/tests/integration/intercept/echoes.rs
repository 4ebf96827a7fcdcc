//! The secret never comes back (E13 as amended, E19): upstreams that quote what they received (the way
//! real APIs quote a bad `anthropic-beta` or `OpenAI-Organization` in their errors) in every form the
//! gateway knows, over HTTP/1.1 and h2, chunked, as server-sent events and in WebSocket frames; and the
//! placeholder refused wherever the rule does not name it, so it is never replaced there to begin with.
//!
//! Injection is checked on the upstream's side (its records), since what the sandbox gets back is
//! scrubbed.

use super::{API_SECRET, World, assert_placeholder, base64, printed, record_header, script, secret_value};
use crate::support::{API, read_log};

/// `label=<status> <body>` for a curl call, on one line.
fn curl(label: &str, args: &str) -> String {
    format!(
        "echo \"{label}=$(curl -sS -m 10 --noproxy '*' -D - {args} -w ' %{{http_code}}' 2>&1 | tr -d '\\r\\n')\"\n"
    )
}

// covers: E19 (every form of the value an upstream quotes back is replaced by the placeholder, whatever the
// framing: raw, JSON, percent-encoded, base64 at every alignment, response headers, a body cut in pieces,
// server-sent events; over HTTP/1.1 and h2)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn an_upstream_that_quotes_the_key_never_shows_it() {
    let world = World::new().await;
    // Characters that every encoding changes.
    let value = format!("sk-ant-{}/+=\"x", secret_value("echo"));
    let upstream = world.upstream(&[API], None, serde_json::json!({})).await;
    let mut sh = String::from("echo \"API_KEY=$API_KEY\"\n");
    let forms = [
        "form=raw",
        "form=json",
        "form=percent",
        "form=base64",
        "form=base64&pre=a",
        "form=base64&pre=ab",
        "form=base64url&pre=abc",
        "form=header",
        "form=chunks",
        "form=sse",
    ];
    for (i, form) in forms.iter().enumerate() {
        for flag in ["--http1.1", "--http2"] {
            sh += &curl(
                &format!("R{i}{flag}"),
                &format!("{flag} 'https://{API}/reflect?{form}'"),
            );
        }
    }
    let out = world
        .run()
        .secrets(API_SECRET)
        .env("API_TOKEN", &value)
        .map(API, 443, upstream.addr)
        .sh(&sh)
        .await;
    out.expect_code(0);
    let vars = printed(&out.stdout);
    let placeholder = vars["API_KEY"].clone();
    assert_placeholder(&placeholder);
    assert!(!out.stdout.contains(&value), "{}", out.stdout);
    assert!(
        !out.stdout.contains(&base64(value.as_bytes())[..20]),
        "{}",
        out.stdout
    );
    for (i, form) in forms.iter().enumerate() {
        for flag in ["--http1.1", "--http2"] {
            let got = &vars[&format!("R{i}{flag}")];
            let readable = matches!(i, 0 | 1 | 7 | 8 | 9);
            assert!(
                !readable || got.contains(&placeholder),
                "{form} {flag}: the answer should quote the placeholder: {got}"
            );
        }
    }
    // The upstream got the real value every time.
    let seen = upstream.requests("/reflect");
    assert_eq!(seen.len(), forms.len() * 2, "{seen:#?}");
    let want = format!("Bearer {value}");
    for r in &seen {
        assert_eq!(record_header(r, "authorization"), Some(want.as_str()), "{r}");
        assert_eq!(record_header(r, "accept-encoding"), Some("identity"), "{r}");
    }
}

// covers: E19 (an upstream that compresses although asked not to gets a 502, never a pass; a Range request
// reaches the upstream without its Range, so an echo cannot be read back in slices)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn unscannable_answers_are_refused_and_ranges_are_dropped() {
    let world = World::new().await;
    let value = secret_value("gz");
    let upstream = world.upstream(&[API], None, serde_json::json!({})).await;
    let mut sh = curl("GZ", &format!("--compressed 'https://{API}/reflect?form=gzip'"));
    sh += &curl("RANGE", &format!("-r 8-12 'https://{API}/reflect?form=raw'"));
    let out = world
        .run()
        .secrets(API_SECRET)
        .env("API_TOKEN", &value)
        .map(API, 443, upstream.addr)
        .sh(&sh)
        .await;
    let vars = printed(&out.stdout);
    assert!(vars["GZ"].ends_with(" 502"), "{vars:#?}");
    assert!(!out.stdout.contains(&value), "{}", out.stdout);
    let ranged = upstream.requests("/reflect?form=raw");
    assert_eq!(ranged.len(), 1);
    assert_eq!(record_header(&ranged[0], "range"), None, "{ranged:#?}");
}

/// Reads one WebSocket message (fragments joined), printing control frames as they pass.
const WS_REFLECT_PY: &str = r#"
import os, socket, ssl, struct, sys, base64
host, path = sys.argv[1], sys.argv[2]
ctx = ssl.create_default_context()
s = ctx.wrap_socket(socket.create_connection((host, 443), timeout=10), server_hostname=host)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n"
           "Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n" % (path, host, key)).encode())
f = s.makefile("rb")
status = f.readline().split()[1].decode()
while f.readline() not in (b"\r\n", b""):
    pass
print("STATUS=%s" % status)
message, first = b"", None
while True:
    head = f.read(2)
    op, n = head[0] & 0x0F, head[1] & 0x7F
    if n == 126:
        n = struct.unpack(">H", f.read(2))[0]
    data = f.read(n)
    if op >= 8:
        print("CONTROL%d=%s" % (op, data.decode()))
        continue
    message += data
    if head[0] & 0x80:
        break
print("MESSAGE=%s" % message.decode())
"#;

// covers: E19 (a WebSocket upstream that quotes the key in a fragmented message and a ping: the sandbox
// reads placeholders; the extension the client offered is not passed on, so frames stay scannable)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn websocket_frames_never_carry_the_key() {
    let world = World::new().await;
    let value = secret_value("wsecho");
    let upstream = world.upstream(&[API], None, serde_json::json!({})).await;
    let client = script(&world, "ws_reflect.py", WS_REFLECT_PY);
    let out = world
        .run()
        .secrets(API_SECRET)
        .env("API_TOKEN", &value)
        .map(API, 443, upstream.addr)
        .sh(&format!(
            "echo \"API_KEY=$API_KEY\"; /usr/bin/python3 {client} {API} '/ws?reflect=Authorization'"
        ))
        .await;
    let vars = printed(&out.stdout);
    assert!(!out.stdout.contains(&value), "{out:#?}");
    assert_eq!(vars.get("STATUS").map(String::as_str), Some("101"), "{out:#?}");
    let placeholder = &vars["API_KEY"];
    assert_eq!(
        vars["MESSAGE"],
        format!("you sent: {placeholder} (end)"),
        "{out:#?}"
    );
    assert_eq!(vars["CONTROL9"], *placeholder, "{out:#?}");
    let upgrade = &upstream.requests("/ws")[0];
    assert_eq!(
        record_header(upgrade, "authorization"),
        Some(format!("Bearer {value}").as_str())
    );
    assert_eq!(
        record_header(upgrade, "sec-websocket-extensions"),
        None,
        "{upgrade}"
    );
}

// covers: E13 (amended: the placeholder is replaced only in the rule's header; in any other place of a
// request to the rule host, in any encoding or case, the request is refused 403 and never reaches the
// upstream; the log names the secret and the typed reason, never the value)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn a_placeholder_outside_its_header_is_refused_in_every_form() {
    let world = World::new().await;
    let value = secret_value("misplaced");
    let log = world.path("log.jsonl");
    let mut sh = String::new();
    let attempts = [
        // What made the preset hosts' own error messages return the key.
        "-H \"anthropic-beta: $API_KEY\"",
        "-H \"OpenAI-Organization: org-$API_KEY\"",
        "-H \"Cookie: s=$API_KEY\"",
        "-H \"X-$API_KEY: 1\"",
        "\"https://{API}/v1/$API_KEY\"",
        "\"https://{API}/v1?key=$API_KEY\"",
        "\"https://{API}/v1?a=1;key=$API_KEY\"",
        "\"https://{API}/v1?key=$(printf %s \"$API_KEY\" | tr a-z A-Z)\"",
        "\"https://{API}/v1?key=$(printf %s \"$API_KEY\" | sed 's/-/%2D/g')\"",
        "\"https://{API}/v1?key=$(printf %s \"$API_KEY\" | sed 's/-/%252D/g')\"",
    ];
    for (i, attempt) in attempts.iter().enumerate() {
        let attempt = attempt.replace("{API}", API);
        let url = if attempt.contains("https://") {
            String::new()
        } else {
            format!("https://{API}/a{i}")
        };
        for flag in ["--http1.1", "--http2"] {
            sh += &format!(
                "echo \"A{i}{flag}=$(curl -sS -m 10 --noproxy '*' {flag} -o /dev/null -w '%{{http_code}}' {attempt} {url})\"\n"
            );
        }
    }
    let out = world
        .run()
        .secrets(API_SECRET)
        .env("API_TOKEN", &value)
        .log(&log)
        .sh(&sh)
        .await;
    out.expect_code(0);
    let vars = printed(&out.stdout);
    for i in 0..attempts.len() {
        for flag in ["--http1.1", "--http2"] {
            assert_eq!(
                vars[&format!("A{i}{flag}")],
                "403",
                "attempt {i} ({}) {flag}: {out:#?}",
                attempts[i]
            );
        }
    }
    assert!(
        world.echoed(API).is_empty(),
        "a refused request reached the upstream"
    );
    let log = read_log(&log);
    let refused: Vec<_> = log
        .iter()
        .filter(|e| e["reason"] == "placeholder_misplaced")
        .collect();
    assert_eq!(refused.len(), attempts.len() * 2, "{log:#?}");
    for e in &refused {
        assert_eq!(
            (e["status"].as_u64(), e["secret"].as_str()),
            (Some(403), Some("api")),
            "{e}"
        );
    }
    let text = std::fs::read_to_string(world.path("log.jsonl")).unwrap();
    assert!(!text.contains(&value), "{text}");
}
