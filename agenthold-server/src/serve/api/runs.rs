//! `/api/v1/workspaces/{ws}/agents/{agent}/runs`: harness runs (SERVER.md §5 and §7, P1). Start one (202 at
//! once; the prompt goes to the harness's standard input), list an agent's runs, get one, follow its
//! normalised events as SSE (replay and reattach from any retained event id with `Last-Event-ID` or
//! `?after=`; the last event is `end`), and cancel it (the whole process group). Start and cancel are audited
//! by the API's audit layer like every state-changing call. The registry behind it is
//! [`crate::serve::runs`].
//!
//! Cancelling a run that already ended is a no-op answered 200 with the run as it is.
// enforces: P1, S9

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agenthold_core::Action;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::agents::agent_meta;
use super::{ApiError, ApiResult, Body, Caller, Params, Problem, sse};
use crate::serve::runs::events::{EventKind, RunEvent};
use crate::serve::runs::{Harness, NewRun, OriginJson, RunEntry, RunOrigin, RunRecord, Usage};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_runs, start_run))
        .routes(routes!(get_run))
        .routes(routes!(run_events))
        .routes(routes!(run_output))
        .routes(routes!(cancel_run))
}

/// `POST …/runs`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"harness": "custom", "prompt": "hello", "argv": ["true"]}))]
pub(crate) struct StartRun {
    /// `claude`, `codex` or `custom`.
    harness: Harness,
    /// The prompt, at most 256 KiB (413 `prompt_too_large` past it); given to the harness on its standard
    /// input, never as an argument.
    prompt: String,
    /// The command to run (`custom` only, where it is required): program and arguments, never a shell
    /// string.
    argv: Option<Vec<String>>,
    /// A session to continue (`claude`/`codex`): a run's `session_id`.
    resume: Option<String>,
    /// The model (`claude`/`codex`).
    model: Option<String>,
}

/// `?cursor=&limit=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// From a previous page's `next_cursor`.
    cursor: Option<String>,
    /// Runs per page, 1 to 500 (default 100).
    limit: Option<usize>,
}

/// `?after=` (instead of `Last-Event-ID`).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Resume after this event id (`<run>.<n>`).
    after: Option<String>,
}

/// A harness run.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunView {
    /// `run_…` (also the key of its event ids, `<id>.<n>`).
    id: String,
    /// Its agent.
    agent: String,
    /// The agent's workspace.
    workspace: String,
    /// `claude`, `codex` or `custom`.
    harness: Harness,
    /// `queued`, `running`, `succeeded`, `failed`, `cancelled` or `lost`.
    state: String,
    /// The harness's exit code once it exited (128 + signal number when killed).
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i64>,
    /// Who or what asked for it: `{kind: user|webhook|agent, user?, webhook?, agent?, run?}`.
    origin: OriginJson,
    /// Its place in a chain of agent-to-agent messages (0: not started by an agent).
    depth: u32,
    /// The user on whose rights it runs.
    started_by: String,
    /// When it was accepted (RFC 3339).
    created_at: String,
    /// When its process started (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    started_at: Option<String>,
    /// When it ended (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    ended_at: Option<String>,
    /// Size of the prompt in bytes.
    prompt_bytes: u64,
    /// The harness's session (pass as `resume` to continue it).
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    /// Tokens and cost as the harness reported them.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    /// The harness's final answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<String>,
    /// Whether older events or output were dropped (past the per-run caps).
    truncated: bool,
    /// The model asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    /// The session asked to resume.
    #[serde(skip_serializing_if = "Option::is_none")]
    resume: Option<String>,
    /// The exec that runs the harness process (`…/execs/{exec}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    exec: Option<String>,
}

impl From<RunRecord> for RunView {
    fn from(r: RunRecord) -> Self {
        Self {
            id: r.id,
            agent: r.agent.to_string(),
            workspace: r.workspace.to_string(),
            harness: r.harness,
            state: r.state.as_str().to_owned(),
            exit_code: r.exit_code,
            origin: r.origin.into(),
            depth: r.depth,
            started_by: r.started_by.to_string(),
            created_at: r.created_at,
            started_at: r.started_at,
            ended_at: r.ended_at,
            prompt_bytes: r.prompt_bytes,
            session_id: r.session_id,
            usage: r.usage,
            result: r.result,
            truncated: r.truncated,
            model: r.model,
            resume: r.resume,
            exec: r.exec,
        }
    }
}

