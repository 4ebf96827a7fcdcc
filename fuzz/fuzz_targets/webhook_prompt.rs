//! Fuzz target: see `agenthold_fuzz::webhook_prompt` for what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agenthold_fuzz::webhook_prompt::check(data));
