//! [`SandboxSpec`], what a caller asks for, checked once where it enters ([`SandboxSpec::split`]) and split
//! into the [`ContainerSpec`] a `Sandbox` implementation is given and the [`GatewaySpec`] the runtime's
//! gateway enforces.
// enforces: S15

use std::collections::BTreeMap;

use crate::error::{Error, Result};
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

/// The smallest CPU limit the engine accepts.
const MIN_CPUS: f64 = 0.01;
/// The smallest memory limit the engine accepts (6 MiB).
const MIN_MEMORY: u64 = 6 * 1024 * 1024;
/// The kernel's largest process count (`PID_MAX_LIMIT` on 64-bit).
const MAX_PIDS: u32 = 4_194_304;

impl SandboxSpec {
    /// Check the whole spec, once, where it enters, and split it into what the sandbox is made of and what
    /// the gateway enforces. Checked: the image is named; labels as [`SandboxSpec::validate_labels`]; limits
    /// are positive (`cpus` a finite number of cores); environment names are non-empty without `=` or NUL,
    /// values without NUL; each secret as [`SecretSpec::validate`], no two with one name or one environment
    /// variable, and no secret's variable also in `env`.
    ///
    /// The environment variables the datapath sets itself (proxies, CA bundle) are the runtime's to check:
    /// core does not know the datapath.
    ///
    /// # Errors
    /// [`Error::Label`] for a label, [`Error::Secret`] for a secret (or two that clash), [`Error::SandboxSpec`] for anything
    /// else, each naming the offending value.
    pub fn split(self) -> Result<(ContainerSpec, GatewaySpec)> {
        self.validate_labels()?;
        let bad = |field: &'static str, problem: String| Err(Error::SandboxSpec { field, problem });
        if self.image.trim().is_empty() {
            return bad("image", "name an image, e.g. agenthold/dev:latest".into());
        }
        // The engine's own floors and the kernel's ceiling: a value past them fails only when the container
        // starts, as the engine's error, not as the bad input it is.
        if let Some(cpus) = self.cpus
            && !(cpus.is_finite() && cpus >= MIN_CPUS)
        {
            return bad(
                "cpus",
                format!("give a number of cores from {MIN_CPUS} (e.g. 1.5), not {cpus}"),
            );
        }
        if self.memory_bytes.is_some_and(|m| m < MIN_MEMORY) {
            return bad(
                "memory",
                format!("give at least {MIN_MEMORY} bytes (6 MiB), e.g. 536870912 for 512 MiB"),
            );
        }
        if self.pids.is_some_and(|p| p == 0 || p > MAX_PIDS) {
            return bad(
                "pids",
                format!("give a process count from 1 to {MAX_PIDS}, e.g. 256"),
            );
        }
        for (key, value) in &self.env {
            check_env(key, value)?;
        }
        let mut names = std::collections::HashSet::new();
        let mut vars = std::collections::HashSet::new();
        for secret in &self.secrets {
            secret.validate()?;
            let fail = |problem: String| {
                Err(Error::Secret {
                    name: secret.name.clone(),
                    problem,
                })
            };
            if !names.insert(secret.name.as_str()) {
                return fail(format!(
                    "two secrets are named {:?}: names are unique per sandbox",
                    secret.name
                ));
            }
            if let Some(env) = &secret.env {
                if !vars.insert(env.as_str()) {
                    return fail(format!("two secrets set the environment variable {env:?}"));
                }
                if self.env.contains_key(env) {
                    // The spec's `env` is at fault as much as the secret: a bad spec (Python: SandboxError).
                    return bad(
                        "env",
                        format!(
                            "{env} is set both in env and by secret {:?} (which puts its placeholder there)",
                            secret.name
                        ),
                    );
                }
            }
        }
        Ok((
            ContainerSpec {
                image: self.image,
                env: self.env,
                cpus: self.cpus,
                memory_bytes: self.memory_bytes,
                pids: self.pids,
                runtime: self.runtime,
                labels: self.labels,
            },
            GatewaySpec {
                policy: self.policy,
                secrets: self.secrets,
            },
        ))
    }

