//! What a warm-pool hand-out applies to a running sandbox ([`agenthold_core::Sandbox::reconfigure`]): the
//! spec's environment, kept by the runtime and given to every command it starts, and the spec's limits,
//! updated on the running container through the engine.
//!
//! The environment is the runtime's, never a file in the sandbox: it lives in the runtime's store (this
//! module's table, keyed by agent) and in memory, and [`ExecEnv::apply`] adds it to each exec's own
//! environment, which wins for the names it sets. Docker itself gives an exec the container's environment
//! under the exec's: so a command sees the image's, then the datapath's, then the spec's, then its own
//! variables, the same order as for a sandbox whose spec was set at creation. Nothing the sandbox can write
//! is read. A pooled sandbox never had an environment of its own, and an agent's entry goes with it.
// enforces: P1

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use agenthold_core::sandbox::ContainerSpec;
use agenthold_core::{AgentId, Store};
use bollard::models::ContainerUpdateBody;

use super::DockerConfig;
use crate::error::{Error, Result};
use crate::table::AgentTable;

/// Store table of environments applied at hand-out.
const TABLE: &str = "docker_agent_env";

/// The environments applied at hand-out, per agent.
const ENVS: AgentTable<BTreeMap<String, String>> = AgentTable::new(TABLE, "sandbox environment");

/// An agent's environment applied at hand-out (empty for every other sandbox).
type Env = Arc<BTreeMap<String, String>>;

/// The environments applied at hand-out: the store's table, with what was read or written kept in memory.
#[derive(Default)]
pub(crate) struct ExecEnv {
    known: Mutex<HashMap<AgentId, Env>>,
}

impl ExecEnv {
    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<AgentId, Env>> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keep `env` as `agent`'s environment (an empty one removes it).
    pub(crate) async fn set(
        &self,
        store: &dyn Store,
        agent: &AgentId,
        env: &BTreeMap<String, String>,
    ) -> Result<()> {
        if env.is_empty() {
            ENVS.delete(store, agent).await?;
        } else {
            ENVS.save(store, agent, env).await?;
        }
        self.known().insert(agent.clone(), Arc::new(env.clone()));
        Ok(())
    }

    /// `agent`'s environment (read from the store once per runtime).
    async fn get(&self, store: &dyn Store, agent: &AgentId) -> Result<Env> {
        if let Some(env) = self.known().get(agent) {
            return Ok(Arc::clone(env));
        }
        let env = Arc::new(ENVS.load(store, agent).await?.unwrap_or_default());
        self.known().insert(agent.clone(), Arc::clone(&env));
        Ok(env)
    }

    /// `own` (a command's environment) with `agent`'s environment under it: the command's own values win.
    pub(crate) async fn apply(
        &self,
        store: &dyn Store,
        agent: &AgentId,
        own: &mut BTreeMap<String, String>,
    ) -> Result<()> {
        for (k, v) in self.get(store, agent).await?.iter() {
            own.entry(k.clone()).or_insert_with(|| v.clone());
        }
        Ok(())
    }

    /// Forget `agent`'s environment (its sandbox is gone).
    pub(crate) async fn forget(&self, store: &dyn Store, agent: &AgentId) -> Result<()> {
        self.known().remove(agent);
        ENVS.delete(store, agent).await
    }
}

/// A container's limits as the engine takes them: the spec's, or the configured defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// CPUs in billionths.
    pub(crate) nano_cpus: i64,
    /// Memory (and memory plus swap: no swap) in bytes.
    pub(crate) memory: i64,
    /// Processes.
    pub(crate) pids: i64,
}

impl Limits {
    /// The limits a sandbox made from `spec` gets.
    pub(crate) fn of(spec: &ContainerSpec, config: &DockerConfig) -> Result<Self> {
        // The spec's limits were checked by `SandboxSpec::split`, the defaults by `Config`.
        let cpus = spec.cpus().unwrap_or(config.cpus);
        // Rounding to whole nano-CPUs is the engine's own resolution.
        #[allow(clippy::cast_possible_truncation)]
        let nano_cpus = (cpus * 1e9) as i64;
        let memory = i64::try_from(spec.memory_bytes().unwrap_or(config.memory_bytes)).map_err(|_| {
            Error::BadInput {
                problem: "memory limit too large".into(),
            }
        })?;
        Ok(Self {
            nano_cpus,
            memory,
            pids: i64::from(spec.pids().unwrap_or(config.pids)),
        })
    }

