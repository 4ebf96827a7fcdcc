//! Fuzz target `tunnel_hello`: arbitrary bytes as the first line a sandbox sends the tunnel server
//! (`sandboxd::contract::tunnel::parse_hello`, S2). Never panics; what it accepts has an agent and a token
//! of printable ASCII only, and the hello written back from them parses to the same two words.
#![no_main]

use sandboxd::contract::tunnel::{MAX_LINE, hello, parse_hello};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The server reads at most MAX_LINE bytes and only UTF-8 lines.
    let Ok(line) = std::str::from_utf8(&data[..data.len().min(MAX_LINE)]) else {
        return;
    };
    if let Ok(h) = parse_hello(line) {
        for word in [h.agent, h.token] {
            assert!(!word.is_empty() && word.bytes().all(|b| b.is_ascii_graphic()), "{word:?}");
        }
        let again = hello(h.agent, h.token);
        let again = again.strip_suffix('\n').unwrap_or(&again);
        assert_eq!(parse_hello(again), Ok(h), "{line:?}");
    }
});
