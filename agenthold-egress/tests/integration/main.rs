//! agenthold-egress integration tests: one binary, one module per subject.
//!
//! Privileged tests (network namespaces, nftables) are `#[ignore]`d with the reason and run by
//! `make test` (`cargo test -- --include-ignored`), as root. Each builds its own `TestNet` (unique names
//! and subnets), so they run in parallel, and each asserts that its namespaces are gone at the end.
//! Nothing here sends a packet beyond loopback or the namespaces the test created: "outside" addresses
//! (93.184.216.34, 1.1.1.1, …) are only ever destinations that the gateway's rules redirect or drop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod attach;
mod datapath;
mod density;
mod gateway;
mod isolation;
mod netns;
mod ruleset;
mod support;
