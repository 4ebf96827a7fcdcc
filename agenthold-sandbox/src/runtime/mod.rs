//! [`Runtime`] (C2, C5, P1): the embeddable composition of a sandbox runtime, the egress gateway, a secret
//! injector, a policy and a store. The server and the Python bindings both use it.
//!
//! ```no_run
//! # async fn demo() -> agenthold_sandbox::Result<()> {
//! use agenthold_core::{NetworkPolicy, SandboxSpec};
//! use agenthold_sandbox::Runtime;
//!
//! let runtime = Runtime::builder().data_dir("/var/lib/agenthold").build().await?;
//! let spec = SandboxSpec { policy: NetworkPolicy::parse(agenthold_core::PolicyMode::Allowlist, &["example.com"])?, ..SandboxSpec::default() };
//! let agent = runtime.create_sandbox(spec).await?;
//! let out = runtime.exec(&agent, &["curl", "-sI", "https://example.com"]).await?;
//! println!("{}", String::from_utf8_lossy(&out.stdout));
//! runtime.remove(&agent).await?;
//! # Ok(()) }
//! ```
// enforces: P1

mod builder;
mod commands;
mod context;
mod files;
mod pool;
mod records;
mod secrets;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_changes;

use std::sync::Arc;
use std::time::Duration;

use agenthold_core::policy::{EgressPolicy, NetworkPolicy};
use agenthold_core::sandbox::{ContainerSpec, GatewaySpec, SandboxInfo, SandboxSpec};
use agenthold_core::secret::{SecretInjector, SecretValue};
use agenthold_core::{AgentId, Config, Sandbox, Store, Vault};
use agenthold_egress::log::LogEntry;
use agenthold_egress::{CertificateAuthority, Gateway};
use tokio_util::sync::CancellationToken;

pub use builder::RuntimeBuilder;
pub use context::SandboxContext;

use crate::error::{Error, Result};
use crate::tunnel::{TunnelCounters, TunnelServer, TunnelStatus};
use records::AgentRecord;

/// The embeddable agenthold runtime. Create it with [`Runtime::builder`]; every method takes `&self`.
///
/// Its parts are trait objects whatever they are (the defaults or a platform's own): the sandbox runtime,
/// the policy and the injector. Where the runtime manages per-agent state it asks the part for it (the
/// policy's and the injector's `table()`), never which kind of part it was given.
pub struct Runtime {
    config: Config,
    store: Arc<dyn Store>,
    vault: Arc<Vault>,
    policy: Arc<dyn EgressPolicy>,
    injector: Arc<dyn SecretInjector>,
    gateway: Arc<Gateway>,
    ca: Arc<CertificateAuthority>,
    sandbox: Arc<dyn Sandbox>,
    tunnel: Arc<TunnelServer>,
    /// The warm pool (`sandbox.warm_pool`; empty when 0).
    pool: Arc<pool::Pool>,
    /// Held while an agent's record is read, changed and stored again (policy, secrets, a refreshed token,
    /// forgetting), so two changes never lose one another.
    record_lock: Arc<tokio::sync::Mutex<()>>,
    /// Told about every token refresh's new values, after the runtime kept them (see
    /// [`Runtime::on_token_refresh`]).
    refresh_listener: RefreshListener,
    cancel: CancellationToken,
}

