//! [`DockerSandbox`], the default [`Sandbox`]: one container, internal network and volume per agent, every
//! network joined by the gateway holder, the gateway's listeners bound per agent inside its namespace.
//!
//! Order matters for failing closed: the network, the gateway's `.2`, the nftables rules and the listeners
//! exist before a sandbox first starts, and a failed create removes whatever it had made.

mod archive;
mod config;
mod container;
pub mod engine;
mod exec;
mod files;
pub mod harness_image;
mod hijack;
pub mod holder;
pub mod hostfw;
pub mod image;
pub mod network;
mod reconcile;
mod terminal;
mod topology;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use agenthold_core::sandbox::{
    ContainerSpec, DirEntry, ExecRequest, ExecStream, ReconcileReport, SandboxInfo, SandboxState, Terminal,
    TerminalRequest,
};
use agenthold_core::{AgentId, Sandbox, Store};
use agenthold_egress::Gateway;
use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::{
    InspectContainerOptions, RemoveContainerOptions, RemoveVolumeOptions, StartContainerOptions,
    StopContainerOptions,
};
use tokio_util::sync::CancellationToken;

pub use config::DockerConfig;
pub use container::DATAPATH_ENV;

use crate::docker::engine::{Engine, is_not_found, is_not_modified};
use crate::docker::network::AgentNetwork;
use crate::error::{Error, Result};
use crate::runtime::SandboxContext;
use crate::tunnel::{TunnelServer, new_token};
use container::{container_name, volume_name};
use topology::{AgentRecord, Topology};

/// How many subnets one create tries when the engine refuses them as overlapping (see `create_inner`).
const SUBNET_TRIES: usize = 16;

/// Largest file [`DockerSandbox`] reads in one piece.
pub const MAX_FILE: usize = 256 * 1024 * 1024;

/// The Docker sandbox runtime.
pub struct DockerSandbox {
    engine: Engine,
    gateway: Arc<Gateway>,
    tunnel: Arc<TunnelServer>,
    store: Arc<dyn Store>,
    config: DockerConfig,
    topology: tokio::sync::Mutex<Topology>,
    /// Agents agenthold itself started and whose start event the watcher has not seen yet.
    starting: Mutex<HashSet<AgentId>>,
    /// Itself, for the event watcher [`Sandbox::reconcile`] starts.
    this: Weak<Self>,
    /// Ends the event watcher (the runtime's shutdown).
    shutdown: CancellationToken,
    /// Whether the event watcher runs.
    watching: AtomicBool,
}

