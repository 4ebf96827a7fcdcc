//! The warm pool (`sandbox.warm_pool`): sandboxes created and started ahead of time, so that handing one
//! out costs a policy update instead of a network, a container and a start.
//!
//! A pooled sandbox is a real agent with its own network, volume and container, made from the plain spec
//! (default image, runtime and limits; no environment, secrets or labels), and its policy refuses
//! everything until it is handed out, when the caller's policy replaces it. A plain spec takes one as it
//! is; any other spec of the same image and runtime takes one too when the sandbox runtime can
//! [`Sandbox::reconfigure`] it: its secrets enter the gateway's table, and the environment (with their
//! placeholders) and limits are applied to the running sandbox before the hand-out returns. A pooled
//! sandbox is handed out once and never returns to the pool, so it carries nothing of another spec. Pooled
//! agents are not listed, are removed on shutdown, and a restarted runtime removes the ones a previous run
//! left.
//!
//! The pool works with any [`Sandbox`] (it only creates and removes). It needs per-agent policies the
//! runtime can set ([`EgressPolicy::table`], the default policy's): with a policy that has none, a pooled
//! sandbox could not be held at "refuse everything", so the pool stays empty (and says so once).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use agenthold_core::policy::{EgressPolicy, NetworkPolicy};
use agenthold_core::sandbox::{ContainerSpec, GatewaySpec, SandboxSpec};
use agenthold_core::{AgentId, Sandbox, Store};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::records::{AgentRecord, RECORDS};

/// The warm pool of a runtime (empty when its size is 0).
pub(crate) struct Pool {
    size: usize,
    image: String,
    /// The container half of the plain spec (`None` when the image does not make a valid spec).
    plain: Option<ContainerSpec>,
    ready: Mutex<VecDeque<AgentId>>,
    /// Creations in flight.
    filling: AtomicUsize,
    /// Signalled whenever a creation ends.
    settled: Notify,
    /// Whether the sandbox runtime may reconfigure (false once it answered that it cannot).
    reconfigurable: AtomicBool,
    sandbox: Arc<dyn Sandbox>,
    policy: Arc<dyn EgressPolicy>,
    store: Arc<dyn Store>,
    cancel: CancellationToken,
}

