//! The `SEND` request (P3): one agent asks for a run of another agent in its workspace. It is carried twice
//! with the same bytes: from `agenthold-send` to `sandboxd boot` over [`crate::contract::SEND_SOCKET`], and
//! from `sandboxd boot` to the runtime over a fresh tunnel connection after an accepted hello.
//!
//! ```text
//! SEND <harness> <name-bytes> <prompt-bytes>\n<name><prompt>
//! ```
//!
//! `<harness>` is `claude` or `codex`; `<name-bytes>` and `<prompt-bytes>` are decimal lengths (no sign, no
//! leading zero) of the target agent's name (1 to [`MAX_NAME`] bytes of UTF-8 without control characters)
//! and of the prompt (0 to [`MAX_PROMPT`] bytes of UTF-8) that follow the line, in that order. The answer
//! is one line: `STARTED <run-id>\n` or `ERR <reason>\n`; then the connection closes. One request per
//! connection. There is no sender field: the runtime knows the sender by the tunnel listener the request
//! arrived on (S4).

use super::Duration;

/// First word of the request line.
pub const SEND: &str = "SEND";
/// First word of the answer to an accepted request (`STARTED <run-id>`).
pub const STARTED: &str = "STARTED";
/// Largest prompt in bytes (256 KiB, as the runs API).
pub const MAX_PROMPT: usize = 256 * 1024;
/// Largest target name in bytes (an agent name is at most 100 characters).
pub const MAX_NAME: usize = 400;
/// Largest run id in an answer.
pub const MAX_RUN_ID: usize = 128;
/// Longest refusal reason the runtime sends (bytes, before the newline).
pub const MAX_REASON: usize = 200;
/// How long the runtime waits for the request line and body once the hello is accepted.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the sender waits for the answer (the runtime starts the run before it answers).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The harness a message starts on the target (a custom command cannot be asked for by an agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Harness {
    /// Claude Code (`claude`), the default.
    Claude,
    /// Codex (`codex`).
    Codex,
}

impl Harness {
    /// The word on the wire and on the command line.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Claude => "claude",
            Self::Codex => "codex",
        }
    }

    /// The harness named `word`, if any.
    #[must_use]
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "claude" => Some(Self::Claude),
            "codex" => Some(Self::Codex),
            _ => None,
        }
    }
}

/// A parsed request line: what follows it on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendHead {
    /// The harness to run on the target.
    pub harness: Harness,
    /// Bytes of the target name that follow the line.
    pub name_len: usize,
    /// Bytes of the prompt that follow the name.
    pub prompt_len: usize,
}

impl SendHead {
    /// Bytes that follow the line.
    #[must_use]
    pub fn body_len(&self) -> usize {
        self.name_len + self.prompt_len
    }
}

/// Why a request is refused before it reaches the runtime's hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// Not `SEND <harness> <n> <n>`.
    Malformed,
    /// A harness other than `claude` or `codex`.
    UnknownHarness,
    /// The name is empty, too long, not UTF-8 or has control characters.
    BadName,
    /// The prompt is over [`MAX_PROMPT`].
    PromptTooLarge,
    /// The prompt is not UTF-8.
    BadPrompt,
}

impl SendError {
    /// The reason sent in `ERR <reason>`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed SEND request",
            Self::UnknownHarness => "unknown harness (claude or codex)",
            Self::BadName => "bad agent name",
            Self::PromptTooLarge => "prompt too large (at most 262144 bytes)",
            Self::BadPrompt => "prompt is not UTF-8",
        }
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for SendError {}

/// A decimal length: digits only, no leading zero (except `0` itself), at most `max`.
fn length(word: &str, max: usize) -> Option<usize> {
    if word.is_empty() || word.len() > 7 || !word.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if word.len() > 1 && word.starts_with('0') {
        return None;
    }
    word.parse::<usize>().ok().filter(|n| *n <= max)
}

