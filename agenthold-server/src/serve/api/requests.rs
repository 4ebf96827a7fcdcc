//! `…/agents/{agent}/requests`: an agent's request log (E16) for viewers — a page of entries, newest
//! first, filtered by verdict, host and kind — and `…/requests/stream`, its live tail as server-sent events.
//!
//! Entries are the runtime's [`LogEntry`], serialised exactly as the runtime serialises them (the fields of
//! `agenthold run --log`, plus `seq`). `seq` numbers every entry of every agent from one counter, so it
//! orders an agent's entries and is both the page cursor and the `n` of the stream's event ids
//! (`<agent>.<seq>`). The log lives in the gateway's memory (the newest `egress.log_keep` entries per agent):
//! a restarted server starts a new one, numbered from 1 again.
//!
//! The stream subscribes to the runtime's broadcast of new entries *before* it reads the entries it
//! replays, and skips live entries whose `seq` it already sent, so nothing is lost or repeated between
//! the two; a receiver that falls behind (more than the broadcast's 1024 entries) fills the gap from the
//! agent's held entries. One broadcast receiver per subscriber: nothing polls.
// enforces: E16

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agenthold_core::{Action, AgentId};
use agenthold_egress::log::{Decision, LogEntry, LogKind};
use agenthold_sandbox::Runtime;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::agents::agent_meta;
use super::{ApiError, ApiResult, Caller, Params, Problem, sse};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_requests))
        .routes(routes!(stream_requests))
}

/// `?cursor=&limit=&verdict=&host=&kind=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct RequestQuery {
    /// A previous page's `next_cursor` (a `seq`): entries older than it.
    cursor: Option<String>,
    /// Entries per page, 1 to 500 (default 100).
    limit: Option<usize>,
    /// `allowed` or `denied`.
    verdict: Option<String>,
    /// Only entries for this host (exact, case-insensitive).
    host: Option<String>,
    /// `dns`, `tcp`, `tls`, `http` or `connect`.
    kind: Option<String>,
}

/// `?after=&verdict=&host=&kind=` of the stream.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct StreamQuery {
    /// Resume after this event id (as `Last-Event-ID`, which wins when both are given).
    after: Option<String>,
    /// `allowed` or `denied`.
    verdict: Option<String>,
    /// Only entries for this host (exact, case-insensitive).
    host: Option<String>,
    /// `dns`, `tcp`, `tls`, `http` or `connect`.
    kind: Option<String>,
}

/// One request log entry (E16), as the runtime writes it.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code, reason = "the schema of LogEntry in the OpenAPI document")]
pub(crate) struct RequestEntry {
    /// Position in the log (one counter for every agent; greater is later).
    seq: u64,
    /// When (RFC 3339, UTC).
    time: String,
    /// The agent.
    agent: String,
    /// `dns`, `tcp`, `tls`, `http` or `connect`.
    kind: String,
    /// Host name (or address).
    host: Option<String>,
    /// Destination port.
    port: Option<u16>,
    /// HTTP method, or DNS query type.
    method: Option<String>,
    /// HTTP path (without the query string).
    path: Option<String>,
    /// HTTP status, or DNS response code.
    status: Option<u16>,
    /// `allowed` or `denied`.
    decision: String,
    /// Why it was denied (`not_in_allowlist`, …), or what failed.
    reason: Option<String>,
    /// Whether a secret was injected.
    secret_injected: bool,
    /// The injected secret's name (never its value).
    secret: Option<String>,
    /// Bytes from the sandbox upstream.
    bytes_up: u64,
    /// Bytes from upstream to the sandbox.
    bytes_down: u64,
    /// `open` or `closed` for long-lived connections, else null.
    phase: Option<String>,
}

/// A page of the request log, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RequestPage {
    /// Entries, newest first.
    #[schema(value_type = Vec<RequestEntry>)]
    items: Vec<LogEntry>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    next_cursor: Option<String>,
}

/// Which entries a query wants.
#[derive(Debug, Default)]
struct Filter {
    decision: Option<Decision>,
    host: Option<String>,
    kind: Option<LogKind>,
}

impl Filter {
    fn parse(verdict: Option<&str>, host: Option<&str>, kind: Option<&str>) -> ApiResult<Self> {
        let decision = match verdict {
            None => None,
            Some("allowed") => Some(Decision::Allowed),
            Some("denied") => Some(Decision::Denied),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "verdict must be allowed or denied, found {other:?}"
                )));
            }
        };
        let kind = match kind {
            None => None,
            Some(k) => Some(
                serde_json::from_value::<LogKind>(serde_json::Value::String(k.to_owned())).map_err(|_| {
                    ApiError::bad_request(format!(
                        "kind must be dns, tcp, tls, http or connect, found {k:?}"
                    ))
                })?,
            ),
        };
        if host.is_some_and(|h| h.is_empty() || h.len() > 255) {
            return Err(ApiError::bad_request("host must be 1 to 255 characters"));
        }
        Ok(Self {
            decision,
            host: host.map(str::to_ascii_lowercase),
            kind,
        })
    }

    fn wants(&self, e: &LogEntry) -> bool {
        self.decision.is_none_or(|d| d == e.decision)
            && self.kind.is_none_or(|k| k == e.kind)
            && self
                .host
                .as_ref()
                .is_none_or(|h| e.host.as_deref().is_some_and(|eh| eh.eq_ignore_ascii_case(h)))
    }
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/requests", tag = "request log",
    params(("ws" = String, Path), ("agent" = String, Path), RequestQuery),
    responses((status = 200, body = RequestPage), (status = 400, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn list_requests(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Params(q): Params<RequestQuery>,
) -> ApiResult<Json<RequestPage>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::View).await?;
    let limit = super::workspaces::page_limit(q.limit)?;
    let filter = Filter::parse(q.verdict.as_deref(), q.host.as_deref(), q.kind.as_deref())?;
    let before = match q.cursor.as_deref() {
        None | Some("") => u64::MAX,
        Some(c) => c
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request(format!("cursor {c:?} is not a cursor of this log")))?,
    };
    let mut items = Vec::with_capacity(limit);
    let mut next_cursor = None;
    for e in state
        .runtime
        .request_log_since(&agent, 0)
        .into_iter()
        .rev()
        .filter(|e| e.seq < before && filter.wants(e))
    {
        if items.len() == limit {
            next_cursor = items.last().map(|last: &LogEntry| last.seq.to_string());
            break;
        }
        items.push(e);
    }
    Ok(Json(RequestPage { items, next_cursor }))
}

