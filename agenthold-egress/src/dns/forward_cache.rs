//! The answer cache of the resolver's forward path: what [`Upstream::forward_for`](super::Upstream) serves
//! before it asks the upstream.
//!
//! **What it stores.** The upstream's answer as received (after the id/question/source checks of the
//! exchange), *before* the gateway's filtering: the policy check, the rebinding filter (E6, E22) and the
//! per-agent name records are all applied by [`Server::answer`](super::Server::answer) to every answer, cached
//! or not, so a hit skips the upstream exchange and nothing else.
//!
//! **Key.** The agent, the question name (compared case-insensitively, as DNS names are), type, class and the
//! CD bit (the only client flag that reaches the upstream: the forwarded query is built afresh without the
//! client's EDNS options or DO bit, see `upstream.rs`, so DO cannot change the answer and is not part of the
//! key).
//!
//! **Per agent.** Every entry belongs to one agent: agent B's query is never answered from agent A's entry.
//! A cache shared between agents would let one agent learn, by timing its own queries, which names another
//! agent resolved (a cross-agent side channel); the price is one upstream query per agent and name. All
//! agents share one entry bound ([`ForwardLimits::cache_entries`]).
//!
//! **Lifetime.** A positive answer lives for its lowest record TTL clamped to
//! [`ForwardLimits::min_ttl`]..[`ForwardLimits::max_ttl`]; a lifetime of zero is not cached. A negative
//! answer (NXDOMAIN, or NOERROR without answer records: NODATA) lives for min(SOA TTL, SOA MINIMUM) of the SOA
//! in its authority section (RFC 2308 §5), at most [`ForwardLimits::max_negative_ttl`]; without an SOA it is
//! not cached (RFC 2308 §5: "SHOULD NOT be cached"). Any other response code (SERVFAIL, REFUSED, …),
//! truncated answers and failures (timeouts) are never cached. Answers served from the cache have every
//! record's TTL lowered by the entry's age in whole seconds.
//!
//! **Bounds.** At most [`ForwardLimits::cache_entries`] entries (`0` disables the cache), none larger than
//! [`ForwardLimits::max_answer_bytes`] on the wire; beyond the count the least recently used entry goes.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agenthold_core::AgentId;
use agenthold_core::config::EgressConfig;
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use super::upstream::lock;

/// Bounds of the forward path: the answer cache and the upstream sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardLimits {
    /// Answers cached, all agents together; `0` disables the cache. Default 10 000
    /// (`egress.dns_cache_entries`).
    pub cache_entries: usize,
    /// Shortest lifetime of a positive answer, whatever its TTL. Default 0 s: the TTL is honoured
    /// (`egress.dns_cache_min_ttl_secs`).
    pub min_ttl: Duration,
    /// Longest lifetime of a positive answer. Default 3600 s (`egress.dns_cache_max_ttl_secs`).
    pub max_ttl: Duration,
    /// Longest lifetime of a negative answer (NXDOMAIN, NODATA). Default 300 s
    /// (`egress.dns_cache_max_negative_ttl_secs`).
    pub max_negative_ttl: Duration,
    /// Largest answer cached, in bytes on the wire. Default 4096 (not configurable: it bounds memory per
    /// entry).
    pub max_answer_bytes: usize,
    /// UDP sockets open towards the upstream at most (each query uses one socket at a time; more concurrent
    /// queries wait for one). Default 32 (`egress.dns_upstream_sockets`).
    pub upstream_sockets: usize,
    /// A pooled upstream socket is closed (and a fresh one, on a new random port, bound when needed) after
    /// this many queries. Default 256.
    pub socket_queries: u32,
    /// … or once it is this old. Default 60 s.
    pub socket_lifetime: Duration,
}

impl Default for ForwardLimits {
    fn default() -> Self {
        Self {
            cache_entries: 10_000,
            min_ttl: Duration::ZERO,
            max_ttl: Duration::from_secs(3600),
            max_negative_ttl: Duration::from_secs(300),
            max_answer_bytes: 4096,
            upstream_sockets: 32,
            socket_queries: 256,
            socket_lifetime: Duration::from_secs(60),
        }
    }
}

impl ForwardLimits {
    /// The limits configured in `egress` (`dns_cache_entries`, `dns_cache_min_ttl_secs`,
    /// `dns_cache_max_ttl_secs`, `dns_cache_max_negative_ttl_secs`, `dns_upstream_sockets`); the rest default.
    #[must_use]
    pub fn from_config(egress: &EgressConfig) -> Self {
        Self {
            cache_entries: egress.dns_cache_entries,
            min_ttl: Duration::from_secs(egress.dns_cache_min_ttl_secs),
            max_ttl: Duration::from_secs(egress.dns_cache_max_ttl_secs),
            max_negative_ttl: Duration::from_secs(egress.dns_cache_max_negative_ttl_secs),
            upstream_sockets: egress.dns_upstream_sockets.max(1),
            ..Self::default()
        }
    }