    /// The spec the two halves were split from (the inverse of [`SandboxSpec::split`]).
    #[must_use]
    pub fn join(container: ContainerSpec, gateway: GatewaySpec) -> Self {
        Self {
            image: container.image,
            env: container.env,
            cpus: container.cpus,
            memory_bytes: container.memory_bytes,
            pids: container.pids,
            policy: gateway.policy,
            secrets: gateway.secrets,
            runtime: container.runtime,
            labels: container.labels,
        }
    }

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

/// The container half of a [`SandboxSpec`]: what a `Sandbox` implementation is given. Only
/// [`SandboxSpec::split`] makes one and its fields are read-only, so an implementation always receives it
/// checked (S15: no reserved label), however it is driven.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSpec {
    image: String,
    env: BTreeMap<String, String>,
    cpus: Option<f64>,
    memory_bytes: Option<u64>,
    pids: Option<u32>,
    runtime: Option<String>,
    labels: BTreeMap<String, String>,
}

impl ContainerSpec {
    /// Container image.
    #[must_use]
    pub fn image(&self) -> &str {
        &self.image
    }

    /// Extra environment variables for every process in the sandbox (with the secrets' placeholders once
    /// the runtime added them).
    #[must_use]
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// CPU limit in cores; `None` for the runtime's default.
    #[must_use]
    pub fn cpus(&self) -> Option<f64> {
        self.cpus
    }

    /// Memory limit in bytes; `None` for the runtime's default.
    #[must_use]
    pub fn memory_bytes(&self) -> Option<u64> {
        self.memory_bytes
    }

    /// Process (PID) limit; `None` for the runtime's default.
    #[must_use]
    pub fn pids(&self) -> Option<u32> {
        self.pids
    }

    /// OCI runtime; `None` for the configured default.
    #[must_use]
    pub fn runtime(&self) -> Option<&str> {
        self.runtime.as_deref()
    }

    /// Labels to put on the sandbox's engine objects, in addition to agenthold's own.
    #[must_use]
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// Set an environment variable (the runtime puts each secret's placeholder in its variable this way).
    ///
    /// # Errors
    /// [`Error::SandboxSpec`] for a name that is empty or holds `=` or NUL, or a value with NUL.
    pub fn set_env(&mut self, name: &str, value: &str) -> Result<()> {
        check_env(name, value)?;
        self.env.insert(name.to_owned(), value.to_owned());
        Ok(())
    }
}

/// An environment variable's name and value are usable (see [`SandboxSpec::split`]).
fn check_env(key: &str, value: &str) -> Result<()> {
    let bad = |problem: String| {
        Err(Error::SandboxSpec {
            field: "env",
            problem,
        })
    };
    if key.is_empty() || key.contains('=') || key.contains('\0') {
        return bad(format!("{key:?} is not a valid environment variable name"));
    }
    if value.contains('\0') {
        return bad(format!("the value of {key} contains a NUL byte"));
    }
    Ok(())
}

