//! HTTP requests from sandboxes, whichever way they arrive: plain HTTP redirected to the transparent proxy,
//! absolute-form requests on the explicit proxy, and requests on intercepted TLS connections. Every request
//! is decided on its own host (E4: a second request on a keep-alive connection to another host is decided
//! again), passed through the secret injector (injection over TLS only, the leak guard everywhere; E11–E13),
//! forwarded through the pooled upstream client, and logged with its status and bytes (E16). Bodies stream
//! both ways; nothing is buffered.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use agenthold_core::AgentId;
use agenthold_core::policy::{DenyReason, Verdict};
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use crate::budget::{AgentBudget, ConnPermit};
use crate::context::{AgentContext, Context};
use crate::dial::DialError;
use crate::inject::{Injected, inject};
use crate::io::{Activity, SpliceEnd, Tracked, splice_rewriting};
use crate::log::{LogEntry, LogKind, PendingEntry, Reason};
use crate::reply::{answer, empty, full, refuse, refuse_pending};
use crate::scrub;
use crate::target::Target;
use crate::upstream::{LoggedBody, ProxyBody, counted, strip_hop_by_hop, upstream_request};

/// Largest request head accepted from a sandbox (hyper's read buffer cap for HTTP/1, header list cap for
/// HTTP/2).
const MAX_HEAD: usize = 64 * 1024;

/// Streams a sandbox may open at once on one HTTP/2 connection (each is an upstream request, which the
/// agent's request budget bounds as well).
const MAX_STREAMS: u32 = 100;

/// How requests reached the gateway on one client connection.
#[derive(Debug, Clone)]
pub(crate) enum Mode {
    /// Plain HTTP redirected by nftables: the host comes from `Host`, the port is the original one.
    Transparent {
        /// The original destination port.
        port: u16,
    },
    /// The explicit proxy: absolute-form URIs (CONNECT is answered by the explicit proxy before a request
    /// gets here).
    Explicit,
    /// A TLS connection to a rule host, terminated with the installation's CA.
    Intercepted {
        /// The connection's SNI (normalised): every request must be for this host.
        sni: String,
        /// The destination port.
        port: u16,
    },
}

/// The HTTP version spoken with the sandbox on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proto {
    Http1,
    Http2,
}

/// Per-connection context of an HTTP client connection.
pub(crate) struct ConnCtx {
    pub(crate) gw: Arc<Context>,
    pub(crate) agent: AgentId,
    /// The agent's share of the gateway's budgets (E20).
    pub(crate) budget: Arc<AgentBudget>,
    /// The connection's permit of that budget: a CONNECT tunnel or a WebSocket takes it over, since it
    /// outlives the HTTP exchange that opened it (one permit per client connection, whatever it becomes).
    pub(crate) permit: Mutex<Option<ConnPermit>>,
    pub(crate) mode: Mode,
    /// Fires when the agent is detached or the gateway shuts down; tasks spawned for this connection
    /// (tunnels, upgrades) end with it.
    pub(crate) cancel: CancellationToken,
}

impl ConnCtx {
    /// The context of a connection of `on` holding `permit`, whose requests arrive as `mode` says.
    pub(crate) fn new(on: AgentContext, permit: Option<ConnPermit>, mode: Mode) -> Self {
        let AgentContext {
            gw,
            agent,
            budget,
            cancel,
        } = on;
        Self {
            gw,
            agent,
            budget,
            permit: Mutex::new(permit),
            mode,
            cancel,
        }
    }

    /// The connection's permit for a tunnel or WebSocket it turns into: the one it holds, or a new one
    /// (an HTTP/2 connection, or a second upgrade) when the budget allows.
    pub(crate) fn take_permit(&self) -> Option<ConnPermit> {
        let held = self.permit.lock().unwrap_or_else(PoisonError::into_inner).take();
        held.or_else(|| self.gw.budget.connection(&self.budget))
    }
}

/// Serve HTTP on `io` (a sandbox connection) until it closes or idles out: every request is [`handle`]d.
pub(crate) async fn serve<IO>(ctx: Arc<ConnCtx>, io: IO, proto: Proto)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_with(ctx, io, proto, |ctx, req| async move { handle(&ctx, req).await }).await;
}