    /// How long `answer` may be cached, or `None` when it must not be.
    pub(crate) fn lifetime(&self, answer: &Message) -> Option<Duration> {
        if answer.truncation {
            return None;
        }
        let rcode = answer.response_code;
        let negative =
            rcode == ResponseCode::NXDomain || (rcode == ResponseCode::NoError && answer.answers.is_empty());
        let lifetime = if negative {
            // RFC 2308 §5: min(SOA TTL, SOA MINIMUM); no SOA, no negative caching.
            let soa = answer.authorities.iter().find_map(|r| match &r.data {
                RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
                _ => None,
            })?;
            secs(soa).min(self.max_negative_ttl)
        } else if rcode == ResponseCode::NoError {
            let lowest = all_records(answer).map(|r| r.ttl).min().unwrap_or(0);
            secs(lowest).clamp(self.min_ttl, self.max_ttl.max(self.min_ttl))
        } else {
            return None;
        };
        (!lifetime.is_zero()).then_some(lifetime)
    }
}

fn secs(ttl: u32) -> Duration {
    Duration::from_secs(u64::from(ttl))
}

fn all_records(m: &Message) -> impl Iterator<Item = &Record> {
    m.answers.iter().chain(&m.authorities).chain(&m.additionals)
}

/// What identifies a cached answer (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    agent: AgentId,
    /// Compared and hashed case-insensitively by hickory's `Name`.
    name: Name,
    qtype: RecordType,
    class: DNSClass,
    checking_disabled: bool,
}

impl Key {
    pub(crate) fn new(agent: &AgentId, question: &Query, checking_disabled: bool) -> Self {
        Self {
            agent: agent.clone(),
            name: question.name.clone(),
            qtype: question.query_type,
            class: question.query_class,
            checking_disabled,
        }
    }

    /// Whether this is the key of `agent`'s `question` (names compared case-insensitively).
    fn is(&self, agent: &AgentId, question: &Query, checking_disabled: bool) -> bool {
        self.qtype == question.query_type
            && self.class == question.query_class
            && self.checking_disabled == checking_disabled
            && self.agent == *agent
            && self.name == question.name
    }
}

/// A cached answer.
#[derive(Debug)]
pub(crate) struct Cached {
    message: Message,
    stored: Instant,
    expires: Instant,
}

impl Cached {
    /// The entry's age at `now` in whole seconds.
    pub(crate) fn age(&self, now: Instant) -> u32 {
        u32::try_from(now.saturating_duration_since(self.stored).as_secs()).unwrap_or(u32::MAX)
    }

    /// When the entry was stored.
    pub(crate) fn stored(&self) -> Instant {
        self.stored
    }

    /// When the entry stops being served.
    pub(crate) fn expires(&self) -> Instant {
        self.expires
    }

    /// The answer as served at `now`: every TTL lowered by the entry's age in whole seconds.
    pub(crate) fn aged(&self, now: Instant) -> Message {
        let age = self.age(now);
        let mut message = self.message.clone();
        if age > 0 {
            for r in message
                .answers
                .iter_mut()
                .chain(&mut message.authorities)
                .chain(&mut message.additionals)
            {
                r.ttl = r.ttl.saturating_sub(age);
            }
        }
        message
    }
}

#[derive(Debug)]
struct Slot {
    key: Key,
    entry: Arc<Cached>,
    /// Use number; an `order` entry with another number is stale.
    seq: u64,
}

/// A `u64` key hashed by [`ForwardCache::digest`] already: used as is.
#[derive(Debug, Default, Clone, Copy)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Slots by digest (a keyed hash of the key: collisions are resolved by comparing keys in the bucket).
    /// Looking up by digest needs no owned key, so a hit copies nothing.
    map: HashMap<u64, Vec<Slot>, BuildHasherDefault<Prehashed>>,
    len: usize,
    /// Use order, least recent first, as (use number, digest); entries whose number no longer matches a
    /// slot's are stale.
    order: VecDeque<(u64, u64)>,
    seq: u64,
}

impl Inner {
    /// Remove the slot of `digest` used as number `seq`, if it is still there.
    fn remove(&mut self, digest: u64, seq: u64) {
        if let Some(bucket) = self.map.get_mut(&digest)
            && let Some(i) = bucket.iter().position(|s| s.seq == seq)
        {
            bucket.swap_remove(i);
            self.len -= 1;
            if bucket.is_empty() {
                self.map.remove(&digest);
            }
        }
    }

