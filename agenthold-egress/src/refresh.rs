//! Token refreshes answered by the gateway (E15): the sandbox's harness posts its refresh request (carrying
//! a placeholder) to the provider's token URL; the gateway sends the refresh upstream with the real refresh
//! token, lets the injector keep the new tokens, and answers the sandbox with placeholders only. The one
//! place where the gateway reads bodies: both are small and bounded, and only on this path.
//!
//! Refreshes of one refresh group (the injector's [`SecretInjector::refresh_group`]: one account's tokens,
//! in one or several agents) run one at a time, from reading the request to keeping the new tokens:
//! providers rotate refresh tokens and revoke the whole family when a spent one comes back, so a second
//! refresh must wait for the first and then go up with the rotated token.
//!
//! [`SecretInjector::refresh_group`]: agenthold_core::secret::SecretInjector::refresh_group
// enforces: E15

use std::time::Duration;

use agenthold_core::AgentId;
use agenthold_core::policy::DenyReason;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;

use crate::context::Context;
use crate::log::{LogEntry, PendingEntry};
use crate::reply::{full, refuse, refuse_pending};
use crate::target::Target;
use crate::upstream::{ProxyBody, upstream_request};

/// Largest refresh request body read from a sandbox.
const MAX_REQUEST: usize = 64 * 1024;
/// Largest token response read from an upstream.
const MAX_RESPONSE: usize = 1024 * 1024;
/// The longest the provider's token endpoint may take to answer, head and body each.
const UPSTREAM_WAIT: Duration = Duration::from_secs(30);
/// The longest a refresh waits for the one of its group before it (whose upstream calls are bounded).
const GROUP_WAIT: Duration = Duration::from_secs(120);

/// Answer `agent`'s token refresh for the refresh-token secret `secret`.
pub(crate) async fn answer(
    gw: &Context,
    agent: &AgentId,
    req: Request<Incoming>,
    target: &Target,
    port: u16,
    secret: &str,
    mut entry: LogEntry,
) -> Response<ProxyBody> {
    let Some(injector) = gw.injector.as_ref() else {
        return refuse(gw, entry, StatusCode::INTERNAL_SERVER_ERROR, "no injector");
    };
    entry.secret = Some(secret.to_owned());
    let lock = gw.refresh_locks.get(injector.refresh_group(agent, secret));
    let Ok(_one_at_a_time) = tokio::time::timeout(GROUP_WAIT, lock.lock_owned()).await else {
        return refuse(
            gw,
            entry,
            StatusCode::SERVICE_UNAVAILABLE,
            "another refresh of this login is still running",
        );
    };
    let (mut parts, body) = req.into_parts();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = match tokio::time::timeout(gw.timeouts.sniff, Limited::new(body, MAX_REQUEST).collect()).await
    {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => {
            return refuse(
                gw,
                entry,
                StatusCode::PAYLOAD_TOO_LARGE,
                "refresh request too large",
            );
        }
        Err(_) => {
            return refuse(
                gw,
                entry,
                StatusCode::REQUEST_TIMEOUT,
                "refresh request body timed out",
            );
        }
    };
    let Some(upstream_body) = injector.refresh_request(agent, secret, &content_type, &body) else {
        entry.deny(DenyReason::PlaceholderLeak);
        return refuse(
            gw,
            entry,
            StatusCode::FORBIDDEN,
            "refresh request does not carry the refresh placeholder",
        );
    };
    let length = upstream_body.len();
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    // The answer is rewritten, so it must arrive readable.
    parts
        .headers
        .insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    let body = Full::new(Bytes::copy_from_slice(&upstream_body))
        .map_err(|never| match never {})
        .boxed();
    drop(upstream_body);
    let mut pending = PendingEntry::new(&gw.log, entry);
    pending
        .counters
        .up
        .fetch_add(length as u64, std::sync::atomic::Ordering::Relaxed);
    let request = match upstream_request(parts, body, "https", target, port, false) {
        Ok(r) => r,
        Err(problem) => return refuse_pending(pending, StatusCode::BAD_REQUEST, problem),
    };
    let response = match tokio::time::timeout(UPSTREAM_WAIT, gw.client.request(request)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            pending.entry.fail(format!("upstream: {e}"));
            return refuse_pending(pending, StatusCode::BAD_GATEWAY, "token refresh upstream failed");
        }
        Err(_) => {
            pending.entry.fail("upstream: no answer in time");
            return refuse_pending(
                pending,
                StatusCode::GATEWAY_TIMEOUT,
                "token refresh upstream timed out",
            );
        }
    };
    let (mut parts, body) = response.into_parts();
    pending.entry.status = Some(parts.status.as_u16());
    let collected = tokio::time::timeout(UPSTREAM_WAIT, Limited::new(body, MAX_RESPONSE).collect()).await;
    let body = match collected.unwrap_or_else(|_| Err("no whole answer in time".into())) {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            pending.entry.fail(format!("token response: {e}"));
            return refuse_pending(pending, StatusCode::BAD_GATEWAY, "token response unreadable");
        }
    };
    let out = if parts.status.is_success() {
        match injector.refresh_response(agent, secret, &body) {
            Some(sanitized) => {
                pending.entry.secret_injected = true;
                Bytes::from(sanitized)
            }
            None => {
                pending.entry.fail("token response could not be made safe");
                return refuse_pending(pending, StatusCode::BAD_GATEWAY, "token response not understood");
            }
        }
    } else {
        // Errors (invalid_grant, …) go back so the harness can react, with any real token they quote
        // replaced by its placeholder.
        Bytes::from(injector.refresh_error(agent, secret, &body))
    };
    pending
        .counters
        .down
        .fetch_add(out.len() as u64, std::sync::atomic::Ordering::Relaxed);
    if let Some(redactor) = injector.redactor(agent) {
        crate::scrub::scrub_headers(&redactor, &mut parts.headers);
    }
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(out.len()));
    Response::from_parts(parts, full(out))
}
