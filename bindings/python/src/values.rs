//! What calls return: [`ExecResult`], [`LogEntry`], and [`Value`], the GIL-free result of an operation that
//! becomes a Python object once the caller holds the GIL again.

use agenthold_egress::log::{Decision, LogKind, Phase};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

/// The outcome of `Sandbox.exec`: `exit_code`, `stdout` and `stderr` (bytes, each capped at 64 MiB), and
/// `timed_out` (the command outran its `timeout` and was killed; `exit_code` is then 124).
#[pyclass(frozen, module = "agenthold", name = "ExecResult")]
pub(crate) struct ExecResult {
    /// Exit code (128 + signal number when killed by a signal, 124 on timeout, -1 when unknown).
    #[pyo3(get)]
    exit_code: i64,
    /// Everything the command wrote to standard output.
    #[pyo3(get)]
    stdout: Py<PyBytes>,
    /// Everything the command wrote to standard error.
    #[pyo3(get)]
    stderr: Py<PyBytes>,
    /// Whether the command was killed because it outran its timeout.
    #[pyo3(get)]
    timed_out: bool,
}

#[pymethods]
impl ExecResult {
    /// `exit_code == 0`.
    #[getter]
    fn ok(&self) -> bool {
        self.exit_code == 0
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let (out, err) = (
            self.stdout.bind(py).as_bytes().len(),
            self.stderr.bind(py).as_bytes().len(),
        );
        format!(
            "ExecResult(exit_code={}, stdout=<{out} bytes>, stderr=<{err} bytes>, timed_out={})",
            self.exit_code,
            if self.timed_out { "True" } else { "False" }
        )
    }
}

/// One line of a sandbox's request log: a DNS query, a connection or an HTTP request the gateway decided.
/// Attribute names are those of the `agenthold run --log` JSON lines.
#[pyclass(frozen, module = "agenthold", name = "LogEntry")]
pub(crate) struct LogEntry {
    /// When the decision was made, RFC 3339 in UTC.
    #[pyo3(get)]
    time: String,
    /// The sandbox (agent id).
    #[pyo3(get)]
    agent: String,
    /// `"dns"`, `"tcp"`, `"tls"`, `"http"` or `"connect"`.
    #[pyo3(get)]
    kind: &'static str,
    /// Host name (or address when there was no name).
    #[pyo3(get)]
    host: Option<String>,
    /// Destination port.
    #[pyo3(get)]
    port: Option<u16>,
    /// HTTP method, or the DNS query type.
    #[pyo3(get)]
    method: Option<String>,
    /// HTTP path, without the query string.
    #[pyo3(get)]
    path: Option<String>,
    /// HTTP status, or the DNS response code.
    #[pyo3(get)]
    status: Option<u16>,
    /// `"allowed"` or `"denied"`.
    #[pyo3(get)]
    decision: &'static str,
    /// Why it was denied (or would have been, `report_only:...`), or what failed upstream.
    #[pyo3(get)]
    reason: Option<String>,
    /// Whether a secret was injected into this request.
    #[pyo3(get)]
    secret_injected: bool,
    /// Name of the injected secret (never its value).
    #[pyo3(get)]
    secret: Option<String>,
    /// Bytes from the sandbox towards the upstream.
    #[pyo3(get)]
    bytes_up: u64,
    /// Bytes from the upstream towards the sandbox.
    #[pyo3(get)]
    bytes_down: u64,
    /// For long-lived connections, `"open"` (written when it opened) or `"closed"`; `None` otherwise.
    #[pyo3(get)]
    phase: Option<&'static str>,
}

impl From<agenthold_egress::log::LogEntry> for LogEntry {
    fn from(e: agenthold_egress::log::LogEntry) -> Self {
        Self {
            time: e.time,
            agent: e.agent.to_string(),
            kind: match e.kind {
                LogKind::Dns => "dns",
                LogKind::Tcp => "tcp",
                LogKind::Tls => "tls",
                LogKind::Http => "http",
                LogKind::Connect => "connect",
            },
            host: e.host,
            port: e.port,
            method: e.method,
            path: e.path,
            status: e.status,
            decision: match e.decision {
                Decision::Allowed => "allowed",
                Decision::Denied => "denied",
            },
            // The typed reason, written as the log's JSON line writes it.
            reason: e.reason.as_ref().map(ToString::to_string),
            secret_injected: e.secret_injected,
            secret: e.secret,
            bytes_up: e.bytes_up,
            bytes_down: e.bytes_down,
            phase: e.phase.map(|p| match p {
                Phase::Open => "open",
                Phase::Closed => "closed",
            }),
        }
    }
}

#[pymethods]
impl LogEntry {
    /// The entry as a dict with the JSON line's keys.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("time", &self.time)?;
        d.set_item("agent", &self.agent)?;
        d.set_item("kind", self.kind)?;
        d.set_item("host", &self.host)?;
        d.set_item("port", self.port)?;
        d.set_item("method", &self.method)?;
        d.set_item("path", &self.path)?;
        d.set_item("status", self.status)?;
        d.set_item("decision", self.decision)?;
        d.set_item("reason", &self.reason)?;
        d.set_item("secret_injected", self.secret_injected)?;
        d.set_item("secret", &self.secret)?;
        d.set_item("bytes_up", self.bytes_up)?;
        d.set_item("bytes_down", self.bytes_down)?;
        d.set_item("phase", self.phase)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let opt = |v: &Option<String>| {
            v.as_deref()
                .map_or_else(|| "None".to_owned(), |s| format!("{s:?}"))
        };
        let num = |v: Option<u16>| v.map_or_else(|| "None".to_owned(), |n| n.to_string());
        format!(
            "LogEntry(kind={:?}, host={}, port={}, method={}, path={}, status={}, decision={:?}, reason={}, \
             secret_injected={})",
            self.kind,
            opt(&self.host),
            num(self.port),
            opt(&self.method),
            opt(&self.path),
            num(self.status),
            self.decision,
            opt(&self.reason),
            if self.secret_injected { "True" } else { "False" },
        )
    }
}

/// A finished operation's result, built without the GIL.
#[derive(Debug)]
pub(crate) enum Value {
    /// `None`.
    Unit,
    /// A string (an agent id).
    Str(String),
    /// Bytes (a file).
    Bytes(Vec<u8>),
    /// A list of strings (agent ids).
    Strs(Vec<String>),
    /// A finished command.
    Exec {
        output: agenthold_core::sandbox::ExecOutput,
        timed_out: bool,
    },
    /// A state and an image (`inspect`).
    Info { running: bool, image: String },
}

impl Value {
    pub(crate) fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            Self::Unit => py.None(),
            Self::Str(s) => s.into_pyobject(py)?.into_any().unbind(),
            Self::Bytes(b) => PyBytes::new(py, &b).into_any().unbind(),
            Self::Strs(v) => v.into_pyobject(py)?.into_any().unbind(),
            Self::Exec { output, timed_out } => {
                let result = ExecResult {
                    exit_code: output.exit_code,
                    stdout: PyBytes::new(py, &output.stdout).unbind(),
                    stderr: PyBytes::new(py, &output.stderr).unbind(),
                    timed_out,
                };
                Py::new(py, result)?.into_any()
            }
            Self::Info { running, image } => {
                let state = if running { "running" } else { "stopped" };
                (state, image).into_pyobject(py)?.into_any().unbind()
            }
        })
    }
}
