//! Sandboxes wired to the egress gateway (E1, E2, E12, E14, S1, S2, S4, S12, P1).
//!
//! - [`image`]: images built without a registry (`agenthold/dev`, the sandboxd image).
#![forbid(unsafe_code)]

mod archive;
pub mod docker;
pub mod engine;
mod error;
pub mod holder;
pub mod hostfw;
pub mod image;
pub mod network;
mod runtime;
mod table;
pub mod tunnel;

pub use docker::{DockerConfig, DockerSandbox};
pub use engine::Engine;
pub use runtime::{Runtime, RuntimeBuilder};

pub use error::{Error, Result};
