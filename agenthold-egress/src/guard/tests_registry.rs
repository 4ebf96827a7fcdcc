//! One test per registry row (E22): each cites its row, checks the table holds it as the registry says
//! (name, RFC, "Globally Reachable"), that the first, middle and last addresses are refused by that row (or a
//! more specific one), that public neighbours just outside stay allowed, and for the IPv4-embedding rows
//! that the IPv4 inside decides. `every_row_has_a_test` keeps the table and this file in step.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::registry::{Embedding, IPV4, IPV6, Reachable, Treatment, lookup};
use super::{BlockReason, Guard};

#[derive(Debug, Clone, Copy)]
enum Expect {
    Blocked,
    Embedded(Embedding),
}

/// First, middle and last address of a block.
fn samples(block: IpNet) -> Vec<IpAddr> {
    let (first, last) = (block.network(), block.broadcast());
    let middle = match (first, last) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            IpAddr::V4(Ipv4Addr::from_bits(a.to_bits() + (b.to_bits() - a.to_bits()) / 2))
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            IpAddr::V6(Ipv6Addr::from_bits(a.to_bits() + (b.to_bits() - a.to_bits()) / 2))
        }
        _ => unreachable!("one family"),
    };
    vec![first, middle, last]
}

/// The addresses just before and just after a block (where they exist).
fn neighbours(block: IpNet) -> Vec<IpAddr> {
    match (block.network(), block.broadcast()) {
        (IpAddr::V4(a), IpAddr::V4(b)) => [a.to_bits().checked_sub(1), b.to_bits().checked_add(1)]
            .into_iter()
            .flatten()
            .map(|n| IpAddr::V4(Ipv4Addr::from_bits(n)))
            .collect(),
        (IpAddr::V6(a), IpAddr::V6(b)) => [a.to_bits().checked_sub(1), b.to_bits().checked_add(1)]
            .into_iter()
            .flatten()
            .map(|n| IpAddr::V6(Ipv6Addr::from_bits(n)))
            .collect(),
        _ => unreachable!("one family"),
    }
}

/// `v4` written in the embedding form `how`.
fn embed(how: Embedding, v4: Ipv4Addr) -> Ipv6Addr {
    let n = u128::from(v4.to_bits());
    Ipv6Addr::from_bits(match how {
        Embedding::Mapped => 0xffff << 32 | n,
        Embedding::Compatible => n,
        Embedding::Nat64 => 0x64_ff9b << 96 | n,
        // A /96 NAT64 prefix cut from the local-use /48.
        Embedding::Nat64LocalUse => 0x0064_ff9b_0001_abcd << 64 | n,
        Embedding::SixToFour => 0x2002 << 112 | n << 80 | 1,
        // Teredo: the server is a public address; the client, inverted, is `v4`.
        Embedding::Teredo => 0x2001_0000 << 96 | u128::from(0x0808_0808u32) << 64 | u128::from(!v4.to_bits()),
    })
}

