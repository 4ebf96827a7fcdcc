//! Harness runs as server-side objects (SERVER.md §5, P1): a prompt to Claude Code, Codex or a custom
//! command inside an agent's sandbox. A run is built on an exec ([`crate::serve::execs`]): the server builds
//! the argv ([`harness`]; never a shell string), the prompt goes to the process's standard input, and the
//! exec's bounded output, cancel (the whole process group) and restart reconcile are reused as they are. A
//! task per run splits the exec's output into lines, keeps the raw standard output lines (bounded, [`lines`])
//! and parses them into normalised events ([`parse`], [`events`]) that clients follow, replay and reattach
//! to; the run and its events are stored when it ends ([`record`]).
//!
//! At start ([`Runs::reconcile`], after the execs') a run recorded `queued`/`running` by a previous server
//! is marked `lost` (its exec was marked lost and its process killed). At most [`KEEP_PER_AGENT`] runs are
//! kept per agent; deleting an agent deletes its runs.
// enforces: P1, S9, S12

pub(crate) mod events;
pub(crate) mod harness;
pub(crate) mod lines;
pub(crate) mod parse;
pub(crate) mod record;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use agenthold_core::{AgentId, Store, UserId, WorkspaceId};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use self::events::{EventKind, EventLog, MAX_EVENT_BYTES, RunEvent, Stream};
use self::lines::{LineBuf, RawLines};
use self::parse::Parser;
pub(crate) use self::record::{RunRecord, RunState, Usage};
use crate::serve::api::{ApiError, ApiResult};
use crate::serve::execs::output::EventKind as ExecEvent;
use crate::serve::execs::{ExecEntry, ExecState, Execs, NewExec};
use crate::serve::records::now_rfc3339;

/// Largest prompt in bytes (S9): 256 KiB.
pub(crate) const MAX_PROMPT: usize = 256 * 1024;
/// Largest prompt of a webhook delivery: its body is capped at 256 KiB on arrival (S8) and then wrapped
/// (instructions of at most 16 KiB, the untrusted-data markers, base64 when it is not UTF-8: 4/3).
pub(crate) const MAX_WEBHOOK_PROMPT: usize = MAX_PROMPT / 3 * 4 + 64 * 1024;
/// Runs kept per agent (the oldest ended ones beyond are deleted).
pub(crate) const KEEP_PER_AGENT: usize = 100;
/// Most items of a custom argv.
pub(crate) const MAX_ARGV: usize = 4096;
/// Longest `model` or `resume` value.
const MAX_OPTION: usize = 256;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Which harness a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Harness {
    /// Claude Code (`claude -p --output-format stream-json`).
    Claude,
    /// Codex (`codex exec --json`).
    Codex,
    /// The caller's own argv; its standard output is parsed as Claude stream-json or Codex JSON lines when
    /// it looks like them.
    Custom,
}

impl Harness {
    /// Its name in the API.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Claude => "claude",
            Self::Codex => "codex",
            Self::Custom => "custom",
        }
    }
}

/// Who or what asked for a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "OriginJson", try_from = "OriginJson")]
pub(crate) enum RunOrigin {
    /// A user through the API.
    User(UserId),
    /// A webhook delivery.
    Webhook {
        /// The webhook's id (`wh_…`).
        webhook: String,
    },
    /// Another agent (agent-to-agent message).
    Agent {
        /// The calling agent.
        agent: AgentId,
        /// The calling agent's run, when the message came from one.
        run: Option<String>,
    },
}

/// The JSON form of [`RunOrigin`]: `{kind, user?, webhook?, agent?, run?}`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct OriginJson {
    /// `user`, `webhook` or `agent`.
    kind: String,
    /// The user (kind `user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    /// The webhook (kind `webhook`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    webhook: Option<String>,
    /// The calling agent (kind `agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent: Option<String>,
    /// The calling agent's run (kind `agent`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    run: Option<String>,
}

