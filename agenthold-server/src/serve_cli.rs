//! `agenthold serve [--config FILE]`: load the configuration (no port is bound before it is valid), build
//! the [`Server`], bind `server.listen`, print the one-time local admin link when there are no users, and
//! serve until SIGTERM or SIGINT.

use std::path::PathBuf;

use agenthold_core::Config;
use agenthold_egress::gateway::Dangerous;
use agenthold_server::Server;
use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};

/// Where the configuration comes from (`serve` and `admin` take the same flags).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ConfigArgs {
    /// The YAML configuration file (see docs/configuration.md).
    #[arg(long, value_name = "FILE", global = true)]
    pub(crate) config: Option<PathBuf>,
    /// The data directory (overrides `data_dir` of the file).
    #[arg(long, value_name = "DIR", global = true)]
    pub(crate) data_dir: Option<PathBuf>,
}

/// `agenthold serve`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// TESTS ONLY: dial IP:PORT for NAME:PORT, even though the address guard would refuse it.
    #[arg(long = "dangerous-connect-to", value_name = "NAME:PORT=IP:PORT")]
    dangerous_connect_to: Vec<String>,
    /// TESTS ONLY: trust this PEM certificate for upstream TLS, in addition to the system's roots.
    #[arg(long, value_name = "PEM")]
    dangerous_upstream_ca: Option<PathBuf>,
}

impl ConfigArgs {
    /// The configuration: the file, then `AGENTHOLD_*`, then `--data-dir`.
    pub(crate) fn load(&self) -> Result<Config> {
        let mut config = Config::load(self.config.as_deref())?;
        if let Some(dir) = &self.data_dir {
            config.data_dir =
                std::path::absolute(dir).with_context(|| format!("--data-dir {}", dir.display()))?;
        }
        Ok(config)
    }
}

/// `agenthold serve`; the exit code.
pub(crate) fn run(args: &ServeArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agenthold serve: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("agenthold serve: {e:#}");
            1
        }
    }
}

async fn serve(args: &ServeArgs) -> Result<()> {
    let config = args.config.load()?;
    let dangerous = Dangerous {
        connect_to: args
            .dangerous_connect_to
            .iter()
            .map(|s| crate::run::parse_connect_to(s))
            .collect::<Result<_>>()?,
        upstream_ca_pem: match &args.dangerous_upstream_ca {
            Some(p) => {
                Some(std::fs::read(p).with_context(|| format!("--dangerous-upstream-ca {}", p.display()))?)
            }
            None => None,
        },
    };
    let listen = config.server.listen;
    let link_minutes = config.auth.login_link_secs.div_ceil(60);
    let data_dir = config.data_dir()?;
    let server = Server::start_with(config, dangerous).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen} (server.listen)"))?;
    let local = listener.local_addr()?;
    eprintln!(
        "agenthold serve: listening on http://{local} (data in {})",
        data_dir.display()
    );
    if server.has_no_users().await? {
        announce_link(&server.login_link().await?, link_minutes);
    }
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!("agenthold serve: stopping");
    };
    server.serve(listener, stop).await
}

/// Print the first-run link where the person who started the server sees it.
#[allow(
    clippy::print_stdout,
    reason = "the link is the command's output, for the person who started it"
)]
fn announce_link(link: &str, minutes: u64) {
    println!(
        "No users yet. Sign in as the local admin within {minutes} minutes (the link works once):\n  {link}"
    );
}
