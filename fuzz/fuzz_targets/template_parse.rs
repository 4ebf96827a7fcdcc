//! Fuzz target: see `agenthold_fuzz::template_parse` for what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agenthold_fuzz::template_parse::check(data));