impl From<RunOrigin> for OriginJson {
    fn from(o: RunOrigin) -> Self {
        let mut j = Self {
            kind: String::new(),
            user: None,
            webhook: None,
            agent: None,
            run: None,
        };
        match o {
            RunOrigin::User(u) => {
                j.kind = "user".into();
                j.user = Some(u.to_string());
            }
            RunOrigin::Webhook { webhook } => {
                j.kind = "webhook".into();
                j.webhook = Some(webhook);
            }
            RunOrigin::Agent { agent, run } => {
                j.kind = "agent".into();
                j.agent = Some(agent.to_string());
                j.run = run;
            }
        }
        j
    }
}

impl TryFrom<OriginJson> for RunOrigin {
    type Error = String;
    fn try_from(j: OriginJson) -> Result<Self, String> {
        match (j.kind.as_str(), j.user, j.webhook, j.agent) {
            ("user", Some(u), _, _) => UserId::new(u).map(Self::User).map_err(|e| e.to_string()),
            ("webhook", _, Some(webhook), _) => Ok(Self::Webhook { webhook }),
            ("agent", _, _, Some(a)) => AgentId::new(a)
                .map(|agent| Self::Agent { agent, run: j.run })
                .map_err(|e| e.to_string()),
            (kind, ..) => Err(format!("a run origin of kind {kind:?} without its id")),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct NewRun {
    /// Which harness.
    pub harness: Harness,
    /// The prompt (at most [`MAX_PROMPT`] bytes), for the harness's standard input.
    pub prompt: String,
    /// The command (`custom` only, where it is required).
    pub argv: Option<Vec<String>>,
    /// A session to continue (`claude`/`codex`).
    pub resume: Option<String>,
    /// The model (`claude`/`codex`).
    pub model: Option<String>,
    /// Who or what asked.
    pub origin: RunOrigin,
    /// Its place in an agent-to-agent chain (0 otherwise).
    pub depth: u32,
    /// A ChatGPT provider login is attached to the agent (set by `AppState::start_run`): `codex` then
    /// uses its built-in OpenAI provider, which reads the account from `auth.json`, instead of the
    /// API-key provider.
    pub chatgpt_login: bool,
}

/// Check `new` before anything starts.
///
/// # Errors
/// 413 `prompt_too_large` past [`MAX_PROMPT`]; 400 for an argv where none belongs or a bad one, or an
/// option value that could pass for an option.
pub(crate) fn check(new: &NewRun) -> ApiResult<()> {
    let cap = match new.origin {
        RunOrigin::Webhook { .. } => MAX_WEBHOOK_PROMPT,
        _ => MAX_PROMPT,
    };
    if new.prompt.len() > cap {
        // enforces: S9
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "prompt_too_large",
            format!(
                "the prompt has {} bytes; at most {MAX_PROMPT} (256 KiB)",
                new.prompt.len()
            ),
        ));
    }
    match (new.harness, &new.argv) {
        (Harness::Custom, None) => return Err(ApiError::bad_request("harness custom needs an argv")),
        (Harness::Custom, Some(argv)) => {
            if argv.is_empty() || argv.len() > MAX_ARGV {
                return Err(ApiError::bad_request(format!(
                    "argv must have 1 to {MAX_ARGV} items, found {}",
                    argv.len()
                )));
            }
            if argv.iter().any(|a| a.contains('\0')) {
                return Err(ApiError::bad_request("argv items may not contain NUL bytes"));
            }
            if new.resume.is_some() || new.model.is_some() {
                return Err(ApiError::bad_request(
                    "resume and model are for the claude and codex harnesses; a custom argv says its own",
                ));
            }
        }
        (h, Some(_)) => {
            return Err(ApiError::bad_request(format!(
                "argv is only for harness custom; the server builds the {} command line",
                h.as_str()
            )));
        }
        (_, None) => {}
    }
    for (name, value) in [("resume", &new.resume), ("model", &new.model)] {
        if let Some(v) = value
            && (v.is_empty()
                || v.len() > MAX_OPTION
                || v.starts_with('-')
                || v.chars().any(|c| c.is_control() || c.is_whitespace()))
        {
            return Err(ApiError::bad_request(format!(
                "{name} must be 1 to {MAX_OPTION} characters without spaces or control characters, not \
                 starting with '-'"
            )));
        }
    }
    Ok(())
}

/// One run: its record, its events, the exec under it, and the signal its followers wait on.
#[derive(Debug)]
pub(crate) struct RunEntry {
    record: Mutex<RunRecord>,
    log: Mutex<EventLog>,
    /// The newest event number; changes wake followers.
    tick: watch::Sender<u64>,
    /// The exec that runs the harness (absent for a stored run).
    exec: Option<Arc<ExecEntry>>,
    /// Its agent was deleted: nothing more is stored.
    forgotten: AtomicBool,
    /// The raw standard output lines once the run ended, until the ended run is stored (its end is visible
    /// before the store has it).
    raw: Mutex<Option<Arc<Vec<String>>>>,
}

impl RunEntry {
    fn new(record: RunRecord, log: EventLog, exec: Option<Arc<ExecEntry>>) -> Self {
        let (tick, _) = watch::channel(log.latest());
        Self {
            record: Mutex::new(record),
            log: Mutex::new(log),
            tick,
            exec,
            forgotten: AtomicBool::new(false),
            raw: Mutex::new(None),
        }
    }

