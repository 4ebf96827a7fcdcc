//! What a sandbox is made of ([`SandboxSpec`]) and the [`Sandbox`] runtime trait that creates and drives
//! sandboxes. The default implementation (Docker) lives in `agenthold-sandbox`.
//!
//! Labels under `agenthold.*` are agenthold's own (S15): the runtime finds its engine objects and the agent
//! an engine event is about by them, so [`SandboxSpec::validate_labels`] refuses them (see
//! [`RESERVED_LABEL_PREFIXES`]).

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::ids::AgentId;
use crate::policy::NetworkPolicy;
use crate::secret::SecretSpec;

/// Everything needed to create an agent's sandbox.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// Container image (default `agenthold/dev:latest`).
    #[serde(default = "default_image")]
    pub image: String,
    /// Extra environment variables for every process in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// CPU limit in cores (fractions allowed); `None` for the runtime's default.
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Memory limit in bytes; `None` for the runtime's default.
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// Process (PID) limit; `None` for the runtime's default.
    #[serde(default)]
    pub pids: Option<u32>,
    /// The network policy (default open).
    #[serde(default)]
    pub policy: NetworkPolicy,
    /// Secrets attached to the agent. Their values are never serialised.
    #[serde(skip)]
    pub secrets: Vec<SecretSpec>,
    /// OCI runtime (`runc`, `runsc`, `sysbox-runc`); `None` for the configured default.
    #[serde(default)]
    pub runtime: Option<String>,
    /// Labels to put on the sandbox's engine objects, in addition to agenthold's own. Keys are printable
    /// ASCII without spaces and outside the reserved namespaces (see [`SandboxSpec::validate_labels`]).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Label namespaces a spec may not use, compared case-insensitively: agenthold's own (`agenthold` and
/// `agenthold.*`: installation, role, agent, … by which agenthold finds its objects and attributes engine
/// events), and the ones Docker reserves for itself (`com.docker.*`, `io.docker.*`, `org.dockerproject.*`;
/// Compose and other host tools act on objects by them).
pub const RESERVED_LABEL_PREFIXES: &[&str] =
    &["agenthold.", "com.docker.", "io.docker.", "org.dockerproject."];

impl SandboxSpec {
    /// Check the spec's label keys (S15): each is non-empty printable ASCII without spaces (so no
    /// whitespace, control or look-alike character can make a reserved key pass for another one), and none
    /// is `agenthold` or starts with one of [`RESERVED_LABEL_PREFIXES`], in any letter case. Values are free.
    ///
    /// # Errors
    /// [`Error::Label`] naming the first offending key.
    pub fn validate_labels(&self) -> Result<()> {
        for key in self.labels.keys() {
            let fail = |problem: String| {
                Err(Error::Label {
                    key: key.clone(),
                    problem,
                })
            };
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
                return fail(
                    "label keys are printable ASCII without spaces or control characters (for example \
                     com.example.team)"
                        .into(),
                );
            }
            let lower = key.to_ascii_lowercase();
            if lower == "agenthold" {
                return fail("agenthold.* labels are reserved for agenthold's own use".into());
            }
            if let Some(prefix) = RESERVED_LABEL_PREFIXES.iter().find(|p| lower.starts_with(**p)) {
                let whose = if *prefix == "agenthold." {
                    "agenthold's"
                } else {
                    "Docker's"
                };
                return fail(format!("{prefix}* labels are reserved for {whose} own use"));
            }
        }
        Ok(())
    }
}

impl Default for SandboxSpec {
    fn default() -> Self {
        Self {
            image: default_image(),
            env: BTreeMap::new(),
            cpus: None,
            memory_bytes: None,
            pids: None,
            policy: NetworkPolicy::default(),
            secrets: Vec::new(),
            runtime: None,
            labels: BTreeMap::new(),
        }
    }
}

fn default_image() -> String {
    "agenthold/dev:latest".to_owned()
}

