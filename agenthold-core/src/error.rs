//! The crate's one error type. Every variant carries the offending value; [`Error::kind`] classifies it as
//! data, so callers branch on the class and never on message text.

use std::path::PathBuf;

/// A boxed error from a backend (a storage engine, a container engine) behind one of core's traits.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result with core's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How an error should be treated by a caller: who is at fault and whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// The input (an entry, a template, a configuration value, an id) is invalid; fix the input.
    BadInput,
    /// The thing asked for does not exist (or the caller may not know that it does).
    NotFound,
    /// A policy or an authorization check refused the action.
    Denied,
    /// Something outside the process (storage, a container engine, an upstream) failed.
    Upstream,
    /// A bug or a broken invariant inside agenthold.
    Internal,
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
    /// An implementation of one of core's traits failed; `kind` classifies the failure.
    #[error("{context}: {source}")]
    Backend {
        /// Classification of the failure.
        kind: ErrorKind,
        /// What was being done.
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
            Self::PolicyEntry { .. }
            | Self::HostName { .. }
            | Self::Template { .. }
            | Self::InvalidId { .. }
            | Self::Secret { .. }
            | Self::Config { .. }
            | Self::HeaderValue { .. }
            | Self::Label { .. }
            | Self::SandboxSpec { .. }
            | Self::MasterKey { .. } => ErrorKind::BadInput,
            Self::Decrypt { .. } | Self::LegacySealed { .. } | Self::Io { .. } | Self::Store { .. } => {
                ErrorKind::Upstream
            }
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::Denied { .. } => ErrorKind::Denied,
            Self::Backend { kind, .. } => *kind,
        }
    }

    /// Wrap an implementation's error with a classification and context.
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
