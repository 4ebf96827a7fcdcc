//! [`NativeRuntime`]: an `agenthold_sandbox::Runtime` with the tokio runtime that drives it, owned by one
//! Python object. Every operation runs as a task on that tokio runtime; the caller either waits for it
//! (with the GIL released; `exec` also polls for Ctrl-C and kills the command when it comes) or passes a
//! `done` callback and gets an [`Op`] back (the asyncio API). `close()` cancels what is running, waits for
//! the tasks, stops the gateway and joins every thread the runtime started.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agenthold_core::sandbox::SandboxState;
use agenthold_core::{AgentId, SandboxSpec};
use agenthold_egress::Dangerous;
use agenthold_sandbox::Runtime;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::errors::{Class, closed, core_err, sandbox_err};
use crate::exec::{self, ExecStream};
use crate::spec::{Policy, Secret};
use crate::values::{LogEntry, Value};

/// How often a waiting call checks for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(50);
/// How long an interrupted call waits for its command to be killed.
pub(crate) const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// How long `close()` waits for running operations to finish after cancelling them.
const CLOSE_WAIT: Duration = Duration::from_secs(15);

/// Everything a live runtime owns.
struct Live {
    tokio: tokio::runtime::Runtime,
    runtime: Arc<Runtime>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl Live {
    /// Cancel running operations, wait for them, stop the gateway, then stop and join the tokio runtime.
    fn shutdown(self) {
        let Self {
            tokio,
            runtime,
            tracker,
            cancel,
        } = self;
        cancel.cancel();
        tracker.close();
        tokio.block_on(async {
            let _ = tokio::time::timeout(CLOSE_WAIT, tracker.wait()).await;
            runtime.shutdown().await;
            drop(runtime);
        });
        tokio.shutdown_timeout(Duration::from_secs(5));
    }
}

/// What an operation needs from the live runtime.
pub(crate) struct Ctx {
    pub(crate) handle: Handle,
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) tracker: TaskTracker,
    /// A child of the runtime's token: cancelled by `close()` or by the caller.
    pub(crate) token: CancellationToken,
}

/// The native runtime behind `agenthold.Runtime`.
#[pyclass(frozen, module = "agenthold._native", name = "Runtime")]
pub(crate) struct NativeRuntime {
    live: Mutex<Option<Live>>,
    data_dir: PathBuf,
    ca_pem: String,
}

impl Drop for NativeRuntime {
    fn drop(&mut self) {
        // Normally `close()` ran (the Python wrapper calls it on `__exit__`, at garbage collection and at
        // exit). Here we may hold the GIL, and operations may wait for it: stop without waiting for them.
        let live = self.live.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(Live {
            tokio,
            runtime,
            cancel,
            ..
        }) = live
        {
            cancel.cancel();
            {
                let _entered = tokio.enter();
                drop(runtime);
            }
            tokio.shutdown_background();
        }
    }
}

/// Parse `IP:PORT`, or `IP` (port 53).
fn parse_dns_upstream(s: &str) -> PyResult<SocketAddr> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| {
            Class::Base.err(format!(
                "dns_upstream {s:?}: expected \"IP:PORT\", e.g. \"127.0.0.1:53\""
            ))
        })
}

/// Parse one `{"NAME:PORT": "IP:PORT"}` pair of `dangerous_connect_to`.
fn parse_connect_to(from: &str, to: &str) -> PyResult<(String, u16, SocketAddr)> {
    let bad = |what: String| Class::Base.err(format!("dangerous_connect_to {{{from:?}: {to:?}}}: {what}"));
    let (name, port) = from
        .rsplit_once(':')
        .ok_or_else(|| bad(format!("the key {from:?} needs a port (NAME:PORT)")))?;
    let port: u16 = port.parse().map_err(|_| bad(format!("bad port {port:?}")))?;
    let to: SocketAddr = to
        .parse()
        .map_err(|_| bad(format!("the value {to:?} is not IP:PORT")))?;
    let name = agenthold_core::policy::normalize_name(name).map_err(|e| bad(e.to_string()))?;
    Ok((name, port, to))
}

/// Parse a sandbox id.
pub(crate) fn parse_agent(id: &str) -> PyResult<AgentId> {
    AgentId::new(id).map_err(|e| Class::Sandbox.err(format!("{e}; sandbox ids come from create_sandbox")))
}

/// A timeout in seconds as a duration.
fn parse_timeout(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    seconds
        .map(|s| {
            Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| Class::Sandbox.err(format!("timeout={s}: give a positive number of seconds")))
        })
        .transpose()
}

