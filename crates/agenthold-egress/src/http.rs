//! HTTP forwarding shared by the transparent proxy (plain HTTP), the explicit proxy (absolute-form
//! requests) and, later, intercepted TLS streams: every request is decided on its own `Host` (E4: a second
//! request on a keep-alive connection to another host is decided again), forwarded through a pooled
//! upstream client whose connector dials only what the gateway resolved and the guard allowed (E5, E6), and
//! logged with its status and the bytes that crossed (E16). Bodies stream both ways; nothing is buffered.

use std::convert::Infallible;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agenthold_core::AgentId;
use agenthold_core::policy::{DenyReason, Verdict};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::dial::{DialError, Dialer};
use crate::gateway::{Shared, Target};
use crate::io::{SpliceEnd, splice};
use crate::log::{Counters, LogEntry, LogKind, PendingEntry};

/// Body type of everything the proxies send.
pub(crate) type ProxyBody = BoxBody<Bytes, BoxError>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Largest request head accepted from a sandbox (hyper's read buffer cap).
const MAX_HEAD: usize = 64 * 1024;

/// The pooled upstream client.
pub(crate) type HttpClient = Client<Connector, ProxyBody>;

/// Build the upstream client over `dialer`.
pub(crate) fn client(dialer: Dialer) -> HttpClient {
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(std::time::Duration::from_secs(60))
        .pool_max_idle_per_host(32)
        .http1_max_buf_size(1024 * 1024)
        .set_host(false)
        .retry_canceled_requests(false)
        .build(Connector { dialer })
}

/// Dials upstreams for the pooled client: names through the gateway's resolver and the guard, addresses
/// through the guard.
#[derive(Clone, Debug)]
pub(crate) struct Connector {
    dialer: Dialer,
}

/// A connection made by [`Connector`].
pub(crate) struct UpstreamConn(TokioIo<TcpStream>);

impl Connection for UpstreamConn {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for UpstreamConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for UpstreamConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = UpstreamConn;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamConn, DialError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), DialError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let dialer = self.dialer.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(80);
            let stream = match host.parse::<IpAddr>() {
                Ok(ip) => dialer.dial_addr((ip, port).into()).await?,
                Err(_) => dialer.dial_name(host, port, None).await?.0,
            };
            Ok(UpstreamConn(TokioIo::new(stream)))
        })
    }
}

/// How requests reached the gateway on one client connection.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Mode {
    /// Plain HTTP redirected by nftables: the host comes from `Host`, the port is the original one.
    Transparent {
        /// The original destination port.
        port: u16,
    },
    /// The explicit proxy: absolute-form URIs (CONNECT is handled by the explicit proxy itself).
    Explicit,
}

/// Per-connection context of an HTTP client connection.
pub(crate) struct ConnCtx {
    pub(crate) gw: Arc<Shared>,
    pub(crate) agent: AgentId,
    pub(crate) mode: Mode,
    /// Fires when the agent is detached or the gateway shuts down; tasks spawned for this connection
    /// (tunnels, upgrades) end with it.
    pub(crate) cancel: tokio_util::sync::CancellationToken,
}

