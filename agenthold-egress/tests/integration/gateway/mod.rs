//! The real gateway end to end (E3–E9, E16, E17): real nftables in a gateway namespace, the gateway's
//! listeners bound inside it, and real clients (curl, Python) in sandbox namespaces attacking it. Upstreams
//! and the upstream DNS server run on loopback in the test process; the gateway reaches them through
//! `Dangerous::connect_to`, never by switching the address guard off.
//!
//! Every test here is privileged: `#[ignore]`d with the reason, run by `make test`.

mod harness;

mod allowed;
mod budgets;
mod bypass;
mod denied;
mod detach;
mod firewall;
mod host;
mod literals;
mod log;
mod policy;
mod rebinding;
mod resolver;
mod revoke;
mod sniffing;
mod spoofing;
mod tcp;
mod timeouts;