/// Wait for an operation's result with the GIL released. With `interrupt`, poll for signals: on Ctrl-C
/// (or any exception a signal handler raises) cancel the operation, wait for it to wind down (the command
/// is killed in the sandbox), and raise that exception.
pub(crate) fn wait<T: Send>(
    py: Python<'_>,
    rx: Receiver<PyResult<T>>,
    interrupt: Option<&CancellationToken>,
) -> PyResult<T> {
    let Some(token) = interrupt else {
        return py.detach(move || rx.recv()).unwrap_or_else(|_| Err(closed()));
    };
    let mut rx = rx;
    loop {
        let (got, back) = py.detach(move || (rx.recv_timeout(SIGNAL_POLL), rx));
        rx = back;
        match got {
            Ok(result) => return result,
            Err(RecvTimeoutError::Disconnected) => return Err(closed()),
            Err(RecvTimeoutError::Timeout) => {
                if let Err(signal) = py.check_signals() {
                    token.cancel();
                    let _ = py.detach(move || rx.recv_timeout(CANCEL_WAIT));
                    return Err(signal);
                }
            }
        }
    }
}

/// Call an asyncio-side `done(ok, value)` callback with an operation's result.
fn deliver(py: Python<'_>, done: &Py<PyAny>, result: PyResult<Value>) {
    let (ok, value) = match result.and_then(|v| v.into_py(py)) {
        Ok(v) => (true, v),
        Err(e) => (false, e.into_value(py).into_any()),
    };
    if let Err(e) = done.call1(py, (ok, value)) {
        e.write_unraisable(py, None);
    }
}

/// The error an operation ends with when it was cancelled.
pub(crate) fn cancelled() -> PyErr {
    Class::Sandbox
        .err("the command was cancelled (interrupted, or the runtime was closed) and killed in the sandbox")
}

/// A running asyncio operation; `cancel()` stops it (and kills its command in the sandbox).
#[pyclass(frozen, module = "agenthold._native", name = "Op")]
pub(crate) struct Op {
    token: CancellationToken,
}

#[pymethods]
impl Op {
    /// Cancel the operation. A running command is killed in the sandbox; other operations finish.
    fn cancel(&self) {
        self.token.cancel();
    }
}

impl NativeRuntime {
    pub(crate) fn ctx(&self) -> PyResult<Ctx> {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let live = live.as_ref().ok_or_else(closed)?;
        Ok(Ctx {
            handle: live.tokio.handle().clone(),
            runtime: Arc::clone(&live.runtime),
            tracker: live.tracker.clone(),
            token: live.cancel.child_token(),
        })
    }

    /// Run `make(runtime, token)` as a task; wait for it (`done` is `None`) or hand its result to `done`.
    fn submit<F>(
        &self,
        py: Python<'_>,
        done: Option<Py<PyAny>>,
        interruptible: bool,
        make: impl FnOnce(Arc<Runtime>, CancellationToken) -> F,
    ) -> PyResult<Py<PyAny>>
    where
        F: Future<Output = PyResult<Value>> + Send + 'static,
    {
        let ctx = self.ctx()?;
        let token = ctx.token;
        let fut = make(ctx.runtime, token.clone());
        match done {
            None => {
                let (tx, rx) = std::sync::mpsc::channel();
                ctx.tracker.spawn_on(
                    async move {
                        let _ = tx.send(fut.await);
                    },
                    &ctx.handle,
                );
                wait(py, rx, interruptible.then_some(&token))?.into_py(py)
            }
            Some(done) => {
                ctx.tracker.spawn_on(
                    async move {
                        let result = fut.await;
                        Python::attach(|py| deliver(py, &done, result));
                    },
                    &ctx.handle,
                );
                Ok(Py::new(py, Op { token })?.into_any())
            }
        }
    }
}

