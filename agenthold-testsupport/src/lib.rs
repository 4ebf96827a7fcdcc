//! Shared helpers for agenthold's integration tests: loopback upstream servers, a DNS server, network
//! namespaces and privilege checks. Never shipped.
//!
//! - [`require_root`] and [`init_tracing`]: the first two lines of a privileged test.
//! - [`TestNet`]: a sandbox namespace and a gateway namespace joined by veth pairs (one per agent).
//! - [`EchoServer`] and [`TestCa`]: HTTP/HTTPS upstreams on loopback that answer with what they received.
//! - [`TestDns`]: an upstream DNS server on loopback that answers from a table and records every query.
//! - [`TestPostgres`]: a throwaway PostgreSQL server (Debian's `postgresql`) on a loopback port.
//! - [`standin`]: the model providers' APIs (Anthropic Messages, OpenAI Responses) for the real harnesses.
//!
//! Everything binds port 0 and reports the address in use; nothing here sends a packet beyond loopback or
//! the namespaces it created. Privileged tests are marked
//! `#[ignore = "needs root and nftables: run with make test"]` and `make test` runs them with
//! `--include-ignored`, so they never skip silently.
#![forbid(unsafe_code)]
// Test code: a failed setup step should stop the test right there, with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dns;
mod echo;
mod net;
mod postgres;
pub mod standin;
mod tls;

use std::sync::Once;

pub use dns::{DnsQuery, TestDns, Transport};
pub use echo::{EchoRequest, EchoServer, UPSTREAM_MARKER};
pub use net::{TestAgent, TestNet};
pub use postgres::{PG_PASSWORD, PG_USER, TestPostgres};
pub use tls::TestCa;

/// Panics with a clear message unless the test runs as root (uid 0).
///
/// Privileged tests call this first, so that running them unprivileged fails loudly instead of
/// reporting confusing `EPERM`s, or worse, passing without having tested anything.
pub fn require_root() {
    if !nix::unistd::geteuid().is_root() {
        panic!("needs root: run `make test` (or `sudo -E cargo test -- --include-ignored`)");
    }
}

/// Installs one `tracing` subscriber for the whole test binary, writing through the test harness (so
/// output shows only for failing tests). `RUST_LOG` filters it; the default is `debug` for agenthold's
/// crates and `warn` for everything else. Safe to call from every test.
pub fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,agenthold=debug"));
        // Another crate's test helper may have installed one already: keep theirs.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}
