//! `…/agents/{agent}/webhooks` (agent admins: create, list, rotate, delete) and `POST /hooks/{token}` (the
//! holder of the URL), P2 and S8. The URL and the HMAC secret appear only in the answers to create and
//! rotate. `/hooks/` is outside the API document and outside the cross-origin rule (no cookies are read
//! there: the token in the path is the credential); it is rate-limited per client address, reads at most
//! 256 KiB (413 past it, never buffering more), and answers 202 with the run it started.
// enforces: P2, S8

use std::net::SocketAddr;

use agenthold_auth::RateLimits;
use agenthold_core::Action;
use axum::body::Body as RawBody;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::agents::agent_meta;
use super::{ApiError, ApiResult, Body, Caller, Problem, created};
use crate::serve::state::AppState;
use crate::serve::webhooks::{self as hooks, BODY_CAP, NewWebhook, Shown, Webhook};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_webhooks, create_webhook))
        .routes(routes!(delete_webhook))
        .routes(routes!(rotate_webhook))
}

/// `POST /hooks/{token}` (not in the API document: its credential is the URL).
pub(super) fn hook_routes() -> Router<AppState> {
    Router::new().route("/hooks/{token}", post(receive))
}

/// Deliveries per second from one client address (bursts of 4× pass): above the unauthenticated rate, since
/// a hook sender is one address with many events.
pub(crate) const DELIVERIES_PER_SECOND: u32 = 20;

/// The limiter of deliveries per client address.
pub(crate) fn delivery_limits(config: &agenthold_core::Config) -> RateLimits {
    RateLimits::new(&agenthold_core::config::AuthConfig {
        rate_unauthenticated: DELIVERIES_PER_SECOND,
        ..config.auth.clone()
    })
}

/// Longest `instructions`.
const MAX_INSTRUCTIONS: usize = 16 * 1024;
/// Most argv elements of a custom harness, and the longest element.
const MAX_ARGV: usize = 64;
const MAX_ARG: usize = 4096;

/// `POST …/webhooks`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateWebhook {
    /// Require an HMAC-SHA256 signature of the body (`X-Agenthold-Signature-256` or GitHub's
    /// `X-Hub-Signature-256`); the secret is in the answer, once.
    #[schema(example = true)]
    hmac: Option<bool>,
    /// `claude` (default), `codex` or `custom`.
    #[schema(example = "custom")]
    harness: Option<String>,
    /// The command of a `custom` harness (required for it, refused otherwise); the prompt is its stdin.
    #[schema(example = json!(["cat"]))]
    argv: Option<Vec<String>>,
    /// A label.
    #[schema(example = "issues")]
    name: Option<String>,
    /// What the run is told before the payload (default: one generic line). At most 16 KiB.
    instructions: Option<String>,
}

/// A webhook. `url` and `secret` only in the answers to create and rotate.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookView {
    /// `wh_…`.
    id: String,
    /// The agent.
    agent: String,
    /// Its workspace.
    workspace: String,
    /// A label.
    name: Option<String>,
    /// `claude`, `codex` or `custom`.
    harness: String,
    /// The command of a `custom` harness.
    #[serde(skip_serializing_if = "Option::is_none")]
    argv: Option<Vec<String>>,
    /// What the run is told before the payload.
    instructions: Option<String>,
    /// Whether deliveries must be signed.
    hmac: bool,
    /// Who created it (runs start as them).
    created_by: String,
    /// When (RFC 3339).
    created_at: String,
    /// When its URL last changed.
    rotated_at: Option<String>,
    /// When a delivery last started a run.
    last_delivery_at: Option<String>,
    /// Deliveries that started a run.
    deliveries: u64,
    /// `<public_url>/hooks/<64 hex>`: shown once.
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    /// The HMAC secret (64 hex digits): shown once.
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
}

impl WebhookView {
    fn new(state: &AppState, hook: Webhook, shown: Option<Shown>) -> Self {
        let (url, secret) = match shown {
            Some(s) => (Some(format!("{}/hooks/{}", state.public_url, s.token)), s.secret),
            None => (None, None),
        };
        Self {
            id: hook.id.clone(),
            agent: hook.agent.to_string(),
            workspace: hook.workspace.to_string(),
            hmac: hook.hmac(),
            name: hook.name,
            harness: hook.harness,
            argv: hook.argv,
            instructions: hook.instructions,
            created_by: hook.created_by.to_string(),
            created_at: hook.created_at,
            rotated_at: hook.rotated_at,
            last_delivery_at: hook.last_delivery_at,
            deliveries: hook.deliveries,
            url,
            secret,
        }
    }
}

/// The webhooks of an agent.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookList {
    /// Oldest first, without URLs or secrets.
    items: Vec<WebhookView>,
}

/// The answer to a delivery.
#[derive(Debug, Serialize)]
struct Accepted {
    /// The run it started.
    run: String,
}

