//! The exception hierarchy (`agenthold.Error` and its four subclasses) and the mapping from the Rust
//! crates' errors to it. Classification is data: the error's [`ErrorKind`] picks the class (errors that
//! crossed the `Sandbox` trait boxed carry their kind with them, so nothing is downcast); the message is the
//! Rust error's, which already names the offending value and what to do.

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
    /// The class of an error of kind `kind`.
    pub(crate) fn of(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::Policy => Self::Policy,
            ErrorKind::Secret => Self::Secret,
            // The caller's side: a bad spec, path or command, an unknown or stopped sandbox, a missing image
            // or OCI runtime.
            ErrorKind::BadInput | ErrorKind::NotFound | ErrorKind::Conflict | ErrorKind::Unavailable => {
                Self::Sandbox
            }
            ErrorKind::Upstream | ErrorKind::Timeout | ErrorKind::Internal => Self::Engine,
            // Config, Denied, Storage, Integrity (and any kind added later): configuration, refusals,
            // agenthold's own storage, records that do not open; neither the sandbox call's input nor the
            // engine.
            _ => Self::Base,
        }
    }

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

/// Classify an error of kind `kind` with the message `message`; returns the class and the message.
pub(crate) fn classify(kind: ErrorKind, message: String) -> (Class, String) {
    let message = if kind == ErrorKind::Conflict {
        // A conflict (the engine's 409): the sandbox is not in a state for this (stopped, for an exec).
        format!("{message} (start the sandbox with start() first)")
    } else {
        message
    };
    (Class::of(kind), message)
}

/// A sandbox-runtime error as a Python exception.
#[expect(
    clippy::needless_pass_by_value,
    reason = "called as `map_err(…)`, which hands the error over"
)]
pub(crate) fn sandbox_err(e: agenthold_sandbox::Error) -> PyErr {
    let (class, message) = classify(e.kind(), e.to_string());
    class.err(message)
}

/// A core error as a Python exception.
#[expect(
    clippy::needless_pass_by_value,
    reason = "called as `map_err(…)`, which hands the error over"
)]
pub(crate) fn core_err(e: agenthold_core::Error) -> PyErr {
    let (class, message) = classify(e.kind(), e.to_string());
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