/// A page of runs.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunList {
    /// Runs, newest first.
    items: Vec<RunView>,
    /// Pass as `cursor` for the next page; absent on the last.
    next_cursor: Option<String>,
}

/// The raw standard output lines of a run.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunOutput {
    /// The lines as the harness printed them (invalid UTF-8 replaced), oldest first; empty while the run
    /// runs and for a lost run.
    lines: Vec<String>,
    /// Whether older lines were dropped (past 8 MiB) or a line was cut (past 1 MiB).
    truncated: bool,
}

/// The SSE form of a stored event: `id: <run>.<n>`, `event: <type>`, `data: {"type": <type>, …}`.
fn to_event(run: &str, e: &RunEvent) -> Event {
    sse::event(run, e.n, e.kind.name(), &e.kind)
}

/// The events of `entry` after event `after`, following new ones as they come, up to `end`. `sent` keeps
/// the number of the last event handed out (the id of a shutdown's `end` event).
fn follow(entry: Arc<RunEntry>, after: u64, sent: Arc<AtomicU64>) -> impl Stream<Item = Event> + Send {
    let run = entry.record().id;
    let rx = entry.subscribe();
    let start = (
        entry,
        rx,
        after,
        std::collections::VecDeque::<RunEvent>::new(),
        false,
    );
    futures_util::stream::unfold(start, move |(entry, mut rx, mut cursor, mut queue, mut done)| {
        let run = run.clone();
        let sent = Arc::clone(&sent);
        async move {
            loop {
                if let Some(e) = queue.pop_front() {
                    cursor = e.n;
                    sent.store(e.n, Ordering::SeqCst);
                    done |= matches!(e.kind, EventKind::End { .. });
                    let event = to_event(&run, &e);
                    return Some((event, (entry, rx, cursor, queue, done)));
                }
                if done {
                    return None;
                }
                // Mark the current value seen before reading, so an event pushed after the read wakes us.
                rx.borrow_and_update();
                let (events, ended) = entry.events_after(cursor);
                if events.is_empty() {
                    if ended || rx.changed().await.is_err() {
                        return None;
                    }
                    continue;
                }
                queue.extend(events);
            }
        }
    })
}

fn location(ws: &str, agent: &str, run: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("/api/v1/workspaces/{ws}/agents/{agent}/runs/{run}")).ok()
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/agents/{agent}/runs", tag = "runs", request_body = StartRun,
    description = "Start a harness run and answer 202 at once with the run (state `running`). The server builds \
                   the command line (`claude -p --output-format stream-json --verbose …`, `codex exec --json …`, or \
                   the `custom` argv) and gives the prompt on standard input. Follow it with `…/runs/{run}/events`.",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 202, body = RunView, description = "started"),
        (status = 400, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "the agent does not run, or runs too many execs"),
        (status = 413, body = Problem, description = "`prompt_too_large`: the prompt is over 256 KiB"),
        (status = 422, body = Problem)),
    extensions(("x-agenthold-role" = json!("operator"))))]
