//! Agent messages over the tunnel (P3, S4): after an accepted hello, a fresh connection may carry one
//! `SEND` request ([`sandboxd::contract::tunnel::parse_send`]); the runtime's embedder decides what it
//! means through [`AgentMessages`]. The sender is the agent whose listener the connection arrived on: the
//! request has no sender field, and nothing in the name or prompt can change it.
// enforces: S4

use agenthold_core::AgentId;
pub use sandboxd::contract::tunnel::Harness as MessageHarness;
use sandboxd::contract::tunnel::{self as wire, SendError};
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;

use super::budget::Budget;

/// How long the hook may take before the sender is told it timed out (a little under the sender's wait).
const HOOK_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(wire::ANSWER_TIMEOUT.as_secs().saturating_sub(5));

/// What an agent's message does, provided by the runtime's embedder (the server starts a run on the target).
#[async_trait::async_trait]
pub trait AgentMessages: Send + Sync + 'static {
    /// `from` (known by its tunnel) asks for a run of the agent named `to_name` with `prompt` on `harness`.
    /// `Ok` is the started run's id (`[A-Za-z0-9_.-]{1,128}`); `Err` a reason the sender sees (one line,
    /// no secrets).
    async fn send(
        &self,
        from: &AgentId,
        to_name: &str,
        harness: MessageHarness,
        prompt: &str,
    ) -> Result<String, String>;
}

/// The default: every message is refused.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoAgentMessages;

#[async_trait::async_trait]
impl AgentMessages for NoAgentMessages {
    async fn send(&self, _: &AgentId, _: &str, _: MessageHarness, _: &str) -> Result<String, String> {
        Err("agent messages are not enabled".to_owned())
    }
}

/// Serves one `SEND` request whose line (without its `\n`) is `line`; the body is read from `reader`.
/// Returns the answer line to write.
pub(super) async fn serve(
    hook: &dyn AgentMessages,
    budget: &Budget,
    agent: &AgentId,
    line: &str,
    reader: &mut BufReader<OwnedReadHalf>,
) -> String {
    let answer = request(hook, agent, line, reader).await;
    budget.count_request(agent, answer.is_err());
    answer.unwrap_or_else(|why| wire::err(why.as_str()))
}

/// Reads and checks the request, then asks the hook.
async fn request(
    hook: &dyn AgentMessages,
    agent: &AgentId,
    line: &str,
    reader: &mut BufReader<OwnedReadHalf>,
) -> Result<String, SendError> {
    let head = wire::parse_send(line)?;
    let mut body = Vec::with_capacity(head.body_len().min(64 * 1024));
    let want = u64::try_from(head.body_len()).map_err(|_| SendError::Malformed)?;
    let read = tokio::time::timeout(
        wire::REQUEST_TIMEOUT,
        (&mut *reader).take(want).read_to_end(&mut body),
    )
    .await;
    if !matches!(read, Ok(Ok(n)) if n == head.body_len()) {
        return Err(SendError::Malformed);
    }
    let (name, prompt) = wire::parse_body(&head, &body)?;
    let answer = tokio::time::timeout(HOOK_TIMEOUT, hook.send(agent, name, head.harness, prompt)).await;
    Ok(match answer {
        Ok(Ok(run)) if wire::valid_run_id(&run) => wire::started(&run),
        Ok(Ok(_)) => wire::err("internal error: bad run id"),
        Ok(Err(reason)) => wire::err(&wire::clean_reason(&reason)),
        Err(_) => wire::err("timed out starting the run"),
    })
}

/// Whether `line` (without its `\n`) is a request rather than a keep-alive.
pub(super) fn is_request(line: &str) -> bool {
    line.split(' ').next() == Some(wire::SEND)
}
