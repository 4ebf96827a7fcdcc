//! `policy_entry`: arbitrary text as an allowlist entry (E8).
//!
//! Parsing never panics. An entry that parses prints a canonical form that parses back to the same entry
//! (and prints the same again); upper-casing that form or, for names, adding a trailing dot changes
//! nothing; matching never panics and is exactly "port covered and host covered". An entry that does not
//! parse is reported as bad input, naming the entry in quotes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use agenthold_core::policy::{HostPattern, PolicyEntry, PortSpec};
use agenthold_core::{Error, ErrorKind};

const PORTS: [u16; 8] = [0, 1, 22, 79, 80, 443, 8443, 65535];

/// Run every check on `data` (lossily decoded as UTF-8); panics on a violated invariant.
pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match PolicyEntry::parse(&text) {
        Ok(entry) => check_entry(&text, &entry),
        Err(err) => check_error(&text, &err),
    }
}

fn check_error(text: &str, err: &Error) {
    assert_eq!(err.kind(), ErrorKind::Policy, "{text:?}: {err}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("{text:?}")),
        "{text:?}: message does not name the entry: {message}"
    );
}

fn check_entry(text: &str, entry: &PolicyEntry) {
    let printed = entry.to_string();
    let reparsed = PolicyEntry::parse(&printed)
        .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(&reparsed, entry, "{text:?} printed as {printed:?}");
    assert_eq!(
        reparsed.to_string(),
        printed,
        "printing is not idempotent for {text:?}"
    );

    // Normalisation: case and a trailing dot on a name never change the entry.
    let upper = PolicyEntry::parse(&printed.to_ascii_uppercase());
    assert_eq!(
        upper.ok().as_ref(),
        Some(entry),
        "upper-casing {printed:?} changed the entry"
    );
    if text.is_ascii() {
        let upper = PolicyEntry::parse(&text.to_ascii_uppercase());
        assert_eq!(
            upper.ok().as_ref(),
            Some(entry),
            "upper-casing {text:?} changed the entry"
        );
    }
    if entry.host.is_name() {
        let (host, port) = printed
            .split_once(':')
            .map_or((printed.as_str(), None), |(h, p)| (h, Some(p)));
        let dotted = match port {
            Some(port) => format!("{host}.:{port}"),
            None => format!("{host}."),
        };
        let parsed = PolicyEntry::parse(&dotted);
        assert_eq!(
            parsed.ok().as_ref(),
            Some(entry),
            "a trailing dot changed {printed:?}"
        );
    }

    // Matching never panics, is the conjunction of its parts, and never widens past `:*`.
    let trimmed = text.trim();
    let any_port = PolicyEntry {
        host: entry.host.clone(),
        ports: PortSpec::Any,
    };
    let names = [
        trimmed,
        printed.as_str(),
        "",
        ".",
        "example.com",
        "a.example.com",
        "xn--bcher-kva.example",
    ];
    let addrs = [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)),
        IpAddr::V4(Ipv4Addr::BROADCAST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
    ];
    for port in PORTS {
        for name in names {
            let m = entry.matches_name(name, port);
            assert_eq!(
                m,
                entry.ports.matches(port) && entry.host.matches_name(name),
                "{printed} {name}:{port}"
            );
            assert!(
                !m || any_port.matches_name(name, port),
                "{printed} widened past :* for {name}:{port}"
            );
        }
        for addr in addrs {
            let m = entry.matches_addr(addr, port);
            assert_eq!(
                m,
                entry.ports.matches(port) && entry.host.matches_addr(addr),
                "{printed} {addr}:{port}"
            );
        }
        let web = port == 80 || port == 443;
        match entry.ports {
            PortSpec::Web => assert_eq!(entry.ports.matches(port), web),
            PortSpec::One(n) => assert_eq!(entry.ports.matches(port), port == n),
            PortSpec::Any => assert!(entry.ports.matches(port)),
        }
    }

    // Each host pattern covers what it names, and a wildcard never its apex.
    let port = match entry.ports {
        PortSpec::One(n) => n,
        PortSpec::Web | PortSpec::Any => 443,
    };
    match &entry.host {
        HostPattern::Exact(name) => assert!(entry.matches_name(name, port), "{printed} misses {name}"),
        HostPattern::Subdomains(suffix) => {
            assert!(!entry.matches_name(suffix, port), "{printed} matches its apex");
            assert!(
                !entry.matches_name(&format!("x{suffix}"), port),
                "{printed} matches x{suffix}"
            );
            assert!(
                entry.matches_name(&format!("x.{suffix}"), port),
                "{printed} misses x.{suffix}"
            );
        }
        HostPattern::Network(net) => {
            assert!(
                entry.matches_addr(net.network(), port),
                "{printed} misses its network address"
            );
            assert!(
                entry.matches_addr(net.broadcast(), port),
                "{printed} misses its last address"
            );
        }
    }
}
