//! The allowlist entry grammar (E8).
//!
//! ```text
//! entry    = host [ ":" ports ]
//! host     = name | "*." name | ipv4 [ "/" len ] | "[" ipv6 [ "/" len ] "]"
//! ports    = port | "*"             ; no port means 80 and 443
//! ```
//!
//! `*.npmjs.org` matches subdomains only, never `npmjs.org` itself. Names are normalised once at parse time
//! ([`normalize_name`]). An address entry with host bits set (`10.0.0.1/8`) is rejected rather than silently
//! widened. [`PolicyEntry`]'s `Display` prints the canonical form, and parsing what it prints gives the same
//! entry back.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

use super::name::normalize_name;
use crate::error::Error;

/// Which hosts an entry covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this (normalised) name.
    Exact(String),
    /// Any name strictly below this (normalised) suffix; never the suffix itself.
    Subdomains(String),
    /// Any address inside this network. A single address is a full-length prefix.
    Network(IpNet),
}

impl HostPattern {
    /// Whether `name` (already normalised) is covered by this pattern.
    #[must_use]
    pub fn matches_name(&self, name: &str) -> bool {
        match self {
            Self::Exact(exact) => name == exact,
            Self::Subdomains(suffix) => is_strict_subdomain(name, suffix),
            Self::Network(_) => false,
        }
    }

    /// Whether `addr` is covered by this pattern.
    #[must_use]
    pub fn matches_addr(&self, addr: IpAddr) -> bool {
        match self {
            Self::Network(net) => net.contains(&addr),
            Self::Exact(_) | Self::Subdomains(_) => false,
        }
    }

    /// Whether this pattern names hosts (as opposed to addresses).
    #[must_use]
    pub fn is_name(&self) -> bool {
        !matches!(self, Self::Network(_))
    }
}

/// Whether `name` is a strict subdomain of `suffix` (`a.b.c` of `b.c`, but not `b.c` nor `xb.c`).
#[must_use]
pub fn is_strict_subdomain(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() + 1
        && name.ends_with(suffix)
        && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

/// Which ports an entry covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpec {
    /// No port was written: 80 and 443.
    Web,
    /// Exactly this port.
    One(u16),
    /// Every port (`:*`).
    Any,
}

impl PortSpec {
    /// Whether `port` is covered.
    #[must_use]
    pub fn matches(self, port: u16) -> bool {
        match self {
            Self::Web => port == 80 || port == 443,
            Self::One(p) => port == p,
            Self::Any => true,
        }
    }
}

/// One allowlist entry: a host pattern and the ports it opens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PolicyEntry {
    /// The hosts covered.
    pub host: HostPattern,
    /// The ports covered.
    pub ports: PortSpec,
}

impl PolicyEntry {
    /// Parse one entry.
    ///
    /// # Errors
    /// [`Error::PolicyEntry`] naming the entry and what is wrong with it.
    pub fn parse(entry: &str) -> Result<Self, Error> {
        parse_entry(entry).map_err(|problem| Error::PolicyEntry {
            entry: entry.to_owned(),
            problem,
        })
    }

    /// Whether this entry covers the (normalised) `name` on `port`.
    #[must_use]
    pub fn matches_name(&self, name: &str, port: u16) -> bool {
        self.ports.matches(port) && self.host.matches_name(name)
    }

    /// Whether this entry covers `addr` on `port`.
    #[must_use]
    pub fn matches_addr(&self, addr: IpAddr, port: u16) -> bool {
        self.ports.matches(port) && self.host.matches_addr(addr)
    }
}

impl FromStr for PolicyEntry {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

impl fmt::Display for PolicyEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Exact(name) => f.write_str(name)?,
            HostPattern::Subdomains(suffix) => write!(f, "*.{suffix}")?,
            HostPattern::Network(IpNet::V4(net)) if net.prefix_len() == 32 => write!(f, "{}", net.addr())?,
            HostPattern::Network(IpNet::V4(net)) => write!(f, "{net}")?,
            HostPattern::Network(IpNet::V6(net)) if net.prefix_len() == 128 => write!(f, "[{}]", net.addr())?,
            HostPattern::Network(IpNet::V6(net)) => write!(f, "[{net}]")?,
        }
        match self.ports {
            PortSpec::Web => Ok(()),
            PortSpec::One(p) => write!(f, ":{p}"),
            PortSpec::Any => f.write_str(":*"),
        }
    }
}

