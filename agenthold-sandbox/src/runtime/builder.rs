//! [`RuntimeBuilder`]: every part of a [`Runtime`] has a default and can be swapped (C2).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use agenthold_core::policy::EgressPolicy;
use agenthold_core::secret::{SecretInjector, SecretValue};
use agenthold_core::{AgentId, Config, MasterKey, Sandbox, Store, Vault};
use agenthold_egress::{Dangerous, EgressStack};
use base64::Engine as _;
use tokio_util::sync::CancellationToken;

use super::Runtime;
use super::context::SandboxContext;
use super::pool::Pool;
use super::records::{self, secret_id};
use crate::docker::DockerSandbox;
use crate::error::{Error, Result};
use crate::tunnel::{AgentMessages, TunnelLimits, TunnelServer};

/// Builds a sandbox runtime from the runtime's parts.
type SandboxFactory = Box<dyn FnOnce(&SandboxContext) -> Arc<dyn Sandbox> + Send>;

/// Where the runtime's sandboxes come from.
#[derive(Default)]
enum SandboxSource {
    /// Docker, on the given engine or the local one.
    #[default]
    Docker,
    /// A sandbox runtime made elsewhere.
    Given(Arc<dyn Sandbox>),
    /// A sandbox runtime made from the runtime's parts.
    Factory(SandboxFactory),
}

/// Builds a [`Runtime`]. Everything is optional: by default the configuration comes from the environment
/// (`AGENTHOLD_*`), storage is redb under the data directory, policies and secrets are the default tables,
/// and sandboxes are Docker containers on the local engine.
#[derive(Default)]
pub struct RuntimeBuilder {
    config: Option<Config>,
    data_dir: Option<PathBuf>,
    store_url: Option<String>,
    docker: Option<bollard::Docker>,
    sandbox: SandboxSource,
    policy: Option<Arc<dyn EgressPolicy>>,
    injector: Option<Arc<dyn SecretInjector>>,
    store: Option<Arc<dyn Store>>,
    dns_upstream: Option<SocketAddr>,
    dangerous: Dangerous,
    warm_pool: Option<usize>,
    tunnel_limits: Option<TunnelLimits>,
    agent_messages: Option<Arc<dyn AgentMessages>>,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("data_dir", &self.data_dir)
            .finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// Use this configuration instead of loading one from the environment.
    #[must_use]
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// The data directory (store, master key, CA).
    #[must_use]
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// Talk to this engine instead of the local default (Docker runtime only).
    #[must_use]
    pub fn docker(mut self, docker: bollard::Docker) -> Self {
        self.docker = Some(docker);
        self
    }

    /// Use a custom sandbox runtime made beforehand (it is then responsible for wiring its sandboxes to a
    /// gateway; to wire them to this runtime's, use [`RuntimeBuilder::sandbox_factory`]).
    #[must_use]
    pub fn sandbox(mut self, sandbox: Arc<dyn Sandbox>) -> Self {
        self.sandbox = SandboxSource::Given(sandbox);
        self
    }

    /// Use a custom sandbox runtime made from this runtime's parts: `factory` is called once, while the
    /// runtime is built, with its gateway, CA, store, tunnel server and shutdown token (see
    /// [`SandboxContext`]), before any sandbox is reconciled or created.
    #[must_use]
    pub fn sandbox_factory(
        mut self,
        factory: impl FnOnce(&SandboxContext) -> Arc<dyn Sandbox> + Send + 'static,
    ) -> Self {
        self.sandbox = SandboxSource::Factory(Box::new(factory));
        self
    }