/// Serve HTTP on `io` until it closes or idles out, answering every request with `respond` (the explicit
/// proxy answers CONNECT itself and hands everything else to [`handle`]).
pub(crate) async fn serve_with<IO, R, F>(ctx: Arc<ConnCtx>, io: IO, proto: Proto, respond: R)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    R: Fn(Arc<ConnCtx>, Request<Incoming>) -> F + Send + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let timeouts = ctx.gw.timeouts;
    let activity = Activity::new();
    activity.touch();
    let io = TokioIo::new(Tracked::new(io, activity.clone()));
    let service = hyper::service::service_fn(move |req| {
        let answered = respond(Arc::clone(&ctx), req);
        async move { Ok::<_, Infallible>(answered.await) }
    });
    let served = async {
        match proto {
            Proto::Http1 => {
                hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(timeouts.sniff)
                    .max_buf_size(MAX_HEAD)
                    .auto_date_header(false)
                    .keep_alive(true)
                    .serve_connection(io, service)
                    .with_upgrades()
                    .await
            }
            Proto::Http2 => {
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .max_concurrent_streams(MAX_STREAMS)
                    .max_header_list_size(u32::try_from(MAX_HEAD).unwrap_or(u32::MAX))
                    .auto_date_header(false)
                    .serve_connection(io, service)
                    .await
            }
        }
    };
    tokio::select! {
        res = served => if let Err(e) = res { tracing::debug!(error = %e, "http connection ended") },
        () = activity.idle_for(timeouts.idle) => tracing::debug!("http connection idle, closed"),
    }
}

/// Where a request goes (host as written, port), from its URI or `Host`.
fn request_target(mode: &Mode, req: &Request<Incoming>) -> Result<(String, u16), &'static str> {
    let port = match mode {
        Mode::Explicit => {
            if req.uri().scheme_str() != Some("http") {
                return Err("the explicit proxy takes absolute-form http:// requests and CONNECT");
            }
            let host = req.uri().host().ok_or("request URI has no host")?;
            return Ok((host.to_owned(), req.uri().port_u16().unwrap_or(80)));
        }
        Mode::Transparent { port } | Mode::Intercepted { port, .. } => *port,
    };
    let host = match req.uri().authority() {
        Some(a) => a.host().to_owned(),
        None => {
            let value = req
                .headers()
                .get(header::HOST)
                .ok_or("request has no Host header")?;
            let text = value.to_str().map_err(|_| "Host header is not ASCII")?;
            crate::sniff::split_host_port(text, port)?.0
        }
    };
    Ok((host, port))
}

/// Handle one request from a sandbox (CONNECT is refused: only the explicit proxy serves it, before a
/// request reaches this).
pub(crate) async fn handle(ctx: &ConnCtx, mut req: Request<Incoming>) -> Response<ProxyBody> {
    let gw = &ctx.gw;
    let mut entry = LogEntry::new(&ctx.agent, LogKind::Http, Verdict::Allowed);
    entry.method = Some(req.method().as_str().to_owned());
    entry.path = Some(req.uri().path().to_owned());
    if req.method() == Method::CONNECT {
        entry.deny(DenyReason::Malformed);
        return refuse(
            gw,
            entry,
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT is only served by the explicit proxy",
        );
    }
    let (host, port) = match request_target(&ctx.mode, &req) {
        Ok(t) => t,
        Err(problem) => {
            entry.deny(DenyReason::Malformed);
            return refuse(gw, entry, StatusCode::BAD_REQUEST, problem);
        }
    };
    let (target, mut entry) = match parse_target(gw, entry, host, port) {
        Ok(t) => t,
        Err(refused) => return refused,
    };
    let tls_host = match &ctx.mode {
        Mode::Intercepted { sni, .. } => Some(sni.as_str()),
        Mode::Transparent { .. } | Mode::Explicit => None,
    };
    if let Some(sni) = tls_host
        && target != Target::Name(sni.to_owned())
    {
        // The gateway holds this line itself, whatever injector is plugged in: a connection opened for a
        // rule host carries requests for that host only.
        entry.deny(DenyReason::HostMismatch);
        return refuse(
            gw,
            entry,
            StatusCode::MISDIRECTED_REQUEST,
            "request host differs from the TLS server name",
        );
    }
    let mut entry = match check_policy(gw, &ctx.agent, &target, port, entry) {
        Ok(entry) => entry,
        Err(refused) => return refused,
    };
    match inject(gw, &ctx.agent, tls_host, &target, &mut req, &mut entry) {
        Err((status, why)) => refuse(gw, entry, status, &why),
        Ok(Injected::Refresh(secret)) => {
            crate::refresh::answer(gw, &ctx.agent, req, &target, port, &secret, entry).await
        }
        Ok(Injected::Forward) => forward(ctx, req, &target, port, entry).await,
    }
}

