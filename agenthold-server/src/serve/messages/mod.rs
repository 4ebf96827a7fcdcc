//! Agent-to-agent messages (P3, S4): what the server does when `agenthold-send` in a sandbox asks, through
//! that sandbox's tunnel, for a run of another agent.
//!
//! The sender is the agent whose tunnel listener the request arrived on (the runtime hands it to
//! [`MessageHook`]); the request carries no sender. The target is looked up by name in the sender's
//! workspace only (another workspace's agent answers exactly like a missing one). The message is allowed
//! only when the sender's owner (`created_by`) may operate the target, asked of authz as that user; the
//! run starts on the owner's rights, marked `origin: {kind: "agent", agent, run}`, at depth
//! `1 + the sender's deepest running run`, and a depth past [`MAX_DEPTH`] is refused. Every message,
//! started or refused, is kept on both sides ([`store`], bounded per agent, deleted with the agent) and
//! written to the workspace's audit log on both sides. Each message counts against the owner's rate limit.
// enforces: P3, S4

pub(crate) mod store;

use std::sync::{OnceLock, Weak};

use agenthold_auth::NewAuditEntry;
use agenthold_core::{Action, AgentId, AuthzDecision, Credential, Principal, Resource};
use agenthold_sandbox::tunnel::{AgentMessages, MessageHarness};

use self::store::{Direction, Message, Outcome};
use super::records::{self, AgentMeta, now_rfc3339};
use super::runs::{Harness, NewRun, RunOrigin, RunState};
use super::state::{AppState, Shared};

/// The deepest chain of agent messages: a message that would start a run deeper than this is refused.
pub(crate) const MAX_DEPTH: u32 = 4;

/// The runtime's [`AgentMessages`] hook for the server. The runtime is built before the server's state
/// exists, so the hook is bound to the state afterwards ([`MessageHook::bind`]) and holds it weakly (the
/// state owns the runtime, which owns the hook).
#[derive(Debug, Default)]
pub(crate) struct MessageHook {
    state: OnceLock<Weak<Shared>>,
}

impl MessageHook {
    /// Start delivering messages with `state`.
    pub(crate) fn bind(&self, state: &AppState) {
        let _ = self.state.set(state.downgrade());
    }
}

#[async_trait::async_trait]
impl AgentMessages for MessageHook {
    async fn send(
        &self,
        from: &AgentId,
        to_name: &str,
        harness: MessageHarness,
        prompt: &str,
    ) -> Result<String, String> {
        let Some(state) = self.state.get().and_then(AppState::upgrade) else {
            return Err("the server is not ready for agent messages".to_owned());
        };
        deliver(&state, from, to_name, harness, prompt).await
    }
}

/// Why a message was refused: the text the sender sees, and whether the target (when known) should
/// record it too.
struct Refusal {
    reason: String,
    target: Option<AgentMeta>,
}

impl Refusal {
    fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            target: None,
        }
    }

    fn at(target: &AgentMeta, reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            target: Some(target.clone()),
        }
    }
}

/// Check, start, record and audit one message; the run id or the reason it was refused.
async fn deliver(
    state: &AppState,
    from: &AgentId,
    to_name: &str,
    harness: MessageHarness,
    prompt: &str,
) -> Result<String, String> {
    let sender = match records::load(state.store.as_ref(), from).await {
        Ok(Some(meta)) => meta,
        Ok(None) => return Err("this agent is not known to the server".to_owned()),
        Err(e) => {
            tracing::warn!(agent = %from, error = %e, "agent message: cannot read the sender");
            return Err("internal error; the server log has the cause".to_owned());
        }
    };
    // A message acts on its owner's rights, so it counts against the owner's rate limit (S13); a refusal
    // here is neither kept nor audited, so a flood cannot grow the store.
    if let Err(retry) = state.limits.check_user(&sender.created_by) {
        return Err(format!(
            "too many requests; retry in {} s",
            retry.as_secs().max(1)
        ));
    }
    let depth = state.runs.running_depth(from).unwrap_or(0).saturating_add(1);
    let outcome = start(state, &sender, to_name, harness, prompt, depth).await;
    let (run, target, refusal) = match outcome {
        Ok((run, target)) => (Some(run), Some(target), None),
        Err(r) => (None, r.target, Some(r.reason)),
    };
    let created_at = now_rfc3339();
    let base = Message {
        id: store::new_id(),
        from_agent: from.clone(),
        from_name: sender.name.clone(),
        to_agent: target.as_ref().map(|t| t.id.clone()),
        to_name: to_name.to_owned(),
        direction: Direction::Sent,
        run: run.clone(),
        depth,
        harness: harness.as_str().to_owned(),
        prompt_bytes: u64::try_from(prompt.len()).unwrap_or(u64::MAX),
        created_at,
        outcome: if refusal.is_some() {
            Outcome::Refused
        } else {
            Outcome::Started
        },
        reason: refusal.clone(),
    };
    store::record(state.store.as_ref(), from, &base).await;
    audit(state, &sender, &base, "agent.message.send", &sender.id).await;
    if let Some(target) = &target {
        let received = Message {
            direction: Direction::Received,
            ..base.clone()
        };
        store::record(state.store.as_ref(), &target.id, &received).await;
        audit(state, &sender, &received, "agent.message.receive", &target.id).await;
    }
    match (run, refusal) {
        (Some(run), _) => {
            tracing::info!(from = %from, to = ?base.to_agent, run = %run, depth, "agent message started a run");
            Ok(run)
        }
        (None, reason) => {
            tracing::info!(from = %from, to_name, reason = ?reason, "agent message refused");
            Err(reason.unwrap_or_else(|| "refused".to_owned()))
        }
    }
}

