//! The tunnel listener's budgets (E20): how many connections each agent and all agents together may hold,
//! the reserve that keeps one agent's flood from starving another, the counters, and the log summary that
//! replaces a warning per refused connection.
//!
//! Every connection takes a slot when it is accepted and gives it back when it closes (hello pending or
//! tunnel up alike). An agent first uses its [`TunnelLimits::reserved_per_agent`] reserved slots, then
//! slots of the pool of [`TunnelLimits::shared`] all agents draw from, never more than
//! [`TunnelLimits::per_agent`] in all. A connection beyond that is closed as soon as it is accepted. So the
//! runtime holds at most `shared + reserved_per_agent × agents` tunnel connections (each a task, a small
//! buffer and a descriptor), one agent at most `per_agent` of them, and an agent's sandboxd always finds its
//! reserve free unless that agent itself uses it up: a flood costs the flooding agent its own tunnel only.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agenthold_core::AgentId;

/// Limits of the tunnel listener. The defaults suit any number of agents: a sandboxd needs one connection
/// (two while it replaces a dead one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelLimits {
    /// Connections one agent may hold at once, hello pending or tunnel up (default 8).
    pub per_agent: usize,
    /// Of those, how many each agent may open even when the shared pool is used up (default 2).
    pub reserved_per_agent: usize,
    /// Connections beyond the agents' reserves, shared by all agents (default 256).
    pub shared: usize,
    /// Time a connection has to send its whole hello line (default 5 s).
    pub hello_timeout: Duration,
    /// At most one summary of refused connections is logged per this interval (default 30 s).
    pub log_interval: Duration,
}

impl Default for TunnelLimits {
    fn default() -> Self {
        Self {
            per_agent: 8,
            reserved_per_agent: 2,
            shared: 256,
            hello_timeout: Duration::from_secs(5),
            log_interval: Duration::from_secs(30),
        }
    }
}

/// What the tunnel listener did, in total or for one agent (for `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TunnelCounters {
    /// Connections open now (hello pending or tunnel up).
    pub open: u64,
    /// Connections accepted within the budget, ever.
    pub accepted: u64,
    /// Hellos accepted (tunnels up), ever.
    pub authenticated: u64,
    /// Connections closed as soon as they were accepted: the agent's budget or the shared pool was full.
    pub refused_over_limit: u64,
    /// Connections that did not send a whole hello line within the hello timeout.
    pub hello_timeouts: u64,
    /// Hellos that were malformed, too long, named another agent, or connections closed before one.
    pub refused_bad_hello: u64,
    /// Hellos with a token that is not the current boot's (or for a sandbox that does not run).
    pub refused_token: u64,
    /// Failed accepts (for instance when the process is out of descriptors).
    pub accept_errors: u64,
    /// Agent message requests (`SEND`) after an accepted hello, ever (refused ones included).
    pub requests: u64,
    /// Of those, the ones refused as malformed before the runtime's hook saw them.
    pub requests_malformed: u64,
}

impl TunnelCounters {
    fn refused(&mut self, why: Refusal) {
        match why {
            Refusal::OverLimit => self.refused_over_limit += 1,
            Refusal::HelloTimeout => self.hello_timeouts += 1,
            Refusal::BadHello | Refusal::WrongAgent => self.refused_bad_hello += 1,
            Refusal::UnknownAgent | Refusal::NotRunning | Refusal::BadToken => self.refused_token += 1,
            Refusal::AcceptError => self.accept_errors += 1,
        }
    }
}

/// Why a connection did not become a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Refusal {
    /// The agent's budget or the shared pool was full.
    OverLimit,
    /// No whole hello within the hello timeout.
    HelloTimeout,
    /// Malformed or overlong hello, or closed before one.
    BadHello,
    /// The hello named another agent than the listener's.
    WrongAgent,
    /// No tunnel was ever expected for the agent.
    UnknownAgent,
    /// The agent's sandbox does not run.
    NotRunning,
    /// Not the current boot's token.
    BadToken,
    /// `accept` failed.
    AcceptError,
}

