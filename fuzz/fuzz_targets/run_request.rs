//! Fuzz target: see `agenthold_fuzz::run_request` for what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agenthold_fuzz::run_request::check(data));
