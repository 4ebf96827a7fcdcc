//! Terminals in a Docker sandbox (P1): an exec with a pseudo-terminal allocated by the engine, its output
//! read byte for byte on a connection of our own (`hijack`), its input fed from a channel, its window size
//! set with the engine's resize call.
//!
//! The program runs under `sandboxd run --id ID` like every other command, so the terminal's id works with
//! `cancel_exec` and `exec_running`, and closing the terminal kills the same way: `sandboxd kill` sends
//! SIGKILL to the program's process group. A shell with job control puts each foreground job in a group
//! of its own; those lose their terminal when `sandboxd run` (the session leader) exits, and the kernel
//! hangs them up. A job the user put in the background with `nohup` or `setsid` outlives the terminal, as
//! it would outlive an SSH session.
// enforces: P1

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agenthold_core::AgentId;
use agenthold_core::sandbox::{Terminal, TerminalControl, TerminalEvent, TerminalRequest};
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::ContainerArchiveInfoOptions;
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt, future, stream};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::container::container_name;
use super::engine::Engine;
use super::{exec, hijack};
use crate::error::{Error, Result};

/// The terminal type a terminal gets unless its request sets `TERM`.
pub(crate) const TERM: &str = "xterm-256color";

/// Keystroke chunks queued towards the engine before `write` waits.
const INPUT_QUEUE: usize = 64;
/// Most output read at once.
const READ_CHUNK: usize = 16 * 1024;
/// The shell a terminal runs when the request names no program and the image has no bash.
const SH: &str = "/bin/sh";
/// The shell preferred when the image has it.
const BASH: &str = "/bin/bash";

/// Open a terminal running `request.argv` (or the image's shell) in `agent`'s sandbox.
pub(super) async fn open(engine: &Engine, agent: &AgentId, request: TerminalRequest) -> Result<Terminal> {
    let TerminalRequest {
        argv,
        mut env,
        cwd,
        cols,
        rows,
    } = request;
    if cols == 0 || rows == 0 {
        return Err(Error::BadInput {
            problem: format!("a terminal of {cols}x{rows}: give at least one column and one row"),
        });
    }
    let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::Unavailable {
        problem: "a terminal is opened from inside a tokio runtime".into(),
    })?;
    let argv = if argv.is_empty() {
        vec![shell(engine, agent).await.to_owned()]
    } else {
        argv
    };
    env.entry("TERM".to_owned()).or_insert_with(|| TERM.to_owned());
    let id = AgentId::random().to_string();
    let options = CreateExecOptions {
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(true),
        env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        cmd: Some(sandboxd::contract::command::run(&id, None, argv)),
        working_dir: cwd,
        ..Default::default()
    };
    let created = engine
        .docker
        .create_exec(&container_name(agent), options)
        .await
        .map_err(|e| Error::engine(format!("open a terminal in {agent}"), e))?;
    let (output, mut input) = attach(engine, agent, &created.id).await?;
    let control = Arc::new(DockerTerminal {
        engine: engine.clone(),
        agent: agent.clone(),
        id: id.clone(),
        exec_id: created.id.clone(),
        input: {
            let (tx, mut rx) = mpsc::channel::<Bytes>(INPUT_QUEUE);
            handle.spawn(async move {
                while let Some(data) = rx.recv().await {
                    if input.write_all(&data).await.is_err() || input.flush().await.is_err() {
                        return;
                    }
                }
                let _ = input.shutdown().await;
            });
            tx
        },
        handle,
        killed: AtomicBool::new(false),
        ended: AtomicBool::new(false),
    });
    // The engine's exec API (1.41) takes no initial size: set it once the exec runs. A program that ended
    // already cannot be resized, and that is no reason to fail the open.
    if let Err(e) = control.resize(cols, rows).await {
        tracing::debug!(agent = %agent, error = %e, "the first resize of a terminal failed");
    }
    let events = output.map(|item| item.map(TerminalEvent::Output));
    let ended = Arc::clone(&control);
    let exit = stream::once(exec::exit_code(engine.clone(), created.id)).map(move |code| {
        // From now on input has nowhere to go.
        ended.ended.store(true, Ordering::Release);
        code.map(|c| TerminalEvent::Exit((c >= 0).then_some(c)))
            .map_err(agenthold_core::Error::from)
    });
    Ok(Terminal::new(id, control, events.chain(exit)))
}