    /// The engine's update that sets these limits on a running container.
    pub(crate) fn update(self) -> ContainerUpdateBody {
        ContainerUpdateBody {
            nano_cpus: Some(self.nano_cpus),
            memory: Some(self.memory),
            memory_swap: Some(self.memory),
            pids_limit: Some(self.pids),
            ..Default::default()
        }
    }
}

/// Whether a spec sets a limit of its own (a sandbox made with the defaults needs no update then).
pub(crate) fn sets_limits(spec: &ContainerSpec) -> bool {
    spec.cpus().is_some() || spec.memory_bytes().is_some() || spec.pids().is_some()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use agenthold_core::store::RedbStore;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    // covers: P1
    /// The environment applied at hand-out sits under a command's own, survives a restart (the store),
    /// and goes with the agent; other agents have none.
    #[tokio::test]
    async fn the_environment_is_under_each_commands_own_and_kept_in_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open_in_data_dir(dir.path()).unwrap();
        let agent = AgentId::random();
        let other = AgentId::random();
        let envs = ExecEnv::default();
        envs.set(&store, &agent, &vars(&[("A", "spec"), ("B", "spec")]))
            .await
            .unwrap();

        let mut own = vars(&[("B", "mine")]);
        envs.apply(&store, &agent, &mut own).await.unwrap();
        assert_eq!(own, vars(&[("A", "spec"), ("B", "mine")]));
        let mut none = BTreeMap::new();
        envs.apply(&store, &other, &mut none).await.unwrap();
        assert!(none.is_empty(), "another agent gets nothing");

        // A restarted runtime reads it from the store.
        let again = ExecEnv::default();
        let mut own = BTreeMap::new();
        again.apply(&store, &agent, &mut own).await.unwrap();
        assert_eq!(own, vars(&[("A", "spec"), ("B", "spec")]));

        again.forget(&store, &agent).await.unwrap();
        for envs in [ExecEnv::default(), again] {
            let mut own = BTreeMap::new();
            envs.apply(&store, &agent, &mut own).await.unwrap();
            assert!(own.is_empty(), "forgotten");
        }
    }

    #[test]
    fn limits_are_the_specs_or_the_defaults() {
        let defaults = agenthold_core::Config::default();
        let config = DockerConfig {
            ports: agenthold_egress::nft::Ports::from_config(&defaults.egress),
            subnet_pool: defaults.sandbox.subnet_pool,
            subnet_prefix: defaults.sandbox.subnet_prefix,
            default_runtime: "runc".into(),
            cpus: 2.0,
            memory_bytes: 1 << 30,
            pids: 512,
            sandboxd_path: "/nonexistent".into(),
            state_dir: "/nonexistent".into(),
            sandboxd_image: String::new(),
            ca_pem: String::new(),
        };
        let split = |spec: agenthold_core::SandboxSpec| spec.split().unwrap().0;
        let plain = split(agenthold_core::SandboxSpec::default());
        assert!(!sets_limits(&plain));
        let limits = Limits::of(&plain, &config).unwrap();
        assert_eq!(
            limits,
            Limits {
                nano_cpus: 2_000_000_000,
                memory: 1 << 30,
                pids: 512
            }
        );
        let small = split(agenthold_core::SandboxSpec {
            cpus: Some(0.5),
            pids: Some(64),
            ..agenthold_core::SandboxSpec::default()
        });
        assert!(sets_limits(&small));
        let update = Limits::of(&small, &config).unwrap().update();
        assert_eq!(
            (
                update.nano_cpus,
                update.memory,
                update.memory_swap,
                update.pids_limit
            ),
            (Some(500_000_000), Some(1 << 30), Some(1 << 30), Some(64)),
            "the spec's limits, the defaults for the rest, no swap"
        );
    }
}
