//! `agenthold serve`: the reference server driven from outside, over HTTP and its admin commands, against
//! the real Docker engine. [`support`] starts one server per test (own data dir, free port) and sweeps its
//! engine objects afterwards.
//!
//! - [`matrix`]: every operation of the OpenAPI document × every role × both credentials (S5, S7).
//! - [`bad_input`]: malformed requests, refused credentials, rate limits, cross-origin writes.
//! - [`crash`]: `kill -9` during a burst of writes; what was acknowledged survives, egress comes back.
//! - [`login`]: OIDC and GitHub logins against provider stand-ins ([`login_standins`]), invitations, cookies.

mod bad_input;
#[allow(
    dead_code,
    reason = "shared by the server tests; not every test uses every helper"
)]
pub(crate) mod client;
mod crash;
mod execs;
mod files;
#[allow(dead_code, reason = "shared by the exec, file and terminal tests")]
pub(crate) mod fixture;
mod login;
#[allow(dead_code, reason = "stand-ins expose more than every test uses")]
mod login_standins;
#[allow(dead_code, reason = "shared by the login tests")]
mod login_support;
mod matrix;
mod provider_logins;
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
