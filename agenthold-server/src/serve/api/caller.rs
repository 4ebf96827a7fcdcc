//! Who is calling: the [`Caller`] extractor authenticates a request by its personal token
//! (`Authorization: Bearer ahp_…`) or its session cookie, applies the rate limits (S13), and asks
//! [`Authz`](agenthold_core::Authz) before a handler acts (S5). Ids in paths that are not valid ids answer
//! 404 like ids that do not exist.
// enforces: S5, S7, S13

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

use agenthold_core::{Action, AgentId, AuthzDecision, Principal, Resource, UserId, WorkspaceId};
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::request::Parts;
use sha2::{Digest, Sha256};

use super::error::{ApiError, ApiResult};
use crate::serve::state::AppState;

/// An authenticated caller.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The user and how they authenticated.
    pub(crate) principal: Principal,
}

/// Where the [`Caller`] extractor leaves the principal for the audit middleware, which runs around the
/// handler and cannot see its arguments.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallerSlot(pub(crate) Arc<OnceLock<Principal>>);

impl Caller {
    /// The calling user.
    pub(crate) fn user(&self) -> &UserId {
        &self.principal.user
    }

    /// Ask authz; NotFound → 404, Forbidden → 403.
    pub(crate) async fn require(&self, state: &AppState, action: Action, on: &Resource) -> ApiResult<()> {
        match state.authz.check(&self.principal, action, on).await? {
            AuthzDecision::Allow => Ok(()),
            AuthzDecision::NotFound => Err(ApiError::not_found()),
            AuthzDecision::Forbidden => Err(ApiError::forbidden(match action {
                Action::CreateToken => "personal tokens are created only from a browser session",
                Action::Own => "this needs the workspace's owner role",
                Action::Administer => "this needs the admin role",
                Action::Operate => "this needs the operator role",
                _ => "your role does not allow this",
            })),
        }
    }

    /// The workspace named in a path, after checking `action` on it.
    pub(crate) async fn workspace(
        &self,
        state: &AppState,
        ws: &str,
        action: Action,
    ) -> ApiResult<WorkspaceId> {
        let ws = WorkspaceId::new(ws).map_err(|_| ApiError::not_found())?;
        self.require(state, action, &Resource::Workspace(ws.clone()))
            .await?;
        Ok(ws)
    }

    /// The workspace and agent named in a path, after checking `action` on the agent.
    pub(crate) async fn agent(
        &self,
        state: &AppState,
        ws: &str,
        agent: &str,
        action: Action,
    ) -> ApiResult<(WorkspaceId, AgentId)> {
        let ws = WorkspaceId::new(ws).map_err(|_| ApiError::not_found())?;
        let agent = AgentId::new(agent).map_err(|_| ApiError::not_found())?;
        let on = Resource::Agent {
            workspace: ws.clone(),
            agent: agent.clone(),
        };
        self.require(state, action, &on).await?;
        Ok((ws, agent))
    }
}

/// The presented bearer token, if the request has an `Authorization: Bearer` header.
fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The value of cookie `name`, if present.
pub(crate) fn cookie<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts
        .headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(k, v)| (k == name).then_some(v))
}

/// The client's address (for the unauthenticated rate limit).
fn client_address(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// Count a request that carried no valid credentials against its address; 429 once over the limit.
fn limit_unauthenticated(state: &AppState, parts: &Parts) -> ApiResult<()> {
    if let Some(ip) = client_address(parts) {
        state.limits.check_address(ip).map_err(ApiError::rate_limited)?;
    }
    Ok(())
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Self> {
        let principal = if let Some(token) = bearer(parts) {
            let found = state.dir.authenticate_token(token).await?;
            let Some(principal) = found else {
                limit_unauthenticated(state, parts)?;
                return Err(ApiError::unauthorized());
            };
            // Keyed by the token's hash: the limiter never holds a usable token.
            let key = hex::encode(Sha256::digest(token.as_bytes()));
            state.limits.check_token(&key).map_err(ApiError::rate_limited)?;
            principal
        } else if let Some(value) = cookie(parts, state.session_cookie()) {
            let found = state.dir.authenticate_session(value).await?;
            let Some(principal) = found else {
                limit_unauthenticated(state, parts)?;
                return Err(ApiError::unauthorized());
            };
            principal
        } else {
            limit_unauthenticated(state, parts)?;
            return Err(ApiError::unauthorized());
        };
        state
            .limits
            .check_user(&principal.user)
            .map_err(ApiError::rate_limited)?;
        if let Some(slot) = parts.extensions.get::<CallerSlot>() {
            let _ = slot.0.set(principal.clone());
        }
        Ok(Self { principal })
    }
}