    /// The record as it is now.
    pub(crate) fn record(&self) -> RunRecord {
        let mut record = lock(&self.record).clone();
        record.truncated |= lock(&self.log).truncated();
        record
    }

    /// The retained events after event `n`, and whether the run has ended.
    pub(crate) fn events_after(&self, n: u64) -> (Vec<RunEvent>, bool) {
        let log = lock(&self.log);
        (log.after(n), log.is_ended())
    }

    /// The number of the newest event.
    pub(crate) fn latest(&self) -> u64 {
        lock(&self.log).latest()
    }

    /// Whether the run has ended.
    pub(crate) fn is_ended(&self) -> bool {
        lock(&self.log).is_ended()
    }

    /// A receiver that wakes when an event comes in.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.tick.subscribe()
    }

    /// Wait until the run has ended.
    pub(crate) async fn ended(&self) {
        let mut rx = self.subscribe();
        loop {
            rx.borrow_and_update();
            if self.is_ended() || rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Append an event, folding what it says into the record, and wake followers.
    fn push(&self, kind: EventKind) {
        {
            let mut r = lock(&self.record);
            match &kind {
                EventKind::Session { session_id, .. } => r.session_id = Some(session_id.clone()),
                EventKind::Usage {
                    input_tokens,
                    output_tokens,
                    cost_usd,
                } => {
                    r.usage = Some(Usage {
                        input_tokens: *input_tokens,
                        output_tokens: *output_tokens,
                        cost_usd: *cost_usd,
                    });
                }
                EventKind::Result { text, session_id, .. } => {
                    if text.is_some() {
                        r.result.clone_from(text);
                    }
                    if session_id.is_some() {
                        r.session_id.clone_from(session_id);
                    }
                }
                _ => {}
            }
        }
        let latest = {
            let mut log = lock(&self.log);
            log.push(kind);
            log.latest()
        };
        self.tick.send_replace(latest);
    }

    /// Record the end (with the run's raw output `raw`) and wake everyone; returns the record and the
    /// events to store.
    fn finish(
        &self,
        state: RunState,
        exit_code: Option<i64>,
        truncated: bool,
        raw: Arc<Vec<String>>,
    ) -> (RunRecord, Vec<RunEvent>) {
        *lock(&self.raw) = Some(raw);
        let (latest, events, truncated) = {
            let mut log = lock(&self.log);
            if truncated {
                log.mark_truncated();
            }
            log.finish(state, exit_code);
            (log.latest(), log.all(), log.truncated())
        };
        let record = {
            let mut r = lock(&self.record);
            r.state = state;
            r.exit_code = exit_code;
            r.ended_at = Some(now_rfc3339());
            r.truncated = truncated;
            r.clone()
        };
        self.tick.send_replace(latest);
        (record, events)
    }
}

/// The registry of runs.
pub(crate) struct Runs {
    execs: Arc<Execs>,
    store: Arc<dyn Store>,
    /// Running runs (and ended ones until they are stored), by id.
    live: Mutex<HashMap<String, Arc<RunEntry>>>,
    /// Held while an ended run is stored or an agent's runs are deleted, so a deleted agent's run is never
    /// stored again.
    persist: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Runs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runs")
            .field("live", &lock(&self.live).len())
            .finish_non_exhaustive()
    }
}

/// The run state an ended exec maps to.
fn state_of(exec: ExecState, exit_code: Option<i64>) -> RunState {
    match exec {
        ExecState::Exited if exit_code == Some(0) => RunState::Succeeded,
        ExecState::Exited | ExecState::TimedOut => RunState::Failed,
        ExecState::Cancelled => RunState::Cancelled,
        ExecState::Lost | ExecState::Running => RunState::Lost,
    }
}

impl Runs {
    /// A registry that starts its runs through `execs` and keeps them in `store`.
    pub(crate) fn new(execs: Arc<Execs>, store: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Self {
            execs,
            store,
            live: Mutex::new(HashMap::new()),
            persist: tokio::sync::Mutex::new(()),
        })
    }

