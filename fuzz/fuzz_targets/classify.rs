//! Fuzz target `classify`: arbitrary bytes as the first bytes of a connection: no panic, a decided prefix
//! decides what the whole decides, the cap always decides, and nothing the strict HTTP or TLS parser
//! accepts is classified as other TCP (E23: bytes that are HTTP are decided by Host, never spliced unread).
//!
//! The checks are `agenthold-egress/src/sniff/invariants.rs`, included here by path; `cargo test -p
//! agenthold-egress` runs the same file on every input in `fuzz/seeds/classify/` and
//! `fuzz/regressions/classify/`.
#![no_main]

// The shared checks name `super::` items: at the crate root, that is this re-export.
use agenthold_egress::sniff::*;

#[allow(dead_code)]
#[path = "../../agenthold-egress/src/sniff/invariants.rs"]
mod invariants;

libfuzzer_sys::fuzz_target!(|data: &[u8]| invariants::classify_first_bytes(data));
