//! Budgets (E20): how many connections each agent and the whole gateway may hold, and how many requests an
//! agent may have in flight upstream, so that one agent exhausting its own budget never starves another.
//!
//! A connection permit is held by every client connection (transparent or explicit) for as long as it is
//! served, and separately by every CONNECT tunnel and WebSocket upgrade (they outlive the HTTP exchange that
//! opened them). One permit stands for every descriptor the connection may need: the client's socket, the
//! upstream's and, for a kernel splice, two pipes ([`FDS_PER_CONNECTION`]).
//!
//! The gateway-wide limit keeps a reserve: an agent that already holds [`FAIR_SHARE`] connections or more
//! can only take from the part of the limit outside the reserve, so a few agents flooding the gateway leave
//! the reserve to the others.
// enforces: E20

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Descriptors one connection may use: client and upstream sockets, two pipes of two ends each.
pub const FDS_PER_CONNECTION: usize = 6;
/// Descriptors kept out of the connection budget for everything else (listeners, DNS, the store, the
/// engine's socket).
pub const FDS_RESERVED: usize = 1024;
/// Below this many connections an agent may also use the gateway's reserve.
pub const FAIR_SHARE: usize = 32;

/// Counters of refusals, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    pub(crate) connections: AtomicU64,
    pub(crate) requests: AtomicU64,
}

/// The gateway-wide connection budget.
#[derive(Debug)]
pub(crate) struct Budget {
    /// Most connections at once, all agents together.
    total: usize,
    /// The part of `total` only agents under [`FAIR_SHARE`] may use.
    reserve: usize,
    /// Most connections one agent may hold.
    per_agent: usize,
    /// Most requests one agent may have in flight upstream.
    requests_per_agent: usize,
    used: AtomicUsize,
    pub(crate) refused: Refusals,
}

/// One agent's share of the budget.
#[derive(Debug, Default)]
pub(crate) struct AgentBudget {
    connections: AtomicUsize,
    requests: AtomicUsize,
    pub(crate) refused: Refusals,
}

/// A connection slot; given back when dropped.
#[derive(Debug)]
pub(crate) struct ConnPermit {
    budget: Arc<Budget>,
    agent: Arc<AgentBudget>,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        self.agent.connections.fetch_sub(1, Ordering::AcqRel);
        self.budget.used.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An upstream request slot; given back when dropped.
#[derive(Debug)]
pub(crate) struct RequestPermit {
    agent: Arc<AgentBudget>,
}

impl Drop for RequestPermit {
    fn drop(&mut self) {
        self.agent.requests.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Take one unit of `counter` unless it is at `limit`.
fn take(counter: &AtomicUsize, limit: usize) -> Option<usize> {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        })
        .ok()
}

impl Budget {
    /// A budget of `total` connections (0: derived from the descriptor limit), `per_agent` each, and
    /// `requests_per_agent` upstream requests in flight per agent.
    pub(crate) fn new(total: usize, per_agent: usize, requests_per_agent: usize) -> Self {
        // Raised whatever the configuration says: a proxy needs far more than a shell's 1024.
        let fds = usize::try_from(raise_descriptor_limit()).unwrap_or(usize::MAX);
        let derived = from_descriptor_limit(fds);
        let total = if total == 0 {
            derived
        } else {
            if total > derived {
                // Past what the descriptors allow, the budget stops protecting anyone: the process runs out
                // of descriptors first, and then every agent fails alike (found by the soak benchmark).
                tracing::warn!(
                    max_connections = total,
                    descriptors = fds,
                    derived,
                    "egress.max_connections is above what the descriptor limit allows ((limit - {FDS_RESERVED}) / \
                     {FDS_PER_CONNECTION}): raise the process's descriptor limit (e.g. LimitNOFILE) or lower it"
                );
            }
            total
        };
        let total = total.max(1);
        Self {
            total,
            reserve: (total / 8).min(FAIR_SHARE * 64),
            per_agent: per_agent.clamp(1, total),
            requests_per_agent: requests_per_agent.max(1),
            used: AtomicUsize::new(0),
            refused: Refusals::default(),
        }
    }

