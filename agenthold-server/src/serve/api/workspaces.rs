//! `/api/v1/workspaces`: workspaces (the creator becomes owner), their members and audit log (P4).
//! Any member sees the workspace and its members; admins manage members; only owners delete the
//! workspace or make and unmake owners. Members can be added before their first login (`POST …/members`,
//! by email or by provider and subject): such a pending member is listed with `pending: true` and an id
//! `inv_…`, which `DELETE …/members/{id}` also takes.

use agenthold_auth::{
    AuditEntry, Membership, NewPendingMember, PENDING_PREFIX, PendingMember, Workspace, WorkspaceRole,
};
use agenthold_core::{Action, Resource, UserId};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, ApiResult, Body, Caller, Params, Problem, created};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_workspaces, create_workspace))
        .routes(routes!(get_workspace, rename_workspace, delete_workspace))
        .routes(routes!(list_members, invite_member))
        .routes(routes!(set_member, remove_member))
        .routes(routes!(audit_log))
}

/// A workspace as the caller sees it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WorkspaceView {
    /// Workspace id.
    id: String,
    /// Its name.
    name: String,
    /// Creation time (RFC 3339).
    created_at: String,
    /// The caller's role in it.
    role: String,
}

impl WorkspaceView {
    fn new(w: Workspace, role: WorkspaceRole) -> Self {
        Self {
            id: w.id.to_string(),
            name: w.name,
            created_at: w.created_at,
            role: role_name(role),
        }
    }
}

/// A list of workspaces.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WorkspaceList {
    /// The caller's workspaces.
    items: Vec<WorkspaceView>,
}

/// `POST /api/v1/workspaces` and `PATCH /api/v1/workspaces/{ws}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkspaceName {
    /// 1 to 100 characters.
    #[schema(min_length = 1, max_length = 100, example = "team")]
    name: String,
}

/// A member of a workspace, or a pending one (invited, not logged in yet).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MemberView {
    /// The member's user id (also `user`); for a pending member the invitation's id (`inv_…`).
    id: String,
    /// The member's user id (absent for a pending member).
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    /// Their display name (a pending member's email, or provider:subject).
    name: String,
    /// `owner`, `admin` or `member`.
    role: String,
    /// Whether this is an invitation that binds at the person's first login.
    pending: bool,
    /// A pending member's email address.
    #[serde(skip_serializing_if = "Option::is_none")]
    email: Option<String>,
    /// A pending member's login provider (`oidc`, `github`).
    #[serde(skip_serializing_if = "Option::is_none")]
    provider: Option<String>,
    /// A pending member's subject at that provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<String>,
}

impl MemberView {
    fn member(user: &UserId, name: String, role: WorkspaceRole) -> Self {
        Self {
            id: user.to_string(),
            user: Some(user.to_string()),
            name,
            role: role_name(role),
            pending: false,
            email: None,
            provider: None,
            subject: None,
        }
    }

    fn pending(p: PendingMember) -> Self {
        let name = match (&p.email, &p.provider, &p.subject) {
            (Some(e), _, _) => e.clone(),
            (None, Some(pr), Some(s)) => format!("{pr}:{s}"),
            _ => String::new(),
        };
        Self {
            id: p.id,
            user: None,
            name,
            role: role_name(p.role),
            pending: true,
            email: p.email,
            provider: p.provider,
            subject: p.subject,
        }
    }
}

/// `POST /api/v1/workspaces/{ws}/members`: add someone before their first login, by email (bound when a
/// provider says that address is verified) or by provider and subject (or both).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"email": "grace@example.com", "role": "member"}))]
pub(crate) struct Invite {
    /// Email address (case-insensitive).
    email: Option<String>,
    /// Login provider: `oidc` or `github` (with `subject`).
    provider: Option<String>,
    /// The provider's subject: the OIDC `sub`, or GitHub's numeric user id.
    subject: Option<String>,
    /// `owner`, `admin` or `member`.
    #[schema(value_type = RoleInWorkspace, example = "member")]
    role: WorkspaceRole,
}

/// A list of members.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MemberList {
    /// Members, by user id.
    items: Vec<MemberView>,
}

