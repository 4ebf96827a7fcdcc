//! `agenthold serve`: the reference server (C3). It composes the defaults — the redb [`Store`] in the data
//! directory, the Docker [`Runtime`] with its egress gateway, the [`Directory`] of users and workspaces
//! and the role-based [`RoleAuthz`] — behind the HTTP API of [`api`], plus the operator's admin socket
//! ([`admin`]).
//!
//! Start: load the configuration (no port is bound before it is valid), open the store, build the runtime
//! (which reconciles: running sandboxes keep their egress and tunnel, S12), mark execs that a previous
//! server left running as `lost` (and the runs on them), bind the admin socket and the listener, and print the one-time local
//! admin link when there are no users yet. Stop (SIGTERM, SIGINT): streams end with their `end` event,
//! in-flight requests get 10 s, then the gateway stops. Sandboxes keep running; the next start takes them
//! over.
// enforces: C3, S12

pub(crate) mod admin;
mod api;
mod credentials;
mod execs;
mod harness_logins;
mod login;
mod messages;
mod providers;
mod records;
mod runs;
mod secrets;
mod state;
mod ui;
mod webhooks;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agenthold_auth::{Directory, RateLimits, RoleAuthz};
use agenthold_core::vault::MasterKey;
use agenthold_core::{Config, Store, Vault};
use agenthold_egress::gateway::Dangerous;
use agenthold_sandbox::Runtime;
use anyhow::{Context, Result};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use self::state::{AppState, Shared};

/// How long in-flight requests get after the stop signal.
const DRAIN: Duration = Duration::from_secs(10);

/// The reference server, built and ready to serve.
///
/// ```no_run
/// # async fn demo() -> anyhow::Result<()> {
/// let config = agenthold_core::Config::load(None)?;
/// let server = agenthold_server::Server::start(config).await?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// server.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
pub struct Server {
    state: AppState,
    data_dir: PathBuf,
}

impl Server {
    /// Build the defaults for `config`: the store it names (the redb file in the data directory by default,
    /// or a PostgreSQL database), the Docker runtime with its
    /// gateway (reconciling the sandboxes a previous server left), the directory and the role authz.
    ///
    /// # Errors
    /// Configuration, store, master key, CA or engine problems, each saying what to fix.
    pub async fn start(config: Config) -> Result<Self> {
        Self::start_with(config, Dangerous::default()).await
    }

    /// [`Server::start`] with the gateway's test-only switches (dial a loopback upstream for a name, trust
    /// an extra upstream CA): for tests that run a real server against local upstreams.
    ///
    /// # Errors
    /// As [`Server::start`].
    pub async fn start_with(config: Config, dangerous: Dangerous) -> Result<Self> {
        // A login provider whose client secret cannot be read fails the start before anything is built.
        providers::Providers::from_config(&config)?;
        let data_dir = config.data_dir()?;
        let store = agenthold_core::store::open_configured(&config)
            .await
            .context("open the store")?;
        let hook = Arc::new(messages::MessageHook::default());
        let runtime = Runtime::builder()
            .config(config.clone())
            .data_dir(&data_dir)
            .store(Arc::clone(&store))
            .dangerous(dangerous)
            .agent_messages(Arc::clone(&hook) as Arc<dyn agenthold_sandbox::tunnel::AgentMessages>)
            .build()
            .await
            .context("start the sandbox runtime")?;
        Self::build(config, runtime, store, Some(&hook)).await
    }

    /// Build the server around a runtime built elsewhere (a custom [`Sandbox`](agenthold_core::Sandbox),
    /// a test double) that uses `store`.
    ///
    /// # Errors
    /// When the store cannot be read.
    pub async fn with_runtime(config: Config, runtime: Runtime, store: Arc<dyn Store>) -> Result<Self> {
        Self::build(config, runtime, store, None).await
    }

