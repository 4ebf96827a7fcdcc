//! The guard beyond the registry rows: embedded IPv4 under every rule, provider endpoints, the deny list,
//! the host's own addresses, whole ranges, and how a refusal names itself.

use std::net::IpAddr;

use ipnet::IpNet;

use super::providers::{COVERED, PROVIDERS};
use super::{BlockReason, Guard, local};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// `a.b.c.d` in every IPv6 form that embeds it (mapped, compatible, NAT64, local-use NAT64, 6to4, Teredo
/// client and server).
fn forms(v4: &str) -> Vec<String> {
    let v4: std::net::Ipv4Addr = v4.parse().unwrap();
    let [a, b, c, d] = v4.octets();
    let hi = u16::from_be_bytes([a, b]);
    let lo = u16::from_be_bytes([c, d]);
    vec![
        v4.to_string(),
        format!("::ffff:{v4}"),
        format!("::{v4}"),
        format!("64:ff9b::{v4}"),
        format!("64:ff9b:1:abcd::{v4}"),
        format!("2002:{hi:x}:{lo:x}::1"),
        format!("2001:0:{hi:x}:{lo:x}::f7f7:f7f7"),
        format!("2001:0:808:808::{:x}:{:x}", !hi, !lo),
    ]
}

// covers: E6
#[test]
fn embedded_ipv4_is_judged_by_the_ipv4_inside() {
    let guard = Guard::new([]);
    for s in forms("8.8.8.8") {
        assert!(guard.check(ip(&s)).is_ok(), "{s}");
    }
    for private in [
        "127.0.0.1",
        "169.254.169.254",
        "10.1.2.3",
        "100.64.0.1",
        "192.175.48.1",
    ] {
        for s in forms(private) {
            let err = guard.check(ip(&s)).unwrap_err();
            assert!(err.range.contains(&ip(private)), "{s}: {err}");
        }
    }
    // IPv4-translated (SIIT, RFC 2765) is not an embedding the guard knows: reserved ::/8.
    assert!(guard.check(ip("::ffff:0:808:808")).is_err());
}

// covers: E22
#[test]
fn provider_endpoints_are_refused_in_every_form() {
    let guard = Guard::new([]);
    for p in PROVIDERS {
        let IpNet::V4(block) = p.block else { continue };
        for s in forms(&block.addr().to_string()) {
            let err = guard.check(ip(&s)).unwrap_err();
            assert_eq!(err.reason, BlockReason::Provider(p), "{s}");
            assert_eq!(err.range, p.block, "{s}");
        }
    }
    assert!(guard.check(ip("168.63.129.16")).is_err(), "Azure WireServer");
    assert!(guard.check(ip("168.63.129.15")).is_ok());
    assert!(guard.check(ip("168.63.129.17")).is_ok());
    // The endpoints the registry rows cover already, as the module says.
    for (addr, what) in COVERED {
        let err = guard.check(ip(addr)).unwrap_err();
        assert!(
            matches!(err.reason, BlockReason::Registry(_)),
            "{addr} ({what}): {err}"
        );
    }
}

// covers: E22
#[test]
fn the_deny_list_is_refused_in_every_form() {
    let guard = Guard::new([net("45.77.0.0/16"), net("2a0e:97c0:1::/48"), net("9.9.9.9/32")]);
    for s in forms("45.77.1.2").into_iter().chain(forms("9.9.9.9")) {
        let err = guard.check(ip(&s)).unwrap_err();
        assert_eq!(err.reason, BlockReason::DenyList, "{s}");
    }
    assert_eq!(
        guard.check(ip("45.77.1.2")).unwrap_err().range,
        net("45.77.0.0/16")
    );
    let err = guard.check(ip("2a0e:97c0:1:ffff::1")).unwrap_err();
    assert_eq!(
        (err.range, err.reason),
        (net("2a0e:97c0:1::/48"), BlockReason::DenyList)
    );
    for ok in ["45.76.255.255", "45.78.0.0", "9.9.9.8", "2a0e:97c0:2::1"] {
        assert!(guard.check(ip(ok)).is_ok(), "{ok}");
    }
    // Host bits are cleared, not refused, by the guard (the configuration refuses them earlier).
    let guard = Guard::new([net("45.77.1.2/16")]);
    assert_eq!(guard.deny_list(), [net("45.77.0.0/16")]);
}

