//! DNS query budgets (E20): a token bucket per agent and one for the whole gateway, with a reserve so that
//! agents flooding DNS cannot starve the others, and counters of what happened to every query.
//!
//! Every query packet an agent's server receives takes one token from the agent's bucket
//! ([`DnsLimits::agent_qps`], burst [`DnsLimits::agent_burst`]; default 200/s, burst 400) and one from the
//! gateway's ([`DnsLimits::gateway_qps`], burst [`DnsLimits::gateway_burst`]; default 2000/s, burst 4000).
//! The last [`DnsLimits::gateway_reserve`] tokens of the gateway's bucket (default 1000) go only to quiet
//! agents: those that have used less than half of their own burst (and less than half the reserve). An agent
//! that floods is busy after a few queries, so it can take the gateway's tokens only down to the reserve,
//! and a quiet agent is still answered from the reserve, which refills before anyone busy can take from it
//! again; one agent can take at most half the reserve, whatever the burst sizes. One agent alone cannot
//! even reach the reserve with the defaults (200/s of 2000/s); it takes ten flooding at once.
//!
//! A query over budget is answered REFUSED without being forwarded (nothing is sent for an unreadable
//! packet). It is counted, and logged at most once per second per agent: the log entry's reason is
//! `rate_limited;agent;refused=N` (or `;gateway;`), N being the queries refused since the previous entry,
//! so a flood cannot flood the request log too.
// enforces: E20

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use agenthold_core::AgentId;
use agenthold_core::config::EgressConfig;

/// How often a refusing agent's log gets an entry.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// The budgets. Every value is at least 1 (smaller values are raised); the reserve is below the gateway's
/// burst (larger values are lowered). An agent counts as quiet (may use the reserve) while it has used less
/// than half its burst and less than half the reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DnsLimits {
    /// Queries per second per agent. Default 200.
    pub agent_qps: u32,
    /// Burst per agent. Default 400.
    pub agent_burst: u32,
    /// Queries per second for the whole gateway. Default 2000.
    pub gateway_qps: u32,
    /// Burst for the whole gateway. Default 4000.
    pub gateway_burst: u32,
    /// Gateway tokens kept for agents holding at least half their own burst. Default 1000.
    pub gateway_reserve: u32,
}

impl Default for DnsLimits {
    fn default() -> Self {
        Self::from_config(&EgressConfig::default())
    }
}

impl DnsLimits {
    /// The budgets configured in `egress` (`dns_agent_qps`, …).
    #[must_use]
    pub fn from_config(egress: &EgressConfig) -> Self {
        Self {
            agent_qps: egress.dns_agent_qps,
            agent_burst: egress.dns_agent_burst,
            gateway_qps: egress.dns_gateway_qps,
            gateway_burst: egress.dns_gateway_burst,
            gateway_reserve: egress.dns_gateway_reserve,
        }
    }
}

/// What happened to queries, per agent or in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DnsCount {
    /// Query packets received.
    pub queries: u64,
    /// Queries forwarded to the upstream.
    pub forwarded: u64,
    /// Refused because the agent's budget was spent.
    pub refused_agent_budget: u64,
    /// Refused because the gateway's budget (beyond the reserve, for a busy agent) was spent.
    pub refused_gateway_budget: u64,
    /// Refused as local-only names or reverse names of blocked ranges.
    pub refused_local: u64,
}

/// A snapshot of the counters: the totals since the gateway started, and per agent currently attached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DnsCounters {
    /// Every agent together, since start (agents detached since included).
    pub total: DnsCount,
    /// Per attached agent.
    pub agents: BTreeMap<AgentId, DnsCount>,
}

/// Which budget refused a query (as the log names it).
pub(crate) use crate::log::BudgetScope as Scope;

/// The outcome of [`DnsBudget::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    Admitted,
    /// Over budget; `log` is `Some(refused since the last entry)` when a log entry is due.
    Refused {
        scope: Scope,
        log: Option<u64>,
    },
}

/// A counted event beyond admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    Forwarded,
    RefusedLocal,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    rate: f64,
    burst: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: u32, burst: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(burst),
            rate: f64::from(rate),
            burst: f64::from(burst),
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now;
    }
}

#[derive(Debug)]
struct AgentState {
    bucket: Bucket,
    count: DnsCount,
    refused_unlogged: u64,
    last_logged: Option<Instant>,
}

#[derive(Debug)]
struct State {
    gateway: Bucket,
    agents: HashMap<AgentId, AgentState>,
    total: DnsCount,
}

/// The budgets and counters of one gateway, shared by every agent's DNS server.
#[derive(Debug)]
pub struct DnsBudget {
    limits: DnsLimits,
    state: Mutex<State>,
}

impl Default for DnsBudget {
    fn default() -> Self {
        Self::new(DnsLimits::default())
    }
}