/// Parses a request line (without its newline). Exactly four words separated by single spaces.
///
/// # Errors
/// [`SendError`] saying what is wrong; [`SendError::PromptTooLarge`] only for a well-formed line.
pub fn parse_send(line: &str) -> Result<SendHead, SendError> {
    let mut words = line.split(' ');
    let (Some(SEND), Some(harness), Some(name), Some(prompt), None) = (
        words.next(),
        words.next(),
        words.next(),
        words.next(),
        words.next(),
    ) else {
        return Err(SendError::Malformed);
    };
    let harness = if harness.bytes().all(|b| b.is_ascii_lowercase()) && !harness.is_empty() {
        Harness::parse(harness).ok_or(SendError::UnknownHarness)?
    } else {
        return Err(SendError::Malformed);
    };
    let name_len = match length(name, MAX_NAME) {
        Some(0) => return Err(SendError::BadName),
        Some(n) => n,
        None if name.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty() => {
            return Err(SendError::BadName);
        }
        None => return Err(SendError::Malformed),
    };
    let prompt_len = match length(prompt, MAX_PROMPT) {
        Some(n) => n,
        None if prompt.bytes().all(|b| b.is_ascii_digit())
            && !prompt.is_empty()
            && !prompt.starts_with('0') =>
        {
            return Err(SendError::PromptTooLarge);
        }
        None => return Err(SendError::Malformed),
    };
    Ok(SendHead {
        harness,
        name_len,
        prompt_len,
    })
}

/// Whether `name` can be a target name: 1 to [`MAX_NAME`] bytes, no control characters.
#[must_use]
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME && !name.chars().any(char::is_control)
}

/// Splits and checks the body that follows a request line: the target name and the prompt.
///
/// # Errors
/// [`SendError::Malformed`] when `body` is not `head.body_len()` bytes; [`SendError::BadName`] or
/// [`SendError::BadPrompt`] when a part is not acceptable.
pub fn parse_body<'a>(head: &SendHead, body: &'a [u8]) -> Result<(&'a str, &'a str), SendError> {
    if body.len() != head.body_len() {
        return Err(SendError::Malformed);
    }
    let (name, prompt) = body.split_at(head.name_len);
    let name = std::str::from_utf8(name).map_err(|_| SendError::BadName)?;
    if !valid_name(name) {
        return Err(SendError::BadName);
    }
    let prompt = std::str::from_utf8(prompt).map_err(|_| SendError::BadPrompt)?;
    Ok((name, prompt))
}

/// The whole request as sent: line, name, prompt.
///
/// # Errors
/// [`SendError`] when the name or prompt cannot be sent (so a sender fails before connecting).
pub fn request(harness: Harness, name: &str, prompt: &str) -> Result<Vec<u8>, SendError> {
    if !valid_name(name) {
        return Err(SendError::BadName);
    }
    if prompt.len() > MAX_PROMPT {
        return Err(SendError::PromptTooLarge);
    }
    let mut out = format!("{SEND} {} {} {}\n", harness.as_str(), name.len(), prompt.len()).into_bytes();
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(prompt.as_bytes());
    Ok(out)
}

/// Whether `id` can be a run id in an answer: `[A-Za-z0-9_.-]{1,128}`.
#[must_use]
pub fn valid_run_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_RUN_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The answer to an accepted request, newline included.
#[must_use]
pub fn started(run_id: &str) -> String {
    format!("{STARTED} {run_id}\n")
}

/// `reason` made safe for an `ERR` line: control characters become spaces, cut at [`MAX_REASON`] bytes on a
/// character boundary, never empty.
#[must_use]
pub fn clean_reason(reason: &str) -> String {
    let mut out = String::new();
    for c in reason.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if out.len() + c.len_utf8() > MAX_REASON {
            break;
        }
        out.push(c);
    }
    let out = out.trim().to_owned();
    if out.is_empty() { "refused".to_owned() } else { out }
}

/// An answer as the sender reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// `STARTED <run-id>`.
    Started(String),
    /// `ERR <reason>`.
    Refused(String),
}

