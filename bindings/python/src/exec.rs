//! Commands: building an [`ExecRequest`], collecting a finished command's output, and [`ExecStream`], the
//! iterator over a running command's output (`Sandbox.exec_stream`).

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agenthold_core::AgentId;
use agenthold_core::sandbox::{ExecChunk, ExecRequest};
use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::errors::{Class, closed, core_err, sandbox_err};
use crate::runtime::{CANCEL_WAIT, Ctx, cancelled};

/// Chunks a stream may hold before the command's output waits for the reader.
const STREAM_WINDOW: usize = 64;

/// Validate and build a request.
pub(crate) fn request(
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    stdin: Option<Vec<u8>>,
    timeout: Option<Duration>,
) -> PyResult<ExecRequest> {
    if argv.is_empty() {
        return Err(
            Class::Sandbox.err("exec needs a command: argv is empty (e.g. [\"sh\", \"-c\", \"echo hi\"])")
        );
    }
    if let Some(k) = env
        .keys()
        .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
    {
        return Err(Class::Sandbox.err(format!("env: {k:?} is not a valid environment variable name")));
    }
    if let Some(cwd) = &cwd
        && !cwd.starts_with('/')
    {
        return Err(Class::Sandbox.err(format!("cwd={cwd:?}: give an absolute path")));
    }
    Ok(ExecRequest {
        argv,
        env,
        cwd,
        stdin,
        timeout,
    })
}

/// One item of a stream.
enum Item {
    Chunk(&'static str, bytes::Bytes),
    End(PyResult<i64>),
}

/// A running command's output, as an iterator of `(stream, data)` tuples where `stream` is `"stdout"` or
/// `"stderr"` and `data` is bytes. After the last chunk, `exit_code` holds the exit code. Ctrl-C while
/// iterating, or `cancel()`, kills the command in the sandbox.
#[pyclass(frozen, module = "agenthold", name = "ExecStream")]
pub(crate) struct ExecStream {
    rx: Mutex<Option<Receiver<Item>>>,
    window: Arc<Semaphore>,
    token: CancellationToken,
    exit_code: Mutex<Option<i64>>,
}

impl ExecStream {
    pub(crate) fn start(ctx: Ctx, agent: AgentId, request: ExecRequest) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        let window = Arc::new(Semaphore::new(STREAM_WINDOW));
        let (token, rt, win) = (ctx.token.clone(), Arc::clone(&ctx.runtime), Arc::clone(&window));
        ctx.tracker.spawn_on(
            async move {
                let end = run(&rt, &agent, request, &token, &win, &tx).await;
                let _ = tx.send(Item::End(end));
            },
            &ctx.handle,
        );
        Self {
            rx: Mutex::new(Some(rx)),
            window,
            token: ctx.token,
            exit_code: Mutex::new(None),
        }
    }
}

/// Start the command and forward its output until it ends or is cancelled.
async fn run(
    rt: &agenthold_sandbox::Runtime,
    agent: &AgentId,
    request: ExecRequest,
    token: &CancellationToken,
    window: &Semaphore,
    tx: &std::sync::mpsc::Sender<Item>,
) -> PyResult<i64> {
    let mut stream = rt.exec_stream(agent, request).await.map_err(sandbox_err)?;
    let id = stream.id().to_owned();
    let forward = async {
        while let Some(chunk) = stream.next().await {
            let item = match chunk.map_err(core_err)? {
                ExecChunk::Stdout(d) => Item::Chunk("stdout", d.into()),
                ExecChunk::Stderr(d) => Item::Chunk("stderr", d.into()),
                ExecChunk::Exit(code) => return Ok(code),
            };
            // One permit per chunk in flight; the reader gives it back.
            if let Ok(permit) = window.acquire().await {
                permit.forget();
            }
            if tx.send(item).is_err() {
                return Err(cancelled());
            }
        }
        // The output ended without an exit code: unknown, as `ExecOutput` has it.
        Ok(-1)
    };
    tokio::select! {
        code = forward => code,
        () = token.cancelled() => {
            let _ = tokio::time::timeout(CANCEL_WAIT, rt.cancel_exec(agent, &id)).await;
            Err(cancelled())
        }
    }
}

#[pymethods]
impl ExecStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<(&'static str, Py<PyBytes>)> {
        let Some(mut rx) = self.rx.lock().unwrap_or_else(PoisonError::into_inner).take() else {
            return Err(PyStopIteration::new_err(()));
        };
        loop {
            let (got, back) = py.detach(move || (rx.recv_timeout(Duration::from_millis(50)), rx));
            rx = back;
            match got {
                Ok(Item::Chunk(stream, data)) => {
                    self.window.add_permits(1);
                    *self.rx.lock().unwrap_or_else(PoisonError::into_inner) = Some(rx);
                    return Ok((stream, PyBytes::new(py, &data).unbind()));
                }
                Ok(Item::End(result)) => {
                    *self.exit_code.lock().unwrap_or_else(PoisonError::into_inner) = Some(result?);
                    return Err(PyStopIteration::new_err(()));
                }
                Err(RecvTimeoutError::Disconnected) => return Err(closed()),
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(signal) = py.check_signals() {
                        self.token.cancel();
                        self.window.add_permits(STREAM_WINDOW);
                        py.detach(move || {
                            let deadline = std::time::Instant::now() + CANCEL_WAIT;
                            while let Some(left) = deadline.checked_duration_since(std::time::Instant::now())
                            {
                                match rx.recv_timeout(left) {
                                    Ok(Item::End(_)) | Err(_) => break,
                                    Ok(Item::Chunk(..)) => {}
                                }
                            }
                        });
                        return Err(signal);
                    }
                }
            }
        }
    }

    /// The exit code once the output is exhausted, else `None`.
    #[getter]
    fn exit_code(&self) -> Option<i64> {
        *self.exit_code.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Kill the command (and everything it started) in the sandbox.
    fn cancel(&self) {
        self.token.cancel();
        self.window.add_permits(STREAM_WINDOW);
    }
}