impl DnsBudget {
    /// Full buckets with `limits` (see [`DnsLimits`] for how they are bounded).
    #[must_use]
    pub fn new(limits: DnsLimits) -> Self {
        let gateway_burst = limits.gateway_burst.max(1);
        let limits = DnsLimits {
            agent_qps: limits.agent_qps.max(1),
            agent_burst: limits.agent_burst.max(1),
            gateway_qps: limits.gateway_qps.max(1),
            gateway_burst,
            gateway_reserve: limits.gateway_reserve.min(gateway_burst - 1),
        };
        Self {
            state: Mutex::new(State {
                gateway: Bucket::full(limits.gateway_qps, limits.gateway_burst, Instant::now()),
                agents: HashMap::new(),
                total: DnsCount::default(),
            }),
            limits,
        }
    }

    /// The budgets in force.
    #[must_use]
    pub fn limits(&self) -> DnsLimits {
        self.limits
    }

    /// The counters now.
    #[must_use]
    pub fn counters(&self) -> DnsCounters {
        let state = self.lock();
        DnsCounters {
            total: state.total,
            agents: state.agents.iter().map(|(id, a)| (id.clone(), a.count)).collect(),
        }
    }

    /// Forget an agent (detached): its bucket and its counters (the totals keep them).
    pub fn forget(&self, agent: &AgentId) {
        self.lock().agents.remove(agent);
    }

    /// Take one query's tokens for `agent` at `now`, or say which budget refuses it.
    pub(crate) fn admit(&self, agent: &AgentId, now: Instant) -> Admission {
        let limits = self.limits;
        let mut guard = self.lock();
        let state = &mut *guard;
        state.gateway.refill(now);
        state.total.queries += 1;
        let a = state.agents.entry(agent.clone()).or_insert_with(|| AgentState {
            bucket: Bucket::full(limits.agent_qps, limits.agent_burst, now),
            count: DnsCount::default(),
            refused_unlogged: 0,
            last_logged: None,
        });
        a.bucket.refill(now);
        a.count.queries += 1;
        let scope = if a.bucket.tokens < 1.0 {
            Some(Scope::Agent)
        } else {
            // An agent that has used less than half its burst (and less than half the reserve) counts as
            // quiet and may take from the reserve; beyond that it is busy and may not. So one agent can
            // take at most half the reserve, however large its own burst.
            let used = a.bucket.burst - a.bucket.tokens;
            let quiet = used < (a.bucket.burst / 2.0).min(f64::from(limits.gateway_reserve) / 2.0);
            let floor = if quiet {
                0.0
            } else {
                f64::from(limits.gateway_reserve)
            };
            (state.gateway.tokens - floor < 1.0).then_some(Scope::Gateway)
        };
        if scope != Some(Scope::Agent) {
            // Charged even when the gateway refuses: the agent's bucket measures its demand, so an agent
            // hammering a saturated gateway stays busy instead of refilling into a quiet one.
            a.bucket.tokens -= 1.0;
        }
        let Some(scope) = scope else {
            state.gateway.tokens -= 1.0;
            return Admission::Admitted;
        };
        let (agent_count, total) = match scope {
            Scope::Agent => (
                &mut a.count.refused_agent_budget,
                &mut state.total.refused_agent_budget,
            ),
            Scope::Gateway => (
                &mut a.count.refused_gateway_budget,
                &mut state.total.refused_gateway_budget,
            ),
        };
        *agent_count += 1;
        *total += 1;
        a.refused_unlogged += 1;
        let due = a
            .last_logged
            .is_none_or(|t| now.saturating_duration_since(t) >= LOG_EVERY);
        let log = due.then(|| {
            a.last_logged = Some(now);
            std::mem::take(&mut a.refused_unlogged)
        });
        Admission::Refused { scope, log }
    }

