//! Running commands in a sandbox (P1) through the engine's exec API. Every command goes through
//! `sandboxd run`, which puts it in its own process group, enforces the timeout by killing the whole group,
//! and records the group so that a running command can be cancelled (`sandboxd kill`), on any OCI runtime.
//!
//! Whether a command still runs ([`running`]) is the engine's answer about the exec that runs its
//! `sandboxd run --id ID` wrapper: `run` waits for the command, so the exec runs exactly as long as the
//! command's leader does. The engine lists only running execs on a container and forgets them all when it
//! stops, so an id from before a restart of the sandbox is not running.

use agenthold_core::AgentId;
use agenthold_core::sandbox::{ExecChunk, ExecRequest, ExecStream};
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures_util::{StreamExt, future, stream};
use tokio::io::AsyncWriteExt;

use super::container::container_name;
use crate::docker::engine::Engine;
use crate::docker::engine::is_not_found;
use crate::error::{Error, Result};

/// Start `request` in `agent`'s sandbox, through `sandboxd run`.
pub(crate) async fn start(engine: &Engine, agent: &AgentId, mut request: ExecRequest) -> Result<ExecStream> {
    if request.argv.is_empty() {
        return Err(Error::BadInput {
            problem: "exec needs a command".into(),
        });
    }
    let id = agenthold_core::AgentId::random().to_string();
    let timeout_ms = request.timeout.take().map(|t| t.as_millis());
    request.argv = sandboxd::contract::command::run(&id, timeout_ms, std::mem::take(&mut request.argv));
    start_raw(engine, agent, request, id).await
}

/// Start `request.argv` as is (no `sandboxd run` wrapper, no timeout); the stream is known as `id`.
pub(crate) async fn start_raw(
    engine: &Engine,
    agent: &AgentId,
    request: ExecRequest,
    id: String,
) -> Result<ExecStream> {
    let cmd = request.argv;
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
    let (exec_id, output, input) = attach(engine, agent, options).await?;
    feed(input, request.stdin).await;
    Ok(into_stream(engine, agent, id, exec_id, output, None))
}

/// Give a command its stdin and close it (at once when there is none). Fed from a task, so a command that
/// writes before it reads cannot deadlock us.
async fn feed(mut input: Input, stdin: Option<Vec<u8>>) {
    if let Some(stdin) = stdin {
        tokio::spawn(async move {
            let _ = input.write_all(&stdin).await;
            let _ = input.shutdown().await;
        });
    } else {
        let _ = input.shutdown().await;
    }
}

/// Create and start an exec in `agent`'s sandbox, attached: its engine id, output and stdin.
async fn attach(
    engine: &Engine,
    agent: &AgentId,
    options: CreateExecOptions<String>,
) -> Result<(String, Output, Input)> {
    let created = engine
        .docker
        .create_exec(&container_name(agent), options)
        .await
        .map_err(|e| Error::engine(format!("exec in {agent}"), e))?;
    let started = engine
        .docker
        .start_exec(&created.id, None)
        .await
        .map_err(|e| Error::engine(format!("exec in {agent}"), e))?;
    let StartExecResults::Attached { output, input } = started else {
        return Err(Error::Unavailable {
            problem: "the engine detached an attached exec".into(),
        });
    };
    Ok((created.id, output, input))
}

/// How often the sandbox of a command whose output is still open is checked for life (see [`stopped`]).
const ALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Resolves once `container` no longer runs (or is gone), looking every [`ALIVE_EVERY`]; an engine that
/// does not answer keeps it waiting. The engine normally ends an exec's output when its container stops,
/// but not always: when a gVisor sandbox failed under load, the engine lost the exec's exit and its output
/// stayed open for good.
async fn stopped(engine: Engine, container: String) {
    loop {
        tokio::time::sleep(ALIVE_EVERY).await;
        match engine
            .docker
            .inspect_container(
                &container,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
        {
            Ok(c) if c.state.as_ref().and_then(|s| s.running) == Some(true) => {}
            Ok(_) => return,
            Err(e) if is_not_found(&e) => return,
            Err(_) => {}
        }
    }
}

/// The engine's output of exec `exec_id` in `agent`'s sandbox as the stream of the command known as `id`:
/// `first` (output read already), the rest of `output`, then the exit code once the output is drained. If
/// the sandbox stops while the output is open and the engine does not end it, the stream ends with an
/// error instead of waiting for good.
fn into_stream(
    engine: &Engine,
    agent: &AgentId,
    id: String,
    exec_id: String,
    output: Output,
    first: Option<ExecChunk>,
) -> ExecStream {
    let died = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = {
        let died = std::sync::Arc::clone(&died);
        let stopped = stopped(engine.clone(), container_name(agent));
        async move {
            stopped.await;
            died.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    };
    let agent = agent.clone();
    let chunks = output.take_until(Box::pin(watch)).filter_map(|item| {
        future::ready(match item {
            Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                Some(Ok(ExecChunk::Stdout(message.into())))
            }
            Ok(LogOutput::StdErr { message }) => Some(Ok(ExecChunk::Stderr(message.into()))),
            Ok(LogOutput::StdIn { .. }) => None,
            Err(e) => Some(Err(Error::engine("read command output", e).into())),
        })
    });
    let engine = engine.clone();
    let exit = stream::once(async move {
        if died.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Unavailable {
                problem: format!("the sandbox of {agent} stopped while the command ran"),
            });
        }
        exit_code(engine, exec_id).await
    })
    .map(|code| code.map(ExecChunk::Exit).map_err(agenthold_core::Error::from));
    ExecStream::new(id, stream::iter(first.map(Ok)).chain(chunks).chain(exit))
}

