//! What a connection's bytes decide (E4, E5, E21, E23), whichever way it reached the gateway: a TCP
//! connection redirected to the transparent proxy, or the inside of a CONNECT tunnel. One rule for both:
//! bytes that are TLS are decided by their SNI, bytes that are HTTP by the `Host` of every request, and
//! only bytes that are neither by the name the agent resolved for the address (or the CONNECT target).
//!
//! Whatever the port and however long the client waits:
//! - [`crate::sniff::classify`] calls HTTP anything a lenient server would read as a request, so such bytes
//!   are parsed strictly and refused when the parser does not accept them, never spliced unread;
//! - a client that does not speak first (SMTP, MySQL wait for the server's greeting) gets the upstream of
//!   the resolved name, but its own first bytes are still read before anything of them is forwarded: if the
//!   server has not spoken yet, they are decided afresh as above (a slow client that then sends a
//!   ClientHello or a request is decided by its SNI or Host); if it has, TLS must name the host the
//!   connection was opened for, and HTTP is refused;
//! - TLS is intercepted (for hosts with a secret rule) only when the bytes are TLS, never because of a port.
//!
//! Every spliced connection is logged when it opens and when it closes, holds a connection permit
//! ([`crate::budget`]) and is registered with [`crate::open`], which closes it when a policy change denies
//! it (E21).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agenthold_core::policy::{DenyReason, Verdict, normalize_name};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::budget::ConnPermit;
use crate::context::{AgentContext, Context};
use crate::dial::DialError;
use crate::http::{ConnCtx, Mode, Proto};
use crate::io::{Rewind, SpliceEnd, splice, splice_tcp};
use crate::log::{LogEntry, LogKind, PendingEntry, Reason};
use crate::open::Registration;
use crate::sniff::{self, Protocol, Sniff};
use crate::target::Target;

/// How long to wait for a client's first bytes on ports where the client may not speak first (SMTP, MySQL,
/// …): after this, the upstream is dialled and its greeting relayed, and the client's bytes are read
/// (never forwarded unread) when they come. On 80 and 443 the client always speaks first, so there the
/// full sniff timeout applies.
const FIRST_BYTES_WAIT: Duration = Duration::from_millis(300);

/// Most bytes read while looking for a complete ClientHello or request head.
const MAX_SNIFF: usize = 64 * 1024 + 5 * 16;

/// A client stream the gateway serves: the plain TCP socket (then splices are zero-copy) or another
/// stream (a CONNECT tunnel hyper hands over).
pub(crate) trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The TCP socket, when the stream is one.
    fn tcp(&self) -> Option<&TcpStream> {
        None
    }
}

impl ClientStream for TcpStream {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

impl ClientStream for hyper_util::rt::TokioIo<hyper::upgrade::Upgraded> {}

/// Where the client aimed the connection.
#[derive(Debug, Clone)]
pub(crate) enum Aim {
    /// Transparent: the original destination; other TCP is decided by the names the agent resolved for it.
    Orig(SocketAddr),
    /// A CONNECT tunnel to this target.
    Tunnel(Target),
}

/// One connection to decide.
pub(crate) struct Flow {
    /// The agent it belongs to.
    pub(crate) on: AgentContext,
    pub(crate) aim: Aim,
    pub(crate) port: u16,
    /// The connection permit it holds (a tunnel's own; a transparent connection's is held by its task).
    pub(crate) permit: Option<ConnPermit>,
    /// The ClientHello offered Encrypted Client Hello: its SNI is only the public name (logged).
    pub(crate) note_ech: bool,
}

/// An upstream connection already dialled, and the target it was dialled for.
pub(crate) type Dialled = Option<(Target, TcpStream)>;

impl Flow {
    /// The log kind of a connection decided by name or address only (not TLS, not HTTP).
    fn other_kind(&self) -> LogKind {
        match self.aim {
            Aim::Orig(_) => LogKind::Tcp,
            Aim::Tunnel(_) => LogKind::Connect,
        }
    }

    /// The log kind of a spliced TLS connection.
    fn tls_kind(&self) -> LogKind {
        match self.aim {
            Aim::Orig(_) => LogKind::Tls,
            Aim::Tunnel(_) => LogKind::Connect,
        }
    }

    /// What other TCP (and TLS without SNI) is decided by: a name the agent resolved for the original
    /// address that the policy allows (else the address), or the tunnel's target.
    fn name_or_address(&self) -> Target {
        match &self.aim {
            Aim::Tunnel(target) => target.clone(),
            Aim::Orig(orig) => {
                let names = self.on.gw.records.names_for(&self.on.agent, orig.ip());
                names
                    .into_iter()
                    .map(Target::Name)
                    .find(|t| self.on.gw.decide(&self.on.agent, t, self.port).is_allowed())
                    .unwrap_or(Target::Addr(orig.ip()))
            }
        }
    }