    /// The gateway-wide connection limit in force.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// Connections held now, all agents together.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// A connection slot for `agent`, or `None` when its budget or the gateway's is spent.
    pub(crate) fn connection(self: &Arc<Self>, agent: &Arc<AgentBudget>) -> Option<ConnPermit> {
        let Some(held) = take(&agent.connections, self.per_agent) else {
            return self.refuse_connection(agent);
        };
        let limit = if held < FAIR_SHARE {
            self.total
        } else {
            self.total - self.reserve
        };
        if take(&self.used, limit).is_none() {
            agent.connections.fetch_sub(1, Ordering::AcqRel);
            return self.refuse_connection(agent);
        }
        Some(ConnPermit {
            budget: Arc::clone(self),
            agent: Arc::clone(agent),
        })
    }

    fn refuse_connection(&self, agent: &AgentBudget) -> Option<ConnPermit> {
        self.refused.connections.fetch_add(1, Ordering::Relaxed);
        agent.refused.connections.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// An upstream request slot for `agent`, or `None` when it has too many in flight.
    pub(crate) fn request(&self, agent: &Arc<AgentBudget>) -> Option<RequestPermit> {
        if take(&agent.requests, self.requests_per_agent).is_none() {
            self.refused.requests.fetch_add(1, Ordering::Relaxed);
            agent.refused.requests.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(RequestPermit {
            agent: Arc::clone(agent),
        })
    }
}

impl AgentBudget {
    /// Connections this agent holds now.
    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    /// Requests this agent has in flight upstream now.
    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::Acquire)
    }
}

/// Raise the soft limit of open descriptors to the hard limit (a proxy needs many; the default soft limit
/// of 1024 is for interactive shells) and return the limit in force.
pub fn raise_descriptor_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// The gateway-wide connection limit `fds` descriptors allow, between 64 and 65 536.
fn from_descriptor_limit(fds: usize) -> usize {
    (fds.saturating_sub(FDS_RESERVED) / FDS_PER_CONNECTION).clamp(64, 65_536)
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: E20
    #[test]
    fn one_agent_at_its_budget_leaves_the_reserve_to_others() {
        let budget = Arc::new(Budget::new(100, 90, 4));
        let (greedy, other) = (Arc::new(AgentBudget::default()), Arc::new(AgentBudget::default()));
        let mut held = Vec::new();
        while let Some(p) = budget.connection(&greedy) {
            held.push(p);
        }
        // The greedy agent stops at the shared part (100 - reserve 12), below its own 90.
        assert_eq!(held.len(), 88);
        assert_eq!(greedy.refused.connections.load(Ordering::Relaxed), 1);
        let mut others = Vec::new();
        while let Some(p) = budget.connection(&other) {
            others.push(p);
        }
        assert_eq!(others.len(), 12, "the reserve went to the other agent");
        assert_eq!(budget.used(), 100);
        drop(held);
        assert_eq!((budget.used(), greedy.connections()), (12, 0));
        // Per-agent limit.
        let budget = Arc::new(Budget::new(1000, 5, 2));
        let a = Arc::new(AgentBudget::default());
        let p: Vec<_> = (0..10).filter_map(|_| budget.connection(&a)).collect();
        assert_eq!(p.len(), 5);
        let r: Vec<_> = (0..10).filter_map(|_| budget.request(&a)).collect();
        assert_eq!((r.len(), a.requests()), (2, 2));
        drop(r);
        assert_eq!(a.requests(), 0);
    }

    #[test]
    fn the_descriptor_limit_is_raised_and_bounds_the_total() {
        let limit = raise_descriptor_limit();
        assert!(limit >= 1024);
        let budget = Budget::new(0, 1024, 256);
        assert!(budget.total() >= 64 && budget.total() <= 65_536);
    }
}