/// The stdin half of an attached exec.
type Input = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// The output half of an attached exec.
type Output = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>> + Send>,
>;

/// A `sandboxd run --id ID --request-stdin` started ahead of its command and attached (its stdin and
/// output held here), so that the command it is given later starts without an engine exec
/// (`sandboxd::contract::request`). The warm pool keeps one in each sandbox for its first command.
pub(crate) struct Ahead {
    /// The id the command will be known by ([`ExecStream::id`], `sandboxd kill --id`).
    id: String,
    /// The engine's exec.
    exec_id: String,
    input: Input,
    output: Output,
}

impl std::fmt::Debug for Ahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ahead")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// How long a command given to a [`Ahead`] waits for sandboxd's acknowledgement.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Start a `run` ahead of its command in `agent`'s (running) sandbox.
pub(crate) async fn start_ahead(engine: &Engine, agent: &AgentId) -> Result<Ahead> {
    let id = agenthold_core::AgentId::random().to_string();
    let options = CreateExecOptions {
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        cmd: Some(sandboxd::contract::command::run_ahead(&id)),
        ..Default::default()
    };
    let (exec_id, output, input) = attach(engine, agent, options).await?;
    Ok(Ahead {
        id,
        exec_id,
        input,
        output,
    })
}

/// Give `request` to `ahead`. `Ok(Err(request))` when `ahead` cannot take it and it never started (the
/// `run` ended without acknowledging it, or the request cannot be carried): the caller starts it as a new
/// exec. When the acknowledgement cannot be known (the engine's stream broke, or [`READY_WAIT`] passed),
/// the command is cancelled by its id and this fails, so it never runs twice.
pub(crate) async fn start_with(
    engine: &Engine,
    agent: &AgentId,
    ahead: Ahead,
    request: ExecRequest,
) -> Result<std::result::Result<ExecStream, ExecRequest>> {
    let Ahead {
        id,
        exec_id,
        mut input,
        mut output,
    } = ahead;
    let wire = sandboxd::contract::request::Request {
        argv: request.argv.iter().map(|a| a.clone().into_bytes()).collect(),
        env: request
            .env
            .iter()
            .map(|(k, v)| (k.clone().into_bytes(), v.clone().into_bytes()))
            .collect(),
        cwd: request.cwd.clone().map(String::into_bytes),
        timeout_ms: request
            .timeout
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)),
    };
    let Ok(bytes) = wire.encode() else {
        // Left to the engine's exec, which reports what is wrong with it as before.
        return Ok(Err(request));
    };
    // Everything before the acknowledgement is sandboxd's (a complaint on stderr); the byte itself is
    // stripped, and what follows it in the same piece is the command's.
    // `Ok(Err(said))`: the output ended without the byte, so the command never started. `Err(())`: the
    // engine's stream broke, and the byte may have been lost on the way.
    let ready = tokio::time::timeout(READY_WAIT, async {
        let mut said = Vec::new();
        if input.write_all(&bytes).await.is_err() || input.flush().await.is_err() {
            // The `run` is gone (its stdin closed): nothing started.
            return Ok(Err(said));
        }
        while let Some(item) = output.next().await {
            match item {
                Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                    if let Some((&first, rest)) = message.split_first()
                        && first == sandboxd::contract::request::READY
                    {
                        return Ok(Ok(rest.to_vec()));
                    }
                    said.extend_from_slice(&message);
                }
                Ok(LogOutput::StdErr { message }) => said.extend_from_slice(&message),
                Ok(LogOutput::StdIn { .. }) => {}
                Err(_) => return Err(()),
            }
        }
        Ok(Err(said))
    })
    .await;
    let rest = match ready {
        Ok(Ok(Ok(rest))) => rest,
        Ok(Ok(Err(said))) => {
            tracing::warn!(
                agent = %agent,
                said = %String::from_utf8_lossy(&said[..said.len().min(512)]),
                "the run started ahead did not take its command; starting it as a new exec"
            );
            return Ok(Err(request));
        }
        Ok(Err(())) | Err(_) => {
            // It may have taken it, or still take it: make sure it never starts (or is killed), then fail;
            // starting it elsewhere could run it twice.
            let _ = cancel(engine, agent, &id).await;
            return Err(Error::Unavailable {
                problem: format!(
                    "the sandbox of {agent} did not acknowledge the command (the engine's stream broke, or \
                     {} s passed)",
                    READY_WAIT.as_secs()
                ),
            });
        }
    };
    feed(input, request.stdin).await;
    let first = (!rest.is_empty()).then_some(ExecChunk::Stdout(rest));
    Ok(Ok(into_stream(engine, agent, id, exec_id, output, first)))
}

