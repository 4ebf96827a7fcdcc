//! The transparent proxy (E4, E5): every TCP connection the sandbox makes, redirected here by nftables.
//!
//! It reads the original destination (SO_ORIGINAL_DST) and the first bytes, then decides by name:
//! TLS → the ClientHello's SNI (no SNI: by address); plain HTTP → the `Host` of every request; anything
//! else → the name the agent resolved for that address through the gateway's DNS (none: by address).
//! Named destinations are resolved and dialled by the gateway itself; the client's address is never
//! dialled for them. Non-intercepted connections are spliced without reading past the ClientHello.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agenthold_core::AgentId;
use agenthold_core::policy::{DenyReason, Verdict, normalize_name};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::dial::DialError;
use crate::gateway::{Shared, Target};
use crate::http::{ConnCtx, Mode, Proto};
use crate::io::{SpliceEnd, splice_tcp};
use crate::log::{LogEntry, LogKind, PendingEntry};
use crate::sniff::{self, Protocol, Sniff};

/// How long to wait for a client's first bytes on ports where the client may not speak first (SMTP, MySQL,
/// …): after this, the connection is decided as "other TCP". On 80 and 443 the client always speaks
/// first, so there the full sniff timeout applies.
const FIRST_BYTES_WAIT: Duration = Duration::from_millis(300);

/// Most bytes read while looking for a complete ClientHello or request head.
const MAX_SNIFF: usize = 64 * 1024 + 5 * 16;

/// Connections served at once per agent and listener; more are closed on accept.
pub(crate) const MAX_CONNECTIONS: usize = 1024;

/// Accept loop of one agent's listener: each connection runs `handle` until it ends or `cancel` fires.
pub(crate) async fn accept_loop<F, Fut>(listener: TcpListener, cancel: CancellationToken, handle: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&limit).try_acquire_owned() else {
            tracing::warn!("connection limit reached, closing new connection");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = handle(stream);
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = conn => {},
                () = cancel.cancelled() => {},
            }
            drop(permit);
        });
    }
}

/// Serve one agent's transparent listener.
pub(crate) async fn serve(gw: Arc<Shared>, agent: AgentId, listener: TcpListener, cancel: CancellationToken) {
    let token = cancel.clone();
    accept_loop(listener, cancel, move |stream| {
        let span = tracing::debug_span!("transparent", agent = %agent);
        handle(Arc::clone(&gw), agent.clone(), stream, token.clone()).instrument(span)
    })
    .await;
}

fn original_dst(stream: &TcpStream) -> std::io::Result<SocketAddr> {
    let sock = socket2::SockRef::from(stream);
    match stream.local_addr()? {
        SocketAddr::V4(_) => sock.original_dst_v4(),
        SocketAddr::V6(_) => sock.original_dst_v6(),
    }
    .and_then(|a| {
        a.as_socket()
            .ok_or_else(|| std::io::Error::other("original destination is not IP"))
    })
}

async fn handle(gw: Arc<Shared>, agent: AgentId, mut stream: TcpStream, cancel: CancellationToken) {
    let orig = match original_dst(&stream) {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(agent = %agent, error = %e, "no original destination; dropping");
            return;
        }
    };
    let deadline = Instant::now() + gw.timeouts.sniff;
    let first_wait = if matches!(orig.port(), 80 | 443) {
        gw.timeouts.sniff
    } else {
        FIRST_BYTES_WAIT
    };
    let mut buf = BytesMut::with_capacity(4096);
    match tokio::time::timeout(first_wait, stream.read_buf(&mut buf)).await {
        // The client waits for the server to speak first.
        Err(_) if first_wait < gw.timeouts.sniff => {
            return other_tcp(&gw, &agent, stream, orig, Bytes::new()).await;
        }
        Err(_) | Ok(Ok(0) | Err(_)) => return,
        Ok(Ok(_)) => {}
    }
    loop {
        match sniff::classify(&buf) {
            Protocol::Tls => return tls(&gw, &agent, stream, orig, buf, deadline, cancel).await,
            // A first byte that could start a method: confirm with the whole head (an SSH banner also
            // starts with a letter) before handing the connection to the HTTP server.
            Protocol::Http => match sniff::parse_request_head(&buf) {
                Sniff::Done(_) => {
                    let mode = Mode::Transparent { port: orig.port() };
                    let ctx = Arc::new(ConnCtx {
                        gw: Arc::clone(&gw),
                        agent,
                        mode,
                        cancel,
                    });
                    return crate::http::serve(
                        ctx,
                        crate::io::Rewind::new(buf.freeze(), stream),
                        Proto::Http1,
                    )
                    .await;
                }
                Sniff::NotThisProtocol => return other_tcp(&gw, &agent, stream, orig, buf.freeze()).await,
                Sniff::Invalid(_) => return refuse_malformed(&gw, &agent, LogKind::Http, orig),
                Sniff::NeedMore => {
                    if !read_more(&mut stream, &mut buf, deadline).await {
                        return;
                    }
                }
            },
            Protocol::Other => return other_tcp(&gw, &agent, stream, orig, buf.freeze()).await,
            Protocol::NeedMore => {
                if !read_more(&mut stream, &mut buf, deadline).await {
                    return;
                }
            }
        }
    }
}

