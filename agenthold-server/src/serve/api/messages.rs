//! `GET /api/v1/workspaces/{ws}/agents/{agent}/messages` (viewer): the agent-to-agent messages an agent
//! sent and received (P3), newest first, started or refused, as kept by [`crate::serve::messages::store`].
//! Messages are sent from inside a sandbox (`agenthold-send`), never through this API.

use agenthold_core::Action;
use axum::Json;
use axum::extract::{Path, State};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::agents::agent_meta;
use super::{ApiResult, Caller, Problem};
use crate::serve::messages::store::{self, Message};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_messages))
}

/// An agent's messages.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MessageList {
    /// Sent and received messages, newest first (at most 200 are kept per agent).
    items: Vec<Message>,
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/messages", tag = "agents",
    description = "Agent-to-agent messages this agent sent (`direction: sent`) and received (`received`), \
                   started or refused, newest first. An agent sends with `agenthold-send AGENT_NAME PROMPT` \
                   inside its sandbox; see docs/server.md, \"Agent-to-agent messages\".",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = MessageList), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn list_messages(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
) -> ApiResult<Json<MessageList>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::View).await?;
    let items = store::list(state.store.as_ref(), &agent).await?;
    Ok(Json(MessageList { items }))
}
