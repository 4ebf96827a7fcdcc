//! Sandboxes wired to the egress gateway (E1, E2, E12, E14, S1, S2, S4, S12, P1).
//!
//! - [`docker`]: the default [`agenthold_core::Sandbox`], Docker, with everything it needs: the engine
//!   connection, the gateway holder, networks, images built without a registry, the host firewall.
#![forbid(unsafe_code)]

pub mod docker;
mod error;
mod runtime;
mod table;
pub mod tunnel;

pub use docker::{DockerConfig, DockerSandbox};
pub use runtime::{Runtime, RuntimeBuilder};

pub use error::{Error, Result};