/// Serve HTTP/1.1 on `io` (a sandbox connection) until it closes or idles out.
pub(crate) async fn serve<IO>(ctx: Arc<ConnCtx>, io: IO)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let timeouts = ctx.gw.timeouts;
    let activity = crate::io::Activity::new();
    activity.touch();
    let io = crate::io::Tracked::new(io, activity.clone());
    let service = hyper::service::service_fn(move |req| {
        let ctx = Arc::clone(&ctx);
        async move { Ok::<_, Infallible>(handle(&ctx, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.sniff)
        .max_buf_size(MAX_HEAD)
        .auto_date_header(false)
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::select! {
        res = conn => if let Err(e) = res { tracing::debug!(error = %e, "http connection ended") },
        () = activity.idle_for(timeouts.idle) => tracing::debug!("http connection idle, closed"),
    }
}

/// Where a request goes, derived from its URI (absolute form) or `Host`.
fn request_target(mode: Mode, req: &Request<Incoming>) -> Result<(String, u16), &'static str> {
    match mode {
        Mode::Explicit => {
            if req.uri().scheme_str() != Some("http") {
                return Err("the explicit proxy takes absolute-form http:// requests and CONNECT");
            }
            let host = req.uri().host().ok_or("request URI has no host")?;
            Ok((host.to_owned(), req.uri().port_u16().unwrap_or(80)))
        }
        Mode::Transparent { port } => {
            let host = match req.uri().authority() {
                Some(a) => a.host().to_owned(),
                None => {
                    let value = req.headers().get(header::HOST).ok_or("request has no Host header")?;
                    let text = value.to_str().map_err(|_| "Host header is not ASCII")?;
                    crate::sniff::split_host_port(text, port)?.0
                }
            };
            Ok((host, port))
        }
    }
}

/// Handle one request from a sandbox.
async fn handle(ctx: &ConnCtx, mut req: Request<Incoming>) -> Response<ProxyBody> {
    let gw = &ctx.gw;
    let path = req.uri().path().to_owned();
    let mut entry = LogEntry::new(&ctx.agent, LogKind::Http, Verdict::Allowed);
    entry.method = Some(req.method().as_str().to_owned());
    entry.path = Some(path);
    if req.method() == Method::CONNECT {
        if matches!(ctx.mode, Mode::Explicit) {
            return crate::explicit::connect(ctx, req).await;
        }
        entry.deny(DenyReason::Malformed);
        return refuse(gw, entry, StatusCode::METHOD_NOT_ALLOWED, "CONNECT is only served by the explicit proxy");
    }
    let (host, port) = match request_target(ctx.mode, &req) {
        Ok(t) => t,
        Err(problem) => {
            entry.deny(DenyReason::Malformed);
            return refuse(gw, entry, StatusCode::BAD_REQUEST, problem);
        }
    };
    let target = match Target::parse(&host) {
        Ok(t) => t,
        Err(reason) => {
            entry = entry.to(host, port);
            entry.deny(reason);
            return refuse(gw, entry, StatusCode::FORBIDDEN, reason.as_str());
        }
    };
    entry = entry.to(target.to_string(), port);
    let verdict = gw.decide(&ctx.agent, &target, port);
    if let Verdict::Denied(reason) = verdict {
        entry.deny(reason);
        return refuse(gw, entry, StatusCode::FORBIDDEN, reason.as_str());
    }
    if let Verdict::Reported(reason) = verdict {
        entry.reason = Some(format!("report_only:{reason}"));
    }
    // Keep the client side's upgrade handle before the request moves upstream.
    let wants_upgrade = req.headers().contains_key(header::UPGRADE);
    let client_upgrade = wants_upgrade.then(|| hyper::upgrade::on(&mut req));
    let mut pending = PendingEntry::new(&gw.log, entry);
    let upstream_req = match build_upstream_request(req, &target, port, wants_upgrade, &pending.counters) {
        Ok(r) => r,
        Err(problem) => {
            pending.entry.deny(DenyReason::Malformed);
            return refuse_pending(pending, StatusCode::BAD_REQUEST, problem);
        }
    };
    match gw.client.request(upstream_req).await {
        Ok(mut resp) => {
            pending.entry.status = Some(resp.status().as_u16());
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS
                && let Some(client_upgrade) = client_upgrade
            {
                let upstream_upgrade = hyper::upgrade::on(&mut resp);
                let idle = gw.timeouts.idle;
                let cancel = ctx.cancel.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = tunnel_upgrade(&mut pending, client_upgrade, upstream_upgrade, idle) => {}
                        () = cancel.cancelled() => {}
                    }
                });
                let (parts, _) = resp.into_parts();
                return Response::from_parts(parts, empty());
            }
            strip_hop_by_hop(resp.headers_mut(), false);
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, LoggedBody { inner: body, pending }.boxed())
        }
        Err(e) => {
            let dial = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<DialError>());
            match dial {
                Some(d) if d.is_blocked() => {
                    pending.entry.deny(DenyReason::BlockedAddress);
                    refuse_pending(pending, StatusCode::FORBIDDEN, "blocked_address")
                }
                _ => {
                    let why = dial.map_or_else(|| e.to_string(), ToString::to_string);
                    pending.entry.fail(format!("upstream: {why}"));
                    refuse_pending(pending, StatusCode::BAD_GATEWAY, &format!("upstream failed: {why}"))
                }
            }
        }
    }
}