/// `PUT /api/v1/workspaces/{ws}/members/{user}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SetRole {
    /// `owner`, `admin` or `member`.
    #[schema(value_type = RoleInWorkspace, example = "member")]
    role: WorkspaceRole,
}

/// The document's name for [`WorkspaceRole`] (which lives in a crate without OpenAPI types).
#[derive(ToSchema)]
#[schema(rename_all = "snake_case", example = "member")]
#[allow(
    dead_code,
    reason = "only describes WorkspaceRole's serde form in the document"
)]
pub(crate) enum RoleInWorkspace {
    Owner,
    Admin,
    Member,
}

/// One audit log entry.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AuditView {
    /// Entry id (also the cursor).
    id: String,
    /// When (RFC 3339).
    time: String,
    /// Who (user id), if known.
    actor: Option<String>,
    /// How they authenticated: `session` or `token`.
    credential: Option<String>,
    /// Method and route (`PUT /api/v1/workspaces/{ws}/members/{user}`), or a named action.
    action: String,
    /// The concrete path or object acted on.
    target: String,
    /// `ok`, `denied` or `failed`.
    result: String,
    /// Why it was denied or failed.
    reason: Option<String>,
}

impl From<AuditEntry> for AuditView {
    fn from(e: AuditEntry) -> Self {
        Self {
            id: e.id,
            time: e.time,
            actor: e.actor.map(|u| u.to_string()),
            credential: e.credential.map(|c| match c {
                agenthold_core::Credential::Session => "session".to_owned(),
                agenthold_core::Credential::Token => "token".to_owned(),
            }),
            action: e.action,
            target: e.target,
            result: e.result,
            reason: e.reason,
        }
    }
}

/// A page of the audit log, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AuditPage {
    /// Entries.
    items: Vec<AuditView>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    next_cursor: Option<String>,
}

/// `?cursor=&limit=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// From a previous page's `next_cursor`.
    cursor: Option<String>,
    /// Entries per page, 1 to 500 (default 100).
    limit: Option<usize>,
}

/// The text form of a workspace role.
pub(crate) fn role_name(role: WorkspaceRole) -> String {
    match role {
        WorkspaceRole::Owner => "owner",
        WorkspaceRole::Admin => "admin",
        WorkspaceRole::Member => "member",
    }
    .to_owned()
}

/// Check a page size.
pub(crate) fn page_limit(limit: Option<usize>) -> ApiResult<usize> {
    match limit {
        None => Ok(100),
        Some(n @ 1..=500) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "limit must be 1 to 500, found {n}"
        ))),
    }
}

#[utoipa::path(get, path = "/api/v1/workspaces", tag = "workspaces",
    responses((status = 200, body = WorkspaceList)),
    extensions(("x-agenthold-role" = json!("self"))))]
async fn list_workspaces(State(state): State<AppState>, caller: Caller) -> ApiResult<Json<WorkspaceList>> {
    caller.require(&state, Action::View, &Resource::Account).await?;
    let items = state
        .dir
        .workspaces_of(caller.user())
        .await?
        .into_iter()
        .map(|(w, r)| WorkspaceView::new(w, r))
        .collect();
    Ok(Json(WorkspaceList { items }))
}

#[utoipa::path(post, path = "/api/v1/workspaces", tag = "workspaces", request_body = WorkspaceName,
    responses((status = 201, body = WorkspaceView), (status = 400, body = Problem)),
    extensions(("x-agenthold-role" = json!("self"))))]
async fn create_workspace(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<WorkspaceName>,
) -> ApiResult<Response> {
    caller.require(&state, Action::View, &Resource::Account).await?;
    let ws = state.dir.create_workspace(&body.name, caller.user()).await?;
    state
        .audit(
            &ws.id,
            Some((caller.user(), caller.principal.credential)),
            "POST /api/v1/workspaces".into(),
            format!("/api/v1/workspaces/{}", ws.id),
            "ok",
            None,
        )
        .await;
    Ok(created(WorkspaceView::new(ws, WorkspaceRole::Owner)))
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}", tag = "workspaces",
    params(("ws" = String, Path)),
    responses((status = 200, body = WorkspaceView), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("member"))))]
