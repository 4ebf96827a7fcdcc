//! What the server keeps about a harness run in its store: the record (table `srv_runs`, JSON, key
//! `<agent>/<run>`) and, once the run ended, its retained events (table `srv_run_events`) and raw output
//! lines (table `srv_run_raw`, same key). Run ids start with the start time, so an agent's records come out
//! of a prefix scan oldest first.
// enforces: P1, S12

use agenthold_core::store::BatchOp;
use agenthold_core::{AgentId, Store, UserId, WorkspaceId};
use serde::{Deserialize, Serialize};

use super::events::RunEvent;
use super::{Harness, RunOrigin};
use crate::serve::api::{ApiError, ApiResult};

/// Run records, by `<agent>/<run>`.
const RECORDS: &str = "srv_runs";
/// Retained events of ended runs, by `<agent>/<run>`.
const EVENTS: &str = "srv_run_events";
/// Retained raw output lines of ended runs, by `<agent>/<run>`.
const RAW: &str = "srv_run_raw";

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RunState {
    /// Accepted, its process not started yet.
    Queued,
    /// Its process runs.
    Running,
    /// The harness exited 0.
    Succeeded,
    /// The harness exited non-zero (or was killed by something other than cancel).
    Failed,
    /// Killed through the cancel call.
    Cancelled,
    /// The server lost track of it (it restarted while the run ran); a process still running was killed.
    Lost,
}

impl RunState {
    /// Its name in the API.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Lost => "lost",
        }
    }

    /// Whether the run has ended.
    pub(crate) fn is_final(self) -> bool {
        !matches!(self, Self::Queued | Self::Running)
    }
}

/// Tokens (and cost, when the harness reports it) a run used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct Usage {
    /// Input tokens (including cached ones the harness counts separately).
    pub(crate) input_tokens: u64,
    /// Output tokens.
    pub(crate) output_tokens: u64,
    /// Cost in US dollars as the harness computed it (Claude Code reports it; Codex does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cost_usd: Option<f64>,
}

/// A run as the server keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunRecord {
    /// `run_…` (also the key of its event stream).
    pub(crate) id: String,
    /// Its agent.
    pub(crate) agent: AgentId,
    /// The agent's workspace.
    pub(crate) workspace: WorkspaceId,
    /// Which harness.
    pub(crate) harness: Harness,
    /// Where it is.
    pub(crate) state: RunState,
    /// The harness's exit code once it exited (128 + signal when killed).
    pub(crate) exit_code: Option<i64>,
    /// Who or what asked for it.
    pub(crate) origin: RunOrigin,
    /// Its place in a chain of agent-to-agent messages (0: not started by an agent).
    pub(crate) depth: u32,
    /// The user on whose rights it runs.
    pub(crate) started_by: UserId,
    /// When it was accepted (RFC 3339).
    pub(crate) created_at: String,
    /// When its process started (RFC 3339).
    pub(crate) started_at: Option<String>,
    /// When it ended (RFC 3339).
    pub(crate) ended_at: Option<String>,
    /// Size of the prompt in bytes (the prompt itself is not kept).
    pub(crate) prompt_bytes: u64,
    /// The harness's session (Claude `session_id`, Codex `thread_id`): pass as `resume` to continue it.
    pub(crate) session_id: Option<String>,
    /// Tokens and cost, as the harness reported them.
    pub(crate) usage: Option<Usage>,
    /// The harness's final answer.
    pub(crate) result: Option<String>,
    /// Whether older events or raw lines were dropped to stay within the per-run caps.
    pub(crate) truncated: bool,
    /// The model asked for.
    #[serde(default)]
    pub(crate) model: Option<String>,
    /// The session asked to resume.
    #[serde(default)]
    pub(crate) resume: Option<String>,
    /// The exec that runs the harness process (`…/execs/{exec}`).
    #[serde(default)]
    pub(crate) exec: Option<String>,
}

/// The store key of a run.
fn key(agent: &AgentId, run: &str) -> Vec<u8> {
    format!("{agent}/{run}").into_bytes()
}

/// A new run id: `run_`, the start time in milliseconds (12 hex digits, so ids sort by time) and 20 random
/// lower-case letters and digits (a valid SSE stream key: no `.`).
pub(crate) fn new_id() -> String {
    let exec = crate::serve::execs::record::new_id();
    format!("run_{}", exec.trim_start_matches('x'))
}

