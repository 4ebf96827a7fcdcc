//! Requests the harness's `call` does not make: fallible ones (for a server that is being killed), streams
//! read only up to their headers (an SSE answer stays open), WebSocket handshakes, and raw bytes on a socket
//! (a body without `Content-Type`, one past the size cap).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use super::support::Auth;

/// What came back.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) content_type: String,
    pub(crate) retry_after: Option<String>,
    /// The JSON body, or the text as a string; `Null` for a stream or an empty body.
    pub(crate) body: Value,
}

impl Answer {
    /// Whether this is a problem+json error with its `status` and `code`.
    pub(crate) fn is_problem(&self) -> bool {
        self.content_type.starts_with("application/problem+json")
            && self.body["status"] == self.status
            && self.body["code"].is_string()
    }
}

/// A client with bounded waits and no error for 4xx/5xx.
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(5)))
        .timeout_recv_response(Some(Duration::from_secs(90)))
        .timeout_recv_body(Some(Duration::from_secs(90)))
        .build()
        .new_agent()
}

/// `METHOD base+path` with `auth`, a JSON `body` and extra `headers`; `Err` when no answer came (the server
/// is gone). A `text/event-stream` answer is not read past its headers.
pub(crate) fn request(
    base: &str,
    method: &str,
    path: &str,
    auth: &Auth,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Result<Answer, String> {
    let mut req = ureq::http::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"));
    match auth {
        Auth::None => {}
        Auth::Token(t) => req = req.header("Authorization", format!("Bearer {t}")),
        Auth::Session(s) => req = req.header("Cookie", format!("agenthold_session={s}")),
    }
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("accept")) {
        req = req.header("Accept", "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let agent = agent();
    let response = match body {
        Some(b) => {
            let bytes = serde_json::to_vec(b).map_err(|e| e.to_string())?;
            let req = req.header("Content-Type", "application/json").body(bytes);
            agent.run(req.map_err(|e| e.to_string())?)
        }
        None => agent.run(req.body(()).map_err(|e| e.to_string())?),
    }
    .map_err(|e| format!("{method} {path}: {e}"))?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let status = response.status().as_u16();
    let content_type = header("content-type").unwrap_or_default();
    let retry_after = header("retry-after");
    let body = if content_type.starts_with("text/event-stream") {
        Value::Null
    } else {
        let raw = response
            .into_body()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_vec()
            .map_err(|e| format!("{method} {path}: body: {e}"))?;
        parse(&raw)
    };
    Ok(Answer {
        status,
        content_type,
        retry_after,
        body,
    })
}

/// [`request`] that panics when no answer came.
pub(crate) fn call(
    base: &str,
    method: &str,
    path: &str,
    auth: &Auth,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Answer {
    request(base, method, path, auth, body, headers).unwrap_or_else(|e| panic!("{e}"))
}

fn parse(raw: &[u8]) -> Value {
    if raw.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(raw).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(raw).into_owned()))
}

/// Send `head` (request line and headers, without the blank line; `Host` is added, and `Connection: close`
/// unless the head has a `Connection`) and `body` on a fresh connection to `base` and read the answer.
/// Write errors after the head are ignored: a server may answer (413) and close before it has read a body
/// past its cap.
pub(crate) fn raw(base: &str, head: &str, body: &[u8]) -> Answer {
    let addr = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    let close = if head.to_ascii_lowercase().contains("\r\nconnection:") {
        ""
    } else {
        "\r\nConnection: close"
    };
    let head = format!("{head}\r\nHost: {addr}{close}\r\n\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let _ = stream.write_all(body);
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    // Read the head, then the body by Content-Length (a 101 has none: stop at the head).
    let (head_end, length) = loop {
        let n = stream.read(&mut chunk).unwrap_or(0);
        assert!(
            n > 0 || !answer.is_empty(),
            "no answer from the server to {head:?}"
        );
        answer.extend_from_slice(&chunk[..n]);
        if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
            let length = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (end + 4, length);
        }
        assert!(n > 0, "the answer ended inside its head: {answer:?}");
    };
    while answer.len() < head_end + length {
        let n = stream.read(&mut chunk).unwrap_or(0);
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&answer[..head_end]).into_owned();
    let mut lines = text.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let header = |name: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    };
    let end = answer.len().min(head_end + length);
    Answer {
        status,
        content_type: header("content-type").unwrap_or_default(),
        retry_after: header("retry-after"),
        body: parse(&answer[head_end..end]),
    }
}

/// A WebSocket handshake on `path` (the answer's head only: 101 when upgraded, else the error).
pub(crate) fn websocket(base: &str, path: &str, auth: &Auth) -> Answer {
    let credential = match auth {
        Auth::None => String::new(),
        Auth::Token(t) => format!("\r\nAuthorization: Bearer {t}"),
        Auth::Session(s) => format!("\r\nCookie: agenthold_session={s}"),
    };
    let head = format!(
        "GET {path} HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: {base}{credential}"
    );
    raw(base, &head, b"")
}

/// Configuration giving a test server agent networks of its own (`10.216.<16·slot>.0/20`), so that servers
/// started at the same time (by this binary or another test run on the host) never race for one subnet.
pub(crate) fn own_pool(slot: u8) -> String {
    format!("sandbox:\n  subnet_pool: 10.216.{}.0/20\n", u16::from(slot) * 16)
}
