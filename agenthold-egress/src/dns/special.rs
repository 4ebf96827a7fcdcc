//! Names the gateway never forwards, whatever the policy (the open one included): they only mean something
//! on a local network, so forwarding them could only leak them to the upstream resolver or, when that
//! resolver is an internal one (a VPC or corporate resolver), hand the sandbox internal names and addresses.
//!
//! - **Single-label names** (`intranet`, `wpad`, `printer`): never a public name; a resolver with a search
//!   list would complete them to internal names.
//! - **Local-only suffixes** ([`LOCAL_SUFFIXES`]): `localhost` (RFC 6761 §6.3), `local` (mDNS, RFC 6762),
//!   `internal` (reserved by ICANN for private use, 2024; GCP's `metadata.google.internal` and AWS's
//!   `*.ec2.internal` live there), `home.arpa` (RFC 8375), `invalid` (RFC 6761 §6.4), and the undelegated
//!   suffixes routers and enterprises use for their own networks: `lan`, `home`, `corp`, `localdomain`
//!   (ICANN's name-collision list keeps `home` and `corp` out of the root). `test` and `example` (RFC 6761)
//!   stay forwardable: they exist nowhere, so forwarding them leaks nothing internal, and test suites use them.
//! - **Reverse names of blocked ranges**: a name under `in-addr.arpa` or `ip6.arpa` whose address range
//!   overlaps any range the [`Guard`] blocks (private, loopback, the host's own addresses, the deny list, …),
//!   so `1.0.0.10.in-addr.arpa` and `10.in-addr.arpa` alike. Reverse names of public addresses are
//!   forwarded.
//!
//! Answer: NXDOMAIN, as RFC 6761 and RFC 6762 ask of resolvers for these names and as RFC 6303 has
//! resolvers answer for the private reverse zones; a client takes it as "no such name" at once, where
//! REFUSED would send it to its next nameserver or search domain.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::guard::{Blocked, Guard};

/// Suffixes (and names) that are only meaningful on a local network.
pub const LOCAL_SUFFIXES: &[&str] = &[
    "localhost",
    "local",
    "internal",
    "home.arpa",
    "invalid",
    "lan",
    "home",
    "corp",
    "localdomain",
];

/// Why a name is not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A name of one label.
    SingleLabel,
    /// A name under (or equal to) this local-only suffix.
    LocalSuffix(&'static str),
    /// A reverse name of a range the guard blocks.
    PrivateReverse(Blocked),
}

/// Whether `name` (normalised: lower case, no trailing dot) must not be forwarded.
pub(crate) fn refusal(name: &str, guard: &Guard) -> Option<Refusal> {
    if !name.contains('.') {
        return Some(Refusal::SingleLabel);
    }
    if let Some(suffix) = LOCAL_SUFFIXES.iter().find(|s| under(name, s)) {
        return Some(Refusal::LocalSuffix(suffix));
    }
    let range = reverse_range(name)?;
    guard.check_net(range).err().map(Refusal::PrivateReverse)
}

/// Whether `name` is `suffix` or a name under it.
fn under(name: &str, suffix: &str) -> bool {
    name.strip_suffix(suffix)
        .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
}

/// The address range a reverse name stands for: the labels next to `in-addr.arpa` (decimal octets) or
/// `ip6.arpa` (hex nibbles), as many as are well-formed, most significant first. Anything further left
/// (more labels, or a label that is not an octet or a nibble) is a name *under* that range, and so is
/// judged by it.
fn reverse_range(name: &str) -> Option<IpNet> {
    if let Some(rest) = strip_zone(name, "in-addr.arpa") {
        let mut bits = 0u32;
        let mut len = 0u8;
        for label in rest.rsplit('.').take(4) {
            // Decimal without leading zeros, as reverse names are written; else it ends the range.
            let Some(octet) = label.parse::<u8>().ok().filter(|o| o.to_string() == label) else {
                break;
            };
            bits |= u32::from(octet) << (24 - len);
            len += 8;
        }
        return Ipv4Net::new(Ipv4Addr::from_bits(bits), len).ok().map(IpNet::V4);
    }
    if let Some(rest) = strip_zone(name, "ip6.arpa") {
        let mut bits = 0u128;
        let mut len = 0u8;
        for label in rest.rsplit('.').take(32) {
            let Some(nibble) = (label.len() == 1)
                .then(|| u8::from_str_radix(label, 16).ok())
                .flatten()
            else {
                break;
            };
            bits |= u128::from(nibble) << (124 - u32::from(len));
            len += 4;
        }
        return Ipv6Net::new(Ipv6Addr::from_bits(bits), len).ok().map(IpNet::V6);
    }
    None
}

