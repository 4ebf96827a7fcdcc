//! The invariants each fuzz target checks, one module per target. Every module is a single file that only
//! uses `agenthold_core`, `base64` and `std`, so `agenthold-core/tests` include the same files by
//! path and replay `fuzz/regressions/<target>/` through exactly these checks under plain `cargo test`.
#![forbid(unsafe_code)]

pub mod policy_entry;
pub mod run_request;
pub mod template_parse;
pub mod template_render;
pub mod tunnel_send;
pub mod webhook_prompt;
