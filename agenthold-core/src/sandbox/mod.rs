//! What a sandbox is made of ([`SandboxSpec`], checked once and split into its [`ContainerSpec`] and
//! [`GatewaySpec`] halves), the commands run in it ([`ExecRequest`], [`ExecStream`]), its terminals
//! ([`TerminalRequest`], [`Terminal`]) and files ([`DirEntry`], [`sandbox_path`]), and the [`Sandbox`]
//! runtime trait that creates and drives sandboxes. The default implementation (Docker) lives in
//! `agenthold-sandbox`, beside `FakeSandbox`, an in-memory test double.
//!
//! Labels under `agenthold.*` are agenthold's own (S15): the runtime finds its engine objects and the agent
//! an engine event is about by them, so [`SandboxSpec::split`] refuses them (see
//! [`RESERVED_LABEL_PREFIXES`]).

mod exec;
mod files;
mod spec;
mod terminal;

pub use exec::{ChunkStream, ExecChunk, ExecOutput, ExecRequest, ExecStream, MAX_CAPTURE};
pub use files::{DirEntry, EntryKind, sandbox_path};
pub use spec::{ContainerSpec, GatewaySpec, RESERVED_LABEL_PREFIXES, SandboxSpec};
pub use terminal::{
    Terminal, TerminalControl, TerminalEvent, TerminalEvents, TerminalInput, TerminalRequest,
};

use crate::error::{ErrorKind, Result};
use crate::ids::AgentId;

/// Run state of a sandbox as the runtime sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Created or stopped.
    Stopped,
    /// Running.
    Running,
}

/// What the runtime reports about a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxInfo {
    /// The agent.
    pub agent: AgentId,
    /// Run state.
    pub state: SandboxState,
    /// The image it runs.
    pub image: String,
}

/// What [`Sandbox::reconcile`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Agents whose sandbox exists (running or stopped) and was taken over.
    pub restored: Vec<AgentId>,
    /// Agents the runtime has a record of but whose sandbox is gone (left for the owner to remove).
    pub missing: Vec<AgentId>,
}

