//! What a [`FakeSandbox`](super::FakeSandbox) records and can be told to fail: one [`Call`] per call
//! received, with its arguments, and the [`Op`] it belongs to.

use agenthold_core::AgentId;
use agenthold_core::sandbox::{ContainerSpec, ExecRequest, TerminalRequest};

/// The operations of [`Sandbox`], to name the one a [`FakeSandbox`](super::FakeSandbox) should fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`agenthold_core::Sandbox::create`].
    Create,
    /// [`agenthold_core::Sandbox::start`].
    Start,
    /// [`agenthold_core::Sandbox::stop`].
    Stop,
    /// [`agenthold_core::Sandbox::remove`].
    Remove,
    /// [`agenthold_core::Sandbox::exec_stream`] (and so [`agenthold_core::Sandbox::exec`], which it serves).
    ExecStream,
    /// [`agenthold_core::Sandbox::cancel_exec`].
    CancelExec,
    /// [`agenthold_core::Sandbox::read_file`].
    ReadFile,
    /// [`agenthold_core::Sandbox::write_file`].
    WriteFile,
    /// [`agenthold_core::Sandbox::inspect`].
    Inspect,
    /// [`agenthold_core::Sandbox::reconcile`].
    Reconcile,
    /// [`agenthold_core::Sandbox::list_dir`].
    ListDir,
    /// [`agenthold_core::Sandbox::remove_path`].
    RemovePath,
    /// [`agenthold_core::Sandbox::resolve_path`].
    ResolvePath,
    /// [`agenthold_core::Sandbox::open_terminal`].
    OpenTerminal,
    /// [`agenthold_core::Sandbox::exec_running`].
    ExecRunning,
}

/// One call a [`FakeSandbox`](super::FakeSandbox) received, with its arguments (recorded also when it failed).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Call {
    /// [`agenthold_core::Sandbox::create`].
    Create {
        /// The agent.
        agent: AgentId,
        /// The container half it was given.
        spec: ContainerSpec,
    },
    /// [`agenthold_core::Sandbox::start`].
    Start(AgentId),
    /// [`agenthold_core::Sandbox::stop`].
    Stop(AgentId),
    /// [`agenthold_core::Sandbox::remove`].
    Remove {
        /// The agent.
        agent: AgentId,
        /// Whether the volume was to be kept.
        keep_volume: bool,
    },
    /// [`agenthold_core::Sandbox::exec_stream`] (also what [`agenthold_core::Sandbox::exec`] records).
    ExecStream {
        /// The agent.
        agent: AgentId,
        /// The request.
        request: ExecRequest,
    },
    /// [`agenthold_core::Sandbox::cancel_exec`].
    CancelExec {
        /// The agent.
        agent: AgentId,
        /// The command's id.
        exec_id: String,
    },
    /// [`agenthold_core::Sandbox::read_file`].
    ReadFile {
        /// The agent.
        agent: AgentId,
        /// The path.
        path: String,
    },
    /// [`agenthold_core::Sandbox::write_file`].
    WriteFile {
        /// The agent.
        agent: AgentId,
        /// The path.
        path: String,
    },
    /// [`agenthold_core::Sandbox::inspect`].
    Inspect(AgentId),
    /// [`agenthold_core::Sandbox::reconcile`].
    Reconcile(Vec<AgentId>),
    /// [`agenthold_core::Sandbox::list_dir`].
    ListDir {
        /// The agent.
        agent: AgentId,
        /// The path.
        path: String,
    },
    /// [`agenthold_core::Sandbox::remove_path`].
    RemovePath {
        /// The agent.
        agent: AgentId,
        /// The path.
        path: String,
    },
    /// [`agenthold_core::Sandbox::resolve_path`].
    ResolvePath {
        /// The agent.
        agent: AgentId,
        /// The path.
        path: String,
    },
    /// [`agenthold_core::Sandbox::open_terminal`].
    OpenTerminal {
        /// The agent.
        agent: AgentId,
        /// The request.
        request: TerminalRequest,
    },
    /// [`agenthold_core::Sandbox::exec_running`].
    ExecRunning {
        /// The agent.
        agent: AgentId,
        /// The command's id.
        exec_id: String,
    },
}

pub(super) fn op_of(call: &Call) -> Op {
    match call {
        Call::Create { .. } => Op::Create,
        Call::Start(_) => Op::Start,
        Call::Stop(_) => Op::Stop,
        Call::Remove { .. } => Op::Remove,
        Call::ExecStream { .. } => Op::ExecStream,
        Call::CancelExec { .. } => Op::CancelExec,
        Call::ReadFile { .. } => Op::ReadFile,
        Call::WriteFile { .. } => Op::WriteFile,
        Call::Inspect(_) => Op::Inspect,
        Call::Reconcile(_) => Op::Reconcile,
        Call::ListDir { .. } => Op::ListDir,
        Call::RemovePath { .. } => Op::RemovePath,
        Call::ResolvePath { .. } => Op::ResolvePath,
        Call::OpenTerminal { .. } => Op::OpenTerminal,
        Call::ExecRunning { .. } => Op::ExecRunning,
    }
}
