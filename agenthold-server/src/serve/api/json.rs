//! JSON request bodies whose every rejection (not JSON, wrong content type, unknown field, wrong type,
//! over the size cap) is a problem+json 4xx naming the problem, and JSON responses.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON request body (`Content-Type: application/json`).
#[derive(Debug)]
pub(crate) struct Body<T>(pub(crate) T);

impl<S, T> FromRequest<S> for Body<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(reject(&rejection)),
        }
    }
}

fn reject(rejection: &JsonRejection) -> ApiError {
    match rejection {
        JsonRejection::MissingJsonContentType(_) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the body must be JSON, sent with Content-Type: application/json",
        ),
        JsonRejection::JsonSyntaxError(e) => {
            ApiError::bad_request(format!("malformed JSON: {}", e.body_text()))
        }
        JsonRejection::JsonDataError(e) => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", e.body_text())
        }
        JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::too_large("the request body is over the 8 MiB cap")
        }
        other => ApiError::bad_request(other.body_text()),
    }
}

/// Query parameters (`?cursor=&limit=`); a malformed query is a problem+json 400.
#[derive(Debug)]
pub(crate) struct Params<T>(pub(crate) T);

impl<S, T> axum::extract::FromRequestParts<S> for Params<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::bad_request(rejection.body_text())),
        }
    }
}