/// The checks and the run: the run's id and the target, or the refusal.
async fn start(
    state: &AppState,
    sender: &AgentMeta,
    to_name: &str,
    harness: MessageHarness,
    prompt: &str,
    depth: u32,
) -> Result<(String, AgentMeta), Refusal> {
    let ws = &sender.workspace;
    // The same answer for a name in no workspace and a name in another one (S4).
    let missing = || Refusal::new(format!("no agent named {to_name:?} in this workspace"));
    let internal = |e: &dyn std::fmt::Display| {
        tracing::warn!(error = %e, "agent message: store or authz error");
        Refusal::new("internal error; the server log has the cause")
    };
    let agents = state.dir.agents_in(ws).await.map_err(|e| internal(&e))?;
    let metas = records::load_many(state.store.as_ref(), &agents)
        .await
        .map_err(|e| internal(&e))?;
    let target = metas
        .into_iter()
        .find(|m| m.name == to_name && m.workspace == *ws)
        .ok_or_else(missing)?;
    let owner = Principal {
        user: sender.created_by.clone(),
        credential: Credential::Token,
    };
    let on = Resource::Agent {
        workspace: ws.clone(),
        agent: target.id.clone(),
    };
    // As the API would answer the owner: an agent they may not see does not exist for them.
    match state
        .authz
        .check(&owner, Action::View, &on)
        .await
        .map_err(|e| internal(&e))?
    {
        AuthzDecision::Allow => {}
        AuthzDecision::NotFound | AuthzDecision::Forbidden => return Err(missing()),
    }
    if state
        .authz
        .check(&owner, Action::Operate, &on)
        .await
        .map_err(|e| internal(&e))?
        != AuthzDecision::Allow
    {
        return Err(Refusal::at(
            &target,
            format!("the owner of this agent needs the operator role on {to_name:?} to send it messages"),
        ));
    }
    if depth > MAX_DEPTH {
        return Err(Refusal::at(
            &target,
            format!("agent message chain too deep ({MAX_DEPTH})"),
        ));
    }
    let calling_run = state.runs.list(&sender.id).await.ok().and_then(|runs| {
        runs.into_iter()
            .filter(|r| r.state == RunState::Running)
            .max_by_key(|r| r.depth)
            .map(|r| r.id)
    });
    let new = NewRun {
        harness: match harness {
            MessageHarness::Claude => Harness::Claude,
            MessageHarness::Codex => Harness::Codex,
        },
        prompt: prompt.to_owned(),
        argv: None,
        resume: None,
        model: None,
        origin: RunOrigin::Agent {
            agent: sender.id.clone(),
            run: calling_run,
        },
        depth,
        chatgpt_login: false,
    };
    match state.start_run(ws, &target.id, &sender.created_by, new).await {
        Ok(run) => Ok((run.id, target)),
        Err(e) => Err(Refusal::at(
            &target,
            format!("the run did not start: {}", e.detail()),
        )),
    }
}

/// One audit entry in the workspace, on the side of `side` (the sender or the target).
async fn audit(state: &AppState, sender: &AgentMeta, message: &Message, action: &str, side: &AgentId) {
    let to = message
        .to_agent
        .as_ref()
        .map_or_else(|| format!("{:?}", message.to_name), ToString::to_string);
    let entry = NewAuditEntry {
        workspace: sender.workspace.clone(),
        actor: Some(sender.created_by.clone()),
        credential: None,
        action: action.to_owned(),
        target: format!(
            "agents/{side} from={} to={to} message={}{}",
            message.from_agent,
            message.id,
            message
                .run
                .as_ref()
                .map(|r| format!(" run={r}"))
                .unwrap_or_default()
        ),
        result: if message.outcome == Outcome::Started {
            "ok"
        } else {
            "denied"
        }
        .to_owned(),
        reason: message.reason.clone(),
    };
    if let Err(e) = state.dir.audit(entry).await {
        tracing::error!(workspace = %sender.workspace, error = %e, "could not write the audit log");
    }
}
