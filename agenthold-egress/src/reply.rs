//! The gateway's own short answers to a sandbox (refusals and failures, logged as they are given), and the
//! bodies they are made of.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::BodyExt;

use crate::context::Context;
use crate::log::{LogEntry, PendingEntry};
use crate::upstream::ProxyBody;

/// A short plain-text answer from the gateway itself, logged now.
pub(crate) fn refuse(
    gw: &Context,
    mut entry: LogEntry,
    status: StatusCode,
    why: &str,
) -> Response<ProxyBody> {
    entry.status = Some(status.as_u16());
    gw.log.record(entry);
    answer(status, why)
}

/// [`refuse`] for an entry that is already pending (it is recorded when `pending` drops, here).
pub(crate) fn refuse_pending(
    mut pending: PendingEntry,
    status: StatusCode,
    why: &str,
) -> Response<ProxyBody> {
    pending.entry.status = Some(status.as_u16());
    drop(pending);
    answer(status, why)
}

/// A short plain-text answer from the gateway itself (not logged here).
pub(crate) fn answer(status: StatusCode, why: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(full(format!("agenthold: {why}\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A body of `text`.
pub(crate) fn full(text: impl Into<Bytes>) -> ProxyBody {
    http_body_util::Full::new(text.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub(crate) fn empty() -> ProxyBody {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed()
}
