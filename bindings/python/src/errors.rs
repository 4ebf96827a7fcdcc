//! The exception hierarchy (`agenthold.Error` and its four subclasses) and the mapping from the Rust
//! crates' error enums to it. Classification is data: the variant (and, for core errors, the kind) picks the
//! class; the message is the Rust error's, which already names the offending value and what to do.

use agenthold_core::ErrorKind;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    agenthold,
    Error,
    PyException,
    "Base class of every error agenthold raises. Catch this to handle them all."
);
create_exception!(
    agenthold,
    PolicyError,
    Error,
    "A network policy is invalid: an allowlist entry that does not parse (the message names it and the \
     accepted forms)."
);
create_exception!(
    agenthold,
    SecretError,
    Error,
    "A secret is invalid: bad name, environment variable, host, header, template or preset (the message \
     names the secret and what to change)."
);
create_exception!(
    agenthold,
    SandboxError,
    Error,
    "A sandbox operation failed for a reason on the caller's side: unknown sandbox, missing image, missing \
     file, bad path or command, or a runtime that was closed."
);
create_exception!(
    agenthold,
    EngineError,
    Error,
    "The container engine (Docker) or the egress gateway failed, or cannot be reached."
);

/// Which Python class an error becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Base,
    Policy,
    Secret,
    Sandbox,
    Engine,
}

impl Class {
    pub(crate) fn err(self, message: impl Into<String>) -> PyErr {
        let message = message.into();
        match self {
            Self::Base => Error::new_err(message),
            Self::Policy => PolicyError::new_err(message),
            Self::Secret => SecretError::new_err(message),
            Self::Sandbox => SandboxError::new_err(message),
            Self::Engine => EngineError::new_err(message),
        }
    }
}

/// Classify a core error; returns the class and the message.
pub(crate) fn classify_core(e: agenthold_core::Error) -> (Class, String) {
    use agenthold_core::Error as E;
    match e {
        E::PolicyEntry { .. } | E::HostName { .. } => (Class::Policy, e.to_string()),
        E::Template { .. } | E::HeaderValue { .. } | E::Secret { .. } => (Class::Secret, e.to_string()),
        // A reserved or malformed label is a bad sandbox spec, not a network policy (S15); so is a bad limit.
        E::NotFound { .. } | E::InvalidId { .. } | E::Label { .. } | E::SandboxSpec { .. } => {
            (Class::Sandbox, e.to_string())
        }
        E::Backend {
            kind,
            context,
            source,
        } => match source.downcast::<agenthold_sandbox::Error>() {
            // The runtime wraps its own errors into core's when they cross the `Sandbox` trait: unwrap them.
            Ok(inner) => classify_sandbox(*inner),
            Err(source) => {
                let class = match kind {
                    ErrorKind::BadInput | ErrorKind::NotFound => Class::Sandbox,
                    _ => Class::Engine,
                };
                (class, format!("{context}: {source}"))
            }
        },
        other => (Class::Base, other.to_string()),
    }
}

/// Classify a sandbox-runtime error; returns the class and the message.
pub(crate) fn classify_sandbox(e: agenthold_sandbox::Error) -> (Class, String) {
    use agenthold_sandbox::Error as E;
    match e {
        E::Core(core) => classify_core(core),
        E::NotFound { agent } => (
            Class::Sandbox,
            format!(
                "sandbox {agent} not found: it was removed, or belongs to a runtime on another data directory"
            ),
        ),
        E::Unavailable { .. } | E::BadInput { .. } => (Class::Sandbox, e.to_string()),
        // A record changed outside agenthold (or another master key): neither the caller's input nor the
        // engine.
        E::StoredSecret { .. } => (Class::Base, e.to_string()),
        // 409: the sandbox is not in a state for this (stopped, for an exec).
        E::Engine {
            source:
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 409,
                    message,
                },
            context,
        } => (
            Class::Sandbox,
            format!("{context}: {message} (start the sandbox with start() first)"),
        ),
        other if other.kind() == ErrorKind::NotFound => (Class::Sandbox, other.to_string()),
        other => (Class::Engine, other.to_string()),
    }
}

/// A sandbox-runtime error as a Python exception.
pub(crate) fn sandbox_err(e: agenthold_sandbox::Error) -> PyErr {
    let (class, message) = classify_sandbox(e);
    class.err(message)
}

/// A core error as a Python exception.
pub(crate) fn core_err(e: agenthold_core::Error) -> PyErr {
    let (class, message) = classify_core(e);
    class.err(message)
}

/// Raised by calls on a runtime after `close()`.
pub(crate) fn closed() -> PyErr {
    SandboxError::new_err("the runtime is closed; create a new agenthold.Runtime")
}

/// Register the classes in the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("PolicyError", py.get_type::<PolicyError>())?;
    m.add("SecretError", py.get_type::<SecretError>())?;
    m.add("SandboxError", py.get_type::<SandboxError>())?;
    m.add("EngineError", py.get_type::<EngineError>())?;
    Ok(())
}
