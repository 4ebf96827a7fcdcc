//! Agent messages, the sender's side (P3): `agenthold-send [--harness claude|codex] AGENT PROMPT` (or
//! `sandboxd send …`) hands one `SEND` request to PID 1 over [`SEND_SOCKET`] and prints the started run's id.
//! It holds no secret: `sandboxd boot` adds the boot token when it forwards the request over the tunnel
//! ([`crate::relay`]). Also the bounded, deadline-checked reads both sides of the socket use ([`Wire`]).

use std::io::{Read, Write as _};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use sandboxd::contract::SEND_SOCKET;
use sandboxd::contract::tunnel::{self as wire, Answer, SendError};

use crate::cli::SendOptions;
use crate::layout::Layout;

/// Exit status when the message was refused or could not be delivered.
pub(crate) const EXIT_REFUSED: i32 = 1;
/// Exit status for a request that cannot be sent as given (usage).
pub(crate) const EXIT_USAGE: i32 = 2;
/// How long a write to a socket may take.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the sender waits for PID 1's answer: the relay's own waits plus a margin.
const CLIENT_TIMEOUT: Duration =
    Duration::from_secs(wire::ANSWER_TIMEOUT.as_secs() + wire::REPLY_TIMEOUT.as_secs() * 2 + 5);
/// How long `-` waits for the end of stdin.
const STDIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest chunk read at once.
const CHUNK: usize = 64 * 1024;

/// Writes one line to stderr, prefixed with `agenthold-send: `.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr().lock(), "agenthold-send: {}", format_args!($($arg)*));
    }};
}

/// Why a bounded read failed.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The deadline passed.
    TimedOut,
    /// The peer closed the connection early.
    Closed,
    /// A line longer than [`wire::MAX_LINE`], or more bytes than the request announced.
    TooLong,
    /// Any other I/O error.
    Io(std::io::Error),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TimedOut => f.write_str("timed out"),
            Self::Closed => f.write_str("connection closed"),
            Self::TooLong => f.write_str("line too long"),
            Self::Io(err) => write!(f, "{err}"),
        }
    }
}

/// A stream whose reads can be given a timeout.
pub(crate) trait Timed: Read {
    /// Sets the read timeout (never zero).
    fn read_timeout(&self, left: Duration) -> std::io::Result<()>;
}

impl Timed for UnixStream {
    fn read_timeout(&self, left: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(left.max(Duration::from_millis(1))))
    }
}

impl Timed for std::net::TcpStream {
    fn read_timeout(&self, left: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(left.max(Duration::from_millis(1))))
    }
}

/// A stream with a buffer: lines bounded by [`wire::MAX_LINE`], bodies by their announced length, every read
/// by a deadline.
pub(crate) struct Wire<S> {
    /// The stream.
    pub(crate) stream: S,
    /// Bytes read but not consumed.
    buf: Vec<u8>,
}

impl<S: Timed> Wire<S> {
    /// Wraps `stream`.
    pub(crate) fn new(stream: S) -> Self {
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    /// One read of at most `max` bytes into the buffer before `deadline`.
    fn fill(&mut self, max: usize, deadline: Instant) -> Result<(), WireError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(WireError::TimedOut);
            }
            self.stream.read_timeout(left).map_err(WireError::Io)?;
            let mut chunk = vec![0u8; max.clamp(1, CHUNK)];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(WireError::Closed),
                Ok(n) => {
                    self.buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
                    return Ok(());
                }
                Err(err)
                    if matches!(
                        err.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => return Err(WireError::Io(err)),
            }
        }
    }

    /// The next line without its `\n`, at most [`wire::MAX_LINE`] bytes with it.
    pub(crate) fn line(&mut self, deadline: Instant) -> Result<Vec<u8>, WireError> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                if pos >= wire::MAX_LINE {
                    return Err(WireError::TooLong);
                }
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                return Ok(line);
            }
            if self.buf.len() >= wire::MAX_LINE {
                return Err(WireError::TooLong);
            }
            self.fill(wire::MAX_LINE - self.buf.len(), deadline)?;
        }
    }

    /// Exactly `n` more bytes. Bytes beyond them already received are an error (one request per
    /// connection).
    pub(crate) fn exact(&mut self, n: usize, deadline: Instant) -> Result<Vec<u8>, WireError> {
        while self.buf.len() < n {
            self.fill(n - self.buf.len(), deadline)?;
        }
        if self.buf.len() > n {
            return Err(WireError::TooLong);
        }
        Ok(std::mem::take(&mut self.buf))
    }
}