impl Refusal {
    const ALL: [Self; 8] = [
        Self::OverLimit,
        Self::HelloTimeout,
        Self::BadHello,
        Self::WrongAgent,
        Self::UnknownAgent,
        Self::NotRunning,
        Self::BadToken,
        Self::AcceptError,
    ];

    /// The reason as sent after `ERR` and logged.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::OverLimit => "over limit",
            Self::HelloTimeout => "hello timeout",
            Self::BadHello => "bad hello",
            Self::WrongAgent => "wrong agent",
            Self::UnknownAgent => "unknown agent",
            Self::NotRunning => "sandbox not running",
            Self::BadToken => "bad token",
            Self::AcceptError => "accept failed",
        }
    }
}

/// One agent's slots and counters.
#[derive(Debug, Default)]
struct AgentBook {
    reserved: usize,
    shared: usize,
    counters: TunnelCounters,
    /// The agent was forgotten while connections were open: drop the entry when the last one closes.
    forgotten: bool,
}

/// Refusals since the last summary line.
#[derive(Debug, Default)]
struct Pending {
    last: Option<Instant>,
    by_reason: HashMap<Refusal, u64>,
    by_agent: HashMap<AgentId, u64>,
}

#[derive(Debug, Default)]
struct Book {
    shared: usize,
    agents: HashMap<AgentId, AgentBook>,
    total: TunnelCounters,
    pending: Pending,
}

/// The budgets and counters of one tunnel server.
#[derive(Debug)]
pub(super) struct Budget {
    pub(super) limits: TunnelLimits,
    book: Mutex<Book>,
}

/// A connection's slot; given back when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    budget: Arc<Budget>,
    agent: AgentId,
    shared: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut book = self.budget.lock();
        if self.shared {
            book.shared = book.shared.saturating_sub(1);
        }
        book.total.open = book.total.open.saturating_sub(1);
        let remove = match book.agents.get_mut(&self.agent) {
            Some(a) => {
                if self.shared {
                    a.shared = a.shared.saturating_sub(1);
                } else {
                    a.reserved = a.reserved.saturating_sub(1);
                }
                a.counters.open = a.counters.open.saturating_sub(1);
                a.forgotten && a.reserved + a.shared == 0
            }
            None => false,
        };
        if remove {
            book.agents.remove(&self.agent);
        }
    }
}