impl std::fmt::Debug for DockerSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerSandbox")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl DockerSandbox {
    /// A runtime over `engine` that attaches agents to `gateway` and authenticates their tunnels with
    /// `tunnel`; per-agent state is kept in `store`. The engine event watcher (started by
    /// [`Sandbox::reconcile`]) runs until `shutdown` is cancelled.
    #[must_use]
    pub fn new(
        engine: Engine,
        gateway: Arc<Gateway>,
        tunnel: Arc<TunnelServer>,
        store: Arc<dyn Store>,
        config: DockerConfig,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new_cyclic(|this| Self {
            engine,
            gateway,
            tunnel,
            store,
            config,
            topology: tokio::sync::Mutex::new(Topology::default()),
            starting: Mutex::new(HashSet::new()),
            this: this.clone(),
            shutdown,
            watching: AtomicBool::new(false),
        })
    }

    /// The Docker runtime a [`crate::Runtime`] builds by default: on `docker` (the local engine when
    /// `None`), with the context's gateway, tunnel server, store and shutdown, configured from its
    /// configuration (see [`DockerConfig::from_config`]).
    ///
    /// # Errors
    /// When the engine cannot be reached or lacks what agenthold needs.
    pub async fn from_context(ctx: &SandboxContext, docker: Option<bollard::Docker>) -> Result<Arc<Self>> {
        let instance = engine::instance_label(&ctx.data_dir);
        let engine = match docker {
            Some(d) => Engine::from_docker(d, &instance).await?,
            None => Engine::connect(&instance).await?,
        };
        let config =
            DockerConfig::from_config(&ctx.config, &engine, &ctx.data_dir, ctx.ca.cert_pem()).await?;
        Ok(Self::new(
            engine,
            Arc::clone(&ctx.gateway),
            Arc::clone(&ctx.tunnel),
            Arc::clone(&ctx.store),
            config,
            ctx.shutdown.clone(),
        ))
    }

    /// The engine connection.
    #[must_use]
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn starting(&self) -> std::sync::MutexGuard<'_, HashSet<AgentId>> {
        self.starting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new boot: fresh token (its hash expected by the tunnel and persisted), files written, started.
    async fn boot(&self, agent: &AgentId) -> Result<()> {
        let (token, hash) = new_token();
        self.tunnel.expect(agent, hash);
        topology::save_token(self.store.as_ref(), agent, Some(hash)).await?;
        container::write_boot_files(&self.engine, agent, &token, &self.config.ca_pem).await?;
        // Marked until the event watcher sees this start, so it does not mistake it for a foreign one.
        self.starting().insert(agent.clone());
        let started = self
            .engine
            .docker
            .start_container(&container_name(agent), None::<StartContainerOptions>)
            .await;
        started.map_err(|e| {
            self.starting().remove(agent);
            Error::engine(format!("start the sandbox of {agent}"), e)
        })
    }

    async fn create_inner(&self, agent: &AgentId, spec: &ContainerSpec, made: &mut Made) -> Result<()> {
        image::require_image(&self.engine.docker, spec.image()).await?;
        let mut topo = self.topology.lock().await;
        // Another runtime on the same engine may take the subnet we picked before we create the network;
        // the engine then refuses it and we pick the next free one (the refused one stays reserved).
        let mut tries = 0;
        let net = loop {
            let net = topo
                .allocate(&self.engine, self.config.subnet_pool, agent)
                .await?;
            match crate::docker::network::create(&self.engine, agent, &net).await? {
                network::Created::Made => break net,
                network::Created::SubnetTaken if tries < SUBNET_TRIES => {
                    tries += 1;
                    tracing::debug!(agent = %agent, subnet = %net.subnet, "subnet taken meanwhile; picking another");
                }
                network::Created::SubnetTaken => {
                    return Err(Error::Unavailable {
                        problem: format!(
                            "the engine refused {SUBNET_TRIES} subnets of sandbox.subnet_pool as overlapping other \
                             networks; is another program creating networks in that range?"
                        ),
                    });
                }
            }
        };
        made.network = Some(net.clone());
        made.record = true;
        topology::RECORDS
            .save(
                self.store.as_ref(),
                agent,
                &AgentRecord {
                    net: net.clone(),
                    token: None,
                },
            )
            .await?;
        topo.attach(
            &self.engine,
            &self.gateway,
            &self.tunnel,
            &self.config,
            agent,
            net.clone(),
        )
        .await?;
        made.attached = true;
        drop(topo);
        let volume = VolumeCreateRequest {
            name: Some(volume_name(agent)),
            labels: Some(self.engine.labels(Some(agent), "volume")),
            ..Default::default()
        };
        self.engine
            .docker
            .create_volume(volume)
            .await
            .map_err(|e| Error::engine("create the volume", e))?;
        made.volume = true;
        container::create(&self.engine, agent, spec, &net, &self.config).await?;
        made.container = true;
        self.boot(agent).await
    }

    /// Remove the container, the agent's attachment, network and record; the volume unless `keep_volume`.
    async fn teardown(&self, agent: &AgentId, keep_volume: bool, known: Option<AgentNetwork>) -> Result<()> {
        let options = RemoveContainerOptions {
            force: true,
            v: false,
            link: false,
        };
        match self
            .engine
            .docker
            .remove_container(&container_name(agent), Some(options))
            .await
        {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::engine(format!("remove the sandbox of {agent}"), e)),
        }
        self.tunnel.forget(agent);
        let mut topo = self.topology.lock().await;
        let net = match topology::RECORDS.load(self.store.as_ref(), agent).await? {
            Some(record) => Some(record.net),
            None => topo.network(agent).or(known),
        };
        if let Some(net) = &net {
            topo.detach(&self.engine, &self.gateway, &self.config, agent, net)
                .await?;
            crate::docker::network::remove(&self.engine.docker, &net.name).await?;
        }
        drop(topo);
        let _ = std::fs::remove_file(self.config.state_dir.join("resolv").join(format!("{agent}.conf")));
        if !keep_volume {
            let options = RemoveVolumeOptions { force: true };
            match self
                .engine
                .docker
                .remove_volume(&volume_name(agent), Some(options))
                .await
            {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(Error::engine("remove the volume", e)),
            }
        }
        topology::RECORDS.delete(self.store.as_ref(), agent).await
    }
}

/// What a create has made so far, to undo on failure.
#[derive(Default)]
struct Made {
    network: Option<AgentNetwork>,
    record: bool,
    attached: bool,
    volume: bool,
    container: bool,
}

impl Made {
    fn anything(&self) -> bool {
        self.network.is_some() || self.record || self.attached || self.volume || self.container
    }
}

#[async_trait::async_trait]
impl Sandbox for DockerSandbox {
    async fn create(&self, agent: &AgentId, spec: &ContainerSpec) -> agenthold_core::Result<SandboxInfo> {
        if topology::RECORDS
            .load(self.store.as_ref(), agent)
            .await?
            .is_some()
        {
            return Err(Error::BadInput {
                problem: format!("sandbox {agent} already exists"),
            }
            .into());
        }
        let mut made = Made::default();
        match self.create_inner(agent, spec, &mut made).await {
            Ok(()) => Ok(SandboxInfo {
                agent: agent.clone(),
                state: SandboxState::Running,
                image: spec.image().to_owned(),
            }),
            Err(e) => {
                if made.anything()
                    && let Err(undo) = self.teardown(agent, false, made.network.clone()).await
                {
                    tracing::error!(agent = %agent, error = %undo, "cleanup after a failed create failed");
                }
                Err(e.into())
            }
        }
    }

