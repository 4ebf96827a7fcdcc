//! Fuzz target: the minimal query parser of the resolver's wire-level hit path,
//! `agenthold_egress::dns::QueryView::parse`, against hickory's parser. What is checked is in the included
//! file, which `agenthold-egress/tests/dns` also runs under plain `cargo test`.
#![no_main]

#[path = "../../agenthold-egress/tests/dns/query_view_check.rs"]
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
mod query_view_check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| query_view_check::check(data));
