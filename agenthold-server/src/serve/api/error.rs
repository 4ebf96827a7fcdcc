//! Errors as `application/problem+json` (RFC 9457): `type`, `title`, `status`, `detail` and a stable
//! machine-readable `code`. Every failure of every handler leaves through [`ApiError`]; its status comes
//! from the error's classification ([`ErrorKind`]), never from matching message text.

use std::time::Duration;

use agenthold_core::ErrorKind;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The media type of error bodies.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// A failed API call.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    detail: String,
    retry_after: Option<Duration>,
}

/// The body of an error response.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Problem {
    /// A URI naming the problem type (`about:blank` plus the `code`).
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// The status's reason phrase.
    pub(crate) title: String,
    /// The HTTP status code.
    pub(crate) status: u16,
    /// What went wrong, for a human.
    pub(crate) detail: String,
    /// What went wrong, for a program: `not_found`, `forbidden`, `bad_request`, `conflict`, …
    pub(crate) code: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// What went wrong, for a human (the problem's `detail`).
    pub(crate) fn detail(&self) -> &str {
        &self.detail
    }

    /// The HTTP status this error answers with.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// 404 with the one body every missing or hidden thing gets (S5: a non-member cannot tell an agent it
    /// may not see from one that does not exist).
    pub(crate) fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "no such resource")
    }

    /// 403: a member whose role is too small.
    pub(crate) fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", detail)
    }

    /// 400: the request is malformed or a value is invalid.
    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", detail)
    }

    /// 401: no valid credentials.
    pub(crate) fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid personal token (Authorization: Bearer) or session cookie is required",
        )
    }

    /// 409: the thing exists but is not in a state for this.
    pub(crate) fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", detail)
    }

    /// 429 with `Retry-After`.
    pub(crate) fn rate_limited(retry_after: Duration) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests; retry after the time in Retry-After",
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// 413: a body over its cap.
    pub(crate) fn too_large(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", detail)
    }

    /// 500 without detail for the client (the cause goes to the log).
    pub(crate) fn internal(cause: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; the server log has the cause",
        )
    }

    /// The error of a lower layer, by its classification.
    pub(crate) fn from_kind(kind: ErrorKind, detail: &dyn std::fmt::Display) -> Self {
        match kind {
            ErrorKind::BadInput | ErrorKind::Policy | ErrorKind::Secret => {
                Self::bad_request(detail.to_string())
            }
            ErrorKind::NotFound => Self::not_found(),
            ErrorKind::Conflict => Self::conflict(detail.to_string()),
            ErrorKind::Denied => Self::forbidden(detail.to_string()),
            ErrorKind::Unavailable => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail.to_string())
            }
            ErrorKind::Timeout => Self::new(StatusCode::GATEWAY_TIMEOUT, "timeout", detail.to_string()),
            ErrorKind::Upstream => Self::new(StatusCode::BAD_GATEWAY, "upstream", detail.to_string()),
            _ => Self::internal(detail),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.detail)
    }
}

impl From<agenthold_sandbox::Error> for ApiError {
    fn from(e: agenthold_sandbox::Error) -> Self {
        Self::from_kind(e.kind(), &e)
    }
}

impl From<agenthold_core::Error> for ApiError {
    fn from(e: agenthold_core::Error) -> Self {
        Self::from_kind(e.kind(), &e)
    }
}

impl From<agenthold_auth::Error> for ApiError {
    fn from(e: agenthold_auth::Error) -> Self {
        Self::from_kind(e.kind(), &e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Problem {
            kind: format!("about:blank#{}", self.code),
            title: self.status.canonical_reason().unwrap_or("Error").to_owned(),
            status: self.status.as_u16(),
            detail: self.detail,
            code: self.code.to_owned(),
        };
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let mut response = (self.status, bytes).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(wait) = self.retry_after {
            // Whole seconds, rounded up: a client that waits this long is let in.
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}

/// `Result` of a handler.
pub(crate) type ApiResult<T> = std::result::Result<T, ApiError>;
