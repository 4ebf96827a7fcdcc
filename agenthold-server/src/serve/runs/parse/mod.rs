//! Harness output lines to normalised [`EventKind`]s. Each harness has its parser ([`claude`] for
//! `--output-format stream-json`, [`codex`] for `exec --json`); a custom command's lines go to whichever
//! of the two recognises them. The parsers read untrusted bytes: anything they do not recognise becomes a
//! `raw` event, nothing panics, and no line is ever interpreted beyond building an event.
// enforces: P1

pub(crate) mod claude;
pub(crate) mod codex;

use super::Harness;
use super::events::{EventKind, Stream};

/// A line that was not recognised.
pub(crate) fn raw(line: &str) -> EventKind {
    EventKind::Raw {
        stream: Stream::Stdout,
        line: line.to_owned(),
    }
}

/// The parser of one run.
#[derive(Debug)]
pub(crate) struct Parser {
    harness: Harness,
    claude: claude::Claude,
    codex: codex::Codex,
}

impl Parser {
    /// A parser for `harness`'s standard output.
    pub(crate) fn new(harness: Harness) -> Self {
        Self {
            harness,
            claude: claude::Claude,
            codex: codex::Codex::default(),
        }
    }

    /// The events of one line of standard output (none for a line that only carries bookkeeping).
    pub(crate) fn line(&mut self, line: &str) -> Vec<EventKind> {
        let parsed = match self.harness {
            Harness::Claude => self.claude.line(line),
            Harness::Codex => self.codex.line(line),
            Harness::Custom => self.claude.line(line).or_else(|| self.codex.line(line)),
        };
        parsed.unwrap_or_else(|| vec![raw(line)])
    }

    /// Standard output ended: what a parser still holds.
    pub(crate) fn finish(&mut self) -> Vec<EventKind> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL: [&str; 6] = [
        r#"{"type":"system","subtype":"init","session_id":"s","model":"m"}"#,
        r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"tool_use","id":"t","name":"Bash","input":{"command":"ls"}}]}}"#,
        r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}],"is_error":false}]}}"#,
        r#"{"type":"result","subtype":"success","is_error":false,"result":"r","session_id":"s","total_cost_usd":0.1,"usage":{"input_tokens":1,"output_tokens":2}}"#,
        r#"{"type":"item.completed","item":{"id":"i","type":"command_execution","command":"ls","aggregated_output":"a","exit_code":0,"status":"completed"}}"#,
        r#"{"type":"turn.completed","usage":{"input_tokens":1,"cached_input_tokens":0,"output_tokens":2}}"#,
    ];

    // covers: P1
    #[test]
    fn every_cut_and_splice_of_real_lines_parses_without_a_panic() {
        let noise = [
            '"', '{', '}', '[', ']', ':', ',', '\\', '\u{0}', '\u{fffd}', '9', '-',
        ];
        for harness in [Harness::Claude, Harness::Codex, Harness::Custom] {
            let mut p = Parser::new(harness);
            for line in REAL {
                assert!(!p.line(line).is_empty());
                let chars: Vec<char> = line.chars().collect();
                for i in 0..chars.len() {
                    let cut: String = chars[..i].iter().collect();
                    let events = p.line(&cut);
                    assert!(!events.is_empty() || cut.trim().starts_with('{'), "{cut}");
                    for n in noise {
                        let mut spliced = chars.clone();
                        spliced[i] = n;
                        let spliced: String = spliced.into_iter().collect();
                        let _ = p.line(&spliced);
                    }
                }
            }
            assert!(p.finish().is_empty());
        }
    }

    // covers: P1
    #[test]
    fn a_custom_harness_reads_either_format_and_keeps_the_rest_raw() {
        let mut p = Parser::new(Harness::Custom);
        assert_eq!(p.line(REAL[0])[0].name(), "session");
        assert_eq!(p.line(REAL[4])[0].name(), "tool_call");
        assert_eq!(p.line("plain text"), [raw("plain text")]);
        // A Claude parser does not read Codex lines (and the other way round): they stay raw.
        assert_eq!(Parser::new(Harness::Claude).line(REAL[4])[0].name(), "raw");
        assert_eq!(Parser::new(Harness::Codex).line(REAL[0])[0].name(), "raw");
    }
}
