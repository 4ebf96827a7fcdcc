//! What the proxies share: the gateway-wide [`Context`] (policy, secret injector, interception TLS, request
//! log, resolved names, dialer and upstream clients, timeouts, budgets, open connections), and per attached
//! agent an [`AgentContext`]. The gateway builds them and hands them down; the proxies (`transparent`,
//! `explicit`, `flow`, `http`, `intercept`) only read them, so none of them needs the gateway itself.

use std::sync::{Arc, Weak};
use std::time::Duration;

use agenthold_core::AgentId;
use agenthold_core::config::EgressConfig;
use agenthold_core::policy::{DenyReason, Destination, EgressPolicy, Verdict};
use agenthold_core::secret::SecretInjector;
use tokio_util::sync::CancellationToken;

use crate::budget::{AgentBudget, Budget};
use crate::dial::Dialer;
use crate::dns;
use crate::log::RequestLog;
use crate::open::{OpenConnections, SWEEP_EVERY};
use crate::target::Target;
use crate::upstream::HttpClient;

/// Timeouts of every network wait in the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Waiting for a ClientHello or a request head (default 10 s).
    pub sniff: Duration,
    /// Connecting to an upstream (default 10 s).
    pub connect: Duration,
    /// A connection idle in both directions is closed (default 600 s).
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            sniff: Duration::from_secs(10),
            connect: Duration::from_secs(10),
            idle: Duration::from_secs(600),
        }
    }
}

impl Timeouts {
    /// The timeouts configured in `egress`.
    #[must_use]
    pub fn from_config(egress: &EgressConfig) -> Self {
        Self {
            sniff: Duration::from_secs(egress.sniff_timeout_secs),
            connect: Duration::from_secs(egress.connect_timeout_secs),
            idle: Duration::from_secs(egress.idle_timeout_secs),
        }
    }
}

/// State shared by every agent's tasks.
pub(crate) struct Context {
    pub(crate) policy: Arc<dyn EgressPolicy>,
    pub(crate) injector: Option<Arc<dyn SecretInjector>>,
    /// Server side of interception; `None` when the gateway has no CA (then nothing is intercepted).
    pub(crate) tls_server: Option<Arc<rustls::ServerConfig>>,
    pub(crate) log: Arc<RequestLog>,
    pub(crate) records: Arc<dns::Records>,
    pub(crate) dialer: Dialer,
    pub(crate) client: HttpClient,
    /// The same, speaking only HTTP/1.1 upstream: protocol upgrades (WebSocket) exist only there, and the
    /// pooled client would pick h2 with an upstream that offers it.
    pub(crate) client_h1: HttpClient,
    pub(crate) timeouts: Timeouts,
    pub(crate) disabled: bool,
    /// Connection and request budgets (E20).
    pub(crate) budget: Arc<Budget>,
    /// Open long-lived connections, swept on policy changes (E21).
    pub(crate) open: Arc<OpenConnections>,
    /// One lock per refresh group: a group's token refreshes run one at a time (E15).
    pub(crate) refresh_locks: RefreshLocks,
}

impl Context {
    /// Decide `target:port` for `agent`.
    pub(crate) fn decide(&self, agent: &AgentId, target: &Target, port: u16) -> Verdict {
        if self.disabled {
            return Verdict::Denied(DenyReason::EgressDisabled);
        }
        let dest = match target {
            Target::Name(n) => Destination::name(n.clone(), port),
            Target::Addr(a) => Destination::addr(*a, port),
        };
        self.policy.decide(agent, &dest)
    }

    /// Whether TLS from `agent` to `host` is intercepted: the gateway has a CA and the injector names the
    /// host.
    pub(crate) fn intercepts(&self, agent: &AgentId, host: &str) -> bool {
        self.tls_server.is_some() && self.injector.as_ref().is_some_and(|i| i.intercepts(agent, host))
    }

    /// Sweep the open connections every [`SWEEP_EVERY`] (see [`OpenConnections::sweep`]) until `stop` fires
    /// or the gateway is gone. It holds the context weakly: dropping the gateway releases what it holds (the
    /// injector, and through it an embedder's store) at once, not at this task's next tick.
    pub(crate) async fn sweep_open_forever(ctx: Weak<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let Some(ctx) = ctx.upgrade() else { return };
            let n = ctx
                .open
                .sweep(|agent, target, port| ctx.decide(agent, target, port).is_allowed());
            if n > 0 {
                tracing::debug!(revoked = n, "policy change closed open connections");
            }
        }
    }
}

/// One attached agent, as its listeners and connections see it.
#[derive(Clone)]
pub(crate) struct AgentContext {
    pub(crate) gw: Arc<Context>,
    pub(crate) agent: AgentId,
    /// The agent's share of the gateway's budgets (E20).
    pub(crate) budget: Arc<AgentBudget>,
    /// Fires when the agent is detached or the gateway shuts down; every task serving the agent ends with
    /// it.
    pub(crate) cancel: CancellationToken,
}

/// One async lock per refresh group, forgotten when no refresh holds or waits for it.
#[derive(Debug, Default)]
pub(crate) struct RefreshLocks(
    std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<tokio::sync::Mutex<()>>>>,
);

impl RefreshLocks {
    /// The lock of `group`.
    pub(crate) fn get(&self, group: String) -> std::sync::Arc<tokio::sync::Mutex<()>> {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.retain(|_, lock| lock.strong_count() > 0);
        if let Some(lock) = map.get(&group).and_then(std::sync::Weak::upgrade) {
            return lock;
        }
        let lock = std::sync::Arc::new(tokio::sync::Mutex::new(()));
        map.insert(group, std::sync::Arc::downgrade(&lock));
        lock
    }
}