#[pymethods]
impl NativeRuntime {
    /// Start a runtime: a tokio runtime, the egress gateway and the Docker sandbox runtime. Sandboxes a
    /// previous runtime on the same data directory left running are taken over.
    #[new]
    #[allow(clippy::needless_pass_by_value)] // pyo3 hands arguments over owned
    #[pyo3(signature = (data_dir=None, dns_upstream=None, dangerous_connect_to=BTreeMap::new(), dangerous_upstream_ca=None, warm_pool=None, store_url=None))]
    #[allow(clippy::too_many_arguments)] // one per keyword argument of `Runtime(...)`
    fn new(
        py: Python<'_>,
        data_dir: Option<PathBuf>,
        dns_upstream: Option<&str>,
        dangerous_connect_to: BTreeMap<String, String>,
        dangerous_upstream_ca: Option<PathBuf>,
        warm_pool: Option<usize>,
        store_url: Option<String>,
    ) -> PyResult<Self> {
        let dns = dns_upstream.map(parse_dns_upstream).transpose()?;
        let connect_to = dangerous_connect_to
            .iter()
            .map(|(from, to)| parse_connect_to(from, to))
            .collect::<PyResult<Vec<_>>>()?;
        let upstream_ca_pem = dangerous_upstream_ca
            .map(|p| {
                std::fs::read(&p).map_err(|e| {
                    Class::Base.err(format!(
                        "dangerous_upstream_ca {}: {e}; give the path of a PEM file",
                        p.display()
                    ))
                })
            })
            .transpose()?;
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("agenthold-runtime")
            .enable_all()
            .build()
            .map_err(|e| Class::Engine.err(format!("start the async runtime: {e}")))?;
        let mut builder = Runtime::builder().dangerous(Dangerous {
            connect_to,
            upstream_ca_pem,
        });
        if let Some(dir) = data_dir {
            builder = builder.data_dir(dir);
        }
        if let Some(addr) = dns {
            builder = builder.dns_upstream(addr);
        }
        if let Some(size) = warm_pool {
            builder = builder.warm_pool(size);
        }
        if let Some(url) = store_url {
            builder = builder.store_url(url);
        }
        let built = py.detach(|| tokio.block_on(builder.build()));
        let runtime = match built {
            Ok(r) => Arc::new(r),
            Err(e) => {
                py.detach(move || tokio.shutdown_timeout(Duration::from_secs(5)));
                let (class, message) = crate::errors::classify(e.kind(), e.to_string());
                // At start, nothing is the caller's sandbox yet: an unreachable engine is the engine's.
                let class = if class == Class::Sandbox {
                    Class::Engine
                } else {
                    class
                };
                return Err(class.err(message));
            }
        };
        let data_dir = runtime.config().data_dir().map_err(core_err)?;
        let ca_pem = runtime.ca_pem().to_owned();
        Ok(Self {
            live: Mutex::new(Some(Live {
                tokio,
                runtime,
                tracker: TaskTracker::new(),
                cancel: CancellationToken::new(),
            })),
            data_dir,
            ca_pem,
        })
    }

    /// The data directory (store, master key, CA).
    #[getter]
    fn data_dir(&self) -> PathBuf {
        self.data_dir.clone()
    }

    /// The installation's CA certificate (PEM) that sandboxes trust for intercepted hosts.
    #[getter]
    fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Whether `close()` ran.
    #[getter]
    fn closed(&self) -> bool {
        self.live.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }

