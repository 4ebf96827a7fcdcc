//! Execs as server-side objects (SERVER.md §3, P1): every command started through the API gets an id, a
//! task that reads its output into a bounded buffer ([`output`]) and wakes every client that follows it,
//! a record in the store ([`record`]) that survives the server, and its retained output stored once it
//! ended. A client can wait for it, stream it, detach and reattach from any retained event, or cancel it
//! (the whole process group).
//!
//! At start ([`Execs::reconcile`]) an exec recorded `running` by a previous server is marked `lost` and, if
//! its process still runs, killed (S12): nobody reads its output any more. At most [`KEEP_PER_AGENT`]
//! execs are kept per agent; deleting an agent deletes its execs.
// enforces: P1, S12

pub(crate) mod output;
pub(crate) mod record;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use agenthold_core::sandbox::{ExecChunk, ExecRequest, ExecStream};
use agenthold_core::{AgentId, Store, UserId, WorkspaceId};
use agenthold_sandbox::Runtime;
use tokio::sync::watch;

use self::output::{MAX_RETAINED, Output, StoredEvent};
pub(crate) use self::record::{ExecRecord, ExecState};
use crate::serve::api::{ApiError, ApiResult};
use crate::serve::records::now_rfc3339;

/// Execs kept per agent (the oldest ended ones beyond are deleted).
pub(crate) const KEEP_PER_AGENT: usize = 100;
/// Execs that may run at once per agent (each holds up to [`MAX_RETAINED`] bytes of output).
pub(crate) const MAX_RUNNING_PER_AGENT: usize = 64;
/// How long the runtime gets to answer a liveness check or a cancel during reconcile.
const RECONCILE_STEP: Duration = Duration::from_secs(10);
/// Exit code of a command the runtime's timeout killed (as coreutils `timeout`).
const EXIT_TIMEOUT: i64 = 124;
/// Exit code of a command killed by SIGKILL (cancel, or the server's timer).
const EXIT_KILLED: i64 = 128 + 9;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What to start.
#[derive(Debug)]
pub(crate) struct NewExec {
    /// Program and arguments.
    pub(crate) argv: Vec<String>,
    /// Extra environment.
    pub(crate) env: BTreeMap<String, String>,
    /// Working directory.
    pub(crate) cwd: Option<String>,
    /// Bytes for standard input.
    pub(crate) stdin: Option<Vec<u8>>,
    /// Timeout in seconds.
    pub(crate) timeout: Option<u64>,
}

/// One exec: its record, its output, and the signal its followers wait on.
#[derive(Debug)]
pub(crate) struct ExecEntry {
    record: Mutex<ExecRecord>,
    output: Mutex<Output>,
    /// The newest event number; changes wake followers.
    tick: watch::Sender<u64>,
    /// The cancel call asked for it.
    cancel_requested: AtomicBool,
    /// Its agent was deleted: nothing more is stored.
    forgotten: AtomicBool,
}

impl ExecEntry {
    fn new(record: ExecRecord, output: Output) -> Self {
        let (tick, _) = watch::channel(output.latest());
        Self {
            record: Mutex::new(record),
            output: Mutex::new(output),
            tick,
            cancel_requested: AtomicBool::new(false),
            forgotten: AtomicBool::new(false),
        }
    }

    /// The record as it is now.
    pub(crate) fn record(&self) -> ExecRecord {
        let mut record = lock(&self.record).clone();
        record.truncated |= lock(&self.output).truncated();
        record
    }

    /// The retained events after event `n`, and whether the exec has ended.
    pub(crate) fn events_after(&self, n: u64) -> (Vec<StoredEvent>, bool) {
        let out = lock(&self.output);
        (out.after(n), out.is_ended())
    }

    /// The number of the newest event.
    pub(crate) fn latest(&self) -> u64 {
        lock(&self.output).latest()
    }

    /// Whether the exec has ended.
    pub(crate) fn is_ended(&self) -> bool {
        lock(&self.output).is_ended()
    }

