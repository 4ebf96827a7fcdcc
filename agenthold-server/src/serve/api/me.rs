//! `/api/v1/me`: the caller's account and personal tokens (S7: created only from a browser session, shown
//! once, revocable with effect on the next request).

use std::time::Duration;

use agenthold_auth::TokenInfo;
use agenthold_core::{Action, Resource};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, ApiResult, Body, Caller, Problem, created};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_me))
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
}

/// The caller.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Me {
    /// User id.
    id: String,
    /// Display name.
    name: String,
    /// Email, when the login provider gave one.
    email: Option<String>,
    /// The login provider (`local`, `oidc`, `github`).
    provider: String,
    /// How this request authenticated: `session` or `token`.
    credential: String,
    /// Workspaces the user is a member of, with their role.
    workspaces: Vec<MyWorkspace>,
}

/// A workspace the caller belongs to.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MyWorkspace {
    /// Workspace id.
    id: String,
    /// Its name.
    name: String,
    /// The caller's role: `owner`, `admin` or `member`.
    role: String,
}

/// A personal token's metadata (never its value, except once at creation).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TokenView {
    /// Token id (for revoking).
    id: String,
    /// The name given at creation.
    name: String,
    /// The first characters after `ahp_`, to recognise it.
    prefix: String,
    /// Creation time (RFC 3339).
    created_at: String,
    /// Expiry (RFC 3339), if any.
    expires_at: Option<String>,
    /// Last use (RFC 3339, to the minute), if any.
    last_used_at: Option<String>,
}

impl From<TokenInfo> for TokenView {
    fn from(t: TokenInfo) -> Self {
        Self {
            id: t.id,
            name: t.name,
            prefix: t.prefix,
            created_at: t.created_at,
            expires_at: t.expires_at,
            last_used_at: t.last_used_at,
        }
    }
}

/// A new token: the value is in `token`, shown this once.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct NewToken {
    /// Token id.
    id: String,
    /// The token (`ahp_…`): send it as `Authorization: Bearer <token>`. Not retrievable later.
    token: String,
    #[serde(flatten)]
    info: TokenView,
}

/// A list of tokens.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TokenList {
    /// The caller's tokens, oldest first.
    items: Vec<TokenView>,
}

/// `POST /api/v1/me/tokens`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateToken {
    /// A name to recognise the token by (1 to 100 characters).
    #[schema(min_length = 1, max_length = 100, example = "laptop")]
    name: String,
    /// Seconds until it expires (1 to 10 years); none: it does not expire.
    #[schema(minimum = 1, maximum = 315_360_000)]
    expires_in: Option<u64>,
}

/// The most a token may live: ten years.
const MAX_TOKEN_LIFETIME: u64 = 10 * 365 * 24 * 3600;

#[utoipa::path(get, path = "/api/v1/me", tag = "me",
    responses((status = 200, body = Me), (status = 401, body = Problem)),
    extensions(("x-agenthold-role" = json!("self"))))]
async fn get_me(State(state): State<AppState>, caller: Caller) -> ApiResult<Json<Me>> {
    caller.require(&state, Action::View, &Resource::Account).await?;
    let user = state
        .dir
        .user(caller.user())
        .await?
        .ok_or_else(ApiError::unauthorized)?;
    let workspaces = state
        .dir
        .workspaces_of(caller.user())
        .await?
        .into_iter()
        .map(|(w, role)| MyWorkspace {
            id: w.id.to_string(),
            name: w.name,
            role: super::workspaces::role_name(role),
        })
        .collect();
    Ok(Json(Me {
        id: user.id.to_string(),
        name: user.name,
        email: user.email,
        provider: user.provider,
        credential: match caller.principal.credential {
            agenthold_core::Credential::Session => "session".into(),
            agenthold_core::Credential::Token => "token".into(),
        },
        workspaces,
    }))
}

#[utoipa::path(get, path = "/api/v1/me/tokens", tag = "me",
    responses((status = 200, body = TokenList), (status = 401, body = Problem)),
    extensions(("x-agenthold-role" = json!("self"))))]
async fn list_tokens(State(state): State<AppState>, caller: Caller) -> ApiResult<Json<TokenList>> {
    caller.require(&state, Action::View, &Resource::Account).await?;
    let items = state
        .dir
        .tokens(caller.user())
        .await?
        .into_iter()
        .map(TokenView::from)
        .collect();
    Ok(Json(TokenList { items }))
}

#[utoipa::path(post, path = "/api/v1/me/tokens", tag = "me", request_body = CreateToken,
    responses((status = 201, body = NewToken), (status = 403, body = Problem, description = "a token cannot create a token")),
    extensions(("x-agenthold-role" = json!("session"))))]
async fn create_token(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<CreateToken>,
) -> ApiResult<Response> {
    caller
        .require(&state, Action::CreateToken, &Resource::Account)
        .await?;
    let expires_in = match body.expires_in {
        None => None,
        Some(s) if (1..=MAX_TOKEN_LIFETIME).contains(&s) => Some(Duration::from_secs(s)),
        Some(s) => {
            return Err(ApiError::bad_request(format!(
                "expires_in must be 1 to {MAX_TOKEN_LIFETIME} seconds, found {s}"
            )));
        }
    };
    let (info, token) = state
        .dir
        .create_token(caller.user(), &body.name, expires_in)
        .await?;
    Ok(created(NewToken {
        id: info.id.clone(),
        token,
        info: TokenView::from(info),
    }))
}

#[utoipa::path(delete, path = "/api/v1/me/tokens/{id}", tag = "me",
    params(("id" = String, Path, description = "token id")),
    responses((status = 204), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("self"))))]
async fn revoke_token(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    caller.require(&state, Action::View, &Resource::Account).await?;
    if id.len() > 128 || !state.dir.revoke_token(caller.user(), &id).await? {
        return Err(ApiError::not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}
