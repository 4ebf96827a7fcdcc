//! `GET /api/v1/workspaces/{ws}/agents/{agent}/terminal`: the one WebSocket of the API (SERVER.md §3), an
//! interactive shell on a pseudo-terminal in the agent's sandbox (P1). Binary frames carry keystrokes in and
//! output out; text frames carry JSON control: `{"type":"resize","cols":N,"rows":N}` from the client,
//! `{"type":"exit","exit_code":N}` (then a close) and `{"type":"error","message":…}` from the server.
//! Closing the socket kills the shell and everything it started (the terminal is dropped).
//!
//! Cross-site WebSocket hijacking (S6): the upgrade is refused (403) when an `Origin` header names another
//! origin than the configured public URL's; a request without `Origin` (not a browser) is let through.
// enforces: P1, S6

use agenthold_core::Action;
use agenthold_core::sandbox::{Terminal, TerminalEvent, TerminalRequest};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::agents::agent_meta;
use super::{ApiError, ApiResult, Caller, Params, Problem};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(terminal))
}

/// Largest window, either way.
const MAX_SIZE: u16 = 1000;

/// `?cols=&rows=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct TerminalQuery {
    /// Initial width in columns, 1 to 1000 (default 80).
    cols: Option<u16>,
    /// Initial height in rows, 1 to 1000 (default 24).
    rows: Option<u16>,
}

/// A control message from the client (a text frame).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Control {
    /// New window size.
    Resize { cols: u16, rows: u16 },
}

fn check_size(cols: u16, rows: u16) -> Result<(), String> {
    if (1..=MAX_SIZE).contains(&cols) && (1..=MAX_SIZE).contains(&rows) {
        Ok(())
    } else {
        Err(format!(
            "cols and rows must be 1 to {MAX_SIZE}, found {cols}x{rows}"
        ))
    }
}

/// `scheme://host[:port]` of a URL, lower-cased.
fn origin_of(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    format!("{scheme}://{authority}").to_ascii_lowercase()
}

/// 403 when the request's `Origin` is another than the public URL's (S6).
fn check_origin(state: &AppState, headers: &HeaderMap) -> ApiResult<()> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("").trim().to_ascii_lowercase();
    if origin == origin_of(&state.public_url) {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "a terminal opens only from the server's own origin {} (S6)",
            origin_of(&state.public_url)
        )))
    }
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/terminal", tag = "terminal",
    description = "A WebSocket upgrade (`Connection: Upgrade`, `Upgrade: websocket`): an interactive shell on a \
                   terminal in the sandbox. Binary frames carry keystrokes in and output out; text frames carry \
                   JSON control: `{\"type\":\"resize\",\"cols\":N,\"rows\":N}` in, `{\"type\":\"exit\",\
                   \"exit_code\":N}` out when the shell ends (then the server closes). Closing the socket kills \
                   the shell. A browser's `Origin` must be the server's public origin (else 403).",
    params(("ws" = String, Path), ("agent" = String, Path), TerminalQuery),
    responses((status = 101, description = "switching to the WebSocket protocol"),
        (status = 400, body = Problem, description = "not a WebSocket upgrade, or a bad size"),
        (status = 403, body = Problem, description = "too small a role, or another origin"),
        (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("operator"))))]
async fn terminal(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Params(q): Params<TerminalQuery>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    check_origin(&state, &headers)?;
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Operate).await?;
    let upgrade = upgrade
        .map_err(|e| ApiError::bad_request(format!("this is a WebSocket endpoint: {}", e.body_text())))?;
    let (cols, rows) = (q.cols.unwrap_or(80), q.rows.unwrap_or(24));
    check_size(cols, rows).map_err(ApiError::bad_request)?;
    let request = TerminalRequest {
        cols,
        rows,
        ..TerminalRequest::default()
    };
    // Opened before the upgrade, so a sandbox that does not run is an HTTP error the client can read.
    let term = state.runtime.open_terminal(&agent, request).await?;
    tracing::info!(agent = %agent, user = %caller.user(), terminal = %term.id(), "terminal opened");
    let shutdown = state.shutdown.clone();
    Ok(upgrade.on_upgrade(move |socket| relay(socket, term, shutdown)))
}

/// A JSON text frame.
fn text(value: &serde_json::Value) -> Message {
    Message::Text(value.to_string().into())
}

/// Relay between the socket and the terminal until either ends; dropping the terminal kills its process.
async fn relay(mut socket: WebSocket, mut term: Terminal, shutdown: CancellationToken) {
    let input = term.input();
    loop {
        tokio::select! {
            msg = socket.recv() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    if let Err(e) = input.write(data).await {
                        let _ = socket.send(text(&serde_json::json!({"type": "error", "message": e.to_string()}))).await;
                    }
                }
                Some(Ok(Message::Text(t))) => {
                    let control = serde_json::from_str::<Control>(t.as_str())
                        .map_err(|e| format!("unknown control message: {e}"))
                        .and_then(|Control::Resize { cols, rows }| check_size(cols, rows).map(|()| (cols, rows)));
                    let outcome = match control {
                        Ok((cols, rows)) => input.resize(cols, rows).await.map_err(|e| e.to_string()),
                        Err(e) => Err(e),
                    };
                    if let Err(message) = outcome {
                        let _ = socket.send(text(&serde_json::json!({"type": "error", "message": message}))).await;
                    }
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_)) | Err(_)) | None => break,
            },
            event = term.next() => match event {
                Some(Ok(TerminalEvent::Output(data))) => {
                    if socket.send(Message::Binary(data)).await.is_err() {
                        break;
                    }
                }
                Some(Ok(TerminalEvent::Exit(code))) => {
                    let _ = socket.send(text(&serde_json::json!({"type": "exit", "exit_code": code}))).await;
                    let _ = socket.send(Message::Close(Some(CloseFrame {
                        code: close_code::NORMAL,
                        reason: "exited".into(),
                    }))).await;
                    break;
                }
                Some(Err(e)) => {
                    let _ = socket.send(text(&serde_json::json!({"type": "error", "message": e.to_string()}))).await;
                    let _ = socket.send(Message::Close(Some(CloseFrame {
                        code: close_code::ERROR,
                        reason: "terminal failed".into(),
                    }))).await;
                    break;
                }
                None => break,
            },
            () = shutdown.cancelled() => {
                let _ = socket.send(Message::Close(Some(CloseFrame {
                    code: close_code::AWAY,
                    reason: "server shutting down".into(),
                }))).await;
                break;
            }
        }
    }
    drop(term);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_compare_scheme_host_and_port() {
        assert_eq!(origin_of("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(
            origin_of("https://Agents.Example.com/base/"),
            "https://agents.example.com"
        );
        assert!(check_size(80, 24).is_ok());
        assert!(check_size(0, 24).is_err());
        assert!(check_size(80, 1001).is_err());
        assert!(serde_json::from_str::<Control>(r#"{"type":"resize","cols":100,"rows":40}"#).is_ok());
        assert!(serde_json::from_str::<Control>(r#"{"type":"resize","cols":100}"#).is_err());
        assert!(serde_json::from_str::<Control>(r#"{"type":"paste"}"#).is_err());
    }
}