impl Pool {
    /// A pool of `size` sandboxes of `image` (none when the policy has no per-agent table).
    pub(crate) fn new(
        size: usize,
        image: String,
        sandbox: Arc<dyn Sandbox>,
        policy: Arc<dyn EgressPolicy>,
        store: Arc<dyn Store>,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        let size = if size > 0 && policy.table().is_none() {
            tracing::warn!(
                "warm pool disabled: the custom policy has no per-agent table, so a pooled sandbox could not \
                 be held at refusing everything until it is handed out"
            );
            0
        } else {
            size
        };
        let plain = plain_spec(image.clone()).split().map(|(container, _)| container);
        if let Err(e) = &plain
            && size > 0
        {
            tracing::warn!(error = %e, "warm pool disabled: the configured image is not a valid spec");
        }
        Arc::new(Self {
            size,
            image,
            plain: plain.ok(),
            ready: Mutex::new(VecDeque::new()),
            filling: AtomicUsize::new(0),
            settled: Notify::new(),
            reconfigurable: AtomicBool::new(true),
            sandbox,
            policy,
            store,
            cancel,
        })
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, VecDeque<AgentId>> {
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether and how a sandbox made from the plain spec can stand in for one made from `container` and
    /// `gateway`.
    pub(crate) fn fit(&self, container: &ContainerSpec, gateway: &GatewaySpec) -> Fit {
        let Some(plain) = self.plain.as_ref().filter(|_| self.size > 0) else {
            return Fit::No;
        };
        if gateway.secrets.is_empty() && plain == container {
            Fit::Plain
        } else if plain.image() == container.image()
            && plain.runtime() == container.runtime()
            && self.reconfigurable.load(Ordering::SeqCst)
        {
            Fit::Reconfigured
        } else {
            Fit::No
        }
    }

    /// A ready sandbox, if there is one.
    pub(crate) fn take(&self) -> Option<AgentId> {
        self.ready().pop_front()
    }

    /// The sandbox runtime cannot reconfigure: from now on only plain specs take pooled sandboxes.
    pub(crate) fn no_reconfigure(&self) {
        if self.reconfigurable.swap(false, Ordering::SeqCst) {
            tracing::info!(
                "warm pool: the sandbox runtime cannot reconfigure a running sandbox; only plain specs take \
                 pooled sandboxes"
            );
        }
    }

    /// Remove a sandbox [`Pool::take`] gave whose hand-out failed halfway (it never goes back).
    pub(crate) async fn discard(&self, agent: &AgentId) {
        self.remove(agent).await;
    }

    /// Sandboxes ready to hand out.
    pub(crate) fn len(&self) -> usize {
        self.ready().len()
    }

    /// Start creating sandboxes until the pool (ready plus in flight) is full again.
    pub(crate) fn refill(self: &Arc<Self>) {
        loop {
            let filling = self.filling.load(Ordering::SeqCst);
            if self.cancel.is_cancelled() || self.plain.is_none() || self.ready().len() + filling >= self.size
            {
                return;
            }
            if self
                .filling
                .compare_exchange(filling, filling + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue;
            }
            let pool = Arc::clone(self);
            tokio::spawn(async move {
                // A creation runs to its end even on shutdown: dropping it halfway would leave Docker
                // objects no record names. `drain` waits for it and removes what it made.
                if let Some(agent) = pool.make_one().await {
                    pool.ready().push_back(agent);
                }
                pool.filling.fetch_sub(1, Ordering::SeqCst);
                pool.settled.notify_waiters();
            });
        }
    }

    async fn make_one(&self) -> Option<AgentId> {
        let container = self.plain.clone()?;
        let table = self.policy.table()?;
        let agent = AgentId::random();
        table.set(agent.clone(), deny_all());
        let record = AgentRecord {
            spec: plain_spec(self.image.clone()),
            secrets: Vec::new(),
            pooled: true,
        };
        if let Err(e) = RECORDS.save(self.store.as_ref(), &agent, &record).await {
            tracing::warn!(error = %e, "warm pool: cannot record a sandbox");
            table.remove(&agent);
            return None;
        }
        match self.sandbox.create(&agent, &container).await {
            Ok(_) => {
                // The first command after the hand-out then skips what the sandbox runtime can do ahead.
                if let Err(e) = self.sandbox.prepare_exec(&agent).await {
                    tracing::debug!(agent = %agent, error = %e, "warm pool: cannot prepare the first exec");
                }
                Some(agent)
            }
            Err(e) => {
                tracing::warn!(error = %e, "warm pool: cannot create a sandbox");
                table.remove(&agent);
                let _ = RECORDS.delete(self.store.as_ref(), &agent).await;
                None
            }
        }
    }

    /// Remove every pooled sandbox (shutdown, after the pool's token is cancelled): pooled sandboxes are the
    /// runtime's own, never left behind. Waits for creations in flight, at most [`DRAIN_WAIT`]; one still
    /// running after that keeps its record, and the next runtime on the data directory removes it.
    pub(crate) async fn drain(&self) {
        let deadline = tokio::time::Instant::now() + DRAIN_WAIT;
        loop {
            let settled = self.settled.notified();
            if self.filling.load(Ordering::SeqCst) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                tracing::warn!("warm pool: creations still running at shutdown; the next start removes them");
                break;
            }
        }
        let agents: Vec<AgentId> = self.ready().drain(..).collect();
        for agent in agents {
            self.remove(&agent).await;
        }
    }

    /// Remove a pooled sandbox a previous runtime on the store left: its policy refuses everything while
    /// it goes.
    pub(crate) async fn remove_leftover(&self, agent: &AgentId) {
        if let Some(table) = self.policy.table() {
            table.set(agent.clone(), deny_all());
        }
        self.remove(agent).await;
    }

    /// Remove a pooled sandbox and what the runtime keeps for it.
    async fn remove(&self, agent: &AgentId) {
        if let Err(e) = self.sandbox.remove(agent, false).await {
            tracing::warn!(agent = %agent, error = %e, "warm pool: cannot remove a sandbox");
        }
        if let Some(table) = self.policy.table() {
            table.remove(agent);
        }
        let _ = RECORDS.delete(self.store.as_ref(), agent).await;
    }
}

/// How a spec can use a pooled sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fit {
    /// As it is: the plain spec with another policy.
    Plain,
    /// Reconfigured at hand-out: same image and runtime, anything else may differ.
    Reconfigured,
    /// Not at all (no pool, another image or runtime, or a sandbox runtime that cannot reconfigure).
    No,
}

/// How long shutdown waits for pool creations in flight.
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The policy of a sandbox waiting in the pool: an empty allowlist.
fn deny_all() -> NetworkPolicy {
    NetworkPolicy::allowlist(Vec::new())
}

/// The spec pooled sandboxes are made from: `image`, nothing else.
fn plain_spec(image: String) -> SandboxSpec {
    SandboxSpec {
        image,
        policy: deny_all(),
        ..SandboxSpec::default()
    }
}
