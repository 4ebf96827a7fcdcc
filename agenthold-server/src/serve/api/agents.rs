//! `/api/v1/workspaces/{ws}/agents`: agents (a sandbox each) — list (only those the caller may see, with
//! label filters), create (the creator becomes its admin), get, update, delete, start, stop, restart — and
//! their grants (P1, P4, S5).

use std::collections::BTreeMap;

use agenthold_auth::AgentRole;
use agenthold_core::sandbox::{SandboxSpec, SandboxState};
use agenthold_core::{Action, AgentId, AuthzDecision, NetworkPolicy, Resource, UserId, WorkspaceId};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::policy::PolicyBody;
use super::{ApiError, ApiResult, Body, Caller, Params, Problem, created};
use crate::serve::records::{self, AgentMeta};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_agents, create_agent))
        .routes(routes!(get_agent, update_agent, delete_agent))
        .routes(routes!(start_agent))
        .routes(routes!(stop_agent))
        .routes(routes!(restart_agent))
        .routes(routes!(list_grants))
        .routes(routes!(set_grant, remove_grant))
}

/// Most labels an agent may carry.
const MAX_LABELS: usize = 32;

/// An agent.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AgentView {
    /// Agent id.
    id: String,
    /// Its workspace.
    workspace: String,
    /// Its name.
    name: String,
    /// `running`, `stopped`, `creating`, `failed`, or `missing` (the sandbox is gone). In lists, the last
    /// state the server saw; for one agent, the engine's.
    state: String,
    /// Labels.
    labels: BTreeMap<String, String>,
    /// Who created it.
    created_by: String,
    /// When (RFC 3339).
    created_at: String,
    /// The caller's role on it: `admin`, `operator` or `viewer` (so a client shows only the actions the
    /// caller may take).
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<String>,
    /// The image it runs (one agent only).
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    /// Its network policy (one agent only).
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<PolicyBody>,
    /// Its resource limits as created (one agent only; a limit absent inside: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    limits: Option<Limits>,
    /// "Credentials inside sandbox" (S11): a harness credential file that the server did not write is in
    /// the sandbox (a login made inside it); checked when a run or exec ends and every minute.
    credentials_inside: bool,
    /// The paths of those files inside the sandbox (empty unless `credentials_inside`).
    credentials_files: Vec<String>,
    /// The provider login its harness uses, and whose it is (one agent only; the Claude login when it
    /// has both, see `provider_logins`).
    #[serde(skip_serializing_if = "Option::is_none")]
    provider_login: Option<super::provider_logins::AgentLoginView>,
    /// Every provider login it uses, one per provider (one agent only).
    #[serde(skip_serializing_if = "Option::is_none")]
    provider_logins: Option<Vec<super::provider_logins::AgentLoginView>>,
}

/// An agent's resource limits.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Limits {
    /// CPU limit in CPUs.
    cpus: Option<f64>,
    /// Memory limit in bytes.
    memory_bytes: Option<u64>,
    /// Process limit.
    pids: Option<u32>,
}

impl AgentView {
    fn new(meta: AgentMeta, role: Option<AgentRole>) -> Self {
        Self {
            id: meta.id.to_string(),
            workspace: meta.workspace.to_string(),
            name: meta.name,
            state: meta.state,
            labels: meta.labels,
            created_by: meta.created_by.to_string(),
            created_at: meta.created_at,
            role: role.map(|r| agent_role_name(r).to_owned()),
            image: None,
            policy: None,
            limits: None,
            credentials_inside: meta.credentials_inside,
            credentials_files: meta.credentials_files,
            provider_login: None,
            provider_logins: None,
        }
    }
}

/// A page of agents.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AgentList {
    /// Agents the caller may see, by id.
    items: Vec<AgentView>,
    /// Pass as `cursor` for the next page; absent on the last.
    next_cursor: Option<String>,
}

/// `?label=&name=&state=&cursor=&limit=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AgentQuery {
    /// Comma-separated `key=value` pairs; an agent must carry all of them.
    label: Option<String>,
    /// Only agents with exactly this name.
    name: Option<String>,
    /// Only agents in this (last seen) state.
    state: Option<String>,
    /// From a previous page's `next_cursor`.
    cursor: Option<String>,
    /// Agents per page, 1 to 1000 (default 100).
    limit: Option<usize>,
}

