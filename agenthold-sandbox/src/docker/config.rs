//! [`DockerConfig`]: how the Docker runtime makes sandboxes, derived from agenthold's [`Config`]; and the
//! static sandboxd this crate embeds, written to the data directory for sandboxes to mount.

use std::path::PathBuf;

use agenthold_core::Config;
use agenthold_egress::nft::Ports;
use ipnet::Ipv4Net;
use sha2::{Digest, Sha256};

use super::engine::Engine;
use super::image;
use crate::error::{Error, Result};

/// The static sandboxd this crate was built with (see `build.rs`).
const SANDBOXD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sandboxd"));

/// How sandboxes are made.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The gateway's ports inside its namespace.
    pub ports: Ports,
    /// Each new agent network takes one `/subnet_prefix` from here.
    pub subnet_pool: Ipv4Net,
    /// Prefix length of a new agent network (`sandbox.subnet_prefix`).
    pub subnet_prefix: u8,
    /// OCI runtime when a spec names none.
    pub default_runtime: String,
    /// CPU limit when a spec gives none.
    pub cpus: f64,
    /// Memory limit when a spec gives none.
    pub memory_bytes: u64,
    /// PID limit when a spec gives none.
    pub pids: u32,
    /// The static sandboxd on the host, bind-mounted read-only into every sandbox.
    pub sandboxd_path: PathBuf,
    /// Where per-agent files the runtime mounts into sandboxes live (`<data_dir>/run`).
    pub state_dir: PathBuf,
    /// The image of the gateway holder (scratch + sandboxd).
    pub sandboxd_image: String,
    /// The installation's CA, written into every sandbox at every start.
    pub ca_pem: String,
}

impl DockerConfig {
    /// Docker settings from agenthold's configuration, for a runtime on `data_dir` whose sandboxes trust
    /// `ca_pem`; writes the embedded sandboxd to the data directory and makes sure its image exists.
    ///
    /// # Errors
    /// When the data directory cannot be written or the engine cannot build the sandboxd image.
    pub async fn from_config(
        config: &Config,
        engine: &Engine,
        data_dir: &std::path::Path,
        ca_pem: &str,
    ) -> Result<Self> {
        let hash = hex::encode(Sha256::digest(SANDBOXD));
        let bin_dir = data_dir.join("bin");
        std::fs::create_dir_all(&bin_dir)
            .map_err(|e| Error::io(format!("create {}", bin_dir.display()), e))?;
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
        Ok(Self {
            ports: Ports::from_config(&config.egress),
            subnet_pool: config.sandbox.subnet_pool,
            subnet_prefix: config.sandbox.subnet_prefix,
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
}
