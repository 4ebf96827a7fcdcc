//! [`FakeSandbox`]: an in-memory [`Sandbox`] test double, for agenthold's own tests and for platform
//! builders who test code that drives a [`crate::Runtime`] (or any `Sandbox`) without Docker, root or a
//! network namespace.
//!
//! It keeps each agent's state and files in memory, records every call ([`FakeSandbox::calls`]), plays
//! scripted command output ([`FakeSandbox::push_exec`]) and fails the calls it is told to
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

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use agenthold_core::sandbox::{
    ContainerSpec, ExecChunk, ExecOutput, ExecRequest, ExecStream, ReconcileReport, SandboxInfo, SandboxState,
};
use agenthold_core::{AgentId, Error, ErrorKind, Result, Sandbox};

/// The operations of [`Sandbox`], to name the one a [`FakeSandbox`] should fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`Sandbox::create`].
    Create,
    /// [`Sandbox::start`].
    Start,
    /// [`Sandbox::stop`].
    Stop,
    /// [`Sandbox::remove`].
    Remove,
    /// [`Sandbox::exec_stream`] (and so [`Sandbox::exec`], which it serves).
    ExecStream,
    /// [`Sandbox::cancel_exec`].
    CancelExec,
    /// [`Sandbox::read_file`].
    ReadFile,
    /// [`Sandbox::write_file`].
    WriteFile,
    /// [`Sandbox::inspect`].
    Inspect,
    /// [`Sandbox::reconcile`].
    Reconcile,
}

/// One call a [`FakeSandbox`] received, with its arguments (recorded also when it failed).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Call {
    /// [`Sandbox::create`].
    Create {
        /// The agent.
        agent: AgentId,
        /// The container half it was given.
        spec: ContainerSpec,
    },
    /// [`Sandbox::start`].
    Start(AgentId),
    /// [`Sandbox::stop`].
    Stop(AgentId),
    /// [`Sandbox::remove`].
    Remove {
        /// The agent.
        agent: AgentId,
        /// Whether the volume was to be kept.
        keep_volume: bool,
    },
    /// [`Sandbox::exec_stream`] (also what [`Sandbox::exec`] records).
    ExecStream {
        /// The agent.
        agent: AgentId,
        /// The request.
        request: ExecRequest,
    },
    /// [`Sandbox::cancel_exec`].
    CancelExec {
        /// The agent.
        agent: AgentId,
        /// The command's id.
        exec_id: String,
    },
    /// [`Sandbox::read_file`].
    ReadFile {
        /// The agent.
        agent: AgentId,
        /// The path.
        path: String,
    },
    /// [`Sandbox::write_file`].
    WriteFile {
        /// The agent.
        agent: AgentId,
        /// The path.
        path: String,
    },
    /// [`Sandbox::inspect`].
    Inspect(AgentId),
    /// [`Sandbox::reconcile`].
    Reconcile(Vec<AgentId>),
}

/// One fake sandbox.
#[derive(Debug, Clone)]
struct Agent {
    spec: ContainerSpec,
    state: SandboxState,
    files: BTreeMap<String, Vec<u8>>,
}

#[derive(Debug, Default)]
struct State {
    agents: HashMap<AgentId, Agent>,
    calls: Vec<Call>,
    scripts: VecDeque<Vec<ExecChunk>>,
    failing: HashSet<Op>,
    failing_once: HashSet<Op>,
    execs: u64,
}

/// An in-memory [`Sandbox`] (see the [module documentation](self)). Cheap to share: wrap it in an `Arc`
/// and give the same one to two runtimes on one data directory to play a restart.
#[derive(Debug, Default)]
pub struct FakeSandbox {
    state: Mutex<State>,
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

    /// Queue the output of the next command: [`Sandbox::exec_stream`] (or [`Sandbox::exec`]) plays the
    /// queued scripts in order. Without a script a command succeeds with no output. A script without an
    /// [`ExecChunk::Exit`] plays a command whose exit code is unknown.
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

fn op_of(call: &Call) -> Op {
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
    }
}

