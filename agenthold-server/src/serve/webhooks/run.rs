//! Starting the run of a delivery. Until the runs module lands this starts a `custom` hook's command as a
//! server-side exec with the prompt on its standard input (the same contract as a `custom` run); `claude`
//! and `codex` hooks answer 503.

use std::collections::BTreeMap;

use axum::http::StatusCode;

use super::Webhook;
use crate::serve::api::{ApiError, ApiResult};
use crate::serve::execs::NewExec;
use crate::serve::state::AppState;

/// Start the run for `hook` with `prompt`; its id.
pub(super) async fn start(state: &AppState, hook: &Webhook, prompt: String) -> ApiResult<String> {
    let Some(argv) = hook.argv.clone().filter(|_| hook.harness == "custom") else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "runs_unavailable",
            "harness runs are not available in this build",
        ));
    };
    let entry = state
        .execs
        .start(
            &hook.workspace,
            &hook.agent,
            &hook.created_by,
            NewExec {
                argv,
                env: BTreeMap::new(),
                cwd: None,
                stdin: Some(prompt.into_bytes()),
                timeout: None,
            },
        )
        .await?;
    Ok(entry.record().id)
}
