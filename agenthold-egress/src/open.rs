//! Open long-lived connections (E16, E21): every spliced connection, CONNECT tunnel, WebSocket and
//! streaming response is registered here with what it was allowed to reach, and a sweep closes those the
//! agent's current policy no longer allows, within [`SWEEP_EVERY`] of the change, whatever the policy
//! implementation (nothing has to announce the change).
//!
//! The same sweep makes long-lived connections visible in the request log: a connection still open
//! [`ANNOUNCE_AFTER`] after it started gets its `open` entry (stamped with its start), and its entry at the
//! close then says `phase: closed`. Short connections keep the one entry written when they close.
// enforces: E21

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agenthold_core::AgentId;
use tokio_util::sync::CancellationToken;

use crate::log::{Announcement, PendingEntry};
use crate::target::Target;

/// How often open connections are checked against the policy.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// How long a connection must be open before its `open` entry is written.
pub(crate) const ANNOUNCE_AFTER: Duration = Duration::from_secs(1);

struct Entry {
    agent: AgentId,
    target: Target,
    port: u16,
    revoke: CancellationToken,
    revoked: Arc<AtomicBool>,
    /// The `open` entry to write once the connection is long-lived.
    announce: Option<Announcement>,
    started: Instant,
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
    /// Register a connection `agent` holds to `target:port` whose closing entry is `pending`: once it is
    /// long-lived its `open` entry is written, and `pending` then becomes its `closed` entry.
    pub(crate) fn register_logged(
        self: &Arc<Self>,
        pending: &mut PendingEntry,
        agent: &AgentId,
        target: &Target,
        port: u16,
    ) -> Registration {
        let announcement = pending.announcement();
        self.insert(agent, target, port, Some(announcement))
    }

    /// Register a stream `agent` holds to `target:port` (revocable; logged as its request, not as a
    /// connection).
    pub(crate) fn register(self: &Arc<Self>, agent: &AgentId, target: &Target, port: u16) -> Registration {
        self.insert(agent, target, port, None)
    }

    fn insert(
        self: &Arc<Self>,
        agent: &AgentId,
        target: &Target,
        port: u16,
        announce: Option<Announcement>,
    ) -> Registration {
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
                    announce,
                    started: Instant::now(),
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

    /// Write the `open` entry of every connection that became long-lived, and revoke every open connection
    /// `allowed` (the agent's current policy) now refuses; returns how many were revoked.
    pub(crate) fn sweep(&self, allowed: impl Fn(&AgentId, &Target, u16) -> bool) -> usize {
        let mut announce = Vec::new();
        let snapshot: Vec<(AgentId, Target, u16, CancellationToken, Arc<AtomicBool>)> = {
            let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
            for e in entries.values_mut() {
                if e.started.elapsed() >= ANNOUNCE_AFTER
                    && let Some(a) = e.announce.take()
                {
                    a.claim();
                    announce.push(a);
                }
            }
            entries
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
                .collect()
        };
        // Written outside the registry's lock (recording takes the log's).
        for a in announce {
            a.write();
        }
        let mut revoked = 0;
        for (agent, target, port, token, flag) in snapshot {
            if !allowed(&agent, &target, port) {
                flag.store(true, Ordering::Release);
                token.cancel();
                revoked += 1;
            }
        }
        revoked
    }
}
