//! The address guard (E6, E22): decides whether an upstream address may ever be dialled, whatever the
//! policy.
//!
//! One [`Guard`] per gateway, shared (`Arc`) by the dialer (every dial, by name or by address) and the DNS
//! server (answer filtering: rebinding protection, and reverse lookups of blocked ranges). It refuses, in
//! this order:
//!
//! 1. every row of the IANA IPv4 and IPv6 special-purpose registries, IPv4 multicast, and every IPv6 block
//!    outside Global Unicast `2000::/3`: the table in [`registry`], one row per registry row with its name,
//!    RFC, "Globally Reachable" flag and our verdict. IPv6 forms that embed an IPv4 address (mapped,
//!    compatible, NAT64, 6to4, Teredo) are judged by the IPv4 inside, by every check below as well;
//! 2. known cloud-provider endpoints at public-looking addresses ([`providers`], e.g. Azure's
//!    `168.63.129.16`);
//! 3. the operator's deny list (`egress.deny_cidrs`);
//! 4. every address of the network namespace the gateway dials from, kept current from netlink
//!    (see `local.rs`: IPv4 addresses as `/32`, IPv6 on-link prefixes).
//!
//! A refusal is data, [`Blocked`]: the range and why; the request log shows it as `blocked_address`.
// enforces: E6

mod local;
pub mod providers;
pub mod registry;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_registry;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use ipnet::IpNet;

use self::local::OwnAddresses;
use self::providers::{PROVIDERS, Provider};
use self::registry::{Row, Treatment};

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockReason {
    /// A row of an IANA registry (see [`registry`]).
    Registry(&'static Row),
    /// A known cloud-provider endpoint (see [`providers`]).
    Provider(&'static Provider),
    /// The operator's deny list (`egress.deny_cidrs`).
    DenyList,
    /// An address (IPv4) or on-link prefix (IPv6) of the namespace the gateway dials from.
    OwnAddress,
}

/// A refusal: the blocked range the address falls in, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    /// The range. For an IPv6 form that embeds an IPv4 address, the IPv4 range that refused it.
    pub range: IpNet,
    /// Why the range is blocked.
    pub reason: BlockReason,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "address in blocked range {} (", self.range)?;
        match self.reason {
            BlockReason::Registry(row) => write!(f, "{}, {}", row.name, row.rfc)?,
            BlockReason::Provider(p) => write!(f, "{} {}", p.provider, p.service)?,
            BlockReason::DenyList => f.write_str("egress.deny_cidrs")?,
            BlockReason::OwnAddress => f.write_str("an address of the gateway's own host")?,
        }
        f.write_str(")")
    }
}

/// Check `addr` against the registry tables alone; return the IPv4 addresses it embeds (to be checked by
/// the other rules as well).
fn check_registry(addr: IpAddr) -> Result<Vec<Ipv4Addr>, Blocked> {
    let Some(row) = registry::lookup(addr) else {
        return Ok(Vec::new());
    };
    // An embedding row is IPv6 only; any other row found blocks.
    let (Treatment::Embedded(how), IpAddr::V6(v6)) = (row.treatment, addr) else {
        return Err(Blocked {
            range: row.block,
            reason: BlockReason::Registry(row),
        });
    };
    let (first, second) = how.extract(v6);
    let inner: Vec<Ipv4Addr> = std::iter::once(first).chain(second).collect();
    for v4 in &inner {
        if let Some(row) = registry::lookup(IpAddr::V4(*v4)) {
            return Err(Blocked {
                range: row.block,
                reason: BlockReason::Registry(row),
            });
        }
    }
    Ok(inner)
}

/// The address guard of one gateway. Cheap to consult (a few table scans and one read lock); share it with
/// `Arc`.
#[derive(Debug)]
pub struct Guard {
    deny: Vec<IpNet>,
    own: Arc<OwnAddresses>,
}

impl Guard {
    /// A guard with the registry tables, the provider endpoints and `deny`, but **no** addresses of the
    /// host: for tests and tools that never dial. A gateway uses [`Guard::watching`].
    #[must_use]
    pub fn new(deny: impl IntoIterator<Item = IpNet>) -> Self {
        Self::with_own_addresses(deny, Vec::new())
    }

