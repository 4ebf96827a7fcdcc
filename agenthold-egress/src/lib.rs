//! The egress gateway (E3–E9, E13–E16, E20, E22), usable without Docker.
//!
//! - [`gateway`]: the entry point, [`Gateway::builder`]: per agent, serve the transparent proxy, the
//!   explicit proxy and DNS on sockets the caller bound inside the gateway's network namespace.
//! - [`ca`]: the installation's CA and the leaf certificates of intercepted hosts.
//! - [`guard`]: the address guard that decides whether an upstream address may ever be dialled: the IANA
//!   special-purpose registries row by row, provider endpoints, the deny list and the host's own addresses.
//! - [`dns`]: the resolver sandboxes talk to, and the gateway's own upstream DNS client.
//! - [`sniff`]: parsers of the first bytes a sandbox sends (TLS ClientHello, HTTP request heads, CONNECT).
//! - [`log`]: the per-agent request log.
//! - [`netns`]: opening sockets and running commands inside another network namespace.
//! - [`nft`]: the nftables ruleset of the gateway's network namespace.
//! - [`datapath`]: the one composition of the above for serving agents inside a network namespace
//!   ([`Datapath`]: rules, listeners at each agent's `.2`, gateway attachment) and the one sandbox
//!   environment ([`datapath::sandbox_env`]).
//! - [`stack`]: the gateway with its default parts (policy table, secret table, the installation's CA).
//!
//! - [`budget`]: connection, descriptor and request budgets per agent and for the whole gateway (E20).
//!
//! Internally, modules import each other one way (checked by `tests/layering.rs`). `gateway` builds the
//! shared `context` (policy, injector, log, dialer, upstream clients, budgets) and wires the rest per agent;
//! nothing below imports it. A connection runs down the layers and never calls back up: `transparent` and
//! `explicit` accept connections (`accept`; the explicit proxy answers CONNECT itself), `flow` decides
//! what a connection's bytes are (TLS by SNI, HTTP by Host, other TCP by resolved name; E23) for both,
//! `intercept` terminates TLS for secret rule hosts, `http` handles requests (the injector's step in
//! `inject`, token refreshes in `refresh`, the gateway's own answers in `reply`), `scrub` removes secret
//! values from the answers of intercepted hosts (E19), `upstream` is the pooled upstream client, `dial`
//! resolves and guards upstream addresses, `open` tracks long-lived connections and closes those a policy
//! change denies (E21), and `io` splices bytes.
#![forbid(unsafe_code)]

mod accept;
pub mod budget;
pub mod ca;
mod context;
pub mod datapath;
mod dial;
pub mod dns;
mod error;
mod explicit;
mod flow;
pub mod gateway;
pub mod guard;
mod http;
mod inject;
mod intercept;
mod io;
pub mod log;
pub mod netns;
pub mod nft;
mod open;
mod refresh;
mod reply;
mod scrub;
pub mod sniff;
pub mod stack;
mod target;
mod tls;
mod transparent;
mod upstream;

pub use ca::CertificateAuthority;
pub use datapath::{Attachment, CaPaths, Datapath, sandbox_env};
pub use dial::{DialError, Resolve};
pub use error::{Error, Result};
pub use gateway::{
    AgentSockets, AgentStats, Dangerous, Gateway, GatewayBuilder, GatewayStats, Limits, Timeouts,
};
pub use log::{LogEntry, RequestLog};
pub use stack::{EgressStack, EgressStackBuilder};