/// The output of a started terminal exec.
type Output = Pin<Box<dyn Stream<Item = agenthold_core::Result<Bytes>> + Send>>;
/// Its input.
type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// Start the exec attached: on a connection of our own when the engine's socket is known (bytes as they
/// are, see `hijack`), else through bollard (whose decoder can stall on output starting with a byte 0, 1
/// or 2).
async fn attach(engine: &Engine, agent: &AgentId, exec_id: &str) -> Result<(Output, Input)> {
    if let Some(socket) = engine.socket() {
        let version = engine.docker.client_version();
        let hijacked = hijack::start_tty(socket, &version, exec_id).await?;
        let early = (!hijacked.early.is_empty()).then_some(Ok(hijacked.early));
        let rest = stream::unfold(Some(hijacked.output), |read| async move {
            let mut read = read?;
            let mut buf = BytesMut::with_capacity(READ_CHUNK);
            match read.read_buf(&mut buf).await {
                Ok(0) => None,
                Ok(_) => Some((Ok(buf.freeze()), Some(read))),
                Err(e) => Some((Err(Error::io("read terminal output", e).into()), None)),
            }
        });
        return Ok((
            Box::pin(stream::iter(early).chain(rest)),
            Box::pin(hijacked.input),
        ));
    }
    let start = StartExecOptions {
        detach: false,
        tty: true,
        output_capacity: None,
    };
    let started = engine
        .docker
        .start_exec(exec_id, Some(start))
        .await
        .map_err(|e| Error::engine(format!("open a terminal in {agent}"), e))?;
    let StartExecResults::Attached { output, input } = started else {
        return Err(Error::Unavailable {
            problem: "the engine detached an attached exec".into(),
        });
    };
    let output = output.filter_map(|item| {
        future::ready(match item {
            Ok(
                LogOutput::Console { message }
                | LogOutput::StdOut { message }
                | LogOutput::StdErr { message },
            ) => Some(Ok(message)),
            Ok(LogOutput::StdIn { .. }) => None,
            Err(e) => Some(Err(Error::engine("read terminal output", e).into())),
        })
    });
    Ok((Box::pin(output), input))
}

/// `/bin/bash` when the image has it, else `/bin/sh`; asked of the engine, not of a program in the
/// sandbox.
async fn shell(engine: &Engine, agent: &AgentId) -> &'static str {
    let options = ContainerArchiveInfoOptions { path: BASH.into() };
    match engine
        .docker
        .get_container_archive_info(&container_name(agent), Some(options))
        .await
    {
        Ok(stat) if stat.file_mode & (1 << 31) == 0 => BASH,
        _ => SH,
    }
}

/// One open terminal, as the engine knows it.
struct DockerTerminal {
    engine: Engine,
    agent: AgentId,
    /// `sandboxd run --id` of the program.
    id: String,
    /// The engine's exec.
    exec_id: String,
    /// Towards the task that writes to the exec's input.
    input: mpsc::Sender<Bytes>,
    /// Where the kill of a dropped terminal runs.
    handle: tokio::runtime::Handle,
    /// Closed (killed) by its owner.
    killed: AtomicBool,
    /// The process ended (its exit was read).
    ended: AtomicBool,
}

#[async_trait::async_trait]
impl TerminalControl for DockerTerminal {
    async fn write(&self, data: Bytes) -> agenthold_core::Result<()> {
        if self.killed.load(Ordering::Acquire) || self.ended.load(Ordering::Acquire) {
            return Err(closed(&self.agent));
        }
        self.input.send(data).await.map_err(|_| closed(&self.agent))
    }

    async fn resize(&self, cols: u16, rows: u16) -> agenthold_core::Result<()> {
        if cols == 0 || rows == 0 {
            return Err(Error::BadInput {
                problem: format!("a terminal of {cols}x{rows}: give at least one column and one row"),
            }
            .into());
        }
        let size = ResizeExecOptions {
            height: rows,
            width: cols,
        };
        self.engine
            .docker
            .resize_exec(&self.exec_id, size)
            .await
            .map_err(|e| Error::engine(format!("resize a terminal in {}", self.agent), e).into())
    }

    fn kill(&self) {
        if self.killed.swap(true, Ordering::AcqRel) {
            return;
        }
        let (engine, agent, id) = (self.engine.clone(), self.agent.clone(), self.id.clone());
        self.handle.spawn(async move {
            if let Err(e) = exec::cancel(&engine, &agent, &id).await {
                tracing::warn!(agent = %agent, error = %e, "could not kill a closed terminal's process");
            }
        });
    }
}

/// Writing to a terminal whose process ended or that was closed.
fn closed(agent: &AgentId) -> agenthold_core::Error {
    agenthold_core::Error::backend(
        agenthold_core::ErrorKind::Conflict,
        "",
        format!("the terminal in {agent} is closed"),
    )
}
