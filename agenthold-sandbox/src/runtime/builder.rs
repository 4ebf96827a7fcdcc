//! [`RuntimeBuilder`]: every part of a [`Runtime`] has a default and can be swapped (C2).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use agenthold_core::policy::EgressPolicy;
use agenthold_core::secret::{SecretInjector, SecretValue};
use agenthold_core::store::RedbStore;
use agenthold_core::{AgentId, Config, MasterKey, Sandbox, Store, Vault};
use agenthold_egress::nft::Ports;
use agenthold_egress::{Dangerous, EgressStack};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::Runtime;
use super::records::{self, secret_id};
use crate::docker::{DockerConfig, DockerSandbox};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::image;
use crate::tunnel::{TunnelLimits, TunnelServer};

/// The static sandboxd this crate was built with (see `build.rs`).
const SANDBOXD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sandboxd"));

/// Builds a [`Runtime`]. Everything is optional: by default the configuration comes from the environment
/// (`AGENTHOLD_*`), storage is redb under the data directory, policies and secrets are the default tables,
/// and sandboxes are Docker containers on the local engine.
#[derive(Default)]
pub struct RuntimeBuilder {
    config: Option<Config>,
    data_dir: Option<PathBuf>,
    docker: Option<bollard::Docker>,
    sandbox: Option<Arc<dyn Sandbox>>,
    policy: Option<Arc<dyn EgressPolicy>>,
    injector: Option<Arc<dyn SecretInjector>>,
    store: Option<Arc<dyn Store>>,
    dns_upstream: Option<SocketAddr>,
    dangerous: Dangerous,
    warm_pool: Option<usize>,
    tunnel_limits: Option<TunnelLimits>,
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

    /// Talk to this engine instead of the local default.
    #[must_use]
    pub fn docker(mut self, docker: bollard::Docker) -> Self {
        self.docker = Some(docker);
        self
    }

    /// Use a custom sandbox runtime (it is then responsible for wiring its sandboxes to the gateway).
    #[must_use]
    pub fn sandbox(mut self, sandbox: Arc<dyn Sandbox>) -> Self {
        self.sandbox = Some(sandbox);
        self
    }

    /// Use a custom policy ([`Runtime::set_policy`] is then unavailable: the policy is yours).
    #[must_use]
    pub fn policy(mut self, policy: Arc<dyn EgressPolicy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Use a custom secret injector (secrets in specs are then ignored: the injector is yours).
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

    /// Forward DNS to this server instead of the configured one.
    #[must_use]
    pub fn dns_upstream(mut self, addr: SocketAddr) -> Self {
        self.dns_upstream = Some(addr);
        self
    }

    /// Keep this many plain sandboxes ready (default `sandbox.warm_pool`; see `docs/configuration.md`).
    #[must_use]
    pub fn warm_pool(mut self, size: usize) -> Self {
        self.warm_pool = Some(size);
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
    /// running (reconcile). Must be called inside a tokio runtime.
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
        let data_dir = config.data_dir()?;
        std::fs::create_dir_all(&data_dir)
            .map_err(|e| Error::io(format!("create {}", data_dir.display()), e))?;
        let store: Arc<dyn Store> = match self.store {
            Some(s) => s,
            None => Arc::new(RedbStore::open_in_data_dir(&data_dir)?),
        };
        let vault = Arc::new(Vault::new(MasterKey::load_from_env_or_file(
            &config.master_key_file()?,
        )?));
        let mut egress = EgressStack::builder(&config.egress, &data_dir)
            .on_secret_update(persist_refreshed(&store, &vault))
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
            policies,
            secrets,
            ..
        } = egress.build()?;
        let tunnel = TunnelServer::with_limits(self.tunnel_limits.unwrap_or_default());
        let (sandbox, docker): (Arc<dyn Sandbox>, Option<Arc<DockerSandbox>>) = match self.sandbox {
            Some(s) => (s, None),
            None => {
                let instance = crate::engine::instance_label(&data_dir);
                let engine = match self.docker {
                    Some(d) => Engine::from_docker(d, &instance).await?,
                    None => Engine::connect(&instance).await?,
                };
                let docker_config = docker_config(&config, &engine, &data_dir, ca.cert_pem()).await?;
                let docker = Arc::new(DockerSandbox::new(
                    engine,
                    Arc::clone(&gateway),
                    Arc::clone(&tunnel),
                    Arc::clone(&store),
                    docker_config,
                ));
                (Arc::clone(&docker) as Arc<dyn Sandbox>, Some(docker))
            }
        };
        let cancel = CancellationToken::new();
        let warm = self.warm_pool.unwrap_or(config.sandbox.warm_pool);
        // The pool needs the default policies (its sandboxes refuse everything until handed out) and the
        // Docker runtime (its agents are plain Docker sandboxes).
        let pool = match (&policies, &docker) {
            (Some(p), Some(_)) if warm > 0 => Some(super::pool::Pool::new(
                warm,
                config.sandbox.image.clone(),
                Arc::clone(&sandbox),
                Arc::clone(p),
                Arc::clone(&store),
                cancel.child_token(),
            )),
            _ => None,
        };
        let runtime = Runtime {
            config,
            store,
            vault,
            policies,
            secrets,
            gateway,
            ca,
            sandbox,
            docker,
            tunnel,
            pool,
            cancel,
        };
        runtime.restore().await?;
        if let Some(pool) = &runtime.pool {
            pool.refill();
        }
        Ok(runtime)
    }
}