/// A sandbox runtime: creates, starts, stops and removes agents' sandboxes and runs commands in them.
///
/// Contract: operations on one agent are idempotent where that makes sense (`stop` of a stopped sandbox and
/// `remove` of a removed one succeed); `remove` leaves no engine object, network or rule behind; a failed
/// `create` leaves nothing behind either. Errors for unknown agents are [`crate::Error::NotFound`].
///
/// An implementation is given only the container half of a spec ([`ContainerSpec`]), already checked by
/// [`SandboxSpec::split`]; the gateway half (policy, secrets) stays with the runtime and its gateway. A
/// runtime that wires its sandboxes to agenthold's gateway gets the gateway when it is built (see
/// `agenthold_sandbox::RuntimeBuilder::sandbox_factory`).
///
/// File operations take absolute paths in normal form; an implementation refuses others as
/// [`sandbox_path`] does ([`ErrorKind::BadInput`]). The operations added after the first release (files
/// beyond read and write, terminals, exec liveness) have defaults that answer [`ErrorKind::Unavailable`], so
/// a runtime written before them still builds and says plainly what it cannot do.
#[async_trait::async_trait]
pub trait Sandbox: Send + Sync {
    /// Create (and start) the sandbox of `agent`.
    async fn create(&self, agent: &AgentId, spec: &ContainerSpec) -> Result<SandboxInfo>;
    /// Start a stopped sandbox.
    async fn start(&self, agent: &AgentId) -> Result<()>;
    /// Stop a running sandbox.
    async fn stop(&self, agent: &AgentId) -> Result<()>;
    /// Remove the sandbox and everything created for it (the volume too unless `keep_volume`).
    async fn remove(&self, agent: &AgentId, keep_volume: bool) -> Result<()>;
    /// Start a command and stream its output: [`ExecChunk::Stdout`] and [`ExecChunk::Stderr`] as the
    /// command writes them, then one [`ExecChunk::Exit`]. [`ExecStream::id`] names the command for
    /// [`Sandbox::cancel_exec`]. A request's timeout kills the command when it passes.
    async fn exec_stream(&self, agent: &AgentId, request: ExecRequest) -> Result<ExecStream>;
    /// Kill a command started with [`Sandbox::exec_stream`] (and everything it started) by its
    /// [`ExecStream::id`]. Killing a command that already ended succeeds.
    async fn cancel_exec(&self, agent: &AgentId, exec_id: &str) -> Result<()>;
    /// Run a command to completion. The default collects [`Sandbox::exec_stream`] (each output capped at
    /// [`MAX_CAPTURE`]).
    async fn exec(&self, agent: &AgentId, request: ExecRequest) -> Result<ExecOutput> {
        self.exec_stream(agent, request).await?.collect().await
    }
    /// Read a file.
    async fn read_file(&self, agent: &AgentId, path: &str) -> Result<Vec<u8>>;
    /// Write (create or replace) a file.
    async fn write_file(&self, agent: &AgentId, path: &str, data: &[u8]) -> Result<()>;
    /// The entries of a directory (not `.` and `..`), sorted by name. A symlink to a directory lists the
    /// directory. Default: [`ErrorKind::Unavailable`].
    ///
    /// # Errors
    /// [`ErrorKind::BadInput`] for a path [`sandbox_path`] refuses or that is not a directory,
    /// [`ErrorKind::NotFound`] when it does not exist (or the sandbox does not).
    async fn list_dir(&self, agent: &AgentId, path: &str) -> Result<Vec<DirEntry>> {
        let _ = (agent, path);
        Err(unsupported("listing directories"))
    }
    /// Remove a file, a symlink (not what it points to) or a directory with everything in it. Default:
    /// [`ErrorKind::Unavailable`].
    ///
    /// # Errors
    /// [`ErrorKind::BadInput`] for a path [`sandbox_path`] refuses and for `/`, [`ErrorKind::NotFound`]
    /// when it does not exist.
    async fn remove_path(&self, agent: &AgentId, path: &str) -> Result<()> {
        let _ = (agent, path);
        Err(unsupported("removing files"))
    }
    /// The canonical absolute path `path` names: every symlink along it resolved within the sandbox's
    /// filesystem, components that do not exist kept as given (as `realpath -m`). A file check (S10: "may
    /// this caller read that file?") compares this, never the path it was given, so a symlink the agent
    /// planted cannot lead past it. An implementation resolves as its own [`Sandbox::read_file`] does, by
    /// means the agent cannot replace (not by running a program inside the sandbox). Default:
    /// [`ErrorKind::Unavailable`] (a check then fails closed).
    ///
    /// # Errors
    /// [`ErrorKind::BadInput`] for a path [`sandbox_path`] refuses, [`ErrorKind::NotFound`] for an unknown
    /// sandbox, the engine's error for a symlink loop.
    async fn resolve_path(&self, agent: &AgentId, path: &str) -> Result<String> {
        let _ = (agent, path);
        Err(unsupported("resolving paths"))
    }
    /// Open an interactive terminal (a pseudo-terminal) running `request.argv` in the sandbox. Dropping the
    /// returned [`Terminal`] kills the process's group, as [`Sandbox::cancel_exec`] does with its id.
    /// Default: [`ErrorKind::Unavailable`].
    ///
    /// # Errors
    /// When the sandbox does not exist or does not run, or the engine fails.
    async fn open_terminal(&self, agent: &AgentId, request: TerminalRequest) -> Result<Terminal> {
        let _ = (agent, request);
        Err(unsupported("terminals"))
    }
    /// Whether the command started with [`Sandbox::exec_stream`] (or [`Sandbox::open_terminal`]) as
    /// `exec_id` may still be running in the sandbox's current boot: true until it is known to have ended,
    /// so a caller that lost its stream (a restarted server) can [`Sandbox::cancel_exec`] it. False for an
    /// id this boot never ran, and for every command once the sandbox stopped or restarted. Default:
    /// [`ErrorKind::Unavailable`].
    ///
    /// # Errors
    /// [`ErrorKind::BadInput`] for a malformed id, [`ErrorKind::NotFound`] for an unknown sandbox.
    async fn exec_running(&self, agent: &AgentId, exec_id: &str) -> Result<bool> {
        let _ = (agent, exec_id);
        Err(unsupported("exec liveness"))
    }
    /// Give a running sandbox that was made from another spec of the same image and runtime (a warm-pool
    /// sandbox, made from the plain spec) the rest of `spec`, before this returns: its environment for every
    /// command started from now on, exactly as if it had been set at creation (a command's own environment
    /// still overrides it), and its limits (CPU, memory, processes) on the running sandbox. The spec's labels
    /// are the caller's records; an implementation need not put them on its objects. Default:
    /// [`ErrorKind::Unavailable`] (the runtime then creates such specs afresh).
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] for an unknown sandbox, the engine's error when a limit cannot be applied.
    async fn reconfigure(&self, agent: &AgentId, spec: &ContainerSpec) -> Result<()> {
        let _ = (agent, spec);
        Err(unsupported("reconfiguring a running sandbox"))
    }
    /// Make the next [`Sandbox::exec_stream`] of `agent`'s running sandbox start sooner by starting now
    /// what it would wait for (the Docker runtime starts `sandboxd run` ahead and gives it the command
    /// later, skipping the engine's exec). The warm pool calls it for every sandbox it makes, so a
    /// handed-out sandbox's first command is quick. Only a speed-up: a command behaves the same either way,
    /// and an implementation falls back to its usual path when what it prepared is gone. Default: nothing.
    ///
    /// # Errors
    /// When it cannot be prepared (the caller carries on without).
    async fn prepare_exec(&self, agent: &AgentId) -> Result<()> {
        let _ = agent;
        Ok(())
    }
    /// Current state.
    async fn inspect(&self, agent: &AgentId) -> Result<SandboxInfo>;
    /// Take over the sandboxes a previous runtime on the same store left (S12). `agents` are the agents the
    /// runtime has records of; it calls this once, when it starts, before anything else. An implementation
    /// re-attaches what still exists to the datapath and may keep watching its engine until the runtime
    /// shuts down; one with records of its own may go by those.
    ///
    /// The default compares: an agent [`Sandbox::inspect`] finds is restored, one it reports not found
    /// ([`ErrorKind::NotFound`]) is missing; nothing needs re-attaching.
    ///
    /// # Errors
    /// When the engine or the store fails (not for a missing sandbox).
    async fn reconcile(&self, agents: &[AgentId]) -> Result<ReconcileReport> {
        let mut report = ReconcileReport::default();
        for agent in agents {
            match self.inspect(agent).await {
                Ok(_) => report.restored.push(agent.clone()),
                Err(e) if e.kind() == ErrorKind::NotFound => report.missing.push(agent.clone()),
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }
    /// The runtime is shutting down (its cancellation token is cancelled and its pool drained): finish
    /// what [`Sandbox::reconcile`] started (watchers, shared containers it releases at shutdown) before this
    /// returns, so nothing of it outlives the process. Bounded by the implementation. Default: nothing.
    async fn shutdown(&self) {}
}

/// The error of a default method: this sandbox runtime does not do `what`.
fn unsupported(what: &str) -> crate::Error {
    crate::Error::backend(
        ErrorKind::Unavailable,
        "",
        format!("this sandbox runtime does not support {what}"),
    )
}