fn not_found(agent: &AgentId) -> Error {
    Error::NotFound {
        what: "sandbox",
        id: agent.to_string(),
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
            files: BTreeMap::new(),
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
        Ok(())
    }

    async fn remove(&self, agent: &AgentId, keep_volume: bool) -> Result<()> {
        let mut state = self.enter(Call::Remove {
            agent: agent.clone(),
            keep_volume,
        })?;
        state.agents.remove(agent);
        Ok(())
    }

    async fn exec_stream(&self, agent: &AgentId, request: ExecRequest) -> Result<ExecStream> {
        let mut state = self.enter(Call::ExecStream {
            agent: agent.clone(),
            request,
        })?;
        match state.agents.get(agent).map(|a| a.state) {
            None => return Err(not_found(agent)),
            Some(SandboxState::Stopped) => {
                return Err(Error::backend(
                    ErrorKind::BadInput,
                    format!("fake sandbox: exec in {agent}"),
                    "the sandbox is stopped",
                ));
            }
            Some(SandboxState::Running) => {}
        }
        state.execs += 1;
        let id = format!("fake-exec-{}", state.execs);
        let chunks = state
            .scripts
            .pop_front()
            .unwrap_or_else(|| vec![ExecChunk::Exit(0)]);
        Ok(ExecStream::new(
            id,
            futures_util::stream::iter(chunks.into_iter().map(Ok)),
        ))
    }

    async fn cancel_exec(&self, agent: &AgentId, exec_id: &str) -> Result<()> {
        self.enter(Call::CancelExec {
            agent: agent.clone(),
            exec_id: exec_id.to_owned(),
        })
        .map(drop)
    }

    async fn read_file(&self, agent: &AgentId, path: &str) -> Result<Vec<u8>> {
        let state = self.enter(Call::ReadFile {
            agent: agent.clone(),
            path: path.to_owned(),
        })?;
        absolute(path)?;
        let a = state.agents.get(agent).ok_or_else(|| not_found(agent))?;
        a.files.get(path).cloned().ok_or_else(|| Error::NotFound {
            what: "file",
            id: path.to_owned(),
        })
    }

    async fn write_file(&self, agent: &AgentId, path: &str, data: &[u8]) -> Result<()> {
        let mut state = self.enter(Call::WriteFile {
            agent: agent.clone(),
            path: path.to_owned(),
        })?;
        absolute(path)?;
        let a = state.agents.get_mut(agent).ok_or_else(|| not_found(agent))?;
        a.files.insert(path.to_owned(), data.to_vec());
        Ok(())
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
mod tests {
    use super::*;
    use agenthold_core::sandbox::SandboxSpec;

    fn plain() -> ContainerSpec {
        SandboxSpec::default().split().unwrap().0
    }

    #[tokio::test]
    async fn keeps_state_and_files_records_calls_and_fails_on_demand() {
        let fake = FakeSandbox::new();
        let a = AgentId::new("a").unwrap();
        assert_eq!(fake.inspect(&a).await.unwrap_err().kind(), ErrorKind::NotFound);
        fake.create(&a, &plain()).await.unwrap();
        assert_eq!(
            fake.create(&a, &plain()).await.unwrap_err().kind(),
            ErrorKind::BadInput
        );
        fake.write_file(&a, "/w/f", b"data").await.unwrap();
        assert_eq!(fake.read_file(&a, "/w/f").await.unwrap(), b"data");
        assert_eq!(
            fake.read_file(&a, "/w/none").await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert!(fake.write_file(&a, "relative", b"").await.is_err());
        fake.stop(&a).await.unwrap();
        assert_eq!(fake.sandbox_state(&a), Some(SandboxState::Stopped));
        assert!(fake.exec(&a, ExecRequest::default()).await.is_err());
        fake.start(&a).await.unwrap();

        fake.push_output(ExecOutput {
            exit_code: 2,
            stdout: b"o".to_vec(),
            stderr: b"e".to_vec(),
        });
        let out = fake.exec(&a, ExecRequest::default()).await.unwrap();
        assert_eq!(
            (out.exit_code, &out.stdout[..], &out.stderr[..]),
            (2, &b"o"[..], &b"e"[..])
        );
        assert_eq!(fake.exec(&a, ExecRequest::default()).await.unwrap().exit_code, 0);

        fake.fail_once(Op::Inspect);
        assert_eq!(fake.inspect(&a).await.unwrap_err().kind(), ErrorKind::Upstream);
        assert!(fake.inspect(&a).await.is_ok());
        fake.fail(Op::Start);
        assert!(fake.start(&a).await.is_err());
        assert!(fake.start(&a).await.is_err());
        fake.heal(Op::Start);
        assert!(fake.start(&a).await.is_ok());

        let b = AgentId::new("b").unwrap();
        let report = fake.reconcile(&[a.clone(), b.clone()]).await.unwrap();
        assert_eq!((report.restored, report.missing), (vec![a.clone()], vec![b]));
        fake.remove(&a, false).await.unwrap();
        fake.remove(&a, false).await.unwrap();
        assert!(fake.agents().is_empty());
        assert_eq!(fake.calls_of(Op::Remove).len(), 2);
        assert!(matches!(&fake.calls()[1], Call::Create { agent, .. } if *agent == a));
    }
}