async fn start_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Body(body): Body<StartRun>,
) -> ApiResult<Response> {
    let (ws, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Operate).await?;
    let new = NewRun {
        harness: body.harness,
        prompt: body.prompt,
        argv: body.argv,
        resume: body.resume,
        model: body.model,
        origin: RunOrigin::User(caller.user().clone()),
        depth: 0,
        chatgpt_login: false,
    };
    let record = state.start_run(&ws, &agent, caller.user(), new).await?;
    let id = record.id.clone();
    let mut response = (StatusCode::ACCEPTED, Json(RunView::from(record))).into_response();
    if let Some(loc) = location(ws.as_str(), agent.as_str(), &id) {
        response.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(response)
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/runs", tag = "runs",
    params(("ws" = String, Path), ("agent" = String, Path), ListQuery),
    responses((status = 200, body = RunList), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn list_runs(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Params(q): Params<ListQuery>,
) -> ApiResult<Json<RunList>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::View).await?;
    let limit = super::workspaces::page_limit(q.limit)?;
    let mut records = state.runs.list(&agent).await?;
    if let Some(cursor) = &q.cursor {
        records.retain(|r| r.id.as_str() < cursor.as_str());
    }
    let next_cursor = (records.len() > limit).then(|| records[limit - 1].id.clone());
    let items = records.into_iter().take(limit).map(RunView::from).collect();
    Ok(Json(RunList { items, next_cursor }))
}

/// The run named in a path, after checking `action` on its agent.
async fn run_entry(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    agent: &str,
    run: &str,
    action: Action,
) -> ApiResult<Arc<RunEntry>> {
    let (ws, agent, _) = agent_meta(state, caller, ws, agent, action).await?;
    state
        .runs
        .find(&ws, &agent, run)
        .await?
        .ok_or_else(ApiError::not_found)
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/runs/{run}", tag = "runs",
    params(("ws" = String, Path), ("agent" = String, Path), ("run" = String, Path)),
    responses((status = 200, body = RunView), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn get_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, run)): Path<(String, String, String)>,
) -> ApiResult<Json<RunView>> {
    let entry = run_entry(&state, &caller, &ws, &agent, &run, Action::View).await?;
    Ok(Json(entry.record().into()))
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/runs/{run}/events", tag = "runs",
    description = "The run's normalised events as SSE: `state`, `session`, `message` (`role`, `text`), `tool_call` \
                   (`id`, `name`, `input`), `tool_result` (`id`, `output`, `is_error`), `usage` (`input_tokens`, \
                   `output_tokens`, `cost_usd`), `result` (`text`, `is_error`, `session_id`), `raw` (`stream`, \
                   `line`: anything not parsed) and a final `end` (`state`, `exit_code`). Every event has the id \
                   `<run>.<n>` and a JSON `data` with its `type`; resume after any retained one with \
                   `Last-Event-ID` or `?after=`. An ended run replays what is retained.",
    params(("ws" = String, Path), ("agent" = String, Path), ("run" = String, Path), EventsQuery),
    responses((status = 200, content_type = "text/event-stream", description = "the event stream"),
        (status = 400, body = Problem, description = "a resume id of another stream or from the future"),
        (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn run_events(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, run)): Path<(String, String, String)>,
    Params(q): Params<EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let entry = run_entry(&state, &caller, &ws, &agent, &run, Action::View).await?;
    let after = sse::resume_after(&headers, q.after.as_deref(), &run, entry.latest())?;
    let sent = Arc::new(AtomicU64::new(after));
    let last = Arc::clone(&sent);
    Ok(sse::respond(
        follow(entry, after, sent),
        run,
        move || last.load(Ordering::SeqCst),
        state.shutdown.clone(),
    ))
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/runs/{run}/output", tag = "runs",
    description = "The raw standard output lines of an ended run, as the harness printed them (what the events \
                   were parsed from), bounded.",
    params(("ws" = String, Path), ("agent" = String, Path), ("run" = String, Path)),
    responses((status = 200, body = RunOutput), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn run_output(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, run)): Path<(String, String, String)>,
) -> ApiResult<Json<RunOutput>> {
    let entry = run_entry(&state, &caller, &ws, &agent, &run, Action::View).await?;
    let record = entry.record();
    let lines = state.runs.raw_lines(&entry).await?;
    Ok(Json(RunOutput {
        lines,
        truncated: record.truncated,
    }))
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/agents/{agent}/runs/{run}/cancel", tag = "runs",
    description = "Kill the run's whole process group and answer the run once it ended (state `cancelled`). \
                   Cancelling a run that already ended changes nothing and answers it as it is.",
    params(("ws" = String, Path), ("agent" = String, Path), ("run" = String, Path)),
    responses((status = 200, body = RunView), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("operator"))))]
async fn cancel_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, run)): Path<(String, String, String)>,
) -> ApiResult<Json<RunView>> {
    let entry = run_entry(&state, &caller, &ws, &agent, &run, Action::Operate).await?;
    state.runs.cancel(&entry).await?;
    Ok(Json(entry.record().into()))
}
