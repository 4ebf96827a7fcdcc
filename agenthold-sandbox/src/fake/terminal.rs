//! The fake's terminals: an echo. What is written comes back as output; the last size set is kept; closing
//! ends the stream with exit code 137 (as a SIGKILL would) and marks the terminal no longer running.

use std::sync::{Arc, Mutex, PoisonError};

use agenthold_core::sandbox::{TerminalControl, TerminalEvent};
use agenthold_core::{Error, ErrorKind, Result};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::State;

/// One fake terminal's controls.
pub(super) struct EchoTerminal {
    pub(super) id: String,
    pub(super) events: mpsc::UnboundedSender<Result<TerminalEvent>>,
    pub(super) state: Arc<Mutex<State>>,
}

impl EchoTerminal {
    fn running(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .running
            .contains_key(&self.id)
    }
}

#[async_trait::async_trait]
impl TerminalControl for EchoTerminal {
    async fn write(&self, data: Bytes) -> Result<()> {
        if !self.running() {
            return Err(Error::backend(
                ErrorKind::Conflict,
                "fake sandbox",
                "the terminal is closed",
            ));
        }
        let _ = self.events.send(Ok(TerminalEvent::Output(data)));
        Ok(())
    }

    async fn resize(&self, cols: u16, rows: u16) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.terminal_sizes.insert(self.id.clone(), (cols, rows));
        Ok(())
    }

    fn kill(&self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .running
            .remove(&self.id);
        let _ = self.events.send(Ok(TerminalEvent::Exit(Some(137))));
    }
}
