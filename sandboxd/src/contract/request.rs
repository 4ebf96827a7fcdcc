//! The command of a `run` started ahead of it: `sandboxd run --id ID --request-stdin`
//! ([`super::command::run_ahead`]). The runtime starts such a `run` in a warm-pool sandbox while it waits
//! in the pool, and writes the first command handed-out sandbox runs to its standard input, so that command
//! does not wait for the engine to start an exec (issue 14: the hand-out is bounded below by one exec).
//!
//! ```text
//! request = header body
//! header  = "AGENTHOLD-RUN 1 " LEN "\n"        ; LEN: the body's length in decimal, at most MAX_BODY
//! body    = *(tag value NUL)
//! tag     = "a"                                ; an argument, in order (at least one: the program)
//!         / "e"                                ; an environment entry NAME=VALUE (NAME not empty, no "=")
//!         / "c"                                ; the working directory (at most once)
//!         / "t"                                ; the timeout in milliseconds, decimal, > 0 (at most once)
//! ```
//!
//! Values cannot hold NUL (neither can arguments, environment entries or paths). After the body, the
//! rest of standard input is the command's own. Once the request is read and valid, `run` writes the one
//! byte [`READY`] to standard output before anything else and only then starts the command; on a malformed
//! request it writes nothing to standard output, says why on standard error and exits 125 without starting
//! anything. The runtime strips the byte, and when the output ends without it, knows the command never
//! started.
//!
//! The request comes from the runtime through the engine's attach; it is still read with bounds: the
//! header byte by byte (never more than [`MAX_HEADER`] bytes, and never past it, so not one byte of the
//! command's input is consumed), the body by its announced length.

use std::io::Read;

/// The header's fixed start (the format's version is its last word).
pub const MAGIC: &[u8] = b"AGENTHOLD-RUN 1 ";
/// Longest header, newline included.
pub const MAX_HEADER: usize = 40;
/// Longest body (the kernel's own limit on arguments and environment together is 2 MiB by default).
pub const MAX_BODY: usize = 4 << 20;
/// The byte `run` writes to standard output once it has a valid request, before it starts the command.
pub const READY: u8 = 0x06;

const TAG_ARG: u8 = b'a';
const TAG_ENV: u8 = b'e';
const TAG_CWD: u8 = b'c';
const TAG_TIMEOUT: u8 = b't';

/// A command for a `run` started ahead of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// Program and arguments (never empty in a valid request).
    pub argv: Vec<Vec<u8>>,
    /// Environment entries set on top of the process's own (a name given twice: the last wins).
    pub env: Vec<(Vec<u8>, Vec<u8>)>,
    /// Working directory, when not the exec's.
    pub cwd: Option<Vec<u8>>,
    /// Kill the command's process group after this many milliseconds (`None`: no timeout).
    pub timeout_ms: Option<u64>,
}

impl Request {
    /// The request's bytes (header and body).
    ///
    /// # Errors
    /// An empty command, a value holding NUL, an environment name that is empty or holds `=`, a zero
    /// timeout, or a body longer than [`MAX_BODY`].
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        if self.argv.is_empty() {
            return Err("a request needs a command".into());
        }
        let mut body = Vec::new();
        let mut field = |tag: u8, parts: &[&[u8]], what: &str| -> Result<(), String> {
            if parts.iter().any(|p| p.contains(&0)) {
                return Err(format!("{what} holds a NUL byte"));
            }
            body.push(tag);
            for part in parts {
                body.extend_from_slice(part);
            }
            body.push(0);
            Ok(())
        };
        for arg in &self.argv {
            field(TAG_ARG, &[arg], "an argument")?;
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains(&b'=') {
                return Err(format!(
                    "environment name {:?} is empty or holds '='",
                    String::from_utf8_lossy(name)
                ));
            }
            field(TAG_ENV, &[name, b"=", value], "an environment entry")?;
        }
        if let Some(cwd) = &self.cwd {
            field(TAG_CWD, &[cwd], "the working directory")?;
        }
        if let Some(ms) = self.timeout_ms {
            if ms == 0 {
                return Err("a zero timeout".into());
            }
            field(TAG_TIMEOUT, &[ms.to_string().as_bytes()], "the timeout")?;
        }
        if body.len() > MAX_BODY {
            return Err(format!(
                "the command is {} bytes, more than {MAX_BODY}",
                body.len()
            ));
        }
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.push(b'\n');
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Reads one request from `input`: the header byte by byte, then exactly the body, so that nothing
    /// after the request is consumed.
    ///
    /// # Errors
    /// A read error, an end of input before the request's end, or a malformed request (see
    /// [`Request::decode_body`]).
    pub fn read_from(input: &mut impl Read) -> Result<Self, String> {
        let mut header = Vec::with_capacity(MAX_HEADER);
        loop {
            let mut byte = [0u8; 1];
            match input.read(&mut byte) {
                Ok(0) => return Err("end of input inside the request's header".into()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("reading the request: {e}")),
            }
            if byte[0] == b'\n' {
                break;
            }
            header.push(byte[0]);
            if header.len() >= MAX_HEADER {
                return Err(format!("the request's header is longer than {MAX_HEADER} bytes"));
            }
        }
        let len = Self::decode_header(&header)?;
        let mut body = vec![0u8; len];
        input
            .read_exact(&mut body)
            .map_err(|e| format!("reading the request's {len}-byte body: {e}"))?;
        Self::decode_body(&body)
    }

