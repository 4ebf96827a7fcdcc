//! `…/agents/{agent}/secrets`: which workspace secrets an agent may use (E12, E13). Viewers list them
//! (name, variable, placeholder; never a value); agent admins attach a secret of the agent's workspace,
//! optionally with an environment variable that holds its placeholder in the sandbox, and detach it.
//! Attaching and detaching apply at once to the gateway's injection (the next request from the sandbox);
//! the server keeps the attachments (see `serve::secrets`) so secret changes reach every agent.
// enforces: E12

use agenthold_core::{Action, SecretId};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::agents::agent_meta;
use super::{ApiError, ApiResult, Body, Caller, Problem};
use crate::serve::records::now_rfc3339;
use crate::serve::secrets::{self as records, Attachment};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_agent_secrets))
        .routes(routes!(attach_secret, detach_secret))
}

/// Longest environment variable name accepted.
const MAX_ENV: usize = 128;

/// `PUT …/agents/{agent}/secrets/{secret}`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AttachSecret {
    /// An environment variable (letters, digits, `_`, not starting with a digit) that holds the secret's
    /// placeholder in the sandbox: in every command the server starts in it from now on (execs, runs,
    /// the terminal). The container's own environment keeps what it was created with.
    #[schema(example = "OPENAI_API_KEY")]
    env: Option<String>,
}

/// A secret attached to an agent.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AgentSecretView {
    /// The workspace secret's id (also `secret`).
    id: String,
    /// The workspace secret's id.
    secret: String,
    /// Its name.
    name: String,
    /// The variable holding the placeholder, if any.
    env: Option<String>,
    /// What the sandbox sees instead of the value (`agenthold-placeholder-…`).
    placeholder: Option<String>,
    /// When it was attached (RFC 3339).
    attached_at: String,
}

/// The secrets attached to an agent.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AgentSecretList {
    /// In the order they were attached.
    items: Vec<AgentSecretView>,
    /// Always absent: an agent's secrets fit one page.
    next_cursor: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/secrets", tag = "agent secrets",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = AgentSecretList), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn list_agent_secrets(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
) -> ApiResult<Json<AgentSecretList>> {
    let (ws, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::View).await?;
    let atts = records::attachments(state.store.as_ref(), &ws, &agent).await?;
    let placeholders = state.runtime.agent_secrets(&agent).await?;
    let mut items = Vec::with_capacity(atts.items.len());
    for item in atts.items {
        let Some(secret) = records::load(state.store.as_ref(), &ws, &item.secret).await? else {
            continue;
        };
        let placeholder = placeholders
            .iter()
            .find(|p| p.name == secret.name)
            .map(|p| p.placeholder.clone());
        items.push(AgentSecretView {
            id: secret.id.to_string(),
            secret: secret.id.to_string(),
            name: secret.name,
            env: item.env,
            placeholder,
            attached_at: item.attached_at,
        });
    }
    Ok(Json(AgentSecretList {
        items,
        next_cursor: None,
    }))
}

#[utoipa::path(put, path = "/api/v1/workspaces/{ws}/agents/{agent}/secrets/{secret}", tag = "agent secrets",
    request_body = AttachSecret,
    params(("ws" = String, Path), ("agent" = String, Path), ("secret" = String, Path, description = "a secret of the same workspace")),
    responses((status = 201, body = AgentSecretView, description = "attached"), (status = 200, body = AgentSecretView, description = "already attached; variable updated"),
        (status = 400, body = Problem, description = "invalid variable name, or one the sandbox or another secret uses"),
        (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn attach_secret(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, secret)): Path<(String, String, String)>,
    Body(body): Body<AttachSecret>,
) -> ApiResult<Response> {
    let (ws, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    let secret = SecretId::new(secret).map_err(|_| ApiError::not_found())?;
    if body.env.as_ref().is_some_and(|e| e.len() > MAX_ENV) {
        return Err(ApiError::bad_request(format!(
            "an environment variable name is at most {MAX_ENV} characters"
        )));
    }
    let _edits = state.edits.lock().await;
    let secret = records::load(state.store.as_ref(), &ws, &secret)
        .await?
        .ok_or_else(ApiError::not_found)?;
    let mut atts = records::attachments(state.store.as_ref(), &ws, &agent).await?;
    let (created, attached_at) = match atts.items.iter_mut().find(|a| a.secret == secret.id) {
        Some(item) => {
            item.env.clone_from(&body.env);
            (false, item.attached_at.clone())
        }
        None => {
            let now = now_rfc3339();
            atts.items.push(Attachment {
                secret: secret.id.clone(),
                env: body.env.clone(),
                revision: secret.revision,
                attached_at: now.clone(),
            });
            (true, now)
        }
    };
    let placeholders = records::apply(&state, &agent, atts).await?;
    let placeholder = placeholders
        .into_iter()
        .find(|p| p.name == secret.name)
        .map(|p| p.placeholder);
    tracing::info!(agent = %agent, secret = %secret.id, "secret attached");
    let view = AgentSecretView {
        id: secret.id.to_string(),
        secret: secret.id.to_string(),
        name: secret.name,
        env: body.env,
        placeholder,
        attached_at,
    };
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view)).into_response())
}

#[utoipa::path(delete, path = "/api/v1/workspaces/{ws}/agents/{agent}/secrets/{secret}", tag = "agent secrets",
    params(("ws" = String, Path), ("agent" = String, Path), ("secret" = String, Path)),
    responses((status = 204, description = "detached: no longer injected"), (status = 403, body = Problem),
        (status = 404, body = Problem, description = "no such agent, or the secret is not attached to it")),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn detach_secret(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, secret)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    let (ws, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    let secret = SecretId::new(secret).map_err(|_| ApiError::not_found())?;
    let _edits = state.edits.lock().await;
    let mut atts = records::attachments(state.store.as_ref(), &ws, &agent).await?;
    let before = atts.items.len();
    atts.items.retain(|a| a.secret != secret);
    if atts.items.len() == before {
        return Err(ApiError::not_found());
    }
    records::apply(&state, &agent, atts).await?;
    tracing::info!(agent = %agent, secret = %secret, "secret detached");
    Ok(StatusCode::NO_CONTENT.into_response())
}