/// The request as it goes upstream: absolute URI for the pool key, hop-by-hop headers removed, HTTP/1.1
/// (the pool picks h2 itself when the upstream negotiates it), body counted.
fn build_upstream_request(
    req: Request<Incoming>,
    target: &Target,
    port: u16,
    keep_upgrade: bool,
    counters: &Arc<Counters>,
) -> Result<Request<ProxyBody>, &'static str> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri = match target {
        Target::Name(n) => format!("http://{n}:{port}{path}"),
        Target::Addr(IpAddr::V4(a)) => format!("http://{a}:{port}{path}"),
        Target::Addr(IpAddr::V6(a)) => format!("http://[{a}]:{port}{path}"),
    };
    parts.uri = uri.parse().map_err(|_| "request target is not a valid URI")?;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers, keep_upgrade);
    if !parts.headers.contains_key(header::HOST) {
        let host = match target {
            Target::Name(n) if port == 80 => n.clone(),
            Target::Name(n) => format!("{n}:{port}"),
            Target::Addr(a) => a.to_string(),
        };
        parts.headers.insert(header::HOST, HeaderValue::from_str(&host).map_err(|_| "bad host")?);
    }
    let body = CountedBody { inner: body, counters: Arc::clone(counters) };
    Ok(Request::from_parts(parts, body.boxed()))
}

/// Remove hop-by-hop headers (RFC 9110 §7.6.1), and the headers `Connection` names; keep `Connection:
/// upgrade` and `Upgrade` for protocol switches.
fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| !(keep_upgrade && n == header::UPGRADE))
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in ["keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer"] {
        headers.remove(name);
    }
    headers.remove(header::TRANSFER_ENCODING);
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

/// Splice an upgraded (WebSocket, …) connection once both sides have switched.
async fn tunnel_upgrade(
    pending: &mut PendingEntry,
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    idle: std::time::Duration,
) {
    match tokio::try_join!(client, upstream) {
        Ok((c, u)) => {
            if let SpliceEnd::Error(e) = splice(TokioIo::new(c), TokioIo::new(u), idle, &pending.counters).await {
                pending.entry.fail(format!("upgrade: {e}"));
            }
        }
        Err(e) => pending.entry.fail(format!("upgrade failed: {e}")),
    }
}

/// A short plain-text answer from the gateway itself, logged now.
pub(crate) fn refuse(gw: &Shared, mut entry: LogEntry, status: StatusCode, why: &str) -> Response<ProxyBody> {
    entry.status = Some(status.as_u16());
    gw.log.record(entry);
    answer(status, why)
}

/// [`refuse`] for an entry that is already pending (it is recorded when `pending` drops, here).
fn refuse_pending(mut pending: PendingEntry, status: StatusCode, why: &str) -> Response<ProxyBody> {
    pending.entry.status = Some(status.as_u16());
    drop(pending);
    answer(status, why)
}

fn answer(status: StatusCode, why: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(full(format!("agenthold: {why}\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

pub(crate) fn full(text: impl Into<Bytes>) -> ProxyBody {
    http_body_util::Full::new(text.into()).map_err(|never| match never {}).boxed()
}

pub(crate) fn empty() -> ProxyBody {
    http_body_util::Empty::new().map_err(|never| match never {}).boxed()
}

/// A request body that counts the bytes it carries upstream.
struct CountedBody {
    inner: Incoming,
    counters: Arc<Counters>,
}

impl Body for CountedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let res = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &res
            && let Some(data) = frame.data_ref()
        {
            self.counters.up.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        res.map_err(Into::into)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that counts the bytes it carries to the sandbox; the request's log entry is recorded
/// when the body ends or is dropped (a client that hangs up early still gets a log line).
struct LoggedBody {
    inner: Incoming,
    pending: PendingEntry,
}

impl Body for LoggedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let res = Pin::new(&mut self.inner).poll_frame(cx);
        match &res {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.pending.counters.down.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let why = format!("upstream body: {e}");
                self.pending.entry.fail(why);
            }
            Poll::Ready(None) | Poll::Pending => {}
        }
        res.map_err(Into::into)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
