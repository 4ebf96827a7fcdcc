//! What a sandbox is made of ([`SandboxSpec`], checked once and split into its [`ContainerSpec`] and
//! [`GatewaySpec`] halves), the commands run in it ([`ExecRequest`], [`ExecStream`]), and the [`Sandbox`]
//! runtime trait that creates and drives sandboxes. The default implementation (Docker) lives in
//! `agenthold-sandbox`, beside `FakeSandbox`, an in-memory test double.
//!
//! Labels under `agenthold.*` are agenthold's own (S15): the runtime finds its engine objects and the agent
//! an engine event is about by them, so [`SandboxSpec::split`] refuses them (see
//! [`RESERVED_LABEL_PREFIXES`]).

mod exec;
mod spec;

pub use exec::{ChunkStream, ExecChunk, ExecOutput, ExecRequest, ExecStream, MAX_CAPTURE};
pub use spec::{ContainerSpec, GatewaySpec, RESERVED_LABEL_PREFIXES, SandboxSpec};

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
}