/// The gateway half of a [`SandboxSpec`]: what the runtime's egress gateway enforces for the agent.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GatewaySpec {
    /// The network policy.
    pub policy: NetworkPolicy,
    /// The secrets, checked.
    pub secrets: Vec<SecretSpec>,
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

    fn rule() -> crate::secret::SecretRule {
        crate::secret::SecretRule::header(&["api.example.test"], "authorization", "Bearer {{.Value}}")
            .unwrap()
    }

    fn secret(name: &str, env: Option<&str>) -> SecretSpec {
        SecretSpec::new(name, "v".into(), env, vec![rule()]).unwrap()
    }

    #[test]
    fn split_hands_each_half_its_fields_and_join_undoes_it() {
        let spec = SandboxSpec {
            image: "img:1".into(),
            env: BTreeMap::from([("A".into(), "1".into())]),
            cpus: Some(0.5),
            memory_bytes: Some(64 << 20),
            pids: Some(64),
            policy: NetworkPolicy::allowlist(Vec::new()),
            secrets: vec![secret("k", Some("K"))],
            runtime: Some("runc".into()),
            labels: BTreeMap::from([("team".into(), "x".into())]),
        };
        let (container, gateway) = spec.clone().split().unwrap();
        assert_eq!(container.image(), "img:1");
        assert_eq!(container.env().len(), 1);
        assert_eq!(
            (container.cpus(), container.memory_bytes(), container.pids()),
            (Some(0.5), Some(64 << 20), Some(64))
        );
        assert_eq!(container.runtime(), Some("runc"));
        assert_eq!(container.labels().len(), 1);
        let mut container = container;
        container.set_env("B", "2").unwrap();
        assert!(container.set_env("B=C", "2").is_err());
        assert!(container.set_env("B", "\0").is_err());
        container.env.remove("B");
        assert_eq!(gateway.policy, spec.policy);
        assert_eq!(gateway.secrets, spec.secrets);
        let joined = SandboxSpec::join(container, gateway);
        assert_eq!(
            serde_json::to_value(&joined).unwrap(),
            serde_json::to_value(&spec).unwrap()
        );
    }

    #[test]
    fn split_refuses_each_bad_field_naming_it() {
        let cases: Vec<(SandboxSpec, &str)> = vec![
            (
                SandboxSpec {
                    image: " ".into(),
                    ..SandboxSpec::default()
                },
                "image",
            ),
            (
                SandboxSpec {
                    cpus: Some(0.0),
                    ..SandboxSpec::default()
                },
                "cpus",
            ),
            (
                SandboxSpec {
                    cpus: Some(f64::NAN),
                    ..SandboxSpec::default()
                },
                "cpus",
            ),
            (
                SandboxSpec {
                    cpus: Some(-1.0),
                    ..SandboxSpec::default()
                },
                "cpus",
            ),
            (
                SandboxSpec {
                    memory_bytes: Some(0),
                    ..SandboxSpec::default()
                },
                "memory",
            ),
            (
                SandboxSpec {
                    pids: Some(0),
                    ..SandboxSpec::default()
                },
                "pids",
            ),
            (
                SandboxSpec {
                    pids: Some(MAX_PIDS + 1),
                    ..SandboxSpec::default()
                },
                "pids",
            ),
            (
                SandboxSpec {
                    memory_bytes: Some(MIN_MEMORY - 1),
                    ..SandboxSpec::default()
                },
                "memory",
            ),
            (
                SandboxSpec {
                    cpus: Some(0.001),
                    ..SandboxSpec::default()
                },
                "cpus",
            ),
            (
                SandboxSpec {
                    env: BTreeMap::from([("A=B".into(), "1".into())]),
                    ..SandboxSpec::default()
                },
                "env",
            ),
            (
                SandboxSpec {
                    env: BTreeMap::from([(String::new(), "1".into())]),
                    ..SandboxSpec::default()
                },
                "env",
            ),
            (
                SandboxSpec {
                    env: BTreeMap::from([("A".into(), "1\0".into())]),
                    ..SandboxSpec::default()
                },
                "env",
            ),
        ];
        for (spec, field) in cases {
            match spec.split() {
                Err(Error::SandboxSpec { field: f, problem }) => {
                    assert_eq!(f, field);
                    assert!(!problem.is_empty());
                }
                other => panic!("{field}: {other:?}"),
            }
        }
        assert!(matches!(
            with_label("agenthold.agent").split(),
            Err(Error::Label { .. })
        ));
    }

    #[test]
    fn split_refuses_conflicting_secrets() {
        for (secrets, env, needle) in [
            (
                vec![secret("k", None), secret("k", None)],
                None,
                "two secrets are named",
            ),
            (
                vec![secret("a", Some("K")), secret("b", Some("K"))],
                None,
                "two secrets set",
            ),
            (vec![secret("a", Some("K"))], Some("K"), "set both in env"),
        ] {
            let spec = SandboxSpec {
                secrets,
                env: env
                    .map(|e: &str| BTreeMap::from([(e.to_owned(), "x".to_owned())]))
                    .unwrap_or_default(),
                ..SandboxSpec::default()
            };
            match spec.split() {
                // Python's classes as before the check moved into `split`: SecretError for two secrets
                // that clash, SandboxError for a secret's variable also in `env`.
                Err(e @ Error::Secret { .. }) if env.is_none() => {
                    assert!(e.to_string().contains(needle), "{e}");
                }
                Err(e @ Error::SandboxSpec { field: "env", .. }) if env.is_some() => {
                    assert!(e.to_string().contains(needle), "{e}");
                }
                other => panic!("{needle}: {other:?}"),
            }
        }
        let bad = SecretSpec {
            rules: Vec::new(),
            ..secret("k", None)
        };
        let spec = SandboxSpec {
            secrets: vec![bad],
            ..SandboxSpec::default()
        };
        assert!(matches!(spec.split(), Err(Error::Secret { .. })));
    }
}