/// Whether `id` could be a run id (anything else in a path is a 404 without a store lookup).
pub(crate) fn valid_id(id: &str) -> bool {
    id.strip_prefix("run_").is_some_and(|rest| {
        (1..=64).contains(&rest.len()) && rest.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}

fn unreadable(what: &str, e: &dyn std::fmt::Display) -> ApiError {
    ApiError::internal(&format!("a stored {what} is unreadable: {e}"))
}

fn to_json<T: Serialize>(value: &T) -> ApiResult<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| ApiError::internal(&e))
}

/// Write `record`.
pub(crate) async fn save(store: &dyn Store, record: &RunRecord) -> ApiResult<()> {
    store
        .put(RECORDS, &key(&record.agent, &record.id), &to_json(record)?)
        .await?;
    Ok(())
}

/// Write an ended run's record, events and raw lines in one batch.
pub(crate) async fn save_ended(
    store: &dyn Store,
    record: &RunRecord,
    events: &[RunEvent],
    raw: &[String],
) -> ApiResult<()> {
    let k = key(&record.agent, &record.id);
    store
        .batch(vec![
            BatchOp::Put {
                table: EVENTS.into(),
                key: k.clone(),
                value: to_json(&events)?,
            },
            BatchOp::Put {
                table: RAW.into(),
                key: k.clone(),
                value: to_json(&raw)?,
            },
            BatchOp::Put {
                table: RECORDS.into(),
                key: k,
                value: to_json(record)?,
            },
        ])
        .await?;
    Ok(())
}

/// The record of one run.
pub(crate) async fn load(store: &dyn Store, agent: &AgentId, run: &str) -> ApiResult<Option<RunRecord>> {
    let Some(bytes) = store.get(RECORDS, &key(agent, run)).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| unreadable("run record", &e))
}

/// The retained events of an ended run (none for one that was lost).
pub(crate) async fn load_events(
    store: &dyn Store,
    agent: &AgentId,
    run: &str,
) -> ApiResult<Option<Vec<RunEvent>>> {
    let Some(bytes) = store.get(EVENTS, &key(agent, run)).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| unreadable("run's events", &e))
}

/// The retained raw lines of an ended run.
pub(crate) async fn load_raw(
    store: &dyn Store,
    agent: &AgentId,
    run: &str,
) -> ApiResult<Option<Vec<String>>> {
    let Some(bytes) = store.get(RAW, &key(agent, run)).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| unreadable("run's raw output", &e))
}

/// Every record of `agent`, oldest first; `None` for every agent.
pub(crate) async fn list(store: &dyn Store, agent: Option<&AgentId>) -> ApiResult<Vec<RunRecord>> {
    let prefix = agent.map(|a| format!("{a}/")).unwrap_or_default();
    let mut out = Vec::new();
    for (k, v) in store.scan_prefix(RECORDS, prefix.as_bytes()).await? {
        match serde_json::from_slice::<RunRecord>(&v) {
            Ok(record) => out.push(record),
            Err(e) => tracing::warn!(key = %String::from_utf8_lossy(&k), error = %e,
                "skipping an unreadable run record"),
        }
    }
    Ok(out)
}

/// Delete runs (records, events and raw lines).
pub(crate) async fn delete(store: &dyn Store, agent: &AgentId, runs: &[String]) -> ApiResult<()> {
    if runs.is_empty() {
        return Ok(());
    }
    let mut ops = Vec::with_capacity(runs.len() * 3);
    for run in runs {
        for table in [RECORDS, EVENTS, RAW] {
            ops.push(BatchOp::Delete {
                table: table.into(),
                key: key(agent, run),
            });
        }
    }
    store.batch(ops).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_creation_and_are_stream_keys() {
        let ids: Vec<String> = (0..50).map(|_| new_id()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        for id in &ids {
            assert!(valid_id(id), "{id}");
            assert!(!id.contains('.'));
        }
        for bad in ["run_", "x123", "run_A", "run_1.2", "run_../x", "RUN_1"] {
            assert!(!valid_id(bad), "{bad}");
        }
        assert!(!valid_id(&format!("run_{}", "a".repeat(65))));
    }
}