async fn get_workspace(
    State(state): State<AppState>,
    caller: Caller,
    Path(ws): Path<String>,
) -> ApiResult<Json<WorkspaceView>> {
    let ws = caller.workspace(&state, &ws, Action::View).await?;
    let found = state.dir.workspace(&ws).await?.ok_or_else(ApiError::not_found)?;
    let role = state
        .dir
        .member_role(&ws, caller.user())
        .await?
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(WorkspaceView::new(found, role)))
}

#[utoipa::path(patch, path = "/api/v1/workspaces/{ws}", tag = "workspaces", request_body = WorkspaceName,
    params(("ws" = String, Path)),
    responses((status = 200, body = WorkspaceView), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("workspace_admin"))))]
async fn rename_workspace(
    State(state): State<AppState>,
    caller: Caller,
    Path(ws): Path<String>,
    Body(body): Body<WorkspaceName>,
) -> ApiResult<Json<WorkspaceView>> {
    let ws = caller.workspace(&state, &ws, Action::Administer).await?;
    let renamed = state.dir.rename_workspace(&ws, &body.name).await?;
    let role = state
        .dir
        .member_role(&ws, caller.user())
        .await?
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(WorkspaceView::new(renamed, role)))
}

#[utoipa::path(delete, path = "/api/v1/workspaces/{ws}", tag = "workspaces",
    params(("ws" = String, Path)),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "the workspace still has agents")),
    extensions(("x-agenthold-role" = json!("owner"))))]
async fn delete_workspace(
    State(state): State<AppState>,
    caller: Caller,
    Path(ws): Path<String>,
) -> ApiResult<Response> {
    let ws = caller.workspace(&state, &ws, Action::Own).await?;
    let agents = state.dir.agents_in(&ws).await?;
    if !agents.is_empty() {
        return Err(ApiError::conflict(format!(
            "the workspace still has {} agent(s); delete them first",
            agents.len()
        )));
    }
    crate::serve::secrets::forget_workspace(state.store.as_ref(), &ws).await?;
    state.dir.delete_workspace(&ws).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/members", tag = "members",
    params(("ws" = String, Path)),
    responses((status = 200, body = MemberList), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("member"))))]
async fn list_members(
    State(state): State<AppState>,
    caller: Caller,
    Path(ws): Path<String>,
) -> ApiResult<Json<MemberList>> {
    let ws = caller.workspace(&state, &ws, Action::View).await?;
    let mut items = Vec::new();
    for Membership { user, role, .. } in state.dir.members(&ws).await? {
        let name = state.dir.user(&user).await?.map(|u| u.name).unwrap_or_default();
        items.push(MemberView::member(&user, name, role));
    }
    items.extend(
        state
            .dir
            .pending_members(&ws)
            .await?
            .into_iter()
            .map(MemberView::pending),
    );
    Ok(Json(MemberList { items }))
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/members", tag = "members", request_body = Invite,
    params(("ws" = String, Path)),
    responses((status = 201, body = MemberView, description = "invited (pending), or added when that provider subject already has a user"),
        (status = 200, body = MemberView, description = "the same person was already invited: the role is updated"),
        (status = 400, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("workspace_admin"))))]
async fn invite_member(
    State(state): State<AppState>,
    caller: Caller,
    Path(ws): Path<String>,
    Body(body): Body<Invite>,
) -> ApiResult<Response> {
    let ws = caller.workspace(&state, &ws, Action::Administer).await?;
    if body.role == WorkspaceRole::Owner {
        caller
            .require(&state, Action::Own, &Resource::Workspace(ws.clone()))
            .await?;
    }
    // Someone who already logged in through that provider is made a member at once.
    if let (Some(provider), Some(subject)) = (&body.provider, &body.subject)
        && let Some(user) = state.dir.user_by_subject(provider, subject).await?
        && provider != "local"
    {
        let current = state.dir.member_role(&ws, &user.id).await?;
        if current == Some(WorkspaceRole::Owner) {
            caller
                .require(&state, Action::Own, &Resource::Workspace(ws.clone()))
                .await?;
        }
        let added = state.dir.set_member(&ws, &user.id, body.role).await?;
        let status = if added {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        return Ok((status, Json(MemberView::member(&user.id, user.name, body.role))).into_response());
    }
    let new = NewPendingMember {
        email: body.email,
        provider: body.provider,
        subject: body.subject,
        role: body.role,
    };
    let (pending, created) = state.dir.add_pending_member(&ws, new, caller.user()).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(MemberView::pending(pending))).into_response())
}