/// What [`Runtime::on_token_refresh`] installs.
pub type RefreshListenerFn = Arc<dyn Fn(&AgentId, &str, &SecretValue) + Send + Sync>;
type RefreshListener = Arc<std::sync::RwLock<Option<RefreshListenerFn>>>;

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("data_dir", &self.config.data_dir)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Call `listener` with `(agent, secret name, new value)` whenever the gateway answered a token refresh
    /// and renewed one of an agent's secrets (E15), synchronously, while the refresh still holds its
    /// group's lock: an embedder that keeps its own copy of an account's tokens (the reference server's
    /// provider logins) records the rotated ones before the next refresh of that account can start. The
    /// runtime persists the agent's own record anyway. Replaces an earlier listener.
    pub fn on_token_refresh(&self, listener: RefreshListenerFn) {
        *self
            .refresh_listener
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(listener);
    }

    /// Start building a runtime.
    #[must_use]
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// The configuration in use.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The installation's CA certificate (PEM): what sandboxes trust for intercepted hosts.
    #[must_use]
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// The egress gateway (its request log, for instance).
    #[must_use]
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Create and start a sandbox with a new random agent id (a warm-pool one when the spec is plain and
    /// one is ready).
    ///
    /// # Errors
    /// When the spec is invalid (see [`SandboxSpec::split`]; also an environment variable the datapath sets
    /// itself), or the sandbox runtime fails; nothing is left behind.
    pub async fn create_sandbox(&self, spec: SandboxSpec) -> Result<AgentId> {
        let (container, gateway) = admit(spec)?;
        if let Some(agent) = self.take_pooled(&container, &gateway).await? {
            return Ok(agent);
        }
        let agent = AgentId::random();
        self.create_admitted(&agent, container, gateway).await?;
        Ok(agent)
    }

    /// Create and start a sandbox for `agent`.
    ///
    /// # Errors
    /// As [`Runtime::create_sandbox`]; also when `agent` already exists.
    pub async fn create_sandbox_with_id(&self, agent: &AgentId, spec: SandboxSpec) -> Result<SandboxInfo> {
        let (container, gateway) = admit(spec)?;
        self.create_admitted(agent, container, gateway).await
    }

    /// Hand out a warm-pool sandbox for a spec, if it fits one and one is ready: its policy becomes the
    /// spec's and its record the caller's. A spec other than the plain one is applied to it first (see
    /// [`Runtime::reconfigure_pooled`]). `None` sends the caller to a fresh create.
    async fn take_pooled(&self, container: &ContainerSpec, gateway: &GatewaySpec) -> Result<Option<AgentId>> {
        let fit = self.pool.fit(container, gateway);
        if fit == pool::Fit::No {
            return Ok(None);
        }
        let taken = self.pool.take();
        self.pool.refill();
        let Some(agent) = taken else {
            return Ok(None);
        };
        if fit == pool::Fit::Reconfigured {
            return Ok(self
                .reconfigure_pooled(agent, container.clone(), gateway.clone())
                .await);
        }
        let record = AgentRecord {
            spec: SandboxSpec::join(container.clone(), gateway.clone()),
            secrets: Vec::new(),
            pooled: false,
        };
        records::RECORDS
            .save(self.store.as_ref(), &agent, &record)
            .await?;
        if let Some(table) = self.policy.table() {
            table.set(agent.clone(), gateway.policy.clone());
        }
        Ok(Some(agent))
    }

    /// Hand out the pooled sandbox `agent` for a spec other than the plain one: its secrets enter the
    /// injector's table, the environment (with their placeholders) and the limits are applied to the
    /// running sandbox ([`Sandbox::reconfigure`]), then the record is the caller's and the policy the
    /// spec's, as a fresh create would leave them. The policy stays "refuse everything" until the end. On
    /// any failure the sandbox is removed, never put back (it may carry part of this spec), and `None`
    /// sends the caller to a fresh create; a sandbox runtime that cannot reconfigure
    /// ([`agenthold_core::ErrorKind::Unavailable`]) is not asked again.
    async fn reconfigure_pooled(
        &self,
        agent: AgentId,
        mut container: ContainerSpec,
        mut gateway: GatewaySpec,
    ) -> Option<AgentId> {
        let secrets = std::mem::take(&mut gateway.secrets);
        let placeholders = match self.injector.table() {
            Some(table) => table.set(&agent, secrets.clone()),
            None => Vec::new(),
        };
        let handed = async {
            for p in &placeholders {
                if let Some(env) = &p.env {
                    container.set_env(env, &p.placeholder)?;
                }
            }
            let spec = SandboxSpec::join(container.clone(), gateway.clone());
            let record = AgentRecord::new(&spec, &secrets, &placeholders, &self.vault, &agent)?;
            // Independent: both run to their end; a failure of either removes the sandbox with its record.
            let (reconfigured, saved) = tokio::join!(
                self.sandbox.reconfigure(&agent, &container),
                records::RECORDS.save(self.store.as_ref(), &agent, &record)
            );
            if let Err(e) = reconfigured {
                if e.kind() == agenthold_core::ErrorKind::Unavailable {
                    self.pool.no_reconfigure();
                }
                return Err(Error::from(e));
            }
            saved?;
            if let Some(table) = self.policy.table() {
                table.set(agent.clone(), gateway.policy.clone());
            }
            Ok::<(), Error>(())
        }
        .await;
        match handed {
            Ok(()) => Some(agent),
            Err(e) => {
                tracing::warn!(agent = %agent, error = %e, "warm pool: hand-out failed; creating afresh");
                if let Some(table) = self.injector.table() {
                    table.remove(&agent);
                }
                self.pool.discard(&agent).await;
                None
            }
        }
    }

    /// Create `agent` from a checked spec: secrets and policy to the gateway's tables, the record to the
    /// store, the container half to the sandbox runtime. On any failure everything is undone.
    async fn create_admitted(
        &self,
        agent: &AgentId,
        mut container: ContainerSpec,
        mut gateway: GatewaySpec,
    ) -> Result<SandboxInfo> {
        if records::RECORDS.load(self.store.as_ref(), agent).await?.is_some() {
            return Err(Error::BadInput {
                problem: format!("sandbox {agent} already exists"),
            });
        }
        let secrets = std::mem::take(&mut gateway.secrets);
        let placeholders = match self.injector.table() {
            Some(table) => table.set(agent, secrets.clone()),
            None => Vec::new(),
        };
        if let Some(table) = self.policy.table() {
            table.set(agent.clone(), gateway.policy.clone());
        }
        // From here on a failure undoes the tables' entries too.
        let created = async {
            for p in &placeholders {
                if let Some(env) = &p.env {
                    container.set_env(env, &p.placeholder)?;
                }
            }
            let spec = SandboxSpec::join(container.clone(), gateway);
            let record = AgentRecord::new(&spec, &secrets, &placeholders, &self.vault, agent)?;
            records::RECORDS.save(self.store.as_ref(), agent, &record).await?;
            Ok(self.sandbox.create(agent, &container).await?)
        }
        .await;
        if created.is_err() {
            self.forget(agent).await;
        }
        created
    }

    /// Replace an agent's network policy; new connections and DNS queries use it at once (E8).
    ///
    /// # Errors
    /// When the agent does not exist, or the runtime's policy has no per-agent table (a custom policy).
    pub async fn set_policy(&self, agent: &AgentId, policy: NetworkPolicy) -> Result<()> {
        let table = self.policy.table().ok_or_else(|| Error::Unavailable {
            problem: "policies are managed by the custom EgressPolicy this runtime was built with".into(),
        })?;
        let _records = self.record_lock.lock().await;
        let mut record = records::RECORDS
            .load(self.store.as_ref(), agent)
            .await?
            .ok_or_else(|| Error::NotFound {
                agent: agent.to_string(),
            })?;
        record.spec.policy = policy.clone();
        records::RECORDS.save(self.store.as_ref(), agent, &record).await?;
        table.set(agent.clone(), policy);
        Ok(())
    }

    /// The agent's network policy, as last set (E8).
    ///
    /// # Errors
    /// When the agent does not exist or the store fails.
    pub async fn policy(&self, agent: &AgentId) -> Result<NetworkPolicy> {
        Ok(self.spec(agent).await?.policy)
    }

    /// The spec the agent was created with, as it stands now (its policy as last set). Its `secrets` are
    /// empty: values never leave the runtime (see [`Runtime::agent_secrets`] for names and placeholders).
    ///
    /// # Errors
    /// When the agent does not exist or the store fails.
    pub async fn spec(&self, agent: &AgentId) -> Result<SandboxSpec> {
        let mut spec = self.record(agent).await?.spec;
        spec.secrets.clear();
        Ok(spec)
    }

    /// The stored record of a handed-out agent (a warm-pool sandbox nobody took is not one).
    async fn record(&self, agent: &AgentId) -> Result<records::AgentRecord> {
        records::RECORDS
            .load(self.store.as_ref(), agent)
            .await?
            .filter(|r| !r.pooled)
            .ok_or_else(|| Error::NotFound {
                agent: agent.to_string(),
            })
    }

    /// The agent's request log, oldest first (E16).
    #[must_use]
    pub fn request_log(&self, agent: &AgentId) -> Vec<LogEntry> {
        self.gateway.log().snapshot(agent)
    }

    /// The agent's request log entries still held whose [`LogEntry::seq`] is greater than `after_seq`,
    /// oldest first (E16): what a reader that saw up to `after_seq` missed. Entries that fell out of the
    /// agent's ring meanwhile are gone; a gap in `seq` between the last one seen and the first returned may
    /// also be other agents' entries (one counter numbers every agent's).
    ///
    /// To resume a live stream without a gap: [`Runtime::subscribe_requests`] first, then this, then the
    /// live entries whose `seq` is greater than the last one returned here.
    #[must_use]
    pub fn request_log_since(&self, agent: &AgentId, after_seq: u64) -> Vec<LogEntry> {
        self.gateway.log().since(agent, after_seq)
    }

    /// Every request log entry recorded from now on, of every agent, as it is recorded (E16). A receiver
    /// that falls more than 1024 entries behind gets `RecvError::Lagged` and skips ahead; it can fill the gap
    /// from [`Runtime::request_log_since`].
    #[must_use]
    pub fn subscribe_requests(&self) -> tokio::sync::broadcast::Receiver<Arc<LogEntry>> {
        self.gateway.log().subscribe()
    }

    /// Whether the agent's sandboxd has a live tunnel (S2).
    #[must_use]
    pub fn tunnel_status(&self, agent: &AgentId) -> TunnelStatus {
        self.tunnel.status(agent)
    }

    /// What the tunnel listeners did, all agents together: connections open and accepted, tunnels up,
    /// refusals by kind (over budget, hello timeout, bad hello, bad token), failed accepts (E20).
    #[must_use]
    pub fn tunnel_counters(&self) -> TunnelCounters {
        self.tunnel.counters()
    }

    /// [`Runtime::tunnel_counters`] of one agent's listener.
    #[must_use]
    pub fn agent_tunnel_counters(&self, agent: &AgentId) -> TunnelCounters {
        self.tunnel.agent_counters(agent)
    }

    /// Current state of a sandbox.
    ///
    /// # Errors
    /// When it does not exist.
    pub async fn inspect(&self, agent: &AgentId) -> Result<SandboxInfo> {
        Ok(self.sandbox.inspect(agent).await?)
    }

    /// Every sandbox this runtime knows.
    ///
    /// # Errors
    /// When the store fails.
    pub async fn sandboxes(&self) -> Result<Vec<AgentId>> {
        Ok(records::RECORDS
            .list(self.store.as_ref())
            .await?
            .into_iter()
            .filter(|(_, r)| !r.pooled)
            .map(|(a, _)| a)
            .collect())
    }

    /// Stop a sandbox (its volume and settings stay).
    ///
    /// # Errors
    /// When it does not exist.
    pub async fn stop(&self, agent: &AgentId) -> Result<()> {
        Ok(self.sandbox.stop(agent).await?)
    }

    /// Start a stopped sandbox (a new boot: new tunnel token, CA written again).
    ///
    /// # Errors
    /// When it does not exist.
    pub async fn start(&self, agent: &AgentId) -> Result<()> {
        Ok(self.sandbox.start(agent).await?)
    }

    /// Remove a sandbox with its network, rules and volume.
    ///
    /// # Errors
    /// When the engine fails (what could be removed is removed).
    pub async fn remove(&self, agent: &AgentId) -> Result<()> {
        self.remove_with(agent, false).await
    }

    /// Remove a sandbox, keeping its volume when `keep_volume`. The agent's next sandbox (a create with
    /// the same id) mounts the kept volume at `/workspace` again; a create that fails leaves it in place.
    ///
    /// # Errors
    /// As [`Runtime::remove`].
    pub async fn remove_with(&self, agent: &AgentId, keep_volume: bool) -> Result<()> {
        let removed = self.sandbox.remove(agent, keep_volume).await;
        self.forget(agent).await;
        Ok(removed?)
    }

    /// Drop everything the runtime holds for `agent` (policy, secrets, log, record).
    async fn forget(&self, agent: &AgentId) {
        let _records = self.record_lock.lock().await;
        if let Some(table) = self.policy.table() {
            table.remove(agent);
        }
        if let Some(table) = self.injector.table() {
            table.remove(agent);
        }
        self.gateway.log().forget(agent);
        if let Err(e) = records::RECORDS.delete(self.store.as_ref(), agent).await {
            tracing::warn!(agent = %agent, error = %e, "could not delete the sandbox record");
        }
    }

    /// Stop serving: listeners close, the event watcher ends. Sandboxes keep running; a runtime started
    /// again on the same data directory takes them over (reconcile).
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.pool.drain().await;
        self.sandbox.shutdown().await;
        self.gateway.shutdown(Duration::from_secs(2)).await;
    }

    /// Warm-pool sandboxes ready to hand out right now (0 without a pool).
    #[must_use]
    pub fn warm_pool_ready(&self) -> usize {
        self.pool.len()
    }
}

/// Where a spec enters: checked once ([`SandboxSpec::split`], plus the environment variables agenthold's
/// datapath sets itself in every sandbox, which a spec may not set) and split into its halves.
fn admit(spec: SandboxSpec) -> Result<(ContainerSpec, GatewaySpec)> {
    let secret_vars = spec.secrets.iter().filter_map(|s| s.env.as_deref());
    if let Some(var) = spec
        .env
        .keys()
        .map(String::as_str)
        .chain(secret_vars)
        .find(|var| crate::docker::DATAPATH_ENV.contains(var))
    {
        return Err(Error::BadInput {
            problem: format!("{var} is set by agenthold's datapath in every sandbox; choose another name"),
        });
    }
    Ok(spec.split()?)
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
