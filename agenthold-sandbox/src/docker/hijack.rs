//! The raw byte stream of an exec that has a terminal: `POST /exec/ID/start` upgraded on a connection of
//! our own to the engine's Unix socket, read and written as it is.
//!
//! Why not bollard's `start_exec`: it reads every exec stream through a decoder of the multiplexed frames
//! non-terminal execs use, and guesses a terminal's raw stream by its first byte. Output whose read begins
//! with a byte 0, 1 or 2 (Ctrl-@, Ctrl-A, Ctrl-B: `cat` of any binary file) is taken for a frame header,
//! and the decoder then waits for as many bytes as the next four give (up to 4 GiB), buffering them: the
//! terminal stalls and the process's memory grows with what the agent prints. A terminal's stream has no
//! frames, so here nothing is decoded.
// enforces: E20

use std::path::Path;
use std::time::Duration;

use bollard::ClientVersion;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::engine::kind_of_status;
use crate::error::{Error, Result};

/// Longest answer head read before giving up.
const MAX_HEAD: usize = 16 * 1024;
/// Longest error body kept for the message.
const MAX_ERROR_BODY: usize = 4 * 1024;
/// How long connecting and the engine's answer may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// A started exec's stream: its output (the bytes that came with the answer first), and its input.
pub(super) struct Hijacked {
    /// Output that arrived with the engine's answer.
    pub(super) early: Bytes,
    /// The rest of the output.
    pub(super) output: OwnedReadHalf,
    /// The process's terminal input.
    pub(super) input: OwnedWriteHalf,
}

/// Start exec `exec_id` (created with a terminal) attached, over a new connection to `socket`.
pub(super) async fn start_tty(socket: &Path, version: &ClientVersion, exec_id: &str) -> Result<Hijacked> {
    let context = || format!("start exec {exec_id} on {}", socket.display());
    let started = tokio::time::timeout(ANSWER_TIMEOUT, start(socket, version, exec_id)).await;
    match started {
        Ok(Ok(hijacked)) => Ok(hijacked),
        Ok(Err(Started::Io(e))) => Err(Error::io(context(), e)),
        Ok(Err(Started::Refused { status, message })) => Err(Error::Engine {
            context: context(),
            kind: kind_of_status(status),
            source: format!("{status}: {message}").into(),
        }),
        Err(_) => Err(Error::Engine {
            context: context(),
            kind: agenthold_core::ErrorKind::Timeout,
            source: format!("no answer within {ANSWER_TIMEOUT:?}").into(),
        }),
    }
}

/// Why a start failed.
enum Started {
    Io(std::io::Error),
    Refused { status: u16, message: String },
}