#[utoipa::path(put, path = "/api/v1/workspaces/{ws}/members/{user}", tag = "members", request_body = SetRole,
    params(("ws" = String, Path), ("user" = String, Path)),
    responses((status = 200, body = MemberView, description = "role changed"), (status = 201, body = MemberView, description = "member added"),
        (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    extensions(("x-agenthold-role" = json!("workspace_admin"))))]
async fn set_member(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, user)): Path<(String, String)>,
    Body(body): Body<SetRole>,
) -> ApiResult<Response> {
    let ws = caller.workspace(&state, &ws, Action::Administer).await?;
    let user = UserId::new(user).map_err(|_| ApiError::not_found())?;
    let found = state.dir.user(&user).await?.ok_or_else(ApiError::not_found)?;
    let current = state.dir.member_role(&ws, &user).await?;
    // Making or unmaking an owner is the owners' call.
    if body.role == WorkspaceRole::Owner || current == Some(WorkspaceRole::Owner) {
        caller
            .require(&state, Action::Own, &Resource::Workspace(ws.clone()))
            .await?;
    }
    let added = state.dir.set_member(&ws, &user, body.role).await?;
    // A lower role may end admin rights on agents: their provider logins go (S3).
    crate::serve::harness_logins::recheck(&state, Some(&ws)).await;
    let view = MemberView::member(&user, found.name, body.role);
    let status = if added {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view)).into_response())
}

#[utoipa::path(delete, path = "/api/v1/workspaces/{ws}/members/{user}", tag = "members",
    params(("ws" = String, Path), ("user" = String, Path, description = "a member's user id, or a pending member's id (`inv_…`)")),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    extensions(("x-agenthold-role" = json!("workspace_admin"))))]
async fn remove_member(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, user)): Path<(String, String)>,
) -> ApiResult<Response> {
    let ws = caller.workspace(&state, &ws, Action::Administer).await?;
    // A pending member (invitation) by its `inv_…` id.
    if user.starts_with(PENDING_PREFIX) {
        let pending = state.dir.pending_members(&ws).await?;
        let found = pending
            .iter()
            .find(|p| p.id == user)
            .ok_or_else(ApiError::not_found)?;
        if found.role == WorkspaceRole::Owner {
            caller
                .require(&state, Action::Own, &Resource::Workspace(ws.clone()))
                .await?;
        }
        state.dir.remove_pending_member(&ws, &user).await?;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let user = UserId::new(user).map_err(|_| ApiError::not_found())?;
    match state.dir.member_role(&ws, &user).await? {
        None => return Err(ApiError::not_found()),
        Some(WorkspaceRole::Owner) => {
            caller
                .require(&state, Action::Own, &Resource::Workspace(ws.clone()))
                .await?;
        }
        Some(_) => {}
    }
    state.dir.remove_member(&ws, &user).await?;
    // Their provider logins leave the workspace's agents with them (S3).
    crate::serve::harness_logins::recheck(&state, Some(&ws)).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/audit", tag = "audit",
    params(("ws" = String, Path), PageQuery),
    responses((status = 200, body = AuditPage), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("workspace_admin"))))]
async fn audit_log(
    State(state): State<AppState>,
    caller: Caller,
    Path(ws): Path<String>,
    Params(q): Params<PageQuery>,
) -> ApiResult<Json<AuditPage>> {
    let ws = caller.workspace(&state, &ws, Action::Administer).await?;
    let limit = page_limit(q.limit)?;
    let (items, next_cursor) = state.dir.audit_page(&ws, q.cursor.as_deref(), limit).await?;
    Ok(Json(AuditPage {
        items: items.into_iter().map(AuditView::from).collect(),
        next_cursor,
    }))
}