/// Memory: bytes, or a string with a unit (`512m`, `2g`, `65536k`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum Memory {
    /// Bytes.
    Bytes(u64),
    /// With a unit suffix k, m or g (powers of 1024).
    Text(String),
}

impl Memory {
    fn bytes(&self) -> ApiResult<u64> {
        match self {
            Self::Bytes(b) => Ok(*b),
            Self::Text(t) => {
                let t = t.trim().to_ascii_lowercase();
                let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
                let n: u64 = digits
                    .parse()
                    .map_err(|_| ApiError::bad_request(format!("memory {t:?} is not a size like 512m")))?;
                let mult: u64 = match unit.trim_end_matches(['b', 'i']) {
                    "" => 1,
                    "k" => 1 << 10,
                    "m" => 1 << 20,
                    "g" => 1 << 30,
                    _ => {
                        return Err(ApiError::bad_request(format!(
                            "memory {t:?}: the unit must be k, m or g"
                        )));
                    }
                };
                n.checked_mul(mult)
                    .ok_or_else(|| ApiError::bad_request(format!("memory {t:?} is too large")))
            }
        }
    }
}

/// `POST …/agents`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateAgent {
    /// 1 to 100 characters, unique in the workspace.
    #[schema(min_length = 1, max_length = 100, example = "builder")]
    name: String,
    /// The image (default `sandbox.image`); it must exist locally.
    image: Option<String>,
    /// The network policy (default open).
    policy: Option<PolicyBody>,
    /// Environment variables.
    env: Option<BTreeMap<String, String>>,
    /// CPU limit in CPUs.
    cpus: Option<f64>,
    /// Memory limit.
    memory: Option<Memory>,
    /// Process limit.
    pids: Option<u32>,
    /// Labels for filtering.
    labels: Option<BTreeMap<String, String>>,
}

/// `PATCH …/agents/{agent}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateAgent {
    /// A new name.
    #[schema(min_length = 1, max_length = 100)]
    name: Option<String>,
    /// New labels (replacing all).
    labels: Option<BTreeMap<String, String>>,
}

/// A grant on an agent.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct GrantView {
    /// The user's id (also `user`).
    id: String,
    /// The user's id.
    user: String,
    /// `admin`, `operator` or `viewer`.
    role: String,
}

/// The grants of an agent.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct GrantList {
    /// Grants by user.
    items: Vec<GrantView>,
}

/// `PUT …/grants/{user}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SetGrant {
    /// `admin`, `operator` or `viewer`.
    #[schema(value_type = RoleOnAgent, example = "operator")]
    role: AgentRole,
}

/// The document's name for [`AgentRole`] (which lives in a crate without OpenAPI types).
#[derive(ToSchema)]
#[schema(rename_all = "snake_case", example = "operator")]
#[allow(dead_code, reason = "only describes AgentRole's serde form in the document")]
pub(crate) enum RoleOnAgent {
    Admin,
    Operator,
    Viewer,
}

/// The text form of an agent role.
pub(crate) fn agent_role_name(role: AgentRole) -> &'static str {
    match role {
        AgentRole::Admin => "admin",
        AgentRole::Operator => "operator",
        AgentRole::Viewer => "viewer",
    }
}

fn check_name(name: &str) -> ApiResult<()> {
    if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "name must be 1 to 100 characters without control characters",
        ));
    }
    Ok(())
}

fn check_labels(labels: &BTreeMap<String, String>) -> ApiResult<()> {
    if labels.len() > MAX_LABELS {
        return Err(ApiError::bad_request(format!("at most {MAX_LABELS} labels")));
    }
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= 63
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
        if !key_ok {
            return Err(ApiError::bad_request(format!(
                "label key {k:?} must be 1 to 63 characters of a-z, A-Z, 0-9, '.', '_', '-', '/'"
            )));
        }
        if v.len() > 253 || v.chars().any(char::is_control) || v.contains(',') {
            return Err(ApiError::bad_request(format!(
                "label {k}: the value must be at most 253 characters, without control characters or ','"
            )));
        }
    }
    Ok(())
}

