//! Commands run in a sandbox: what is asked ([`ExecRequest`]), a running command's output as it comes
//! ([`ExecStream`] of [`ExecChunk`]s) and a finished command's output ([`ExecOutput`]).
//!
//! The stream is a boxed [`futures_core::Stream`]: the one trait every async runtime and the futures
//! combinators agree on, object safe, and without an executor or I/O in core (futures-core is the trait
//! alone). Implementations build it however they like (an engine's attach stream, a channel, a list).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;

use crate::error::Result;

/// Output kept per stream by [`ExecStream::collect`] (and so by `Sandbox::exec`); more is dropped. Streaming
/// callers see everything.
pub const MAX_CAPTURE: usize = 64 * 1024 * 1024;

/// A command to run in a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecRequest {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment for this command.
    pub env: BTreeMap<String, String>,
    /// Working directory, if not the image's.
    pub cwd: Option<String>,
    /// Bytes to feed to standard input.
    pub stdin: Option<Vec<u8>>,
    /// Give up (and kill the command) after this long.
    pub timeout: Option<std::time::Duration>,
}

/// What a finished command produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit code (128 + signal number when killed by a signal, -1 when unknown).
    pub exit_code: i64,
    /// Everything written to standard output.
    pub stdout: Vec<u8>,
    /// Everything written to standard error.
    pub stderr: Vec<u8>,
}

/// One piece of a running command's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecChunk {
    /// Bytes written to standard output.
    Stdout(Vec<u8>),
    /// Bytes written to standard error.
    Stderr(Vec<u8>),
    /// The command ended with this exit code (as [`ExecOutput::exit_code`]); the last item of a stream.
    Exit(i64),
}

/// The boxed stream behind an [`ExecStream`].
pub type ChunkStream = Pin<Box<dyn Stream<Item = Result<ExecChunk>> + Send>>;

/// A running command: its id (for `Sandbox::cancel_exec`) and its output, ending with
/// [`ExecChunk::Exit`]. A stream that ends without one reports exit code -1 (unknown). Dropping it stops
/// reading, not the command: cancel it for that.
pub struct ExecStream {
    id: String,
    chunks: ChunkStream,
}

impl std::fmt::Debug for ExecStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStream")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ExecStream {
    /// A command known as `id` whose output is `chunks`.
    pub fn new(
        id: impl Into<String>,
        chunks: impl Stream<Item = Result<ExecChunk>> + Send + 'static,
    ) -> Self {
        Self {
            id: id.into(),
            chunks: Box::pin(chunks),
        }
    }

    /// The id `Sandbox::cancel_exec` knows the command by.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The next chunk; `None` after the last.
    pub async fn next(&mut self) -> Option<Result<ExecChunk>> {
        std::future::poll_fn(|cx| self.chunks.as_mut().poll_next(cx)).await
    }

    /// Read to the end and return the output, each stream capped at [`MAX_CAPTURE`] bytes.
    ///
    /// # Errors
    /// The first error the stream yields.
    pub async fn collect(mut self) -> Result<ExecOutput> {
        let mut out = ExecOutput {
            exit_code: -1,
            ..ExecOutput::default()
        };
        while let Some(chunk) = self.next().await {
            let (buf, data) = match chunk? {
                ExecChunk::Stdout(d) => (&mut out.stdout, d),
                ExecChunk::Stderr(d) => (&mut out.stderr, d),
                ExecChunk::Exit(code) => {
                    out.exit_code = code;
                    break;
                }
            };
            let room = MAX_CAPTURE.saturating_sub(buf.len());
            buf.extend_from_slice(&data[..data.len().min(room)]);
        }
        Ok(out)
    }
}

impl Stream for ExecStream {
    type Item = Result<ExecChunk>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().chunks.as_mut().poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.chunks.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream from a list, without an executor crate: every item is ready.
    struct Ready(std::vec::IntoIter<Result<ExecChunk>>);

    impl Stream for Ready {
        type Item = Result<ExecChunk>;
        fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Poll::Ready(self.get_mut().0.next())
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        loop {
            if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
                return out;
            }
        }
    }

    fn stream(items: Vec<Result<ExecChunk>>) -> ExecStream {
        ExecStream::new("x", Ready(items.into_iter()))
    }

    #[test]
    fn collect_gathers_both_outputs_and_stops_at_the_exit() {
        let out = block_on(
            stream(vec![
                Ok(ExecChunk::Stdout(b"a".to_vec())),
                Ok(ExecChunk::Stderr(b"e".to_vec())),
                Ok(ExecChunk::Stdout(b"b".to_vec())),
                Ok(ExecChunk::Exit(3)),
                Ok(ExecChunk::Stdout(b"after".to_vec())),
            ])
            .collect(),
        )
        .unwrap();
        assert_eq!(
            out,
            ExecOutput {
                exit_code: 3,
                stdout: b"ab".to_vec(),
                stderr: b"e".to_vec()
            }
        );
    }

    #[test]
    fn a_stream_without_an_exit_is_unknown_and_errors_surface() {
        let out = block_on(stream(vec![Ok(ExecChunk::Stdout(b"a".to_vec()))]).collect()).unwrap();
        assert_eq!(out.exit_code, -1);
        let err =
            block_on(stream(vec![Err(crate::Error::Denied { reason: "no".into() })]).collect()).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Denied);
    }
}
