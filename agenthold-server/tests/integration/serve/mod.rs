//! `agenthold serve`: the reference server driven from outside, over HTTP and its admin commands, against
//! the real Docker engine. [`support`] starts one server per test (own data dir, free port) and sweeps its
//! engine objects afterwards.

mod execs;
mod files;
#[allow(dead_code, reason = "shared by the exec, file and terminal tests")]
pub(crate) mod fixture;
mod requests;
mod secrets;
mod smoke;
#[allow(
    dead_code,
    reason = "shared by the server tests; not every test uses every helper"
)]
pub(crate) mod support;
mod terminal;
#[allow(
    dead_code,
    reason = "shared by the egress tests; not every test uses every helper"
)]
pub(crate) mod world;
