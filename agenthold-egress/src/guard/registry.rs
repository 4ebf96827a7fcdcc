//! The address guard's static tables: the IANA IPv4 and IPv6 Special-Purpose Address Registries row by row
//! (RFC 6890 and the RFCs that added rows since), plus the blocks of the IANA IPv4 and IPv6 Address Space
//! Registries that are not unicast address space for the public Internet (IPv4 multicast, and for IPv6
//! everything outside Global Unicast `2000::/3`).
//!
//! Source: the registries as published at <https://www.iana.org/assignments/iana-ipv4-special-registry/>,
//! <https://www.iana.org/assignments/iana-ipv6-special-registry/>,
//! <https://www.iana.org/assignments/ipv4-address-space/> and
//! <https://www.iana.org/assignments/ipv6-address-space/> (contents as of 2025: the newest rows are
//! `100:0:0:1::/64` (RFC 9780), `2001:1::3/128` (RFC 9665), `5f00::/16` (RFC 9602) and `3fff::/20`
//! (RFC 9637)). Each row carries the registry's name, RFC and "Globally Reachable" column, and our
//! [`Treatment`]. An address is judged by the most specific row that contains it.
//!
//! **Verdicts.** Every row is [`Treatment::Block`], except the IPv6 forms that embed an IPv4 address
//! (IPv4-mapped, IPv4-compatible, NAT64 well-known and local-use, 6to4, Teredo), which are judged by the
//! IPv4 address inside ([`Treatment::Embedded`]): the kernel or a translator turns them into that IPv4
//! destination, so the IPv4 table decides. Rows the registry marks globally reachable are blocked all the
//! same (PCP and TURN anycast, AS112, AMT, DNS-SD SRP anycast, ORCHIDv2, DETs): they are protocol
//! infrastructure addresses, no API an agent needs lives there, and an anycast service answers from a
//! nearby instance that may well be inside the operator's own network. Rows whose flag is "N/A" (terminated
//! or IPv4-embedding blocks) say so in [`Reachable::NotApplicable`]. The conservative choice is written on
//! each such row as its `note`.
// enforces: E22

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Which registry a row comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// IANA IPv4 Special-Purpose Address Registry.
    Ipv4SpecialPurpose,
    /// IANA IPv6 Special-Purpose Address Registry.
    Ipv6SpecialPurpose,
    /// IANA IPv4 Address Space Registry (the multicast block).
    Ipv4AddressSpace,
    /// IANA Internet Protocol Version 6 Address Space registry (the blocks outside `2000::/3`).
    Ipv6AddressSpace,
    /// Not an IANA registry row: an address form an RFC defines (the deprecated IPv4-compatible IPv6
    /// addresses, RFC 4291 §2.5.5.1).
    Rfc,
}

/// The registry's "Globally Reachable" column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reachable {
    /// `True`.
    Yes,
    /// `False`.
    No,
    /// `N/A`: a terminated row, a block that embeds IPv4, or a registry without that column.
    NotApplicable,
}

/// How an IPv6 address carries an IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Embedding {
    /// `::ffff:a.b.c.d` (RFC 4291 §2.5.5.2): the last 32 bits.
    Mapped,
    /// `::a.b.c.d` (deprecated, RFC 4291 §2.5.5.1): the last 32 bits.
    Compatible,
    /// `64:ff9b::a.b.c.d` (RFC 6052): the last 32 bits.
    Nat64,
    /// `64:ff9b:1::/48` (RFC 8215): a local-use prefix the operator may cut into NAT64 prefixes. Judged
    /// by the last 32 bits, which is where every `/96` NAT64 prefix (the usual deployment) puts the IPv4
    /// address; an operator whose translator uses another RFC 6052 format adds its prefix to
    /// `egress.deny_cidrs`.
    Nat64LocalUse,
    /// `2002:AABB:CCDD::/48` (RFC 3056): bits 16..48.
    SixToFour,
    /// Teredo `2001:0:SSSS:SSSS:…:CCCC:CCCC` (RFC 4380): the server in bits 32..64 and the client, inverted,
    /// in the last 32 bits; both are judged.
    Teredo,
}

