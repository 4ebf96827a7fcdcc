//! [`DockerSandbox`], the default [`Sandbox`]: one container, internal network and volume per agent, every
//! network joined by the gateway holder, the gateway's listeners bound per agent inside its namespace.
//!
//! Order matters for failing closed: the network, the gateway's `.2`, the nftables rules and the listeners
//! exist before a sandbox first starts, and a failed create removes whatever it had made.

mod archive;
mod cgroup;
mod config;
mod container;
pub mod engine;
mod exec;
mod files;
mod handout;
pub mod harness_image;
mod hijack;
pub mod holder;
pub mod hostfw;
pub mod image;
pub mod network;
mod reconcile;
mod terminal;
mod topology;

use std::collections::{HashMap, HashSet};
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
use topology::{AgentRecord, TopologyLock};

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
    topology: TopologyLock,
    /// Agents agenthold itself started, with how many of those starts the watcher has not seen yet (a
    /// create whose planned subnet the engine refused starts two containers in a row).
    starting: Mutex<HashMap<AgentId, u32>>,
    /// Agents whose sandbox container a create is making again (the engine refused the planned subnet):
    /// the death of the container being replaced revokes nothing.
    remaking: Mutex<HashSet<AgentId>>,
    /// Itself, for the event watcher [`Sandbox::reconcile`] starts.
    this: Weak<Self>,
    /// Ends the event watcher (the runtime's shutdown).
    shutdown: CancellationToken,
    /// Whether the event watcher runs.
    watching: AtomicBool,
    /// The event watcher, which releases the idle holder when it ends (awaited by [`Sandbox::shutdown`]).
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Environments applied at a warm-pool hand-out, given to every exec.
    exec_env: handout::ExecEnv,
    /// Engine updates of limits a hand-out wrote straight into the cgroups, still running (a start of the
    /// agent waits for its own: the engine recreates the cgroups from its record).
    limits_sync: Mutex<HashMap<AgentId, LimitsSync>>,
    /// A `sandboxd run` started ahead of its command per agent ([`Sandbox::prepare_exec`]), taken by the
    /// agent's next exec.
    ahead: Mutex<HashMap<AgentId, exec::Ahead>>,
}

/// An engine update in the background of limits already in the cgroups.
struct LimitsSync {
    limits: handout::Limits,
    task: tokio::task::JoinHandle<Result<()>>,
}

/// How long a shutdown waits for the engine watcher to release the idle holder (one lock wait and one
/// engine removal).
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a start waits for a background limits update (an engine request is bounded at 120 s).
const LIMITS_SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(150);