/// The caller's meta of an agent after checking `action` on it; 404 when it has no record.
pub(crate) async fn agent_meta(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    agent: &str,
    action: Action,
) -> ApiResult<(WorkspaceId, AgentId, AgentMeta)> {
    let (ws, agent) = caller.agent(state, ws, agent, action).await?;
    let meta = records::load(state.store.as_ref(), &agent)
        .await?
        .filter(|m| m.workspace == ws)
        .ok_or_else(ApiError::not_found)?;
    Ok((ws, agent, meta))
}

/// Ask the engine for an agent's state and remember it.
async fn live_state(state: &AppState, meta: &mut AgentMeta) {
    let seen = match state.runtime.inspect(&meta.id).await {
        Ok(info) => match info.state {
            SandboxState::Running => "running",
            SandboxState::Stopped => "stopped",
        },
        Err(e) if e.kind() == agenthold_core::ErrorKind::NotFound => "missing",
        Err(e) => {
            tracing::warn!(agent = %meta.id, error = %e, "inspect failed");
            return;
        }
    };
    if meta.state != seen && meta.state != "creating" {
        records::set_state(state.store.as_ref(), &meta.id, seen).await;
    }
    seen.clone_into(&mut meta.state);
}

async fn full_view(
    state: &AppState,
    caller: &Caller,
    ws: &WorkspaceId,
    mut meta: AgentMeta,
) -> ApiResult<AgentView> {
    live_state(state, &mut meta).await;
    let role = state.dir.agent_role(ws, &meta.id, caller.user()).await?;
    let agent = meta.id.clone();
    let mut view = AgentView::new(meta, role);
    if let Ok(info) = state.runtime.inspect(&agent).await {
        view.image = Some(info.image);
    }
    if let Ok(policy) = state.runtime.policy(&agent).await {
        view.policy = Some(PolicyBody::from(&policy));
    }
    if let Ok(spec) = state.runtime.spec(&agent).await {
        view.limits = Some(Limits {
            cpus: spec.cpus,
            memory_bytes: spec.memory_bytes,
            pids: spec.pids,
        });
    }
    let logins = super::provider_logins::agent_logins(state, &agent).await?;
    view.provider_login = logins.first().cloned();
    view.provider_logins = Some(logins);
    Ok(view)
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents", tag = "agents",
    params(("ws" = String, Path), AgentQuery),
    responses((status = 200, body = AgentList), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("member"))))]
async fn list_agents(
    State(state): State<AppState>,
    caller: Caller,
    Path(ws): Path<String>,
    Params(q): Params<AgentQuery>,
) -> ApiResult<Json<AgentList>> {
    let ws = caller.workspace(&state, &ws, Action::View).await?;
    let limit = match q.limit {
        None => 100,
        Some(n @ 1..=1000) => n,
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "limit must be 1 to 1000, found {n}"
            )));
        }
    };
    let mut wanted = BTreeMap::new();
    for pair in q
        .label
        .as_deref()
        .unwrap_or("")
        .split(',')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| ApiError::bad_request(format!("label filter {pair:?} must be key=value")))?;
        wanted.insert(k.to_owned(), v.to_owned());
    }
    let mut agents = state.dir.agents_in(&ws).await?;
    agents.sort();
    if let Some(cursor) = &q.cursor {
        agents.retain(|a| a.as_str() > cursor.as_str());
    }
    let mut items = Vec::new();
    let mut next_cursor = None;
    for agent in agents {
        let on = Resource::Agent {
            workspace: ws.clone(),
            agent: agent.clone(),
        };
        if state.authz.check(&caller.principal, Action::View, &on).await? != AuthzDecision::Allow {
            continue;
        }
        let Some(meta) = records::load(state.store.as_ref(), &agent).await? else {
            continue;
        };
        let matches = wanted.iter().all(|(k, v)| meta.labels.get(k) == Some(v))
            && q.name.as_ref().is_none_or(|n| *n == meta.name)
            && q.state.as_ref().is_none_or(|s| *s == meta.state);
        if !matches {
            continue;
        }
        if items.len() == limit {
            next_cursor = items.last().map(|v: &AgentView| v.id.clone());
            break;
        }
        // The caller's role, so a list shows only the actions the caller may take (the web UI's quick actions).
        let role = state.dir.agent_role(&ws, &agent, caller.user()).await?;
        items.push(AgentView::new(meta, role));
    }
    Ok(Json(AgentList { items, next_cursor }))
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/agents", tag = "agents", request_body = CreateAgent,
    params(("ws" = String, Path)),
    responses((status = 201, body = AgentView), (status = 400, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "the name is taken in this workspace")),
    extensions(("x-agenthold-role" = json!("member"))))]