    /// Count an event for `agent`.
    pub(crate) fn record(&self, agent: &AgentId, event: Event) {
        let mut guard = self.lock();
        let state = &mut *guard;
        let counts = [
            Some(&mut state.total),
            state.agents.get_mut(agent).map(|a| &mut a.count),
        ];
        for count in counts.into_iter().flatten() {
            match event {
                Event::Forwarded => count.forwarded += 1,
                Event::RefusedLocal => count.refused_local += 1,
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update leaves the state consistent (plain counters and buckets).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str) -> AgentId {
        AgentId::new(id).unwrap()
    }

    fn limits(
        agent_qps: u32,
        agent_burst: u32,
        gateway_qps: u32,
        gateway_burst: u32,
        reserve: u32,
    ) -> DnsLimits {
        DnsLimits {
            agent_qps,
            agent_burst,
            gateway_qps,
            gateway_burst,
            gateway_reserve: reserve,
        }
    }

    /// Admitted queries out of `n` sent at `now`.
    fn send(b: &DnsBudget, a: &AgentId, n: u32, now: Instant) -> u32 {
        (0..n).filter(|_| b.admit(a, now) == Admission::Admitted).count() as u32
    }

    // covers: E20
    #[test]
    fn an_agent_gets_its_burst_then_its_rate() {
        let b = DnsBudget::new(limits(200, 400, 2000, 4000, 1000));
        let a = agent("a");
        let t = Instant::now();
        assert_eq!(send(&b, &a, 1000, t), 400);
        assert_eq!(send(&b, &a, 1000, t + Duration::from_millis(500)), 100);
        assert_eq!(
            send(&b, &a, 1000, t + Duration::from_secs(10)),
            400,
            "refills to the burst, not beyond"
        );
        let c = b.counters();
        assert_eq!(c.agents[&a].queries, 3000);
        assert_eq!(c.agents[&a].refused_agent_budget, 2100);
        assert_eq!(c.total.refused_agent_budget, 2100);
    }

    // covers: E20
    #[test]
    fn one_agent_exhausting_its_budget_never_starves_another() {
        // The agent burst is larger than the gateway's unreserved part: without the reserve, agent a alone
        // would drain the gateway.
        let b = DnsBudget::new(limits(10, 100, 1, 60, 20));
        let (a, other) = (agent("a"), agent("b"));
        let t = Instant::now();
        // Quiet for 10 queries (half the reserve), then busy down to the reserve: 40 in all. The gateway's
        // refusals still cost a its own tokens, so it then runs out of those.
        assert_eq!(send(&b, &a, 1000, t), 40, "a stops at the reserve");
        let c = b.counters().agents[&a];
        assert_eq!((c.refused_gateway_budget, c.refused_agent_budget), (60, 900));
        // The other agent is quiet: the reserve is its.
        assert_eq!(send(&b, &other, 10, t), 10);
        assert_eq!(b.counters().agents[&other].refused_gateway_budget, 0);
    }

    // covers: E20
    #[test]
    fn many_flooding_agents_leave_the_reserve_to_quiet_ones() {
        let b = DnsBudget::new(limits(200, 400, 2000, 4000, 1000));
        let t = Instant::now();
        let flooders: Vec<AgentId> = (0..20).map(|i| agent(&format!("f{i}"))).collect();
        let quiet = agent("quiet");
        // Twenty agents at five times their rate, together twice the gateway's: once they have used their
        // bursts (a second), they take only what the gateway has beyond the reserve.
        for step in 0..60u64 {
            let now = t + Duration::from_millis(step * 100);
            for f in &flooders {
                send(&b, f, 100, now);
            }
            if step >= 10 {
                assert_eq!(send(&b, &quiet, 5, now), 5, "step {step}");
            }
        }
        assert!(
            b.counters().total.refused_gateway_budget > 0,
            "the gateway's budget did bind"
        );
    }

    #[test]
    fn refusals_are_logged_once_a_second_with_their_count() {
        let b = DnsBudget::new(limits(1, 1, 100, 100, 10));
        let a = agent("a");
        let t = Instant::now();
        assert_eq!(b.admit(&a, t), Admission::Admitted);
        assert_eq!(
            b.admit(&a, t),
            Admission::Refused {
                scope: Scope::Agent,
                log: Some(1)
            }
        );
        for _ in 0..9 {
            assert_eq!(
                b.admit(&a, t),
                Admission::Refused {
                    scope: Scope::Agent,
                    log: None
                }
            );
        }
        let later = t + Duration::from_millis(1500);
        assert_eq!(b.admit(&a, later), Admission::Admitted);
        assert_eq!(
            b.admit(&a, later),
            Admission::Refused {
                scope: Scope::Agent,
                log: Some(10)
            }
        );
    }

    #[test]
    fn events_are_counted_and_agents_forgotten() {
        let b = DnsBudget::default();
        let a = agent("a");
        b.admit(&a, Instant::now());
        b.record(&a, Event::Forwarded);
        b.record(&a, Event::RefusedLocal);
        let c = b.counters();
        assert_eq!((c.agents[&a].forwarded, c.agents[&a].refused_local), (1, 1));
        b.forget(&a);
        let c = b.counters();
        assert!(c.agents.is_empty());
        assert_eq!(
            (c.total.queries, c.total.forwarded, c.total.refused_local),
            (1, 1, 1)
        );
    }

    #[test]
    fn limits_are_bounded() {
        let b = DnsBudget::new(limits(0, 0, 0, 0, 5));
        assert_eq!(b.limits(), limits(1, 1, 1, 1, 0));
        assert_eq!(DnsLimits::default(), limits(200, 400, 2000, 4000, 1000));
    }
}
