//! The crate's one error type. [`Error::kind`] classifies it as data (the shared
//! [`agenthold_core::ErrorKind`]); an engine error's class is decided once, where it is made, by the engine
//! module (the one place that reads the engine's status codes), so nobody downcasts or matches codes later.

use agenthold_core::{BoxError, ErrorKind};

/// Errors of `agenthold-sandbox`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The container engine refused or failed a request.
    #[error("docker: {context}: {source}")]
    Engine {
        /// What was being done.
        context: String,
        /// What the engine's answer means ([`ErrorKind::NotFound`] for a missing object,
        /// [`ErrorKind::Conflict`] for one not in a state for the request, …), set by the engine module.
        kind: ErrorKind,
        /// The engine's error.
        #[source]
        source: BoxError,
    },
    /// The engine is missing something agenthold needs (an image, a runtime, a feature).
    #[error("{problem}")]
    Unavailable {
        /// What is missing and how to get it.
        problem: String,
    },
    /// A sandbox does not exist.
    #[error("sandbox {agent} not found: it was removed, or belongs to a runtime on another data directory")]
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
            Self::Engine { kind, .. } => *kind,
            Self::Unavailable { .. } => ErrorKind::Unavailable,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::BadInput { .. } => ErrorKind::BadInput,
            // A host command or file operation the runtime needed is the host's side, like the engine's.
            // The runtime hands the gateway only what it validated itself (or the operator configured):
            // when the gateway then fails under a sandbox operation, that too is the engine side's failure.
            // The gateway's finer class stays readable on the wrapped error.
            Self::Io { .. } | Self::Egress(_) => ErrorKind::Upstream,
            // The record was changed outside agenthold, or the master key is not the one it was sealed
            // under: whatever the vault's own complaint, the stored data is at fault.
            Self::StoredSecret { .. } => ErrorKind::Integrity,
            Self::Core(e) => e.kind(),
        }
    }
}

/// Crossing the `Sandbox` trait: the class travels as [`agenthold_core::Error::Backend`]'s `kind`, so a caller
/// never downcasts the boxed source to learn it.
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
                // No context of its own: the runtime's error already says what was being done.
                Self::backend(kind, "", other)
            }
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use agenthold_core::ErrorKind;

    use super::Error;

    fn io() -> std::io::Error {
        std::io::Error::other("boom")
    }

    #[test]
    fn every_variant_has_its_kind() {
        let cases = [
            (
                Error::Unavailable {
                    problem: "no image".into(),
                },
                ErrorKind::Unavailable,
            ),
            (Error::NotFound { agent: "a".into() }, ErrorKind::NotFound),
            (
                Error::BadInput {
                    problem: "relative path".into(),
                },
                ErrorKind::BadInput,
            ),
            (Error::io("debootstrap", io()), ErrorKind::Upstream),
            (
                Error::StoredSecret {
                    agent: "a".into(),
                    secret: "tok".into(),
                    source: agenthold_core::Error::Decrypt { id: "a/tok".into() },
                },
                ErrorKind::Integrity,
            ),
            (
                Error::Egress(agenthold_egress::Error::Tls {
                    problem: "not a PEM certificate".into(),
                }),
                ErrorKind::Upstream,
            ),
            (
                Error::Core(agenthold_core::Error::Label {
                    key: "agenthold.x".into(),
                    problem: "reserved".into(),
                }),
                ErrorKind::BadInput,
            ),
            (
                Error::Core(agenthold_core::Error::PolicyEntry {
                    entry: "http://x".into(),
                    problem: "no scheme".into(),
                }),
                ErrorKind::Policy,
            ),
        ];
        for (error, kind) in cases {
            assert_eq!(error.kind(), kind, "{error:?}");
        }
    }

    #[test]
    fn the_kind_survives_the_sandbox_trait_both_ways() {
        // Out through `Sandbox` (core's error) and back into the runtime's: same class, no downcast.
        for error in [
            Error::Unavailable {
                problem: "no image".into(),
            },
            Error::BadInput {
                problem: "relative path".into(),
            },
            Error::io("debootstrap", io()),
        ] {
            let kind = error.kind();
            let core = agenthold_core::Error::from(error);
            assert!(matches!(core, agenthold_core::Error::Backend { .. }), "{core:?}");
            assert_eq!(core.kind(), kind);
            assert_eq!(Error::from(core).kind(), kind);
        }
        let missing = agenthold_core::Error::from(Error::NotFound { agent: "a".into() });
        assert!(
            matches!(missing, agenthold_core::Error::NotFound { .. }),
            "{missing:?}"
        );
        let label = Error::Core(agenthold_core::Error::Label {
            key: "agenthold.x".into(),
            problem: "reserved".into(),
        });
        let core = agenthold_core::Error::from(label);
        assert!(matches!(core, agenthold_core::Error::Label { .. }), "{core:?}");
    }
}
