//! `agenthold image …`: local images, built without a registry ([`agenthold_sandbox::docker::image`]).
//!
//! - `agenthold image build-dev [--data-dir DIR] [--mirror URL] [--force]` builds `agenthold/dev:latest`
//!   from Debian packages unless the existing one was built from the same inputs, and prints its id and
//!   whether it was built or reused. The sandboxd image needs no command: the runtime builds it.
//! - `agenthold image build-harness [--data-dir DIR] [--registry URL] [--force]` builds
//!   `agenthold/harness:latest` on the dev image (built first when missing) with the pinned `claude` and
//!   `codex` binaries from npm ([`agenthold_sandbox::docker::harness_image`], tarballs fetched by
//!   [`crate::image_fetch`]), printed the same way.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use agenthold_core::Config;
use agenthold_sandbox::docker::harness_image::{
    DEFAULT_REGISTRY, HARNESS_IMAGE, HARNESS_PACKAGES, build_harness_image, current_harness_image,
    extract_binary,
};
use agenthold_sandbox::docker::image::{
    DEV_IMAGE, DevImageOptions, ImageRef, current_dev_image, ensure_dev_image,
};
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
    /// Build agenthold/harness:latest (the dev image plus the real `claude` and `codex` binaries), unless
    /// it is current.
    ///
    /// The npm tarballs of the pinned versions are fetched over HTTPS from the registry, checked against
    /// the pinned sha512 integrity, cached in DIR/images/harness-cache; only the binaries go into the image,
    /// with a user `agent` (uid 1000) whose home is /workspace. Builds the dev image first when missing.
    BuildHarness(BuildHarnessArgs),
}

/// Flags of `agenthold image build-harness`.
#[derive(Debug, clap::Args)]
struct BuildHarnessArgs {
    /// Data directory; tarballs are cached and the context assembled in DIR/images. Default from the
    /// configuration.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// npm registry to fetch the tarballs from (the pinned integrity is checked whatever it is).
    #[arg(long, value_name = "URL", default_value = DEFAULT_REGISTRY)]
    registry: String,
    /// Rebuild even when the existing image is current (the dev image is reused when current).
    #[arg(long)]
    force: bool,
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
            ImageCommand::BuildHarness(a) => runtime.block_on(build_harness(a)),
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

fn data_dir(given: Option<&PathBuf>) -> Result<PathBuf, Failure> {
    match given {
        Some(d) => Ok(d.clone()),
        None => Config::load(None)
            .and_then(|c| c.data_dir())
            .context("find the data directory (or pass --data-dir)")
            .map_err(Failure::BadInput),
    }
}

async fn engine() -> Result<bollard::Docker, Failure> {
    bollard::Docker::connect_with_local_defaults()
        .context("connect to the Docker engine")
        .map_err(Failure::Engine)?
        .negotiate_version()
        .await
        .context("reach the Docker engine (is dockerd running?)")
        .map_err(Failure::Engine)
}

fn print_outcome(outcome: &str, image: &ImageRef, started: Instant) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{outcome} {} {} in {:.1} s",
        image.name,
        image.id,
        started.elapsed().as_secs_f64()
    )
    .context("write to standard output")
    .map_err(Failure::Engine)
}

async fn build_harness(args: &BuildHarnessArgs) -> Result<(), Failure> {
    let images = data_dir(args.data_dir.as_ref())?.join("images");
    if !args.registry.starts_with("https://") && !args.registry.starts_with("http://") {
        return Err(Failure::BadInput(anyhow::anyhow!(
            "--registry {:?}: expected an http:// or https:// URL",
            args.registry
        )));
    }
    let docker = engine().await?;
    let started = Instant::now();
    let dev_opts = DevImageOptions::default();
    if current_dev_image(&docker, &dev_opts).await?.is_none() {
        eprintln!("agenthold image: building {DEV_IMAGE} first, with debootstrap (about a minute)…");
    }
    ensure_dev_image(&docker, &images, &dev_opts).await?;
    let before = current_harness_image(&docker).await?;
    if let Some(image) = before.as_ref().filter(|_| !args.force) {
        return print_outcome("reused", image, started);
    }
    let context = images.join("harness-context");
    tokio::fs::create_dir_all(&context)
        .await
        .with_context(|| format!("create {}", context.display()))
        .map_err(Failure::Engine)?;
    for pkg in &HARNESS_PACKAGES {
        let (tgz, fetched) =
            crate::image_fetch::cached_tarball(&args.registry, pkg, &images.join("harness-cache"))
                .await
                .map_err(Failure::Engine)?;
        eprintln!(
            "agenthold image: {}@{} {} ({})",
            pkg.package,
            pkg.version,
            if fetched {
                "fetched and verified"
            } else {
                "cached, verified"
            },
            pkg.integrity
        );
        for (member, binary) in pkg.binaries {
            extract_binary(&tgz, member, &context.join(binary)).await?;
        }
    }
    eprintln!("agenthold image: building {HARNESS_IMAGE}…");
    let built = build_harness_image(&docker, &context).await;
    // The context holds ~700 MB of binaries that the cached tarballs can reproduce.
    let _ = tokio::fs::remove_dir_all(&context).await;
    let image = built?;
    print_outcome("built", &image, started)
}

async fn build_dev(args: &BuildDevArgs) -> Result<(), Failure> {
    let data_dir = data_dir(args.data_dir.as_ref())?;
    let mut opts = DevImageOptions::default().with_force(args.force);
    opts.mirror.clone_from(&args.mirror);
    let docker = engine().await?;
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
    print_outcome(outcome, &image, started)
}