    /// A ClientHello without SNI: decided by the tunnel's target, or by the address (never by a resolved
    /// name: TLS names its host itself, and one that does not is judged by where it goes).
    fn name_or_address_for_tls(&self) -> Target {
        match &self.aim {
            Aim::Tunnel(target) => target.clone(),
            Aim::Orig(orig) => Target::Addr(orig.ip()),
        }
    }

    fn entry(&self, kind: LogKind, verdict: Verdict, host: impl Into<String>) -> LogEntry {
        let mut entry = LogEntry::new(&self.on.agent, kind, verdict).to(host, self.port);
        if kind == LogKind::Connect {
            entry.method = Some("CONNECT".into());
            entry.status = verdict.is_allowed().then_some(200);
        }
        entry
    }

    /// A tunnel whose requests are logged one by one (HTTP inside, or intercepted TLS): one entry for the
    /// tunnel itself.
    fn record_tunnel(&self) {
        if let Aim::Tunnel(target) = &self.aim {
            let entry = self.entry(LogKind::Connect, Verdict::Allowed, target.to_string());
            self.on.gw.log.record(entry);
        }
    }

    /// Log a connection refused before anything was forwarded.
    fn refuse(&self, kind: LogKind, reason: DenyReason, host: impl Into<String>) {
        self.on
            .gw
            .log
            .record(self.entry(kind, Verdict::Denied(reason), host));
    }

    fn aimed_host(&self) -> String {
        match &self.aim {
            Aim::Orig(orig) => orig.ip().to_string(),
            Aim::Tunnel(target) => target.to_string(),
        }
    }
}

/// Decide and serve `client`, whose first bytes (possibly none yet) are in `buf`. `upstream` is a
/// connection already dialled (for a tunnel's target), used when the decision lands on its target.
pub(crate) async fn serve<C: ClientStream>(flow: Flow, mut client: C, mut buf: BytesMut, upstream: Dialled) {
    let sniff = flow.on.gw.timeouts.sniff;
    if buf.is_empty() {
        let wait = if matches!(flow.port, 80 | 443) {
            sniff
        } else {
            FIRST_BYTES_WAIT
        };
        match tokio::time::timeout(wait, client.read_buf(&mut buf)).await {
            // The client waits for the server to speak first.
            Err(_) if wait < sniff => return server_first(flow, client, upstream).await,
            Err(_) | Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(_)) => {}
        }
    }
    decide(flow, client, buf, upstream, Instant::now() + sniff).await;
}

/// Classify the bytes in `buf` (reading more until `deadline`) and serve the connection accordingly.
async fn decide<C: ClientStream>(
    flow: Flow,
    mut client: C,
    mut buf: BytesMut,
    upstream: Dialled,
    deadline: Instant,
) {
    loop {
        match sniff::classify(&buf) {
            Protocol::Tls => return tls(flow, client, buf, upstream, deadline).await,
            Protocol::Http => match sniff::parse_request_head(&buf) {
                Sniff::Done(_) => return http(flow, client, buf).await,
                Sniff::NeedMore => {}
                Sniff::NotThisProtocol | Sniff::Invalid(_) => {
                    return flow.refuse(LogKind::Http, DenyReason::Malformed, flow.aimed_host());
                }
            },
            Protocol::Other => {
                let target = flow.name_or_address();
                let kind = flow.other_kind();
                return connect_and_splice(flow, kind, client, target, buf.freeze(), upstream).await;
            }
            Protocol::NeedMore => {}
        }
        if !read_more(&mut client, &mut buf, deadline).await {
            return;
        }
    }
}

/// Read more sniffing bytes before `deadline`; false when the client closed, failed, stalled or sent too
/// much.
async fn read_more<C: ClientStream>(client: &mut C, buf: &mut BytesMut, deadline: Instant) -> bool {
    if buf.len() >= MAX_SNIFF {
        return false;
    }
    matches!(tokio::time::timeout_at(deadline, client.read_buf(buf)).await, Ok(Ok(n)) if n > 0)
}

/// Plain HTTP: every request on the connection is decided by its own `Host` (hyper serves it).
async fn http<C: ClientStream>(flow: Flow, client: C, buf: BytesMut) {
    flow.record_tunnel();
    let ctx = ConnCtx::new(flow.on, flow.permit, Mode::Transparent { port: flow.port });
    crate::http::serve(Arc::new(ctx), Rewind::new(buf.freeze(), client), Proto::Http1).await;
}