/// The event of one entry: the entry's own JSON plus `"type": "request"`.
#[derive(Serialize)]
struct EntryEvent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    entry: &'a LogEntry,
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/requests/stream", tag = "request log",
    params(("ws" = String, Path), ("agent" = String, Path), StreamQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "resume after this event id")),
    responses((status = 200, content_type = "text/event-stream",
            description = "events `request` (id `<agent>.<seq>`, data: the entry and `\"type\":\"request\"`), then `end` when the agent is deleted or the server stops"),
        (status = 400, body = Problem, description = "a resume id of another stream, malformed, or one this stream never sent"),
        (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn stream_requests(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Params(q): Params<StreamQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::View).await?;
    let filter = Filter::parse(q.verdict.as_deref(), q.host.as_deref(), q.kind.as_deref())?;
    let key = agent.to_string();
    // Watch for deletion and subscribe before reading what is held: nothing falls between.
    let gone = state.agents_gone.watch(&agent);
    let live = state.runtime.subscribe_requests();
    let after = sse::resume_after(&headers, q.after.as_deref(), &key, u64::MAX)?;
    let replay = state.runtime.request_log_since(&agent, after);
    if after > 0 && replay.is_empty() {
        // Every id this stream sends is the seq of one of the agent's entries, and the ring keeps the
        // newest: a resume id with nothing after it must be the newest entry itself. Anything else was
        // never sent (from the future, or from a server before a restart, whose log is gone).
        let newest = state.runtime.request_log_since(&agent, after - 1);
        if newest.first().is_none_or(|e| e.seq != after) {
            return Err(ApiError::bad_request(format!(
                "event id {:?} was never sent by this stream (from the future, or from before the server restarted)",
                sse::event_id(&key, after)
            )));
        }
    }
    let last = Arc::new(AtomicU64::new(after));
    let tail = Tail {
        runtime: Arc::clone(&state.runtime),
        agent,
        key: key.clone(),
        filter,
        live,
        gone,
        queue: replay.into_iter().collect(),
        last: Arc::clone(&last),
        done: false,
    };
    let events = futures_util::stream::unfold(tail, |mut tail| async move {
        let event = match tail.next().await? {
            Item::Entry(entry) => sse::event(
                &tail.key,
                entry.seq,
                "request",
                &EntryEvent {
                    kind: "request",
                    entry: &entry,
                },
            ),
            Item::End(n, reason) => sse::end_event(&tail.key, n, reason),
        };
        Some((event, tail))
    });
    Ok(sse::respond(
        events,
        key,
        move || last.load(Ordering::Relaxed),
        state.shutdown.clone(),
    ))
}

/// What a [`Tail`] produces.
#[derive(Debug)]
enum Item {
    /// An entry to send.
    Entry(Arc<LogEntry>),
    /// The end, with the resume point and why.
    End(u64, &'static str),
}

/// One subscriber's position in an agent's log.
struct Tail {
    runtime: Arc<Runtime>,
    agent: AgentId,
    key: String,
    filter: Filter,
    live: broadcast::Receiver<Arc<LogEntry>>,
    gone: CancellationToken,
    /// Entries read from the held log, not sent yet.
    queue: VecDeque<LogEntry>,
    /// The last `seq` passed (sent or filtered out): the stream's resume point, and the `n` of `end`.
    last: Arc<AtomicU64>,
    done: bool,
}

impl Tail {
    /// The next item; `None` after the end.
    async fn next(&mut self) -> Option<Item> {
        if self.done {
            return None;
        }
        loop {
            while let Some(entry) = self.queue.pop_front() {
                if self.pass(&entry) {
                    return Some(Item::Entry(Arc::new(entry)));
                }
            }
            let received = tokio::select! {
                biased;
                () = self.gone.cancelled() => {
                    self.done = true;
                    return Some(Item::End(self.last.load(Ordering::Relaxed), "agent deleted"));
                }
                r = self.live.recv() => r,
            };
            match received {
                Ok(entry) if entry.agent == self.agent => {
                    if self.pass(&entry) {
                        return Some(Item::Entry(entry));
                    }
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => {
                    // Fell behind the broadcast: what it skipped is still in the agent's ring.
                    let after = self.last.load(Ordering::Relaxed);
                    self.queue = self.runtime.request_log_since(&self.agent, after).into();
                }
                Err(RecvError::Closed) => {
                    self.done = true;
                    return Some(Item::End(self.last.load(Ordering::Relaxed), "request log closed"));
                }
            }
        }
    }

    /// Whether `entry` is new and wanted; moves the resume point past it either way.
    fn pass(&self, entry: &LogEntry) -> bool {
        if entry.seq <= self.last.load(Ordering::Relaxed) {
            return false;
        }
        self.last.store(entry.seq, Ordering::Relaxed);
        self.filter.wants(entry)
    }
}

#[cfg(test)]
mod tests;
