//! The browser login providers (SERVER.md §2, S6): OpenID Connect ([`oidc`]) and GitHub ([`github`]).
//!
//! - `GET /auth/providers`: which sign-in buttons to show.
//! - `GET /auth/{oidc|github}/start?next=/path`: stores a login attempt (PKCE verifier, nonce, the
//!   sanitised `next`, the hash of a browser-binding cookie) under the hash of a fresh `state`, sets the
//!   binding cookie and sends the browser to the provider (303).
//! - `GET /auth/{oidc|github}/callback?code&state`: consumes the attempt (single use, 10 minutes, same
//!   browser), exchanges the code, finds or creates the user by (provider, subject), binds pending
//!   invitations, starts a new session (the one the browser presented is deleted) and sends the browser to
//!   `next` (303). A failure is an HTML page saying why (CSP-clean, no script), and counts against the
//!   client address's rate limit of unauthenticated and failed requests (`auth.rate_unauthenticated`), as
//!   does every start (each writes a record).
// enforces: S6

mod github;
pub(crate) mod http;
mod jwt;
mod next;
mod oidc;
mod page;

use agenthold_auth::{AttemptRefusal, NewLoginAttempt, NewUser};
use agenthold_core::{Config, Credential, UserId};
use axum::Router;
use axum::extract::{Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;

pub(crate) use self::next::sanitize_next;
use self::page::failure_page;
use super::api::{ApiError, session_cookie_value};
use super::state::AppState;

/// The configured providers, with their client secrets (read at start; never logged or shown).
#[derive(Debug)]
pub(crate) struct Providers {
    oidc: Option<oidc::Oidc>,
    github: Option<github::Github>,
    client: http::Client,
}

impl Providers {
    /// Whether the provider named `provider` (`oidc` or `github`) is turned on.
    fn is_configured(&self, provider: &str) -> bool {
        match provider {
            "oidc" => self.oidc.is_some(),
            "github" => self.github.is_some(),
            _ => false,
        }
    }

    /// The providers `config` turns on; reads their client secret files.
    pub(crate) fn from_config(config: &Config) -> anyhow::Result<Self> {
        let public_url = config.server.public_url();
        let read = agenthold_core::config::read_client_secret;
        let oidc = match &config.auth.oidc {
            Some(c) => Some(oidc::Oidc::new(
                c.clone(),
                read("auth.oidc.client_secret_file", &c.client_secret_file)?,
                &public_url,
            )),
            None => None,
        };
        let github = match &config.auth.github {
            Some(c) => Some(github::Github::new(
                c.clone(),
                read("auth.github.client_secret_file", &c.client_secret_file)?,
                &public_url,
            )),
            None => None,
        };
        Ok(Self {
            oidc,
            github,
            client: http::Client::new()?,
        })
    }
}

/// Who a provider says logged in.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// `oidc` or `github`.
    provider: &'static str,
    /// The provider's stable id of the person.
    subject: String,
    /// A display name.
    name: String,
    /// An email address, if given.
    email: Option<String>,
    /// Whether the provider verified it.
    email_verified: bool,
}

/// Why a login failed: the status and the sentence shown.
#[derive(Debug)]
pub(crate) struct Failure {
    status: StatusCode,
    reason: String,
}

impl Failure {
    fn new(status: StatusCode, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
        }
    }

    /// The provider could not be reached or answered nonsense.
    pub(crate) fn unreachable(detail: impl std::fmt::Display) -> Self {
        tracing::warn!(%detail, "login provider call failed");
        Self::new(
            StatusCode::BAD_GATEWAY,
            format!("the identity provider could not be used: {detail}"),
        )
    }

    /// The token endpoint refused the code (`error` is the provider's error code, if it gave one).
    pub(crate) fn refused(error: Option<&str>) -> Self {
        let mut reason = String::from("the identity provider refused the code");
        if let Some(e) = error.map(clean_code).filter(|e| !e.is_empty()) {
            reason.push_str(&format!(" ({e})"));
        }
        Self::new(StatusCode::UNAUTHORIZED, reason)
    }

    /// The ID token did not pass a check.
    pub(crate) fn invalid_token(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, reason)
    }
}

/// A provider's error code as shown: `[A-Za-z0-9_.-]`, at most 64 characters.
fn clean_code(code: &str) -> String {
    code.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        .take(64)
        .collect()
}

/// `url` with `query` appended (`?` or `&`).
pub(crate) fn query_join(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/auth/providers", get(list))
        .route("/auth/oidc/start", get(|s, p, q| start(s, p, q, "oidc")))
        .route("/auth/github/start", get(|s, p, q| start(s, p, q, "github")))
        .route("/auth/oidc/callback", get(|s, p, q| callback(s, p, q, "oidc")))
        .route(
            "/auth/github/callback",
            get(|s, p, q| callback(s, p, q, "github")),
        )
}

