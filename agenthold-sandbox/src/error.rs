//! The crate's one error type.

use agenthold_core::ErrorKind;

/// Errors of `agenthold-sandbox`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The container engine refused or failed a request.
    #[error("docker: {context}: {source}")]
    Engine {
        /// What was being done.
        context: String,
        /// The engine's error.
        #[source]
        source: bollard::errors::Error,
    },
    /// The engine is missing something agenthold needs (an image, a runtime, a feature).
    #[error("{problem}")]
    Unavailable {
        /// What is missing and how to get it.
        problem: String,
    },
    /// A sandbox does not exist.
    #[error("sandbox {agent} not found")]
    NotFound {
        /// The agent.
        agent: String,
    },
    /// The request is invalid.
    #[error("{problem}")]
    BadInput {
        /// What is wrong.
        problem: String,
    },
    /// A local command or file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A secret stored in the runtime's records cannot be used (S15): it does not open under the master
    /// key for its agent, name and rules (the record was changed outside agenthold, or the key is not the
    /// one it was sealed under), or it is in the vault's old format after the store's migration. Its value is
    /// never used.
    #[error(
        "stored secret {secret:?} of agent {agent} cannot be used, its value was not loaded: {source}; if the \
         master key is the right one, the record was changed outside agenthold: restore the store from a backup"
    )]
    StoredSecret {
        /// The agent the record belongs to.
        agent: String,
        /// The secret's name.
        secret: String,
        /// Why it does not open (the vault's error).
        #[source]
        source: agenthold_core::Error,
    },
    /// The egress gateway failed.
    #[error(transparent)]
    Egress(#[from] agenthold_egress::Error),
    /// Core (store, vault, policy, secrets) failed.
    #[error(transparent)]
    Core(#[from] agenthold_core::Error),
}

impl Error {
    pub(crate) fn engine(context: impl Into<String>, source: bollard::errors::Error) -> Self {
        Self::Engine {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    /// The class of this error.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Engine { source, .. } if is_not_found(source) => ErrorKind::NotFound,
            Self::Engine { .. } | Self::Io { .. } | Self::Unavailable { .. } | Self::Egress(_) => {
                ErrorKind::Upstream
            }
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::BadInput { .. } => ErrorKind::BadInput,
            Self::Core(e) | Self::StoredSecret { source: e, .. } => e.kind(),
        }
    }
}

/// Whether the engine answered 404.
pub(crate) fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }
    )
}

impl From<Error> for agenthold_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Core(core) => core,
            Error::NotFound { agent } => Self::NotFound {
                what: "sandbox",
                id: agent,
            },
            other => {
                let kind = other.kind();
                Self::backend(kind, "sandbox runtime", other)
            }
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
