//! Which name each address the gateway's DNS handed to an agent was resolved from.
//!
//! A plain TCP connection (SSH, a database) carries no name; the transparent proxy decides it by the name
//! the agent resolved to the address it dials, read back here. Per agent, because agent A resolving a name
//! must not make that name's addresses count as named for agent B. An address may map to several names
//! (CDNs put many names on one address); [`Records::names_for`] returns them all, newest first.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agenthold_core::AgentId;

use super::upstream::lock;

/// The shortest time a remembered address stays mapped, whatever the record's TTL.
///
/// Why: a client connects *after* it got the answer, and resolver libraries and applications cache answers
/// a little (or a lot) beyond the TTL. A record with TTL 0 or 1 s would otherwise expire before the client's
/// connection reaches the proxy, and the connection would be refused for lack of a name.
pub const RECORDS_MIN_TTL: Duration = Duration::from_secs(60);
/// The longest time a remembered address stays mapped (records with week-long TTLs exist).
const RECORDS_MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default cap on (address, name) pairs per agent.
const DEFAULT_CAP: usize = 4096;
/// Names kept per address; beyond it the oldest name of that address goes.
const NAMES_PER_ADDR: usize = 32;

#[derive(Debug)]
struct Named {
    name: String,
    expires: Instant,
    /// Insertion number; an `order` entry with another number is stale.
    seq: u64,
}

/// One agent's mappings.
#[derive(Debug, Default)]
struct AgentRecords {
    by_addr: HashMap<IpAddr, Vec<Named>>,
    /// (address, name) pairs currently mapped.
    len: usize,
    seq: u64,
    /// Insertion order of pairs, oldest first; entries whose `seq` no longer matches are stale.
    order: VecDeque<(u64, IpAddr)>,
}

impl AgentRecords {
    fn remember(&mut self, name: &str, addr: IpAddr, expires: Instant, cap: usize) {
        self.seq += 1;
        let seq = self.seq;
        let names = self.by_addr.entry(addr).or_default();
        if let Some(pos) = names.iter().position(|n| n.name == name) {
            // Refresh: the later expiry wins, and the pair becomes the newest.
            let old = names.remove(pos);
            names.push(Named {
                name: old.name,
                expires: old.expires.max(expires),
                seq,
            });
        } else {
            if names.len() == NAMES_PER_ADDR {
                names.remove(0);
                self.len -= 1;
            }
            names.push(Named {
                name: name.to_owned(),
                expires,
                seq,
            });
            self.len += 1;
        }
        self.order.push_back((seq, addr));
        while self.len > cap {
            let Some((seq, addr)) = self.order.pop_front() else {
                break;
            };
            self.remove_pair(addr, seq);
        }
        if self.order.len() > 2 * cap + 16 {
            let by_addr = &self.by_addr;
            self.order.retain(|(seq, addr)| {
                by_addr
                    .get(addr)
                    .is_some_and(|ns| ns.iter().any(|n| n.seq == *seq))
            });
        }
    }

    fn remove_pair(&mut self, addr: IpAddr, seq: u64) {
        let Some(names) = self.by_addr.get_mut(&addr) else {
            return;
        };
        if let Some(pos) = names.iter().position(|n| n.seq == seq) {
            names.remove(pos);
            self.len -= 1;
        }
        if names.is_empty() {
            self.by_addr.remove(&addr);
        }
    }
}

/// Per agent: address → the names it was resolved from, each until its (clamped) TTL runs out.
///
/// Cheap and synchronous (one `std` mutex, no I/O): it is read once per plain TCP connection.
#[derive(Debug)]
pub struct Records {
    agents: Mutex<HashMap<AgentId, AgentRecords>>,
    cap: usize,
    min_ttl: Duration,
}

impl Default for Records {
    fn default() -> Self {
        Self::new()
    }
}

impl Records {
    /// Empty records: at most 4096 (address, name) pairs per agent, TTLs raised to at least
    /// [`RECORDS_MIN_TTL`] and capped at one day.
    #[must_use]
    pub fn new() -> Self {
        Self::with_limits(DEFAULT_CAP, RECORDS_MIN_TTL)
    }

    /// Empty records with another cap per agent (at least one pair) and another minimum TTL (tests use a
    /// short one to see entries expire).
    #[must_use]
    pub fn with_limits(cap_per_agent: usize, min_ttl: Duration) -> Self {
        Self {
            agents: Mutex::new(HashMap::new()),
            cap: cap_per_agent.max(1),
            min_ttl,
        }
    }

    /// Remember that `agent` was told `name` (normalised) resolves to `addr`, for `ttl` (clamped). Beyond the
    /// cap, the agent's oldest pair is forgotten.
    pub fn remember(&self, agent: &AgentId, name: &str, addr: IpAddr, ttl: Duration) {
        self.remember_at(agent, name, addr, ttl, Instant::now());
    }

    pub(crate) fn remember_at(&self, agent: &AgentId, name: &str, addr: IpAddr, ttl: Duration, now: Instant) {
        let ttl = ttl.clamp(self.min_ttl, RECORDS_MAX_TTL.max(self.min_ttl));
        let mut agents = lock(&self.agents);
        let records = match agents.get_mut(agent) {
            Some(r) => r,
            None => agents.entry(agent.clone()).or_default(),
        };
        records.remember(name, addr, now + ttl, self.cap);
    }

