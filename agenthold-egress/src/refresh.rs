//! Token refreshes answered by the gateway (E15): the sandbox's harness posts its refresh request (carrying
//! a placeholder) to the provider's token URL; the gateway sends the refresh upstream with the real refresh
//! token, lets the injector keep the new tokens, and answers the sandbox with placeholders only. The one
//! place where the gateway reads bodies: both are small and bounded, and only on this path.

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
    let response = match gw.client.request(request).await {
        Ok(r) => r,
        Err(e) => {
            pending.entry.fail(format!("upstream: {e}"));
            return refuse_pending(pending, StatusCode::BAD_GATEWAY, "token refresh upstream failed");
        }
    };
    let (mut parts, body) = response.into_parts();
    pending.entry.status = Some(parts.status.as_u16());
    let body = match Limited::new(body, MAX_RESPONSE).collect().await {
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
