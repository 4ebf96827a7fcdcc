//! `agenthold image …`: local images, built without a registry ([`agenthold_sandbox::docker::image`]).
//!
//! - `agenthold image build-dev [--data-dir DIR] [--mirror URL] [--force]` builds `agenthold/dev:latest`
//!   from Debian packages unless the existing one was built from the same inputs, and prints its id and
//!   whether it was built or reused. The sandboxd image needs no command: the runtime builds it.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use agenthold_core::Config;
use agenthold_sandbox::docker::image::{DEV_IMAGE, DevImageOptions, current_dev_image, ensure_dev_image};
use anyhow::Context;

/// `agenthold image`: its subcommands.
#[derive(Debug, clap::Args)]
pub(crate) struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ImageCommand {
    /// Build agenthold/dev:latest from Debian packages, unless it is current (needs root; about a minute).
    ///
    /// Debian bookworm from debootstrap (curl, git, python3, node, the CA store), imported with `docker
    /// import`: no registry is involved. Reused while its inputs (package list, suite, mirror) are unchanged.
    BuildDev(BuildDevArgs),
}

/// Flags of `agenthold image build-dev`. Their names are a contract.
#[derive(Debug, clap::Args)]
struct BuildDevArgs {
    /// Data directory; the root filesystem is assembled in DIR/images. Default from the configuration.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Debian mirror for debootstrap; default: the host's apt sources, else `http://deb.debian.org/debian`.
    #[arg(long, value_name = "URL")]
    mirror: Option<String>,
    /// Rebuild even when the existing image is current.
    #[arg(long)]
    force: bool,
}

/// Why a command failed: decides the exit code.
enum Failure {
    /// The input is wrong (exit 2, like a usage error).
    BadInput(anyhow::Error),
    /// The engine, debootstrap or the file system failed (exit 125, like `docker run`).
    Engine(anyhow::Error),
}

impl From<agenthold_sandbox::Error> for Failure {
    fn from(e: agenthold_sandbox::Error) -> Self {
        if e.kind().is_bad_input() {
            Self::BadInput(e.into())
        } else {
            Self::Engine(e.into())
        }
    }
}

/// Run `agenthold image …`; returns the exit code (0, 2 for bad input, 125 when building failed).
pub(crate) fn run(args: &ImageArgs) -> i32 {
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")
        .map_err(Failure::Engine)
        .and_then(|runtime| match &args.command {
            ImageCommand::BuildDev(a) => runtime.block_on(build_dev(a)),
        });
    match result {
        Ok(()) => 0,
        Err(Failure::BadInput(e)) => {
            eprintln!("agenthold image: {e:#}");
            2
        }
        Err(Failure::Engine(e)) => {
            eprintln!("agenthold image: {e:#}");
            125
        }
    }
}

async fn build_dev(args: &BuildDevArgs) -> Result<(), Failure> {
    let data_dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => Config::load(None)
            .and_then(|c| c.data_dir())
            .context("find the data directory (or pass --data-dir)")
            .map_err(Failure::BadInput)?,
    };
    let mut opts = DevImageOptions::default().with_force(args.force);
    opts.mirror.clone_from(&args.mirror);
    let docker = bollard::Docker::connect_with_local_defaults()
        .context("connect to the Docker engine")
        .map_err(Failure::Engine)?
        .negotiate_version()
        .await
        .context("reach the Docker engine (is dockerd running?)")
        .map_err(Failure::Engine)?;
    let before = current_dev_image(&docker, &opts).await?;
    if before.is_none() || args.force {
        eprintln!("agenthold image: building {DEV_IMAGE} with debootstrap (about a minute)…");
    }
    let started = Instant::now();
    let image = ensure_dev_image(&docker, &data_dir.join("images"), &opts).await?;
    let outcome = if before.as_ref().is_some_and(|b| b.id == image.id) {
        "reused"
    } else {
        "built"
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{outcome} {} {} in {:.1} s",
        image.name,
        image.id,
        started.elapsed().as_secs_f64()
    )
    .context("write to standard output")
    .map_err(Failure::Engine)?;
    Ok(())
}