/// The labels left of `zone` (`""` for the zone itself), if `name` is `zone` or under it.
fn strip_zone<'a>(name: &'a str, zone: &str) -> Option<&'a str> {
    if name == zone {
        return Some("");
    }
    name.strip_suffix(zone)?.strip_suffix('.')
}

/// The address a full reverse name stands for (for tests and logs).
#[cfg(test)]
fn reverse_addr(name: &str) -> Option<std::net::IpAddr> {
    reverse_range(name)
        .filter(|n| n.prefix_len() == n.max_prefix_len())
        .map(|n| n.network())
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    /// The reverse name of `addr`.
    fn ptr(addr: &str) -> String {
        match addr.parse::<IpAddr>().unwrap() {
            IpAddr::V4(v4) => {
                let [a, b, c, d] = v4.octets();
                format!("{d}.{c}.{b}.{a}.in-addr.arpa")
            }
            IpAddr::V6(v6) => {
                let hex = format!("{:032x}", v6.to_bits());
                let nibbles: Vec<String> = hex.chars().rev().map(String::from).collect();
                format!("{}.ip6.arpa", nibbles.join("."))
            }
        }
    }

    fn refused(name: &str) -> Option<Refusal> {
        refusal(
            name,
            &Guard::with_own_addresses([], vec!["45.76.0.10/32".parse().unwrap()]),
        )
    }

    // covers: E9
    #[test]
    fn single_labels_and_local_suffixes_are_refused() {
        for name in ["intranet", "wpad", "localhost", "arpa", "com"] {
            assert_eq!(refused(name), Some(Refusal::SingleLabel), "{name}");
        }
        for (name, suffix) in [
            ("printer.local", "local"),
            ("metadata.google.internal", "internal"),
            ("ip-10-0-0-1.ec2.internal", "internal"),
            ("foo.localhost", "localhost"),
            ("nas.home.arpa", "home.arpa"),
            ("router.lan", "lan"),
            ("x.corp", "corp"),
            ("x.home", "home"),
            ("x.localdomain", "localdomain"),
            ("x.invalid", "invalid"),
        ] {
            assert_eq!(refused(name), Some(Refusal::LocalSuffix(suffix)), "{name}");
        }
        for name in [
            "github.com",
            "api.test",
            "x.example",
            "notlocal.com",
            "local.example.com",
            "internal.com",
            "lan.example",
            "8.8.8.8.in-addr.arpa.example",
        ] {
            assert_eq!(refused(name), None, "{name}");
        }
    }

    // covers: E9, E6
    #[test]
    fn reverse_names_of_blocked_ranges_are_refused() {
        for name in [
            "1.0.0.10.in-addr.arpa",
            "10.in-addr.arpa",
            "in-addr.arpa",
            "254.169.254.169.in-addr.arpa",
            "1.0.0.127.in-addr.arpa",
            "16.129.63.168.in-addr.arpa",
            "10.0.76.45.in-addr.arpa",
            "1.168.192.in-addr.arpa",
            "192.in-addr.arpa",
            // Labels beyond the four octets, or odd labels, are under the range they follow.
            "x.1.0.0.10.in-addr.arpa",
            "foo.10.in-addr.arpa",
            "010.in-addr.arpa",
            "ip6.arpa",
            "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa",
            "d.f.ip6.arpa",
            "0.8.e.f.ip6.arpa",
            "8.b.d.0.1.0.0.2.ip6.arpa",
            "2.ip6.arpa",
        ] {
            assert!(
                matches!(refused(name), Some(Refusal::PrivateReverse(_))),
                "{name}: {:?}",
                refused(name)
            );
        }
        for addr in [
            "8.8.8.8",
            "140.82.112.3",
            "2001:4860:4860::8888",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            let name = ptr(addr);
            assert_eq!(refused(&name), None, "{name}");
            assert_eq!(reverse_addr(&name), Some(addr.parse().unwrap()), "{name}");
        }
        for addr in [
            "10.0.0.1",
            "45.76.0.10",
            "fd00::1",
            "2001:4::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(
                matches!(refused(&ptr(addr)), Some(Refusal::PrivateReverse(_))),
                "{addr}"
            );
        }
        for name in ["8.in-addr.arpa", "8.8.in-addr.arpa", "6.0.6.2.ip6.arpa"] {
            assert_eq!(refused(name), None, "{name}");
        }
    }
}
