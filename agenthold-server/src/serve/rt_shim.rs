//! TEMPORARY: the runtime methods of branch `rt` that are not committed yet, so this branch builds; removed
//! when `rt` is merged.
#![allow(dead_code)]

use std::sync::Arc;

use agenthold_core::AgentId;
use agenthold_core::secret::{Placeholder, SecretSpec};
use agenthold_egress::log::LogEntry;
use agenthold_sandbox::Runtime;

pub(crate) trait RtShim {
    fn request_log_since(&self, agent: &AgentId, after: u64) -> Vec<LogEntry>;
    fn subscribe_requests(&self) -> tokio::sync::broadcast::Receiver<Arc<LogEntry>>;
    async fn set_secrets(
        &self,
        agent: &AgentId,
        s: Vec<SecretSpec>,
    ) -> agenthold_sandbox::Result<Vec<Placeholder>>;
    async fn agent_secrets(&self, agent: &AgentId) -> agenthold_sandbox::Result<Vec<Placeholder>>;
}

impl RtShim for Runtime {
    fn request_log_since(&self, agent: &AgentId, after: u64) -> Vec<LogEntry> {
        self.gateway().log().since(agent, after)
    }
    fn subscribe_requests(&self) -> tokio::sync::broadcast::Receiver<Arc<LogEntry>> {
        self.gateway().log().subscribe()
    }
    async fn set_secrets(
        &self,
        agent: &AgentId,
        s: Vec<SecretSpec>,
    ) -> agenthold_sandbox::Result<Vec<Placeholder>> {
        Ok(self.secrets().map(|t| t.set(agent, s)).unwrap_or_default())
    }
    async fn agent_secrets(&self, agent: &AgentId) -> agenthold_sandbox::Result<Vec<Placeholder>> {
        let _ = agent;
        Ok(Vec::new())
    }
}
