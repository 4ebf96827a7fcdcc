//! The explicit proxy (E7): what `HTTPS_PROXY`/`HTTP_PROXY` in every sandbox point at. CONNECT tunnels
//! and absolute-form HTTP requests get the same decisions as the transparent path; denials answer 403 with
//! the reason in the body, upstream failures 502.

use std::sync::Arc;

use agenthold_core::AgentId;
use agenthold_core::policy::{DenyReason, Verdict};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::gateway::{Shared, Target};
use crate::http::{ConnCtx, Mode, Proto, check_policy, empty, parse_target, refuse};
use crate::io::{SpliceEnd, Tracked, splice, splice_tcp};
use crate::log::{Counters, LogEntry, LogKind, PendingEntry};
use crate::sniff::split_host_port;
use crate::transparent::accept_loop;
use crate::upstream::ProxyBody;

/// Serve one agent's explicit-proxy listener.
pub(crate) async fn serve(gw: Arc<Shared>, agent: AgentId, listener: TcpListener, cancel: CancellationToken) {
    let token = cancel.clone();
    accept_loop(listener, cancel, move |stream| {
        let ctx = Arc::new(ConnCtx {
            gw: Arc::clone(&gw),
            agent: agent.clone(),
            mode: Mode::Explicit,
            cancel: token.clone(),
        });
        let span = tracing::debug_span!("explicit", agent = %agent);
        crate::http::serve(ctx, stream, Proto::Http1).instrument(span)
    })
    .await;
}

/// Answer a CONNECT: decide the authority, dial it, answer 200 and splice the upgraded connection.
pub(crate) async fn connect(ctx: &ConnCtx, mut req: Request<Incoming>) -> Response<ProxyBody> {
    let gw = &ctx.gw;
    let mut entry = LogEntry::new(&ctx.agent, LogKind::Connect, Verdict::Allowed);
    entry.method = Some("CONNECT".into());
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default();
    let (host, port) = match split_host_port(&authority, 443) {
        Ok(hp) => hp,
        Err(problem) => {
            entry.deny(DenyReason::Malformed);
            return refuse(gw, entry, StatusCode::BAD_REQUEST, problem);
        }
    };
    let (target, entry) = match parse_target(gw, entry, host, port) {
        Ok(t) => t,
        Err(refused) => return refused,
    };
    let mut entry = match check_policy(gw, &ctx.agent, &target, port, entry) {
        Ok(entry) => entry,
        Err(refused) => return refused,
    };
    if let Target::Name(name) = &target
        && crate::intercept::wanted(gw, &ctx.agent, name)
    {
        // The tunnel carries TLS to a rule host: terminate it here instead of dialling now (each request
        // is forwarded by the pooled client).
        entry.status = Some(200);
        gw.log.record(entry);
        let on_upgrade = hyper::upgrade::on(&mut req);
        let (gw, agent, name, cancel) = (
            Arc::clone(gw),
            ctx.agent.clone(),
            name.clone(),
            ctx.cancel.clone(),
        );
        tokio::spawn(async move {
            if let Ok(upgraded) = on_upgrade.await {
                crate::intercept::serve(gw, agent, TokioIo::new(upgraded), name, port, cancel).await;
            }
        });
        return Response::new(empty());
    }
    let dialed = match &target {
        Target::Name(n) => gw.dialer.dial_name(n, port, None).await.map(|(s, _)| s),
        Target::Addr(a) => gw.dialer.dial_addr((*a, port).into()).await,
    };
    let upstream = match dialed {
        Ok(s) => s,
        Err(e) if e.is_blocked() => {
            entry.deny(DenyReason::BlockedAddress);
            return refuse(gw, entry, StatusCode::FORBIDDEN, "blocked_address");
        }
        Err(e) => {
            let why = format!("upstream: {e}");
            entry.fail(why.clone());
            return refuse(gw, entry, StatusCode::BAD_GATEWAY, &why);
        }
    };
    entry.status = Some(200);
    let mut pending = PendingEntry::new(&gw.log, entry);
    let on_upgrade = hyper::upgrade::on(&mut req);
    let idle = gw.timeouts.idle;
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        let tunnel = async {
            match on_upgrade.await {
                Ok(upgraded) => {
                    let end = tunnel(upgraded, upstream, idle, &pending.counters).await;
                    if let SpliceEnd::Error(e) = end {
                        tracing::debug!(error = %e, "tunnel ended with an error");
                    }
                }
                Err(e) => pending.entry.fail(format!("upgrade failed: {e}")),
            }
        };
        tokio::select! {
            () = tunnel => {}
            () = cancel.cancelled() => {}
        }
    });
    Response::new(empty())
}

/// Carry a CONNECT tunnel: zero-copy between the two sockets when the upgraded connection is the plain TCP
/// socket the explicit proxy serves (after forwarding what hyper had already read of it), a userspace copy
/// otherwise.
async fn tunnel(
    upgraded: hyper::upgrade::Upgraded,
    mut upstream: TcpStream,
    idle: std::time::Duration,
    counters: &Counters,
) -> SpliceEnd {
    match upgraded.downcast::<TokioIo<Tracked<TcpStream>>>() {
        Ok(parts) => {
            if !parts.read_buf.is_empty() {
                if let Err(e) = upstream.write_all(&parts.read_buf).await {
                    return SpliceEnd::Error(e);
                }
                counters
                    .up
                    .fetch_add(parts.read_buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            let client = parts.io.into_inner().into_inner();
            splice_tcp(&client, &upstream, idle, counters).await
        }
        Err(upgraded) => splice(TokioIo::new(upgraded), upstream, idle, counters).await,
    }
}