/// Reads the prompt from stdin: at most [`wire::MAX_PROMPT`] bytes, within [`STDIN_TIMEOUT`].
fn stdin_prompt() -> Result<String, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    // A thread, so the wait can time out; it is left behind (and ends with the process) if it does.
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let limit = u64::try_from(wire::MAX_PROMPT + 1).unwrap_or(u64::MAX);
        let read = std::io::stdin().lock().take(limit).read_to_end(&mut bytes);
        let _ = tx.send(read.map(|_| bytes));
    });
    let bytes = match rx.recv_timeout(STDIN_TIMEOUT) {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(err)) => return Err(format!("reading the prompt from stdin: {err}")),
        Err(_) => {
            return Err(format!("no end of stdin within {} s", STDIN_TIMEOUT.as_secs()));
        }
    };
    if bytes.len() > wire::MAX_PROMPT {
        return Err(SendError::PromptTooLarge.to_string());
    }
    String::from_utf8(bytes).map_err(|_| SendError::BadPrompt.to_string())
}

/// Sends `request` to PID 1 at `socket` and returns its answer.
pub(crate) fn exchange(
    socket: &std::path::Path,
    request: &[u8],
    timeout: Duration,
) -> Result<Answer, String> {
    let stream = UnixStream::connect(socket).map_err(|err| {
        format!(
            "cannot reach sandboxd at {}: {err} (agent messages work inside an agenthold sandbox)",
            socket.display()
        )
    })?;
    stream
        .set_write_timeout(Some(WRITE_TIMEOUT))
        .map_err(|err| format!("socket: {err}"))?;
    (&stream)
        .write_all(request)
        .map_err(|err| format!("sending the request: {err}"))?;
    let mut conn = Wire::new(stream);
    let line = conn
        .line(Instant::now() + timeout)
        .map_err(|err| format!("waiting for the answer: {err}"))?;
    wire::parse_answer(&line)
        .map_err(|()| "sandboxd sent an answer that is not part of the protocol".to_owned())
}

/// `agenthold-send` / `sandboxd send`: returns the exit status (0: the run id is on stdout).
pub(crate) fn send(layout: &Layout, opts: SendOptions) -> i32 {
    let prompt = match opts.prompt {
        Some(prompt) => prompt,
        None => match stdin_prompt() {
            Ok(prompt) => prompt,
            Err(err) => {
                say!("{err}");
                return EXIT_REFUSED;
            }
        },
    };
    let request = match wire::request(opts.harness, &opts.name, &prompt) {
        Ok(request) => request,
        Err(err) => {
            say!("{err}");
            return if err == SendError::PromptTooLarge {
                EXIT_REFUSED
            } else {
                EXIT_USAGE
            };
        }
    };
    match exchange(&layout.path(SEND_SOCKET), &request, CLIENT_TIMEOUT) {
        Ok(Answer::Started(run)) => {
            let _ = writeln!(std::io::stdout().lock(), "{run}");
            0
        }
        Ok(Answer::Refused(reason)) => {
            say!("refused: {reason}");
            EXIT_REFUSED
        }
        Err(err) => {
            say!("{err}");
            EXIT_REFUSED
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_bodies_are_bounded() {
        let (a, b) = UnixStream::pair().expect("pair");
        let mut w = Wire::new(a);
        (&b).write_all(b"SEND claude 1 2\nabc").expect("write");
        let soon = || Instant::now() + Duration::from_millis(200);
        assert_eq!(w.line(soon()).expect("line"), b"SEND claude 1 2");
        assert_eq!(w.exact(3, soon()).expect("body"), b"abc");
        assert!(matches!(w.exact(1, soon()), Err(WireError::TimedOut)));
        (&b).write_all(&[b'x'; 300]).expect("write");
        assert!(matches!(w.line(soon()), Err(WireError::TooLong)));
        let (a, b) = UnixStream::pair().expect("pair");
        let mut w = Wire::new(a);
        (&b).write_all(b"x\nabcd").expect("write");
        assert_eq!(w.line(soon()).expect("line"), b"x");
        assert!(matches!(w.exact(2, soon()), Err(WireError::TooLong)));
        drop(b);
        let mut w2 = Wire::new(UnixStream::pair().expect("pair").0);
        assert!(matches!(w2.line(soon()), Err(WireError::Closed)));
    }
}
