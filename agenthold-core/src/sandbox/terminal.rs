//! An interactive terminal in a sandbox (P1): a process on a pseudo-terminal, what is asked
//! ([`TerminalRequest`]), and the open terminal ([`Terminal`]): keystrokes in, output out, a window size,
//! and the end with its exit code.
//!
//! As [`super::ExecStream`], the output is a boxed [`futures_core::Stream`] and core brings no executor:
//! a runtime implements [`TerminalControl`] (write, resize, kill) however its engine does it, and
//! [`Terminal`] is the one shape callers see. Dropping a [`Terminal`] kills its process.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_core::Stream;

use crate::error::Result;

/// A terminal to open in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalRequest {
    /// Program and arguments; empty for the sandbox's shell (`/bin/bash` when the image has it, else
    /// `/bin/sh`).
    pub argv: Vec<String>,
    /// Extra environment (`TERM` is `xterm-256color` unless given here).
    pub env: BTreeMap<String, String>,
    /// Working directory, if not the image's.
    pub cwd: Option<String>,
    /// Width in columns.
    pub cols: u16,
    /// Height in rows.
    pub rows: u16,
}

impl Default for TerminalRequest {
    /// The shell, 80 columns by 24 rows.
    fn default() -> Self {
        Self {
            argv: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            cols: 80,
            rows: 24,
        }
    }
}

/// What an open terminal's stream yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalEvent {
    /// Bytes the process wrote to the terminal (standard output and error are one stream on a terminal).
    Output(Bytes),
    /// The process ended, with its exit code when the runtime learned it (128 + the signal number when a
    /// signal killed it); the last item of the stream.
    Exit(Option<i64>),
}

/// The controls of an open terminal, implemented by a sandbox runtime for its [`Terminal`]s.
#[async_trait::async_trait]
pub trait TerminalControl: Send + Sync {
    /// Send bytes to the process, as typed (a `\r` or `\n` ends a line, `\x03` is Ctrl-C).
    async fn write(&self, data: Bytes) -> Result<()>;
    /// Change the window size (the process gets `SIGWINCH`).
    async fn resize(&self, cols: u16, rows: u16) -> Result<()>;
    /// Kill the process and everything in its process group. Called when the [`Terminal`] is closed or
    /// dropped before its process ended, possibly outside an async context: it must not block (start the
    /// kill and return).
    fn kill(&self);
}

/// The boxed stream behind a [`Terminal`].
pub type TerminalEvents = Pin<Box<dyn Stream<Item = Result<TerminalEvent>> + Send>>;

/// An open terminal: read it as a stream of [`TerminalEvent`]s (output, then one exit), write keystrokes
/// with [`Terminal::write`] (or from another task through [`Terminal::input`]), resize it with
/// [`Terminal::resize`]. Dropping (or [`Terminal::close`]) kills its process unless it already ended.
pub struct Terminal {
    id: String,
    control: Arc<dyn TerminalControl>,
    events: TerminalEvents,
    ended: bool,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal")
            .field("id", &self.id)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Terminal {
    /// A terminal known as `id` (the id `Sandbox::cancel_exec` and `Sandbox::exec_running` know its
    /// process by), driven through `control`, whose output is `events`.
    pub fn new(
        id: impl Into<String>,
        control: Arc<dyn TerminalControl>,
        events: impl Stream<Item = Result<TerminalEvent>> + Send + 'static,
    ) -> Self {
        Self {
            id: id.into(),
            control,
            events: Box::pin(events),
            ended: false,
        }
    }

    /// The id of the terminal's process (as an [`super::ExecStream::id`]).
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A handle that writes to and resizes this terminal from another task; it does not keep the process
    /// alive (dropping the [`Terminal`] still kills it, and writing then fails).
    #[must_use]
    pub fn input(&self) -> TerminalInput {
        TerminalInput {
            control: Arc::clone(&self.control),
        }
    }

    /// Send keystrokes.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Conflict`] once the process ended; the runtime's error.
    pub async fn write(&self, data: impl Into<Bytes>) -> Result<()> {
        self.live()?;
        self.control.write(data.into()).await
    }

    /// Change the window size.
    ///
    /// # Errors
    /// As [`Terminal::write`].
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<()> {
        self.live()?;
        self.control.resize(cols, rows).await
    }

    /// Whether the process may still take input: not once this terminal yielded its exit.
    fn live(&self) -> Result<()> {
        if self.ended {
            return Err(crate::Error::backend(
                crate::ErrorKind::Conflict,
                "",
                format!("the process of terminal {} ended", self.id),
            ));
        }
        Ok(())
    }

    /// The next event; `None` after the [`TerminalEvent::Exit`].
    pub async fn next(&mut self) -> Option<Result<TerminalEvent>> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }

