//! Server-sent event streams (SERVER.md §3): every event has a monotonic id `<stream>.<n>` (the stream's
//! own key, then a counter), a client resumes with `Last-Event-ID` (or `?after=`), a keep-alive comment
//! goes out every 15 s, and the last event is `end` — also when the server shuts down.
//!
//! A resume id that names another stream, is malformed, or lies in the future is a 400: a client that
//! resumes wrongly learns it at once instead of silently missing or repeating events.

use std::convert::Infallible;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{ApiError, ApiResult};

/// Interval of the keep-alive comment.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The event id of event `n` of `stream`.
pub(crate) fn event_id(stream: &str, n: u64) -> String {
    format!("{stream}.{n}")
}

/// Where a client resumes: the `n` of the last event it saw (0: from the start). Reads `Last-Event-ID`,
/// else `after` (the `?after=` query value). `latest` is the newest `n` the stream has produced so far.
///
/// # Errors
/// 400 for an id of another stream, a malformed id, or one after `latest`.
pub(crate) fn resume_after(
    headers: &HeaderMap,
    after: Option<&str>,
    stream: &str,
    latest: u64,
) -> ApiResult<u64> {
    let given = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::bad_request("Last-Event-ID is not text"))?
                .trim()
                .to_owned(),
        ),
        None => after.map(|a| a.trim().to_owned()),
    };
    let Some(given) = given.filter(|g| !g.is_empty()) else {
        return Ok(0);
    };
    let number = match given.rsplit_once('.') {
        Some((s, n)) if s == stream => n,
        Some(_) => {
            return Err(ApiError::bad_request(format!(
                "event id {given:?} belongs to another stream (this stream's ids look like {})",
                event_id(stream, 1)
            )));
        }
        None => given.as_str(),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| ApiError::bad_request(format!("event id {given:?} is not an id of this stream")))?;
    if n > latest {
        return Err(ApiError::bad_request(format!(
            "event id {given:?} is in the future: the newest event of this stream is {}",
            event_id(stream, latest)
        )));
    }
    Ok(n)
}

/// Event `n` of `stream`, of type `kind`, with `data` as JSON (whose `type` field the caller sets).
pub(crate) fn event(stream: &str, n: u64, kind: &str, data: &impl Serialize) -> Event {
    let json = serde_json::to_string(data).unwrap_or_else(|_| "{}".to_owned());
    Event::default().id(event_id(stream, n)).event(kind).data(json)
}

/// The final event.
pub(crate) fn end_event(stream: &str, n: u64, reason: &str) -> Event {
    event(
        stream,
        n,
        "end",
        &serde_json::json!({ "type": "end", "reason": reason }),
    )
}

/// Answer with `events`, keep-alive comments, and an `end` event (id `end_n`) when the server shuts down
/// before `events` ends by itself (a stream that ends by itself sends its own `end`).
pub(crate) fn respond<S>(
    events: S,
    stream: String,
    end_n: impl Fn() -> u64 + Send + 'static,
    shutdown: CancellationToken,
) -> Response
where
    S: Stream<Item = Event> + Send + 'static,
{
    let events = events.take_until(shutdown.clone().cancelled_owned());
    let closing =
        futures_util::stream::once(async move { shutdown.is_cancelled() }).filter_map(move |cancelled| {
            let end = cancelled.then(|| end_event(&stream, end_n(), "server shutting down"));
            async move { end }
        });
    let all = events.chain(closing).map(Ok::<_, Infallible>);
    Sse::new(all)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}
