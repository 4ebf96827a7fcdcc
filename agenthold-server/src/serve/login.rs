//! The local admin link's landing page (SERVER.md §2): `/login/local#<token>` loads a page whose script
//! (served from `/login/local.js`: the CSP allows no inline script) posts the fragment to `/auth/local`,
//! which redeems it once, sets the session cookie and answers `{next}` (the sanitised `?next=` of the page),
//! where the script goes. The fragment never reaches a server log. Also `/auth/logout`. The login providers
//! (OIDC, GitHub) are in `providers`; the web UI is `ui.rs`.
// enforces: S6

use axum::Router;
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::api::{ApiError, ApiResult, Body};
use super::state::AppState;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/login/local", get(page))
        .route("/login/local.js", get(script))
        .route("/auth/local", post(redeem))
        .route("/auth/logout", post(logout))
}

const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

fn html(body: &'static str) -> Response {
    let mut r = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response();
    r.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(PAGE_CSP),
    );
    r
}

async fn page() -> Response {
    html(concat!(
        "<!doctype html><meta charset=utf-8><title>agenthold: sign in</title>",
        "<p id=msg>Signing in…</p><script src=\"/login/local.js\"></script>"
    ))
}

async fn script() -> Response {
    const JS: &str = r#"(function () {
  var token = location.hash.slice(1);
  var next = new URLSearchParams(location.search).get("next") || "/";
  history.replaceState(null, "", location.pathname);
  var msg = document.getElementById("msg");
  fetch("/auth/local", {method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json"}, body: JSON.stringify({token: token, next: next})})
    .then(function (r) {
      if (r.ok) { return r.json().then(function (b) { location.replace(b.next); }); } else { msg.textContent = "This link is invalid, expired or already used. Run `agenthold admin login-link` for a new one."; }
    });
})();
"#;
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], JS).into_response()
}

/// `POST /auth/local`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Redeem {
    token: String,
    /// Where to go afterwards (sanitised: only a local path, else `/`).
    next: Option<String>,
}

async fn redeem(
    State(state): State<AppState>,
    parts: Parts,
    Body(body): Body<Redeem>,
) -> ApiResult<Response> {
    let Some(user) = state.dir.redeem_login_link(&body.token).await? else {
        if let Some(ip) = client_ip(&parts) {
            state.limits.check_address(ip).map_err(ApiError::rate_limited)?;
        }
        return Err(ApiError::unauthorized());
    };
    // A new session at login; the one the browser had (if any) ends.
    if let Some(old) = super::api::session_cookie_value(&parts, state.session_cookie()) {
        state.dir.delete_session(old).await?;
    }
    let cookie = state.dir.create_session(&user).await?;
    let next = super::providers::sanitize_next(body.next.as_deref());
    let mut response = axum::Json(serde_json::json!({ "next": next })).into_response();
    let value = session_cookie(&state, &cookie, state.config.auth.session_absolute_secs);
    if let Ok(v) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(response)
}

async fn logout(State(state): State<AppState>, parts: Parts) -> ApiResult<Response> {
    if let Some(value) = super::api::session_cookie_value(&parts, state.session_cookie()) {
        state.dir.delete_session(value).await?;
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&session_cookie(&state, "", 0)) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(response)
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Lax, Path=/, and Secure (with the `__Host-` name) on HTTPS.
pub(crate) fn session_cookie(state: &AppState, value: &str, max_age: u64) -> String {
    let secure = if state.https() { "; Secure" } else { "" };
    format!(
        "{}={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age}{secure}",
        state.session_cookie()
    )
}

fn client_ip(parts: &Parts) -> Option<std::net::IpAddr> {
    parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
}
