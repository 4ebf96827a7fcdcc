//! Fuzz target: one DNS query packet (and the fake upstream's answer) through the gateway's per-query logic,
//! `agenthold_egress::dns::Server::answer`, without a network. What is checked is in the included file,
//! which `agenthold-egress/tests/dns` also uses to replay `fuzz/regressions/dns_message/`.
#![no_main]

#[path = "../../agenthold-egress/tests/dns/fuzz_check.rs"]
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
mod fuzz_check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_check::check(data));