/// Read more sniffing bytes before `deadline`; false when the client closed, failed, stalled or sent too
/// much.
async fn read_more(stream: &mut TcpStream, buf: &mut BytesMut, deadline: Instant) -> bool {
    if buf.len() >= MAX_SNIFF {
        return false;
    }
    matches!(tokio::time::timeout_at(deadline, stream.read_buf(buf)).await, Ok(Ok(n)) if n > 0)
}

async fn tls(
    gw: &Arc<Shared>,
    agent: &AgentId,
    mut stream: TcpStream,
    orig: SocketAddr,
    mut buf: BytesMut,
    deadline: Instant,
    cancel: CancellationToken,
) {
    let hello = loop {
        match sniff::parse_client_hello(&buf) {
            Sniff::Done(h) => break h,
            Sniff::NeedMore => {
                if !read_more(&mut stream, &mut buf, deadline).await {
                    return;
                }
            }
            Sniff::NotThisProtocol | Sniff::Invalid(_) => {
                return refuse_malformed(gw, agent, LogKind::Tls, orig);
            }
        }
    };
    let port = orig.port();
    let target = match hello.sni.as_deref().map(normalize_name) {
        None => Target::Addr(orig.ip()),
        Some(Ok(name)) => Target::Name(name),
        Some(Err(_)) => {
            let mut entry = LogEntry::new(agent, LogKind::Tls, Verdict::Denied(DenyReason::InvalidName));
            entry = entry.to(hello.sni.unwrap_or_default(), port);
            gw.log.record(entry);
            return;
        }
    };
    if let Target::Name(name) = &target
        && crate::intercept::wanted(gw, agent, name)
    {
        let verdict = gw.decide(agent, &target, port);
        if !verdict.is_allowed() {
            gw.log
                .record(LogEntry::new(agent, LogKind::Tls, verdict).to(name.clone(), port));
            return;
        }
        let io = crate::io::Rewind::new(buf.freeze(), stream);
        return crate::intercept::serve(Arc::clone(gw), agent.clone(), io, name.clone(), port, cancel).await;
    }
    connect_and_splice(gw, agent, LogKind::Tls, stream, orig, target, buf.freeze()).await;
}

/// Neither TLS nor HTTP: decide by the name the agent resolved for the original address, else by address.
async fn other_tcp(gw: &Arc<Shared>, agent: &AgentId, stream: TcpStream, orig: SocketAddr, prefix: Bytes) {
    let port = orig.port();
    let names = gw.records.names_for(agent, orig.ip());
    let named = names
        .into_iter()
        .map(Target::Name)
        .find(|t| gw.decide(agent, t, port).is_allowed());
    let target = named.unwrap_or(Target::Addr(orig.ip()));
    connect_and_splice(gw, agent, LogKind::Tcp, stream, orig, target, prefix).await;
}

/// Decide `target`, dial it, replay `prefix`, splice, and log when the connection closes.
async fn connect_and_splice(
    gw: &Arc<Shared>,
    agent: &AgentId,
    kind: LogKind,
    stream: TcpStream,
    orig: SocketAddr,
    target: Target,
    prefix: Bytes,
) {
    let port = orig.port();
    let verdict = gw.decide(agent, &target, port);
    let entry = LogEntry::new(agent, kind, verdict).to(target.to_string(), port);
    if !verdict.is_allowed() {
        gw.log.record(entry);
        return;
    }
    let dialed = match &target {
        Target::Name(n) => gw
            .dialer
            .dial_name(n, port, Some(orig.ip()))
            .await
            .map(|(s, _)| s),
        Target::Addr(_) => gw.dialer.dial_addr(orig).await,
    };
    let mut upstream = match dialed {
        Ok(s) => s,
        Err(e) => return record_dial_error(gw, entry, &e),
    };
    let mut pending = PendingEntry::new(&gw.log, entry);
    if let Err(e) = upstream.write_all(&prefix).await {
        pending.entry.fail(format!("upstream: {e}"));
        return;
    }
    pending
        .counters
        .up
        .fetch_add(prefix.len() as u64, std::sync::atomic::Ordering::Relaxed);
    if let SpliceEnd::Error(e) = splice_tcp(&stream, &upstream, gw.timeouts.idle, &pending.counters).await {
        tracing::debug!(agent = %agent, error = %e, "splice ended with an error");
    }
}

/// Log a connection whose first bytes break the protocol they started (it is then closed).
fn refuse_malformed(gw: &Shared, agent: &AgentId, kind: LogKind, orig: SocketAddr) {
    let entry = LogEntry::new(agent, kind, Verdict::Denied(DenyReason::Malformed));
    gw.log.record(entry.to(orig.ip().to_string(), orig.port()));
}

/// Log a failed dial: a guard refusal is a denial, anything else an upstream failure.
pub(crate) fn record_dial_error(gw: &Shared, mut entry: LogEntry, e: &DialError) {
    if e.is_blocked() {
        entry.deny(DenyReason::BlockedAddress);
    } else {
        entry.fail(format!("upstream: {e}"));
    }
    gw.log.record(entry);
}