/// A command to run in a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecRequest {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment for this command.
    pub env: BTreeMap<String, String>,
    /// Working directory, if not the image's.
    pub cwd: Option<String>,
    /// Bytes to feed to standard input.
    pub stdin: Option<Vec<u8>>,
    /// Give up (and kill the command) after this long.
    pub timeout: Option<std::time::Duration>,
}

/// What a finished command produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit code (128 + signal number when killed by a signal, -1 when unknown).
    pub exit_code: i64,
    /// Everything written to standard output.
    pub stdout: Vec<u8>,
    /// Everything written to standard error.
    pub stderr: Vec<u8>,
}

/// Run state of a sandbox as the runtime sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Created or stopped.
    Stopped,
    /// Running.
    Running,
}

/// What the runtime reports about a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxInfo {
    /// The agent.
    pub agent: AgentId,
    /// Run state.
    pub state: SandboxState,
    /// The image it runs.
    pub image: String,
}

/// A sandbox runtime: creates, starts, stops and removes agents' sandboxes and runs commands in them.
///
/// Contract: operations on one agent are idempotent where that makes sense (`stop` of a stopped sandbox and
/// `remove` of a removed one succeed); `remove` leaves no engine object, network or rule behind; a failed
/// `create` leaves nothing behind either. Errors for unknown agents are [`crate::Error::NotFound`].
#[async_trait::async_trait]
pub trait Sandbox: Send + Sync {
    /// Create (and start) the sandbox of `agent`.
    async fn create(&self, agent: &AgentId, spec: &SandboxSpec) -> Result<SandboxInfo>;
    /// Start a stopped sandbox.
    async fn start(&self, agent: &AgentId) -> Result<()>;
    /// Stop a running sandbox.
    async fn stop(&self, agent: &AgentId) -> Result<()>;
    /// Remove the sandbox and everything created for it (the volume too unless `keep_volume`).
    async fn remove(&self, agent: &AgentId, keep_volume: bool) -> Result<()>;
    /// Run a command to completion.
    async fn exec(&self, agent: &AgentId, request: ExecRequest) -> Result<ExecOutput>;
    /// Read a file.
    async fn read_file(&self, agent: &AgentId, path: &str) -> Result<Vec<u8>>;
    /// Write (create or replace) a file.
    async fn write_file(&self, agent: &AgentId, path: &str, data: &[u8]) -> Result<()>;
    /// Current state.
    async fn inspect(&self, agent: &AgentId) -> Result<SandboxInfo>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_label(key: &str) -> SandboxSpec {
        SandboxSpec {
            labels: BTreeMap::from([(key.to_owned(), "v".to_owned())]),
            ..SandboxSpec::default()
        }
    }

    // covers: S15
    #[test]
    fn reserved_and_malformed_label_keys_are_refused() {
        for key in [
            "agenthold.agent",
            "agenthold.role",
            "agenthold.instance",
            "agenthold.managed",
            "agenthold.",
            "agenthold",
            "AgentHold.Agent",
            "AGENTHOLD",
            " agenthold.agent",
            "agenthold.agent\t",
            "agenthold\u{0}.agent",
            "agenthold\u{200b}.agent",
            "\u{0430}genthold.agent",
            "com.docker.compose.project",
            "Com.Docker.x",
            "io.docker.x",
            "org.dockerproject.x",
            "",
            "a b",
            "a\nb",
        ] {
            match with_label(key).validate_labels() {
                Err(Error::Label { key: k, problem }) => {
                    assert_eq!(k, key);
                    assert!(!problem.is_empty());
                }
                other => panic!("{key:?}: {other:?}"),
            }
        }
        for key in [
            "team",
            "com.example.team",
            "agentholder",
            "my.agenthold.x",
            "a-b_c.d/e:f",
        ] {
            assert!(with_label(key).validate_labels().is_ok(), "{key:?}");
        }
        assert!(SandboxSpec::default().validate_labels().is_ok());
    }
}
