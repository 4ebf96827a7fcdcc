//! Sandboxes wired to the egress gateway (E1, E2, E12, E14, S1, S2, S4, S12, P1).
//!
//! - [`Runtime`]: the embeddable composition of a sandbox runtime, the gateway, policies, secrets and a
//!   store; [`RuntimeBuilder::sandbox_factory`] builds a custom [`agenthold_core::Sandbox`] from the
//!   runtime's parts ([`SandboxContext`]).
//! - [`docker`]: the default [`agenthold_core::Sandbox`], Docker, with everything it needs: the engine
//!   connection, the gateway holder, networks, images built without a registry, the host firewall.
//! - [`fake`]: [`fake::FakeSandbox`], an in-memory `Sandbox` test double.
//! - [`tunnel`]: the tunnel server sandboxd connects to.
#![forbid(unsafe_code)]

pub mod docker;
mod error;
pub mod fake;
mod runtime;
mod table;
pub mod tunnel;

pub use docker::{DockerConfig, DockerSandbox};
pub use runtime::{RefreshListenerFn, Runtime, RuntimeBuilder, SandboxContext};

pub use error::{Error, Result};
