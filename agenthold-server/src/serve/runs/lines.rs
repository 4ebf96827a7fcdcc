//! Output bytes to lines, bounded: a line longer than [`MAX_LINE`] is cut there (the rest up to its newline
//! is dropped and the run marked truncated), and the raw standard output lines a run keeps are capped at
//! [`MAX_RAW_BYTES`] (the oldest go first), so neither a harness that never prints a newline nor one that
//! prints forever grows the server's memory.
// enforces: P1

use std::collections::VecDeque;

/// Longest line kept whole (1 MiB): a JSON line of a harness stays well below.
pub(crate) const MAX_LINE: usize = 1024 * 1024;
/// Raw standard output bytes kept per run.
pub(crate) const MAX_RAW_BYTES: usize = 8 * 1024 * 1024;

/// Bytes of one stream, split into lines.
#[derive(Debug, Default)]
pub(crate) struct LineBuf {
    buf: Vec<u8>,
    /// The current line was cut: drop bytes up to its newline.
    skipping: bool,
    truncated: bool,
}

fn text(bytes: &[u8]) -> String {
    let line = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    String::from_utf8_lossy(line).into_owned()
}

impl LineBuf {
    /// An empty buffer.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Add bytes; returns the lines they complete (without their `\n` or `\r\n`).
    pub(crate) fn push(&mut self, mut data: &[u8]) -> Vec<String> {
        let mut lines = Vec::new();
        while !data.is_empty() {
            let newline = data.iter().position(|b| *b == b'\n');
            let (part, rest, complete) = match newline {
                Some(i) => (&data[..i], &data[i + 1..], true),
                None => (data, &[][..], false),
            };
            data = rest;
            if !self.skipping {
                let room = MAX_LINE - self.buf.len();
                if part.len() > room {
                    self.buf.extend_from_slice(&part[..room]);
                    lines.push(text(&std::mem::take(&mut self.buf)));
                    self.truncated = true;
                    self.skipping = !complete;
                    continue;
                }
                self.buf.extend_from_slice(part);
            }
            if complete {
                if !self.skipping {
                    lines.push(text(&std::mem::take(&mut self.buf)));
                }
                self.skipping = false;
            }
        }
        lines
    }

    /// The stream ended: the last line if it had no newline.
    pub(crate) fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.buf);
        (!rest.is_empty() && !self.skipping).then(|| text(&rest))
    }

    /// Whether a line was cut.
    pub(crate) fn truncated(&self) -> bool {
        self.truncated
    }
}

/// The raw standard output lines of a run, oldest dropped past [`MAX_RAW_BYTES`].
#[derive(Debug)]
pub(crate) struct RawLines {
    lines: VecDeque<String>,
    bytes: usize,
    cap: usize,
    truncated: bool,
}

impl RawLines {
    /// Empty, with the default cap.
    pub(crate) fn new() -> Self {
        Self::with_cap(MAX_RAW_BYTES)
    }

    /// Empty, keeping at most `cap` bytes.
    pub(crate) fn with_cap(cap: usize) -> Self {
        Self {
            lines: VecDeque::new(),
            bytes: 0,
            cap,
            truncated: false,
        }
    }

    /// Keep a line.
    pub(crate) fn push(&mut self, line: String) {
        self.bytes += line.len();
        self.lines.push_back(line);
        while self.bytes > self.cap {
            let Some(old) = self.lines.pop_front() else {
                break;
            };
            self.bytes -= old.len();
            self.truncated = true;
        }
    }

    /// Whether lines were dropped.
    pub(crate) fn truncated(&self) -> bool {
        self.truncated
    }

    /// Every kept line.
    pub(crate) fn all(&self) -> Vec<String> {
        self.lines.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_chunks_and_crlf() {
        let mut b = LineBuf::new();
        assert!(b.push(b"ab").is_empty());
        assert_eq!(b.push(b"c\r\nd\n\ne"), ["abc", "d", ""]);
        assert_eq!(b.finish().as_deref(), Some("e"));
        assert!(!b.truncated());
        // Invalid UTF-8 is replaced, never a panic.
        assert_eq!(b.push(b"\xff\xfe\n"), ["\u{fffd}\u{fffd}"]);
    }

    #[test]
    fn a_line_past_the_cap_is_cut_and_the_rest_dropped_up_to_its_newline() {
        let mut b = LineBuf::new();
        let big = vec![b'x'; MAX_LINE + 10];
        let lines = b.push(&big);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].len(), MAX_LINE);
        assert!(b.push(&[b'y'; 100]).is_empty());
        assert_eq!(b.push(b"zz\nnext\n"), ["next"]);
        assert!(b.truncated());
        assert_eq!(b.finish(), None);
        // Exactly the cap, then a newline: kept whole.
        let mut b = LineBuf::new();
        let mut exact = vec![b'a'; MAX_LINE];
        exact.push(b'\n');
        assert_eq!(b.push(&exact)[0].len(), MAX_LINE);
        assert!(!b.truncated());
    }

    #[test]
    fn raw_lines_keep_the_newest_within_the_cap() {
        let mut r = RawLines::with_cap(10);
        for l in ["aaaa", "bbbb", "cccc"] {
            r.push(l.to_owned());
        }
        assert_eq!(r.all(), ["bbbb", "cccc"]);
        assert!(r.truncated());
    }
}
