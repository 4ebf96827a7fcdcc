//! The explicit proxy (E7): what `HTTPS_PROXY`/`HTTP_PROXY` in every sandbox point at. CONNECT tunnels
//! and absolute-form HTTP requests get the same decisions as the transparent path, and so do the bytes
//! inside a tunnel (E23); denials answer 403 with the reason in the body, upstream failures 502, a spent
//! connection budget 503.
// enforces: E7

use std::sync::Arc;

use agenthold_core::policy::{DenyReason, Verdict};
use bytes::BytesMut;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tracing::Instrument;

use crate::accept::accept;
use crate::context::AgentContext;
use crate::flow::{Aim, Dialled, Flow};
use crate::http::{ConnCtx, Mode, Proto, check_policy, parse_target};
use crate::io::Tracked;
use crate::log::{LogEntry, LogKind};
use crate::reply::{empty, refuse};
use crate::sniff::split_host_port;
use crate::target::Target;
use crate::upstream::ProxyBody;

/// Serve one agent's explicit-proxy listener: CONNECT is answered here, every other request is an
/// absolute-form HTTP request for [`crate::http`].
pub(crate) async fn serve(on: AgentContext, listener: TcpListener) {
    accept(on, listener, |on, stream, permit| {
        let span = tracing::debug_span!("explicit", agent = %on.agent);
        let ctx = Arc::new(ConnCtx::new(on.clone(), Some(permit), Mode::Explicit));
        crate::http::serve_with(ctx, stream, Proto::Http1, |ctx, req| async move {
            if req.method() == Method::CONNECT {
                connect(&ctx, req).await
            } else {
                crate::http::handle(&ctx, req).await
            }
        })
        .instrument(span)
    })
    .await;
}

/// Answer a CONNECT: decide the authority, dial it (a rule host is not dialled: its TLS is terminated
/// here), answer 200, and hand the tunnel to [`crate::flow`], which decides its bytes as it decides a
/// transparent connection's (TLS by SNI, which must name the CONNECT host; HTTP by each request's Host).
async fn connect(ctx: &ConnCtx, mut req: Request<Incoming>) -> Response<ProxyBody> {
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
    // A tunnel outlives the exchange that opened it: it takes over the connection's permit (E20).
    let Some(permit) = ctx.take_permit() else {
        entry.deny(DenyReason::OverBudget);
        return refuse(gw, entry, StatusCode::SERVICE_UNAVAILABLE, "over_budget");
    };
    let rule_host = matches!(&target, Target::Name(n) if gw.intercepts(&ctx.agent, n));
    let dialled = if rule_host {
        None
    } else {
        let dialled = match &target {
            Target::Name(n) => gw.dialer.dial_name(n, port, None).await.map(|(s, _)| s),
            Target::Addr(a) => gw.dialer.dial_addr((*a, port).into()).await,
        };
        match dialled {
            Ok(s) => Some((target.clone(), s)),
            Err(e) if e.is_blocked() => {
                entry.deny(DenyReason::BlockedAddress);
                return refuse(gw, entry, StatusCode::FORBIDDEN, "blocked_address");
            }
            Err(e) => {
                let why = format!("upstream: {e}");
                entry.fail(why.clone());
                return refuse(gw, entry, StatusCode::BAD_GATEWAY, &why);
            }
        }
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let flow = Flow {
        on: AgentContext {
            gw: Arc::clone(gw),
            agent: ctx.agent.clone(),
            budget: Arc::clone(&ctx.budget),
            cancel: ctx.cancel.clone(),
        },
        aim: Aim::Tunnel(target),
        port,
        permit: Some(permit),
        note_ech: false,
    };
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        let tunnel = async {
            match on_upgrade.await {
                Ok(upgraded) => tunnel(flow, upgraded, dialled).await,
                Err(e) => {
                    entry.fail(format!("upgrade failed: {e}"));
                    flow.on.gw.log.record(entry);
                }
            }
        };
        tokio::select! {
            () = tunnel => {}
            () = cancel.cancelled() => {}
        }
    });
    Response::new(empty())
}

/// Serve a CONNECT tunnel: on the plain TCP socket the explicit proxy serves (after what hyper had already
/// read of it), so that splices stay zero-copy; on the upgraded stream otherwise.
async fn tunnel(flow: Flow, upgraded: hyper::upgrade::Upgraded, dialled: Dialled) {
    match upgraded.downcast::<TokioIo<Tracked<TcpStream>>>() {
        Ok(parts) => {
            let client = parts.io.into_inner().into_inner();
            crate::flow::serve(flow, client, BytesMut::from(&parts.read_buf[..]), dialled).await;
        }
        Err(upgraded) => {
            crate::flow::serve(flow, TokioIo::new(upgraded), BytesMut::new(), dialled).await;
        }
    }
}