/// TLS: decided by the SNI (or, without one, by the address or tunnel target); intercepted for hosts with a
/// secret rule, spliced otherwise.
async fn tls<C: ClientStream>(
    flow: Flow,
    mut client: C,
    mut buf: BytesMut,
    upstream: Dialled,
    deadline: Instant,
) {
    let hello = loop {
        match sniff::parse_client_hello(&buf) {
            Sniff::Done(h) => break h,
            Sniff::NeedMore => {
                if !read_more(&mut client, &mut buf, deadline).await {
                    return;
                }
            }
            Sniff::NotThisProtocol | Sniff::Invalid(_) => {
                return flow.refuse(LogKind::Tls, DenyReason::Malformed, flow.aimed_host());
            }
        }
    };
    let target = match hello.sni.as_deref().map(normalize_name) {
        None => flow.name_or_address_for_tls(),
        Some(Ok(name)) => Target::Name(name),
        Some(Err(_)) => {
            let sni = hello.sni.unwrap_or_default();
            return flow.refuse(LogKind::Tls, DenyReason::InvalidName, sni);
        }
    };
    if let Aim::Tunnel(Target::Name(asked)) = &flow.aim
        && target != Target::Name(asked.clone())
    {
        // CONNECT a.example then a ClientHello for b.example: on a shared address that would reach b.
        return flow.refuse(LogKind::Connect, DenyReason::HostMismatch, target.to_string());
    }
    if let Target::Name(name) = &target
        && flow.on.gw.intercepts(&flow.on.agent, name)
    {
        let verdict = flow.on.gw.decide(&flow.on.agent, &target, flow.port);
        if !verdict.is_allowed() {
            flow.on
                .gw
                .log
                .record(flow.entry(LogKind::Tls, verdict, name.clone()));
            return;
        }
        flow.record_tunnel();
        let io = Rewind::new(buf.freeze(), client);
        let sni = name.clone();
        return crate::intercept::serve(flow.on, flow.permit, flow.port, io, sni).await;
    }
    let kind = flow.tls_kind();
    let mut flow = flow;
    if hello.ech_offered {
        flow.note_ech = true;
    }
    connect_and_splice(flow, kind, client, target, buf.freeze(), upstream).await;
}

/// Decide `target`, dial it (or use `upstream` when it was dialled for the same target), replay `prefix`,
/// splice, and log when the connection opens and when it closes.
async fn connect_and_splice<C: ClientStream>(
    flow: Flow,
    kind: LogKind,
    client: C,
    target: Target,
    prefix: Bytes,
    upstream: Dialled,
) {
    let gw = &flow.on.gw;
    let verdict = gw.decide(&flow.on.agent, &target, flow.port);
    let mut entry = flow.entry(kind, verdict, target.to_string());
    if flow.note_ech && entry.reason.is_none() {
        entry.set_reason(Reason::EchOffered);
    }
    if !verdict.is_allowed() {
        gw.log.record(entry);
        return;
    }
    let upstream = match upstream {
        Some((dialled, s)) if dialled == target => s,
        _ => match dial(&flow, &target).await {
            Ok(s) => s,
            Err(e) => return record_dial_error(gw, entry, &e),
        },
    };
    let mut pending = PendingEntry::new(&gw.log, entry);
    splice_registered(&flow, &mut pending, client, upstream, prefix, &target, None).await;
}

/// Dial `target` on the flow's port: a name through the gateway's resolver and the guard (preferring the
/// address the client used, when the name resolves to it), an address through the guard.
async fn dial(flow: &Flow, target: &Target) -> Result<TcpStream, DialError> {
    let prefer = match flow.aim {
        Aim::Orig(orig) => Some(orig.ip()),
        Aim::Tunnel(_) => None,
    };
    match target {
        Target::Name(n) => flow
            .on
            .gw
            .dialer
            .dial_name(n, flow.port, prefer)
            .await
            .map(|(s, _)| s),
        Target::Addr(a) => flow.on.gw.dialer.dial_addr((*a, flow.port).into()).await,
    }
}

