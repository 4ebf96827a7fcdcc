//! The crate's one error type. Every variant carries the offending value; [`Error::kind`] classifies it as
//! data, so callers branch on the class and never on message text.

use std::path::PathBuf;

/// A boxed error from a backend (a storage engine, a container engine) behind one of core's traits.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result with core's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How an error should be treated by a caller: who is at fault and whether retrying can help.
///
/// Every crate's error has a `kind()` returning one of these, and an error that wraps another crate's error
/// (boxed or not) carries the inner kind, so callers (the server, the bindings) branch on the class and never
/// downcast nor read message text. The Docker engine's status codes are read once, in the sandbox crate's
/// engine module, and arrive here as [`ErrorKind::NotFound`], [`ErrorKind::Conflict`] and so on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// The input (an id, a label, a path, a command, a spec field) is invalid; fix the input.
    BadInput,
    /// A network policy is invalid: an allowlist entry or a host name in it; fix the policy.
    Policy,
    /// A secret or its injection rule (name, host, header, template) is invalid; fix the secret.
    Secret,
    /// A configuration value (a configuration key, the master key, the gateway's settings or CA) is
    /// invalid or missing; fix the configuration.
    Config,
    /// The thing asked for does not exist (or the caller may not know that it does).
    NotFound,
    /// The thing exists but is not in a state for this (a stopped sandbox asked to run a command, a name
    /// already taken).
    Conflict,
    /// A policy or an authorization check refused the action.
    Denied,
    /// Something agenthold needs is missing on this host: an image, an OCI runtime, the engine itself.
    Unavailable,
    /// Something outside the process did not answer in time.
    Timeout,
    /// Something outside the process failed: the container engine, the egress gateway's kernel side, an
    /// upstream, a host command.
    Upstream,
    /// agenthold's own state on disk (a file in its data directory, the store's database) could not be read
    /// or written.
    Storage,
    /// Stored data does not open: wrong master key, tampered bytes, or a format no longer accepted.
    Integrity,
    /// A bug or a broken invariant inside agenthold.
    Internal,
}

impl ErrorKind {
    /// Whether the caller's input is at fault ([`BadInput`](Self::BadInput) or one of its refinements
    /// [`Policy`](Self::Policy), [`Secret`](Self::Secret), [`Config`](Self::Config)): retrying the same
    /// request cannot help.
    #[must_use]
    pub fn is_bad_input(self) -> bool {
        matches!(self, Self::BadInput | Self::Policy | Self::Secret | Self::Config)
    }
}

