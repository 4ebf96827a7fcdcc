//! The output of one exec as a numbered list of events — `stdout`/`stderr` chunks, then one `exit` and one
//! `end` — kept within a byte cap: past it the oldest chunks are dropped and the exec is marked truncated,
//! so memory per exec stays bounded however much a command prints.
//!
//! A chunk that ends inside a UTF-8 sequence keeps those (at most three) bytes for the next chunk of the
//! same stream, so every chunk's text form is whole characters when the bytes are UTF-8; `data_b64` of the
//! API always carries the exact bytes.

use std::collections::VecDeque;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::record::ExecState;

/// Output bytes kept per exec (in memory while it runs, in the store once it ended).
pub(crate) const MAX_RETAINED: usize = 8 * 1024 * 1024;

/// One event of an exec, numbered from 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredEvent {
    /// Its number in the exec's stream (event id `<exec>.<n>`).
    pub(crate) n: u64,
    /// What happened.
    #[serde(flatten)]
    pub(crate) kind: EventKind,
}

/// What an event says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum EventKind {
    /// Bytes the command wrote to standard output.
    Stdout {
        /// The bytes (base64 in the store).
        #[serde(with = "b64")]
        data: Bytes,
    },
    /// Bytes the command wrote to standard error.
    Stderr {
        /// The bytes (base64 in the store).
        #[serde(with = "b64")]
        data: Bytes,
    },
    /// The command ended.
    Exit {
        /// Its exit code, when known.
        exit_code: Option<i64>,
        /// How it ended.
        state: ExecState,
    },
    /// The last event of the stream.
    End {
        /// How the exec ended.
        state: ExecState,
    },
}

impl EventKind {
    /// The SSE event name.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Stdout { .. } => "stdout",
            Self::Stderr { .. } => "stderr",
            Self::Exit { .. } => "exit",
            Self::End { .. } => "end",
        }
    }

    /// Output bytes it carries.
    fn len(&self) -> usize {
        match self {
            Self::Stdout { data } | Self::Stderr { data } => data.len(),
            _ => 0,
        }
    }
}

/// Bytes as base64 text.
mod b64 {
    use super::{Bytes, Engine, STANDARD};

    pub(super) fn serialize<S: serde::Serializer>(data: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(data))
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        let text = <String as serde::Deserialize>::deserialize(d)?;
        STANDARD
            .decode(text)
            .map(Bytes::from)
            .map_err(serde::de::Error::custom)
    }
}

/// The retained events of one exec.
#[derive(Debug)]
pub(crate) struct Output {
    events: VecDeque<StoredEvent>,
    /// Output bytes in `events`.
    bytes: usize,
    /// The number of the next event.
    next_n: u64,
    truncated: bool,
    ended: bool,
    /// An incomplete UTF-8 sequence at the end of the last chunk, per stream (stdout, stderr).
    held: [Vec<u8>; 2],
    cap: usize,
}

/// How many bytes at the end of `buf` start a UTF-8 sequence that is not complete yet (0 to 3).
fn incomplete_tail(buf: &[u8]) -> usize {
    for back in 1..=buf.len().min(3) {
        let b = buf[buf.len() - back];
        if b & 0xC0 == 0x80 {
            continue;
        }
        let need = match b {
            0xF0.. => 4,
            0xE0.. => 3,
            0xC0.. => 2,
            _ => 1,
        };
        return if need > back { back } else { 0 };
    }
    0
}