/// Forward `prefix`, splice until either side ends, the connection idles out, the agent is detached or a
/// policy change revokes it. Logged when it opens and when it closes.
async fn splice_registered<C: ClientStream>(
    flow: &Flow,
    pending: &mut PendingEntry,
    client: C,
    mut upstream: TcpStream,
    prefix: Bytes,
    target: &Target,
    registration: Option<Registration>,
) {
    let gw = &flow.on.gw;
    let registration = match registration {
        Some(r) => r,
        None => gw
            .open
            .register_logged(pending, &flow.on.agent, target, flow.port),
    };
    if let Err(e) = upstream.write_all(&prefix).await {
        pending.entry.fail(format!("upstream: {e}"));
        return;
    }
    pending
        .counters
        .up
        .fetch_add(prefix.len() as u64, std::sync::atomic::Ordering::Relaxed);
    let idle = gw.timeouts.idle;
    let counters = &pending.counters;
    let spliced = async {
        if client.tcp().is_none() {
            return splice(client, &mut upstream, idle, counters).await;
        }
        match client.tcp() {
            Some(tcp) => splice_tcp(tcp, &upstream, idle, counters).await,
            None => SpliceEnd::Closed,
        }
    };
    let revoked = tokio::select! {
        end = spliced => {
            if let SpliceEnd::Error(e) = end {
                tracing::debug!(agent = %flow.on.agent, error = %e, "splice ended with an error");
            }
            false
        }
        () = registration.revoke.cancelled() => true,
        () = flow.on.cancel.cancelled() => false,
    };
    if revoked {
        pending.revoked();
    }
}

/// The client did not speak within [`FIRST_BYTES_WAIT`]: dial what the name (or address) allows, relay the
/// server's greeting, and read the client's first bytes before forwarding any of them.
async fn server_first<C: ClientStream>(flow: Flow, mut client: C, upstream: Dialled) {
    let target = flow.name_or_address();
    let kind = flow.other_kind();
    let verdict = flow.on.gw.decide(&flow.on.agent, &target, flow.port);
    let entry = flow.entry(kind, verdict, target.to_string());
    if !verdict.is_allowed() {
        return flow.on.gw.log.record(entry);
    }
    let mut upstream = match upstream {
        Some((dialled, s)) if dialled == target => s,
        _ => match dial(&flow, &target).await {
            Ok(s) => s,
            Err(e) => return record_dial_error(&flow.on.gw, entry, &e),
        },
    };
    let mut pending = PendingEntry::new(&flow.on.gw.log, entry);
    // Open from now on: a policy change closes it while it waits, too (E21).
    let registration = flow
        .on
        .gw
        .open
        .register_logged(&mut pending, &flow.on.agent, &target, flow.port);
    let mut buf = BytesMut::with_capacity(4096);
    let mut greeting = vec![0u8; 4096];
    let mut spoke = false;
    let idle = flow.on.gw.timeouts.idle;
    loop {
        tokio::select! {
            read = client.read_buf(&mut buf) => match read {
                Ok(n) if n > 0 => break,
                _ => return,
            },
            read = upstream.read(&mut greeting) => match read {
                Ok(n) if n > 0 => {
                    spoke = true;
                    if client.write_all(greeting.get(..n).unwrap_or_default()).await.is_err() {
                        return;
                    }
                    pending.counters.down.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                }
                _ => return,
            },
            () = tokio::time::sleep(idle) => return,
            () = registration.revoke.cancelled() => return pending.revoked(),
            () = flow.on.cancel.cancelled() => return,
        }
    }
    let deadline = Instant::now() + flow.on.gw.timeouts.sniff;
    if !spoke {
        // Nothing crossed yet: decide the client's bytes as if they had come first.
        pending.discard();
        drop(registration);
        return decide(flow, client, buf, Some((target, upstream)), deadline).await;
    }
    // The server spoke: the client's bytes go to this upstream, so they must not be TLS for another name or
    // HTTP (whose requests would each need their own decision).
    loop {
        match sniff::classify(&buf) {
            Protocol::Other => break,
            Protocol::Http => {
                pending.entry.set_reason(Reason::HttpAfterServerGreeting);
                return;
            }
            Protocol::Tls => match sniff::parse_client_hello(&buf) {
                Sniff::Done(hello) => {
                    let named = hello.sni.as_deref().map(normalize_name);
                    let same = match named {
                        None => true,
                        Some(Ok(name)) => Target::Name(name) == target,
                        Some(Err(_)) => false,
                    };
                    if same {
                        break;
                    }
                    pending.entry.deny(DenyReason::HostMismatch);
                    return;
                }
                Sniff::NeedMore => {}
                Sniff::NotThisProtocol | Sniff::Invalid(_) => {
                    pending.entry.deny(DenyReason::Malformed);
                    return;
                }
            },
            Protocol::NeedMore => {}
        }
        if !read_more(&mut client, &mut buf, deadline).await {
            return;
        }
    }
    splice_registered(
        &flow,
        &mut pending,
        client,
        upstream,
        buf.freeze(),
        &target,
        Some(registration),
    )
    .await;
}

/// Log a failed dial: a guard refusal is a denial, anything else an upstream failure.
pub(crate) fn record_dial_error(gw: &Context, mut entry: LogEntry, e: &DialError) {
    if e.is_blocked() {
        entry.deny(DenyReason::BlockedAddress);
    } else {
        entry.fail(format!("upstream: {e}"));
    }
    gw.log.record(entry);
}
