//! Fuzz target: see `agenthold_fuzz::policy_entry` for what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agenthold_fuzz::policy_entry::check(data));
