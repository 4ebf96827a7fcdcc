//! The container engine connection: bollard with API version negotiation, what the engine can do (isolated
//! gateway mode on Docker ≥ 28, which OCI runtimes it knows), and the labels agenthold puts on every object
//! it creates so that it can find them again (reconcile, cleanup) and never touches anything else.

use std::collections::HashMap;
use std::path::Path;

use agenthold_core::AgentId;
use bollard::Docker;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Label on every object agenthold creates.
pub const LABEL_MANAGED: &str = "agenthold.managed";
/// Label naming the installation (a hash of its data directory): two runtimes on one host keep apart.
pub const LABEL_INSTANCE: &str = "agenthold.instance";
/// Label naming the agent an object belongs to.
pub const LABEL_AGENT: &str = "agenthold.agent";
/// Label naming an object's role (`sandbox`, `gateway`, `network`, `volume`).
pub const LABEL_ROLE: &str = "agenthold.role";

/// The [`LABEL_INSTANCE`] value of a runtime on `data_dir`: the first 12 hex digits of the SHA-256 of its
/// path, so that a restart on the same directory finds its objects again and another directory never does.
#[must_use]
pub fn instance_label(data_dir: &Path) -> String {
    let mut hex = hex::encode(Sha256::digest(data_dir.display().to_string().as_bytes()));
    hex.truncate(12);
    hex
}

/// A connected, version-negotiated engine.
#[derive(Debug, Clone)]
pub struct Engine {
    /// The bollard client.
    pub docker: Docker,
    major: u32,
    runtimes: Vec<String>,
    instance: String,
}

impl Engine {
    /// Connect to the local engine (`DOCKER_HOST` or the default socket) and negotiate the API version.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no engine answers, with what to do about it.
    pub async fn connect(instance: &str) -> Result<Self> {
        let docker = Docker::connect_with_local_defaults().map_err(|e| Error::engine("connect", e))?;
        Self::from_docker(docker, instance).await
    }

    /// Use an existing bollard client (negotiating its version).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the engine does not answer.
    pub async fn from_docker(docker: Docker, instance: &str) -> Result<Self> {
        let docker = docker.negotiate_version().await.map_err(|e| Error::Unavailable {
            problem: format!(
                "cannot reach the Docker engine ({e}); is dockerd running and its socket readable?"
            ),
        })?;
        let version = docker.version().await.map_err(|e| Error::engine("version", e))?;
        let major = version
            .version
            .as_deref()
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        let info = docker.info().await.map_err(|e| Error::engine("info", e))?;
        let runtimes = info.runtimes.map(|r| r.into_keys().collect()).unwrap_or_default();
        Ok(Self {
            docker,
            major,
            runtimes,
            instance: instance.to_owned(),
        })
    }

    /// Whether bridge networks support `gateway_mode_ipv4=isolated` (Docker ≥ 28).
    #[must_use]
    pub fn isolated_gateway_mode(&self) -> bool {
        self.major >= 28
    }

    /// The installation label value.
    #[must_use]
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Check that the engine knows the OCI runtime `name` (`runc`, `runsc`, `sysbox-runc`).
    ///
    /// # Errors
    /// [`Error::Unavailable`] naming the runtime and the ones the engine has.
    pub fn check_runtime(&self, name: &str) -> Result<()> {
        if self.runtimes.iter().any(|r| r == name) {
            return Ok(());
        }
        Err(Error::Unavailable {
            problem: format!(
                "the container runtime {name:?} is not registered with Docker (it has: {}); install it and add it \
                 to /etc/docker/daemon.json \"runtimes\"",
                self.runtimes.join(", ")
            ),
        })
    }

    /// Labels for an object of `role`, belonging to `agent` when given.
    #[must_use]
    pub fn labels(&self, agent: Option<&AgentId>, role: &str) -> HashMap<String, String> {
        let mut labels = HashMap::from([
            (LABEL_MANAGED.to_owned(), "1".to_owned()),
            (LABEL_INSTANCE.to_owned(), self.instance.clone()),
            (LABEL_ROLE.to_owned(), role.to_owned()),
        ]);
        if let Some(agent) = agent {
            labels.insert(LABEL_AGENT.to_owned(), agent.to_string());
        }
        labels
    }

    /// The `label=` filters that select this installation's objects of `role`.
    #[must_use]
    pub fn filters(&self, role: &str) -> HashMap<String, Vec<String>> {
        HashMap::from([(
            "label".to_owned(),
            vec![
                format!("{LABEL_INSTANCE}={}", self.instance),
                format!("{LABEL_ROLE}={role}"),
            ],
        )])
    }
}