    /// Drop stale order entries once they outnumber live ones (hits push one each).
    fn compact(&mut self, cap: usize) {
        if self.order.len() > 2 * cap.min(self.len.max(64)) + 64 {
            let map = &self.map;
            self.order
                .retain(|(seq, digest)| map.get(digest).is_some_and(|b| b.iter().any(|s| s.seq == *seq)));
        }
    }
}

/// The bounded, per-agent answer cache (see the module docs).
#[derive(Debug)]
pub(crate) struct ForwardCache {
    limits: ForwardLimits,
    hasher: RandomState,
    inner: Mutex<Inner>,
}

impl ForwardCache {
    pub(crate) fn new(limits: ForwardLimits) -> Self {
        Self {
            limits,
            hasher: RandomState::new(),
            inner: Mutex::new(Inner::default()),
        }
    }

    pub(crate) fn limits(&self) -> &ForwardLimits {
        &self.limits
    }

    /// A keyed hash of (agent, lower-cased name, type, class, CD), in one pass over a stack buffer.
    fn digest(&self, agent: &AgentId, question: &Query, checking_disabled: bool) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(agent.as_str().as_bytes());
        h.write_u8(0xff);
        let mut buf = [0u8; 512];
        let mut n = 0;
        for label in &question.name {
            for b in std::iter::once(&u8::try_from(label.len()).unwrap_or(u8::MAX)).chain(label) {
                if let Some(slot) = buf.get_mut(n) {
                    *slot = b.to_ascii_lowercase();
                    n += 1;
                }
            }
        }
        h.write(buf.get(..n).unwrap_or_default());
        h.write_u8(u8::from(question.name.is_fqdn()));
        h.write_u16(u16::from(question.query_type));
        h.write_u16(u16::from(question.query_class));
        h.write_u8(u8::from(checking_disabled));
        h.finish()
    }

    /// The fresh entry for `agent`'s `question` at `now`, made the most recently used; an expired entry is
    /// removed.
    pub(crate) fn get(
        &self,
        agent: &AgentId,
        question: &Query,
        checking_disabled: bool,
        now: Instant,
    ) -> Option<Arc<Cached>> {
        if self.limits.cache_entries == 0 {
            return None;
        }
        let digest = self.digest(agent, question, checking_disabled);
        let mut inner = lock(&self.inner);
        let Inner { map, order, seq, .. } = &mut *inner;
        let slot = map
            .get_mut(&digest)?
            .iter_mut()
            .find(|s| s.key.is(agent, question, checking_disabled))?;
        if slot.entry.expires <= now {
            let stale = slot.seq;
            inner.remove(digest, stale);
            return None;
        }
        *seq += 1;
        slot.seq = *seq;
        order.push_back((*seq, digest));
        let entry = Arc::clone(&slot.entry);
        inner.compact(self.limits.cache_entries);
        Some(entry)
    }

    /// Store `answer` (`wire_len` bytes on the wire) for `agent`'s `question` if it may be cached; returns
    /// whether it was.
    pub(crate) fn insert(
        &self,
        agent: &AgentId,
        question: &Query,
        checking_disabled: bool,
        answer: &Message,
        wire_len: usize,
        now: Instant,
    ) -> bool {
        let cap = self.limits.cache_entries;
        if cap == 0 || wire_len > self.limits.max_answer_bytes {
            return false;
        }
        let Some(lifetime) = self.limits.lifetime(answer) else {
            return false;
        };
        let entry = Arc::new(Cached {
            message: answer.clone(),
            stored: now,
            expires: now + lifetime,
        });
        let key = Key::new(agent, question, checking_disabled);
        let digest = self.digest(agent, question, checking_disabled);
        let mut inner = lock(&self.inner);
        inner.seq += 1;
        let seq = inner.seq;
        inner.order.push_back((seq, digest));
        let bucket = inner.map.entry(digest).or_default();
        if let Some(slot) = bucket.iter_mut().find(|s| s.key == key) {
            *slot = Slot { key, entry, seq };
        } else {
            bucket.push(Slot { key, entry, seq });
            inner.len += 1;
        }
        while inner.len > cap {
            let Some((seq, digest)) = inner.order.pop_front() else {
                break;
            };
            inner.remove(digest, seq);
        }
        inner.compact(cap);
        true
    }

    /// Entries held (expired ones not yet removed included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).len
    }
}

#[cfg(test)]
#[path = "forward_cache_tests.rs"]
mod tests;
