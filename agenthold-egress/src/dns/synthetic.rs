//! Synthetic addresses for test-only name overrides (`--dangerous-connect-to NAME:PORT=IP:PORT`).
//!
//! An overridden name must still route through the gateway: the sandbox gets a synthetic address, never the
//! real target (which is typically a loopback test server the sandbox must not learn about or reach). The
//! [`Server`](super::Server) answers such a name with its synthetic address *without asking the upstream*
//! and records the pair in [`Records`](super::Records); the transparent proxy, seeing a connection to that
//! address, maps it back to the name and dials the override's target itself.
//!
//! The range is 198.18.0.0/15 (RFC 2544 benchmarking): it is never a real destination, the address guard
//! blocks it (so an upstream answer can never forge a synthetic mapping: such records are stripped), and
//! sandboxes' default route sends it to the gateway like any other address.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::RwLock;

use agenthold_core::policy::normalize_name;
use ipnet::Ipv4Net;

use crate::error::{Error, Result};

/// The range synthetic addresses are allocated from: 198.18.0.0/15.
pub const SYNTHETIC_RANGE: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 0, 0), 15);

#[derive(Debug, Default)]
struct Table {
    by_name: HashMap<String, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, String>,
}

/// Names answered with a synthetic address (one per name, stable for the life of the table) instead of
/// being resolved. Empty unless a test or `--dangerous-connect-to` adds names: a dangerous switch.
#[derive(Debug, Default)]
pub struct SyntheticNames {
    table: RwLock<Table>,
}

impl SyntheticNames {
    /// An empty table (no overrides: every name is resolved normally).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Override `name`: from now on it resolves to a synthetic address, returned. Adding a name twice
    /// returns the same address. Addresses are handed out in order from 198.18.0.1.
    ///
    /// # Errors
    /// [`Error::Core`] when `name` is not a valid host name; [`Error::Config`] when the range is exhausted.
    pub fn insert(&self, name: &str) -> Result<Ipv4Addr> {
        let name = normalize_name(name)?;
        let mut table = self
            .table
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(addr) = table.by_name.get(&name) {
            return Ok(*addr);
        }
        // Host 0 is skipped (.0 of the range reads like a network address); the last address of the range
        // (198.19.255.255) is excluded as the broadcast-looking address.
        let index = u32::try_from(table.by_name.len() + 1).unwrap_or(u32::MAX);
        let addr = Ipv4Addr::from(SYNTHETIC_RANGE.network().to_bits().saturating_add(index));
        if !SYNTHETIC_RANGE.contains(&addr) || addr == SYNTHETIC_RANGE.broadcast() {
            return Err(Error::Config {
                problem: format!("no synthetic address left for {name}"),
            });
        }
        table.by_name.insert(name.clone(), addr);
        table.by_addr.insert(addr, name);
        Ok(addr)
    }

    /// The synthetic address of `name` (normalised), if it is overridden.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<Ipv4Addr> {
        self.read().by_name.get(name).copied()
    }

    /// The name a synthetic address stands for.
    #[must_use]
    pub fn name_of(&self, addr: Ipv4Addr) -> Option<String> {
        self.read().by_addr.get(&addr).cloned()
    }

    /// Whether no name is overridden.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.read().by_name.is_empty()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        // Inserts update both maps under one write lock without a panic point between them.
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_stable_distinct_and_in_range() {
        let s = SyntheticNames::new();
        assert!(s.is_empty());
        let a = s.insert("API.Example.com.").unwrap();
        let b = s.insert("other.example").unwrap();
        assert_eq!(a, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(b, Ipv4Addr::new(198, 18, 0, 2));
        assert_eq!(s.insert("api.example.com").unwrap(), a);
        assert_eq!(s.get("api.example.com"), Some(a));
        assert_eq!(s.name_of(b).as_deref(), Some("other.example"));
        assert!(SYNTHETIC_RANGE.contains(&a));
        assert!(
            crate::guard::Guard::new([])
                .check(std::net::IpAddr::V4(a))
                .is_err(),
            "the guard must block the synthetic range"
        );
    }

    #[test]
    fn invalid_names_are_refused() {
        assert!(SyntheticNames::new().insert("not a name").is_err());
    }
}
