//! [`FakeSandbox`]: an in-memory [`Sandbox`] test double, for agenthold's own tests and for platform
//! builders who test code that drives a [`crate::Runtime`] (or any `Sandbox`) without Docker, root or a
//! network namespace.
//!
//! It keeps each agent's state and files in memory (with directories and symlinks, see
//! [`FakeSandbox::symlink`]), records every call ([`FakeSandbox::calls`]), plays scripted command output
//! ([`FakeSandbox::push_exec`]), opens echo terminals, and fails the calls it is told to
//! ([`FakeSandbox::fail`], [`FakeSandbox::fail_once`]). Nothing is isolated and no command runs: it stands
//! in for a runtime, it is not one.
//!
//! ```
//! # async fn demo() -> agenthold_core::Result<()> {
//! use agenthold_core::sandbox::{ExecChunk, ExecRequest, SandboxSpec};
//! use agenthold_core::{AgentId, Sandbox};
//! use agenthold_sandbox::fake::{Call, FakeSandbox, Op};
//!
//! let fake = FakeSandbox::new();
//! let agent = AgentId::random();
//! let (container, _gateway) = SandboxSpec::default().split()?;
//! fake.create(&agent, &container).await?;
//! fake.push_exec(vec![ExecChunk::Stdout(b"hi\n".to_vec()), ExecChunk::Exit(0)]);
//! let out = fake.exec(&agent, ExecRequest { argv: vec!["echo".into(), "hi".into()], ..Default::default() }).await?;
//! assert_eq!(out.stdout, b"hi\n");
//! fake.fail_once(Op::Stop);
//! assert!(fake.stop(&agent).await.is_err());
//! assert!(matches!(fake.calls()[0], Call::Create { .. }));
//! # Ok(()) }
//! ```

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use agenthold_core::sandbox::{
    ContainerSpec, DirEntry, ExecChunk, ExecOutput, ExecRequest, ExecStream, ReconcileReport, SandboxInfo,
    SandboxState, Terminal, TerminalControl, TerminalRequest,
};
use agenthold_core::{AgentId, Error, ErrorKind, Result, Sandbox};

mod calls;
mod fs;
mod terminal;

use calls::op_of;
pub use calls::{Call, Op};

/// One fake sandbox.
#[derive(Debug, Clone)]
struct Agent {
    spec: ContainerSpec,
    state: SandboxState,
    files: fs::Tree,
}

#[derive(Debug, Default)]
struct State {
    agents: HashMap<AgentId, Agent>,
    calls: Vec<Call>,
    scripts: VecDeque<Vec<ExecChunk>>,
    failing: HashSet<Op>,
    failing_once: HashSet<Op>,
    execs: u64,
    /// Commands that have not ended (streams whose script has no exit, open terminals): id to agent.
    running: HashMap<String, AgentId>,
    /// The last size each terminal was given.
    terminal_sizes: HashMap<String, (u16, u16)>,
}

/// An in-memory [`Sandbox`] (see the [module documentation](self)). Cheap to share: wrap it in an `Arc`
/// and give the same one to two runtimes on one data directory to play a restart.
#[derive(Debug, Default)]
pub struct FakeSandbox {
    state: Arc<Mutex<State>>,
}

impl FakeSandbox {
    /// A fake with no sandbox, no script and nothing failing.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking test thread cannot leave the state half-updated in a way that matters to a double.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every call received so far, oldest first.
    #[must_use]
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// Forget the calls received so far.
    pub fn clear_calls(&self) {
        self.state().calls.clear();
    }

    /// Every call of `op`'s kind received so far.
    #[must_use]
    pub fn calls_of(&self, op: Op) -> Vec<Call> {
        self.calls().into_iter().filter(|c| op_of(c) == op).collect()
    }

    /// The agents that have a sandbox, sorted.
    #[must_use]
    pub fn agents(&self) -> Vec<AgentId> {
        let mut agents: Vec<AgentId> = self.state().agents.keys().cloned().collect();
        agents.sort();
        agents
    }

    /// The container spec `agent`'s sandbox was created with.
    #[must_use]
    pub fn spec(&self, agent: &AgentId) -> Option<ContainerSpec> {
        self.state().agents.get(agent).map(|a| a.spec.clone())
    }

    /// The state of `agent`'s sandbox.
    #[must_use]
    pub fn sandbox_state(&self, agent: &AgentId) -> Option<SandboxState> {
        self.state().agents.get(agent).map(|a| a.state)
    }

    /// Make a directory in `agent`'s sandbox (parents are implied).
    ///
    /// # Errors
    /// For an unknown agent or a path [`agenthold_core::sandbox::sandbox_path`] refuses.
    pub fn mkdir(&self, agent: &AgentId, path: &str) -> Result<()> {
        let mut state = self.state();
        let a = state.agents.get_mut(agent).ok_or_else(|| not_found(agent))?;
        a.files.mkdir(path)
    }