/// Parses an answer line (without its newline).
///
/// # Errors
/// `Err(())` when the line is neither a `STARTED` with a valid run id nor an `ERR`.
#[allow(clippy::result_unit_err)]
pub fn parse_answer(line: &[u8]) -> Result<Answer, ()> {
    let line = std::str::from_utf8(line).map_err(|_| ())?;
    if let Some(id) = line.strip_prefix(STARTED).and_then(|r| r.strip_prefix(' ')) {
        return if valid_run_id(id) {
            Ok(Answer::Started(id.to_owned()))
        } else {
            Err(())
        };
    }
    match line.strip_prefix(super::ERR) {
        Some(reason) => Ok(Answer::Refused(clean_reason(reason))),
        None => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips() {
        let req = request(Harness::Codex, "Büro agent", "hi\nthere").unwrap_or_default();
        let text = String::from_utf8_lossy(&req).into_owned();
        let (line, body) = text.split_once('\n').unwrap_or_default();
        assert_eq!(line, "SEND codex 11 8");
        let head = parse_send(line).map_err(|e| e.to_string());
        assert_eq!(
            head,
            Ok(SendHead {
                harness: Harness::Codex,
                name_len: 11,
                prompt_len: 8
            })
        );
        let Ok(head) = head else { return };
        assert_eq!(
            parse_body(&head, body.as_bytes()),
            Ok(("Büro agent", "hi\nthere"))
        );
        let empty = request(Harness::Claude, "b", "").unwrap_or_default();
        assert_eq!(empty, b"SEND claude 1 0\nb");
    }

    #[test]
    fn malformed_lines_are_refused() {
        for bad in [
            "",
            "SEND",
            "SEND claude 1",
            "SEND claude 1 2 3",
            "send claude 1 2",
            "SEND  claude 1 2",
            "SEND claude 1 2 ",
            "SEND claude +1 2",
            "SEND claude 1 -2",
            "SEND claude 1 02",
            "SEND claude 0x1 2",
            "SEND claude 1 2\r",
            "SEND Claude 1 2",
            "SEND claude\t1 2",
            "SEND claude 1 99999999999999999999",
        ] {
            assert!(parse_send(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_send("SEND custom 1 2"), Err(SendError::UnknownHarness));
        assert_eq!(parse_send("SEND claude 0 2"), Err(SendError::BadName));
        assert_eq!(parse_send("SEND claude 401 2"), Err(SendError::BadName));
        assert_eq!(parse_send("SEND claude 1 262145"), Err(SendError::PromptTooLarge));
        assert!(parse_send("SEND claude 400 262144").is_ok());
    }

    #[test]
    fn bodies_are_checked() {
        let head = SendHead {
            harness: Harness::Claude,
            name_len: 2,
            prompt_len: 1,
        };
        assert_eq!(parse_body(&head, b"ab"), Err(SendError::Malformed));
        assert_eq!(parse_body(&head, b"a\nb"), Err(SendError::BadName));
        assert_eq!(parse_body(&head, b"\xffab"), Err(SendError::BadName));
        assert_eq!(parse_body(&head, b"ab\xff"), Err(SendError::BadPrompt));
        assert_eq!(request(Harness::Claude, "", "x"), Err(SendError::BadName));
        assert_eq!(
            request(Harness::Claude, "a", &"x".repeat(MAX_PROMPT + 1)),
            Err(SendError::PromptTooLarge)
        );
    }

    #[test]
    fn answers_parse() {
        assert_eq!(
            parse_answer(b"STARTED run_1"),
            Ok(Answer::Started("run_1".into()))
        );
        assert_eq!(parse_answer(b"ERR no"), Ok(Answer::Refused("no".into())));
        for bad in [&b"STARTED"[..], b"STARTED ", b"STARTED a b", b"OK", b"\xff"] {
            assert_eq!(parse_answer(bad), Err(()), "{bad:?}");
        }
        assert_eq!(started("run_1"), "STARTED run_1\n");
        assert_eq!(clean_reason("a\nb"), "a b");
        assert_eq!(clean_reason(""), "refused");
        assert!(clean_reason(&"é".repeat(500)).len() <= MAX_REASON);
    }
}
