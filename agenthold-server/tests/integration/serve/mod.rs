//! `agenthold serve`: the reference server driven from outside, over HTTP and its admin commands, against
//! the real Docker engine. [`support`] starts one server per test (own data dir, free port) and sweeps its
//! engine objects afterwards.
//!
//! - [`matrix`]: every operation of the OpenAPI document × every role × both credentials (S5, S7).
//! - [`bad_input`]: malformed requests, refused credentials, rate limits, cross-origin writes.
//! - [`runs`]: harness runs with a custom harness (events, replay, cancel, stdin, limits, lost).
//! - [`crash`]: `kill -9` during a burst of writes; what was acknowledged survives, egress comes back.
//! - [`harness`]: the real `claude` and `codex` in a sandbox against provider stand-ins.
//! - [`store_down`]: the server on PostgreSQL while its database goes away and comes back.
//! - [`login`]: OIDC and GitHub logins against provider stand-ins ([`login_standins`]), invitations, cookies.

mod bad_input;
#[allow(
    dead_code,
    reason = "shared by the server tests; not every test uses every helper"
)]
pub(crate) mod client;
mod crash;
mod credentials;
mod execs;
mod files;
#[allow(dead_code, reason = "shared by the exec, file and terminal tests")]
pub(crate) mod fixture;
mod harness;
mod login;
#[allow(dead_code, reason = "stand-ins expose more than every test uses")]
mod login_standins;
#[allow(dead_code, reason = "shared by the login tests")]
mod login_support;
mod matrix;
mod messages;
mod provider_logins;
mod requests;
mod runs;
mod secrets;
mod smoke;
mod store_down;
#[allow(
    dead_code,
    reason = "shared by the server tests; not every test uses every helper"
)]
pub(crate) mod support;
mod terminal;
mod webhooks;
#[allow(
    dead_code,
    reason = "shared by the egress tests; not every test uses every helper"
)]
pub(crate) mod world;