/// How long after a hand-out the engine's record of the limits is updated: its `runc update` competes with
/// the first command a caller runs right after the hand-out (measured: +15–20 ms on that exec).
const LIMITS_RECORD_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

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
            topology: TopologyLock::default(),
            starting: Mutex::new(HashMap::new()),
            remaking: Mutex::new(HashSet::new()),
            this: this.clone(),
            shutdown,
            watching: AtomicBool::new(false),
            watcher: Mutex::new(None),
            exec_env: handout::ExecEnv::default(),
            limits_sync: Mutex::new(HashMap::new()),
            ahead: Mutex::new(HashMap::new()),
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

    fn starting(&self) -> std::sync::MutexGuard<'_, HashMap<AgentId, u32>> {
        self.starting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a create is making `agent`'s sandbox container again ([`Self::remaking`]).
    fn is_remade(&self, agent: &AgentId) -> bool {
        self.remaking
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(agent)
    }

    /// Count one start of `agent`'s sandbox by agenthold itself, until its event is seen.
    fn mark_start(&self, agent: &AgentId) {
        *self.starting().entry(agent.clone()).or_default() += 1;
    }

    /// Whether a start of `agent`'s sandbox was agenthold's own (and one fewer is now awaited): called for
    /// every start event, and for a start that failed (it makes no event).
    fn own_start(&self, agent: &AgentId) -> bool {
        let mut starting = self.starting();
        match starting.get_mut(agent) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => starting.remove(agent).is_some(),
            None => false,
        }
    }

    fn ahead(&self) -> std::sync::MutexGuard<'_, HashMap<AgentId, exec::Ahead>> {
        self.ahead.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn limits_sync(&self) -> std::sync::MutexGuard<'_, HashMap<AgentId, LimitsSync>> {
        self.limits_sync.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The engine's update of `agent`'s limits (`runc update`).
    async fn update_limits(&self, agent: &AgentId, limits: handout::Limits) -> Result<()> {
        update_limits(&self.engine, agent, limits).await
    }

    /// Set `agent`'s limits on its running container: straight into its cgroups when they are certain
    /// (`cgroup.rs`), the engine's record then updated in the background; otherwise through the engine.
    async fn set_limits(&self, agent: &AgentId, limits: handout::Limits) -> Result<()> {
        let inspected = self
            .engine
            .docker
            .inspect_container(&container_name(agent), None::<InspectContainerOptions>)
            .await
            .map_err(|e| {
                if is_not_found(&e) {
                    not_found(agent)
                } else {
                    Error::engine(format!("inspect the sandbox of {agent}"), e)
                }
            })?;
        let runc = inspected.host_config.as_ref().and_then(|h| h.runtime.as_deref()) == Some("runc");
        let pid = inspected
            .state
            .as_ref()
            .filter(|s| s.running == Some(true))
            .and_then(|s| s.pid)
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p != 0);
        let written = match (runc, pid, inspected.id.as_deref()) {
            (true, Some(pid), Some(id)) => {
                cgroup::write(std::path::Path::new(cgroup::ROOT), id, pid, limits).unwrap_or_else(|e| {
                    tracing::warn!(agent = %agent, error = %e, "writing the limits into the cgroups failed; the engine sets them");
                    cgroup::Written::NotHere
                })
            }
            _ => cgroup::Written::NotHere,
        };
        if written == cgroup::Written::NotHere {
            return self.update_limits(agent, limits).await;
        }
        tracing::debug!(agent = %agent, "limits written into the cgroups; the engine's record follows");
        let engine = self.engine.clone();
        let owner = agent.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(LIMITS_RECORD_DELAY).await;
            let updated = update_limits(&engine, &owner, limits).await;
            if let Err(e) = &updated {
                tracing::warn!(agent = %owner, error = %e, "the engine's record of the limits is not updated yet; the next start retries");
            }
            updated
        });
        if let Some(old) = self
            .limits_sync()
            .insert(agent.clone(), LimitsSync { limits, task })
        {
            old.task.abort();
        }
        Ok(())
    }

    /// Serve `agent` on `net` through the gateway holder ([`topology::Topology::attach`]), in the topology the
    /// caller holds.
    async fn serve(&self, topo: &mut topology::Topology, agent: &AgentId, net: AgentNetwork) -> Result<()> {
        topo.attach(
            &self.engine,
            &self.gateway,
            &self.tunnel,
            &self.config,
            agent,
            net,
        )
        .await
    }

    /// Wait for `agent`'s background limits update, redoing it through the engine when it failed or is
    /// still not done after [`LIMITS_SYNC_WAIT`]: a start must not bring back older limits.
    async fn sync_limits(&self, agent: &AgentId) -> Result<()> {
        let Some(LimitsSync { limits, task }) = self.limits_sync().remove(agent) else {
            return Ok(());
        };
        match tokio::time::timeout(LIMITS_SYNC_WAIT, task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            _ => self.update_limits(agent, limits).await,
        }
    }

    /// A new boot: fresh token (its hash expected by the tunnel and persisted), files written, started and
    /// plugged into `net`.
    async fn boot(&self, agent: &AgentId, net: &AgentNetwork) -> Result<()> {
        self.prepare_boot(agent).await?;
        self.start_booted(agent, net).await
    }

    /// The first half of a boot, for a created container that is not running: a fresh token, its hash
    /// expected by the tunnel and persisted, the token put where the sandbox reads it.
    async fn prepare_boot(&self, agent: &AgentId) -> Result<()> {
        let (token, hash) = new_token();
        self.tunnel.expect(agent, hash);
        topology::save_token(self.store.as_ref(), agent, Some(hash)).await?;
        container::put_boot_token(&self.engine, &self.config, agent, &token).await
    }

    /// The second half of a boot: start the prepared container and plug it into `net`.
    async fn start_booted(&self, agent: &AgentId, net: &AgentNetwork) -> Result<()> {
        self.start_prepared(agent).await?;
        self.plug(agent, net).await
    }

    /// Start the prepared container; it has loopback only until [`Self::plug`].
    async fn start_prepared(&self, agent: &AgentId) -> Result<()> {
        // Marked until the event watcher sees this start, so it does not mistake it for a foreign one.
        self.mark_start(agent);
        let started = self
            .engine
            .docker
            .start_container(&container_name(agent), None::<StartContainerOptions>)
            .await;
        started.map_err(|e| {
            self.own_start(agent);
            Error::engine(format!("start the sandbox of {agent}"), e)
        })
    }

    /// Plug `agent`'s started sandbox into `net` ([`network::plug_sandbox`]). Nothing to do for a sandbox an
    /// earlier version made (an engine endpoint of its network) or one that is not running (any more: its
    /// next start plugs it).
    async fn plug(&self, agent: &AgentId, net: &AgentNetwork) -> Result<()> {
        let found = self
            .engine
            .docker
            .inspect_container(&container_name(agent), None::<InspectContainerOptions>)
            .await
            .map_err(|e| Error::engine(format!("inspect the sandbox of {agent}"), e))?;
        let mode = found.host_config.as_ref().and_then(|h| h.network_mode.as_deref());
        if mode != Some("none") {
            return Ok(());
        }
        let state = found.state.unwrap_or_default();
        let pid = state.pid.and_then(|p| u32::try_from(p).ok()).filter(|p| *p > 0);
        let (Some(true), Some(pid)) = (state.running, pid) else {
            return Ok(());
        };
        let id = found.id.unwrap_or_default();
        let target = net.clone();
        let plugged = tokio::task::spawn_blocking(move || network::plug_sandbox(&target, &id, pid))
            .await
            .map_err(|e| Error::Unavailable {
                problem: format!("plugging the sandbox of {agent} into its network: {e}"),
            })?;
        match plugged {
            Ok(()) => Ok(()),
            Err(_) if !self.is_running(agent).await? => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn create_inner(&self, agent: &AgentId, spec: &ContainerSpec, made: &mut Made) -> Result<()> {
        image::require_image(&self.engine.docker, spec.image()).await?;
        let mut topo = self.topology.lock("create a sandbox network").await?;
        let planned = self.allocate(&mut topo, agent).await?;
        // Two branches once the subnet is chosen: the network side (the engine's network, the record, then
        // the gateway side: host firewall, holder join, rules, listeners) and the sandbox side (boot token,
        // volume, container, start). The sandbox is not an endpoint of the network: it has loopback only
        // until it is plugged in (`network::plug_sandbox`), which waits for both sides, so the rules and
        // listeners exist before its first packet (E1). The start waits for nothing of the network side
        // (should the engine refuse the planned subnet, the container, whose environment names that
        // subnet's `.2`, is made and started again for the one that exists). Both run to their end (no
        // cancelling a branch halfway through an engine call, which could make an object after the teardown
        // looked for it); a teardown removes whatever exists.
        made.attached = true;
        made.container = true;
        // The boot token's hash goes into the record the network side saves (a boot's usual
        // `prepare_boot` would race with that save); the sandbox side writes the token itself.
        let (token, hash) = new_token();
        self.tunnel.expect(agent, hash);
        let (network_made, network_known) = tokio::sync::oneshot::channel::<AgentNetwork>();
        let mut made_network = None;
        let network_side = async {
            // Owned here, so that the topology is free for other creates once this agent is served (not
            // held through the sandbox side's start).
            let mut topo = topo;
            let net = match self.make_network(&mut topo, agent, planned.clone()).await {
                Ok(net) => net,
                Err(e) => {
                    // At once, not when this future is dropped: the sandbox side waits for it.
                    drop(network_made);
                    return Err(e);
                }
            };
            made_network = Some(net.clone());
            let _ = network_made.send(net.clone());
            topology::RECORDS
                .save(
                    self.store.as_ref(),
                    agent,
                    &AgentRecord {
                        net: net.clone(),
                        token: Some(hex::encode(hash)),
                    },
                )
                .await?;
            self.serve(&mut topo, agent, net.clone()).await?;
            drop(topo);
            Ok::<_, Error>(net)
        };
        let sandbox_side = async {
            let made_volume = ensure_volume(&self.engine, agent).await?;
            let started = async {
                // On the host, before the create (it mounts the token's directory): no engine call.
                container::write_boot_token(&self.config, agent, &token)?;
                container::create(&self.engine, agent, spec, &planned, &self.config).await?;
                self.start_prepared(agent).await?;
                // Dropped unsent: the network side failed, and says why (its teardown removes this).
                let Ok(net) = network_known.await else {
                    return Ok(());
                };
                if net != planned {
                    // Rare: the engine refused the planned subnet, which the environment names. The started
                    // sandbox was never plugged in (it had loopback only); it is made again for the real
                    // network, with the same token written again (the first boot took it). Until the new one
                    // runs, the event watcher takes the old one's death for what it is (`on_event`).
                    let remade = async {
                        remove_sandbox_container(&self.engine, agent).await?;
                        container::write_boot_token(&self.config, agent, &token)?;
                        container::create(&self.engine, agent, spec, &net, &self.config).await?;
                        self.start_prepared(agent).await
                    };
                    self.remaking
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(agent.clone());
                    let remade = remade.await;
                    self.remaking
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(agent);
                    remade?;
                }
                Ok::<_, Error>(())
            };
            Ok::<_, Error>((made_volume, started.await))
        };
        let (network, sandbox) = tokio::join!(network_side, sandbox_side);
        // What either side made, for the teardown of a failed create. The record is saved with the
        // network, so it counts as soon as the network does.
        if let Ok((made_volume, _)) = &sandbox {
            made.volume = *made_volume;
        }
        made.record = made_network.is_some();
        made.network = made_network;
        let net = network?;
        let (_, started) = sandbox?;
        started?;
        self.plug(agent, &net).await
    }

    /// A free subnet of the configured pool for `agent` ([`topology::Topology::allocate`]).
    async fn allocate(&self, topo: &mut topology::Topology, agent: &AgentId) -> Result<AgentNetwork> {
        let (pool, prefix) = (self.config.subnet_pool, self.config.subnet_prefix);
        topo.allocate(&self.engine, pool, prefix, agent).await
    }

    /// Create `agent`'s network on `planned`, or on the next free subnet when the engine refuses it as
    /// overlapping: another runtime on the same engine may take the subnet we picked before we create the
    /// network (the refused one stays reserved).
    async fn make_network(
        &self,
        topo: &mut topology::Topology,
        agent: &AgentId,
        planned: AgentNetwork,
    ) -> Result<AgentNetwork> {
        let mut net = planned;
        let mut tries = 0;
        loop {
            match crate::docker::network::create(&self.engine, agent, &net).await? {
                network::Created::Made => return Ok(net),
                network::Created::SubnetTaken if tries < SUBNET_TRIES => {
                    tries += 1;
                    topo.subnet_refused();
                    tracing::debug!(agent = %agent, subnet = %net.subnet, "subnet taken meanwhile; picking another");
                    net = self.allocate(topo, agent).await?;
                }
                network::Created::SubnetTaken => {
                    return Err(Error::Unavailable {
                        problem: format!(
                            "the engine refused {SUBNET_TRIES} subnets of sandbox.subnet_pool as overlapping \
                             other networks; is another program creating networks in that range?"
                        ),
                    });
                }
            }
        }
    }

    /// Remove the container, the agent's attachment, network and record; the volume unless `keep_volume`.
    async fn teardown(&self, agent: &AgentId, keep_volume: bool, known: Option<AgentNetwork>) -> Result<()> {
        if let Some(sync) = self.limits_sync().remove(agent) {
            sync.task.abort();
        }
        // Its stdin closes: the `run` waiting in the sandbox ends without starting anything.
        drop(self.ahead().remove(agent));
        remove_sandbox_container(&self.engine, agent).await?;
        self.tunnel.forget(agent);
        let mut topo = self.topology.lock("remove a sandbox network").await?;
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
        // What the sandbox may have left in its boot directory goes with it (`remove_dir_all` follows no
        // link the sandbox planted there).
        let _ = std::fs::remove_dir_all(container::boot_dir(&self.config, agent));
        self.exec_env.forget(self.store.as_ref(), agent).await?;
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

/// Make `agent`'s volume unless it exists already (kept by a `remove` with `keep_volume`, for the agent's
/// next sandbox): true when this call made it, so that only then does a failed create remove it.
async fn ensure_volume(engine: &Engine, agent: &AgentId) -> Result<bool> {
    match engine.docker.inspect_volume(&volume_name(agent)).await {
        Ok(_) => return Ok(false),
        Err(e) if is_not_found(&e) => {}
        Err(e) => return Err(Error::engine("inspect the volume", e)),
    }
    let volume = VolumeCreateRequest {
        name: Some(volume_name(agent)),
        labels: Some(engine.labels(Some(agent), "volume")),
        ..Default::default()
    };
    engine
        .docker
        .create_volume(volume)
        .await
        .map_err(|e| Error::engine("create the volume", e))?;
    Ok(true)
}

/// How many times a removal is tried when the storage driver could not delete the root filesystem yet.
const REMOVE_TRIES: u32 = 4;

/// Force-remove `agent`'s sandbox container (gone already is fine), trying again when the storage driver
/// was not done with its root filesystem (see [`engine::is_busy_rootfs`]).
async fn remove_sandbox_container(engine: &Engine, agent: &AgentId) -> Result<()> {
    let mut tries = 0;
    loop {
        let options = RemoveContainerOptions {
            force: true,
            v: false,
            link: false,
        };
        match engine
            .docker
            .remove_container(&container_name(agent), Some(options))
            .await
        {
            Ok(()) => return Ok(()),
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) if engine::is_busy_rootfs(&e) && tries + 1 < REMOVE_TRIES => {
                tries += 1;
                tracing::debug!(agent = %agent, tries, "the storage driver still holds the root filesystem; removing again");
                tokio::time::sleep(std::time::Duration::from_millis(250 * u64::from(tries))).await;
            }
            Err(e) => return Err(Error::engine(format!("remove the sandbox of {agent}"), e)),
        }
    }
}

/// The engine's update of `agent`'s limits on its running container (`runc update`).
async fn update_limits(engine: &Engine, agent: &AgentId, limits: handout::Limits) -> Result<()> {
    match engine
        .docker
        .update_container(&container_name(agent), limits.update())
        .await
    {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Err(not_found(agent)),
        Err(e) => Err(Error::engine(
            format!("update the limits of the sandbox of {agent}"),
            e,
        )),
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
                    // A volume this create did not make was kept by an earlier `remove`: it holds the
                    // agent's work and outlives the failed create.
                    && let Err(undo) = self.teardown(agent, !made.volume, made.network.clone()).await
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
        self.sync_limits(agent).await?;
        {
            let mut topo = self.topology.lock("attach a started sandbox").await?;
            self.serve(&mut topo, agent, record.net.clone()).await?;
        }
        Ok(self.boot(agent, &record.net).await?)
    }

    async fn stop(&self, agent: &AgentId) -> agenthold_core::Result<()> {
        drop(self.ahead().remove(agent));
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

    async fn exec_stream(
        &self,
        agent: &AgentId,
        mut request: ExecRequest,
    ) -> agenthold_core::Result<ExecStream> {
        self.exec_env
            .apply(self.store.as_ref(), agent, &mut request.env)
            .await?;
        let ahead = self.ahead().remove(agent);
        if let Some(ahead) = ahead {
            match exec::start_with(&self.engine, agent, ahead, request).await? {
                Ok(stream) => return Ok(stream),
                Err(back) => request = back,
            }
        }
        Ok(exec::start(&self.engine, agent, request).await?)
    }

    /// Starts `sandboxd run --request-stdin` in the sandbox and keeps it attached for the agent's next
    /// exec (one per agent; a second call replaces the first, whose `run` then ends unused).
    async fn prepare_exec(&self, agent: &AgentId) -> agenthold_core::Result<()> {
        let ahead = exec::start_ahead(&self.engine, agent).await?;
        drop(self.ahead().insert(agent.clone(), ahead));
        Ok(())
    }

    /// The environment is kept by the runtime and given to every exec and terminal (see the `handout`
    /// module); the limits are updated on the running container. Labels stay the runtime's records.
    async fn reconfigure(&self, agent: &AgentId, spec: &ContainerSpec) -> agenthold_core::Result<()> {
        if topology::RECORDS
            .load(self.store.as_ref(), agent)
            .await?
            .is_none()
        {
            return Err(not_found(agent).into());
        }
        let limits = async {
            if !handout::sets_limits(spec) {
                return Ok(());
            }
            let limits = handout::Limits::of(spec, &self.config)?;
            self.set_limits(agent, limits).await
        };
        // Both before this returns; neither depends on the other.
        let (limits, env) = tokio::join!(limits, self.exec_env.set(self.store.as_ref(), agent, spec.env()));
        limits?;
        Ok(env?)
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
            let watcher = this.watch(self.shutdown.clone());
            *self.watcher.lock().unwrap_or_else(PoisonError::into_inner) = Some(watcher);
            // The holder starts now, in the background, not with the first create (which finds it up, or
            // waits for the topology lock until it is). Skipped when something holds the lock already:
            // whatever it is starts the holder itself if it needs one.
            tokio::spawn(async move {
                let Some(mut topo) = this.topology.try_lock("start the gateway container ahead") else {
                    return;
                };
                if this.shutdown.is_cancelled() {
                    // Shutting down already: the watcher releases the holder, none is started.
                    return;
                }
                let warmed = topo.warm(&this.engine, &this.gateway, &this.config).await;
                drop(topo);
                if let Err(e) = warmed {
                    tracing::warn!(error = %e, "cannot start the gateway container ahead; the first create will");
                }
            });
        }
        Ok(report)
    }

    /// Waits (at most [`SHUTDOWN_WAIT`]) for the event watcher to end, which removes the idle holder.
    async fn shutdown(&self) {
        let watcher = self.watcher.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(watcher) = watcher
            && tokio::time::timeout(SHUTDOWN_WAIT, watcher).await.is_err()
        {
            tracing::warn!(
                "the engine watcher did not end within {} s; the idle gateway container may stay",
                SHUTDOWN_WAIT.as_secs()
            );
        }
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
        mut request: TerminalRequest,
    ) -> agenthold_core::Result<Terminal> {
        // The terminal's default `TERM` beats the spec's, as it beats a container's environment.
        request
            .env
            .entry("TERM".to_owned())
            .or_insert_with(|| terminal::TERM.to_owned());
        self.exec_env
            .apply(self.store.as_ref(), agent, &mut request.env)
            .await?;
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