impl serde::Serialize for PolicyEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PolicyEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

fn parse_entry(raw: &str) -> Result<PolicyEntry, String> {
    let entry = raw.trim();
    if entry.is_empty() {
        return Err("empty entry".into());
    }
    if entry.contains("://") {
        return Err("entries are host[:port], not URLs; drop the scheme".into());
    }
    let (host, ports) = split_port(entry)?;
    let ports = match ports {
        None => PortSpec::Web,
        Some("*") => PortSpec::Any,
        Some(p) => PortSpec::One(parse_port(p)?),
    };
    Ok(PolicyEntry {
        host: parse_host(host)?,
        ports,
    })
}

/// Split `host[:port]`, where an IPv6 host is bracketed.
fn split_port(entry: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(rest) = entry.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or_else(|| "an IPv6 address must be closed with ']'".to_owned())?;
        if inside
            .split('/')
            .next()
            .is_none_or(|a| a.parse::<std::net::Ipv6Addr>().is_err())
        {
            return Err("brackets are only for IPv6 addresses, like [2001:db8::/32]:443".into());
        }
        return match after {
            "" => Ok((inside, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((inside, Some(port))),
                None => Err(format!("unexpected {after:?} after ']'; expected ':port'")),
            },
        };
    }
    match entry.matches(':').count() {
        0 => Ok((entry, None)),
        1 => entry
            .split_once(':')
            .map(|(h, p)| (h, Some(p)))
            .ok_or_else(String::new),
        _ => Err("an IPv6 address must be written in brackets, like [2001:db8::/32]:443".into()),
    }
}

fn parse_port(port: &str) -> Result<u16, String> {
    if port.is_empty() {
        return Err("empty port after ':'".into());
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port {port:?} is not a number or '*'"));
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("port {port} is out of range 1-65535")),
        Ok(p) => Ok(p),
    }
}

fn parse_host(host: &str) -> Result<HostPattern, String> {
    if host.is_empty() {
        return Err("empty host".into());
    }
    if let Some(net) = parse_network(host)? {
        return Ok(HostPattern::Network(net));
    }
    if let Some(suffix) = host.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err("only one leading '*.' is allowed".into());
        }
        let suffix = normalize_name(suffix).map_err(|e| name_problem(&e))?;
        return Ok(HostPattern::Subdomains(suffix));
    }
    if host.contains('*') {
        return Err("a wildcard is only allowed as a leading '*.' (like *.npmjs.org)".into());
    }
    normalize_name(host)
        .map(HostPattern::Exact)
        .map_err(|e| name_problem(&e))
}

fn name_problem(e: &Error) -> String {
    match e {
        Error::HostName { problem, .. } => problem.clone(),
        other => other.to_string(),
    }
}

