//! Provider logins (S3, E15): `/api/v1/me/provider-logins` (the caller's Claude and ChatGPT accounts:
//! connect from a browser session only, list, withdraw) and `…/agents/{agent}/provider-login` (attach one,
//! by its owner on an agent they administer; detach). See `serve/harness_logins`.
// enforces: S3

use agenthold_core::{Action, Credential, Resource};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, ApiResult, Body, Caller, Params, Problem, created};
use crate::serve::harness_logins::record::{self, LoginRecord, Pending};
use crate::serve::harness_logins::{self, Provider};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_logins, start_login))
        .routes(routes!(complete_login))
        .routes(routes!(withdraw_login))
        .routes(routes!(attach_login, detach_login))
}

/// A provider login as its owner sees it (never a token).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LoginView {
    /// Login id (`pl_…`).
    id: String,
    /// `claude` or `chatgpt`.
    provider: Provider,
    /// The name given at the start.
    name: Option<String>,
    /// `pending` (waiting for the code), `connected`, `expired` (the code came too late) or `failed` (the
    /// provider refused the code: start again).
    state: String,
    /// While pending: the address to open, where the provider asks for consent and shows the code.
    #[serde(skip_serializing_if = "Option::is_none")]
    authorize_url: Option<String>,
    /// The account, when the provider said (an email).
    account: Option<String>,
    /// When it was started (RFC 3339).
    created_at: String,
    /// When it was connected (RFC 3339).
    connected_at: Option<String>,
    /// The agents it is attached to.
    agents: Vec<LoginAgent>,
}

/// An agent a login is attached to.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LoginAgent {
    /// The workspace.
    workspace: String,
    /// The agent.
    agent: String,
}

/// The caller's provider logins.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LoginList {
    /// Oldest first.
    items: Vec<LoginView>,
}

/// `POST /api/v1/me/provider-logins`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartLogin {
    /// `claude` or `chatgpt`.
    #[schema(example = "claude")]
    provider: Provider,
    /// A name to recognise it by (up to 100 characters).
    #[schema(max_length = 100, example = "my max plan")]
    name: Option<String>,
}

/// `POST /api/v1/me/provider-logins/{id}/complete`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompleteLogin {
    /// What the provider gave back: Claude's `code#state`, or the whole address ChatGPT redirected to
    /// (`http://localhost:1455/auth/callback?code=…&state=…`), or the bare code.
    #[schema(example = "code#state")]
    code: String,
}

/// `PUT …/agents/{agent}/provider-login`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AttachLogin {
    /// The id of a connected login of the caller's.
    #[schema(example = "pl_0123456789abcdef01234567")]
    login: String,
}

/// The login an agent uses (in the agent's JSON too).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct AgentLoginView {
    /// Login id.
    pub(crate) id: String,
    /// `claude` or `chatgpt`.
    pub(crate) provider: Provider,
    /// Whose account it is (user id).
    pub(crate) owner: String,
    /// Their display name.
    pub(crate) owner_name: String,
    /// When it was attached (RFC 3339).
    pub(crate) attached_at: String,
}

/// `?provider=` of a detach.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct DetachQuery {
    /// Only the login of this provider (default: every login of the agent).
    provider: Option<Provider>,
}

fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Only from a browser session (S3: like personal tokens, S7).
fn session_only(caller: &Caller) -> ApiResult<()> {
    if caller.principal.credential == Credential::Session {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "provider logins are connected only from a browser session",
        ))
    }
}

async fn view(state: &AppState, rec: &LoginRecord, authorize_url: Option<String>) -> ApiResult<LoginView> {
    let status = match (&rec.pending, rec.connected()) {
        (_, true) => "connected",
        (Some(p), false) if p.expires_unix > now_unix() => "pending",
        (Some(_), false) => "expired",
        (None, false) => "failed",
    };
    let agents = harness_logins::agents_of(state, &rec.id)
        .await?
        .into_iter()
        .map(|(w, a)| LoginAgent {
            workspace: w.to_string(),
            agent: a.to_string(),
        })
        .collect();
    Ok(LoginView {
        id: rec.id.clone(),
        provider: rec.provider,
        name: rec.name.clone(),
        state: status.to_owned(),
        authorize_url,
        account: rec.meta.as_ref().and_then(|m| m.account.clone()),
        created_at: rec.created_at.clone(),
        connected_at: rec.connected_at.clone(),
        agents,
    })
}

