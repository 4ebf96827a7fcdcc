//! Open long-lived connections (E16, E21): every spliced connection, CONNECT tunnel, WebSocket and
//! streaming response is registered here with what it was allowed to reach, and a sweep closes those the
//! agent's current policy no longer allows, within [`SWEEP_EVERY`] of the change, whatever the policy
//! implementation (nothing has to announce the change).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agenthold_core::AgentId;
use tokio_util::sync::CancellationToken;

use crate::gateway::{Shared, Target};

/// How often open connections are checked against the policy.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_millis(250);

struct Entry {
    agent: AgentId,
    target: Target,
    port: u16,
    revoke: CancellationToken,
    revoked: Arc<AtomicBool>,
}

/// The registry.
#[derive(Default)]
pub(crate) struct OpenConnections {
    next: AtomicU64,
    entries: Mutex<HashMap<u64, Entry>>,
}

/// A registered connection; unregistered when dropped.
pub(crate) struct Registration {
    id: u64,
    open: Arc<OpenConnections>,
    /// Fires when the policy no longer allows the connection.
    pub(crate) revoke: CancellationToken,
    revoked: Arc<AtomicBool>,
}

impl Registration {
    /// Whether the sweep revoked this connection.
    pub(crate) fn was_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.open
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

impl OpenConnections {
    /// Register a connection `agent` holds to `target:port`.
    pub(crate) fn register(self: &Arc<Self>, agent: &AgentId, target: &Target, port: u16) -> Registration {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let revoke = CancellationToken::new();
        let revoked = Arc::new(AtomicBool::new(false));
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                id,
                Entry {
                    agent: agent.clone(),
                    target: target.clone(),
                    port,
                    revoke: revoke.clone(),
                    revoked: Arc::clone(&revoked),
                },
            );
        Registration {
            id,
            open: Arc::clone(self),
            revoke,
            revoked,
        }
    }

    /// How many connections `agent` has open (all agents when `None`).
    pub(crate) fn count(&self, agent: Option<&AgentId>) -> usize {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .values()
            .filter(|e| agent.is_none_or(|a| &e.agent == a))
            .count()
    }

    /// Revoke every open connection the policy now denies; returns how many.
    pub(crate) fn sweep(&self, gw: &Shared) -> usize {
        let snapshot: Vec<(AgentId, Target, u16, CancellationToken, Arc<AtomicBool>)> = self
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|e| !e.revoke.is_cancelled())
            .map(|e| {
                (
                    e.agent.clone(),
                    e.target.clone(),
                    e.port,
                    e.revoke.clone(),
                    Arc::clone(&e.revoked),
                )
            })
            .collect();
        let mut revoked = 0;
        for (agent, target, port, token, flag) in snapshot {
            if !gw.decide(&agent, &target, port).is_allowed() {
                flag.store(true, Ordering::Release);
                token.cancel();
                revoked += 1;
            }
        }
        revoked
    }

    /// Run [`OpenConnections::sweep`] every [`SWEEP_EVERY`] until `stop` fires.
    pub(crate) async fn sweep_forever(gw: Arc<Shared>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let n = gw.open.sweep(&gw);
            if n > 0 {
                tracing::debug!(revoked = n, "policy change closed open connections");
            }
        }
    }
}