    async fn start(&self, agent: &AgentId) -> agenthold_core::Result<()> {
        let info = self.inspect(agent).await?;
        if info.state == SandboxState::Running {
            return Ok(());
        }
        let record = topology::RECORDS
            .load(self.store.as_ref(), agent)
            .await?
            .ok_or_else(|| not_found(agent))?;
        {
            let mut topo = self.topology.lock().await;
            topo.attach(
                &self.engine,
                &self.gateway,
                &self.tunnel,
                &self.config,
                agent,
                record.net,
            )
            .await?;
        }
        Ok(self.boot(agent).await?)
    }

    async fn stop(&self, agent: &AgentId) -> agenthold_core::Result<()> {
        let options = StopContainerOptions {
            t: Some(10),
            signal: None,
        };
        match self
            .engine
            .docker
            .stop_container(&container_name(agent), Some(options))
            .await
        {
            Ok(()) => {}
            // Already stopped.
            Err(e) if is_not_modified(&e) => {}
            Err(e) if is_not_found(&e) => return Err(not_found(agent).into()),
            Err(e) => return Err(Error::engine(format!("stop the sandbox of {agent}"), e).into()),
        }
        self.tunnel.revoke(agent);
        Ok(topology::save_token(self.store.as_ref(), agent, None).await?)
    }

    async fn remove(&self, agent: &AgentId, keep_volume: bool) -> agenthold_core::Result<()> {
        Ok(self.teardown(agent, keep_volume, None).await?)
    }

    async fn exec_stream(&self, agent: &AgentId, request: ExecRequest) -> agenthold_core::Result<ExecStream> {
        Ok(exec::start(&self.engine, agent, request).await?)
    }

    async fn cancel_exec(&self, agent: &AgentId, exec_id: &str) -> agenthold_core::Result<()> {
        Ok(exec::cancel(&self.engine, agent, exec_id).await?)
    }

    async fn reconcile(&self, _agents: &[AgentId]) -> agenthold_core::Result<ReconcileReport> {
        // This runtime's own records name every sandbox it made (pooled ones too), with their networks.
        let report = self.reconcile_records().await?;
        if !self.watching.swap(true, Ordering::SeqCst)
            && let Some(this) = self.this.upgrade()
        {
            this.watch(self.shutdown.clone());
        }
        Ok(report)
    }

    async fn read_file(&self, agent: &AgentId, path: &str) -> agenthold_core::Result<Vec<u8>> {
        Ok(files::read(&self.engine, agent, path).await?)
    }

    async fn write_file(&self, agent: &AgentId, path: &str, data: &[u8]) -> agenthold_core::Result<()> {
        Ok(files::write(&self.engine, agent, path, data).await?)
    }

    /// Runs GNU `find` in the sandbox (see the `files` module).
    async fn list_dir(&self, agent: &AgentId, path: &str) -> agenthold_core::Result<Vec<DirEntry>> {
        Ok(files::list(&self.engine, agent, path).await?)
    }

    /// Runs `rm -rf` in the sandbox.
    async fn remove_path(&self, agent: &AgentId, path: &str) -> agenthold_core::Result<()> {
        Ok(files::remove(&self.engine, agent, path).await?)
    }

    /// Resolved by the engine's stat API, never by a program in the sandbox (see the `files` module).
    async fn resolve_path(&self, agent: &AgentId, path: &str) -> agenthold_core::Result<String> {
        Ok(files::resolve(&self.engine, agent, path).await?)
    }

    async fn open_terminal(
        &self,
        agent: &AgentId,
        request: TerminalRequest,
    ) -> agenthold_core::Result<Terminal> {
        Ok(terminal::open(&self.engine, agent, request).await?)
    }

    /// Asks the engine whether the exec running `sandboxd run --id EXEC_ID` still runs.
    async fn exec_running(&self, agent: &AgentId, exec_id: &str) -> agenthold_core::Result<bool> {
        Ok(exec::running(&self.engine, agent, exec_id).await?)
    }

    async fn inspect(&self, agent: &AgentId) -> agenthold_core::Result<SandboxInfo> {
        let c = match self
            .engine
            .docker
            .inspect_container(&container_name(agent), None::<InspectContainerOptions>)
            .await
        {
            Ok(c) => c,
            Err(e) if is_not_found(&e) => return Err(not_found(agent).into()),
            Err(e) => return Err(Error::engine(format!("inspect the sandbox of {agent}"), e).into()),
        };
        let running = c.state.and_then(|s| s.running).unwrap_or(false);
        Ok(SandboxInfo {
            agent: agent.clone(),
            state: if running {
                SandboxState::Running
            } else {
                SandboxState::Stopped
            },
            image: c.config.and_then(|c| c.image).unwrap_or_default(),
        })
    }
}

fn not_found(agent: &AgentId) -> Error {
    Error::NotFound {
        agent: agent.to_string(),
    }
}