impl Embedding {
    /// The IPv4 addresses `addr` carries in this form (the second only for Teredo).
    #[must_use]
    pub fn extract(self, addr: Ipv6Addr) -> (Ipv4Addr, Option<Ipv4Addr>) {
        let bits = addr.to_bits();
        // Truncation is the point: each slice is exactly 32 bits of the address.
        #[allow(clippy::cast_possible_truncation)]
        let at = |shift: u32| Ipv4Addr::from_bits((bits >> shift) as u32);
        match self {
            Self::Mapped | Self::Compatible | Self::Nat64 | Self::Nat64LocalUse => (at(0), None),
            Self::SixToFour => (at(80), None),
            Self::Teredo => (at(64), Some(Ipv4Addr::from_bits(!at(0).to_bits()))),
        }
    }
}

/// What the guard does with an address a row covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Treatment {
    /// Never dialled.
    Block,
    /// Judged by the IPv4 address(es) inside, by the IPv4 rows and every other check of the guard.
    Embedded(Embedding),
}

/// One row of a registry, with our verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Row {
    /// The address block.
    pub block: IpNet,
    /// The registry's name for it.
    pub name: &'static str,
    /// The RFC(s) the registry cites.
    pub rfc: &'static str,
    /// Which registry.
    pub source: Source,
    /// The registry's "Globally Reachable" column.
    pub reachable: Reachable,
    /// Our verdict.
    pub treatment: Treatment,
    /// Why, where the verdict is not simply the registry's flag (empty otherwise).
    pub note: &'static str,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> IpNet {
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len))
}

const fn v6(s: [u16; 8], len: u8) -> IpNet {
    let [a, b, c, d, e, f, g, h] = s;
    IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), len))
}

/// A row blocked as the registry says (not globally reachable, or terminated).
const fn row(
    block: IpNet,
    name: &'static str,
    rfc: &'static str,
    source: Source,
    reachable: Reachable,
) -> Row {
    Row {
        block,
        name,
        rfc,
        source,
        reachable,
        treatment: Treatment::Block,
        note: "",
    }
}

/// A row the registry marks globally reachable that we block all the same.
const fn anycast(
    block: IpNet,
    name: &'static str,
    rfc: &'static str,
    source: Source,
    note: &'static str,
) -> Row {
    Row {
        block,
        name,
        rfc,
        source,
        reachable: Reachable::Yes,
        treatment: Treatment::Block,
        note,
    }
}

const fn embedded(
    block: IpNet,
    name: &'static str,
    rfc: &'static str,
    source: Source,
    reachable: Reachable,
    how: Embedding,
) -> Row {
    Row {
        block,
        name,
        rfc,
        source,
        reachable,
        treatment: Treatment::Embedded(how),
        note: "judged by the IPv4 address inside",
    }
}

use Reachable::{No, NotApplicable as Na};
use Source::{Ipv4AddressSpace as V4Space, Ipv4SpecialPurpose as V4, Ipv6AddressSpace as V6Space};
use Source::{Ipv6SpecialPurpose as V6, Rfc};

const INFRA: &str = "globally reachable per IANA, blocked: anycast protocol infrastructure, no API lives there, \
                     and the nearest instance may sit inside the operator's network";
const IDENTIFIERS: &str = "globally reachable per IANA, blocked: identifiers of an overlay protocol, not hosts \
                           an agent talks to";
const TERMINATED: &str = "terminated row (no globally-reachable flag): blocked";

