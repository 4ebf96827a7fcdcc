//! `/api/v1/workspaces/{ws}/agents/{agent}/execs`: commands in an agent's sandbox as server-side objects
//! (SERVER.md §3, P1). Start one and wait for its output as JSON (the contract call), follow it as SSE, or
//! detach; list, get, follow or reattach from any retained event id (`Last-Event-ID`, `?after=`), and
//! cancel (the whole process group). The registry behind it is [`crate::serve::execs`].
//!
//! Cancelling an exec that already ended is a no-op answered 200 with the exec as it is, so a client may
//! retry a cancel whose answer it lost.
// enforces: P1, S9

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agenthold_core::Action;
use agenthold_core::sandbox::sandbox_path;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::agents::agent_meta;
use super::{ApiError, ApiResult, Body, Caller, Params, Problem, sse};
use crate::serve::execs::output::{EventKind, StoredEvent};
use crate::serve::execs::{ExecEntry, ExecRecord, NewExec};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_execs, start_exec))
        .routes(routes!(get_exec))
        .routes(routes!(exec_events))
        .routes(routes!(cancel_exec))
}

/// Most arguments an exec may have.
const MAX_ARGV: usize = 4096;
/// Most environment variables an exec may set.
const MAX_ENV: usize = 4096;
/// Longest timeout, in seconds (a day).
const MAX_TIMEOUT: u64 = 86_400;

/// `POST …/execs`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartExec {
    /// Program and arguments (1 to 4096 items, no NUL bytes); run as given, never through a shell.
    argv: Vec<String>,
    /// Kill the command (its whole process group) after this many seconds, 1 to 86400; state `timed_out`.
    timeout: Option<u64>,
    /// Extra environment variables.
    env: Option<BTreeMap<String, String>>,
    /// Working directory (absolute).
    cwd: Option<String>,
    /// Text for standard input (else standard input is empty).
    stdin: Option<String>,
    /// Bytes for standard input, base64 (instead of `stdin`).
    stdin_b64: Option<String>,
}

/// `?detach=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct StartQuery {
    /// Answer 202 at once with the running exec instead of waiting or streaming.
    detach: Option<bool>,
}

/// `?cursor=&limit=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// From a previous page's `next_cursor`.
    cursor: Option<String>,
    /// Execs per page, 1 to 500 (default 100).
    limit: Option<usize>,
}

/// `?after=` (instead of `Last-Event-ID`).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Resume after this event id (`<exec>.<n>`).
    after: Option<String>,
}

/// An exec.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ExecView {
    /// Exec id (also the key of its event ids, `<id>.<n>`).
    id: String,
    /// Its agent.
    agent: String,
    /// Program and arguments.
    argv: Vec<String>,
    /// Working directory, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
    /// Timeout in seconds, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<u64>,
    /// `running`, `exited`, `cancelled`, `timed_out` or `lost`.
    state: String,
    /// Exit code once ended (128 + signal number when killed; 124 or 137 after a timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i64>,
    /// When it started (RFC 3339).
    started_at: String,
    /// When it ended (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    ended_at: Option<String>,
    /// Whether older output was dropped (more than 8 MiB of output): its events start later.
    truncated: bool,
    /// Who started it.
    started_by: String,
}

impl From<ExecRecord> for ExecView {
    fn from(r: ExecRecord) -> Self {
        Self {
            id: r.id,
            agent: r.agent.to_string(),
            argv: r.argv,
            cwd: r.cwd,
            timeout: r.timeout,
            state: r.state.as_str().to_owned(),
            exit_code: r.exit_code,
            started_at: r.started_at,
            ended_at: r.ended_at,
            truncated: r.truncated,
            started_by: r.started_by.to_string(),
        }
    }
}

/// An ended exec with its output.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ExecResult {
    /// The exec.
    #[serde(flatten)]
    exec: ExecView,
    /// Standard output as UTF-8 text, invalid bytes replaced by U+FFFD.
    stdout: String,
    /// Standard error as UTF-8 text, invalid bytes replaced by U+FFFD.
    stderr: String,
    /// Standard output, the exact bytes, base64.
    stdout_b64: String,
    /// Standard error, the exact bytes, base64.
    stderr_b64: String,
}

/// A page of execs.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ExecList {
    /// Execs, newest first.
    items: Vec<ExecView>,
    /// Pass as `cursor` for the next page; absent on the last.
    next_cursor: Option<String>,
}

