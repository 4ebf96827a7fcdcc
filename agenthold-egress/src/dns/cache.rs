//! A bounded map whose entries expire: the store behind [`Upstream`](super::Upstream)'s answer cache.
//!
//! Bounded because the names come from sandboxes: without a cap, an agent resolving random names would grow
//! the gateway's memory without limit. Beyond the cap the oldest insertion goes first (not the least recently
//! used: a hit does not refresh an entry, its TTL bounds it anyway).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Instant;

/// One stored value.
#[derive(Debug)]
struct Slot<V> {
    value: V,
    expires: Instant,
    /// Insertion number; an `order` entry with another number is stale.
    seq: u64,
}

/// A map of at most `cap` entries, each valid until its expiry.
#[derive(Debug)]
pub(crate) struct ExpiringMap<K, V> {
    cap: usize,
    seq: u64,
    map: HashMap<K, Slot<V>>,
    /// Insertion order, oldest first. Entries of replaced or removed keys stay until they reach the front
    /// (or a compaction), recognised by their `seq`.
    order: VecDeque<(u64, K)>,
}

impl<K: Hash + Eq + Clone, V: Clone> ExpiringMap<K, V> {
    /// An empty map holding at most `cap` entries (at least one).
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            seq: 0,
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// The value of `key` if it has not expired at `now`; an expired entry is removed.
    pub(crate) fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        let slot = self.map.get(key)?;
        if slot.expires > now {
            return Some(slot.value.clone());
        }
        self.map.remove(key);
        None
    }

    /// Insert or replace `key`, valid until `expires`, evicting the oldest entries beyond the cap.
    pub(crate) fn insert(&mut self, key: K, value: V, expires: Instant) {
        self.seq += 1;
        let seq = self.seq;
        self.order.push_back((seq, key.clone()));
        self.map.insert(key, Slot { value, expires, seq });
        while self.map.len() > self.cap {
            let Some((seq, key)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&key).is_some_and(|s| s.seq == seq) {
                self.map.remove(&key);
            }
        }
        // Stale order entries (replaced keys) would otherwise accumulate when the same keys are refreshed
        // over and over without the map ever filling up.
        if self.order.len() > 2 * self.cap + 16 {
            let map = &self.map;
            self.order
                .retain(|(seq, key)| map.get(key).is_some_and(|s| s.seq == *seq));
        }
    }

    /// Number of entries (expired ones not yet removed included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Length of the insertion-order queue (tests check it stays bounded).
    #[cfg(test)]
    fn order_len(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn entries_expire() {
        let now = Instant::now();
        let mut m = ExpiringMap::new(10);
        m.insert("a", 1, now + Duration::from_secs(5));
        assert_eq!(m.get(&"a", now), Some(1));
        assert_eq!(m.get(&"a", now + Duration::from_secs(5)), None);
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn cap_evicts_the_oldest_insertion() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut m = ExpiringMap::new(3);
        for (i, k) in ["a", "b", "c", "d"].into_iter().enumerate() {
            m.insert(k, i, later);
        }
        assert_eq!(m.len(), 3);
        assert_eq!(m.get(&"a", now), None);
        assert_eq!(m.get(&"d", now), Some(3));
        // Replacing "b" makes it the newest: the next eviction takes "c".
        m.insert("b", 10, later);
        m.insert("e", 4, later);
        assert_eq!(m.get(&"c", now), None);
        assert_eq!(m.get(&"b", now), Some(10));
    }

    #[test]
    fn refreshing_one_key_keeps_the_order_queue_bounded() {
        let later = Instant::now() + Duration::from_secs(60);
        let mut m = ExpiringMap::new(4);
        for i in 0..10_000 {
            m.insert("same", i, later);
        }
        assert_eq!(m.len(), 1);
        assert!(m.order_len() <= 2 * 4 + 17);
    }
}
