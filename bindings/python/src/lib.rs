//! `agenthold._native`: the native half of the `agenthold` Python package (C4). A thin layer over
//! [`agenthold_sandbox::Runtime`]: the same gateway, policies, secrets and request log as the server.
//!
//! - `runtime`: the runtime object, its tokio runtime, and how calls wait (GIL released, Ctrl-C).
//! - `exec`: commands and streamed output.
//! - `spec`: `Policy` and `Secret`, validated at construction.
//! - `values`: `ExecResult`, `LogEntry`.
//! - `errors`: `agenthold.Error` and its subclasses.
//!
//! The pure-Python half (`python/agenthold`) gives the public classes their final shape (`Runtime`,
//! `Sandbox`, `agenthold.aio`).
//!
//! No `unsafe` here: pyo3's macros carry their own FFI glue.
// enforces: C4
#![forbid(unsafe_code)]

mod errors;
mod exec;
mod runtime;
mod spec;
mod values;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
#[pyo3(name = "_native")]
fn agenthold_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<spec::Policy>()?;
    m.add_class::<spec::Secret>()?;
    m.add_class::<values::ExecResult>()?;
    m.add_class::<values::LogEntry>()?;
    m.add_class::<exec::ExecStream>()?;
    m.add_class::<runtime::NativeRuntime>()?;
    m.add_class::<runtime::Op>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
