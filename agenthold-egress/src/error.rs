//! The crate's one error type.

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
    Dns(#[from] crate::dns::LookupError),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