    /// Start `new` in `agent`'s sandbox on the rights of `started_by`; answers the run as started (state
    /// `running`). The caller has checked that `started_by` may operate the agent.
    ///
    /// # Errors
    /// As [`check`]; 409 when the agent does not run or runs too many execs; a store error.
    pub(crate) async fn start(
        self: &Arc<Self>,
        ws: &WorkspaceId,
        agent: &AgentId,
        started_by: &UserId,
        new: NewRun,
    ) -> ApiResult<RunRecord> {
        check(&new)?;
        let args = harness::HarnessArgs {
            resume: new.resume.as_deref(),
            model: new.model.as_deref(),
            custom: new.argv.as_deref(),
            chatgpt_login: new.chatgpt_login,
        };
        let exec = NewExec {
            argv: harness::argv(new.harness, &args),
            env: harness::env(new.harness),
            cwd: harness::cwd(new.harness),
            // enforces: P1 — the prompt only ever reaches the harness as its standard input.
            stdin: Some(new.prompt.as_bytes().to_vec()),
            timeout: None,
        };
        let created_at = now_rfc3339();
        let exec = self.execs.start(ws, agent, started_by, exec).await?;
        let record = RunRecord {
            id: record::new_id(),
            agent: agent.clone(),
            workspace: ws.clone(),
            harness: new.harness,
            state: RunState::Running,
            exit_code: None,
            origin: new.origin,
            depth: new.depth,
            started_by: started_by.clone(),
            created_at,
            started_at: Some(now_rfc3339()),
            ended_at: None,
            prompt_bytes: u64::try_from(new.prompt.len()).unwrap_or(u64::MAX),
            session_id: None,
            usage: None,
            result: None,
            truncated: false,
            model: new.model,
            resume: new.resume,
            exec: Some(exec.record().id),
        };
        if let Err(e) = record::save(self.store.as_ref(), &record).await {
            // Nobody could ever see or cancel it: stop it now.
            let _ = self.execs.cancel(&exec).await;
            return Err(e);
        }
        let entry = Arc::new(RunEntry::new(
            record.clone(),
            EventLog::new(MAX_EVENT_BYTES),
            Some(Arc::clone(&exec)),
        ));
        entry.push(EventKind::State {
            state: RunState::Running,
        });
        lock(&self.live).insert(record.id.clone(), Arc::clone(&entry));
        tracing::info!(agent = %agent, workspace = %ws, run = %record.id, harness = new.harness.as_str(),
            depth = record.depth, "run started");
        tokio::spawn(Arc::clone(self).drive(entry, exec));
        let (this, agent) = (Arc::clone(self), agent.clone());
        tokio::spawn(async move {
            if let Err(e) = this.prune(&agent).await {
                tracing::warn!(agent = %agent, error = %e, "could not delete old runs");
            }
        });
        Ok(record)
    }