impl From<std::io::Error> for Started {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

async fn start(socket: &Path, version: &ClientVersion, exec_id: &str) -> Result<Hijacked, Started> {
    let mut stream = UnixStream::connect(socket).await?;
    let body = br#"{"Detach":false,"Tty":true}"#;
    let head = format!(
        "POST /v{}.{}/exec/{exec_id}/start HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n\
         Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {}\r\n\r\n",
        version.major_version,
        version.minor_version,
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut answer = Vec::with_capacity(1024);
    let end = loop {
        if let Some(at) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if answer.len() > MAX_HEAD {
            return Err(Started::Io(std::io::Error::other(
                "the engine's answer head is too long",
            )));
        }
        if stream.read_buf(&mut answer).await? == 0 {
            return Err(Started::Io(std::io::Error::other(
                "the engine closed the connection before answering",
            )));
        }
    };
    let status = status_of(&answer[..end]).ok_or_else(|| {
        Started::Io(std::io::Error::other(format!(
            "not an HTTP answer: {:?}",
            String::from_utf8_lossy(&answer[..end.min(80)])
        )))
    })?;
    // 101 Switching Protocols; engines before the upgrade handshake answer 200 and hijack all the same.
    if status != 101 && status != 200 {
        let mut body = answer.split_off(end);
        while body.len() < MAX_ERROR_BODY {
            match tokio::time::timeout(Duration::from_secs(2), stream.read_buf(&mut body)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => break,
            }
        }
        body.truncate(MAX_ERROR_BODY);
        return Err(Started::Refused {
            status,
            message: message_of(&body),
        });
    }
    let early = Bytes::from(answer.split_off(end));
    let (output, input) = stream.into_split();
    Ok(Hijacked { early, output, input })
}

/// The status code of an HTTP/1.x answer head.
fn status_of(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split(' ');
    words.next()?.starts_with("HTTP/1.").then_some(())?;
    words.next()?.parse().ok()
}

/// The engine's error message (`{"message": "..."}`), or the body as text.
fn message_of(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Message {
        message: String,
    }
    // The body may be chunked: its JSON starts at the first `{`.
    let json = body
        .iter()
        .position(|&b| b == b'{')
        .map_or(body, |at| &body[at..]);
    let json = json
        .iter()
        .rposition(|&b| b == b'}')
        .map_or(json, |at| &json[..=at]);
    serde_json::from_slice::<Message>(json)
        .map_or_else(|_| String::from_utf8_lossy(body).trim().to_owned(), |m| m.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_heads_and_error_bodies_read() {
        assert_eq!(
            status_of(b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n"),
            Some(101)
        );
        assert_eq!(status_of(b"HTTP/1.0 404 Not Found\r\n\r\n"), Some(404));
        assert_eq!(status_of(b"SSH-2.0-x\r\n\r\n"), None);
        assert_eq!(status_of(b"HTTP/1.1 abc\r\n\r\n"), None);
        assert_eq!(
            message_of(b"3a\r\n{\"message\":\"No such exec instance: x\"}\n\r\n0\r\n\r\n"),
            "No such exec instance: x"
        );
        assert_eq!(message_of(b"plain words\n"), "plain words");
    }

    /// A fake engine on a Unix socket: answers the upgrade, then writes output that bollard's decoder
    /// would take for a frame header; the bytes come through as they are, and input reaches it.
    #[tokio::test]
    async fn the_stream_is_read_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("engine.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let engine = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            while !String::from_utf8_lossy(&request).contains("\"Tty\":true}") {
                conn.read_buf(&mut request).await.unwrap();
            }
            conn.write_all(b"HTTP/1.1 101 UPGRADED\r\nUpgrade: tcp\r\n\r\n\x01\x00\x00\x00\xff\xff")
                .await
                .unwrap();
            conn.write_all(b"\xff\xffafter").await.unwrap();
            let mut typed = [0u8; 3];
            conn.read_exact(&mut typed).await.unwrap();
            (String::from_utf8_lossy(&request).into_owned(), typed)
        });
        let version = ClientVersion {
            major_version: 1,
            minor_version: 41,
        };
        let mut hijacked = start_tty(&socket, &version, "abc").await.unwrap();
        let mut output = hijacked.early.to_vec();
        let expected = b"\x01\x00\x00\x00\xff\xff\xff\xffafter";
        while output.len() < expected.len() {
            let read = tokio::time::timeout(Duration::from_secs(10), hijacked.output.read_buf(&mut output));
            assert!(read.await.unwrap().unwrap() > 0, "closed early: {output:?}");
        }
        assert_eq!(output, expected);
        hijacked.input.write_all(b"ls\n").await.unwrap();
        let (request, typed) = engine.await.unwrap();
        assert!(
            request.starts_with("POST /v1.41/exec/abc/start HTTP/1.1\r\n"),
            "{request}"
        );
        assert_eq!(&typed, b"ls\n");
    }

    #[tokio::test]
    async fn a_refusal_carries_the_engine_status() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("engine.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 256];
            let _ = conn.read(&mut request).await.unwrap();
            conn.write_all(b"HTTP/1.1 409 Conflict\r\nContent-Length: 43\r\n\r\n{\"message\":\"container x is not running\"}\n")
                .await
                .unwrap();
        });
        let version = ClientVersion {
            major_version: 1,
            minor_version: 41,
        };
        let err = start_tty(&socket, &version, "abc").await.err().unwrap();
        assert_eq!(err.kind(), agenthold_core::ErrorKind::Conflict);
        assert!(err.to_string().contains("container x is not running"), "{err}");
    }
}