    /// Use a custom policy. Unless it reports a per-agent table ([`EgressPolicy::table`]), specs' policies
    /// are not applied, [`Runtime::set_policy`] is unavailable and there is no warm pool: the policy is
    /// yours.
    #[must_use]
    pub fn policy(mut self, policy: Arc<dyn EgressPolicy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Use a custom secret injector. Unless it reports a per-agent table ([`SecretInjector::table`]),
    /// secrets in specs are kept sealed in the runtime's records but not injected: the injector is yours.
    #[must_use]
    pub fn injector(mut self, injector: Arc<dyn SecretInjector>) -> Self {
        self.injector = Some(injector);
        self
    }

    /// Use a custom store.
    #[must_use]
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Keep the state in the store this URL names instead of the configured one (the configuration's
    /// `store` key): `postgres://user@host[:port]/database`, with the password from
    /// `AGENTHOLD_STORE_PASSWORD` or the configuration's `store_password_file` (needs the
    /// `postgres` cargo feature); `""` for the redb file in the data directory. Ignored when
    /// [`RuntimeBuilder::store`] gives a store.
    #[must_use]
    pub fn store_url(mut self, url: impl Into<String>) -> Self {
        self.store_url = Some(url.into());
        self
    }

    /// Forward DNS to this server instead of the configured one.
    #[must_use]
    pub fn dns_upstream(mut self, addr: SocketAddr) -> Self {
        self.dns_upstream = Some(addr);
        self
    }

    /// Keep this many plain sandboxes ready (default `sandbox.warm_pool`; see `docs/configuration.md`).
    /// Works with any sandbox runtime; needs a policy with a per-agent table (the default one).
    #[must_use]
    pub fn warm_pool(mut self, size: usize) -> Self {
        self.warm_pool = Some(size);
        self
    }

    /// What an agent's `agenthold-send` does (P3): the hook gets the sender (known by its tunnel), the
    /// target's name, the harness and the prompt, and returns the started run's id or a reason. Default:
    /// every message is refused ("agent messages are not enabled").
    #[must_use]
    pub fn agent_messages(mut self, hook: Arc<dyn AgentMessages>) -> Self {
        self.agent_messages = Some(hook);
        self
    }

    /// Budgets of the tunnel listeners (default [`TunnelLimits::default`]; see `docs/runtime.md`).
    #[must_use]
    pub fn tunnel_limits(mut self, limits: TunnelLimits) -> Self {
        self.tunnel_limits = Some(limits);
        self
    }

    /// Weaken the gateway for tests (see [`Dangerous`]).
    #[must_use]
    pub fn dangerous(mut self, dangerous: Dangerous) -> Self {
        self.dangerous = dangerous;
        self
    }

    /// Build the runtime and take over sandboxes a previous runtime on the same data directory left
    /// (reconcile). Must be called inside a tokio runtime. Nothing here needs privileges: the gateway binds
    /// nothing until a sandbox runtime attaches an agent, so a custom sandbox runtime runs as any user.
    ///
    /// # Errors
    /// Configuration, master key, CA, store or engine problems, each saying what to fix.
    pub async fn build(self) -> Result<Runtime> {
        let mut config = match self.config {
            Some(c) => c,
            None => Config::load(None)?,
        };
        if let Some(dir) = self.data_dir {
            config.data_dir = dir;
        }
        if let Some(url) = self.store_url {
            config.store = url;
        }
        let data_dir = config.data_dir()?;
        std::fs::create_dir_all(&data_dir)
            .map_err(|e| Error::io(format!("create {}", data_dir.display()), e))?;
        let store: Arc<dyn Store> = match self.store {
            Some(s) => s,
            None => agenthold_core::store::open_configured(&config).await?,
        };
        let vault = Arc::new(Vault::new(MasterKey::load_from_env_or_file(
            &config.master_key_file()?,
        )?));
        let record_lock = Arc::new(tokio::sync::Mutex::new(()));
        let refresh_listener = super::RefreshListener::default();
        let mut egress = EgressStack::builder(&config.egress, &data_dir)
            .on_secret_update(persist_refreshed(&store, &vault, &record_lock, &refresh_listener))
            .dangerous(self.dangerous);
        if let Some(policy) = self.policy {
            egress = egress.policy(policy);
        }
        if let Some(injector) = self.injector {
            egress = egress.injector(injector);
        }
        if let Some(addr) = self.dns_upstream {
            egress = egress.dns_upstream(addr);
        }
        let EgressStack {
            gateway,
            ca,
            policy,
            injector,
            ..
        } = egress.build()?;
        let tunnel = match self.agent_messages {
            Some(hook) => TunnelServer::with_messages(self.tunnel_limits.unwrap_or_default(), hook),
            None => TunnelServer::with_limits(self.tunnel_limits.unwrap_or_default()),
        };
        let cancel = CancellationToken::new();
        let context = SandboxContext {
            config: config.clone(),
            data_dir,
            store: Arc::clone(&store),
            gateway: Arc::clone(&gateway),
            ca: Arc::clone(&ca),
            tunnel: Arc::clone(&tunnel),
            shutdown: cancel.clone(),
        };
        let sandbox: Arc<dyn Sandbox> = match self.sandbox {
            SandboxSource::Docker => DockerSandbox::from_context(&context, self.docker).await?,
            SandboxSource::Given(s) => s,
            SandboxSource::Factory(make) => make(&context),
        };
        let pool = Pool::new(
            self.warm_pool.unwrap_or(config.sandbox.warm_pool),
            config.sandbox.image.clone(),
            Arc::clone(&sandbox),
            Arc::clone(&policy),
            Arc::clone(&store),
            cancel.child_token(),
        );
        let runtime = Runtime {
            config,
            store,
            vault,
            policy,
            injector,
            gateway,
            ca,
            sandbox,
            tunnel,
            pool,
            record_lock,
            refresh_listener,
            cancel,
        };
        runtime.restore().await?;
        runtime.pool.refill();
        Ok(runtime)
    }
}

/// Persist a token refresh's new values in the vault-sealed records (E15), sealed with the rules of the
/// stored secret, and only after the stored value was seen to open under those rules: a record whose rules
/// were changed outside agenthold is never re-sealed (which would bind the new value to those rules, S15).
fn persist_refreshed(
    store: &Arc<dyn Store>,
    vault: &Arc<Vault>,
    record_lock: &Arc<tokio::sync::Mutex<()>>,
    listener: &super::RefreshListener,
) -> agenthold_core::secret::OnUpdate {
    let (store, vault, record_lock) = (Arc::clone(store), Arc::clone(vault), Arc::clone(record_lock));
    let listener = Arc::clone(listener);
    let handle = tokio::runtime::Handle::try_current().ok();
    Box::new(move |agent: &AgentId, name: &str, value: &SecretValue| {
        let listening = listener
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(listening) = listening {
            listening(agent, name, value);
        }
        let Some(handle) = &handle else { return };
        let (store, vault, record_lock, agent, name) = (
            Arc::clone(&store),
            Arc::clone(&vault),
            Arc::clone(&record_lock),
            agent.clone(),
            name.to_owned(),
        );
        let value = value.clone();
        handle.spawn(async move {
            let _records = record_lock.lock().await;
            let Ok(Some(mut record)) = records::RECORDS.load(store.as_ref(), &agent).await else {
                return;
            };
            let Some(s) = record.secrets.iter_mut().find(|s| s.name == name) else {
                return;
            };
            let id = match secret_id(&agent, &name) {
                Ok(id) => id,
                Err(e) => {
                    tracing::error!(agent = %agent, secret = %name, error = %e, "cannot persist a refreshed token");
                    return;
                }
            };
            let current = base64::engine::general_purpose::STANDARD.decode(&s.sealed);
            if let Err(e) = current
                .map_err(|e| e.to_string())
                .and_then(|sealed| vault.open(&id, &s.rules, &sealed).map(drop).map_err(|e| e.to_string()))
            {
                tracing::error!(
                    agent = %agent, secret = %name, error = %e,
                    "the stored secret does not open under its stored rules; the refreshed token is kept in \
                     memory only"
                );
                return;
            }
            s.sealed = base64::engine::general_purpose::STANDARD.encode(vault.seal(&id, &s.rules, &value));
            if let Err(e) = records::RECORDS.save(store.as_ref(), &agent, &record).await {
                tracing::error!(agent = %agent, error = %e, "could not persist a refreshed token");
            }
        });
    })
}

impl Runtime {
    /// Rebuild policies and secrets from the store, then let the sandbox runtime take over what a previous
    /// runtime left (S12) and remove the warm-pool sandboxes it never handed out.
    ///
    /// On a store that was never migrated, secrets sealed before rules were bound are sealed again with
    /// their rules first, each record stored again, and the store marked migrated once every record was
    /// (a start interrupted halfway migrates the rest next time); on a migrated store an old-format secret
    /// fails to open (S15). A secret that does not open fails the start, naming it.
    async fn restore(&self) -> Result<()> {
        let migrating = !agenthold_core::vault::legacy_migrated(self.store.as_ref()).await?;
        let mut known = Vec::new();
        let mut leftover_pool = Vec::new();
        for (agent, mut record) in records::RECORDS.list(self.store.as_ref()).await? {
            known.push(agent.clone());
            if record.pooled {
                leftover_pool.push(agent);
                continue;
            }
            if migrating && record.migrate_legacy(&self.vault, &agent)? {
                records::RECORDS
                    .save(self.store.as_ref(), &agent, &record)
                    .await?;
                tracing::info!(agent = %agent, "secrets sealed again with their rules bound (one-way vault migration)");
            }
            if let Some(table) = self.policy.table() {
                table.set(agent.clone(), record.spec.policy.clone());
            }
            if let Some(table) = self.injector.table() {
                table.set_with_placeholders(&agent, record.open_secrets(&self.vault, &agent)?);
            }
        }
        if migrating {
            agenthold_core::vault::mark_legacy_migrated(self.store.as_ref()).await?;
        }
        let report = self.sandbox.reconcile(&known).await?;
        if !report.restored.is_empty() {
            tracing::info!(agents = report.restored.len(), "reconciled sandboxes");
        }
        if !report.missing.is_empty() {
            tracing::warn!(
                agents = ?report.missing,
                "sandboxes with a record but none in the sandbox runtime; remove them to forget them"
            );
        }
        // Pooled sandboxes of a previous run were never handed out: remove them (the pool refills).
        for agent in leftover_pool {
            self.pool.remove_leftover(&agent).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use agenthold_core::sandbox::SandboxSpec;
    use agenthold_core::secret::{SecretRule, SecretSpec};
    use agenthold_core::store::RedbStore;
    use agenthold_core::vault::MasterKey;

    use super::*;

    async fn sealed_of(store: &Arc<dyn Store>, agent: &AgentId) -> String {
        records::RECORDS
            .load(store.as_ref(), agent)
            .await
            .unwrap()
            .unwrap()
            .secrets[0]
            .sealed
            .clone()
    }

    /// A refreshed token is sealed with the stored rules only when the stored value opens under them: a
    /// record whose rules were redirected in the store is not re-sealed (that would bind the new value to
    /// the redirected rules).
    // covers: S15, E15
    #[tokio::test]
    async fn a_refresh_never_reseals_under_rules_changed_in_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(RedbStore::open_in_data_dir(dir.path()).unwrap());
        let vault = Arc::new(Vault::new(MasterKey::from_bytes([1; 32])));
        let agent = AgentId::new("a").unwrap();
        let rule = |host: &str| SecretRule::header(&[host], "authorization", "Bearer {{.Value}}").unwrap();
        let secret = SecretSpec::new("tok", "old".into(), None, vec![rule("api.example.test")]).unwrap();
        let record =
            records::AgentRecord::new(&SandboxSpec::default(), &[secret], &[], &vault, &agent).unwrap();
        records::RECORDS
            .save(store.as_ref(), &agent, &record)
            .await
            .unwrap();
        let on_update = persist_refreshed(
            &store,
            &vault,
            &Arc::default(),
            &crate::runtime::RefreshListener::default(),
        );
        let settle = || tokio::time::sleep(std::time::Duration::from_millis(200));

        // Untouched: the new value replaces the old one, bound to the same rules.
        on_update(&agent, "tok", &SecretValue::from("new"));
        settle().await;
        let record = records::RECORDS
            .load(store.as_ref(), &agent)
            .await
            .unwrap()
            .unwrap();
        let opened = record.open_secrets(&vault, &agent).unwrap();
        assert_eq!(opened[0].0.value.expose(), b"new");

        // Redirected: nothing is written.
        let mut tampered = record;
        tampered.secrets[0].rules = vec![rule("evil.test")];
        records::RECORDS
            .save(store.as_ref(), &agent, &tampered)
            .await
            .unwrap();
        let before = sealed_of(&store, &agent).await;
        on_update(&agent, "tok", &SecretValue::from("newer"));
        settle().await;
        assert_eq!(
            sealed_of(&store, &agent).await,
            before,
            "re-sealed under redirected rules"
        );
        let err = records::RECORDS
            .load(store.as_ref(), &agent)
            .await
            .unwrap()
            .unwrap()
            .open_secrets(&vault, &agent)
            .unwrap_err();
        assert!(err.to_string().contains("\"tok\" of agent a"), "{err}");
    }
}