    /// The greatest depth among `agent`'s running runs (`None` when none runs).
    #[allow(dead_code, reason = "the agent-to-agent messages ask it (helper a2a)")]
    pub(crate) fn running_depth(&self, agent: &AgentId) -> Option<u32> {
        lock(&self.live)
            .values()
            .filter(|e| !e.is_ended())
            .filter_map(|e| {
                let r = lock(&e.record);
                (r.agent == *agent).then_some(r.depth)
            })
            .max()
    }

    /// Follow the exec's output to its end: split it into lines, keep the raw lines, parse them into events;
    /// then store the run.
    async fn drive(self: Arc<Self>, entry: Arc<RunEntry>, exec: Arc<ExecEntry>) {
        let (agent, id, harness) = {
            let r = lock(&entry.record);
            (r.agent.clone(), r.id.clone(), r.harness)
        };
        let mut parser = Parser::new(harness);
        let mut out = LineBuf::new();
        let mut err = LineBuf::new();
        let mut raw = RawLines::new();
        let mut truncated = false;
        let mut rx = exec.subscribe();
        let mut cursor = 0;
        let handle = |stream: Stream, line: String, parser: &mut Parser, raw: &mut RawLines| match stream {
            Stream::Stdout => {
                for kind in parser.line(&line) {
                    entry.push(kind);
                }
                raw.push(line);
            }
            Stream::Stderr => entry.push(EventKind::Raw { stream, line }),
        };
        loop {
            rx.borrow_and_update();
            let (events, ended) = exec.events_after(cursor);
            if events.first().is_some_and(|e| e.n > cursor + 1) {
                // The exec dropped output before this task read it.
                truncated = true;
            }
            for e in events {
                cursor = e.n;
                match e.kind {
                    ExecEvent::Stdout { data } => {
                        for line in out.push(&data) {
                            handle(Stream::Stdout, line, &mut parser, &mut raw);
                        }
                    }
                    ExecEvent::Stderr { data } => {
                        for line in err.push(&data) {
                            handle(Stream::Stderr, line, &mut parser, &mut raw);
                        }
                    }
                    ExecEvent::Exit { .. } | ExecEvent::End { .. } => {}
                }
            }
            if ended || rx.changed().await.is_err() {
                break;
            }
        }
        for (stream, buf) in [(Stream::Stdout, &mut out), (Stream::Stderr, &mut err)] {
            if let Some(line) = buf.finish() {
                handle(stream, line, &mut parser, &mut raw);
            }
            truncated |= buf.truncated();
        }
        for kind in parser.finish() {
            entry.push(kind);
        }
        truncated |= raw.truncated();
        let exec_record = exec.record();
        let state = state_of(exec_record.state, exec_record.exit_code);
        let raw = Arc::new(raw.all());
        let (record, events) = entry.finish(state, exec_record.exit_code, truncated, Arc::clone(&raw));
        tracing::info!(agent = %agent, run = %id, state = state.as_str(), exit_code = ?record.exit_code, "run ended");
        {
            let _guard = self.persist.lock().await;
            if !entry.forgotten.load(Ordering::SeqCst)
                && let Err(e) = record::save_ended(self.store.as_ref(), &record, &events, &raw).await
            {
                tracing::error!(agent = %agent, run = %id, error = %e, "could not store an ended run");
            }
        }
        lock(&self.live).remove(&id);
    }

