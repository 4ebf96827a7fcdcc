//! Running commands in a sandbox (P1) through the engine's exec API. Every command goes through
//! `sandboxd run`, which puts it in its own process group, enforces the timeout by killing the whole group,
//! and records the group so that a running command can be cancelled (`sandboxd kill`), on any OCI runtime.

use std::pin::Pin;

use agenthold_core::AgentId;
use agenthold_core::sandbox::{ExecOutput, ExecRequest};
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;

use super::container::container_name;
use crate::engine::Engine;
use crate::error::{Error, Result};

/// Output kept per stream by [`collect`]; more is dropped (streaming callers see everything).
pub const MAX_CAPTURE: usize = 64 * 1024 * 1024;

/// One piece of a running command's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Bytes written to standard output.
    Stdout(Bytes),
    /// Bytes written to standard error.
    Stderr(Bytes),
}

/// A running command.
pub struct ExecHandle {
    /// The id `sandboxd run` knows the command by (for [`super::DockerSandbox::cancel`]).
    pub id: String,
    exec_id: String,
    output: Pin<Box<dyn Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>> + Send>>,
    engine: Engine,
}

impl std::fmt::Debug for ExecHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecHandle")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ExecHandle {
    /// The next piece of output; `None` when the command closed its output (it may still be running).
    pub async fn next(&mut self) -> Option<Result<Chunk>> {
        loop {
            return match self.output.next().await? {
                Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                    Some(Ok(Chunk::Stdout(message)))
                }
                Ok(LogOutput::StdErr { message }) => Some(Ok(Chunk::Stderr(message))),
                Ok(LogOutput::StdIn { .. }) => continue,
                Err(e) => Some(Err(Error::engine("read command output", e))),
            };
        }
    }

    /// Wait for the command to end and return its exit code (after the output is drained).
    ///
    /// # Errors
    /// When the engine fails.
    pub async fn wait(mut self) -> Result<i64> {
        while self.output.next().await.is_some() {}
        for _ in 0..100 {
            let inspect = self
                .engine
                .docker
                .inspect_exec(&self.exec_id)
                .await
                .map_err(|e| Error::engine("inspect exec", e))?;
            if inspect.running != Some(true) {
                return Ok(inspect.exit_code.unwrap_or(-1));
            }
            // Output closed but the process is still being reaped: a short wait.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Ok(-1)
    }
}

/// Start `request` in `agent`'s sandbox, through `sandboxd run`.
pub(crate) async fn start(engine: &Engine, agent: &AgentId, mut request: ExecRequest) -> Result<ExecHandle> {
    if request.argv.is_empty() {
        return Err(Error::BadInput {
            problem: "exec needs a command".into(),
        });
    }
    let id = agenthold_core::AgentId::random().to_string();
    let timeout_ms = request.timeout.take().map(|t| t.as_millis());
    request.argv = sandboxd::contract::command::run(&id, timeout_ms, std::mem::take(&mut request.argv));
    let mut handle = start_raw(engine, agent, request).await?;
    handle.id = id;
    Ok(handle)
}

/// Start `request.argv` as is (no `sandboxd run` wrapper, no timeout).
pub(crate) async fn start_raw(engine: &Engine, agent: &AgentId, request: ExecRequest) -> Result<ExecHandle> {
    let cmd = request.argv;
    let id = String::new();
    let env: Vec<String> = request.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let options = CreateExecOptions {
        attach_stdin: Some(request.stdin.is_some()),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        env: (!env.is_empty()).then_some(env),
        cmd: Some(cmd),
        working_dir: request.cwd,
        ..Default::default()
    };
    let container = container_name(agent);
    let created = engine
        .docker
        .create_exec(&container, options)
        .await
        .map_err(|e| Error::engine(format!("exec in {agent}"), e))?;
    let started = engine
        .docker
        .start_exec(&created.id, None)
        .await
        .map_err(|e| Error::engine(format!("exec in {agent}"), e))?;
    let StartExecResults::Attached { output, mut input } = started else {
        return Err(Error::Unavailable {
            problem: "the engine detached an attached exec".into(),
        });
    };
    if let Some(stdin) = request.stdin {
        // Feed stdin from a task so a command that writes before reading cannot deadlock us.
        tokio::spawn(async move {
            let _ = input.write_all(&stdin).await;
            let _ = input.shutdown().await;
        });
    } else {
        let _ = input.shutdown().await;
    }
    Ok(ExecHandle {
        id,
        exec_id: created.id,
        output,
        engine: engine.clone(),
    })
}

/// Run to completion and collect the output (each stream capped at [`MAX_CAPTURE`]).
pub(crate) async fn collect(mut handle: ExecHandle) -> Result<ExecOutput> {
    let mut out = ExecOutput::default();
    while let Some(chunk) = handle.next().await {
        let (buf, data) = match chunk? {
            Chunk::Stdout(d) => (&mut out.stdout, d),
            Chunk::Stderr(d) => (&mut out.stderr, d),
        };
        let room = MAX_CAPTURE.saturating_sub(buf.len());
        buf.extend_from_slice(&data[..data.len().min(room)]);
    }
    out.exit_code = handle.wait().await?;
    Ok(out)
}
