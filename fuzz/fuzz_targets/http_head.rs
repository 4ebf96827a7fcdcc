//! Fuzz target `http_head`: arbitrary bytes parsed as an HTTP/1.x request head whole and in two chunks: no
//! panic, a decided prefix decides what the whole decides, an accepted head ends with CRLF CRLF within 64
//! KiB, re-parses the same alone, has a destination, and its Host agrees with its target.
//!
//! The checks are `agenthold-egress/src/sniff/invariants.rs`, included here by path; `cargo test -p
//! agenthold-egress` runs the same file on every input in `fuzz/seeds/http_head/` and
//! `fuzz/regressions/http_head/`.
#![no_main]

// The shared checks name `super::` items: at the crate root, that is this re-export.
use agenthold_egress::sniff::*;

#[allow(dead_code)]
#[path = "../../agenthold-egress/src/sniff/invariants.rs"]
mod invariants;

libfuzzer_sys::fuzz_target!(|data: &[u8]| invariants::http_head(data));