    /// [`Guard::new`] plus a fixed list of the host's own ranges (not followed: for tests).
    #[must_use]
    pub fn with_own_addresses(deny: impl IntoIterator<Item = IpNet>, own: Vec<IpNet>) -> Self {
        Self {
            deny: deny.into_iter().map(|n| n.trunc()).collect(),
            own: Arc::new(OwnAddresses::new(own)),
        }
    }

    /// The gateway's guard: [`Guard::new`] plus every address of the calling thread's network namespace,
    /// followed from then on (netlink notifications, and a re-read every 30 s). Call it in the namespace the
    /// gateway dials from; a background thread keeps the list current until the guard is dropped.
    ///
    /// # Errors
    /// When the namespace's addresses cannot be read (`getifaddrs` failed): without them the guard could
    /// not refuse the host itself.
    pub fn watching(deny: impl IntoIterator<Item = IpNet>) -> std::io::Result<Self> {
        Ok(Self {
            deny: deny.into_iter().map(|n| n.trunc()).collect(),
            own: local::watch()?,
        })
    }

    /// Whether `addr` may be dialled.
    ///
    /// # Errors
    /// [`Blocked`]: the range and the reason.
    pub fn check(&self, addr: IpAddr) -> Result<(), Blocked> {
        let inner = check_registry(addr)?;
        self.check_dynamic(addr)?;
        for v4 in inner {
            self.check_dynamic(IpAddr::V4(v4))?;
        }
        Ok(())
    }

    /// Whether the whole range `net` is free of blocked addresses (used for reverse DNS zones): refused
    /// when any blocked range overlaps it. A single address is judged by [`Guard::check`]; a larger range
    /// overlapping an IPv4-embedding block is refused, since some of its addresses embed blocked IPv4.
    ///
    /// # Errors
    /// [`Blocked`]: the first blocked range found.
    pub fn check_net(&self, net: IpNet) -> Result<(), Blocked> {
        if net.prefix_len() == net.max_prefix_len() {
            return self.check(net.network());
        }
        if let Some(row) = registry::overlapping(net).next() {
            return Err(Blocked {
                range: row.block,
                reason: BlockReason::Registry(row),
            });
        }
        let overlaps = |r: &IpNet| r.contains(&net.network()) || net.contains(&r.network());
        if let Some(p) = PROVIDERS.iter().find(|p| overlaps(&p.block)) {
            return Err(Blocked {
                range: p.block,
                reason: BlockReason::Provider(p),
            });
        }
        if let Some(d) = self.deny.iter().find(|d| overlaps(d)) {
            return Err(Blocked {
                range: *d,
                reason: BlockReason::DenyList,
            });
        }
        if let Some(range) = self.own.overlapping(net) {
            return Err(Blocked {
                range,
                reason: BlockReason::OwnAddress,
            });
        }
        Ok(())
    }

    /// The deny list (`egress.deny_cidrs`), host bits cleared.
    #[must_use]
    pub fn deny_list(&self) -> &[IpNet] {
        &self.deny
    }

    /// The host's own ranges as last read.
    #[must_use]
    pub fn own_addresses(&self) -> Vec<IpNet> {
        self.own.snapshot().to_vec()
    }

    /// The checks beyond the registry tables, for one address (no embedding: the caller unwraps).
    fn check_dynamic(&self, addr: IpAddr) -> Result<(), Blocked> {
        if let Some(p) = PROVIDERS.iter().find(|p| p.block.contains(&addr)) {
            return Err(Blocked {
                range: p.block,
                reason: BlockReason::Provider(p),
            });
        }
        if let Some(d) = self.deny.iter().find(|d| d.contains(&addr)) {
            return Err(Blocked {
                range: *d,
                reason: BlockReason::DenyList,
            });
        }
        if let Some(range) = self.own.find(addr) {
            return Err(Blocked {
                range,
                reason: BlockReason::OwnAddress,
            });
        }
        Ok(())
    }
}