/// Docker settings from the configuration; writes the embedded sandboxd to the data directory and makes
/// sure its image exists.
async fn docker_config(
    config: &Config,
    engine: &Engine,
    data_dir: &std::path::Path,
    ca_pem: &str,
) -> Result<DockerConfig> {
    let hash = hex::encode(Sha256::digest(SANDBOXD));
    let bin_dir = data_dir.join("bin");
    std::fs::create_dir_all(&bin_dir).map_err(|e| Error::io(format!("create {}", bin_dir.display()), e))?;
    let sandboxd_path = bin_dir.join(format!("sandboxd-{}", &hash[..12]));
    if std::fs::read(&sandboxd_path).map_or(true, |b| b != SANDBOXD) {
        use std::os::unix::fs::PermissionsExt;
        let tmp = sandboxd_path.with_extension("tmp");
        std::fs::write(&tmp, SANDBOXD).map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| Error::io(format!("chmod {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &sandboxd_path)
            .map_err(|e| Error::io(format!("rename {}", tmp.display()), e))?;
    }
    let image = image::ensure_sandboxd_image(&engine.docker, SANDBOXD).await?;
    Ok(DockerConfig {
        ports: Ports::from_config(&config.egress),
        subnet_pool: config.sandbox.subnet_pool,
        default_runtime: config.sandbox.runtime.as_str().to_owned(),
        cpus: config.sandbox.cpus,
        memory_bytes: config.sandbox.memory_bytes,
        pids: config.sandbox.pids,
        sandboxd_path,
        state_dir: data_dir.join("run"),
        sandboxd_image: image.name,
        ca_pem: ca_pem.to_owned(),
    })
}

/// Persist a token refresh's new values in the vault-sealed records (E15), sealed with the rules of the
/// stored secret, and only after the stored value was seen to open under those rules: a record whose rules
/// were changed outside agenthold is never re-sealed (which would bind the new value to those rules, S15).
fn persist_refreshed(store: &Arc<dyn Store>, vault: &Arc<Vault>) -> agenthold_core::secret::OnUpdate {
    let (store, vault) = (Arc::clone(store), Arc::clone(vault));
    let handle = tokio::runtime::Handle::try_current().ok();
    Box::new(move |agent: &AgentId, name: &str, value: &SecretValue| {
        let Some(handle) = &handle else { return };
        let (store, vault, agent, name) = (
            Arc::clone(&store),
            Arc::clone(&vault),
            agent.clone(),
            name.to_owned(),
        );
        let value = value.clone();
        handle.spawn(async move {
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
    /// Rebuild policies and secrets from the store, then restore the sandboxes' datapath (S12).
    ///
    /// On a store that was never migrated, secrets sealed before rules were bound are sealed again with
    /// their rules first, each record stored again, and the store marked migrated once every record was
    /// (a start interrupted halfway migrates the rest next time); on a migrated store an old-format secret
    /// fails to open (S15). A secret that does not open fails the start, naming it.
    async fn restore(&self) -> Result<()> {
        let migrating = !agenthold_core::vault::legacy_migrated(self.store.as_ref()).await?;
        let mut leftover_pool = Vec::new();
        for (agent, mut record) in records::RECORDS.list(self.store.as_ref()).await? {
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
            if let Some(p) = &self.policies {
                p.set(agent.clone(), record.spec.policy.clone());
            }
            if let Some(s) = &self.secrets {
                s.set_with_placeholders(&agent, record.open_secrets(&self.vault, &agent)?);
            }
        }
        if migrating {
            agenthold_core::vault::mark_legacy_migrated(self.store.as_ref()).await?;
        }
        if let Some(docker) = &self.docker {
            let report = docker.reconcile().await?;
            if !report.restored.is_empty() {
                tracing::info!(agents = report.restored.len(), "reconciled running sandboxes");
            }
            docker.watch(self.cancel.clone());
        }
        // Pooled sandboxes of a previous run were never handed out: remove them (the pool refills).
        for agent in leftover_pool {
            if let Some(p) = &self.policies {
                p.set(
                    agent.clone(),
                    agenthold_core::NetworkPolicy::allowlist(Vec::new()),
                );
                super::pool::remove_pooled(self.sandbox.as_ref(), p, self.store.as_ref(), &agent).await;
            } else if let Err(e) = self.sandbox.remove(&agent, false).await {
                tracing::warn!(agent = %agent, error = %e, "cannot remove a pooled sandbox of a previous run");
            }
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
        let on_update = persist_refreshed(&store, &vault);
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