impl Budget {
    pub(super) fn new(limits: TunnelLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            book: Mutex::new(Book::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a connection of `agent` just accepted, or `None` (counted and logged) when its budget or
    /// the shared pool is full: close the connection then.
    pub(super) fn admit(self: &Arc<Self>, agent: &AgentId) -> Option<Slot> {
        let limits = self.limits;
        let shared = {
            let mut guard = self.lock();
            let book = &mut *guard;
            let a = book.agents.entry(agent.clone()).or_default();
            a.forgotten = false;
            let shared = if a.reserved < limits.reserved_per_agent.min(limits.per_agent) {
                Some(false)
            } else if a.reserved + a.shared < limits.per_agent && book.shared < limits.shared {
                Some(true)
            } else {
                None
            };
            if let Some(shared) = shared {
                if shared {
                    a.shared += 1;
                    book.shared += 1;
                } else {
                    a.reserved += 1;
                }
                for c in [&mut a.counters, &mut book.total] {
                    c.open += 1;
                    c.accepted += 1;
                }
            }
            shared
        };
        let Some(shared) = shared else {
            self.refused(agent, Refusal::OverLimit);
            return None;
        };
        Some(Slot {
            budget: Arc::clone(self),
            agent: agent.clone(),
            shared,
        })
    }

    /// Count an agent message request; `malformed` when it was refused before the hook.
    pub(super) fn count_request(&self, agent: &AgentId, malformed: bool) {
        let mut guard = self.lock();
        let book = &mut *guard;
        let agent_counters = book.agents.get_mut(agent).map(|a| &mut a.counters);
        for c in [Some(&mut book.total), agent_counters].into_iter().flatten() {
            c.requests += 1;
            if malformed {
                c.requests_malformed += 1;
            }
        }
    }

    /// Count a tunnel that came up.
    pub(super) fn authenticated(&self, agent: &AgentId) {
        let mut book = self.lock();
        book.total.authenticated += 1;
        if let Some(a) = book.agents.get_mut(agent) {
            a.counters.authenticated += 1;
        }
    }

    /// Count a refused connection, and log the summary when one is due.
    pub(super) fn refused(&self, agent: &AgentId, why: Refusal) {
        let line = {
            let mut book = self.lock();
            book.total.refused(why);
            if let Some(a) = book.agents.get_mut(agent) {
                a.counters.refused(why);
            }
            *book.pending.by_reason.entry(why).or_default() += 1;
            *book.pending.by_agent.entry(agent.clone()).or_default() += 1;
            self.summary_if_due(&mut book.pending)
        };
        if let Some(line) = line {
            line.log();
        }
    }

    /// Log the summary of refusals not logged yet, when one is due (called periodically).
    pub(super) fn flush(&self) {
        let line = self.summary_if_due(&mut self.lock().pending);
        if let Some(line) = line {
            line.log();
        }
    }

    fn summary_if_due(&self, pending: &mut Pending) -> Option<Summary> {
        if pending.by_reason.is_empty()
            || pending
                .last
                .is_some_and(|last| last.elapsed() < self.limits.log_interval)
        {
            return None;
        }
        pending.last = Some(Instant::now());
        let mut reasons = String::new();
        let mut total = 0;
        for why in Refusal::ALL {
            if let Some(n) = pending.by_reason.get(&why) {
                total += n;
                let _ = write!(
                    reasons,
                    "{}{}={n}",
                    if reasons.is_empty() { "" } else { ", " },
                    why.as_str()
                );
            }
        }
        let mut agents: Vec<(AgentId, u64)> = pending.by_agent.drain().collect();
        agents.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut top = String::new();
        for (agent, n) in agents.iter().take(3) {
            let _ = write!(top, "{}{agent}={n}", if top.is_empty() { "" } else { ", " });
        }
        if agents.len() > 3 {
            let _ = write!(top, " and {} more", agents.len() - 3);
        }
        pending.by_reason.clear();
        Some(Summary {
            total,
            reasons,
            agents: top,
            interval: self.limits.log_interval,
        })
    }

    /// Counters of every agent together.
    pub(super) fn counters(&self) -> TunnelCounters {
        self.lock().total
    }

    /// Counters of `agent` (zero when it never connected or was forgotten).
    pub(super) fn agent_counters(&self, agent: &AgentId) -> TunnelCounters {
        self.lock()
            .agents
            .get(agent)
            .map(|a| a.counters)
            .unwrap_or_default()
    }

    /// Forget `agent`'s counters (its entry goes with its last open connection).
    pub(super) fn forget(&self, agent: &AgentId) {
        let mut book = self.lock();
        let remove = match book.agents.get_mut(agent) {
            Some(a) if a.reserved + a.shared == 0 => true,
            Some(a) => {
                a.forgotten = true;
                false
            }
            None => false,
        };
        if remove {
            book.agents.remove(agent);
        }
    }
}

/// One summary line of refused connections.
struct Summary {
    total: u64,
    reasons: String,
    agents: String,
    interval: Duration,
}

impl Summary {
    fn log(&self) {
        tracing::warn!(
            refused = self.total,
            reasons = %self.reasons,
            agents = %self.agents,
            "tunnel connections refused since the last summary (at most one summary per {:?}; counters: \
             Runtime::tunnel_counters)",
            self.interval
        );
    }
}