/// The caller's login `id`; 404 for another user's.
async fn own(state: &AppState, caller: &Caller, id: &str) -> ApiResult<LoginRecord> {
    if id.len() > 64 {
        return Err(ApiError::not_found());
    }
    record::load(state.store.as_ref(), id)
        .await?
        .filter(|l| l.owner == *caller.user())
        .ok_or_else(ApiError::not_found)
}

#[utoipa::path(get, path = "/api/v1/me/provider-logins", tag = "provider-logins",
    responses((status = 200, body = LoginList), (status = 401, body = Problem)),
    extensions(("x-agenthold-role" = json!("self"))))]
async fn list_logins(State(state): State<AppState>, caller: Caller) -> ApiResult<Json<LoginList>> {
    caller.require(&state, Action::View, &Resource::Account).await?;
    let mut items = Vec::new();
    for rec in record::all(state.store.as_ref()).await? {
        if rec.owner == *caller.user() {
            items.push(view(&state, &rec, None).await?);
        }
    }
    Ok(Json(LoginList { items }))
}

#[utoipa::path(post, path = "/api/v1/me/provider-logins", tag = "provider-logins", request_body = StartLogin,
    responses((status = 201, body = LoginView, description = "pending: open `authorize_url`, then complete with the code"),
        (status = 403, body = Problem, description = "not a browser session")),
    extensions(("x-agenthold-role" = json!("session"))))]
async fn start_login(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<StartLogin>,
) -> ApiResult<Response> {
    caller.require(&state, Action::View, &Resource::Account).await?;
    session_only(&caller)?;
    if let Some(name) = &body.name
        && (name.chars().count() > 100 || name.chars().any(char::is_control))
    {
        return Err(ApiError::bad_request(
            "name: up to 100 characters, no control characters",
        ));
    }
    let oauth_state = harness_logins::random_value()?;
    let verifier = harness_logins::random_value()?;
    let id = harness_logins::new_login_id()?;
    let cfg = body.provider.config(&state);
    let authorize_url = harness_logins::authorize_url(body.provider, cfg, &oauth_state, &verifier);
    let attempt_secs = i64::try_from(state.config.harness_logins.attempt_secs).unwrap_or(i64::MAX);
    let rec = LoginRecord {
        id,
        owner: caller.user().clone(),
        provider: body.provider,
        name: body.name,
        created_at: crate::serve::records::now_rfc3339(),
        connected_at: None,
        pending: Some(Pending {
            state_hash: harness_logins::state_hash(&oauth_state),
            verifier,
            expires_unix: now_unix().saturating_add(attempt_secs),
        }),
        sealed: None,
        meta: None,
    };
    record::save(state.store.as_ref(), &rec).await?;
    Ok(created(view(&state, &rec, Some(authorize_url)).await?))
}

#[utoipa::path(post, path = "/api/v1/me/provider-logins/{id}/complete", tag = "provider-logins", request_body = CompleteLogin,
    params(("id" = String, Path, description = "login id")),
    responses((status = 200, body = LoginView, description = "connected"),
        (status = 400, body = Problem, description = "wrong state, expired, or the provider refused the code"),
        (status = 403, body = Problem, description = "not a browser session"),
        (status = 404, body = Problem), (status = 409, body = Problem, description = "not pending")),
    extensions(("x-agenthold-role" = json!("session"))))]
