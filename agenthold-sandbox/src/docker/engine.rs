//! The container engine connection: bollard with API version negotiation, what the engine can do (isolated
//! gateway mode on Docker ≥ 28, which OCI runtimes it knows), and the labels agenthold puts on every object
//! it creates so that it can find them again (reconcile, cleanup) and never touches anything else.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use agenthold_core::{AgentId, ErrorKind};
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
    /// The engine's Unix socket, when known: terminals open their own connection on it (see
    /// `docker::hijack`).
    socket: Option<PathBuf>,
}

impl Engine {
    /// Connect to the local engine (`DOCKER_HOST` or the default socket) and negotiate the API version.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no engine answers, with what to do about it.
    pub async fn connect(instance: &str) -> Result<Self> {
        let docker = Docker::connect_with_local_defaults().map_err(|e| Error::engine("connect", e))?;
        // The socket bollard's local defaults connect to: `DOCKER_HOST` when it names a Unix socket, else the
        // default one.
        let socket = std::env::var("DOCKER_HOST")
            .ok()
            .and_then(|host| host.strip_prefix("unix://").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"));
        Ok(Self::from_docker(docker, instance).await?.with_socket(socket))
    }

    /// Say which Unix socket the client given to [`Engine::from_docker`] talks to. Terminals then read
    /// their output from a connection of their own on it, byte for byte; without it they go through the
    /// client, which mistakes output starting with a byte 0, 1 or 2 for a frame header (see
    /// `docker::hijack`).
    #[must_use]
    pub fn with_socket(mut self, socket: impl Into<PathBuf>) -> Self {
        self.socket = Some(socket.into());
        self
    }

    /// The engine's Unix socket, when known.
    #[must_use]
    pub fn socket(&self) -> Option<&Path> {
        self.socket.as_deref()
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
            socket: None,
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

// What the engine's answers mean. This is the one place that reads its status codes (and, where it has no
// code of its own, its message): everywhere else an engine failure is an [`Error`] with a kind.

/// The class of a failed engine request.
fn kind_of(e: &bollard::errors::Error) -> ErrorKind {
    use bollard::errors::Error as E;
    match e {
        E::DockerResponseServerError { status_code: 404, .. } => ErrorKind::NotFound,
        // The object is not in a state for the request: a stopped container asked to run a command, a
        // name already taken.
        E::DockerResponseServerError { status_code: 409, .. } => ErrorKind::Conflict,
        E::RequestTimeoutError => ErrorKind::Timeout,
        _ => ErrorKind::Upstream,
    }
}

/// The class of an engine answer's HTTP status, for a request made without bollard (`docker::hijack`).
pub(crate) fn kind_of_status(status: u16) -> ErrorKind {
    match status {
        404 => ErrorKind::NotFound,
        409 => ErrorKind::Conflict,
        _ => ErrorKind::Upstream,
    }
}

/// Whether the engine answered that the object (container, network, volume, image) does not exist.
pub(crate) fn is_not_found(e: &bollard::errors::Error) -> bool {
    kind_of(e) == ErrorKind::NotFound
}

/// Whether the engine refused a network because its subnet overlaps another one: another runtime on the
/// same engine took that subnet between our look at the engine's networks and our create. The engine says
/// so only in its message ("Pool overlaps with other one on this address space").
pub(crate) fn is_pool_overlap(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError { message, .. }
            if message.to_ascii_lowercase().contains("overlaps")
    )
}

/// Whether a container removal failed only because the storage driver could not delete the root filesystem
/// yet ("driver \"overlay2\" failed to remove root filesystem: … directory not empty"): a process of the
/// container was still finishing a write while the driver walked the directory. The container is dead by
/// then; removing it again succeeds.
pub(crate) fn is_busy_rootfs(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError { message, .. }
            if message.contains("failed to remove root filesystem")
    )
}

/// Whether the engine answered 304: the container already is in the state asked for (started, stopped).
pub(crate) fn is_not_modified(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError { status_code: 304, .. }
    )
}

/// Whether a network disconnect failed because the container was not connected to that network. The engine
/// says so only in its message (the status differs between versions).
pub(crate) fn is_not_connected(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError { message, .. } if message.contains("not connected")
    )
}

impl Error {
    /// A failed engine request, with what was being done; classified here, once.
    pub(crate) fn engine(context: impl Into<String>, source: bollard::errors::Error) -> Self {
        Self::Engine {
            context: context.into(),
            kind: kind_of(&source),
            source: Box::new(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status_code: u16, message: &str) -> bollard::errors::Error {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message: message.to_owned(),
        }
    }

    #[test]
    fn status_codes_become_kinds() {
        let cases = [
            (answer(404, "No such container: x"), ErrorKind::NotFound),
            (answer(409, "container x is not running"), ErrorKind::Conflict),
            (answer(500, "boom"), ErrorKind::Upstream),
            (answer(400, "bad parameter"), ErrorKind::Upstream),
            (bollard::errors::Error::RequestTimeoutError, ErrorKind::Timeout),
        ];
        for (e, kind) in cases {
            let error = Error::engine("exec in a", e);
            assert_eq!(error.kind(), kind, "{error}");
            assert!(error.to_string().starts_with("docker: exec in a: "), "{error}");
        }
    }

    #[test]
    fn the_kind_crosses_the_sandbox_trait() {
        let core = agenthold_core::Error::from(Error::engine("exec in a", answer(409, "not running")));
        assert_eq!(core.kind(), ErrorKind::Conflict);
        let core = agenthold_core::Error::from(Error::engine("read /x", answer(404, "no such file")));
        assert_eq!(core.kind(), ErrorKind::NotFound);
    }

    #[test]
    fn only_a_busy_root_filesystem_is_removed_again() {
        // What Docker 20.10 answered in a server test while a run was still finishing in the container.
        assert!(is_busy_rootfs(&answer(
            500,
            "container 4a0f: driver \"overlay2\" failed to remove root filesystem: unlinkat \
             /var/lib/docker/overlay2/1113/merged: directory not empty"
        )));
        assert!(!is_busy_rootfs(&answer(500, "boom")));
        assert!(!is_busy_rootfs(&answer(404, "No such container: x")));
    }

    #[test]
    fn answers_that_are_not_failures() {
        // What Docker 20.10 answers when another runtime took the subnet first.
        assert!(is_pool_overlap(&answer(
            403,
            "Pool overlaps with other one on this address space"
        )));
        assert!(!is_pool_overlap(&answer(
            409,
            "network with name x already exists"
        )));
        assert!(is_not_found(&answer(404, "")));
        assert!(!is_not_found(&answer(409, "")));
        assert!(is_not_modified(&answer(304, "")));
        assert!(!is_not_modified(&answer(404, "")));
        assert!(is_not_connected(&answer(
            403,
            "container abc is not connected to network none"
        )));
        assert!(!is_not_connected(&answer(500, "boom")));
    }
}