/// How long [`exit_code`] waits for the engine to reap a command whose output closed.
const REAP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The exit code of a command whose output closed (-1 when the engine still reports it running after
/// [`REAP_WAIT`]).
pub(crate) async fn exit_code(engine: Engine, exec_id: String) -> Result<i64> {
    let deadline = tokio::time::Instant::now() + REAP_WAIT;
    // Output closed but the process may still be being reaped: waits of 1, 2, 4, 8, 16, then 20 ms, so the
    // usual case (reaped within a millisecond or two) does not pay a whole 20 ms on every command.
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        let inspect = engine
            .docker
            .inspect_exec(&exec_id)
            .await
            .map_err(|e| Error::engine("inspect exec", e))?;
        if inspect.running != Some(true) {
            return Ok(inspect.exit_code.unwrap_or(-1));
        }
        if tokio::time::Instant::now() + pause > deadline {
            return Ok(-1);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(20));
    }
}

/// Kill the command known as `exec_id` and its process group (`sandboxd kill`); one that ended is fine.
pub(crate) async fn cancel(engine: &Engine, agent: &AgentId, exec_id: &str) -> Result<()> {
    let request = ExecRequest {
        argv: sandboxd::contract::command::kill(exec_id),
        ..Default::default()
    };
    // `sandboxd kill` itself is not wrapped in `sandboxd run`: exec the binary directly.
    let killed = start_raw(engine, agent, request, String::new()).await?;
    killed.collect().await?;
    Ok(())
}

/// Whether the engine still runs the exec of `sandboxd run --id EXEC_ID` in `agent`'s sandbox.
pub(crate) async fn running(engine: &Engine, agent: &AgentId, exec_id: &str) -> Result<bool> {
    if !sandboxd::contract::valid_exec_id(exec_id) {
        return Err(Error::BadInput {
            problem: format!("{exec_id:?} is not an exec id"),
        });
    }
    let container = match engine
        .docker
        .inspect_container(&container_name(agent), None)
        .await
    {
        Ok(c) => c,
        Err(e) if is_not_found(&e) => {
            return Err(Error::NotFound {
                agent: agent.to_string(),
            });
        }
        Err(e) => return Err(Error::engine(format!("inspect the sandbox of {agent}"), e)),
    };
    if container.state.and_then(|s| s.running) != Some(true) {
        return Ok(false);
    }
    let wanted = [
        sandboxd::contract::command::RUN,
        sandboxd::contract::command::OPT_ID,
        exec_id,
    ];
    for id in container.exec_ids.unwrap_or_default() {
        let exec = match engine.docker.inspect_exec(&id).await {
            Ok(exec) => exec,
            // Ended and forgotten between the two requests.
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(Error::engine("inspect exec", e)),
        };
        let Some(process) = exec.process_config else {
            continue;
        };
        let ours = process.entrypoint.as_deref() == Some(sandboxd::contract::SANDBOXD)
            && process
                .arguments
                .as_deref()
                .is_some_and(|args| args.len() >= wanted.len() && args[..wanted.len()] == wanted);
        if ours && exec.running == Some(true) {
            return Ok(true);
        }
    }
    Ok(false)
}
