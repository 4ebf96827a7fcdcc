//! Where a connection or request wants to go: a normalised name, or an address when there is no name.

use std::fmt;
use std::net::IpAddr;

use agenthold_core::policy::{DenyReason, normalize_name};

/// Where a connection or request wants to go: a (normalised) name, or an address when there is no name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Name(String),
    Addr(IpAddr),
}

impl Target {
    /// A target from a host as written by the sandbox (`Host`, CONNECT authority, SNI): an IP literal
    /// (IPv6 possibly in brackets) or a name, normalised.
    pub(crate) fn parse(host: &str) -> std::result::Result<Self, DenyReason> {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Self::Addr(ip));
        }
        normalize_name(host)
            .map(Self::Name)
            .map_err(|_| DenyReason::InvalidName)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(n) => f.write_str(n),
            Self::Addr(a) => write!(f, "{a}"),
        }
    }
}
