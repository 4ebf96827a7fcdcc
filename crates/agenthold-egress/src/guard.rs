//! The address guard (E6): the one function that decides whether an upstream address may ever be dialled.
//!
//! It runs on every address the gateway is about to dial, after the policy said yes, so no policy entry can
//! re-open a blocked range. Blocked: every IPv4 range that is private, loopback, link-local (cloud metadata
//! at 169.254.169.254 included), CGNAT, multicast, reserved or documentation; for IPv6 everything outside
//! global unicast (2000::/3) plus the special ranges inside it. IPv6 forms that embed an IPv4 address
//! (mapped, compatible, NAT64, 6to4, Teredo) are judged by the IPv4 address inside.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is refused: the blocked range it falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Blocked {
    /// The range in CIDR notation (`169.254.0.0/16`), or a short description.
    pub range: &'static str,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "address in blocked range {}", self.range)
    }
}

/// IPv4 ranges never dialled: (network, prefix length, name).
const V4_BLOCKED: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8, "0.0.0.0/8"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "10.0.0.0/8"),
    (Ipv4Addr::new(100, 64, 0, 0), 10, "100.64.0.0/10"),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "127.0.0.0/8"),
    (Ipv4Addr::new(169, 254, 0, 0), 16, "169.254.0.0/16"),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "172.16.0.0/12"),
    (Ipv4Addr::new(192, 0, 0, 0), 24, "192.0.0.0/24"),
    (Ipv4Addr::new(192, 0, 2, 0), 24, "192.0.2.0/24"),
    (Ipv4Addr::new(192, 88, 99, 0), 24, "192.88.99.0/24"),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "192.168.0.0/16"),
    (Ipv4Addr::new(198, 18, 0, 0), 15, "198.18.0.0/15"),
    (Ipv4Addr::new(198, 51, 100, 0), 24, "198.51.100.0/24"),
    (Ipv4Addr::new(203, 0, 113, 0), 24, "203.0.113.0/24"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "224.0.0.0/4"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "240.0.0.0/4"),
    (Ipv4Addr::new(255, 255, 255, 255), 32, "255.255.255.255/32"),
];

/// IPv6 ranges never dialled that are not IPv4-embedding forms: (network, prefix length, name). Everything
/// outside 2000::/3 is blocked as well; the ranges below 2000::/3 are listed to name them in logs.
const V6_BLOCKED: &[(Ipv6Addr, u8, &str)] = &[
    (Ipv6Addr::UNSPECIFIED, 128, "::/128"),
    (Ipv6Addr::LOCALHOST, 128, "::1/128"),
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10, "fe80::/10"),
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7, "fc00::/7"),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, "ff00::/8"),
    (Ipv6Addr::new(0x0100, 0, 0, 0, 0, 0, 0, 0), 64, "100::/64"),
    (
        Ipv6Addr::new(0x2001, 0x0db8, 0, 0, 0, 0, 0, 0),
        32,
        "2001:db8::/32",
    ),
    (Ipv6Addr::new(0x2001, 0x0002, 0, 0, 0, 0, 0, 0), 48, "2001:2::/48"),
    (
        Ipv6Addr::new(0x2001, 0x0010, 0, 0, 0, 0, 0, 0),
        28,
        "2001:10::/28",
    ),
    (
        Ipv6Addr::new(0x2001, 0x0020, 0, 0, 0, 0, 0, 0),
        28,
        "2001:20::/28",
    ),
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20, "3fff::/20"),
    (Ipv6Addr::new(0x5f00, 0, 0, 0, 0, 0, 0, 0), 16, "5f00::/16"),
];

fn v4_in(addr: Ipv4Addr, net: Ipv4Addr, len: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    u32::from(addr) & mask == u32::from(net) & mask
}

fn v6_in(addr: Ipv6Addr, net: Ipv6Addr, len: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    u128::from(addr) & mask == u128::from(net) & mask
}

/// Check an IPv4 address.
///
/// # Errors
/// [`Blocked`] naming the range the address falls in.
pub fn check_v4(addr: Ipv4Addr) -> Result<(), Blocked> {
    match V4_BLOCKED.iter().find(|(net, len, _)| v4_in(addr, *net, *len)) {
        Some((_, _, range)) => Err(Blocked { range }),
        None => Ok(()),
    }
}

/// The IPv4 addresses an IPv6 address embeds, if it is one of the embedding forms.
fn embedded_v4(addr: Ipv6Addr) -> Option<(Ipv4Addr, Option<Ipv4Addr>)> {
    let bits = u128::from(addr);
    // Truncation is the point: each slice below is exactly 32 bits of the address.
    #[allow(clippy::cast_possible_truncation)]
    let v4_at = |shift: u32| Ipv4Addr::from((bits >> shift) as u32);
    let is = |net: Ipv6Addr, len: u8| v6_in(addr, net, len);
    if is(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96) // IPv4-mapped ::ffff:a.b.c.d
        || is(Ipv6Addr::UNSPECIFIED, 96) // IPv4-compatible ::a.b.c.d (deprecated)
        || is(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96) // NAT64 well-known prefix
        || is(Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48)
    // NAT64 local-use prefix
    {
        return Some((v4_at(0), None));
    }
    if is(Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16) {
        // 6to4: 2002:AABB:CCDD::/48 carries a.b.c.d in bits 16..48.
        return Some((v4_at(80), None));
    }
    if is(Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32) {
        // Teredo: the server's address in bits 32..64, the client's (inverted) in the last 32 bits.
        return Some((v4_at(64), Some(Ipv4Addr::from(!v4_at(0).to_bits()))));
    }
    None
}