    /// Plant a symlink at `link` pointing to `target` (absolute, or relative to the link's directory) in
    /// `agent`'s sandbox, as an agent would with `ln -s`.
    ///
    /// # Errors
    /// For an unknown agent or a `link` [`agenthold_core::sandbox::sandbox_path`] refuses.
    pub fn symlink(&self, agent: &AgentId, link: &str, target: &str) -> Result<()> {
        let mut state = self.state();
        let a = state.agents.get_mut(agent).ok_or_else(|| not_found(agent))?;
        a.files.symlink(link, target)
    }

    /// The size a terminal (by its id) was last given ([`Terminal::resize`]).
    #[must_use]
    pub fn terminal_size(&self, id: &str) -> Option<(u16, u16)> {
        self.state().terminal_sizes.get(id).copied()
    }

    /// Queue the output of the next command: [`Sandbox::exec_stream`] (or [`Sandbox::exec`]) plays the
    /// queued scripts in order. Without a script a command succeeds with no output. A script without an
    /// [`ExecChunk::Exit`] plays a command whose exit code is unknown, and that [`Sandbox::exec_running`]
    /// reports running until it is cancelled.
    pub fn push_exec(&self, chunks: Vec<ExecChunk>) {
        self.state().scripts.push_back(chunks);
    }

    /// Queue a finished command's output (see [`FakeSandbox::push_exec`]).
    pub fn push_output(&self, output: ExecOutput) {
        self.push_exec(vec![
            ExecChunk::Stdout(output.stdout),
            ExecChunk::Stderr(output.stderr),
            ExecChunk::Exit(output.exit_code),
        ]);
    }

    /// Fail every call of `op` from now on (with an [`ErrorKind::Upstream`] error, as an engine that is
    /// down would), until [`FakeSandbox::heal`].
    pub fn fail(&self, op: Op) {
        self.state().failing.insert(op);
    }

    /// Fail the next call of `op` only.
    pub fn fail_once(&self, op: Op) {
        self.state().failing_once.insert(op);
    }

    /// Let calls of `op` succeed again.
    pub fn heal(&self, op: Op) {
        let mut state = self.state();
        state.failing.remove(&op);
        state.failing_once.remove(&op);
    }

    /// Record `call`, then fail it if told to.
    fn enter(&self, call: Call) -> Result<MutexGuard<'_, State>> {
        let op = op_of(&call);
        let mut state = self.state();
        state.calls.push(call);
        if state.failing.contains(&op) || state.failing_once.remove(&op) {
            return Err(Error::backend(
                ErrorKind::Upstream,
                format!("fake sandbox: {op:?}"),
                "the FakeSandbox was told to fail this call",
            ));
        }
        Ok(state)
    }
}

fn not_found(agent: &AgentId) -> Error {
    Error::NotFound {
        what: "sandbox",
        id: agent.to_string(),
    }
}

/// Commands and terminals need a running sandbox.
fn running_sandbox(state: &State, agent: &AgentId) -> Result<()> {
    match state.agents.get(agent).map(|a| a.state) {
        None => Err(not_found(agent)),
        Some(SandboxState::Stopped) => Err(Error::backend(
            ErrorKind::BadInput,
            format!("fake sandbox: exec in {agent}"),
            "the sandbox is stopped",
        )),
        Some(SandboxState::Running) => Ok(()),
    }
}

fn info(agent: &AgentId, a: &Agent) -> SandboxInfo {
    SandboxInfo {
        agent: agent.clone(),
        state: a.state,
        image: a.spec.image().to_owned(),
    }
}

fn absolute(path: &str) -> Result<()> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(Error::backend(
            ErrorKind::BadInput,
            format!("fake sandbox: {path:?}"),
            "give an absolute path",
        ))
    }
}

#[async_trait::async_trait]
impl Sandbox for FakeSandbox {
    async fn create(&self, agent: &AgentId, spec: &ContainerSpec) -> Result<SandboxInfo> {
        let mut state = self.enter(Call::Create {
            agent: agent.clone(),
            spec: spec.clone(),
        })?;
        if state.agents.contains_key(agent) {
            return Err(Error::backend(
                ErrorKind::BadInput,
                "fake sandbox: create",
                format!("sandbox {agent} already exists"),
            ));
        }
        let made = Agent {
            spec: spec.clone(),
            state: SandboxState::Running,
            files: fs::Tree::default(),
        };
        let made_info = info(agent, &made);
        state.agents.insert(agent.clone(), made);
        Ok(made_info)
    }

    async fn start(&self, agent: &AgentId) -> Result<()> {
        let mut state = self.enter(Call::Start(agent.clone()))?;
        let a = state.agents.get_mut(agent).ok_or_else(|| not_found(agent))?;
        a.state = SandboxState::Running;
        Ok(())
    }

    async fn stop(&self, agent: &AgentId) -> Result<()> {
        let mut state = self.enter(Call::Stop(agent.clone()))?;
        let a = state.agents.get_mut(agent).ok_or_else(|| not_found(agent))?;
        a.state = SandboxState::Stopped;
        // Every command dies with the sandbox.
        state.running.retain(|_, a| a != agent);
        Ok(())
    }