/// An address or a network, if `host` is written as one.
fn parse_network(host: &str) -> Result<Option<IpNet>, String> {
    let (addr, len) = match host.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (host, None),
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return match len {
            Some(_) => Err(
                "entries are host[:port]; a '/' is only allowed in an address prefix like 10.0.0.0/8".into(),
            ),
            None => Ok(None),
        };
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => max,
        Some(l) => match l.parse::<u8>() {
            Ok(n) if n <= max && l.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(format!("prefix length {l:?} is not a number from 0 to {max}")),
        },
    };
    let net = IpNet::new(addr, len).map_err(|e| e.to_string())?;
    if net.network() != addr {
        return Err(format!(
            "address has bits set outside the /{len} prefix; did you mean {}?",
            net.trunc()
        ));
    }
    Ok(Some(net))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PolicyEntry {
        PolicyEntry::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(
            p("github.com"),
            PolicyEntry {
                host: HostPattern::Exact("github.com".into()),
                ports: PortSpec::Web
            }
        );
        assert_eq!(
            p("*.npmjs.org"),
            PolicyEntry {
                host: HostPattern::Subdomains("npmjs.org".into()),
                ports: PortSpec::Web
            }
        );
        assert_eq!(p("github.com:22").ports, PortSpec::One(22));
        assert_eq!(p("registry.example.com:*").ports, PortSpec::Any);
        let net = p("203.0.113.0/24:443");
        assert_eq!(net.host, HostPattern::Network("203.0.113.0/24".parse().unwrap()));
        assert_eq!(net.ports, PortSpec::One(443));
        assert_eq!(
            p("[2001:db8::/32]:443").host,
            HostPattern::Network("2001:db8::/32".parse().unwrap())
        );
        assert_eq!(
            p("[2001:db8::1]").host,
            HostPattern::Network("2001:db8::1/128".parse().unwrap())
        );
        assert_eq!(
            p("198.51.100.7").host,
            HostPattern::Network("198.51.100.7/32".parse().unwrap())
        );
    }

    #[test]
    fn normalises_names_once() {
        assert_eq!(p("GitHub.com.").to_string(), "github.com");
        assert_eq!(
            p("*.Bücher.example:8443").to_string(),
            "*.xn--bcher-kva.example:8443"
        );
        assert_eq!(p("  github.com  ").to_string(), "github.com");
    }

    #[test]
    fn prints_canonically() {
        for s in [
            "github.com",
            "*.npmjs.org",
            "github.com:22",
            "registry.example.com:*",
            "203.0.113.0/24:443",
            "[2001:db8::/32]:443",
            "[2001:db8::1]",
            "198.51.100.7:*",
        ] {
            assert_eq!(p(s).to_string(), s);
        }
    }

    #[test]
    fn wildcard_never_matches_its_apex() {
        let e = p("*.npmjs.org");
        assert!(e.matches_name("registry.npmjs.org", 443));
        assert!(e.matches_name("a.b.npmjs.org", 80));
        assert!(!e.matches_name("npmjs.org", 443));
        assert!(!e.matches_name("evilnpmjs.org", 443));
        assert!(!e.matches_name("registry.npmjs.org", 22));
    }

    #[test]
    fn ports() {
        assert!(p("github.com").matches_name("github.com", 80));
        assert!(p("github.com").matches_name("github.com", 443));
        assert!(!p("github.com").matches_name("github.com", 22));
        assert!(p("github.com:22").matches_name("github.com", 22));
        assert!(!p("github.com:22").matches_name("github.com", 443));
        assert!(p("github.com:*").matches_name("github.com", 5432));
    }

    #[test]
    fn bad_entries_name_the_entry_and_the_problem() {
        for (entry, needle) in [
            ("", "empty"),
            ("https://github.com", "scheme"),
            ("github.com/path", "'/'"),
            ("github.com:", "empty port"),
            ("github.com:0", "range"),
            ("github.com:65536", "range"),
            ("github.com:ssh", "not a number"),
            ("github.com:22:33", "brackets"),
            ("2001:db8::1", "brackets"),
            ("[2001:db8::1", "closed"),
            ("[2001:db8::1]x", "after ']'"),
            ("[github.com]:22", "only for IPv6"),
            ("[1.2.3.4]", "only for IPv6"),
            ("*", "wildcard"),
            ("*.*.com", "one leading"),
            ("foo.*.com", "wildcard"),
            ("10.0.0.1/8", "did you mean 10.0.0.0/8"),
            ("10.0.0.0/33", "prefix length"),
            ("10.0.0.0/-1", "prefix length"),
            ("[::1/129]", "prefix length"),
            ("a..b", "empty label"),
            ("exa mple.com", "letters"),
            ("0x7f.1", "numeric"),
            ("1.2.3", "numeric"),
        ] {
            let err = PolicyEntry::parse(entry).expect_err(entry).to_string();
            assert!(err.contains(&format!("{entry:?}")), "{err}");
            assert!(err.contains(needle), "{entry:?}: {err}");
        }
    }
}