#[derive(Serialize)]
struct ProviderView {
    id: &'static str,
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    start: Option<&'static str>,
}

/// `GET /auth/providers`.
async fn list(State(state): State<AppState>) -> Response {
    let mut providers = Vec::new();
    if let Some(o) = &state.providers.oidc {
        providers.push(ProviderView {
            id: "oidc",
            name: o.config.name.clone(),
            start: Some("/auth/oidc/start"),
        });
    }
    if state.providers.github.is_some() {
        providers.push(ProviderView {
            id: "github",
            name: "GitHub".into(),
            start: Some("/auth/github/start"),
        });
    }
    providers.push(ProviderView {
        id: "local",
        name: "Local admin link".into(),
        start: None,
    });
    axum::Json(serde_json::json!({ "providers": providers })).into_response()
}

/// Name of the browser-binding cookie: `__Host-` on HTTPS, which browsers accept only with `Path=/`.
fn binding_cookie_name(state: &AppState) -> &'static str {
    if state.https() {
        "__Host-agenthold_login"
    } else {
        "agenthold_login"
    }
}

/// The browser-binding cookie's `Set-Cookie` value.
fn binding_cookie(state: &AppState, value: &str, max_age: i64) -> String {
    let name = binding_cookie_name(state);
    if state.https() {
        format!("{name}={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age}; Secure")
    } else {
        format!("{name}={value}; Path=/auth/; HttpOnly; SameSite=Lax; Max-Age={max_age}")
    }
}

/// 256 random bits, base64url.
fn random_value() -> Result<String, Failure> {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "no randomness available"))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// `GET /auth/{provider}/start?next=`.
async fn start(
    State(state): State<AppState>,
    parts: Parts,
    Query(query): Query<HashMap<String, String>>,
    provider: &'static str,
) -> Response {
    // Each start writes a login attempt: starts count against the client address's limit of
    // unauthenticated requests, like failed callbacks.
    if let Some(ip) = client_ip(&parts)
        && let Err(retry) = state.limits.check_address(ip)
    {
        return ApiError::rate_limited(retry).into_response();
    }
    match start_inner(&state, &parts, &query, provider).await {
        Ok(r) => r,
        Err(f) => failure_page(&f),
    }
}

async fn start_inner(
    state: &AppState,
    parts: &Parts,
    query: &HashMap<String, String>,
    provider: &'static str,
) -> Result<Response, Failure> {
    let p = &state.providers;
    if !p.is_configured(provider) {
        return Ok(ApiError::not_found().into_response());
    }
    let verifier = random_value()?;
    let nonce = if provider == "oidc" {
        random_value()?
    } else {
        String::new()
    };
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    let presented = session_cookie_value(parts, binding_cookie_name(state));
    let values = state
        .dir
        .create_login_attempt(
            NewLoginAttempt {
                provider: provider.to_owned(),
                verifier,
                nonce: nonce.clone(),
                next: sanitize_next(query.get("next").map(String::as_str)),
            },
            presented,
        )
        .await
        .map_err(|e| {
            Failure::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("could not start the sign-in: {e}"),
            )
        })?;
    let location = match (provider, &p.oidc, &p.github) {
        ("oidc", Some(o), _) => {
            o.authorize_url(&p.client, &values.state, &nonce, &challenge)
                .await?
        }
        ("github", _, Some(g)) => g.authorize_url(&values.state, &challenge),
        _ => return Ok(ApiError::not_found().into_response()),
    };
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&location) {
        headers.insert(header::LOCATION, v);
    }
    let cookie = binding_cookie(state, &values.binding, agenthold_auth::LOGIN_ATTEMPT_SECS);
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        headers.insert(header::SET_COOKIE, v);
    }
    Ok(response)
}

/// `GET /auth/{provider}/callback?code&state` (or `?error&state`).
async fn callback(
    State(state): State<AppState>,
    parts: Parts,
    Query(query): Query<HashMap<String, String>>,
    provider: &'static str,
) -> Response {
    match callback_inner(&state, &parts, &query, provider).await {
        Ok(r) => r,
        Err(f) => {
            if let Some(ip) = client_ip(&parts)
                && let Err(retry) = state.limits.check_address(ip)
            {
                return ApiError::rate_limited(retry).into_response();
            }
            tracing::info!(provider, reason = %f.reason, "login failed");
            let mut page = failure_page(&f);
            // The attempt is used up either way: drop the binding cookie.
            if let Ok(v) = HeaderValue::from_str(&binding_cookie(&state, "", 0)) {
                page.headers_mut().append(header::SET_COOKIE, v);
            }
            page
        }
    }
}

