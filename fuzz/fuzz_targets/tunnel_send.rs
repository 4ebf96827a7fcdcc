//! Fuzz target: see `agenthold_fuzz::tunnel_send` for what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agenthold_fuzz::tunnel_send::check(data));