    /// Kill the process now (as dropping does).
    pub fn close(self) {}
}

impl Stream for Terminal {
    type Item = Result<TerminalEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let next = this.events.as_mut().poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(TerminalEvent::Exit(_)))) => this.ended = true,
            Poll::Ready(None) => {
                // A stream that ends without an exit: the process is gone, its code unknown.
                this.ended = true;
                return Poll::Ready(Some(Ok(TerminalEvent::Exit(None))));
            }
            _ => {}
        }
        next
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if !self.ended {
            self.control.kill();
        }
    }
}

/// Writes to and resizes a [`Terminal`] from another task (see [`Terminal::input`]).
#[derive(Clone)]
pub struct TerminalInput {
    control: Arc<dyn TerminalControl>,
}

impl std::fmt::Debug for TerminalInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalInput").finish_non_exhaustive()
    }
}

impl TerminalInput {
    /// Send keystrokes.
    ///
    /// # Errors
    /// When the terminal was closed, its process ended, or the runtime fails.
    pub async fn write(&self, data: impl Into<Bytes>) -> Result<()> {
        self.control.write(data.into()).await
    }

    /// Change the window size.
    ///
    /// # Errors
    /// As [`TerminalInput::write`].
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<()> {
        self.control.resize(cols, rows).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    struct Recorder {
        writes: Mutex<Vec<Bytes>>,
        sizes: Mutex<Vec<(u16, u16)>>,
        kills: Mutex<u32>,
    }

    #[async_trait::async_trait]
    impl TerminalControl for Recorder {
        async fn write(&self, data: Bytes) -> Result<()> {
            self.writes.lock().unwrap().push(data);
            Ok(())
        }
        async fn resize(&self, cols: u16, rows: u16) -> Result<()> {
            self.sizes.lock().unwrap().push((cols, rows));
            Ok(())
        }
        fn kill(&self) {
            *self.kills.lock().unwrap() += 1;
        }
    }

    /// Items from a list, every one ready.
    struct Ready(std::vec::IntoIter<Result<TerminalEvent>>);

    impl Stream for Ready {
        type Item = Result<TerminalEvent>;
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

    fn terminal(control: &Arc<Recorder>, events: Vec<TerminalEvent>) -> Terminal {
        let control: Arc<dyn TerminalControl> = Arc::clone(control) as Arc<dyn TerminalControl>;
        Terminal::new(
            "t",
            control,
            Ready(events.into_iter().map(Ok).collect::<Vec<_>>().into_iter()),
        )
    }

    #[test]
    fn dropping_an_open_terminal_kills_it_and_an_ended_one_is_left_alone() {
        let control = Arc::new(Recorder::default());
        let mut open = terminal(&control, vec![TerminalEvent::Output(Bytes::from_static(b"$ "))]);
        block_on(open.write("ls\n")).unwrap();
        block_on(open.input().resize(100, 40)).unwrap();
        assert_eq!(
            block_on(open.next()).unwrap().unwrap(),
            TerminalEvent::Output(Bytes::from_static(b"$ "))
        );
        drop(open);
        assert_eq!(*control.kills.lock().unwrap(), 1);
        assert_eq!(*control.writes.lock().unwrap(), [Bytes::from_static(b"ls\n")]);
        assert_eq!(*control.sizes.lock().unwrap(), [(100, 40)]);

        let control = Arc::new(Recorder::default());
        let mut ended = terminal(&control, vec![TerminalEvent::Exit(Some(3))]);
        assert_eq!(
            block_on(ended.next()).unwrap().unwrap(),
            TerminalEvent::Exit(Some(3))
        );
        assert!(block_on(ended.next()).is_none());
        ended.close();
        assert_eq!(*control.kills.lock().unwrap(), 0);
    }

    #[test]
    fn a_stream_without_an_exit_ends_with_an_unknown_code() {
        let control = Arc::new(Recorder::default());
        let mut t = terminal(&control, vec![]);
        assert_eq!(block_on(t.next()).unwrap().unwrap(), TerminalEvent::Exit(None));
        assert!(block_on(t.next()).is_none());
    }
}