    async fn remove(&self, agent: &AgentId, keep_volume: bool) -> Result<()> {
        let mut state = self.enter(Call::Remove {
            agent: agent.clone(),
            keep_volume,
        })?;
        state.agents.remove(agent);
        state.running.retain(|_, a| a != agent);
        Ok(())
    }

    async fn exec_stream(&self, agent: &AgentId, request: ExecRequest) -> Result<ExecStream> {
        let mut state = self.enter(Call::ExecStream {
            agent: agent.clone(),
            request,
        })?;
        running_sandbox(&state, agent)?;
        state.execs += 1;
        let id = format!("fake-exec-{}", state.execs);
        let chunks = state
            .scripts
            .pop_front()
            .unwrap_or_else(|| vec![ExecChunk::Exit(0)]);
        if !chunks.iter().any(|c| matches!(c, ExecChunk::Exit(_))) {
            state.running.insert(id.clone(), agent.clone());
        }
        Ok(ExecStream::new(
            id,
            futures_util::stream::iter(chunks.into_iter().map(Ok)),
        ))
    }

    async fn cancel_exec(&self, agent: &AgentId, exec_id: &str) -> Result<()> {
        let mut state = self.enter(Call::CancelExec {
            agent: agent.clone(),
            exec_id: exec_id.to_owned(),
        })?;
        state.running.remove(exec_id);
        Ok(())
    }

    async fn read_file(&self, agent: &AgentId, path: &str) -> Result<Vec<u8>> {
        let state = self.enter(Call::ReadFile {
            agent: agent.clone(),
            path: path.to_owned(),
        })?;
        absolute(path)?;
        let a = state.agents.get(agent).ok_or_else(|| not_found(agent))?;
        a.files.read(path)
    }

    async fn write_file(&self, agent: &AgentId, path: &str, data: &[u8]) -> Result<()> {
        let mut state = self.enter(Call::WriteFile {
            agent: agent.clone(),
            path: path.to_owned(),
        })?;
        absolute(path)?;
        let a = state.agents.get_mut(agent).ok_or_else(|| not_found(agent))?;
        a.files.write(path, data);
        Ok(())
    }

    async fn list_dir(&self, agent: &AgentId, path: &str) -> Result<Vec<DirEntry>> {
        let state = self.enter(Call::ListDir {
            agent: agent.clone(),
            path: path.to_owned(),
        })?;
        let a = state.agents.get(agent).ok_or_else(|| not_found(agent))?;
        a.files.list(path)
    }

    async fn remove_path(&self, agent: &AgentId, path: &str) -> Result<()> {
        let mut state = self.enter(Call::RemovePath {
            agent: agent.clone(),
            path: path.to_owned(),
        })?;
        let a = state.agents.get_mut(agent).ok_or_else(|| not_found(agent))?;
        a.files.remove(path)
    }

    async fn resolve_path(&self, agent: &AgentId, path: &str) -> Result<String> {
        let state = self.enter(Call::ResolvePath {
            agent: agent.clone(),
            path: path.to_owned(),
        })?;
        let a = state.agents.get(agent).ok_or_else(|| not_found(agent))?;
        a.files.resolve(path)
    }

    /// An echo terminal (see the module documentation).
    async fn open_terminal(&self, agent: &AgentId, request: TerminalRequest) -> Result<Terminal> {
        let size = (request.cols, request.rows);
        let mut state = self.enter(Call::OpenTerminal {
            agent: agent.clone(),
            request,
        })?;
        running_sandbox(&state, agent)?;
        state.execs += 1;
        let id = format!("fake-term-{}", state.execs);
        state.running.insert(id.clone(), agent.clone());
        state.terminal_sizes.insert(id.clone(), size);
        drop(state);
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let control: Arc<dyn TerminalControl> = Arc::new(terminal::EchoTerminal {
            id: id.clone(),
            events,
            state: Arc::clone(&self.state),
        });
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|event| (event, rx)) },
            );
        Ok(Terminal::new(id, control, stream))
    }

    async fn exec_running(&self, agent: &AgentId, exec_id: &str) -> Result<bool> {
        let state = self.enter(Call::ExecRunning {
            agent: agent.clone(),
            exec_id: exec_id.to_owned(),
        })?;
        match state.agents.get(agent) {
            None => Err(not_found(agent)),
            Some(_) => Ok(state.running.get(exec_id) == Some(agent)),
        }
    }

    async fn inspect(&self, agent: &AgentId) -> Result<SandboxInfo> {
        let state = self.enter(Call::Inspect(agent.clone()))?;
        let a = state.agents.get(agent).ok_or_else(|| not_found(agent))?;
        Ok(info(agent, a))
    }

    /// As the trait's default: the agents it holds are restored, the others missing.
    async fn reconcile(&self, agents: &[AgentId]) -> Result<ReconcileReport> {
        let state = self.enter(Call::Reconcile(agents.to_vec()))?;
        let (restored, missing) = agents.iter().cloned().partition(|a| state.agents.contains_key(a));
        Ok(ReconcileReport { restored, missing })
    }
}

#[cfg(test)]
mod tests;