/// Errors of `agenthold-core`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A network policy entry could not be parsed.
    #[error("invalid policy entry {entry:?}: {problem}")]
    PolicyEntry {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A host name could not be normalised (bad characters, bad IDNA, too long).
    #[error("invalid host name {name:?}: {problem}")]
    HostName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A header template could not be parsed.
    #[error("invalid template {template:?} at byte {position}: {problem}")]
    Template {
        /// The template source.
        template: String,
        /// Byte offset in the source where the problem was found.
        position: usize,
        /// What is wrong.
        problem: String,
    },
    /// A template rendered to a value that cannot be sent as an HTTP header value.
    #[error("template for header {header:?} rendered an invalid header value: {problem}")]
    HeaderValue {
        /// The header the value was meant for.
        header: String,
        /// What is wrong (the value itself is never included).
        problem: &'static str,
    },
    /// An identifier is malformed.
    #[error("invalid {kind} {value:?}: {problem}")]
    InvalidId {
        /// Which kind of identifier ("agent id", "secret id", …).
        kind: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A secret or its injection rule is invalid.
    #[error("invalid secret {name:?}: {problem}")]
    Secret {
        /// The secret's name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// A configuration key is unknown or its value invalid.
    #[error("configuration key {key}: {problem}")]
    Config {
        /// Dotted path of the key (`egress.proxy_port`), or the environment variable that set it.
        key: String,
        /// What is wrong.
        problem: String,
    },
    /// The master key could not be loaded or created.
    #[error("master key ({source_name}): {problem}")]
    MasterKey {
        /// Where the key came from: the file path or `AGENTHOLD_MASTER_KEY`.
        source_name: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
    /// A sealed secret failed authentication: wrong master key, tampered bytes, bytes sealed for another
    /// secret id, or injection rules changed since the value was sealed (S15). The value is never returned.
    #[error(
        "secret {id} could not be decrypted: wrong master key, tampered data, data sealed for another secret, \
         or its injection rules (hosts, header, template) were changed since it was sealed"
    )]
    Decrypt {
        /// The secret id the data was opened for.
        id: String,
    },
    /// A sealed secret is in the format from before rules were bound into the AAD (version 1), and was
    /// presented where only the current format is accepted (after the store's one-way migration).
    #[error(
        "secret {id} is sealed in the old format that does not bind its injection rules; such records are \
         migrated once, when a store is first opened by this version, and refused afterwards: set the secret \
         again"
    )]
    LegacySealed {
        /// The secret id the data was opened for.
        id: String,
    },
    /// A sandbox label is reserved or malformed (S15: `agenthold.*` labels are agenthold's own).
    #[error("label {key:?}: {problem}")]
    Label {
        /// The label key as given.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A sandbox spec is invalid (an empty image, a limit that is not positive, a bad environment
    /// variable); labels and secrets have their own variants.
    #[error("sandbox spec: {field}: {problem}")]
    SandboxSpec {
        /// The field (`image`, `cpus`, `memory`, `pids`, `env`).
        field: &'static str,
        /// What is wrong and what to give instead.
        problem: String,
    },
    /// A path inside a sandbox is not one a file operation accepts: relative, with a `..` component, or with
    /// a NUL byte (see [`crate::sandbox::sandbox_path`]).
    #[error("path {path:?}: {problem}")]
    SandboxPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The storage backend failed.
    #[error("store ({backend}): {op}: {source}")]
    Store {
        /// Which backend ("redb", "sled", …).
        backend: &'static str,
        /// What was being done ("open", "put agents/…").
        op: String,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// Something that was asked for does not exist.
    #[error("{what} not found: {id}")]
    NotFound {
        /// What kind of thing ("sandbox", "secret", …).
        what: &'static str,
        /// Its identifier.
        id: String,
    },
    /// An action was refused.
    #[error("denied: {reason}")]
    Denied {
        /// Why.
        reason: String,
    },
    /// An implementation of one of core's traits failed; `kind` classifies the failure. The implementation
    /// sets it from its own error when it wraps one (the sandbox runtime passes its `Error::kind`), so a
    /// caller never has to downcast `source` to learn the class.
    #[error("{context}{}{source}", if context.is_empty() { "" } else { ": " })]
    Backend {
        /// Classification of the failure.
        kind: ErrorKind,
        /// What was being done; empty when the implementation's error already says it all.
        context: String,
        /// The implementation's error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// The class of this error.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::PolicyEntry { .. } | Self::HostName { .. } => ErrorKind::Policy,
            Self::Template { .. } | Self::HeaderValue { .. } | Self::Secret { .. } => ErrorKind::Secret,
            Self::InvalidId { .. }
            | Self::Label { .. }
            | Self::SandboxSpec { .. }
            | Self::SandboxPath { .. } => ErrorKind::BadInput,
            Self::Config { .. } | Self::MasterKey { .. } => ErrorKind::Config,
            Self::Decrypt { .. } | Self::LegacySealed { .. } => ErrorKind::Integrity,
            Self::Io { .. } | Self::Store { .. } => ErrorKind::Storage,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::Denied { .. } => ErrorKind::Denied,
            Self::Backend { kind, .. } => *kind,
        }
    }

    /// Wrap an implementation's error with a classification and context (empty: the error shows as its
    /// source alone).
    pub fn backend(kind: ErrorKind, context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Backend {
            kind,
            context: context.into(),
            source: source.into(),
        }
    }

    #[allow(dead_code)] // used by the vault and the store
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> std::io::Error {
        std::io::Error::other("disk on fire")
    }

    #[test]
    fn every_variant_has_its_kind() {
        let cases = [
            (
                Error::PolicyEntry {
                    entry: "x".into(),
                    problem: "bad".into(),
                },
                ErrorKind::Policy,
            ),
            (
                Error::HostName {
                    name: "x".into(),
                    problem: "bad".into(),
                },
                ErrorKind::Policy,
            ),
            (
                Error::Template {
                    template: "x".into(),
                    position: 0,
                    problem: "bad".into(),
                },
                ErrorKind::Secret,
            ),
            (
                Error::HeaderValue {
                    header: "x".into(),
                    problem: "bad",
                },
                ErrorKind::Secret,
            ),
            (
                Error::Secret {
                    name: "x".into(),
                    problem: "bad".into(),
                },
                ErrorKind::Secret,
            ),
            (
                Error::InvalidId {
                    kind: "agent id",
                    value: "x".into(),
                    problem: "bad",
                },
                ErrorKind::BadInput,
            ),
            (
                Error::Label {
                    key: "agenthold.x".into(),
                    problem: "reserved".into(),
                },
                ErrorKind::BadInput,
            ),
            (
                Error::Config {
                    key: "egress.proxy_port".into(),
                    problem: "bad".into(),
                },
                ErrorKind::Config,
            ),
            (
                Error::MasterKey {
                    source_name: "file".into(),
                    problem: "bad".into(),
                },
                ErrorKind::Config,
            ),
            (
                Error::SandboxPath {
                    path: "../x".into(),
                    problem: "bad",
                },
                ErrorKind::BadInput,
            ),
            (Error::Decrypt { id: "s".into() }, ErrorKind::Integrity),
            (Error::LegacySealed { id: "s".into() }, ErrorKind::Integrity),
            (Error::io("/x", io()), ErrorKind::Storage),
            (
                Error::Store {
                    backend: "redb",
                    op: "open".into(),
                    source: io().into(),
                },
                ErrorKind::Storage,
            ),
            (
                Error::NotFound {
                    what: "sandbox",
                    id: "a".into(),
                },
                ErrorKind::NotFound,
            ),
            (Error::Denied { reason: "no".into() }, ErrorKind::Denied),
        ];
        for (error, kind) in cases {
            assert_eq!(error.kind(), kind, "{error:?}");
        }
    }

    #[test]
    fn a_backend_error_carries_the_kind_it_was_given() {
        for kind in [ErrorKind::Conflict, ErrorKind::Unavailable, ErrorKind::Upstream] {
            let error = Error::backend(kind, "sandbox runtime", io());
            assert_eq!(error.kind(), kind);
            assert_eq!(error.to_string(), "sandbox runtime: disk on fire");
        }
        assert_eq!(
            Error::backend(ErrorKind::Upstream, "", io()).to_string(),
            "disk on fire"
        );
    }

    #[test]
    fn bad_input_covers_its_refinements_only() {
        for kind in [
            ErrorKind::BadInput,
            ErrorKind::Policy,
            ErrorKind::Secret,
            ErrorKind::Config,
        ] {
            assert!(kind.is_bad_input(), "{kind:?}");
        }
        for kind in [
            ErrorKind::NotFound,
            ErrorKind::Conflict,
            ErrorKind::Denied,
            ErrorKind::Unavailable,
            ErrorKind::Timeout,
            ErrorKind::Upstream,
            ErrorKind::Storage,
            ErrorKind::Integrity,
            ErrorKind::Internal,
        ] {
            assert!(!kind.is_bad_input(), "{kind:?}");
        }
    }

    #[test]
    fn kinds_serialise_as_snake_case() {
        let json = serde_json::to_string(&[ErrorKind::BadInput, ErrorKind::NotFound]).unwrap_or_default();
        assert_eq!(json, r#"["bad_input","not_found"]"#);
    }
}