/// The IANA IPv4 Special-Purpose Address Registry, in the registry's order, then IPv4 multicast.
#[rustfmt::skip]
pub const IPV4: &[Row] = &[
    row(v4(0, 0, 0, 0, 8), "\"This network\"", "RFC 791, Section 3.2", V4, No),
    row(v4(0, 0, 0, 0, 32), "\"This host on this network\"", "RFC 1122, Section 3.2.1.3", V4, No),
    row(v4(10, 0, 0, 0, 8), "Private-Use", "RFC 1918", V4, No),
    row(v4(100, 64, 0, 0, 10), "Shared Address Space", "RFC 6598", V4, No),
    row(v4(127, 0, 0, 0, 8), "Loopback", "RFC 1122, Section 3.2.1.3", V4, No),
    row(v4(169, 254, 0, 0, 16), "Link Local", "RFC 3927", V4, No),
    row(v4(172, 16, 0, 0, 12), "Private-Use", "RFC 1918", V4, No),
    row(v4(192, 0, 0, 0, 24), "IETF Protocol Assignments", "RFC 6890, Section 2.1", V4, No),
    row(v4(192, 0, 0, 0, 29), "IPv4 Service Continuity Prefix", "RFC 7335", V4, No),
    row(v4(192, 0, 0, 8, 32), "IPv4 dummy address", "RFC 7600", V4, No),
    anycast(v4(192, 0, 0, 9, 32), "Port Control Protocol Anycast", "RFC 7723", V4, INFRA),
    anycast(v4(192, 0, 0, 10, 32), "Traversal Using Relays around NAT Anycast", "RFC 8155", V4, INFRA),
    // One registry row holds both /32s.
    row(v4(192, 0, 0, 170, 32), "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 Section 2.2", V4, No),
    row(v4(192, 0, 0, 171, 32), "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 Section 2.2", V4, No),
    row(v4(192, 0, 2, 0, 24), "Documentation (TEST-NET-1)", "RFC 5737", V4, No),
    anycast(v4(192, 31, 196, 0, 24), "AS112-v4", "RFC 7535", V4, INFRA),
    anycast(v4(192, 52, 193, 0, 24), "AMT", "RFC 7450", V4, INFRA),
    Row { note: TERMINATED, ..row(v4(192, 88, 99, 0, 24), "Deprecated (6to4 Relay Anycast)", "RFC 7526", V4, Na) },
    row(v4(192, 88, 99, 2, 32), "6a44-relay anycast address", "RFC 6751", V4, No),
    row(v4(192, 168, 0, 0, 16), "Private-Use", "RFC 1918", V4, No),
    anycast(v4(192, 175, 48, 0, 24), "Direct Delegation AS112 Service", "RFC 7534", V4, INFRA),
    row(v4(198, 18, 0, 0, 15), "Benchmarking", "RFC 2544", V4, No),
    row(v4(198, 51, 100, 0, 24), "Documentation (TEST-NET-2)", "RFC 5737", V4, No),
    row(v4(203, 0, 113, 0, 24), "Documentation (TEST-NET-3)", "RFC 5737", V4, No),
    row(v4(240, 0, 0, 0, 4), "Reserved", "RFC 1112, Section 4", V4, No),
    row(v4(255, 255, 255, 255, 32), "Limited Broadcast", "RFC 8190, RFC 919 Section 7", V4, No),
    // Not in the special-purpose registry: multicast is its own block of the address space registry.
    Row { note: "multicast, not a unicast destination", ..row(v4(224, 0, 0, 0, 4), "Multicast", "RFC 5771", V4Space, Na) },
];

