//! Claude Code's `--output-format stream-json --verbose` lines.
// enforces: P1

use super::super::events::EventKind;

/// The state of one run's Claude parser.
#[derive(Debug, Default)]
pub(crate) struct Claude {}

impl Claude {
    /// The events of `line`, or `None` when it is not a Claude line.
    pub(crate) fn line(&mut self, _line: &str) -> Option<Vec<EventKind>> {
        None
    }
}
