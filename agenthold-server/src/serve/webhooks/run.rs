//! Starting the run of a delivery: through [`Runs::start`](crate::serve::runs::Runs::start) as the hook's
//! creator, with origin `webhook`, the hook's harness (and argv for `custom`), depth 0.

use super::Webhook;
use crate::serve::api::{ApiError, ApiResult};
use crate::serve::runs::{Harness, NewRun, RunOrigin};
use crate::serve::state::AppState;

/// Start the run for `hook` with `prompt`; its id.
pub(super) async fn start(state: &AppState, hook: &Webhook, prompt: String) -> ApiResult<String> {
    let harness = match hook.harness.as_str() {
        "claude" => Harness::Claude,
        "codex" => Harness::Codex,
        "custom" => Harness::Custom,
        other => {
            return Err(ApiError::internal(&format!(
                "webhook {} has an unknown harness {other:?}",
                hook.id
            )));
        }
    };
    let new = NewRun {
        harness,
        prompt,
        argv: hook.argv.clone(),
        resume: None,
        model: None,
        origin: RunOrigin::Webhook {
            webhook: hook.id.clone(),
        },
        depth: 0,
        chatgpt_login: false,
    };
    let run = state
        .start_run(&hook.workspace, &hook.agent, &hook.created_by, new)
        .await?;
    Ok(run.id)
}