    /// The names `agent` resolved to `addr` that have not expired, newest first.
    #[must_use]
    pub fn names_for(&self, agent: &AgentId, addr: IpAddr) -> Vec<String> {
        self.names_for_at(agent, addr, Instant::now())
    }

    pub(crate) fn names_for_at(&self, agent: &AgentId, addr: IpAddr, now: Instant) -> Vec<String> {
        let agents = lock(&self.agents);
        let Some(names) = agents.get(agent).and_then(|r| r.by_addr.get(&addr)) else {
            return Vec::new();
        };
        names
            .iter()
            .rev()
            .filter(|n| n.expires > now)
            .map(|n| n.name.clone())
            .collect()
    }

    /// Forget everything about `agent` (when its sandbox is removed).
    pub fn forget(&self, agent: &AgentId) {
        lock(&self.agents).remove(agent);
    }

    /// How many (address, name) pairs are held for `agent`, expired ones not yet evicted included.
    #[must_use]
    pub fn len(&self, agent: &AgentId) -> usize {
        lock(&self.agents).get(agent).map_or(0, |r| r.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str) -> AgentId {
        AgentId::new(id).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn maps_addresses_back_to_names_per_agent() {
        let r = Records::new();
        let (a, b) = (agent("a"), agent("b"));
        r.remember(&a, "github.com", ip("140.82.112.3"), Duration::from_secs(300));
        assert_eq!(r.names_for(&a, ip("140.82.112.3")), ["github.com"]);
        assert!(r.names_for(&b, ip("140.82.112.3")).is_empty());
        assert!(r.names_for(&a, ip("140.82.112.4")).is_empty());
    }

    #[test]
    fn an_address_may_carry_several_names_newest_first() {
        let r = Records::new();
        let a = agent("a");
        r.remember(&a, "one.example", ip("151.101.1.1"), Duration::from_secs(60));
        r.remember(&a, "two.example", ip("151.101.1.1"), Duration::from_secs(60));
        assert_eq!(r.names_for(&a, ip("151.101.1.1")), ["two.example", "one.example"]);
        // Remembering "one" again refreshes it rather than adding a duplicate.
        r.remember(&a, "one.example", ip("151.101.1.1"), Duration::from_secs(60));
        assert_eq!(r.names_for(&a, ip("151.101.1.1")), ["one.example", "two.example"]);
        assert_eq!(r.len(&a), 2);
    }

    #[test]
    fn ttl_is_raised_to_the_minimum_and_entries_expire() {
        let r = Records::new();
        let a = agent("a");
        let now = Instant::now();
        r.remember_at(&a, "short.example", ip("93.184.216.34"), Duration::ZERO, now);
        let soon = now + Duration::from_secs(59);
        assert_eq!(r.names_for_at(&a, ip("93.184.216.34"), soon), ["short.example"]);
        let later = now + RECORDS_MIN_TTL;
        assert!(r.names_for_at(&a, ip("93.184.216.34"), later).is_empty());
        r.remember_at(
            &a,
            "long.example",
            ip("93.184.216.35"),
            Duration::from_secs(600),
            now,
        );
        assert_eq!(r.names_for_at(&a, ip("93.184.216.35"), later), ["long.example"]);
        assert!(
            r.names_for_at(&a, ip("93.184.216.35"), now + Duration::from_secs(600))
                .is_empty()
        );
    }

    #[test]
    fn cap_per_agent_evicts_the_oldest_pairs() {
        let r = Records::with_limits(4, RECORDS_MIN_TTL);
        let a = agent("a");
        for i in 0..10u8 {
            r.remember(
                &a,
                &format!("n{i}.example"),
                IpAddr::from([93, 184, 216, i]),
                Duration::from_secs(60),
            );
        }
        assert_eq!(r.len(&a), 4);
        assert!(r.names_for(&a, IpAddr::from([93, 184, 216, 5])).is_empty());
        assert_eq!(r.names_for(&a, IpAddr::from([93, 184, 216, 6])), ["n6.example"]);
        assert_eq!(r.names_for(&a, IpAddr::from([93, 184, 216, 9])), ["n9.example"]);
        // The order queue stays bounded when one pair is refreshed over and over.
        for _ in 0..10_000 {
            r.remember(
                &a,
                "n9.example",
                IpAddr::from([93, 184, 216, 9]),
                Duration::from_secs(60),
            );
        }
        assert_eq!(r.len(&a), 4);
        assert!(lock(&r.agents).get(&a).unwrap().order.len() <= 2 * 4 + 17);
    }

    #[test]
    fn names_per_address_are_capped() {
        let r = Records::new();
        let a = agent("a");
        for i in 0..100 {
            r.remember(
                &a,
                &format!("n{i}.example"),
                ip("151.101.1.1"),
                Duration::from_secs(60),
            );
        }
        let names = r.names_for(&a, ip("151.101.1.1"));
        assert_eq!(names.len(), NAMES_PER_ADDR);
        assert_eq!(names[0], "n99.example");
        assert_eq!(r.len(&a), NAMES_PER_ADDR);
    }

    #[test]
    fn forget_drops_the_agent() {
        let r = Records::new();
        let a = agent("a");
        r.remember(&a, "x.example", ip("93.184.216.34"), Duration::from_secs(60));
        r.forget(&a);
        assert!(r.names_for(&a, ip("93.184.216.34")).is_empty());
        assert_eq!(r.len(&a), 0);
    }
}
