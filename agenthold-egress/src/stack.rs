//! [`EgressStack`]: the gateway with its default parts, composed once for every host of the gateway (the
//! embeddable `Runtime` and `agenthold run`): the policy table, the secret table, the installation's CA
//! under the data directory, and the [`Gateway`] built from the `egress` configuration. A custom policy or
//! injector replaces the matching table.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agenthold_core::config::EgressConfig;
use agenthold_core::policy::{EgressPolicy, PolicyTable};
use agenthold_core::secret::{OnUpdate, SecretInjector, SecretTable};

use crate::Result;
use crate::ca::CertificateAuthority;
use crate::gateway::{Dangerous, Gateway};

/// Where the installation's CA lives under a data directory.
pub const CA_DIR: &str = "egress";

/// The gateway and the parts it was built from.
#[non_exhaustive]
pub struct EgressStack {
    /// The gateway.
    pub gateway: Arc<Gateway>,
    /// The installation's CA (signs intercepted hosts' certificates; sandboxes trust it).
    pub ca: Arc<CertificateAuthority>,
    /// The policy the gateway decides with: the default [`PolicyTable`] unless a custom one was given
    /// (`policy.table()` answers whether there is a per-agent table to set policies in).
    pub policy: Arc<dyn EgressPolicy>,
    /// The injector the gateway injects with: the default [`SecretTable`] unless a custom one was given
    /// (`injector.table()` answers whether there is a per-agent table to set secrets in).
    pub injector: Arc<dyn SecretInjector>,
}

impl std::fmt::Debug for EgressStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressStack")
            .field("gateway", &self.gateway)
            .field("ca", &self.ca)
            .field("default_policy_table", &self.policy.table().is_some())
            .field("default_secret_table", &self.injector.table().is_some())
            .finish()
    }
}

impl EgressStack {
    /// Start composing for the `egress` configuration, with the CA under `data_dir` (`DATA_DIR/egress`).
    #[must_use]
    pub fn builder(egress: &EgressConfig, data_dir: &Path) -> EgressStackBuilder {
        EgressStackBuilder {
            egress: egress.clone(),
            ca_dir: data_dir.join(CA_DIR),
            policy: None,
            injector: None,
            on_secret_update: None,
            dns_upstream: None,
            dangerous: Dangerous::default(),
        }
    }
}

/// Builds an [`EgressStack`].
pub struct EgressStackBuilder {
    egress: EgressConfig,
    ca_dir: PathBuf,
    policy: Option<Arc<dyn EgressPolicy>>,
    injector: Option<Arc<dyn SecretInjector>>,
    on_secret_update: Option<OnUpdate>,
    dns_upstream: Option<SocketAddr>,
    dangerous: Dangerous,
}

impl std::fmt::Debug for EgressStackBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressStackBuilder")
            .field("ca_dir", &self.ca_dir)
            .field("dns_upstream", &self.dns_upstream)
            .field("dangerous", &self.dangerous)
            .finish_non_exhaustive()
    }
}

impl EgressStackBuilder {
    /// Decide with `policy` instead of a [`PolicyTable`].
    #[must_use]
    pub fn policy(mut self, policy: Arc<dyn EgressPolicy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Inject with `injector` instead of a [`SecretTable`].
    #[must_use]
    pub fn injector(mut self, injector: Arc<dyn SecretInjector>) -> Self {
        self.injector = Some(injector);
        self
    }

    /// Called by the default secret table when a token refresh changes a value (to persist it).
    #[must_use]
    pub fn on_secret_update(mut self, on_update: OnUpdate) -> Self {
        self.on_secret_update = Some(on_update);
        self
    }

    /// Forward DNS to `addr` instead of the configured upstream.
    #[must_use]
    pub fn dns_upstream(mut self, addr: SocketAddr) -> Self {
        self.dns_upstream = Some(addr);
        self
    }

    /// Weaken the gateway for tests (see [`Dangerous`]).
    #[must_use]
    pub fn dangerous(mut self, dangerous: Dangerous) -> Self {
        self.dangerous = dangerous;
        self
    }

    /// Load (or create) the CA and build the gateway. Must be called inside a tokio runtime (see
    /// [`crate::GatewayBuilder::build`]).
    ///
    /// # Errors
    /// When the CA cannot be loaded or created, or the gateway cannot be built from the configuration.
    pub fn build(self) -> Result<EgressStack> {
        let ca = Arc::new(CertificateAuthority::load_or_create(&self.ca_dir)?);
        let policy: Arc<dyn EgressPolicy> = match self.policy {
            Some(p) => p,
            None => Arc::new(PolicyTable::new()),
        };
        let injector: Arc<dyn SecretInjector> = match self.injector {
            Some(i) => i,
            None => {
                let table = SecretTable::new(self.egress.leak_guard);
                Arc::new(match self.on_secret_update {
                    Some(on_update) => table.with_on_update(on_update),
                    None => table,
                })
            }
        };
        let mut gateway = Gateway::builder();
        // Before `config`, which would otherwise look the upstream up in the configuration.
        if let Some(addr) = self.dns_upstream {
            gateway = gateway.dns_upstream(addr);
        }
        let gateway = gateway
            .config(&self.egress)?
            .policy(Arc::clone(&policy))
            .injector(Arc::clone(&injector))
            .certificate_authority(Arc::clone(&ca))
            .dangerous(self.dangerous)
            .build()?;
        Ok(EgressStack {
            gateway: Arc::new(gateway),
            ca,
            policy,
            injector,
        })
    }
}
