//! [`SandboxContext`]: the parts of a [`super::Runtime`] a sandbox runtime is built with, so that a custom
//! [`agenthold_core::Sandbox`] can wire its sandboxes to the same gateway as the default one does.

use std::path::PathBuf;
use std::sync::Arc;

use agenthold_core::{Config, Store};
use agenthold_egress::datapath::Datapath;
use agenthold_egress::netns::NetNs;
use agenthold_egress::nft::Ports;
use agenthold_egress::{CertificateAuthority, Gateway};
use tokio_util::sync::CancellationToken;

use crate::tunnel::TunnelServer;

/// What a sandbox runtime is built from (see [`super::RuntimeBuilder::sandbox_factory`]): the runtime's
/// configuration, store, gateway, CA and tunnel server. Non-exhaustive: more parts may be added.
#[derive(Clone)]
#[non_exhaustive]
pub struct SandboxContext {
    /// The runtime's configuration (its `data_dir` resolved into [`SandboxContext::data_dir`]).
    pub config: Config,
    /// The data directory (store, master key, CA); a sandbox runtime may keep its own files under it.
    pub data_dir: PathBuf,
    /// The store; a sandbox runtime may keep per-agent state in tables of its own.
    pub store: Arc<dyn Store>,
    /// The egress gateway. A sandbox's traffic must reach nothing but it. A runtime whose sandboxes sit in
    /// network namespaces serves them through [`SandboxContext::datapath`] (the same composition the
    /// Docker runtime uses: rules, listeners at the agent's `.2`, attachment, environment); one that
    /// serves agents on listeners of its own attaches them with [`Gateway::attach`] and gives its
    /// sandboxes [`agenthold_egress::datapath::sandbox_env_via`]. Policies and secrets are already the
    /// gateway's (the runtime sets them).
    pub gateway: Arc<Gateway>,
    /// The installation's CA: what a sandbox must trust for the hosts the gateway intercepts (E14).
    pub ca: Arc<CertificateAuthority>,
    /// The tunnel server `sandboxd` connects to (S2), for runtimes that run sandboxd in their sandboxes.
    pub tunnel: Arc<TunnelServer>,
    /// Cancelled when the runtime shuts down or is dropped: end background tasks (event watchers) with it.
    pub shutdown: CancellationToken,
}

impl std::fmt::Debug for SandboxContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxContext")
            .field("data_dir", &self.data_dir)
            .finish_non_exhaustive()
    }
}

impl SandboxContext {
    /// The datapath of a gateway namespace this runtime owns, on the configured ports (`egress.*_port`,
    /// the tunnel included): serve each agent with [`Datapath::attach`] or [`Datapath::attach_at`] and
    /// give its sandbox the [`agenthold_egress::datapath::Attachment::env`].
    ///
    /// # Errors
    /// As [`Datapath::new`]: invalid ports, or a namespace that cannot be hardened (needs root).
    pub async fn datapath(&self, ns: NetNs) -> agenthold_egress::Result<Datapath> {
        Datapath::new(
            ns,
            Ports::from_config(&self.config.egress),
            Arc::clone(&self.gateway),
        )
        .await
    }
}
