//! The crate's one error type. [`Error::kind`] classifies it as data (the shared
//! [`agenthold_core::ErrorKind`]), so callers branch on the class and never on message text.

use std::net::SocketAddr;
use std::time::Duration;

use agenthold_core::ErrorKind;

/// Errors of `agenthold-egress`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Entering or using a network namespace failed.
    #[error("network namespace {namespace}: {context}: {source}")]
    Netns {
        /// The namespace (path or name).
        namespace: String,
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Applying nftables rules failed.
    #[error("nftables in {namespace}: {problem}")]
    Nftables {
        /// The namespace the rules were meant for.
        namespace: String,
        /// What went wrong (nft's own message).
        problem: String,
    },
    /// TLS configuration (a CA, a trust anchor) is invalid.
    #[error("TLS: {problem}")]
    Tls {
        /// What is wrong.
        problem: String,
    },
    /// Gateway configuration is invalid.
    #[error("gateway configuration: {problem}")]
    Config {
        /// What is wrong.
        problem: String,
    },
    /// An error from core (policy, templates, secrets).
    #[error(transparent)]
    Core(#[from] agenthold_core::Error),
    /// A DNS lookup or forwarded query failed (upstream failure, or a name that does not resolve).
    #[error(transparent)]
    Dns(#[from] LookupError),
}

impl Error {
    /// The class of this error. Wrapped errors (core's, a DNS lookup's) keep their own class.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            // Sockets, namespaces and nftables are the kernel's side: nothing the caller can fix by asking
            // differently.
            Self::Io { .. } | Self::Netns { .. } | Self::Nftables { .. } => ErrorKind::Upstream,
            Self::Tls { .. } | Self::Config { .. } => ErrorKind::Config,
            Self::Core(e) => e.kind(),
            Self::Dns(e) => e.kind(),
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// Why a DNS lookup or forwarded query failed. Cloneable, because one result may answer several coalesced
/// callers and stay in the negative cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// No acceptable answer arrived within the timeout, on any attempt.
    #[error("DNS upstream {upstream}: no answer for {name} within {timeout:?} ({attempts} attempts)")]
    Timeout {
        /// The upstream server.
        upstream: SocketAddr,
        /// The name asked for.
        name: String,
        /// Attempts made.
        attempts: u32,
        /// The timeout of each attempt.
        timeout: Duration,
    },
    /// The upstream answered with an error code other than NXDOMAIN (SERVFAIL, REFUSED, …).
    #[error("DNS upstream {upstream}: {name}: error response code {rcode}")]
    ServFail {
        /// The upstream server.
        upstream: SocketAddr,
        /// The name asked for.
        name: String,
        /// The DNS response code.
        rcode: u16,
    },
    /// The name does not exist.
    #[error("DNS: {name} does not exist (NXDOMAIN)")]
    NxDomain {
        /// The name asked for.
        name: String,
    },
    /// The name exists but has no A or AAAA record.
    #[error("DNS: {name} has no address records")]
    NoAddress {
        /// The name asked for.
        name: String,
    },
    /// The upstream's answer (or the query handed in) could not be used.
    #[error("DNS upstream {upstream}: {name}: malformed message: {problem}")]
    Malformed {
        /// The upstream server.
        upstream: SocketAddr,
        /// The name asked for (empty when the query had none).
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// A socket operation failed.
    #[error("DNS upstream {upstream}: {name}: {context}: {message}")]
    Io {
        /// The upstream server.
        upstream: SocketAddr,
        /// The name asked for.
        name: String,
        /// What was being done.
        context: &'static str,
        /// The kind of I/O error.
        kind: std::io::ErrorKind,
        /// The error's message (an `io::Error` is not `Clone`).
        message: String,
    },
    /// The name handed to [`crate::dns::Upstream::lookup`] is not a valid host name.
    #[error("DNS: invalid name {name:?}: {problem}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use super::*;

    const UPSTREAM: SocketAddr =
        SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 53));

    #[test]
    fn every_variant_has_its_kind() {
        let io = || std::io::Error::other("boom");
        let cases = [
            (Error::io("bind", io()), ErrorKind::Upstream),
            (
                Error::Netns {
                    namespace: "ns".into(),
                    context: "enter".into(),
                    source: io(),
                },
                ErrorKind::Upstream,
            ),
            (
                Error::Nftables {
                    namespace: "ns".into(),
                    problem: "no".into(),
                },
                ErrorKind::Upstream,
            ),
            (
                Error::Tls {
                    problem: "no PEM".into(),
                },
                ErrorKind::Config,
            ),
            (
                Error::Config {
                    problem: "ports".into(),
                },
                ErrorKind::Config,
            ),
        ];
        for (error, kind) in cases {
            assert_eq!(error.kind(), kind, "{error:?}");
        }
    }

    #[test]
    fn wrapped_errors_keep_their_kind() {
        let core = agenthold_core::policy::normalize_name("bad name!")
            .map(drop)
            .unwrap_err();
        assert_eq!(Error::from(core).kind(), ErrorKind::Policy);
        let denied = agenthold_core::Error::Denied { reason: "no".into() };
        assert_eq!(Error::from(denied).kind(), ErrorKind::Denied);
        let lookups = [
            (
                LookupError::Timeout {
                    upstream: UPSTREAM,
                    name: "a.test".into(),
                    attempts: 2,
                    timeout: Duration::from_secs(1),
                },
                ErrorKind::Timeout,
            ),
            (
                LookupError::ServFail {
                    upstream: UPSTREAM,
                    name: "a.test".into(),
                    rcode: 2,
                },
                ErrorKind::Upstream,
            ),
            (
                LookupError::NxDomain {
                    name: "a.test".into(),
                },
                ErrorKind::NotFound,
            ),
            (
                LookupError::NoAddress {
                    name: "a.test".into(),
                },
                ErrorKind::NotFound,
            ),
            (
                LookupError::InvalidName {
                    name: "bad name!".into(),
                    problem: "space".into(),
                },
                ErrorKind::BadInput,
            ),
        ];
        for (lookup, kind) in lookups {
            assert_eq!(lookup.kind(), kind, "{lookup:?}");
            assert_eq!(Error::from(lookup).kind(), kind);
        }
    }
}