/// The target of `host` as written by the sandbox, with `entry` pointed at it; an invalid host is
/// refused (403) and logged.
#[allow(clippy::result_large_err)] // the error is the answer itself, built once on a cold path
pub(crate) fn parse_target(
    gw: &Context,
    entry: LogEntry,
    host: String,
    port: u16,
) -> Result<(Target, LogEntry), Response<ProxyBody>> {
    match Target::parse(&host) {
        Ok(target) => {
            let entry = entry.to(target.to_string(), port);
            Ok((target, entry))
        }
        Err(reason) => {
            let mut entry = entry.to(host, port);
            entry.deny(reason);
            Err(refuse(gw, entry, StatusCode::FORBIDDEN, reason.as_str()))
        }
    }
}

/// Ask the policy about `target:port`; a denial is answered (403) and logged, a report-only denial noted.
#[allow(clippy::result_large_err)] // the error is the answer itself, built once on a cold path
pub(crate) fn check_policy(
    gw: &Context,
    agent: &AgentId,
    target: &Target,
    port: u16,
    mut entry: LogEntry,
) -> Result<LogEntry, Response<ProxyBody>> {
    match gw.decide(agent, target, port) {
        Verdict::Denied(reason) => {
            entry.deny(reason);
            Err(refuse(gw, entry, StatusCode::FORBIDDEN, reason.as_str()))
        }
        Verdict::Reported(reason) => {
            entry.set_reason(Reason::ReportOnly(reason));
            Ok(entry)
        }
        Verdict::Allowed => Ok(entry),
    }
}