async fn create_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path(ws): Path<String>,
    Body(body): Body<CreateAgent>,
) -> ApiResult<Response> {
    let ws = caller.workspace(&state, &ws, Action::CreateAgent).await?;
    check_name(&body.name)?;
    let labels = body.labels.unwrap_or_default();
    check_labels(&labels)?;
    let policy = match &body.policy {
        Some(p) => p.parse()?,
        None => NetworkPolicy::open(),
    };
    let memory_bytes = body.memory.as_ref().map(Memory::bytes).transpose()?;
    let named_image = body.image.is_some();
    let spec = SandboxSpec {
        image: body.image.unwrap_or_else(|| state.config.sandbox.image.clone()),
        env: body.env.unwrap_or_default(),
        cpus: body.cpus,
        memory_bytes,
        pids: body.pids,
        policy,
        ..SandboxSpec::default()
    };
    // Check the spec before anything is recorded, so bad input changes nothing.
    spec.clone().split()?;
    // The engine refuses more CPUs than the host has only when it creates the container.
    if let (Some(cpus), Ok(host)) = (spec.cpus, std::thread::available_parallelism()) {
        let host = u32::try_from(host.get()).unwrap_or(u32::MAX);
        if cpus > f64::from(host) {
            return Err(ApiError::bad_request(format!(
                "cpus {cpus}: this host has {host} CPUs"
            )));
        }
    }
    let taken = records::load_many(state.store.as_ref(), &state.dir.agents_in(&ws).await?)
        .await?
        .into_iter()
        .any(|m| m.name == body.name);
    if taken {
        return Err(ApiError::conflict(format!(
            "an agent named {:?} exists in this workspace",
            body.name
        )));
    }
    let agent = AgentId::random();
    let mut meta = AgentMeta {
        id: agent.clone(),
        workspace: ws.clone(),
        name: body.name,
        labels,
        created_by: caller.user().clone(),
        created_at: records::now_rfc3339(),
        state: "creating".into(),
        credentials_inside: false,
        credentials_files: Vec::new(),
    };
    // The record first: a crash during the engine's work leaves a visible agent that can be deleted, never
    // an invisible container.
    records::save(state.store.as_ref(), &meta).await?;
    state.dir.register_agent(&ws, &agent, caller.user()).await?;
    match state.runtime.create_sandbox_with_id(&agent, spec).await {
        Ok(_) => {
            meta.state = "running".into();
            records::save(state.store.as_ref(), &meta).await?;
        }
        Err(e) => {
            let _ = state.dir.unregister_agent(&ws, &agent).await;
            let _ = records::delete(state.store.as_ref(), &agent).await;
            // An image the caller named that the engine lacks is the caller's mistake, not an outage.
            if named_image && e.kind() == agenthold_core::ErrorKind::Unavailable {
                return Err(ApiError::bad_request(e.to_string()));
            }
            return Err(e.into());
        }
    }
    let view = full_view(&state, &caller, &ws, meta).await?;
    Ok(created(view))
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}", tag = "agents",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = AgentView), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn get_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
) -> ApiResult<Json<AgentView>> {
    let (ws, _, meta) = agent_meta(&state, &caller, &ws, &agent, Action::View).await?;
    Ok(Json(full_view(&state, &caller, &ws, meta).await?))
}

#[utoipa::path(patch, path = "/api/v1/workspaces/{ws}/agents/{agent}", tag = "agents", request_body = UpdateAgent,
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = AgentView), (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn update_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Body(body): Body<UpdateAgent>,
) -> ApiResult<Json<AgentView>> {
    let (ws, agent, mut meta) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    if let Some(name) = body.name {
        check_name(&name)?;
        let taken = records::load_many(state.store.as_ref(), &state.dir.agents_in(&ws).await?)
            .await?
            .into_iter()
            .any(|m| m.name == name && m.id != agent);
        if taken {
            return Err(ApiError::conflict(format!(
                "an agent named {name:?} exists in this workspace"
            )));
        }
        meta.name = name;
    }
    if let Some(labels) = body.labels {
        check_labels(&labels)?;
        meta.labels = labels;
    }
    records::save(state.store.as_ref(), &meta).await?;
    Ok(Json(full_view(&state, &caller, &ws, meta).await?))
}

