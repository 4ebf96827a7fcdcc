//! `webhook_prompt`: the prompt a webhook delivery starts its run with (P2, S8), built from arbitrary
//! instructions and payload bytes. The builder is the server's own file, included by path.
//!
//! Input: the first byte is the length of the instructions (lossily decoded as UTF-8), the rest after them
//! is the payload. Checks: no panic; the builder refuses exactly when the nonce occurs in the embedded
//! payload or the instructions; otherwise the block opens once and closes once as the last line, the nonce
//! occurs only in the two markers, and what stands between them is the payload as sent (valid UTF-8) or
//! standard base64 of its bytes (anything else).

#[path = "../../agenthold-server/src/serve/webhooks/prompt.rs"]
#[allow(dead_code, reason = "the server's module; the fuzz check uses part of it")]
mod prompt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// A fixed nonce: the fuzzer can find it (comparison tracing) and so exercise the refusal.
const NONCE: &str = "0123456789abcdef0123456789abcdef";

/// Run every check on `data`; panics on a violated invariant.
pub fn check(data: &[u8]) {
    let (instructions, payload) = match data.split_first() {
        Some((&n, rest)) => rest.split_at(usize::from(n).min(rest.len())),
        None => (&[][..], &[][..]),
    };
    let instructions = String::from_utf8_lossy(instructions);
    let embedded = match std::str::from_utf8(payload) {
        Ok(text) => text.to_owned(),
        Err(_) => STANDARD.encode(payload),
    };
    let effective = if instructions.trim().is_empty() {
        prompt::DEFAULT_INSTRUCTIONS
    } else {
        instructions.trim_end()
    };
    let must_refuse = embedded.contains(NONCE) || effective.contains(NONCE);
    let Some((built, encoding)) = prompt::build(&instructions, payload, NONCE) else {
        assert!(must_refuse, "refused although the nonce is absent");
        return;
    };
    assert!(!must_refuse, "built although the nonce is in the input");
    assert!(built.starts_with(effective));
    assert_eq!(built.matches(NONCE).count(), 2);
    assert_eq!(built.matches(&prompt::open_marker(NONCE)).count(), 1);
    assert_eq!(built.matches(&prompt::close_marker(NONCE)).count(), 1);
    assert!(built.ends_with(&format!("\n{}\n", prompt::close_marker(NONCE))));
    let (nonce, inner) = prompt::split(&built).expect("the builder's own structure");
    assert_eq!(nonce, NONCE);
    match encoding {
        prompt::Encoding::Text => assert_eq!(inner.as_bytes(), payload),
        prompt::Encoding::Base64 => {
            assert!(std::str::from_utf8(payload).is_err());
            assert_eq!(STANDARD.decode(inner).expect("base64"), payload);
        }
    }
}