    /// The body's length from a header line (without its newline).
    ///
    /// # Errors
    /// Another magic or version, a length that is not decimal, or one over [`MAX_BODY`].
    pub fn decode_header(line: &[u8]) -> Result<usize, String> {
        let Some(len) = line.strip_prefix(MAGIC) else {
            return Err(format!(
                "not a request header: {:?}",
                String::from_utf8_lossy(line)
            ));
        };
        if len.is_empty() || len.len() > 10 || !len.iter().all(u8::is_ascii_digit) {
            return Err(format!("bad request length {:?}", String::from_utf8_lossy(len)));
        }
        let len: usize = std::str::from_utf8(len)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("bad request length")?;
        if len > MAX_BODY {
            return Err(format!("a request of {len} bytes is over {MAX_BODY}"));
        }
        Ok(len)
    }

    /// The request in `body`.
    ///
    /// # Errors
    /// A field without its NUL, an unknown tag, no argument, an environment entry without `=` or with an
    /// empty name, a second working directory or timeout, a timeout that is not a positive decimal.
    pub fn decode_body(body: &[u8]) -> Result<Self, String> {
        let mut request = Self::default();
        let mut rest = body;
        while let Some((&tag, after)) = rest.split_first() {
            let Some(end) = after.iter().position(|&b| b == 0) else {
                return Err("a field of the request is not terminated".into());
            };
            let value = &after[..end];
            rest = &after[end + 1..];
            match tag {
                TAG_ARG => request.argv.push(value.to_vec()),
                TAG_ENV => {
                    let Some(eq) = value.iter().position(|&b| b == b'=').filter(|&eq| eq > 0) else {
                        return Err("an environment entry is not NAME=VALUE".into());
                    };
                    request.env.push((value[..eq].to_vec(), value[eq + 1..].to_vec()));
                }
                TAG_CWD if request.cwd.is_none() => request.cwd = Some(value.to_vec()),
                TAG_TIMEOUT if request.timeout_ms.is_none() => {
                    let ms = std::str::from_utf8(value)
                        .ok()
                        .filter(|s| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()))
                        .and_then(|s| s.parse::<u64>().ok())
                        .filter(|&ms| ms > 0)
                        .ok_or("the timeout is not a positive number of milliseconds")?;
                    request.timeout_ms = Some(ms);
                }
                TAG_CWD | TAG_TIMEOUT => {
                    return Err(format!("field {:?} given twice", char::from(tag)));
                }
                other => return Err(format!("unknown field {other:#04x}")),
            }
        }
        if request.argv.is_empty() {
            return Err("the request has no command".into());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sample() -> Request {
        Request {
            argv: vec![
                b"sh".to_vec(),
                b"-c".to_vec(),
                b"echo \xff $A".to_vec(),
                Vec::new(),
            ],
            env: vec![(b"A".to_vec(), b"x=y".to_vec()), (b"EMPTY".to_vec(), Vec::new())],
            cwd: Some(b"/tmp".to_vec()),
            timeout_ms: Some(1500),
        }
    }

    #[test]
    fn round_trip_leaves_the_commands_input_unread() {
        let request = sample();
        let mut bytes = request.encode().unwrap();
        bytes.extend_from_slice(b"the command's own input");
        let mut input = std::io::Cursor::new(bytes);
        assert_eq!(Request::read_from(&mut input).unwrap(), request);
        let mut rest = Vec::new();
        input.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"the command's own input");
        let minimal = Request {
            argv: vec![b"true".to_vec()],
            ..Request::default()
        };
        let bytes = minimal.encode().unwrap();
        assert_eq!(Request::read_from(&mut bytes.as_slice()).unwrap(), minimal);
    }

    #[test]
    fn encoding_refuses_what_cannot_be_carried() {
        let cases = [
            Request::default(),
            Request {
                argv: vec![b"a\0b".to_vec()],
                ..Request::default()
            },
            Request {
                env: vec![(b"A=B".to_vec(), b"v".to_vec())],
                ..sample()
            },
            Request {
                env: vec![(Vec::new(), b"v".to_vec())],
                ..sample()
            },
            Request {
                timeout_ms: Some(0),
                ..sample()
            },
            Request {
                argv: vec![vec![b'x'; MAX_BODY]],
                ..Request::default()
            },
        ];
        for case in cases {
            assert!(case.encode().is_err(), "{case:?}");
        }
    }

    #[test]
    fn malformed_requests_are_errors() {
        let body = |b: &[u8]| {
            let mut out = MAGIC.to_vec();
            out.extend_from_slice(b.len().to_string().as_bytes());
            out.push(b'\n');
            out.extend_from_slice(b);
            out
        };
        let bad: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"AGENTHOLD-RUN 2 3\nat\0".to_vec(),
            b"AGENTHOLD-RUN 1 \nat\0".to_vec(),
            b"AGENTHOLD-RUN 1 -3\nat\0".to_vec(),
            b"AGENTHOLD-RUN 1 99999999999\n".to_vec(),
            format!("AGENTHOLD-RUN 1 {}\n", MAX_BODY + 1).into_bytes(),
            [MAGIC, &[b'1'; 40]].concat(),
            b"AGENTHOLD-RUN 1 10\nat\0".to_vec(),
            body(b""),
            body(b"at"),
            body(b"xt\0"),
            body(b"at\0eNOEQ\0"),
            body(b"at\0e=v\0"),
            body(b"at\0c/\0c/\0"),
            body(b"at\0t1\0t2\0"),
            body(b"at\0t0\0"),
            body(b"at\0t-1\0"),
            body(b"at\0t99999999999999999999999\0"),
            body(b"e=\0"),
        ];
        for bytes in bad {
            assert!(
                Request::read_from(&mut bytes.as_slice()).is_err(),
                "{:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }
}
