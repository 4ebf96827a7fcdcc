//! What the server keeps about an exec in its store: the record (table `srv_execs`, JSON, key
//! `<agent>/<exec>`) and, once the exec ended, its retained output (table `srv_exec_output`, same key). Exec
//! ids start with the start time, so an agent's records come out of a prefix scan oldest first.
// enforces: P1, S12

use std::sync::atomic::{AtomicU64, Ordering};

use agenthold_core::{AgentId, Store, UserId, WorkspaceId};
use serde::{Deserialize, Serialize};

use super::output::StoredEvent;
use crate::serve::api::{ApiError, ApiResult};

/// Exec records, by `<agent>/<exec>`.
const RECORDS: &str = "srv_execs";
/// Retained output of ended execs, by `<agent>/<exec>`.
const OUTPUT: &str = "srv_exec_output";

/// Where an exec is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ExecState {
    /// Started, not ended.
    Running,
    /// Ended by itself, with an exit code.
    Exited,
    /// Killed through the cancel call.
    Cancelled,
    /// Killed when its timeout passed.
    TimedOut,
    /// The server lost track of it (it restarted while the exec ran, or the output stream broke off
    /// without an exit); a process still running at the restart was killed.
    Lost,
}

impl ExecState {
    /// Its name in the API (`timed_out`, …).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Cancelled => "cancelled",
            Self::TimedOut => "timed_out",
            Self::Lost => "lost",
        }
    }
}

/// An exec as the server keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ExecRecord {
    /// The exec's id (also the key of its event stream).
    pub(crate) id: String,
    /// Its agent.
    pub(crate) agent: AgentId,
    /// The agent's workspace.
    pub(crate) workspace: WorkspaceId,
    /// Program and arguments.
    pub(crate) argv: Vec<String>,
    /// Working directory, when given.
    pub(crate) cwd: Option<String>,
    /// Timeout in seconds, when given.
    pub(crate) timeout: Option<u64>,
    /// Who started it.
    pub(crate) started_by: UserId,
    /// The runtime's id of the command (for cancel and the liveness check after a restart).
    pub(crate) runtime_id: String,
    /// Where it is.
    pub(crate) state: ExecState,
    /// The exit code once it exited (128 + signal when killed).
    pub(crate) exit_code: Option<i64>,
    /// When it started (RFC 3339).
    pub(crate) started_at: String,
    /// When it ended (RFC 3339).
    pub(crate) ended_at: Option<String>,
    /// Whether older output was dropped to stay within the per-exec cap.
    pub(crate) truncated: bool,
}

/// The store key of an exec.
fn key(agent: &AgentId, exec: &str) -> Vec<u8> {
    format!("{agent}/{exec}").into_bytes()
}

/// The newest time an id was made for, so ids made in one millisecond still sort in order.
static LAST_MS: AtomicU64 = AtomicU64::new(0);

/// A new exec id: the start time in milliseconds (12 hex digits, so ids sort by time) and 20 random
/// characters; lower-case letters and digits only, so it is a valid SSE stream key.
pub(crate) fn new_id() -> String {
    let now = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX);
    let mut ms = now;
    let _ = LAST_MS.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
        ms = now.max(last + 1);
        Some(ms)
    });
    // Two random ids of 16 base32 characters; 20 of them are 100 bits.
    let random = format!("{}{}", AgentId::random(), AgentId::random());
    let tail: String = random.chars().take(20).collect();
    format!("x{ms:012x}{tail}")
}

/// Whether `id` could be an exec id (anything else in a path is a 404 without a store lookup).
pub(crate) fn valid_id(id: &str) -> bool {
    (2..=64).contains(&id.len())
        && id.starts_with('x')
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn unreadable(what: &str, e: &dyn std::fmt::Display) -> ApiError {
    ApiError::internal(&format!("a stored {what} is unreadable: {e}"))
}

/// Write `record`.
pub(crate) async fn save(store: &dyn Store, record: &ExecRecord) -> ApiResult<()> {
    let bytes = serde_json::to_vec(record).map_err(|e| ApiError::internal(&e))?;
    store
        .put(RECORDS, &key(&record.agent, &record.id), &bytes)
        .await?;
    Ok(())
}

/// Write an ended exec's record and its retained output in one batch.
pub(crate) async fn save_ended(
    store: &dyn Store,
    record: &ExecRecord,
    output: &[StoredEvent],
) -> ApiResult<()> {
    let k = key(&record.agent, &record.id);
    let rec = serde_json::to_vec(record).map_err(|e| ApiError::internal(&e))?;
    let out = serde_json::to_vec(output).map_err(|e| ApiError::internal(&e))?;
    store
        .batch(vec![
            agenthold_core::store::BatchOp::Put {
                table: OUTPUT.into(),
                key: k.clone(),
                value: out,
            },
            agenthold_core::store::BatchOp::Put {
                table: RECORDS.into(),
                key: k,
                value: rec,
            },
        ])
        .await?;
    Ok(())
}

/// The record of one exec.
pub(crate) async fn load(store: &dyn Store, agent: &AgentId, exec: &str) -> ApiResult<Option<ExecRecord>> {
    let Some(bytes) = store.get(RECORDS, &key(agent, exec)).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| unreadable("exec record", &e))
}

/// The retained output of an ended exec (none for one that was lost).
pub(crate) async fn load_output(
    store: &dyn Store,
    agent: &AgentId,
    exec: &str,
) -> ApiResult<Option<Vec<StoredEvent>>> {
    let Some(bytes) = store.get(OUTPUT, &key(agent, exec)).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| unreadable("exec output", &e))
}

/// Every record of `agent`, oldest first; `None` for every agent.
pub(crate) async fn list(store: &dyn Store, agent: Option<&AgentId>) -> ApiResult<Vec<ExecRecord>> {
    let prefix = agent.map(|a| format!("{a}/")).unwrap_or_default();
    let mut out = Vec::new();
    for (k, v) in store.scan_prefix(RECORDS, prefix.as_bytes()).await? {
        match serde_json::from_slice::<ExecRecord>(&v) {
            Ok(record) => out.push(record),
            Err(e) => tracing::warn!(key = %String::from_utf8_lossy(&k), error = %e,
                "skipping an unreadable exec record"),
        }
    }
    Ok(out)
}

/// Delete execs (records and output).
pub(crate) async fn delete(store: &dyn Store, agent: &AgentId, execs: &[String]) -> ApiResult<()> {
    if execs.is_empty() {
        return Ok(());
    }
    let mut ops = Vec::with_capacity(execs.len() * 2);
    for exec in execs {
        for table in [RECORDS, OUTPUT] {
            ops.push(agenthold_core::store::BatchOp::Delete {
                table: table.into(),
                key: key(agent, exec),
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
        assert!(!valid_id("X1"));
        assert!(!valid_id("x1.2"));
        assert!(!valid_id("x"));
        assert!(!valid_id(&format!("x{}", "a".repeat(64))));
    }
}