    /// A receiver that wakes when an event comes in.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.tick.subscribe()
    }

    /// Wait until the exec has ended.
    pub(crate) async fn ended(&self) {
        let mut rx = self.subscribe();
        loop {
            rx.borrow_and_update();
            if self.is_ended() {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// The retained standard output and standard error.
    pub(crate) fn collected(&self) -> (Vec<u8>, Vec<u8>) {
        lock(&self.output).collected()
    }

    fn push(&self, stderr: bool, data: &[u8]) {
        let latest = {
            let mut out = lock(&self.output);
            out.push_output(stderr, data);
            out.latest()
        };
        self.tick.send_replace(latest);
    }

    /// Record the end and wake everyone; returns the record and the events to store.
    fn finish(&self, exit_code: Option<i64>, state: ExecState) -> (ExecRecord, Vec<StoredEvent>) {
        let (latest, events, truncated) = {
            let mut out = lock(&self.output);
            out.finish(exit_code, state);
            (out.latest(), out.all(), out.truncated())
        };
        let record = {
            let mut record = lock(&self.record);
            record.state = state;
            record.exit_code = exit_code;
            record.ended_at = Some(now_rfc3339());
            record.truncated = truncated;
            record.clone()
        };
        self.tick.send_replace(latest);
        (record, events)
    }
}

/// The registry of execs.
pub(crate) struct Execs {
    runtime: Arc<Runtime>,
    store: Arc<dyn Store>,
    /// Running execs (and ended ones until their output is stored), by id.
    live: Mutex<HashMap<String, Arc<ExecEntry>>>,
    /// Held while an ended exec is stored or an agent's execs are deleted, so a deleted agent's exec is
    /// never stored again.
    persist: tokio::sync::Mutex<()>,
    /// The agent of every exec that ended (runs end as execs): the credential check (S11) follows it.
    ended: tokio::sync::broadcast::Sender<AgentId>,
}

impl std::fmt::Debug for Execs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execs")
            .field("live", &lock(&self.live).len())
            .finish_non_exhaustive()
    }
}

