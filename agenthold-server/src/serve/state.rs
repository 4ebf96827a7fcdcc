//! What every handler shares: the runtime, the directory of users and workspaces, authz, rate limits and
//! the server's own settings. Cheap to clone (one `Arc`).

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

use agenthold_auth::{Directory, NewAuditEntry, RateLimits};
use agenthold_core::{AgentId, Authz, Config, Credential, Store, UserId, Vault, WorkspaceId};
use agenthold_sandbox::Runtime;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use super::execs::Execs;
use super::providers::Providers;
use super::runs::Runs;

/// The server's shared state.
#[derive(Clone)]
pub(crate) struct AppState(Arc<Shared>);

/// The parts of [`AppState`].
pub(crate) struct Shared {
    /// Sandboxes, gateway, request logs.
    pub(crate) runtime: Arc<Runtime>,
    /// Users, workspaces, members, grants, tokens, sessions, audit.
    pub(crate) dir: Arc<Directory>,
    /// Asked before every action (S5).
    pub(crate) authz: Arc<dyn Authz>,
    /// Per user, per token, per client address (S13).
    pub(crate) limits: Arc<RateLimits>,
    /// The store the runtime and the directory use (the server's own tables live there too).
    pub(crate) store: Arc<dyn Store>,
    /// The configuration the server started with.
    pub(crate) config: Config,
    /// `server.public_url`, resolved, without a trailing slash.
    pub(crate) public_url: String,
    /// Prometheus text for `/metrics` (absent when another recorder was installed first).
    pub(crate) metrics: Option<PrometheusHandle>,
    /// Cancelled when the server shuts down: streams end with their `end` event.
    pub(crate) shutdown: CancellationToken,
    /// Seals and opens workspace secrets' values (the runtime's master key, E10, S15).
    pub(crate) vault: Arc<Vault>,
    /// Held while workspace secrets, their attachments or a policy are read, changed and applied, so two
    /// concurrent changes never lose one another (they are rare, admin-only calls).
    pub(crate) edits: tokio::sync::Mutex<()>,
    /// Fired when an agent is deleted: its streams end.
    pub(crate) agents_gone: AgentSignals,
    /// Execs as server-side objects.
    pub(crate) execs: Arc<Execs>,
    /// Harness runs (built on the execs).
    pub(crate) runs: Arc<Runs>,
    /// The browser login providers (OIDC, GitHub) that the configuration turns on.
    pub(crate) providers: Arc<Providers>,
    /// Webhook deliveries per client address (S8), apart from the unauthenticated limit.
    pub(crate) hook_limits: Arc<RateLimits>,
    /// Provider logins (Claude, ChatGPT accounts for the harnesses): what is kept besides the store.
    pub(crate) logins: Arc<super::harness_logins::Logins>,
}

/// One cancellation token per agent that someone waits on, fired (and forgotten) when the agent is deleted.
#[derive(Debug, Default)]
pub(crate) struct AgentSignals(Mutex<HashMap<AgentId, CancellationToken>>);

impl AgentSignals {
    /// The token that is cancelled when `agent` is deleted.
    pub(crate) fn watch(&self, agent: &AgentId) -> CancellationToken {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(agent.clone())
            .or_default()
            .clone()
    }

    /// `agent` was deleted: wake everyone watching it.
    pub(crate) fn fire(&self, agent: &AgentId) {
        let token = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(agent);
        if let Some(token) = token {
            token.cancel();
        }
    }
}

impl Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    pub(crate) fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }

    /// Start a harness run on `agent`, the one way every caller (API, webhook, agent message) starts one:
    /// first the agent's provider logins are checked (S3: a login whose owner lost the agent is detached
    /// before the run can use it, a missing credential file is written again), then the run starts.
    ///
    /// # Errors
    /// As [`Runs::start`](super::runs::Runs::start), and a store error of the login check.
    pub(crate) async fn start_run(
        &self,
        ws: &WorkspaceId,
        agent: &AgentId,
        started_by: &UserId,
        mut new: super::runs::NewRun,
    ) -> crate::serve::api::ApiResult<super::runs::RunRecord> {
        super::harness_logins::before_run(self, ws, agent, new.harness.as_str()).await?;
        new.chatgpt_login = super::harness_logins::of_agent(self, agent)
            .await?
            .iter()
            .any(|a| a.provider == super::harness_logins::Provider::Chatgpt);
        self.runs.start(ws, agent, started_by, new).await
    }

    /// A weak handle, for parts the state itself owns (the runtime's agent message hook).
    pub(crate) fn downgrade(&self) -> std::sync::Weak<Shared> {
        Arc::downgrade(&self.0)
    }

    /// The state behind a weak handle, while the server lives.
    pub(crate) fn upgrade(weak: &std::sync::Weak<Shared>) -> Option<Self> {
        weak.upgrade().map(Self)
    }

    /// Whether the public URL is HTTPS (session cookies get `Secure` and the `__Host-` prefix).
    pub(crate) fn https(&self) -> bool {
        self.public_url.starts_with("https://")
    }

    /// Name of the session cookie.
    pub(crate) fn session_cookie(&self) -> &'static str {
        if self.https() {
            "__Host-agenthold_session"
        } else {
            "agenthold_session"
        }
    }

    /// Append to a workspace's audit log; a failure to write is logged, not returned (the action itself
    /// already happened and was acknowledged by the store).
    pub(crate) async fn audit(
        &self,
        workspace: &WorkspaceId,
        actor: Option<(&UserId, Credential)>,
        action: String,
        target: String,
        result: &str,
        reason: Option<String>,
    ) {
        let entry = NewAuditEntry {
            workspace: workspace.clone(),
            actor: actor.map(|(u, _)| u.clone()),
            credential: actor.map(|(_, c)| c),
            action,
            target,
            result: result.to_owned(),
            reason,
        };
        if let Err(e) = self.dir.audit(entry).await {
            tracing::error!(workspace = %workspace, error = %e, "could not write the audit log");
        }
    }
}
