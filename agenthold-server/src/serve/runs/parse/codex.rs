//! Codex's `exec --json` lines.
// enforces: P1

use super::super::events::EventKind;

/// The state of one run's Codex parser.
#[derive(Debug, Default)]
pub(crate) struct Codex {}

impl Codex {
    /// The events of `line`, or `None` when it is not a Codex line.
    pub(crate) fn line(&mut self, _line: &str) -> Option<Vec<EventKind>> {
        None
    }
}
