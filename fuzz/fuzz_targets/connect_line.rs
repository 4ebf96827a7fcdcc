//! Fuzz target `connect_line`: arbitrary bytes as an authority for `split_host_port` (what it accepts
//! round-trips) and as the target and Host of a CONNECT head (accepted exactly when `split_host_port` accepts
//! it, same host and port).
//!
//! The checks are `agenthold-egress/src/sniff/invariants.rs`, included here by path; `cargo test -p
//! agenthold-egress` runs the same file on every input in `fuzz/seeds/connect_line/` and
//! `fuzz/regressions/connect_line/`.
#![no_main]

// The shared checks name `super::` items: at the crate root, that is this re-export.
use agenthold_egress::sniff::*;

#[allow(dead_code)]
#[path = "../../agenthold-egress/src/sniff/invariants.rs"]
mod invariants;

libfuzzer_sys::fuzz_target!(|data: &[u8]| invariants::connect_line(data));
