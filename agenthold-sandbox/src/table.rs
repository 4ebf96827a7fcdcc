//! Store tables of JSON records keyed by agent id: the runtime's agent records and the Docker runtime's
//! per-agent state both live in one.

use std::marker::PhantomData;

use agenthold_core::{AgentId, Store};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// A table of `T` per agent.
pub(crate) struct AgentTable<T> {
    table: &'static str,
    /// What a record is, for messages ("sandbox record").
    what: &'static str,
    records: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> AgentTable<T> {
    pub(crate) const fn new(table: &'static str, what: &'static str) -> Self {
        Self {
            table,
            what,
            records: PhantomData,
        }
    }

    pub(crate) async fn save(&self, store: &dyn Store, agent: &AgentId, record: &T) -> Result<()> {
        let bytes = serde_json::to_vec(record).map_err(|e| Error::BadInput {
            problem: format!("{} of {agent}: {e}", self.what),
        })?;
        Ok(store.put(self.table, agent.as_str().as_bytes(), &bytes).await?)
    }

    pub(crate) async fn load(&self, store: &dyn Store, agent: &AgentId) -> Result<Option<T>> {
        let Some(bytes) = store.get(self.table, agent.as_str().as_bytes()).await? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::BadInput {
                problem: format!("the stored {} of {agent} is unreadable: {e}", self.what),
            })
    }

    pub(crate) async fn delete(&self, store: &dyn Store, agent: &AgentId) -> Result<()> {
        store.delete(self.table, agent.as_str().as_bytes()).await?;
        Ok(())
    }

    /// Every record; unreadable ones are skipped with a warning (one bad record must not stop a restart).
    pub(crate) async fn list(&self, store: &dyn Store) -> Result<Vec<(AgentId, T)>> {
        let mut out = Vec::new();
        for (key, value) in store.scan_prefix(self.table, b"").await? {
            let Ok(agent) = AgentId::new(String::from_utf8_lossy(&key).into_owned()) else {
                continue;
            };
            match serde_json::from_slice(&value) {
                Ok(record) => out.push((agent, record)),
                Err(e) => {
                    tracing::warn!(agent = %agent, error = %e, what = self.what, "unreadable record skipped");
                }
            }
        }
        Ok(out)
    }
}
