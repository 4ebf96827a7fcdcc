//! [`RuntimeBuilder`]: every part of a [`Runtime`] has a default and can be swapped (C2).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use agenthold_core::policy::{EgressPolicy, PolicyTable};
use agenthold_core::secret::{SecretInjector, SecretTable, SecretValue};
use agenthold_core::store::RedbStore;
use agenthold_core::{AgentId, Config, MasterKey, Sandbox, Store, Vault};
use agenthold_egress::nft::Ports;
use agenthold_egress::{CertificateAuthority, Dangerous, Gateway};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::Runtime;
use super::records::{self, secret_id};
use crate::docker::{DockerConfig, DockerSandbox};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::image;
use crate::tunnel::TunnelServer;

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
        let ca = Arc::new(CertificateAuthority::load_or_create(&data_dir.join("egress"))?);
        let policies = self.policy.is_none().then(|| Arc::new(PolicyTable::new()));
        let policy: Arc<dyn EgressPolicy> = match (&self.policy, &policies) {
            (Some(p), _) => Arc::clone(p),
            (None, Some(table)) => Arc::clone(table) as Arc<dyn EgressPolicy>,
            (None, None) => Arc::new(PolicyTable::new()),
        };
        let secrets = match self.injector {
            Some(_) => None,
            None => Some(Arc::new(
                SecretTable::new(config.egress.leak_guard).with_on_update(persist_refreshed(&store, &vault)),
            )),
        };
        let injector: Arc<dyn SecretInjector> = match (self.injector, &secrets) {
            (Some(i), _) => i,
            (None, Some(table)) => Arc::clone(table) as Arc<dyn SecretInjector>,
            (None, None) => Arc::new(SecretTable::default()),
        };
        let mut gateway = Gateway::builder()
            .config(&config.egress)?
            .policy(policy)
            .injector(injector)
            .certificate_authority(Arc::clone(&ca))
            .dangerous(self.dangerous);
        if let Some(addr) = self.dns_upstream {
            gateway = gateway.dns_upstream(addr);
        }
        let gateway = Arc::new(gateway.build()?);
        let tunnel = TunnelServer::new();
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
        ports: Ports {
            proxy: config.egress.proxy_port,
            explicit: config.egress.explicit_port,
            dns: config.egress.dns_port,
            tunnel: Some(config.egress.tunnel_port),
        },
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

/// Persist a token refresh's new values in the vault-sealed records (E15).
fn persist_refreshed(store: &Arc<dyn Store>, vault: &Arc<Vault>) -> agenthold_core::secret::OnUpdate {
    let (store, vault) = (Arc::clone(store), Arc::clone(vault));
    let handle = tokio::runtime::Handle::try_current().ok();
    Box::new(move |agent: &AgentId, name: &str, value: &SecretValue| {
        let Some(handle) = &handle else { return };
        let (store, agent, name) = (Arc::clone(&store), agent.clone(), name.to_owned());
        let sealed = secret_id(&agent, &name).map(|id| vault.seal(&id, value));
        handle.spawn(async move {
            let Ok(sealed) = sealed else { return };
            let Ok(Some(mut record)) = records::RECORDS.load(store.as_ref(), &agent).await else {
                return;
            };
            if let Some(s) = record.secrets.iter_mut().find(|s| s.name == name) {
                s.sealed = base64::engine::general_purpose::STANDARD.encode(sealed);
            }
            if let Err(e) = records::RECORDS.save(store.as_ref(), &agent, &record).await {
                tracing::error!(agent = %agent, error = %e, "could not persist a refreshed token");
            }
        });
    })
}

impl Runtime {
    /// Rebuild policies and secrets from the store, then restore the sandboxes' datapath (S12).
    async fn restore(&self) -> Result<()> {
        let mut leftover_pool = Vec::new();
        for (agent, record) in records::RECORDS.list(self.store.as_ref()).await? {
            if record.pooled {
                leftover_pool.push(agent);
                continue;
            }
            if let Some(p) = &self.policies {
                p.set(agent.clone(), record.spec.policy.clone());
            }
            if let Some(s) = &self.secrets {
                s.set_with_placeholders(&agent, record.open_secrets(&self.vault, &agent)?);
            }
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
