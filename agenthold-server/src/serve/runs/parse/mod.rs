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
            claude: claude::Claude::default(),
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