async fn callback_inner(
    state: &AppState,
    parts: &Parts,
    query: &HashMap<String, String>,
    provider: &'static str,
) -> Result<Response, Failure> {
    let p = &state.providers;
    if !p.is_configured(provider) {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            "this sign-in provider is not configured",
        ));
    }
    let bad = |reason: &str| Failure::new(StatusCode::BAD_REQUEST, reason);
    let st = query
        .get("state")
        .ok_or_else(|| bad("the provider's answer has no state"))?;
    let binding = session_cookie_value(parts, binding_cookie_name(state));
    let internal = |e: agenthold_auth::Error| {
        Failure::new(StatusCode::INTERNAL_SERVER_ERROR, format!("internal error: {e}"))
    };
    let attempt = match state
        .dir
        .take_login_attempt(provider, st, binding)
        .await
        .map_err(internal)?
    {
        Ok(a) => a,
        Err(AttemptRefusal::Unknown) => {
            return Err(bad(
                "state unknown or expired: the sign-in took more than 10 minutes, was already completed, or was not started here",
            ));
        }
        Err(AttemptRefusal::WrongBrowser) => {
            return Err(bad(
                "this sign-in was not started in this browser (its login cookie is missing or different)",
            ));
        }
    };
    if let Some(error) = query.get("error") {
        return Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            format!(
                "the identity provider did not sign you in ({})",
                clean_code(error)
            ),
        ));
    }
    let code = query
        .get("code")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| bad("the provider's answer has no code"))?;
    // RFC 9207: a provider that names itself in the answer must be the configured issuer (mix-up defence).
    if let (Some(iss), Some(o)) = (query.get("iss"), &p.oidc)
        && provider == "oidc"
        && *iss != o.config.issuer
    {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            "the answer names another issuer (iss) than the configured one",
        ));
    }
    let identity = match (provider, &p.oidc, &p.github) {
        ("oidc", Some(o), _) => {
            o.finish(&p.client, code, &attempt.verifier, &attempt.nonce)
                .await?
        }
        ("github", _, Some(g)) => g.finish(&p.client, code, &attempt.verifier).await?,
        _ => return Err(bad("this sign-in provider is not configured")),
    };
    let user = find_or_create(state, &identity).await.map_err(internal)?;
    let verified = identity.email.as_deref().filter(|_| identity.email_verified);
    for bound in state
        .dir
        .bind_pending_members(&user, identity.provider, &identity.subject, verified)
        .await
        .map_err(internal)?
    {
        let how = if bound.by_email {
            "verified email"
        } else {
            "provider subject"
        };
        state
            .audit(
                &bound.invitation.workspace,
                Some((&user, Credential::Session)),
                "member.bind_invitation".into(),
                format!("{} -> {user}", bound.invitation.id),
                "ok",
                Some(format!("bound at login by {how} ({})", identity.provider)),
            )
            .await;
    }
    // A new session at every login; the one the browser had (if any) ends.
    if let Some(old) = session_cookie_value(parts, state.session_cookie()) {
        state.dir.delete_session(old).await.map_err(internal)?;
    }
    let cookie = state.dir.create_session(&user).await.map_err(internal)?;
    tracing::info!(%user, provider, "login");
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&sanitize_next(Some(&attempt.next))) {
        headers.insert(header::LOCATION, v);
    }
    let session = super::login::session_cookie(state, &cookie, state.config.auth.session_absolute_secs);
    for value in [session, binding_cookie(state, "", 0)] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.append(header::SET_COOKIE, v);
        }
    }
    Ok(response)
}

/// The user of `identity`: found by (provider, subject), else created with its name and email.
async fn find_or_create(state: &AppState, identity: &Identity) -> agenthold_auth::Result<UserId> {
    if let Some(u) = state
        .dir
        .user_by_subject(identity.provider, &identity.subject)
        .await?
    {
        return Ok(u.id);
    }
    let mut name: String = identity
        .name
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(100)
        .collect();
    if name.trim().is_empty() {
        name = identity
            .subject
            .chars()
            .filter(|c| !c.is_control())
            .take(100)
            .collect();
    }
    let email = identity.email.clone().filter(|e| {
        e.contains('@') && e.chars().count() <= 254 && !e.chars().any(|c| c.is_control() || c.is_whitespace())
    });
    let new = NewUser {
        name,
        email,
        provider: identity.provider.to_owned(),
        subject: Some(identity.subject.clone()),
    };
    match state.dir.create_user(new).await {
        Ok(u) => Ok(u.id),
        // Two first logins at once: the other one created it.
        Err(agenthold_auth::Error::Conflict { .. }) => state
            .dir
            .user_by_subject(identity.provider, &identity.subject)
            .await?
            .map(|u| u.id)
            .ok_or_else(|| agenthold_auth::Error::Conflict {
                problem: "the user vanished during login".into(),
            }),
        Err(e) => Err(e),
    }
}

fn client_ip(parts: &Parts) -> Option<std::net::IpAddr> {
    parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
}