#[utoipa::path(delete, path = "/api/v1/workspaces/{ws}/agents/{agent}", tag = "agents",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn delete_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
) -> ApiResult<Response> {
    let (ws, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    match state.runtime.remove(&agent).await {
        Ok(()) => {}
        Err(e) if e.kind() == agenthold_core::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    state.dir.unregister_agent(&ws, &agent).await?;
    records::delete(state.store.as_ref(), &agent).await?;
    crate::serve::secrets::forget_agent(state.store.as_ref(), &agent).await;
    crate::serve::webhooks::forget_agent(&state, &agent).await;
    crate::serve::harness_logins::forget_agent(&state, &agent).await;
    state.agents_gone.fire(&agent);
    state.execs.forget_agent(&agent).await?;
    state.runs.forget_agent(&agent).await?;
    crate::serve::messages::store::forget_agent(state.store.as_ref(), &agent).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Start, stop or restart, then answer with the agent.
async fn lifecycle(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    agent: &str,
    op: &str,
) -> ApiResult<Json<AgentView>> {
    let (ws, agent, meta) = agent_meta(state, caller, ws, agent, Action::Operate).await?;
    match op {
        "start" => state.runtime.start(&agent).await?,
        "stop" => state.runtime.stop(&agent).await?,
        _ => {
            state.runtime.stop(&agent).await?;
            state.runtime.start(&agent).await?;
        }
    }
    Ok(Json(full_view(state, caller, &ws, meta).await?))
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/agents/{agent}/start", tag = "agents",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = AgentView), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("operator"))))]
async fn start_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
) -> ApiResult<Json<AgentView>> {
    lifecycle(&state, &caller, &ws, &agent, "start").await
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/agents/{agent}/stop", tag = "agents",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = AgentView), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("operator"))))]
async fn stop_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
) -> ApiResult<Json<AgentView>> {
    lifecycle(&state, &caller, &ws, &agent, "stop").await
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/agents/{agent}/restart", tag = "agents",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = AgentView), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("operator"))))]
async fn restart_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
) -> ApiResult<Json<AgentView>> {
    lifecycle(&state, &caller, &ws, &agent, "restart").await
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/grants", tag = "grants",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = GrantList), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn list_grants(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
) -> ApiResult<Json<GrantList>> {
    let (ws, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    let items = state
        .dir
        .grants(&ws, &agent)
        .await?
        .into_iter()
        .map(|g| GrantView {
            id: g.user.to_string(),
            user: g.user.to_string(),
            role: agent_role_name(g.role).to_owned(),
        })
        .collect();
    Ok(Json(GrantList { items }))
}

#[utoipa::path(put, path = "/api/v1/workspaces/{ws}/agents/{agent}/grants/{user}", tag = "grants", request_body = SetGrant,
    params(("ws" = String, Path), ("agent" = String, Path), ("user" = String, Path)),
    responses((status = 200, body = GrantView, description = "changed"), (status = 201, body = GrantView, description = "granted"),
        (status = 403, body = Problem), (status = 404, body = Problem, description = "no such agent, or the user is not a member")),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn set_grant(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, user)): Path<(String, String, String)>,
    Body(body): Body<SetGrant>,
) -> ApiResult<Response> {
    let (ws, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    let user = UserId::new(user).map_err(|_| ApiError::not_found())?;
    let added = state.dir.set_grant(&ws, &agent, &user, body.role).await?;
    // A lowered grant may end the user's admin rights: their provider login goes (S3).
    crate::serve::harness_logins::recheck(&state, Some(&ws)).await;
    let view = GrantView {
        id: user.to_string(),
        user: user.to_string(),
        role: agent_role_name(body.role).to_owned(),
    };
    let status = if added {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view)).into_response())
}

#[utoipa::path(delete, path = "/api/v1/workspaces/{ws}/agents/{agent}/grants/{user}", tag = "grants",
    params(("ws" = String, Path), ("agent" = String, Path), ("user" = String, Path)),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn remove_grant(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, user)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    let (ws, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    let user = UserId::new(user).map_err(|_| ApiError::not_found())?;
    if !state.dir.remove_grant(&ws, &agent, &user).await? {
        return Err(ApiError::not_found());
    }
    crate::serve::harness_logins::recheck(&state, Some(&ws)).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}