/// Send the request upstream and stream the answer back (scrubbed, from intercepted hosts: E19).
async fn forward(
    ctx: &ConnCtx,
    mut req: Request<Incoming>,
    target: &Target,
    port: u16,
    entry: LogEntry,
) -> Response<ProxyBody> {
    let gw = &ctx.gw;
    let intercepted = matches!(ctx.mode, Mode::Intercepted { .. });
    let scheme = if intercepted { "https" } else { "http" };
    let redactor = intercepted
        .then(|| gw.injector.as_ref().and_then(|i| i.redactor(&ctx.agent)))
        .flatten();
    if redactor.is_some() {
        scrub::prepare_request(req.headers_mut());
    }
    // Keep the client side's upgrade handle before the request moves upstream. Only WebSocket upgrades
    // are carried (E23); any other `Upgrade` is dropped below with the hop-by-hop headers.
    let websocket = scrub::is_websocket(req.headers());
    // Budgets (E20): every request in flight upstream, and a WebSocket as the connection it becomes.
    let Some(request_permit) = gw.budget.request(&ctx.budget) else {
        let mut entry = entry;
        entry.deny(DenyReason::OverBudget);
        return refuse(gw, entry, StatusCode::SERVICE_UNAVAILABLE, "over_budget");
    };
    let ws_permit = match websocket.then(|| ctx.take_permit()) {
        Some(None) => {
            let mut entry = entry;
            entry.deny(DenyReason::OverBudget);
            return refuse(gw, entry, StatusCode::SERVICE_UNAVAILABLE, "over_budget");
        }
        Some(Some(permit)) => Some(permit),
        None => None,
    };
    let client_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
    let mut pending = PendingEntry::new(&gw.log, entry);
    let (parts, body) = req.into_parts();
    let head_only = parts.method == Method::HEAD;
    let body = counted(body, &pending.counters);
    let upstream_req = match upstream_request(parts, body, scheme, target, port, websocket) {
        Ok(r) => r,
        Err(problem) => {
            pending.entry.deny(DenyReason::Malformed);
            return refuse_pending(pending, StatusCode::BAD_REQUEST, problem);
        }
    };
    let client = if websocket { &gw.client_h1 } else { &gw.client };
    let mut resp = match client.request(upstream_req).await {
        Ok(resp) => resp,
        Err(e) => return upstream_failed(pending, &e),
    };
    pending.entry.status = Some(resp.status().as_u16());
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade.filter(|_| scrub::is_websocket(resp.headers())) else {
            pending
                .entry
                .fail("upstream switched to a protocol other than the WebSocket asked for");
            return refuse_pending(pending, StatusCode::BAD_GATEWAY, "unexpected protocol switch");
        };
        if let Some(r) = &redactor {
            scrub::scrub_headers(r, resp.headers_mut());
        }
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        let idle = gw.timeouts.idle;
        let cancel = ctx.cancel.clone();
        let registration = gw.open.register_logged(&mut pending, &ctx.agent, target, port);
        tokio::spawn(async move {
            let _permit = ws_permit;
            let revoked = tokio::select! {
                () = tunnel_upgrade(&mut pending, client_upgrade, upstream_upgrade, idle, redactor) => false,
                () = registration.revoke.cancelled() => true,
                () = cancel.cancelled() => false,
            };
            if revoked {
                pending.revoked();
            }
        });
        let (parts, _) = resp.into_parts();
        return Response::from_parts(parts, empty());
    }
    strip_hop_by_hop(resp.headers_mut(), false);
    let bodiless = head_only || matches!(resp.status().as_u16(), 204 | 304);
    // Short answers of known length end on their own; only the others (event streams, downloads) are
    // worth registering for revocation.
    let short = scrub::whole_length(resp.headers());
    let body = |inner, pending| {
        let registration = (!short).then(|| gw.open.register(&ctx.agent, target, port));
        LoggedBody::new(inner, pending, request_permit, registration).boxed()
    };
    let Some(redactor) = redactor else {
        let (parts, inner) = resp.into_parts();
        return Response::from_parts(parts, body(inner, pending));
    };
    if bodiless {
        scrub::scrub_headers(&redactor, resp.headers_mut());
        let (parts, inner) = resp.into_parts();
        return Response::from_parts(parts, body(inner, pending));
    }
    if let Err(scrub::Unscannable(why)) = scrub::response_headers(&redactor, resp.headers_mut()) {
        pending.entry.fail(why);
        return refuse_pending(pending, StatusCode::BAD_GATEWAY, why);
    }
    let (mut parts, inner) = resp.into_parts();
    let streamed = body(inner, pending);
    if short {
        // A short answer of known length is read whole, scrubbed, and keeps an exact length. (A stalled
        // upstream is bounded by the client connection's idle timeout, which drops this future.)
        return match scrub::whole(streamed, &redactor).await {
            Ok(bytes) => {
                parts
                    .headers
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
                Response::from_parts(parts, full(bytes))
            }
            Err(why) => answer(StatusCode::BAD_GATEWAY, &why),
        };
    }
    Response::from_parts(parts, scrub::RedactedBody::new(streamed, &redactor).boxed())
}

/// Answer and log a request the pooled client could not deliver: a guard refusal is a denial (403), any
/// other failure a 502.
fn upstream_failed(mut pending: PendingEntry, e: &hyper_util::client::legacy::Error) -> Response<ProxyBody> {
    let dial = std::error::Error::source(e).and_then(|s| s.downcast_ref::<DialError>());
    match dial {
        Some(d) if d.is_blocked() => {
            pending.entry.deny(DenyReason::BlockedAddress);
            refuse_pending(pending, StatusCode::FORBIDDEN, "blocked_address")
        }
        _ => {
            let why = dial.map_or_else(|| e.to_string(), ToString::to_string);
            pending.entry.fail(format!("upstream: {why}"));
            refuse_pending(
                pending,
                StatusCode::BAD_GATEWAY,
                &format!("upstream failed: {why}"),
            )
        }
    }
}

/// Splice an upgraded WebSocket connection once both sides have switched; what the upstream sends is
/// scrubbed frame by frame when there is a redactor.
async fn tunnel_upgrade(
    pending: &mut PendingEntry,
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    idle: std::time::Duration,
    redactor: Option<Arc<agenthold_core::secret::Redactor>>,
) {
    match tokio::try_join!(client, upstream) {
        Ok((c, u)) => {
            let mut scrubber = redactor.map(scrub::WsScrubber::new);
            let rewrite = scrubber.as_mut().map(|s| s as &mut dyn crate::io::Rewrite);
            if let SpliceEnd::Error(e) =
                splice_rewriting(TokioIo::new(c), TokioIo::new(u), idle, &pending.counters, rewrite).await
            {
                pending.entry.fail(format!("upgrade: {e}"));
            }
        }
        Err(e) => pending.entry.fail(format!("upgrade failed: {e}")),
    }
}
