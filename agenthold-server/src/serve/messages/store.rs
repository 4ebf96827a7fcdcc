//! The kept agent messages (table `srv_agent_messages`, JSON, key `<agent>/<message id>`): each message is
//! written once on the sender's side (`sent`) and, when the target is known, once on the target's
//! (`received`). Ids start with the time, so a prefix scan gives an agent's messages oldest first; at most
//! [`KEEP_PER_AGENT`] are kept per agent (the oldest go first), and all of them go with the agent.

use agenthold_core::{AgentId, Store};
use serde::{Deserialize, Serialize};

use crate::serve::api::{ApiError, ApiResult};

/// Messages by `<agent>/<id>`.
const TABLE: &str = "srv_agent_messages";
/// Most messages kept per agent (sent and received together).
pub(crate) const KEEP_PER_AGENT: usize = 200;

/// Which side of a message a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Direction {
    /// This agent sent it.
    Sent,
    /// This agent was its target.
    Received,
}

/// What became of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// A run started on the target.
    Started,
    /// Refused (see `reason`).
    Refused,
}

/// One message as kept and shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct Message {
    /// `msg_…`, the same on both sides.
    pub(crate) id: String,
    /// The sending agent (known by its tunnel).
    #[schema(value_type = String)]
    pub(crate) from_agent: AgentId,
    /// The sender's name when it sent.
    pub(crate) from_name: String,
    /// The target, when an agent of that name was found in the workspace.
    #[schema(value_type = Option<String>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) to_agent: Option<AgentId>,
    /// The target's name as the sender gave it.
    pub(crate) to_name: String,
    /// `sent` or `received`, from the point of view of the agent whose list this is.
    pub(crate) direction: Direction,
    /// The run it started on the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) run: Option<String>,
    /// The depth the run has (or would have had) in its chain of messages.
    pub(crate) depth: u32,
    /// `claude` or `codex`.
    pub(crate) harness: String,
    /// Size of the prompt in bytes (the prompt itself is the run's).
    pub(crate) prompt_bytes: u64,
    /// When (RFC 3339).
    pub(crate) created_at: String,
    /// `started` or `refused`.
    pub(crate) outcome: Outcome,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
}

/// A new message id: `msg_` and the time-ordered part of an exec id.
pub(crate) fn new_id() -> String {
    let exec = crate::serve::execs::record::new_id();
    format!("msg_{}", exec.trim_start_matches('x'))
}

fn prefix(agent: &AgentId) -> Vec<u8> {
    format!("{agent}/").into_bytes()
}

/// Keep `message` for `agent` and drop its oldest past [`KEEP_PER_AGENT`]. Best effort: a store error is
/// logged (the run, if any, has started already).
pub(crate) async fn record(store: &dyn Store, agent: &AgentId, message: &Message) {
    let result = async {
        let bytes = serde_json::to_vec(message).map_err(|e| ApiError::internal(&e))?;
        let mut key = prefix(agent);
        key.extend_from_slice(message.id.as_bytes());
        store.put(TABLE, &key, &bytes).await?;
        let keys = store.scan_prefix(TABLE, &prefix(agent)).await?;
        let over = keys.len().saturating_sub(KEEP_PER_AGENT);
        for (key, _) in keys.into_iter().take(over) {
            store.delete(TABLE, &key).await?;
        }
        ApiResult::Ok(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(agent = %agent, error = %e, "could not keep an agent message");
    }
}

/// `agent`'s messages, newest first.
///
/// # Errors
/// A store error or an unreadable record.
pub(crate) async fn list(store: &dyn Store, agent: &AgentId) -> ApiResult<Vec<Message>> {
    let mut out = Vec::new();
    for (_, bytes) in store.scan_prefix(TABLE, &prefix(agent)).await? {
        out.push(
            serde_json::from_slice(&bytes)
                .map_err(|e| ApiError::internal(&format!("a stored agent message is unreadable: {e}")))?,
        );
    }
    out.reverse();
    Ok(out)
}

/// Delete every message kept for `agent` (it was deleted).
///
/// # Errors
/// A store error.
pub(crate) async fn forget_agent(store: &dyn Store, agent: &AgentId) -> ApiResult<()> {
    for (key, _) in store.scan_prefix(TABLE, &prefix(agent)).await? {
        store.delete(TABLE, &key).await?;
    }
    Ok(())
}