fn check_row(block: &str, name: &str, rfc: &str, reachable: Reachable, expect: Expect) {
    let block: IpNet = block.parse().unwrap();
    assert_eq!(block, block.trunc(), "{block}: write the network address");
    let table = if block.network().is_ipv4() { IPV4 } else { IPV6 };
    let row = table
        .iter()
        .find(|r| r.block == block)
        .unwrap_or_else(|| panic!("{block} is not in the table"));
    assert_eq!(
        (row.name, row.rfc, row.reachable),
        (name, rfc, reachable),
        "{block}"
    );
    let guard = Guard::new([]);
    match expect {
        Expect::Blocked => {
            assert_eq!(row.treatment, Treatment::Block, "{block}");
            if row.reachable == Reachable::Yes {
                assert!(
                    !row.note.is_empty(),
                    "{block}: a globally reachable row we block says why"
                );
            }
            let mut here = 0;
            for addr in samples(block) {
                let err = guard
                    .check(addr)
                    .expect_err(&format!("{addr} in {block} must be refused"));
                // A more specific row may take an address of a containing block (0.0.0.0 is
                // "This host on this network" inside "This network").
                if lookup(addr) == Some(row) {
                    assert_eq!(err.range, block, "{addr}");
                    assert_eq!(err.reason, BlockReason::Registry(row), "{addr}");
                    here += 1;
                }
            }
            assert!(here > 0, "{block}: no sample is judged by this row");
        }
        Expect::Embedded(how) => {
            assert_eq!(row.treatment, Treatment::Embedded(how), "{block}");
            for (v4, allowed) in [
                (Ipv4Addr::new(8, 8, 8, 8), true),
                (Ipv4Addr::new(1, 1, 1, 1), true),
                (Ipv4Addr::new(127, 0, 0, 1), false),
                (Ipv4Addr::new(10, 1, 2, 3), false),
                (Ipv4Addr::new(169, 254, 169, 254), false),
                (Ipv4Addr::new(192, 31, 196, 1), false),
                (Ipv4Addr::new(168, 63, 129, 16), false),
            ] {
                let addr = embed(how, v4);
                assert!(block.contains(&IpAddr::V6(addr)), "{addr} not in {block}");
                assert_eq!(lookup(IpAddr::V6(addr)), Some(row), "{addr}");
                let inner = how.extract(addr);
                let carried = inner.1.unwrap_or(inner.0);
                assert_eq!(carried, v4, "{addr}");
                assert_eq!(
                    guard.check(IpAddr::V6(addr)).is_ok(),
                    allowed,
                    "{addr} embeds {v4}"
                );
            }
        }
    }
    for n in neighbours(block) {
        if lookup(n).is_none() {
            assert!(guard.check(n).is_ok(), "{n}, just outside {block}, is public");
        }
    }
}

macro_rules! rows {
    ($($test:ident: $block:literal, $name:literal, $rfc:literal, $reach:ident, $expect:expr;)*) => {
        $(
            #[test]
            fn $test() {
                check_row($block, $name, $rfc, Reachable::$reach, $expect);
            }
        )*
    };
}

use Expect::{Blocked, Embedded};