/// The IANA IPv6 Special-Purpose Address Registry, in the registry's order, then the IPv4-compatible form,
/// then the blocks of the IPv6 Address Space registry outside Global Unicast `2000::/3` (`fc00::/7` and
/// `fe80::/10` are special-purpose rows already).
#[rustfmt::skip]
pub const IPV6: &[Row] = &[
    row(v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "Loopback Address", "RFC 4291", V6, No),
    row(v6([0, 0, 0, 0, 0, 0, 0, 0], 128), "Unspecified Address", "RFC 4291", V6, No),
    embedded(v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96), "IPv4-mapped Address", "RFC 4291", V6, No, Embedding::Mapped),
    embedded(v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96), "IPv4-IPv6 Translat.", "RFC 6052", V6, Reachable::Yes, Embedding::Nat64),
    embedded(v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), "IPv4-IPv6 Translat.", "RFC 8215", V6, No, Embedding::Nat64LocalUse),
    row(v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), "Discard-Only Address Block", "RFC 6666", V6, No),
    row(v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64), "Dummy IPv6 Prefix", "RFC 9780", V6, No),
    row(v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), "IETF Protocol Assignments", "RFC 2928", V6, No),
    embedded(v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32), "TEREDO", "RFC 4380, RFC 8190", V6, Na, Embedding::Teredo),
    anycast(v6([0x2001, 1, 0, 0, 0, 0, 0, 1], 128), "Port Control Protocol Anycast", "RFC 7723", V6, INFRA),
    anycast(v6([0x2001, 1, 0, 0, 0, 0, 0, 2], 128), "Traversal Using Relays around NAT Anycast", "RFC 8155", V6, INFRA),
    anycast(v6([0x2001, 1, 0, 0, 0, 0, 0, 3], 128), "DNS-SD Service Registration Protocol Anycast Address", "RFC 9665", V6, INFRA),
    row(v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48), "Benchmarking", "RFC 5180, RFC Errata 1752", V6, No),
    anycast(v6([0x2001, 3, 0, 0, 0, 0, 0, 0], 32), "AMT", "RFC 7450", V6, INFRA),
    anycast(v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48), "AS112-v6", "RFC 7535", V6, INFRA),
    Row { note: TERMINATED, ..row(v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0], 28), "Deprecated (previously ORCHID)", "RFC 4843", V6, Na) },
    anycast(v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28), "ORCHIDv2", "RFC 7343", V6, IDENTIFIERS),
    anycast(v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28), "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374", V6, IDENTIFIERS),
    row(v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), "Documentation", "RFC 3849", V6, No),
    embedded(v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16), "6to4", "RFC 3056", V6, Na, Embedding::SixToFour),
    anycast(v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48), "Direct Delegation AS112 Service", "RFC 7534", V6, INFRA),
    row(v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), "Documentation", "RFC 9637", V6, No),
    row(v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16), "Segment Routing (SRv6) SIDs", "RFC 9602", V6, No),
    row(v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), "Unique-Local", "RFC 4193, RFC 8190", V6, No),
    row(v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "Link-Local Unicast", "RFC 4291", V6, No),
    // Not a registry row: deprecated, but a dual-stack socket may still turn it into the IPv4 inside.
    embedded(v6([0, 0, 0, 0, 0, 0, 0, 0], 96), "IPv4-Compatible IPv6 Address (deprecated)", "RFC 4291, Section 2.5.5.1", Rfc, Na, Embedding::Compatible),
    // The IPv6 Address Space registry: everything but Global Unicast 2000::/3 is reserved, multicast,
    // unique-local or link-scoped; none of it is a public destination.
    row(v6([0, 0, 0, 0, 0, 0, 0, 0], 8), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0x100, 0, 0, 0, 0, 0, 0, 0], 8), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0x200, 0, 0, 0, 0, 0, 0, 0], 7), "Reserved by IETF", "RFC 4048", V6Space, Na),
    row(v6([0x400, 0, 0, 0, 0, 0, 0, 0], 6), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0x800, 0, 0, 0, 0, 0, 0, 0], 5), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0x1000, 0, 0, 0, 0, 0, 0, 0], 4), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0x4000, 0, 0, 0, 0, 0, 0, 0], 3), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0x6000, 0, 0, 0, 0, 0, 0, 0], 3), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0x8000, 0, 0, 0, 0, 0, 0, 0], 3), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0xa000, 0, 0, 0, 0, 0, 0, 0], 3), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0xc000, 0, 0, 0, 0, 0, 0, 0], 3), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0xe000, 0, 0, 0, 0, 0, 0, 0], 4), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0xf000, 0, 0, 0, 0, 0, 0, 0], 5), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0xf800, 0, 0, 0, 0, 0, 0, 0], 6), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0xfe00, 0, 0, 0, 0, 0, 0, 0], 9), "Reserved by IETF", "RFC 4291", V6Space, Na),
    row(v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), "Reserved by IETF (formerly Site-Local)", "RFC 3879", V6Space, Na),
    row(v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "Multicast", "RFC 4291", V6Space, Na),
];

/// The most specific row containing `addr`, if any (rows of the address's family only).
#[must_use]
pub fn lookup(addr: IpAddr) -> Option<&'static Row> {
    let rows = match addr {
        IpAddr::V4(_) => IPV4,
        IpAddr::V6(_) => IPV6,
    };
    rows.iter()
        .filter(|r| r.block.contains(&addr))
        // `max_by_key` keeps the last of equal keys; the tables hold no block twice (a test checks).
        .max_by_key(|r| r.block.prefix_len())
}

/// Every row whose block overlaps `net` (for judging a whole range, such as a reverse DNS zone).
pub fn overlapping(net: IpNet) -> impl Iterator<Item = &'static Row> {
    let rows = match net {
        IpNet::V4(_) => IPV4,
        IpNet::V6(_) => IPV6,
    };
    rows.iter()
        .filter(move |r| r.block.contains(&net.network()) || net.contains(&r.block.network()))
}