/// Check an IPv6 address.
///
/// # Errors
/// [`Blocked`] naming the range the address (or the IPv4 address it embeds) falls in.
pub fn check_v6(addr: Ipv6Addr) -> Result<(), Blocked> {
    if let Some((_, _, range)) = V6_BLOCKED.iter().find(|(net, len, _)| v6_in(addr, *net, *len)) {
        return Err(Blocked { range });
    }
    if let Some((first, second)) = embedded_v4(addr) {
        check_v4(first)?;
        if let Some(second) = second {
            check_v4(second)?;
        }
        return Ok(());
    }
    if !v6_in(addr, Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3) {
        return Err(Blocked {
            range: "outside global unicast 2000::/3",
        });
    }
    Ok(())
}

/// Whether `addr` may ever be dialled.
///
/// # Errors
/// [`Blocked`] naming the range.
pub fn check(addr: IpAddr) -> Result<(), Blocked> {
    match addr {
        IpAddr::V4(v4) => check_v4(v4),
        IpAddr::V6(v6) => check_v6(v6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(s: &str) -> bool {
        check(s.parse().unwrap()).is_err()
    }

    // covers: E6
    #[test]
    fn every_ipv4_range_and_its_edges() {
        for (net, len, _) in V4_BLOCKED {
            let first = u32::from(*net);
            let last = first | u32::MAX.checked_shr(u32::from(*len)).unwrap_or(0);
            assert!(check_v4(Ipv4Addr::from(first)).is_err(), "{net}/{len} first");
            assert!(check_v4(Ipv4Addr::from(last)).is_err(), "{net}/{len} last");
        }
        // Just outside each edge, where that neighbour is public.
        for public in [
            "1.0.0.0",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "191.255.255.255",
            "192.0.1.0",
            "192.0.3.0",
            "192.88.98.255",
            "192.88.100.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "198.51.99.255",
            "198.51.101.0",
            "203.0.112.255",
            "203.0.114.0",
            "223.255.255.255",
            "8.8.8.8",
            "140.82.112.3",
        ] {
            assert!(!blocked(public), "{public} should be allowed");
        }
        assert!(blocked("169.254.169.254"));
        assert!(blocked("255.255.255.255"));
    }

    // covers: E6
    #[test]
    fn every_ipv6_range() {
        for s in [
            "::",
            "::1",
            "fe80::1",
            "febf:ffff::1",
            "fc00::1",
            "fdff:ffff::1",
            "ff02::1",
            "ff00::",
            "2001:db8::1",
            "2001:db8:ffff::1",
            "100::1",
            "100::ffff:ffff:ffff:ffff",
            "2001:2::1",
            "2001:10::1",
            "3fff::1",
            "5f00::1",
            "fec0::1",
            "4000::1",
            "::2:3:4",
        ] {
            assert!(blocked(s), "{s} should be blocked");
        }
        for s in [
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "2001:4860:4860::8888",
            "100:0:0:1::1",
        ] {
            // 100:0:0:1::/64 is outside 100::/64 but also outside 2000::/3, hence blocked; the others are public.
            assert_eq!(blocked(s), s.starts_with("100:"), "{s}");
        }
    }

    // covers: E6
    #[test]
    fn embedded_ipv4_is_judged_by_the_ipv4_inside() {
        for (s, is_blocked) in [
            ("::ffff:127.0.0.1", true),
            ("::ffff:169.254.169.254", true),
            ("::ffff:10.1.2.3", true),
            ("::ffff:8.8.8.8", false),
            ("::127.0.0.1", true),
            ("::8.8.8.8", false),
            ("64:ff9b::7f00:1", true),
            ("64:ff9b::a9fe:a9fe", true),
            ("64:ff9b::808:808", false),
            ("64:ff9b:1::c0a8:101", true),
            ("64:ff9b:1::808:808", false),
            ("2002:7f00:1::", true),
            ("2002:a9fe:a9fe::1", true),
            ("2002:0808:0808::1", false),
            // Teredo: server 8.8.8.8, client 127.0.0.1 (inverted: 80ff:fffe).
            ("2001:0:808:808::80ff:fffe", true),
            // Teredo: server 10.0.0.1, client public.
            ("2001:0:a00:1::f7f7:f7f7", true),
            // Teredo: both public (client 8.8.8.8 inverted: f7f7:f7f7).
            ("2001:0:808:808::f7f7:f7f7", false),
        ] {
            assert_eq!(blocked(s), is_blocked, "{s}");
        }
    }

    #[test]
    fn names_the_range() {
        assert_eq!(
            check("169.254.169.254".parse().unwrap()).unwrap_err().range,
            "169.254.0.0/16"
        );
        assert_eq!(
            check("::ffff:10.0.0.1".parse().unwrap()).unwrap_err().range,
            "10.0.0.0/8"
        );
    }
}
