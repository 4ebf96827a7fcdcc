//! `tunnel_send`: arbitrary bytes as an agent message request (`SEND <harness> <n> <n>\n<name><prompt>`,
//! P3) and as its answer line, through `sandboxd::contract::tunnel`.
//!
//! Parsing never panics; a line is only accepted with lengths within the limits; a request whose body
//! parses is exactly what `request` writes for its parts (one encoding per request, so a relay that
//! re-encodes forwards the same bytes); an answer line parses to a valid run id or a one-line reason.

use sandboxd::contract::tunnel::{
    Answer, MAX_LINE, MAX_NAME, MAX_PROMPT, MAX_REASON, clean_reason, parse_answer, parse_body, parse_send,
    request, valid_run_id,
};

/// Run every check on `data`; panics on a violated invariant.
pub fn check(data: &[u8]) {
    if let Ok(answer) = parse_answer(data) {
        match answer {
            Answer::Started(id) => assert!(valid_run_id(&id), "{id:?}"),
            Answer::Refused(reason) => {
                assert!(!reason.is_empty() && reason.len() <= MAX_REASON, "{reason:?}");
                assert!(!reason.chars().any(char::is_control), "{reason:?}");
            }
        }
    }
    let cleaned = clean_reason(&String::from_utf8_lossy(data));
    assert!(!cleaned.chars().any(char::is_control) && cleaned.len() <= MAX_REASON);

    // The runtime reads at most MAX_LINE bytes up to the newline, and only UTF-8.
    let Some(pos) = data.iter().position(|&b| b == b'\n') else {
        return;
    };
    if pos >= MAX_LINE {
        return;
    }
    let Ok(line) = std::str::from_utf8(&data[..pos]) else {
        return;
    };
    let Ok(head) = parse_send(line) else {
        return;
    };
    assert!(head.name_len >= 1 && head.name_len <= MAX_NAME, "{line:?}");
    assert!(head.prompt_len <= MAX_PROMPT, "{line:?}");
    let body = &data[pos + 1..];
    let Ok((name, prompt)) = parse_body(&head, body) else {
        return;
    };
    assert!(
        !name.is_empty() && !name.chars().any(char::is_control),
        "{name:?}"
    );
    let again = request(head.harness, name, prompt).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    assert_eq!(again.as_slice(), data, "one encoding per request");
}
