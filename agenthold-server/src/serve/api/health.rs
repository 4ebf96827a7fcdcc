//! `/healthz` (the process answers), `/readyz` (the store answers and the server is not shutting down) and
//! `/metrics` (Prometheus text). Outside `/api/v1` and without credentials, for the operator's probes.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::serve::state::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics_text))
}

async fn ready(State(state): State<AppState>) -> impl IntoResponse {
    if state.shutdown.is_cancelled() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    match state.store.get("server_meta", b"probe").await {
        Ok(_) => (StatusCode::OK, "ready\n"),
        Err(e) => {
            tracing::warn!(error = %e, "readiness: the store does not answer");
            (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
        }
    }
}

async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    let body = state.metrics.as_ref().map(|h| h.render()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}
