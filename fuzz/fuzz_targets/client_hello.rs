//! Fuzz target `client_hello`: arbitrary bytes as the first bytes of a connection, parsed as a TLS
//! ClientHello whole and in two chunks (prefix first): no panic, a decided prefix decides what the whole
//! decides, a `Done` hello re-parses the same from exactly its records and needs more one byte short, its SNI
//! is printable ASCII.
//!
//! The checks are `agenthold-egress/src/sniff/invariants.rs`, included here by path; `cargo test -p
//! agenthold-egress` runs the same file on every input in `fuzz/seeds/client_hello/` and
//! `fuzz/regressions/client_hello/`.
#![no_main]

// The shared checks name `super::` items: at the crate root, that is this re-export.
use agenthold_egress::sniff::*;

#[allow(dead_code)]
#[path = "../../agenthold-egress/src/sniff/invariants.rs"]
mod invariants;

libfuzzer_sys::fuzz_target!(|data: &[u8]| invariants::client_hello(data));