rows! {
    // IANA IPv4 special-purpose registry: 0.0.0.0/8 "This network", RFC 791 §3.2
    v4_this_network: "0.0.0.0/8", "\"This network\"", "RFC 791, Section 3.2", No, Blocked;
    // IANA IPv4 special-purpose registry: 0.0.0.0/32 "This host on this network", RFC 1122 §3.2.1.3
    v4_this_host: "0.0.0.0/32", "\"This host on this network\"", "RFC 1122, Section 3.2.1.3", No, Blocked;
    // IANA IPv4 special-purpose registry: 10.0.0.0/8 Private-Use, RFC 1918
    v4_private_10: "10.0.0.0/8", "Private-Use", "RFC 1918", No, Blocked;
    // IANA IPv4 special-purpose registry: 100.64.0.0/10 Shared Address Space (CGNAT), RFC 6598
    v4_shared_address_space: "100.64.0.0/10", "Shared Address Space", "RFC 6598", No, Blocked;
    // IANA IPv4 special-purpose registry: 127.0.0.0/8 Loopback, RFC 1122 §3.2.1.3
    v4_loopback: "127.0.0.0/8", "Loopback", "RFC 1122, Section 3.2.1.3", No, Blocked;
    // IANA IPv4 special-purpose registry: 169.254.0.0/16 Link Local (cloud metadata), RFC 3927
    v4_link_local: "169.254.0.0/16", "Link Local", "RFC 3927", No, Blocked;
    // IANA IPv4 special-purpose registry: 172.16.0.0/12 Private-Use, RFC 1918
    v4_private_172: "172.16.0.0/12", "Private-Use", "RFC 1918", No, Blocked;
    // IANA IPv4 special-purpose registry: 192.0.0.0/24 IETF Protocol Assignments, RFC 6890 §2.1
    v4_ietf_protocol_assignments: "192.0.0.0/24", "IETF Protocol Assignments", "RFC 6890, Section 2.1", No, Blocked;
    // IANA IPv4 special-purpose registry: 192.0.0.0/29 IPv4 Service Continuity Prefix, RFC 7335
    v4_service_continuity: "192.0.0.0/29", "IPv4 Service Continuity Prefix", "RFC 7335", No, Blocked;
    // IANA IPv4 special-purpose registry: 192.0.0.8/32 IPv4 dummy address, RFC 7600
    v4_dummy: "192.0.0.8/32", "IPv4 dummy address", "RFC 7600", No, Blocked;
    // IANA IPv4 special-purpose registry: 192.0.0.9/32 Port Control Protocol Anycast, RFC 7723 (globally reachable)
    v4_pcp_anycast: "192.0.0.9/32", "Port Control Protocol Anycast", "RFC 7723", Yes, Blocked;
    // IANA IPv4 special-purpose registry: 192.0.0.10/32 Traversal Using Relays around NAT Anycast, RFC 8155 (globally reachable)
    v4_turn_anycast: "192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "RFC 8155", Yes, Blocked;
    // IANA IPv4 special-purpose registry: 192.0.0.170/32 NAT64/DNS64 Discovery, RFC 8880, RFC 7050 §2.2
    v4_nat64_discovery_170: "192.0.0.170/32", "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 Section 2.2", No, Blocked;
    // IANA IPv4 special-purpose registry: 192.0.0.171/32 NAT64/DNS64 Discovery (same row), RFC 8880, RFC 7050 §2.2
    v4_nat64_discovery_171: "192.0.0.171/32", "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 Section 2.2", No, Blocked;
    // IANA IPv4 special-purpose registry: 192.0.2.0/24 Documentation (TEST-NET-1), RFC 5737
    v4_test_net_1: "192.0.2.0/24", "Documentation (TEST-NET-1)", "RFC 5737", No, Blocked;
    // IANA IPv4 special-purpose registry: 192.31.196.0/24 AS112-v4, RFC 7535 (globally reachable)
    v4_as112: "192.31.196.0/24", "AS112-v4", "RFC 7535", Yes, Blocked;
    // IANA IPv4 special-purpose registry: 192.52.193.0/24 AMT, RFC 7450 (globally reachable)
    v4_amt: "192.52.193.0/24", "AMT", "RFC 7450", Yes, Blocked;
    // IANA IPv4 special-purpose registry: 192.88.99.0/24 Deprecated (6to4 Relay Anycast), RFC 7526 (terminated)
    v4_6to4_relay_anycast: "192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", "RFC 7526", NotApplicable, Blocked;
    // IANA IPv4 special-purpose registry: 192.88.99.2/32 6a44-relay anycast address, RFC 6751
    v4_6a44_relay_anycast: "192.88.99.2/32", "6a44-relay anycast address", "RFC 6751", No, Blocked;
    // IANA IPv4 special-purpose registry: 192.168.0.0/16 Private-Use, RFC 1918
    v4_private_192_168: "192.168.0.0/16", "Private-Use", "RFC 1918", No, Blocked;
    // IANA IPv4 special-purpose registry: 192.175.48.0/24 Direct Delegation AS112 Service, RFC 7534 (globally reachable)
    v4_as112_direct_delegation: "192.175.48.0/24", "Direct Delegation AS112 Service", "RFC 7534", Yes, Blocked;
    // IANA IPv4 special-purpose registry: 198.18.0.0/15 Benchmarking, RFC 2544
    v4_benchmarking: "198.18.0.0/15", "Benchmarking", "RFC 2544", No, Blocked;
    // IANA IPv4 special-purpose registry: 198.51.100.0/24 Documentation (TEST-NET-2), RFC 5737
    v4_test_net_2: "198.51.100.0/24", "Documentation (TEST-NET-2)", "RFC 5737", No, Blocked;
    // IANA IPv4 special-purpose registry: 203.0.113.0/24 Documentation (TEST-NET-3), RFC 5737
    v4_test_net_3: "203.0.113.0/24", "Documentation (TEST-NET-3)", "RFC 5737", No, Blocked;
    // IANA IPv4 special-purpose registry: 240.0.0.0/4 Reserved, RFC 1112 §4
    v4_reserved: "240.0.0.0/4", "Reserved", "RFC 1112, Section 4", No, Blocked;
    // IANA IPv4 special-purpose registry: 255.255.255.255/32 Limited Broadcast, RFC 8190, RFC 919 §7
    v4_limited_broadcast: "255.255.255.255/32", "Limited Broadcast", "RFC 8190, RFC 919 Section 7", No, Blocked;
    // IANA IPv4 address space registry: 224.0.0.0/4 Multicast, RFC 5771
    v4_multicast: "224.0.0.0/4", "Multicast", "RFC 5771", NotApplicable, Blocked;

    // IANA IPv6 special-purpose registry: ::1/128 Loopback Address, RFC 4291
    v6_loopback: "::1/128", "Loopback Address", "RFC 4291", No, Blocked;
    // IANA IPv6 special-purpose registry: ::/128 Unspecified Address, RFC 4291
    v6_unspecified: "::/128", "Unspecified Address", "RFC 4291", No, Blocked;
    // IANA IPv6 special-purpose registry: ::ffff:0:0/96 IPv4-mapped Address, RFC 4291
    v6_ipv4_mapped: "::ffff:0.0.0.0/96", "IPv4-mapped Address", "RFC 4291", No, Embedded(Embedding::Mapped);
    // IANA IPv6 special-purpose registry: 64:ff9b::/96 IPv4-IPv6 Translat., RFC 6052 (globally reachable)
    v6_nat64_well_known: "64:ff9b::/96", "IPv4-IPv6 Translat.", "RFC 6052", Yes, Embedded(Embedding::Nat64);
    // IANA IPv6 special-purpose registry: 64:ff9b:1::/48 IPv4-IPv6 Translat. (local use), RFC 8215
    v6_nat64_local_use: "64:ff9b:1::/48", "IPv4-IPv6 Translat.", "RFC 8215", No, Embedded(Embedding::Nat64LocalUse);
    // IANA IPv6 special-purpose registry: 100::/64 Discard-Only Address Block, RFC 6666
    v6_discard_only: "100::/64", "Discard-Only Address Block", "RFC 6666", No, Blocked;
    // IANA IPv6 special-purpose registry: 100:0:0:1::/64 Dummy IPv6 Prefix, RFC 9780
    v6_dummy_prefix: "100:0:0:1::/64", "Dummy IPv6 Prefix", "RFC 9780", No, Blocked;
    // IANA IPv6 special-purpose registry: 2001::/23 IETF Protocol Assignments, RFC 2928
    v6_ietf_protocol_assignments: "2001::/23", "IETF Protocol Assignments", "RFC 2928", No, Blocked;
    // IANA IPv6 special-purpose registry: 2001::/32 TEREDO, RFC 4380, RFC 8190
    v6_teredo: "2001::/32", "TEREDO", "RFC 4380, RFC 8190", NotApplicable, Embedded(Embedding::Teredo);
    // IANA IPv6 special-purpose registry: 2001:1::1/128 Port Control Protocol Anycast, RFC 7723 (globally reachable)
    v6_pcp_anycast: "2001:1::1/128", "Port Control Protocol Anycast", "RFC 7723", Yes, Blocked;
    // IANA IPv6 special-purpose registry: 2001:1::2/128 Traversal Using Relays around NAT Anycast, RFC 8155 (globally reachable)
    v6_turn_anycast: "2001:1::2/128", "Traversal Using Relays around NAT Anycast", "RFC 8155", Yes, Blocked;
    // IANA IPv6 special-purpose registry: 2001:1::3/128 DNS-SD Service Registration Protocol Anycast Address, RFC 9665 (globally reachable)
    v6_dnssd_srp_anycast: "2001:1::3/128", "DNS-SD Service Registration Protocol Anycast Address", "RFC 9665", Yes, Blocked;
    // IANA IPv6 special-purpose registry: 2001:2::/48 Benchmarking, RFC 5180, RFC Errata 1752
    v6_benchmarking: "2001:2::/48", "Benchmarking", "RFC 5180, RFC Errata 1752", No, Blocked;
    // IANA IPv6 special-purpose registry: 2001:3::/32 AMT, RFC 7450 (globally reachable)
    v6_amt: "2001:3::/32", "AMT", "RFC 7450", Yes, Blocked;
    // IANA IPv6 special-purpose registry: 2001:4:112::/48 AS112-v6, RFC 7535 (globally reachable)
    v6_as112: "2001:4:112::/48", "AS112-v6", "RFC 7535", Yes, Blocked;
    // IANA IPv6 special-purpose registry: 2001:10::/28 Deprecated (previously ORCHID), RFC 4843 (terminated)
    v6_orchid_deprecated: "2001:10::/28", "Deprecated (previously ORCHID)", "RFC 4843", NotApplicable, Blocked;
    // IANA IPv6 special-purpose registry: 2001:20::/28 ORCHIDv2, RFC 7343 (globally reachable)
    v6_orchid_v2: "2001:20::/28", "ORCHIDv2", "RFC 7343", Yes, Blocked;
    // IANA IPv6 special-purpose registry: 2001:30::/28 Drone Remote ID Protocol Entity Tags (DETs) Prefix, RFC 9374 (globally reachable)
    v6_drone_remote_id_dets: "2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374", Yes, Blocked;
    // IANA IPv6 special-purpose registry: 2001:db8::/32 Documentation, RFC 3849
    v6_documentation: "2001:db8::/32", "Documentation", "RFC 3849", No, Blocked;
    // IANA IPv6 special-purpose registry: 2002::/16 6to4, RFC 3056
    v6_6to4: "2002::/16", "6to4", "RFC 3056", NotApplicable, Embedded(Embedding::SixToFour);
    // IANA IPv6 special-purpose registry: 2620:4f:8000::/48 Direct Delegation AS112 Service, RFC 7534 (globally reachable)
    v6_as112_direct_delegation: "2620:4f:8000::/48", "Direct Delegation AS112 Service", "RFC 7534", Yes, Blocked;
    // IANA IPv6 special-purpose registry: 3fff::/20 Documentation, RFC 9637
    v6_documentation_3fff: "3fff::/20", "Documentation", "RFC 9637", No, Blocked;
    // IANA IPv6 special-purpose registry: 5f00::/16 Segment Routing (SRv6) SIDs, RFC 9602
    v6_srv6_sids: "5f00::/16", "Segment Routing (SRv6) SIDs", "RFC 9602", No, Blocked;
    // IANA IPv6 special-purpose registry: fc00::/7 Unique-Local, RFC 4193, RFC 8190
    v6_unique_local: "fc00::/7", "Unique-Local", "RFC 4193, RFC 8190", No, Blocked;
    // IANA IPv6 special-purpose registry: fe80::/10 Link-Local Unicast, RFC 4291
    v6_link_local: "fe80::/10", "Link-Local Unicast", "RFC 4291", No, Blocked;
    // RFC 4291 §2.5.5.1: ::/96 IPv4-Compatible IPv6 Address (deprecated; not an IANA row)
    v6_ipv4_compatible: "::/96", "IPv4-Compatible IPv6 Address (deprecated)", "RFC 4291, Section 2.5.5.1", NotApplicable, Embedded(Embedding::Compatible);

    // IANA IPv6 address space registry: ::/8 Reserved by IETF, RFC 4291
    v6_space_0000: "::/8", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: 100::/8 Reserved by IETF, RFC 4291
    v6_space_0100: "100::/8", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: 200::/7 Reserved by IETF (formerly NSAP), RFC 4048
    v6_space_0200: "200::/7", "Reserved by IETF", "RFC 4048", NotApplicable, Blocked;
    // IANA IPv6 address space registry: 400::/6 Reserved by IETF, RFC 4291
    v6_space_0400: "400::/6", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: 800::/5 Reserved by IETF, RFC 4291
    v6_space_0800: "800::/5", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: 1000::/4 Reserved by IETF, RFC 4291
    v6_space_1000: "1000::/4", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: 4000::/3 Reserved by IETF, RFC 4291
    v6_space_4000: "4000::/3", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: 6000::/3 Reserved by IETF, RFC 4291
    v6_space_6000: "6000::/3", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: 8000::/3 Reserved by IETF, RFC 4291
    v6_space_8000: "8000::/3", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: a000::/3 Reserved by IETF, RFC 4291
    v6_space_a000: "a000::/3", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: c000::/3 Reserved by IETF, RFC 4291
    v6_space_c000: "c000::/3", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: e000::/4 Reserved by IETF, RFC 4291
    v6_space_e000: "e000::/4", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: f000::/5 Reserved by IETF, RFC 4291
    v6_space_f000: "f000::/5", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: f800::/6 Reserved by IETF, RFC 4291
    v6_space_f800: "f800::/6", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: fe00::/9 Reserved by IETF, RFC 4291
    v6_space_fe00: "fe00::/9", "Reserved by IETF", "RFC 4291", NotApplicable, Blocked;
    // IANA IPv6 address space registry: fec0::/10 Reserved by IETF (formerly Site-Local), RFC 3879
    v6_space_fec0: "fec0::/10", "Reserved by IETF (formerly Site-Local)", "RFC 3879", NotApplicable, Blocked;
    // IANA IPv6 address space registry: ff00::/8 Multicast, RFC 4291
    v6_space_multicast: "ff00::/8", "Multicast", "RFC 4291", NotApplicable, Blocked;
}

