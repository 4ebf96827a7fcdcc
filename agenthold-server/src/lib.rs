//! The agenthold reference server as a library: [`Server`] composes the defaults (Docker runtime, egress
//! gateway, redb store, role-based authz) behind the HTTP API of `docs/server.md`. The `agenthold` binary's
//! `serve` command is a thin wrapper (load the configuration, build, serve until a signal); platforms and
//! tests build a [`Server`] themselves, around their own runtime if they like.
#![forbid(unsafe_code)]

mod serve;

pub use serve::Server;
pub use serve::admin::{AdminRequest, call as admin_call};
