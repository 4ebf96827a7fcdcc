//! A run's normalised events (the same for every harness, so the API and UI do not depend on one) and the
//! bounded, numbered log that keeps them: past [`MAX_EVENT_BYTES`] the oldest events are dropped and the run
//! is marked truncated, so memory per run stays bounded however much a harness prints.
// enforces: P1

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::record::RunState;

/// Bytes of events (as JSON) kept per run.
pub(crate) const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// One event of a run, numbered from 1 (SSE id `<run>.<n>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunEvent {
    /// Its number in the run's stream.
    pub(crate) n: u64,
    /// What happened.
    #[serde(flatten)]
    pub(crate) kind: EventKind,
}

/// Which output stream a raw line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// What an event says (its JSON form, with `type`, is the SSE `data:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum EventKind {
    /// The harness's session started (Claude `system`/`init`, Codex `thread.started`).
    Session {
        /// The session to pass as `resume` later.
        session_id: String,
        /// The model, when the harness says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    /// Text from the model (`assistant`), the user, or the model's reasoning (`reasoning`).
    Message {
        /// `assistant`, `user`, `reasoning` or `error`.
        role: String,
        /// The text.
        text: String,
    },
    /// The model called a tool.
    ToolCall {
        /// The call's id, when the harness gives one (matches a `tool_result`'s `id`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// The tool.
        name: String,
        /// Its input as the harness gave it.
        input: serde_json::Value,
    },
    /// A tool answered.
    ToolResult {
        /// The call's id, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// Its output as text.
        output: String,
        /// Whether the tool failed.
        is_error: bool,
    },
    /// Tokens (and cost) used so far (Claude: for the whole run; Codex: for one turn).
    Usage {
        /// Input tokens.
        input_tokens: u64,
        /// Output tokens.
        output_tokens: u64,
        /// Cost in US dollars, when the harness reports it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
    },
    /// The harness's final answer.
    Result {
        /// The answer's text.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// Whether the harness reports a failure.
        is_error: bool,
        /// Its session.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_id: Option<String>,
    },
    /// A line that was not parsed.
    Raw {
        /// Where it came from.
        stream: Stream,
        /// The line (invalid UTF-8 replaced by U+FFFD; a line past the line cap cut and marked).
        line: String,
    },
    /// The run's state changed.
    State {
        /// The new state.
        state: RunState,
    },
    /// The last event.
    End {
        /// How the run ended.
        state: RunState,
        /// The harness's exit code, when known.
        exit_code: Option<i64>,
    },
}

impl EventKind {
    /// The SSE event name (the `type`).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Session { .. } => "session",
            Self::Message { .. } => "message",
            Self::ToolCall { .. } => "tool_call",
            Self::ToolResult { .. } => "tool_result",
            Self::Usage { .. } => "usage",
            Self::Result { .. } => "result",
            Self::Raw { .. } => "raw",
            Self::State { .. } => "state",
            Self::End { .. } => "end",
        }
    }

    /// Bytes it counts against the cap (its JSON size).
    fn size(&self) -> usize {
        serde_json::to_vec(self).map_or(0, |v| v.len())
    }
}

/// The retained events of one run.
#[derive(Debug)]
pub(crate) struct EventLog {
    events: VecDeque<(RunEvent, usize)>,
    bytes: usize,
    next_n: u64,
    truncated: bool,
    ended: bool,
    cap: usize,
}

impl EventLog {
    /// An empty log that keeps at most `cap` bytes of events.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            events: VecDeque::new(),
            bytes: 0,
            next_n: 1,
            truncated: false,
            ended: false,
            cap,
        }
    }

    /// The log of an ended run as the store kept it; without stored events (a run lost in a restart), its
    /// final `state` and `end`.
    pub(crate) fn ended(events: Option<Vec<RunEvent>>, state: RunState, exit_code: Option<i64>) -> Self {
        let mut log = Self::new(MAX_EVENT_BYTES);
        match events {
            Some(events) if !events.is_empty() => {
                log.next_n = events.last().map_or(1, |e| e.n + 1);
                for e in events {
                    let size = e.kind.size();
                    log.bytes += size;
                    log.events.push_back((e, size));
                }
                log.ended = true;
            }
            _ => log.finish(state, exit_code),
        }
        log
    }

    /// Append an event (ignored once ended); drops the oldest past the cap.
    pub(crate) fn push(&mut self, kind: EventKind) {
        if self.ended {
            return;
        }
        let size = kind.size();
        self.bytes += size;
        self.events.push_back((RunEvent { n: self.next_n, kind }, size));
        self.next_n += 1;
        // Never drop the newest event: a single event larger than the cap is bounded by the line cap.
        while self.bytes > self.cap && self.events.len() > 1 {
            let Some((_, size)) = self.events.pop_front() else {
                break;
            };
            self.bytes -= size;
            self.truncated = true;
        }
    }

    /// The run ended: its final `state` and `end`.
    pub(crate) fn finish(&mut self, state: RunState, exit_code: Option<i64>) {
        if self.ended {
            return;
        }
        self.push(EventKind::State { state });
        self.push(EventKind::End { state, exit_code });
        self.ended = true;
    }

    /// The retained events after event `n`.
    pub(crate) fn after(&self, n: u64) -> Vec<RunEvent> {
        let start = self.events.partition_point(|(e, _)| e.n <= n);
        self.events.range(start..).map(|(e, _)| e.clone()).collect()
    }

    /// The number of the newest event (0 before the first).
    pub(crate) fn latest(&self) -> u64 {
        self.next_n - 1
    }

    /// Whether the `end` event is in.
    pub(crate) fn is_ended(&self) -> bool {
        self.ended
    }

    /// Whether older events were dropped.
    pub(crate) fn truncated(&self) -> bool {
        self.truncated
    }

    /// Mark the log truncated (raw output was dropped elsewhere).
    pub(crate) fn mark_truncated(&mut self) {
        self.truncated = true;
    }

    /// Every retained event.
    pub(crate) fn all(&self) -> Vec<RunEvent> {
        self.events.iter().map(|(e, _)| e.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(line: &str) -> EventKind {
        EventKind::Raw {
            stream: Stream::Stdout,
            line: line.to_owned(),
        }
    }

    #[test]
    fn events_are_numbered_end_last_and_nothing_follows_the_end() {
        let mut log = EventLog::new(1024);
        log.push(raw("a"));
        log.finish(RunState::Succeeded, Some(0));
        log.push(raw("late"));
        let names: Vec<_> = log.all().iter().map(|e| (e.n, e.kind.name())).collect();
        assert_eq!(names, [(1, "raw"), (2, "state"), (3, "end")]);
        assert_eq!(log.after(1).len(), 2);
        let json = serde_json::to_value(&log.all()[2]).unwrap();
        assert_eq!(json["type"], "end");
        assert_eq!(json["state"], "succeeded");
        assert_eq!(json["exit_code"], 0);
    }

    #[test]
    fn past_the_cap_the_oldest_go_and_the_log_is_truncated() {
        let mut log = EventLog::new(200);
        for i in 0..20 {
            log.push(raw(&format!("line {i}")));
        }
        assert!(log.truncated());
        assert!(log.all()[0].n > 1);
        assert_eq!(log.latest(), 20);
        let back: Vec<RunEvent> = serde_json::from_str(&serde_json::to_string(&log.all()).unwrap()).unwrap();
        assert_eq!(back, log.all());
        let lost = EventLog::ended(None, RunState::Lost, None);
        let kinds: Vec<_> = lost.all().iter().map(|e| e.kind.name()).collect();
        assert_eq!(kinds, ["state", "end"]);
    }
}