/// This file names every row of both tables, and no block appears twice in a table.
#[test]
fn every_row_has_a_test() {
    let source = include_str!("tests_registry.rs");
    for table in [IPV4, IPV6] {
        let mut seen = std::collections::HashSet::new();
        for row in table {
            assert!(seen.insert(row.block), "{} appears twice", row.block);
            let quoted = format!(": \"{}\",", row.block);
            assert_eq!(
                source.matches(&quoted).count(),
                1,
                "{} ({}) needs exactly one row test",
                row.block,
                row.name
            );
        }
    }
}

/// Outside every row: public unicast space, in both families.
#[test]
fn global_unicast_between_the_rows_is_allowed() {
    let guard = Guard::new([]);
    for public in [
        "1.0.0.0",
        "8.8.8.8",
        "140.82.112.3",
        "192.0.1.255",
        "192.0.3.0",
        "223.255.255.255",
        "2606:4700::1111",
        "2a00:1450:4001::200e",
        "2001:4860:4860::8888",
        "2001:200::1",
        "2620:4f:7fff:ffff:ffff:ffff:ffff:ffff",
        "3ffe::1",
    ] {
        let addr: IpAddr = public.parse().unwrap();
        assert_eq!(lookup(addr), None, "{public}");
        assert!(guard.check(addr).is_ok(), "{public}");
    }
}

/// The examples: inside 2001::/23 but outside its more specific rows.
#[test]
fn ietf_protocol_assignments_between_its_rows_are_refused() {
    let guard = Guard::new([]);
    for s in [
        "2001:4::",
        "2001:4::1",
        "2001:40::",
        "2001:40::1",
        "2001:1::4",
        "2001:5::1",
        "2001:1ff:ffff::1",
    ] {
        let err = guard.check(s.parse().unwrap()).unwrap_err();
        assert_eq!(err.range.to_string(), "2001::/23", "{s}");
    }
}