async fn complete_login(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Body(body): Body<CompleteLogin>,
) -> ApiResult<Json<LoginView>> {
    caller.require(&state, Action::View, &Resource::Account).await?;
    session_only(&caller)?;
    let pasted = harness_logins::parse_pasted(&body.code)?;
    let (rec, pending) = {
        let _records = state.logins.record_lock.lock().await;
        let mut rec = own(&state, &caller, &id).await?;
        let Some(pending) = rec.pending.clone() else {
            return Err(ApiError::conflict(if rec.connected() {
                "this login is already connected"
            } else {
                "this login attempt was used up: start a new one"
            }));
        };
        if pending.expires_unix <= now_unix() {
            return Err(ApiError::bad_request(
                "this login attempt expired: start a new one",
            ));
        }
        if let Some(s) = &pasted.state
            && harness_logins::state_hash(s) != pending.state_hash
        {
            return Err(ApiError::bad_request(
                "the state does not match this login attempt (a code of another attempt?)",
            ));
        }
        // Single use from here: a code goes to the provider once.
        rec.pending = None;
        record::save(state.store.as_ref(), &rec).await?;
        (rec, pending)
    };
    let cfg = rec.provider.config(&state);
    let state_param = pasted.state.clone().unwrap_or_default();
    let (tokens, meta) = harness_logins::exchange(
        &state.logins.client,
        rec.provider,
        cfg,
        &pasted.code,
        &state_param,
        &pending.verifier,
    )
    .await?;
    let _records = state.logins.record_lock.lock().await;
    // Withdrawn meanwhile: nothing to connect.
    let mut rec = own(&state, &caller, &rec.id).await?;
    rec.seal(&state.vault, &tokens)?;
    rec.meta = Some(meta);
    rec.connected_at = Some(crate::serve::records::now_rfc3339());
    record::save(state.store.as_ref(), &rec).await?;
    drop(_records);
    Ok(Json(view(&state, &rec, None).await?))
}

#[utoipa::path(delete, path = "/api/v1/me/provider-logins/{id}", tag = "provider-logins",
    params(("id" = String, Path, description = "login id")),
    responses((status = 204, description = "withdrawn: detached from every agent and deleted"), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("self"))))]
async fn withdraw_login(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    caller.require(&state, Action::View, &Resource::Account).await?;
    if id.len() > 64
        || !harness_logins::withdraw(&state, caller.user(), caller.principal.credential, &id).await?
    {
        return Err(ApiError::not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The logins `agent` uses, for its JSON.
pub(crate) async fn agent_logins(
    state: &AppState,
    agent: &agenthold_core::AgentId,
) -> ApiResult<Vec<AgentLoginView>> {
    let mut out = Vec::new();
    for item in harness_logins::of_agent(state, agent).await? {
        let owner_name = state
            .dir
            .user(&item.owner)
            .await?
            .map_or_else(|| item.owner.to_string(), |u| u.name);
        out.push(AgentLoginView {
            id: item.login,
            provider: item.provider,
            owner: item.owner.to_string(),
            owner_name,
            attached_at: item.attached_at,
        });
    }
    Ok(out)
}

#[utoipa::path(put, path = "/api/v1/workspaces/{ws}/agents/{agent}/provider-login", tag = "provider-logins", request_body = AttachLogin,
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = AgentLoginView, description = "attached (replacing the agent's login of the same provider)"),
        (status = 400, body = Problem, description = "not a connected login of the caller's"),
        (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn attach_login(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Body(body): Body<AttachLogin>,
) -> ApiResult<Json<AgentLoginView>> {
    let (ws, agent, _) = super::agents::agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    let rec = harness_logins::attach(&state, caller.user(), &ws, &agent, &body.login).await?;
    agent_logins(&state, &agent)
        .await?
        .into_iter()
        .find(|l| l.id == rec.id)
        .map(Json)
        .ok_or_else(|| ApiError::internal(&"an attached login is not listed"))
}

#[utoipa::path(delete, path = "/api/v1/workspaces/{ws}/agents/{agent}/provider-login", tag = "provider-logins",
    params(("ws" = String, Path), ("agent" = String, Path), DetachQuery),
    responses((status = 204, description = "detached (or none was attached)"), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn detach_login(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Params(q): Params<DetachQuery>,
) -> ApiResult<Response> {
    let (_, agent, _) = super::agents::agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    harness_logins::detach(
        &state,
        &agent,
        q.provider,
        Some((caller.user(), caller.principal.credential)),
        "detached by an agent admin",
    )
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