    /// A run of `agent` in `workspace`: the live one, else the stored one.
    ///
    /// # Errors
    /// A store error.
    pub(crate) async fn find(
        &self,
        workspace: &WorkspaceId,
        agent: &AgentId,
        run: &str,
    ) -> ApiResult<Option<Arc<RunEntry>>> {
        if !record::valid_id(run) {
            return Ok(None);
        }
        let live = lock(&self.live).get(run).cloned();
        if let Some(entry) = live {
            let r = lock(&entry.record);
            let mine = r.agent == *agent && r.workspace == *workspace;
            drop(r);
            return Ok(mine.then_some(entry));
        }
        let Some(rec) = record::load(self.store.as_ref(), agent, run).await? else {
            return Ok(None);
        };
        if rec.workspace != *workspace {
            return Ok(None);
        }
        let events = record::load_events(self.store.as_ref(), agent, run).await?;
        let log = EventLog::ended(events, rec.state, rec.exit_code);
        Ok(Some(Arc::new(RunEntry::new(rec, log, None))))
    }

    /// The raw standard output lines of the ended run `entry` (bounded; empty while it runs or once lost):
    /// the entry's own until the store has them.
    ///
    /// # Errors
    /// A store error.
    pub(crate) async fn raw_lines(&self, entry: &RunEntry) -> ApiResult<Vec<String>> {
        if let Some(raw) = lock(&entry.raw).as_ref() {
            return Ok(raw.to_vec());
        }
        let record = lock(&entry.record).clone();
        let (agent, run) = (&record.agent, &record.id);
        Ok(record::load_raw(self.store.as_ref(), agent, run)
            .await?
            .unwrap_or_default())
    }

    /// The runs of `agent`, newest first.
    ///
    /// # Errors
    /// A store error.
    pub(crate) async fn list(&self, agent: &AgentId) -> ApiResult<Vec<RunRecord>> {
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

    /// Kill a running run's process group and wait (up to 10 s) for its end; an ended run is left as it is.
    ///
    /// # Errors
    /// The runtime's error when the kill fails.
    pub(crate) async fn cancel(&self, entry: &RunEntry) -> ApiResult<()> {
        let Some(exec) = entry.exec.as_ref().filter(|_| !entry.is_ended()) else {
            return Ok(());
        };
        self.execs.cancel(exec).await?;
        if tokio::time::timeout(Duration::from_secs(10), entry.ended())
            .await
            .is_err()
        {
            tracing::warn!(run = %lock(&entry.record).id, "a cancelled run has not ended after 10 s");
        }
        Ok(())
    }

    /// Delete the oldest ended runs of `agent` beyond [`KEEP_PER_AGENT`].
    async fn prune(&self, agent: &AgentId) -> ApiResult<()> {
        let records = record::list(self.store.as_ref(), Some(agent)).await?;
        let Some(excess) = records.len().checked_sub(KEEP_PER_AGENT).filter(|n| *n > 0) else {
            return Ok(());
        };
        let old: Vec<String> = records
            .into_iter()
            .filter(|r| r.state.is_final())
            .take(excess)
            .map(|r| r.id)
            .collect();
        let _guard = self.persist.lock().await;
        record::delete(self.store.as_ref(), agent, &old).await
    }

    /// Forget every run of a deleted agent (its sandbox is gone, and with it their processes).
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

    /// Mark every run a previous server left `queued` or `running` as `lost` (call after
    /// [`Execs::reconcile`], which killed their processes). Returns how many were marked.
    ///
    /// # Errors
    /// A store error.
    pub(crate) async fn reconcile(&self) -> ApiResult<usize> {
        let mut marked = 0;
        for mut rec in record::list(self.store.as_ref(), None).await? {
            if rec.state.is_final() || lock(&self.live).contains_key(&rec.id) {
                continue;
            }
            rec.state = RunState::Lost;
            rec.ended_at = Some(now_rfc3339());
            record::save(self.store.as_ref(), &rec).await?;
            tracing::info!(agent = %rec.agent, run = %rec.id, "run left running by a previous server marked lost");
            marked += 1;
        }
        Ok(marked)
    }
}