fn check(body: &StartExec) -> ApiResult<()> {
    if body.argv.is_empty() || body.argv.len() > MAX_ARGV {
        return Err(ApiError::bad_request(format!(
            "argv must have 1 to {MAX_ARGV} items, found {}",
            body.argv.len()
        )));
    }
    if body.argv.iter().any(|a| a.contains('\0')) {
        return Err(ApiError::bad_request("argv items may not contain NUL bytes"));
    }
    if let Some(t) = body.timeout
        && !(1..=MAX_TIMEOUT).contains(&t)
    {
        return Err(ApiError::bad_request(format!(
            "timeout must be 1 to {MAX_TIMEOUT} seconds, found {t}"
        )));
    }
    if let Some(env) = &body.env {
        if env.len() > MAX_ENV {
            return Err(ApiError::bad_request(format!(
                "at most {MAX_ENV} environment variables"
            )));
        }
        for (k, v) in env {
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                return Err(ApiError::bad_request(format!(
                    "environment variable {k:?}: names are non-empty without '=' or NUL, values without NUL"
                )));
            }
        }
    }
    if body.stdin.is_some() && body.stdin_b64.is_some() {
        return Err(ApiError::bad_request("give stdin or stdin_b64, not both"));
    }
    Ok(())
}

fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            m.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

fn result(entry: &ExecEntry) -> ExecResult {
    let (out, err) = entry.collected();
    ExecResult {
        exec: entry.record().into(),
        stdout: String::from_utf8_lossy(&out).into_owned(),
        stderr: String::from_utf8_lossy(&err).into_owned(),
        stdout_b64: STANDARD.encode(&out),
        stderr_b64: STANDARD.encode(&err),
    }
}

/// The SSE form of a stored event.
fn to_event(exec: &str, e: &StoredEvent) -> Event {
    let data = match &e.kind {
        EventKind::Stdout { data } | EventKind::Stderr { data } => serde_json::json!({
            "type": e.kind.name(),
            "data": String::from_utf8_lossy(data),
            "data_b64": STANDARD.encode(data),
        }),
        EventKind::Exit { exit_code, state } => serde_json::json!({
            "type": "exit",
            "exit_code": exit_code,
            "state": state.as_str(),
        }),
        EventKind::End { state } => serde_json::json!({
            "type": "end",
            "reason": state.as_str(),
            "state": state.as_str(),
        }),
    };
    sse::event(exec, e.n, e.kind.name(), &data)
}

