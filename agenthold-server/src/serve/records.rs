//! The server's own agent records (table `srv_agents`, JSON by agent id): what the API shows about an
//! agent beyond its sandbox — workspace, name, labels, creator, and the last state the server saw. The
//! sandbox's spec (image, limits, policy, secrets) stays in the runtime's record.

use std::collections::BTreeMap;

use agenthold_core::{AgentId, Store, UserId, WorkspaceId};
use serde::{Deserialize, Serialize};

use super::api::{ApiError, ApiResult};

const TABLE: &str = "srv_agents";

/// What the server keeps about an agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AgentMeta {
    /// The agent.
    pub(crate) id: AgentId,
    /// Its workspace.
    pub(crate) workspace: WorkspaceId,
    /// Its name, unique in the workspace.
    pub(crate) name: String,
    /// Labels for filtering (`team=infra`).
    pub(crate) labels: BTreeMap<String, String>,
    /// Who created it (its first admin).
    pub(crate) created_by: UserId,
    /// When (RFC 3339).
    pub(crate) created_at: String,
    /// The last state the server saw: `creating`, `running`, `stopped`, `failed`.
    pub(crate) state: String,
    /// A harness credential file the server did not write is in the sandbox (S11; see `credentials`).
    #[serde(default)]
    pub(crate) credentials_inside: bool,
    /// Where (paths inside the sandbox), when [`AgentMeta::credentials_inside`].
    #[serde(default)]
    pub(crate) credentials_files: Vec<String>,
}

pub(crate) async fn load(store: &dyn Store, agent: &AgentId) -> ApiResult<Option<AgentMeta>> {
    let Some(bytes) = store.get(TABLE, agent.as_str().as_bytes()).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| ApiError::internal(&format!("the stored record of agent {agent} is unreadable: {e}")))
}

pub(crate) async fn save(store: &dyn Store, meta: &AgentMeta) -> ApiResult<()> {
    let bytes = serde_json::to_vec(meta).map_err(|e| ApiError::internal(&e))?;
    store.put(TABLE, meta.id.as_str().as_bytes(), &bytes).await?;
    Ok(())
}

pub(crate) async fn delete(store: &dyn Store, agent: &AgentId) -> ApiResult<()> {
    store.delete(TABLE, agent.as_str().as_bytes()).await?;
    Ok(())
}

/// The records of `agents`, in the given order, skipping missing ones.
pub(crate) async fn load_many(store: &dyn Store, agents: &[AgentId]) -> ApiResult<Vec<AgentMeta>> {
    let mut out = Vec::with_capacity(agents.len());
    for agent in agents {
        if let Some(meta) = load(store, agent).await? {
            out.push(meta);
        }
    }
    Ok(out)
}

/// Update the last seen state of an agent (best effort: the state is a hint for lists).
pub(crate) async fn set_state(store: &dyn Store, agent: &AgentId, state: &str) {
    match load(store, agent).await {
        Ok(Some(mut meta)) if meta.state != state => {
            meta.state = state.to_owned();
            if let Err(e) = save(store, &meta).await {
                tracing::warn!(agent = %agent, error = %e, "could not record the agent's state");
            }
        }
        _ => {}
    }
}

/// Now, as RFC 3339 UTC.
pub(crate) fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
