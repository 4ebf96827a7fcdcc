//! `…/agents/{agent}/network-policy`: read (viewer) and replace (agent admin) an agent's network policy; a
//! replacement applies to new connections and DNS queries at once (E8).
// enforces: E8

use agenthold_core::policy::PolicyMode;
use agenthold_core::{Action, NetworkPolicy};
use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::agents::agent_meta;
use super::{ApiError, ApiResult, Body, Caller, Problem};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_policy, put_policy))
}

/// A network policy: `open` (any public destination) or `allowlist` with entries such as `github.com`,
/// `*.npmjs.org`, `github.com:22`, `host:*`, `203.0.113.0/24:443`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyBody {
    /// `open` or `allowlist`.
    #[schema(example = "allowlist")]
    pub(crate) mode: String,
    /// Allowlist entries (ignored in `open` mode).
    #[serde(default)]
    #[schema(example = json!(["example.com"]))]
    pub(crate) entries: Vec<String>,
}

impl PolicyBody {
    /// The core policy; a bad mode or entry is a 400 naming it.
    pub(crate) fn parse(&self) -> ApiResult<NetworkPolicy> {
        let mode = match self.mode.as_str() {
            "open" => PolicyMode::Open,
            "allowlist" => PolicyMode::Allowlist,
            other => {
                return Err(ApiError::bad_request(format!(
                    "policy mode must be open or allowlist, found {other:?}"
                )));
            }
        };
        if self.entries.len() > 4096 {
            return Err(ApiError::bad_request("a policy holds at most 4096 entries"));
        }
        NetworkPolicy::parse(mode, &self.entries).map_err(|e| ApiError::bad_request(e.to_string()))
    }
}

impl From<&NetworkPolicy> for PolicyBody {
    fn from(p: &NetworkPolicy) -> Self {
        // The core type's serde form is exactly this shape.
        serde_json::to_value(p)
            .ok()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or(Self {
                mode: "allowlist".into(),
                entries: Vec::new(),
            })
    }
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/network-policy", tag = "network policy",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = PolicyBody), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn get_policy(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
) -> ApiResult<Json<PolicyBody>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::View).await?;
    let policy = state.runtime.policy(&agent).await?;
    Ok(Json(PolicyBody::from(&policy)))
}

#[utoipa::path(put, path = "/api/v1/workspaces/{ws}/agents/{agent}/network-policy", tag = "network policy",
    request_body = PolicyBody,
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = PolicyBody), (status = 400, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn put_policy(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Body(body): Body<PolicyBody>,
) -> ApiResult<Json<PolicyBody>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    let policy = body.parse()?;
    let _edits = state.edits.lock().await;
    state.runtime.set_policy(&agent, policy.clone()).await?;
    Ok(Json(PolicyBody::from(&policy)))
}
