//! The page a failed sign-in shows: the reason (escaped) and a link back to `/login`; no script, no style,
//! a CSP that loads nothing.
// enforces: S6

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::Failure;

/// The CSP of the failure page: no script, no style, nothing loaded.
const FAILURE_CSP: &str = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The HTML page of a failed login.
pub(super) fn failure_page(f: &Failure) -> Response {
    let body = format!(
        "<!doctype html><meta charset=utf-8><title>agenthold: sign-in failed</title>\
         <h1>Sign-in failed</h1><p id=reason>{}</p><p><a href=\"/login\">Back to sign in</a></p>",
        escape(&f.reason)
    );
    let mut r = (
        f.status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(FAILURE_CSP),
    );
    r
}

/// `text` safe inside HTML text.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