impl Execs {
    /// A registry over `runtime`, keeping its records in `store`.
    pub(crate) fn new(runtime: Arc<Runtime>, store: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Self {
            runtime,
            store,
            live: Mutex::new(HashMap::new()),
            persist: tokio::sync::Mutex::new(()),
            ended: tokio::sync::broadcast::channel(256).0,
        })
    }

    /// Start `new` in `agent`'s sandbox.
    ///
    /// # Errors
    /// 409 when the agent runs [`MAX_RUNNING_PER_AGENT`] execs already; the runtime's error when the
    /// sandbox cannot run it; a store error.
    pub(crate) async fn start(
        self: &Arc<Self>,
        workspace: &WorkspaceId,
        agent: &AgentId,
        user: &UserId,
        new: NewExec,
    ) -> ApiResult<Arc<ExecEntry>> {
        let running = lock(&self.live)
            .values()
            .filter(|e| lock(&e.record).agent == *agent && !e.is_ended())
            .count();
        if running >= MAX_RUNNING_PER_AGENT {
            return Err(ApiError::conflict(format!(
                "this agent runs {running} execs already (at most {MAX_RUNNING_PER_AGENT} at once)"
            )));
        }
        let timeout = new.timeout.map(Duration::from_secs);
        let request = ExecRequest {
            argv: new.argv.clone(),
            env: new.env,
            cwd: new.cwd.clone(),
            stdin: new.stdin,
            timeout,
        };
        let stream = self.runtime.exec_stream(agent, request).await?;
        let id = record::new_id();
        let record = ExecRecord {
            id: id.clone(),
            agent: agent.clone(),
            workspace: workspace.clone(),
            argv: new.argv,
            cwd: new.cwd,
            timeout: new.timeout,
            started_by: user.clone(),
            runtime_id: stream.id().to_owned(),
            state: ExecState::Running,
            exit_code: None,
            started_at: now_rfc3339(),
            ended_at: None,
            truncated: false,
        };
        if let Err(e) = record::save(self.store.as_ref(), &record).await {
            // Nobody could ever see or cancel it: stop it now.
            let _ = self.runtime.cancel_exec(agent, stream.id()).await;
            return Err(e);
        }
        let entry = Arc::new(ExecEntry::new(record, Output::new(MAX_RETAINED)));
        lock(&self.live).insert(id, Arc::clone(&entry));
        tokio::spawn(Arc::clone(self).drive(Arc::clone(&entry), stream, timeout));
        // Housekeeping off the caller's path: the answer does not wait for old records to go.
        let (this, agent) = (Arc::clone(self), agent.clone());
        tokio::spawn(async move {
            if let Err(e) = this.prune(&agent).await {
                tracing::warn!(agent = %agent, error = %e, "could not delete old execs");
            }
        });
        Ok(entry)
    }

    /// Read an exec's output to its end, enforce its timeout, then store it.
    async fn drive(
        self: Arc<Self>,
        entry: Arc<ExecEntry>,
        mut stream: ExecStream,
        timeout: Option<Duration>,
    ) {
        let (agent, id) = {
            let r = lock(&entry.record);
            (r.agent.clone(), r.id.clone())
        };
        let started = Instant::now();
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut timed_out = false;
        let mut exit = None;
        loop {
            let timer = async {
                match deadline {
                    Some(d) if !timed_out => tokio::time::sleep_until(d).await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                chunk = stream.next() => match chunk {
                    Some(Ok(ExecChunk::Stdout(data))) => entry.push(false, &data),
                    Some(Ok(ExecChunk::Stderr(data))) => entry.push(true, &data),
                    Some(Ok(ExecChunk::Exit(code))) => { exit = Some(code); break; }
                    Some(Err(e)) => {
                        tracing::warn!(agent = %agent, exec = %id, error = %e, "the output of an exec broke off");
                        break;
                    }
                    None => break,
                },
                () = timer => {
                    // The runtime's own timer kills it too; this one also covers a runtime that has none.
                    timed_out = true;
                    if let Err(e) = self.runtime.cancel_exec(&agent, stream.id()).await {
                        tracing::warn!(agent = %agent, exec = %id, error = %e, "could not kill an exec past its timeout");
                    }
                }
            }
        }
        let killed = exit.is_none_or(|c| c == EXIT_KILLED || c == EXIT_TIMEOUT);
        let past_timeout = timeout.is_some_and(|t| started.elapsed() >= t);
        let state = if entry.cancel_requested.load(Ordering::SeqCst) && killed {
            ExecState::Cancelled
        } else if (timed_out || past_timeout) && killed {
            ExecState::TimedOut
        } else if exit.is_some() {
            ExecState::Exited
        } else {
            ExecState::Lost
        };
        let (record, events) = entry.finish(exit, state);
        tracing::info!(agent = %agent, exec = %id, state = state.as_str(), exit_code = ?exit, "exec ended");
        {
            let _guard = self.persist.lock().await;
            if !entry.forgotten.load(Ordering::SeqCst)
                && let Err(e) = record::save_ended(self.store.as_ref(), &record, &events).await
            {
                tracing::error!(agent = %agent, exec = %id, error = %e, "could not store an ended exec");
            }
        }
        lock(&self.live).remove(&id);
        // Nobody listening is fine.
        let _ = self.ended.send(agent);
    }

    /// The agents of execs that end from now on (one message per exec; a slow receiver may lag).
    pub(crate) fn subscribe_ended(&self) -> tokio::sync::broadcast::Receiver<AgentId> {
        self.ended.subscribe()
    }

    /// An exec of `agent` in `workspace`: the live one, else the stored one.
    ///
    /// # Errors
    /// A store error.
    pub(crate) async fn find(
        &self,
        workspace: &WorkspaceId,
        agent: &AgentId,
        exec: &str,
    ) -> ApiResult<Option<Arc<ExecEntry>>> {
        if !record::valid_id(exec) {
            return Ok(None);
        }
        let live = lock(&self.live).get(exec).cloned();
        if let Some(entry) = live {
            let r = lock(&entry.record);
            let mine = r.agent == *agent && r.workspace == *workspace;
            drop(r);
            return Ok(mine.then_some(entry));
        }
        let Some(rec) = record::load(self.store.as_ref(), agent, exec).await? else {
            return Ok(None);
        };
        if rec.workspace != *workspace {
            return Ok(None);
        }
        let events = record::load_output(self.store.as_ref(), agent, exec).await?;
        let output = Output::ended(events, rec.exit_code, rec.state);
        Ok(Some(Arc::new(ExecEntry::new(rec, output))))
    }

    /// The execs of `agent`, newest first.
    ///
    /// # Errors
    /// A store error.
    pub(crate) async fn list(&self, agent: &AgentId) -> ApiResult<Vec<ExecRecord>> {
        let mut records = record::list(self.store.as_ref(), Some(agent)).await?;
        records.reverse();
        let live = lock(&self.live).clone();
        for r in &mut records {
            if let Some(entry) = live.get(&r.id) {
                *r = entry.record();
            }
        }
        Ok(records)
    }

    /// Kill a running exec's process group and wait (up to 10 s) for its end; an ended exec is left as it
    /// is.
    ///
    /// # Errors
    /// The runtime's error when the kill fails.
    pub(crate) async fn cancel(&self, entry: &ExecEntry) -> ApiResult<()> {
        if entry.is_ended() {
            return Ok(());
        }
        entry.cancel_requested.store(true, Ordering::SeqCst);
        let (agent, runtime_id) = {
            let r = lock(&entry.record);
            (r.agent.clone(), r.runtime_id.clone())
        };
        self.runtime.cancel_exec(&agent, &runtime_id).await?;
        if tokio::time::timeout(Duration::from_secs(10), entry.ended())
            .await
            .is_err()
        {
            tracing::warn!(agent = %agent, exec = %runtime_id, "a cancelled exec has not ended after 10 s");
        }
        Ok(())
    }

    /// Delete the oldest ended execs of `agent` beyond [`KEEP_PER_AGENT`].
    async fn prune(&self, agent: &AgentId) -> ApiResult<()> {
        let records = record::list(self.store.as_ref(), Some(agent)).await?;
        let Some(excess) = records.len().checked_sub(KEEP_PER_AGENT).filter(|n| *n > 0) else {
            return Ok(());
        };
        let old: Vec<String> = records
            .into_iter()
            .filter(|r| r.state != ExecState::Running)
            .take(excess)
            .map(|r| r.id)
            .collect();
        let _guard = self.persist.lock().await;
        record::delete(self.store.as_ref(), agent, &old).await
    }

    /// Forget every exec of a deleted agent (its sandbox is gone, and with it their processes).
    ///
    /// # Errors
    /// A store error.
    pub(crate) async fn forget_agent(&self, agent: &AgentId) -> ApiResult<()> {
        let _guard = self.persist.lock().await;
        lock(&self.live).retain(|_, e| {
            let mine = lock(&e.record).agent == *agent;
            if mine {
                e.forgotten.store(true, Ordering::SeqCst);
            }
            !mine
        });
        let ids: Vec<String> = record::list(self.store.as_ref(), Some(agent))
            .await?
            .into_iter()
            .map(|r| r.id)
            .collect();
        record::delete(self.store.as_ref(), agent, &ids).await
    }

    /// Mark every exec a previous server left `running` as `lost`, killing the ones whose process still
    /// runs (S12). Returns how many were marked.
    ///
    /// # Errors
    /// A store error.
    pub(crate) async fn reconcile(&self) -> ApiResult<usize> {
        let mut marked = 0;
        for mut rec in record::list(self.store.as_ref(), None).await? {
            if rec.state != ExecState::Running || lock(&self.live).contains_key(&rec.id) {
                continue;
            }
            let running = tokio::time::timeout(
                RECONCILE_STEP,
                self.runtime.exec_running(&rec.agent, &rec.runtime_id),
            )
            .await;
            match running {
                Ok(Ok(true)) => {
                    let cancelled = tokio::time::timeout(
                        RECONCILE_STEP,
                        self.runtime.cancel_exec(&rec.agent, &rec.runtime_id),
                    )
                    .await;
                    if !matches!(cancelled, Ok(Ok(()))) {
                        tracing::warn!(agent = %rec.agent, exec = %rec.id, "could not kill a lost exec");
                    }
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(agent = %rec.agent, exec = %rec.id, error = %e, "liveness of a lost exec unknown");
                }
                Err(_) => tracing::warn!(agent = %rec.agent, exec = %rec.id, "liveness check timed out"),
            }
            rec.state = ExecState::Lost;
            rec.ended_at = Some(now_rfc3339());
            record::save(self.store.as_ref(), &rec).await?;
            tracing::info!(agent = %rec.agent, exec = %rec.id, "exec left running by a previous server marked lost");
            marked += 1;
        }
        Ok(marked)
    }
}