fn check(body: CreateWebhook) -> ApiResult<NewWebhook> {
    let harness = body.harness.unwrap_or_else(|| "claude".to_owned());
    match (harness.as_str(), &body.argv) {
        ("custom", Some(argv)) => {
            if argv.is_empty()
                || argv.len() > MAX_ARGV
                || argv.iter().any(|a| a.len() > MAX_ARG || a.contains('\0'))
            {
                return Err(ApiError::bad_request(format!(
                    "argv: 1 to {MAX_ARGV} arguments of at most {MAX_ARG} bytes, without NUL"
                )));
            }
        }
        ("custom", None) => return Err(ApiError::bad_request("a custom harness needs argv")),
        ("claude" | "codex", None) => {}
        ("claude" | "codex", Some(_)) => {
            return Err(ApiError::bad_request("argv is only for the custom harness"));
        }
        (other, _) => {
            return Err(ApiError::bad_request(format!(
                "harness {other:?}: use claude, codex or custom"
            )));
        }
    }
    if let Some(name) = &body.name
        && (name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control))
    {
        return Err(ApiError::bad_request(
            "name must be 1 to 100 characters without control characters",
        ));
    }
    if body
        .instructions
        .as_ref()
        .is_some_and(|i| i.len() > MAX_INSTRUCTIONS)
    {
        return Err(ApiError::bad_request("instructions are at most 16 KiB"));
    }
    Ok(NewWebhook {
        hmac: body.hmac.unwrap_or(false),
        harness,
        argv: body.argv,
        name: body.name,
        instructions: body.instructions,
    })
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/webhooks", tag = "webhooks",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = WebhookList), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn list_webhooks(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
) -> ApiResult<Json<WebhookList>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    let items = hooks::list(state.store.as_ref(), &agent)
        .await?
        .into_iter()
        .map(|h| WebhookView::new(&state, h, None))
        .collect();
    Ok(Json(WebhookList { items }))
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/agents/{agent}/webhooks", tag = "webhooks",
    description = "Make a webhook: its URL (with a 256-bit token) and, with `hmac`, its signing secret are in \
                   this answer only; the server keeps the token's hash and the secret sealed.",
    request_body = CreateWebhook,
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 201, body = WebhookView), (status = 400, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem, description = "the agent has 32 webhooks")),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn create_webhook(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Body(body): Body<CreateWebhook>,
) -> ApiResult<Response> {
    let (ws, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    let new = check(body)?;
    let (hook, shown) = hooks::create(&state, &ws, &agent, caller.user(), new).await?;
    Ok(created(WebhookView::new(&state, hook, Some(shown))))
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/agents/{agent}/webhooks/{webhook}/rotate", tag = "webhooks",
    description = "A new URL (and a new secret when the hook signs); the old ones stop working at once.",
    params(("ws" = String, Path), ("agent" = String, Path), ("webhook" = String, Path)),
    responses((status = 200, body = WebhookView), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn rotate_webhook(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, webhook)): Path<(String, String, String)>,
) -> ApiResult<Json<WebhookView>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    let (hook, shown) = hooks::rotate(&state, &agent, &webhook)
        .await?
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(WebhookView::new(&state, hook, Some(shown))))
}

#[utoipa::path(delete, path = "/api/v1/workspaces/{ws}/agents/{agent}/webhooks/{webhook}", tag = "webhooks",
    params(("ws" = String, Path), ("agent" = String, Path), ("webhook" = String, Path)),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn delete_webhook(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, webhook)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    if !hooks::delete(&state, &agent, &webhook).await? {
        return Err(ApiError::not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Read at most [`BODY_CAP`] bytes of `body`: 413 as soon as the declared length or the bytes read pass it.
async fn read_capped(headers: &HeaderMap, body: RawBody) -> ApiResult<Vec<u8>> {
    let too_large = || ApiError::too_large("a webhook body is at most 256 KiB");
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > BODY_CAP as u64) {
        return Err(too_large());
    }
    match Limited::new(body, BODY_CAP).collect().await {
        Ok(collected) => Ok(collected.to_bytes().to_vec()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => Err(ApiError::bad_request(format!("the body could not be read: {e}"))),
    }
}

/// `POST /hooks/{token}`.
async fn receive(
    State(state): State<AppState>,
    Path(token): Path<String>,
    request: Request,
) -> ApiResult<Response> {
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    if let Some(ConnectInfo(addr)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() {
        state
            .hook_limits
            .check_address(addr.ip())
            .map_err(ApiError::rate_limited)?;
    }
    // Looked up by the token's hash; an unknown token answers exactly as a missing resource.
    let Some(hook) = hooks::find(&state, &token).await? else {
        // The body is read (at most the delivery limit) and dropped first: answering before it arrived
        // makes hyper close the connection after the answer, and a client that reuses it sees a reset.
        let _ = read_capped(&headers, body).await;
        metrics::counter!("agenthold_webhook_deliveries_total", "outcome" => "unknown").increment(1);
        return Err(ApiError::not_found());
    };
    let body = match read_capped(&headers, body).await {
        Ok(body) => body,
        Err(e) => {
            state
                .audit(
                    &hook.workspace,
                    None,
                    "webhook delivery".to_owned(),
                    format!("agents/{}/webhooks/{}", hook.agent, hook.id),
                    "failed",
                    Some(format!("body refused ({})", e.status())),
                )
                .await;
            return Err(e);
        }
    };
    let outcome = hooks::deliver(&state, hook, &headers, &body).await;
    let label = match &outcome {
        Ok(_) => "started",
        Err(e) if e.status() == StatusCode::UNAUTHORIZED => "bad_signature",
        Err(_) => "failed",
    };
    metrics::counter!("agenthold_webhook_deliveries_total", "outcome" => label).increment(1);
    let delivered = outcome?;
    Ok((StatusCode::ACCEPTED, Json(Accepted { run: delivered.run })).into_response())
}
