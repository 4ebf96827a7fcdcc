//! The secret injector's step of a request (E11–E13): the request head goes through the injector, which
//! injects secrets (over intercepted TLS only), refuses a leaked or misplaced placeholder, or asks for a
//! token refresh; the verdict is noted in the request's log entry.
// enforces: E13 E15

use agenthold_core::AgentId;
use agenthold_core::policy::DenyReason;
use agenthold_core::secret::{InjectOutcome, RequestHead};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Request, StatusCode};
use hyper::body::Incoming;

use crate::context::Context;
use crate::log::{LogEntry, Reason};
use crate::target::Target;

/// What to do with a request once the injector has seen it.
pub(crate) enum Injected {
    /// Forward it (rewritten or not).
    Forward,
    /// Answer it as a token refresh of this secret.
    Refresh(String),
}

/// Pass the head of `agent`'s request through the secret injector (`tls_host`: the connection's TLS server
/// name when it is intercepted). `Err` is the answer to give instead of forwarding (the entry is already
/// marked).
pub(crate) fn inject(
    gw: &Context,
    agent: &AgentId,
    tls_host: Option<&str>,
    target: &Target,
    req: &mut Request<Incoming>,
    entry: &mut LogEntry,
) -> Result<Injected, (StatusCode, String)> {
    let Some(injector) = gw.injector.as_ref().filter(|i| i.has_secrets(agent)) else {
        return Ok(Injected::Forward);
    };
    let mut head = RequestHead {
        method: req.method().as_str().to_owned(),
        host: target.to_string(),
        path_and_query: req
            .uri()
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
        headers: req
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect(),
    };
    match injector.rewrite(agent, tls_host, &mut head) {
        InjectOutcome::Refuse {
            status,
            reason,
            secret,
        } => {
            entry.deny(reason);
            entry.secret = secret;
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
            Err((status, reason.as_str().to_owned()))
        }
        InjectOutcome::Refresh { secret } if tls_host.is_some() => Ok(Injected::Refresh(secret)),
        InjectOutcome::Refresh { .. } => {
            entry.deny(DenyReason::PlaceholderLeak);
            Err((
                StatusCode::FORBIDDEN,
                "token refreshes are answered over TLS only".to_owned(),
            ))
        }
        InjectOutcome::Forward { injected, leaked } => {
            if !leaked.is_empty() {
                entry.set_reason(Reason::LeakLogged {
                    secrets: leaked.join(","),
                });
            }
            if injected.is_empty() {
                return Ok(Injected::Forward);
            }
            apply_head(req, head).map_err(|why| {
                entry.fail(format!("injection: {why}"));
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("injection failed: {why}"),
                )
            })?;
            entry.secret_injected = true;
            entry.secret = Some(injected.join(","));
            Ok(Injected::Forward)
        }
    }
}

/// Put a rewritten head back into the request.
fn apply_head(req: &mut Request<Incoming>, head: RequestHead) -> Result<(), &'static str> {
    let mut headers = HeaderMap::with_capacity(head.headers.len());
    for (name, value) in head.headers {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| "invalid header name")?;
        let value = HeaderValue::from_bytes(&value).map_err(|_| "invalid header value")?;
        headers.append(name, value);
    }
    *req.headers_mut() = headers;
    let unchanged = req
        .uri()
        .path_and_query()
        .is_some_and(|p| p.as_str() == head.path_and_query);
    if unchanged {
        // A header rule only (the common case): the URI stays as it is, not parsed again.
        return Ok(());
    }
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(head.path_and_query.parse().map_err(|_| "invalid path")?);
    *req.uri_mut() = http::Uri::from_parts(parts).map_err(|_| "invalid URI")?;
    Ok(())
}