    /// Warm-pool sandboxes ready to hand out right now (0 without a pool, or after `close()`).
    #[getter]
    fn warm_pool_ready(&self) -> usize {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, |live| live.runtime.warm_pool_ready())
    }

    /// Cancel running commands, stop the gateway and join every thread. Sandboxes keep existing; a runtime
    /// on the same data directory takes them over. Idempotent.
    fn close(&self, py: Python<'_>) {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(live) = live {
            py.detach(move || live.shutdown());
        }
    }

    /// Create and start a sandbox; returns its id.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (image, policy, secrets, env, cpus, memory, pids, done=None))]
    fn create_sandbox(
        &self,
        py: Python<'_>,
        image: String,
        policy: Option<&Bound<'_, Policy>>,
        secrets: Vec<Bound<'_, Secret>>,
        env: BTreeMap<String, String>,
        cpus: Option<f64>,
        memory: Option<u64>,
        pids: Option<u32>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        // Checked once, where the spec enters the runtime (`SandboxSpec::split`): limits, labels, secrets.
        let spec = SandboxSpec {
            image,
            env,
            cpus,
            memory_bytes: memory,
            pids,
            policy: policy.map(|p| p.get().inner.clone()).unwrap_or_default(),
            secrets: secrets.into_iter().map(|s| s.get().spec.clone()).collect(),
            ..SandboxSpec::default()
        };
        self.submit(py, done, false, move |rt, _| async move {
            let agent = rt.create_sandbox(spec).await.map_err(sandbox_err)?;
            Ok(Value::Str(agent.to_string()))
        })
    }

    /// Run a command to completion. Waiting, Ctrl-C cancels it (the command is killed in the sandbox).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (agent, argv, env, cwd, stdin, timeout, done=None))]
    fn exec(
        &self,
        py: Python<'_>,
        agent: &str,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
        stdin: Option<Vec<u8>>,
        timeout: Option<f64>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let agent = parse_agent(agent)?;
        let timeout = parse_timeout(timeout)?;
        let request = exec::request(argv, env, cwd, stdin, timeout)?;
        self.submit(py, done, true, move |rt, token| async move {
            let started = Instant::now();
            let stream = rt.exec_stream(&agent, request).await.map_err(sandbox_err)?;
            let id = stream.id().to_owned();
            tokio::select! {
                out = stream.collect() => {
                    let output = out.map_err(core_err)?;
                    let timed_out = timeout.is_some_and(|t| output.exit_code == 124 && started.elapsed() >= t);
                    Ok(Value::Exec { output, timed_out })
                }
                () = token.cancelled() => {
                    let _ = tokio::time::timeout(CANCEL_WAIT, rt.cancel_exec(&agent, &id)).await;
                    Err(cancelled())
                }
            }
        })
    }

    /// Start a command and iterate over its output as it comes.
    #[pyo3(signature = (agent, argv, env, cwd, stdin, timeout))]
    #[allow(clippy::too_many_arguments)]
    fn exec_stream(
        &self,
        agent: &str,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
        stdin: Option<Vec<u8>>,
        timeout: Option<f64>,
    ) -> PyResult<ExecStream> {
        let agent = parse_agent(agent)?;
        let timeout = parse_timeout(timeout)?;
        let request = exec::request(argv, env, cwd, stdin, timeout)?;
        Ok(ExecStream::start(self.ctx()?, agent, request))
    }

    /// Read a file from a sandbox.
    #[pyo3(signature = (agent, path, done=None))]
    fn read_file(
        &self,
        py: Python<'_>,
        agent: &str,
        path: String,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let agent = parse_agent(agent)?;
        self.submit(py, done, false, move |rt, _| async move {
            Ok(Value::Bytes(
                rt.read_file(&agent, &path).await.map_err(sandbox_err)?,
            ))
        })
    }

    /// Write (create or replace) a file in a sandbox.
    #[pyo3(signature = (agent, path, data, done=None))]
    fn write_file(
        &self,
        py: Python<'_>,
        agent: &str,
        path: String,
        data: &Bound<'_, PyBytes>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let agent = parse_agent(agent)?;
        let data = data.as_bytes().to_vec();
        self.submit(py, done, false, move |rt, _| async move {
            rt.write_file(&agent, &path, &data).await.map_err(sandbox_err)?;
            Ok(Value::Unit)
        })
    }

    /// Replace a sandbox's network policy; the next connection or DNS query uses it.
    #[pyo3(signature = (agent, policy, done=None))]
    fn set_policy(
        &self,
        py: Python<'_>,
        agent: &str,
        policy: &Bound<'_, Policy>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let agent = parse_agent(agent)?;
        let policy = policy.get().inner.clone();
        self.submit(py, done, false, move |rt, _| async move {
            rt.set_policy(&agent, policy).await.map_err(sandbox_err)?;
            Ok(Value::Unit)
        })
    }

    /// A sandbox's request log, oldest first.
    fn request_log(&self, agent: &str) -> PyResult<Vec<LogEntry>> {
        let agent = parse_agent(agent)?;
        Ok(self
            .ctx()?
            .runtime
            .request_log(&agent)
            .into_iter()
            .map(LogEntry::from)
            .collect())
    }

    /// Stop a sandbox (its files and settings stay).
    #[pyo3(signature = (agent, done=None))]
    fn stop(&self, py: Python<'_>, agent: &str, done: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        let agent = parse_agent(agent)?;
        self.submit(py, done, false, move |rt, _| async move {
            rt.stop(&agent).await.map_err(sandbox_err)?;
            Ok(Value::Unit)
        })
    }

    /// Start a stopped sandbox.
    #[pyo3(signature = (agent, done=None))]
    fn start(&self, py: Python<'_>, agent: &str, done: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        let agent = parse_agent(agent)?;
        self.submit(py, done, false, move |rt, _| async move {
            rt.start(&agent).await.map_err(sandbox_err)?;
            Ok(Value::Unit)
        })
    }

    /// Remove a sandbox with its network, rules and volume.
    #[pyo3(signature = (agent, done=None))]
    fn remove(&self, py: Python<'_>, agent: &str, done: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        let agent = parse_agent(agent)?;
        self.submit(py, done, false, move |rt, _| async move {
            rt.remove(&agent).await.map_err(sandbox_err)?;
            Ok(Value::Unit)
        })
    }

    /// `(state, image)` of a sandbox; state is `"running"` or `"stopped"`.
    #[pyo3(signature = (agent, done=None))]
    fn inspect(&self, py: Python<'_>, agent: &str, done: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        let agent = parse_agent(agent)?;
        self.submit(py, done, false, move |rt, _| async move {
            let info = rt.inspect(&agent).await.map_err(sandbox_err)?;
            Ok(Value::Info {
                running: info.state == SandboxState::Running,
                image: info.image,
            })
        })
    }

    /// Ids of every sandbox this runtime knows.
    #[pyo3(signature = (done=None))]
    fn sandboxes(&self, py: Python<'_>, done: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        self.submit(py, done, false, move |rt, _| async move {
            let ids = rt.sandboxes().await.map_err(sandbox_err)?;
            Ok(Value::Strs(ids.into_iter().map(|a| a.to_string()).collect()))
        })
    }
}