/// The events of `entry` after event `after`, following new ones as they come, up to `end`. `sent` keeps the
/// number of the last event handed out (the id of a shutdown's `end` event).
fn follow(entry: Arc<ExecEntry>, after: u64, sent: Arc<AtomicU64>) -> impl Stream<Item = Event> + Send {
    let exec = entry.record().id;
    let rx = entry.subscribe();
    let start = (
        entry,
        rx,
        after,
        std::collections::VecDeque::<StoredEvent>::new(),
        false,
    );
    futures_util::stream::unfold(start, move |(entry, mut rx, mut cursor, mut queue, mut done)| {
        let exec = exec.clone();
        let sent = Arc::clone(&sent);
        async move {
            loop {
                if let Some(e) = queue.pop_front() {
                    cursor = e.n;
                    sent.store(e.n, Ordering::SeqCst);
                    done |= matches!(e.kind, EventKind::End { .. });
                    let event = to_event(&exec, &e);
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

fn stream_response(state: &AppState, entry: Arc<ExecEntry>, after: u64) -> Response {
    let exec = entry.record().id;
    let sent = Arc::new(AtomicU64::new(after));
    let last = Arc::clone(&sent);
    sse::respond(
        follow(entry, after, sent),
        exec,
        move || last.load(Ordering::SeqCst),
        state.shutdown.clone(),
    )
}

fn location(ws: &str, agent: &str, exec: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("/api/v1/workspaces/{ws}/agents/{agent}/execs/{exec}")).ok()
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/agents/{agent}/execs", tag = "execs", request_body = StartExec,
    description = "Start a command. By default (`Accept: application/json`) wait for it to end and answer 200 with \
                   its output; with `Accept: text/event-stream` answer its events as SSE (as `…/events`); with \
                   `?detach=true` answer 202 at once. The exec keeps running when the client goes away.",
    params(("ws" = String, Path), ("agent" = String, Path), StartQuery),
    responses((status = 200, body = ExecResult, description = "ended (wait), or its SSE stream"),
        (status = 202, body = ExecView, description = "started (detach)"),
        (status = 400, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "the agent does not run, or runs too many execs"),
        (status = 413, body = Problem), (status = 422, body = Problem)),
    extensions(("x-agenthold-role" = json!("operator"))))]
async fn start_exec(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Params(q): Params<StartQuery>,
    headers: HeaderMap,
    Body(body): Body<StartExec>,
) -> ApiResult<Response> {
    let (ws, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Operate).await?;
    check(&body)?;
    let cwd = body.cwd.as_deref().map(sandbox_path).transpose()?;
    let stdin = match (body.stdin, body.stdin_b64) {
        (Some(text), _) => Some(text.into_bytes()),
        (None, Some(b64)) => Some(
            STANDARD
                .decode(b64.trim())
                .map_err(|e| ApiError::bad_request(format!("stdin_b64 is not base64: {e}")))?,
        ),
        (None, None) => None,
    };
    let new = NewExec {
        argv: body.argv,
        env: body.env.unwrap_or_default(),
        cwd,
        stdin,
        timeout: body.timeout,
    };
    let entry = state.execs.start(&ws, &agent, caller.user(), new).await?;
    let id = entry.record().id;
    let mut response = if q.detach.unwrap_or(false) {
        (StatusCode::ACCEPTED, Json(ExecView::from(entry.record()))).into_response()
    } else if wants_sse(&headers) {
        stream_response(&state, entry, 0)
    } else {
        tokio::select! {
            () = entry.ended() => {}
            () = state.shutdown.cancelled() => {
                return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable",
                    format!("the server is shutting down before exec {id} ended")));
            }
        }
        Json(result(&entry)).into_response()
    };
    if let Some(loc) = location(ws.as_str(), agent.as_str(), &id) {
        response.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(response)
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/execs", tag = "execs",
    params(("ws" = String, Path), ("agent" = String, Path), ListQuery),
    responses((status = 200, body = ExecList), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn list_execs(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Params(q): Params<ListQuery>,
) -> ApiResult<Json<ExecList>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::View).await?;
    let limit = super::workspaces::page_limit(q.limit)?;
    let mut records = state.execs.list(&agent).await?;
    if let Some(cursor) = &q.cursor {
        records.retain(|r| r.id.as_str() < cursor.as_str());
    }
    let next_cursor = (records.len() > limit).then(|| records[limit - 1].id.clone());
    let items = records.into_iter().take(limit).map(ExecView::from).collect();
    Ok(Json(ExecList { items, next_cursor }))
}

/// The exec named in a path, after checking `action` on its agent.
async fn exec_entry(
    state: &AppState,
    caller: &Caller,
    ws: &str,
    agent: &str,
    exec: &str,
    action: Action,
) -> ApiResult<Arc<ExecEntry>> {
    let (ws, agent, _) = agent_meta(state, caller, ws, agent, action).await?;
    state
        .execs
        .find(&ws, &agent, exec)
        .await?
        .ok_or_else(ApiError::not_found)
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/execs/{exec}", tag = "execs",
    params(("ws" = String, Path), ("agent" = String, Path), ("exec" = String, Path)),
    responses((status = 200, body = ExecView), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn get_exec(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, exec)): Path<(String, String, String)>,
) -> ApiResult<Json<ExecView>> {
    let entry = exec_entry(&state, &caller, &ws, &agent, &exec, Action::View).await?;
    Ok(Json(entry.record().into()))
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/execs/{exec}/events", tag = "execs",
    description = "The exec's events as SSE: `stdout` and `stderr` (`data` as text, `data_b64` the exact bytes), \
                   one `exit` (`exit_code`, `state`) and a final `end`. Every event has the id `<exec>.<n>`; resume \
                   after any retained one with `Last-Event-ID` or `?after=`. An ended exec replays what is retained.",
    params(("ws" = String, Path), ("agent" = String, Path), ("exec" = String, Path), EventsQuery),
    responses((status = 200, content_type = "text/event-stream", description = "the event stream"),
        (status = 400, body = Problem, description = "a resume id of another stream or from the future"),
        (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn exec_events(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, exec)): Path<(String, String, String)>,
    Params(q): Params<EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let entry = exec_entry(&state, &caller, &ws, &agent, &exec, Action::View).await?;
    let after = sse::resume_after(&headers, q.after.as_deref(), &exec, entry.latest())?;
    Ok(stream_response(&state, entry, after))
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/agents/{agent}/execs/{exec}/cancel", tag = "execs",
    description = "Kill the exec's whole process group and answer the exec once it ended (state `cancelled`). \
                   Cancelling an exec that already ended changes nothing and answers it as it is.",
    params(("ws" = String, Path), ("agent" = String, Path), ("exec" = String, Path)),
    responses((status = 200, body = ExecView), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("operator"))))]
async fn cancel_exec(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent, exec)): Path<(String, String, String)>,
) -> ApiResult<Json<ExecView>> {
    let entry = exec_entry(&state, &caller, &ws, &agent, &exec, Action::Operate).await?;
    state.execs.cancel(&entry).await?;
    Ok(Json(entry.record().into()))
}