impl Output {
    /// An empty output that keeps at most `cap` bytes.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            events: VecDeque::new(),
            bytes: 0,
            next_n: 1,
            truncated: false,
            ended: false,
            held: [Vec::new(), Vec::new()],
            cap,
        }
    }

    /// The output of an ended exec as the store kept it; without stored events (an exec lost in a
    /// restart), just its `exit` and `end`.
    pub(crate) fn ended(events: Option<Vec<StoredEvent>>, exit_code: Option<i64>, state: ExecState) -> Self {
        let mut out = Self::new(MAX_RETAINED);
        match events {
            Some(events) if !events.is_empty() => {
                out.next_n = events.last().map_or(1, |e| e.n + 1);
                out.bytes = events.iter().map(|e| e.kind.len()).sum();
                out.events = events.into();
                out.ended = true;
            }
            _ => out.finish(exit_code, state),
        }
        out
    }

    fn push(&mut self, kind: EventKind) {
        self.bytes += kind.len();
        self.events.push_back(StoredEvent { n: self.next_n, kind });
        self.next_n += 1;
    }

    /// Append a chunk of standard output (`stderr` false) or standard error.
    pub(crate) fn push_output(&mut self, stderr: bool, data: &[u8]) {
        if self.ended {
            return;
        }
        let held = &mut self.held[usize::from(stderr)];
        let mut buf = std::mem::take(held);
        buf.extend_from_slice(data);
        let keep = incomplete_tail(&buf);
        *held = buf.split_off(buf.len() - keep);
        if buf.is_empty() {
            return;
        }
        if buf.len() > self.cap {
            buf.drain(..buf.len() - self.cap);
            self.truncated = true;
        }
        let data = Bytes::from(buf);
        self.push(if stderr {
            EventKind::Stderr { data }
        } else {
            EventKind::Stdout { data }
        });
        while self.bytes > self.cap {
            let Some(old) = self.events.pop_front() else {
                break;
            };
            self.bytes -= old.kind.len();
            self.truncated = true;
        }
    }

    /// The exec ended: flush held bytes, then the `exit` and `end` events.
    pub(crate) fn finish(&mut self, exit_code: Option<i64>, state: ExecState) {
        if self.ended {
            return;
        }
        for stderr in [false, true] {
            let held = std::mem::take(&mut self.held[usize::from(stderr)]);
            if !held.is_empty() {
                let data = Bytes::from(held);
                self.push(if stderr {
                    EventKind::Stderr { data }
                } else {
                    EventKind::Stdout { data }
                });
            }
        }
        self.push(EventKind::Exit { exit_code, state });
        self.push(EventKind::End { state });
        self.ended = true;
    }

    /// The retained events after event `n`.
    pub(crate) fn after(&self, n: u64) -> Vec<StoredEvent> {
        let start = self.events.partition_point(|e| e.n <= n);
        self.events.range(start..).cloned().collect()
    }

    /// The number of the newest event (0 before the first).
    pub(crate) fn latest(&self) -> u64 {
        self.next_n - 1
    }

    /// Whether the `end` event is in.
    pub(crate) fn is_ended(&self) -> bool {
        self.ended
    }

    /// Whether older output was dropped.
    pub(crate) fn truncated(&self) -> bool {
        self.truncated
    }

    /// Every retained event.
    pub(crate) fn all(&self) -> Vec<StoredEvent> {
        self.events.iter().cloned().collect()
    }

    /// The retained standard output and standard error, each concatenated.
    pub(crate) fn collected(&self) -> (Vec<u8>, Vec<u8>) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for e in &self.events {
            match &e.kind {
                EventKind::Stdout { data } => out.extend_from_slice(data),
                EventKind::Stderr { data } => err.extend_from_slice(data),
                _ => {}
            }
        }
        (out, err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdout_of(out: &Output) -> Vec<u8> {
        out.collected().0
    }

    #[test]
    fn events_are_numbered_and_end_with_exit_and_end() {
        let mut out = Output::new(1024);
        out.push_output(false, b"a");
        out.push_output(true, b"e");
        out.finish(Some(3), ExecState::Exited);
        out.push_output(false, b"late");
        let names: Vec<_> = out.all().iter().map(|e| (e.n, e.kind.name())).collect();
        assert_eq!(names, [(1, "stdout"), (2, "stderr"), (3, "exit"), (4, "end")]);
        assert_eq!(out.latest(), 4);
        assert!(out.is_ended());
        assert_eq!(out.after(2).len(), 2);
        assert_eq!(out.after(4).len(), 0);
        assert_eq!(out.collected(), (b"a".to_vec(), b"e".to_vec()));
    }

    #[test]
    fn over_the_cap_the_oldest_chunks_go_and_the_output_is_truncated() {
        let mut out = Output::new(10);
        for chunk in [b"0123", b"4567", b"89ab"] {
            out.push_output(false, chunk);
        }
        assert!(out.truncated());
        assert_eq!(stdout_of(&out), b"456789ab");
        assert_eq!(out.all()[0].n, 2);
        // A resume from a dropped event starts at the oldest kept one.
        assert_eq!(out.after(0)[0].n, 2);
        // One chunk larger than the cap keeps its tail.
        out.push_output(false, b"ABCDEFGHIJKLMNOP");
        assert_eq!(stdout_of(&out), b"GHIJKLMNOP");
        out.finish(Some(0), ExecState::Exited);
        let kinds: Vec<_> = out.all().iter().map(|e| e.kind.name()).collect();
        assert_eq!(kinds, ["stdout", "exit", "end"]);
    }

    #[test]
    fn a_split_utf8_sequence_waits_for_the_rest() {
        let euro = "€".as_bytes(); // e2 82 ac
        let mut out = Output::new(1024);
        out.push_output(false, &[b'x', euro[0]]);
        out.push_output(false, &euro[1..2]);
        out.push_output(false, &[euro[2], b'y']);
        let chunks: Vec<_> = out
            .all()
            .into_iter()
            .map(|e| match e.kind {
                EventKind::Stdout { data } => String::from_utf8(data.to_vec()).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(chunks, ["x", "€y"]);
        // Invalid bytes pass through as they are; a held tail is flushed at the end.
        out.push_output(true, &[0xff, 0xfe, 0xf0]);
        out.finish(None, ExecState::Lost);
        assert_eq!(out.collected().1, [0xff, 0xfe, 0xf0]);
        assert_eq!(incomplete_tail(b"abc"), 0);
        assert_eq!(incomplete_tail(&[0xf0, 0x9f, 0x98]), 3);
        assert_eq!(incomplete_tail(&[0xf0, 0x9f, 0x98, 0x80]), 0);
    }

    #[test]
    fn stored_events_round_trip_and_an_exec_lost_without_output_has_exit_and_end() {
        let mut out = Output::new(1024);
        out.push_output(false, &[0, 159, 146, 150]);
        out.finish(Some(0), ExecState::Exited);
        let json = serde_json::to_string(&out.all()).unwrap();
        let back: Vec<StoredEvent> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, out.all());
        let restored = Output::ended(Some(back), Some(0), ExecState::Exited);
        assert_eq!(restored.latest(), 3);
        assert!(restored.is_ended());
        let lost = Output::ended(None, None, ExecState::Lost);
        let kinds: Vec<_> = lost.all().iter().map(|e| e.kind.name()).collect();
        assert_eq!(kinds, ["exit", "end"]);
    }
}
