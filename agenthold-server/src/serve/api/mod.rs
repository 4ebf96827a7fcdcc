//! `/api/v1`: the router, built from each resource module's routes so that the OpenAPI document
//! (`/api/v1/openapi.json`) and the router come from one list (SERVER.md §3). Every operation carries its
//! minimum role as the extension `x-agenthold-role`; the role-matrix test walks the document.
//!
//! Around every route: the body cap (S9, 8 MiB unless a route sets its own, as file uploads do), cross-origin
//! protection for state-changing requests (S6, the rule of Go's `CrossOriginProtection`), the audit log of
//! state-changing workspace calls (P4), request metrics and the security headers.

mod agent_secrets;
mod agents;
mod caller;
mod doc;
mod error;
mod execs;
mod files;
mod health;
mod json;
mod me;
mod messages;
mod policy;
mod provider_logins;
mod requests;
mod roles;
mod runs;
mod secrets;
mod sse;
mod suggestions;
mod terminal;
mod webhooks;
mod workspaces;

use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tower_http::csrf::CsrfLayer;
use tower_http::set_header::SetResponseHeaderLayer;
use utoipa::OpenApi;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;

pub(crate) use caller::{Caller, CallerSlot, cookie as session_cookie_value};
pub(crate) use error::{ApiError, ApiResult, Problem};
pub(crate) use json::{Body, Params};
pub(crate) use webhooks::delivery_limits;

use crate::serve::state::AppState;

/// Largest JSON body a route accepts (S9); file uploads have their own cap (64 MiB, `files`).
pub(crate) const BODY_LIMIT: usize = 8 * 1024 * 1024;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "agenthold",
        description = "The agenthold reference server: workspaces, agents in sandboxes, their egress. \
                       Every operation's minimum role is its `x-agenthold-role` extension."
    ),
    modifiers(&SecuritySchemes),
    components(schemas(Problem))
)]
struct ApiDoc;

/// Bearer tokens and the session cookie.
struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "session",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::new("agenthold_session"))),
        );
        openapi.security = Some(vec![
            utoipa::openapi::security::SecurityRequirement::new("token", Vec::<String>::new()),
            utoipa::openapi::security::SecurityRequirement::new("session", Vec::<String>::new()),
        ]);
    }
}

/// Every API route with its OpenAPI operation.
fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(me::routes())
        .merge(workspaces::routes())
        .merge(agents::routes())
        .merge(policy::routes())
        .merge(secrets::routes())
        .merge(agent_secrets::routes())
        .merge(requests::routes())
        .merge(suggestions::routes())
        .merge(execs::routes())
        .merge(runs::routes())
        .merge(messages::routes())
        .merge(files::routes())
        .merge(terminal::routes())
        .merge(webhooks::routes())
        .merge(provider_logins::routes())
}

/// The OpenAPI document of the API (the same list the router serves).
pub(crate) fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = api_routes().split_for_parts().1;
    doc::finish(&mut doc);
    doc
}

/// The whole HTTP application: the API, the probes, `pages` (the login pages) and the web UI (every path no
/// route claims) behind the same layers.
pub(crate) fn app(state: AppState, pages: Router<AppState>) -> Router {
    let (api, mut doc) = api_routes().split_for_parts();
    doc::finish(&mut doc);
    let doc = serde_json::to_value(&doc).unwrap_or_default();
    let api = api
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { Json(doc) }
            }),
        )
        .merge(health::routes())
        .merge(webhooks::hook_routes())
        .merge(pages)
        .fallback(crate::serve::ui::fallback);
    api.layer(middleware::from_fn_with_state(state.clone(), audit_and_measure))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(
            CsrfLayer::new()
                .with_insecure_bypass(|_: &Method, uri: &axum::http::Uri| uri.path().starts_with("/hooks/"))
                .with_rejection_response(|_: tower_http::csrf::ProtectionError| {
                    ApiError::forbidden("cross-origin request refused (S6)").into_response()
                }),
        )
        .layer(SetResponseHeaderLayer::if_not_present(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::X_FRAME_OPTIONS,
            HeaderValue::from_static("DENY"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            HeaderName::from_static("cache-control"),
            HeaderValue::from_static("no-store"),
        ))
        .with_state(state)
}

/// The workspace id of a `/api/v1/workspaces/{ws}/…` path.
fn workspace_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/api/v1/workspaces/")?;
    let ws = rest.split('/').next()?;
    (!ws.is_empty()).then_some(ws)
}

/// Record request metrics, and append every state-changing call inside a workspace to its audit log
/// (actor, credential, action = method and route, target = path, result by status). Calls answered 404 are
/// not recorded: to a non-member the workspace does not exist (S5).
async fn audit_and_measure(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let slot = CallerSlot::default();
    req.extensions_mut().insert(slot.clone());
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let response = next.run(req).await;
    let status = response.status();
    metrics::counter!("agenthold_http_requests_total", "method" => method.to_string(), "route" => route.clone(), "status" => status.as_u16().to_string()).increment(1);
    metrics::histogram!("agenthold_http_request_seconds", "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    let mutating = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    let workspace = workspace_of(&path).and_then(|ws| agenthold_core::WorkspaceId::new(ws).ok());
    if mutating
        && status != StatusCode::NOT_FOUND
        && let (Some(principal), Some(ws)) = (slot.0.get(), workspace)
    {
        let result = if status.is_success() {
            "ok"
        } else if status == StatusCode::FORBIDDEN {
            "denied"
        } else {
            "failed"
        };
        let reason = (!status.is_success()).then(|| status.to_string());
        state
            .audit(
                &ws,
                Some((&principal.user, principal.credential)),
                format!("{method} {route}"),
                path,
                result,
                reason,
            )
            .await;
    }
    response
}

/// A 201 with a JSON body.
pub(crate) fn created<T: serde::Serialize>(body: T) -> Response {
    (StatusCode::CREATED, Json(body)).into_response()
}
