//! Commands and terminals in a sandbox (P1): run to completion, streamed, cancelled, asked after, and
//! interactive terminals.
//!
//! Every command the runtime starts gets the agent's current secret placeholders in the variables their
//! secrets name (unless the request sets that variable itself): a secret attached after the sandbox was
//! created ([`Runtime::set_secrets`]) reaches new commands at once, although the engine cannot change a
//! created container's own environment.

use std::collections::BTreeMap;

use agenthold_core::AgentId;
use agenthold_core::sandbox::{ExecOutput, ExecRequest, ExecStream, Terminal, TerminalRequest};

use super::Runtime;
use crate::error::Result;

impl Runtime {
    /// Run a command to completion.
    ///
    /// # Errors
    /// When the sandbox does not exist or does not run.
    pub async fn exec(&self, agent: &AgentId, argv: &[&str]) -> Result<ExecOutput> {
        let request = ExecRequest {
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            ..ExecRequest::default()
        };
        self.exec_request(agent, request).await
    }

    /// Run a command described in full (environment, working directory, stdin, timeout).
    ///
    /// # Errors
    /// As [`Runtime::exec`].
    pub async fn exec_request(&self, agent: &AgentId, mut request: ExecRequest) -> Result<ExecOutput> {
        self.add_secret_env(agent, &mut request.env);
        Ok(self.sandbox.exec(agent, request).await?)
    }

    /// Start a command and stream its output (see [`agenthold_core::Sandbox::exec_stream`]).
    ///
    /// # Errors
    /// As [`Runtime::exec`].
    pub async fn exec_stream(&self, agent: &AgentId, mut request: ExecRequest) -> Result<ExecStream> {
        self.add_secret_env(agent, &mut request.env);
        Ok(self.sandbox.exec_stream(agent, request).await?)
    }

    /// Kill a running command started with [`Runtime::exec_stream`] (or a terminal's process), by its
    /// [`ExecStream::id`], with everything in its process group.
    ///
    /// # Errors
    /// When the sandbox runtime fails.
    pub async fn cancel_exec(&self, agent: &AgentId, exec_id: &str) -> Result<()> {
        Ok(self.sandbox.cancel_exec(agent, exec_id).await?)
    }

    /// Whether the command started as `exec_id` ([`ExecStream::id`], [`Terminal::id`]) may still run in the
    /// sandbox's current boot. A caller that lost a command's stream (its process restarted) asks this,
    /// and cancels the command with [`Runtime::cancel_exec`] when it is still running; an id from before
    /// the sandbox last stopped, or one it never ran, is not running. With the Docker runtime the answer is
    /// the engine's, about the exec of the command's `sandboxd run` wrapper.
    ///
    /// # Errors
    /// [`agenthold_core::ErrorKind::BadInput`] for a malformed id, `NotFound` for an unknown sandbox;
    /// `Unavailable` from a sandbox runtime that cannot tell.
    pub async fn exec_running(&self, agent: &AgentId, exec_id: &str) -> Result<bool> {
        Ok(self.sandbox.exec_running(agent, exec_id).await?)
    }

    /// Open an interactive terminal in a running sandbox: its shell (`/bin/bash` when the image has it,
    /// else `/bin/sh`) unless `request.argv` names a program. Write keystrokes with [`Terminal::write`] (or
    /// from another task through [`Terminal::input`]), read its output as a stream, resize it with
    /// [`Terminal::resize`]; dropping it kills its process group.
    ///
    /// # Errors
    /// When the sandbox does not exist or does not run; `Unavailable` from a sandbox runtime without
    /// terminals.
    pub async fn open_terminal(&self, agent: &AgentId, mut request: TerminalRequest) -> Result<Terminal> {
        self.add_secret_env(agent, &mut request.env);
        Ok(self.sandbox.open_terminal(agent, request).await?)
    }

    /// Put the agent's secret placeholders in `env` (the variables each secret names), leaving alone a
    /// variable `env` sets already.
    fn add_secret_env(&self, agent: &AgentId, env: &mut BTreeMap<String, String>) {
        let Some(table) = self.injector.table() else {
            return;
        };
        for placeholder in table.placeholders(agent) {
            if let Some(var) = placeholder.env {
                env.entry(var).or_insert(placeholder.placeholder);
            }
        }
    }
}