    /// [`Server::with_runtime`]; agent messages (P3) are delivered when the runtime was built with `hook`.
    async fn build(
        config: Config,
        runtime: Runtime,
        store: Arc<dyn Store>,
        hook: Option<&messages::MessageHook>,
    ) -> Result<Self> {
        let data_dir = config.data_dir()?;
        let dir = Arc::new(Directory::new(Arc::clone(&store), config.auth.clone()));
        // The runtime's master key (the runtime created the key file if there was none).
        let vault = Arc::new(Vault::new(
            MasterKey::load_from_env_or_file(&config.master_key_file()?).context("load the master key")?,
        ));
        // The login providers' client secrets are read now: a missing file fails the start, naming the key.
        let providers = Arc::new(providers::Providers::from_config(&config)?);
        let runtime = Arc::new(runtime);
        let execs = execs::Execs::new(Arc::clone(&runtime), Arc::clone(&store));
        let lost = execs
            .reconcile()
            .await
            .map_err(|e| anyhow::anyhow!("reconcile the execs of the previous server: {e}"))?;
        if lost > 0 {
            tracing::info!(lost, "execs left running by the previous server are marked lost");
        }
        let runs = runs::Runs::new(Arc::clone(&execs), Arc::clone(&store));
        let lost = runs
            .reconcile()
            .await
            .map_err(|e| anyhow::anyhow!("reconcile the runs of the previous server: {e}"))?;
        if lost > 0 {
            tracing::info!(lost, "runs left running by the previous server are marked lost");
        }
        let state = AppState::new(Shared {
            runtime,
            authz: Arc::new(RoleAuthz::new(Arc::clone(&dir))),
            limits: Arc::new(RateLimits::new(&config.auth)),
            hook_limits: Arc::new(api::delivery_limits(&config)),
            dir,
            store,
            public_url: config.server.public_url(),
            metrics: metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .ok(),
            config,
            shutdown: CancellationToken::new(),
            vault,
            edits: tokio::sync::Mutex::new(()),
            agents_gone: state::AgentSignals::default(),
            execs,
            runs,
            providers,
            logins: Arc::new(harness_logins::Logins::new().context("the provider logins' HTTP client")?),
        });
        secrets::reconcile(&state).await;
        if let Some(hook) = hook {
            hook.bind(&state);
        }
        harness_logins::install(&state, state.shutdown.clone()).await;
        Ok(Self { state, data_dir })
    }

    /// The HTTP application (for serving it yourself, or calling it in-process).
    pub fn router(&self) -> axum::Router {
        api::app(self.state.clone(), login::routes().merge(providers::routes()))
    }

    /// The runtime the server drives (for embedding code and benchmarks that compare with it).
    #[must_use]
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.state.runtime
    }

    /// Whether no user exists yet (the first run).
    ///
    /// # Errors
    /// When the store cannot be read.
    pub async fn has_no_users(&self) -> Result<bool> {
        Ok(self.state.dir.user_count().await? == 0)
    }

    /// A new one-time local admin link.
    ///
    /// # Errors
    /// When the store cannot be written.
    pub async fn login_link(&self) -> Result<String> {
        admin::login_link(&self.state).await
    }

    /// The OpenAPI document of the API.
    #[must_use]
    pub fn openapi() -> utoipa::openapi::OpenApi {
        api::openapi()
    }

    /// Serve HTTP on `listener` and the admin socket in the data directory until `stop` completes; then
    /// streams end, in-flight requests get 10 s, and the gateway stops (sandboxes keep running).
    ///
    /// # Errors
    /// When the admin socket cannot be bound or the HTTP server fails.
    pub async fn serve(
        self,
        listener: TcpListener,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let shutdown = self.state.shutdown.clone();
        let admin_listener = admin::bind(&self.data_dir).await?;
        let admin_task = tokio::spawn(admin::serve(admin_listener, self.state.clone(), shutdown.clone()));
        tokio::spawn(purge_expired(self.state.clone(), shutdown.clone()));
        tokio::spawn(credentials::watch(self.state.clone()));
        let app = self.router();
        let closing = shutdown.clone();
        let server = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async move { closing.cancelled().await });
        let mut server = std::pin::pin!(server.into_future());
        let stopped = tokio::select! {
            r = &mut server => { r.context("the HTTP server failed")?; false }
            () = stop => true,
        };
        shutdown.cancel();
        if stopped && tokio::time::timeout(DRAIN, &mut server).await.is_err() {
            tracing::warn!("requests still open after {DRAIN:?}; closing them");
        }
        let _ = admin_task.await;
        let _ = std::fs::remove_file(self.data_dir.join(admin::SOCKET));
        self.state.runtime.shutdown().await;
        Ok(())
    }
}

/// Every 10 minutes until `shutdown`: delete expired sessions, login links and login attempts that nobody
/// presented again.
async fn purge_expired(state: AppState, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(600)) => {}
        }
        match state.dir.purge_expired().await {
            Ok(n) if n > 0 => tracing::debug!(records = n, "expired credentials purged"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not purge expired credentials"),
        }
    }
}