// covers: E22
#[test]
fn own_addresses_are_refused_ipv4_exactly_and_ipv6_by_prefix() {
    let guard = Guard::with_own_addresses([], vec![net("45.76.0.10/32"), net("2a0e:1234:5678:9abc::/64")]);
    for s in forms("45.76.0.10") {
        let err = guard.check(ip(&s)).unwrap_err();
        assert_eq!(
            (err.range, err.reason),
            (net("45.76.0.10/32"), BlockReason::OwnAddress),
            "{s}"
        );
    }
    assert!(
        guard.check(ip("45.76.0.11")).is_ok(),
        "an IPv4 neighbour is a public host"
    );
    for s in [
        "2a0e:1234:5678:9abc::10",
        "2a0e:1234:5678:9abc::99",
        "2a0e:1234:5678:9abc:ffff:ffff:ffff:ffff",
    ] {
        let err = guard.check(ip(s)).unwrap_err();
        assert_eq!(err.reason, BlockReason::OwnAddress, "{s}");
    }
    assert!(guard.check(ip("2a0e:1234:5678:9abd::1")).is_ok());
}

// covers: E22
#[test]
fn the_namespace_addresses_are_read_with_getifaddrs() {
    // Every namespace has loopback; the test process's is no exception.
    let own = local::read().unwrap();
    assert!(own.contains(&net("127.0.0.1/32")), "{own:?}");
    assert!(own.iter().all(|n| *n == n.trunc()), "{own:?}");
    let guard = Guard::watching([]).unwrap();
    assert!(guard.own_addresses().contains(&net("127.0.0.1/32")));
    // Every IPv4 address of this host is refused, whatever range it is in.
    for n in guard.own_addresses() {
        assert!(guard.check(n.network()).is_err(), "{n}");
    }
}

#[test]
fn ranges_are_refused_when_any_part_is_blocked() {
    let guard = Guard::with_own_addresses([net("45.77.0.0/16")], vec![net("45.76.0.10/32")]);
    for blocked in [
        "10.0.0.0/8",
        "10.1.0.0/16",
        "192.0.0.0/8",
        "0.0.0.0/0",
        "168.63.0.0/16",
        "45.77.3.0/24",
        "45.0.0.0/8",
        "45.76.0.0/24",
        "2000::/4",
        "::/0",
        "::ffff:0:0/104",
        "fd00::/8",
    ] {
        assert!(guard.check_net(net(blocked)).is_err(), "{blocked}");
    }
    for fine in [
        "8.8.0.0/16",
        "8.0.0.0/8",
        "2606:4700::/32",
        "8.8.8.8/32",
        "::ffff:808:808/128",
    ] {
        assert!(guard.check_net(net(fine)).is_ok(), "{fine}");
    }
}

#[test]
fn a_refusal_names_its_range_and_reason() {
    let guard = Guard::new([net("45.77.0.0/16")]);
    let err = guard.check(ip("169.254.169.254")).unwrap_err();
    assert_eq!(err.range, net("169.254.0.0/16"));
    assert_eq!(
        err.to_string(),
        "address in blocked range 169.254.0.0/16 (Link Local, RFC 3927)"
    );
    assert_eq!(
        guard.check(ip("::ffff:10.0.0.1")).unwrap_err().range,
        net("10.0.0.0/8")
    );
    assert!(
        guard
            .check(ip("45.77.0.1"))
            .unwrap_err()
            .to_string()
            .contains("egress.deny_cidrs")
    );
    assert!(
        guard
            .check(ip("168.63.129.16"))
            .unwrap_err()
            .to_string()
            .contains("Azure")
    );
}
