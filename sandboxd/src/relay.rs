//! Agent messages, PID 1's side (P3, S4): `sandboxd boot` listens on [`SEND_SOCKET`] (mode 0666: the
//! harness runs as a non-root user) and forwards each well-formed `SEND` request over a fresh tunnel
//! connection authenticated with the boot token, which never leaves this process. The runtime knows the
//! sender by the tunnel listener, so nothing a local user writes can name another sender.
//!
//! Bounded: at most [`MAX_INFLIGHT`] requests at once (more are answered `ERR busy` at once), the request
//! line and body by their lengths and [`wire::REQUEST_TIMEOUT`], the tunnel's answer by
//! [`wire::ANSWER_TIMEOUT`]; every write has a timeout.
// enforces: S4

use std::io::Write as _;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use sandboxd::contract::tunnel::{self as wire, Answer};
use sandboxd::contract::{SEND_SOCKET, SEND_SOCKET_MODE};

use crate::layout::Layout;
use crate::log;
use crate::send::{WRITE_TIMEOUT, Wire};
use crate::tunnel::TunnelConfig;

/// Requests handled at once; more are refused with `ERR busy`.
pub(crate) const MAX_INFLIGHT: usize = 4;

/// Decrements the in-flight count when a request ends.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Binds [`SEND_SOCKET`] (replacing what a previous boot left) and serves it on a background thread.
/// `tunnel` is `None` when the sandbox has no tunnel: requests are then refused with a clear reason.
pub(crate) fn spawn(
    layout: &Layout,
    tunnel: Option<TunnelConfig>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let path: PathBuf = layout.path(SEND_SOCKET);
    match std::fs::remove_file(&path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
        _ => {}
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(SEND_SOCKET_MODE))?;
    let tunnel = tunnel.map(Arc::new);
    std::thread::Builder::new()
        .name("send-relay".into())
        .spawn(move || serve(&listener, tunnel.as_ref()))
}

/// Accepts forever.
fn serve(listener: &UnixListener, tunnel: Option<&Arc<TunnelConfig>>) {
    let inflight = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(conn) = conn else {
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        };
        let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
        if inflight.fetch_add(1, Ordering::SeqCst) >= MAX_INFLIGHT {
            inflight.fetch_sub(1, Ordering::SeqCst);
            let _ = (&conn).write_all(wire::err("busy: too many agent messages at once").as_bytes());
            continue;
        }
        let guard = InFlight(Arc::clone(&inflight));
        let tunnel = tunnel.cloned();
        let spawned = std::thread::Builder::new().name("send".into()).spawn(move || {
            let _guard = guard;
            handle(&conn, tunnel.as_deref());
        });
        if let Err(err) = spawned {
            log!("send: cannot start a thread: {err}");
        }
    }
}

/// One request from the socket: read and check it, forward it, write the answer.
fn handle(conn: &UnixStream, tunnel: Option<&TunnelConfig>) {
    let answer = match read_request(conn) {
        Ok(request) => match tunnel {
            Some(cfg) => forward(cfg, &request),
            None => wire::err("agent messages need the tunnel, and this sandbox has none"),
        },
        Err(reason) => wire::err(&reason),
    };
    let _ = (&*conn).write_all(answer.as_bytes());
}

/// Reads one request within [`wire::REQUEST_TIMEOUT`] and returns it re-encoded (only checked bytes go
/// on).
fn read_request(conn: &UnixStream) -> Result<Vec<u8>, String> {
    let stream = conn.try_clone().map_err(|err| err.to_string())?;
    let mut wire_in = Wire::new(stream);
    let deadline = Instant::now() + wire::REQUEST_TIMEOUT;
    let line = wire_in
        .line(deadline)
        .map_err(|err| format!("reading the request: {err}"))?;
    let line = std::str::from_utf8(&line).map_err(|_| wire::SendError::Malformed.to_string())?;
    let head = wire::parse_send(line).map_err(|e| e.to_string())?;
    let body = wire_in
        .exact(head.body_len(), deadline)
        .map_err(|err| format!("reading the request: {err}"))?;
    let (name, prompt) = wire::parse_body(&head, &body).map_err(|e| e.to_string())?;
    wire::request(head.harness, name, prompt).map_err(|e| e.to_string())
}

/// Sends `request` over a fresh tunnel connection and returns the answer line to relay.
fn forward(cfg: &TunnelConfig, request: &[u8]) -> String {
    match exchange(cfg, request) {
        Ok(Answer::Started(run)) => wire::started(&run),
        Ok(Answer::Refused(reason)) => wire::err(&reason),
        Err(why) => {
            log!("send: {why}");
            wire::err(&format!("cannot reach agenthold: {why}"))
        }
    }
}

/// Hello, `OK`, request, answer. Errors never contain the token.
fn exchange(cfg: &TunnelConfig, request: &[u8]) -> Result<Answer, String> {
    let stream = TcpStream::connect_timeout(&cfg.addr, cfg.timeout).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_nodelay(true)
        .and_then(|()| stream.set_write_timeout(Some(cfg.timeout)))
        .map_err(|e| format!("connect: {e}"))?;
    (&stream)
        .write_all(cfg.hello().as_bytes())
        .map_err(|e| format!("hello: {e}"))?;
    let mut conn = Wire::new(stream.try_clone().map_err(|e| format!("hello: {e}"))?);
    let ok = conn
        .line(Instant::now() + cfg.timeout)
        .map_err(|e| format!("hello: {e}"))?;
    if ok.as_slice() != wire::OK.as_bytes() {
        return match wire::parse_answer(&ok) {
            Ok(Answer::Refused(reason)) => Ok(Answer::Refused(format!("tunnel refused: {reason}"))),
            _ => Err("hello: unexpected answer".to_owned()),
        };
    }
    (&stream)
        .write_all(request)
        .map_err(|e| format!("request: {e}"))?;
    let answer = conn
        .line(Instant::now() + wire::ANSWER_TIMEOUT)
        .map_err(|e| format!("answer: {e}"))?;
    wire::parse_answer(&answer).map_err(|()| "answer: not part of the protocol".to_owned())
}

#[cfg(test)]
mod tests;
