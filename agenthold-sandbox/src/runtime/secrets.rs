//! An agent's secrets after it was created (E10, E12, E13): replaced as a whole while the sandbox runs, and
//! listed (names, variables, placeholders; never values).
//!
//! A secret that keeps its name keeps its placeholder, so the sandbox's environment and whatever the agent
//! wrote it into stay valid. The change is stored first (values sealed by the vault, as at creation) and
//! then takes effect in the gateway, for the next request. Placeholder variables: the engine cannot change
//! a created container's environment, so the runtime puts each secret's variable into every command it
//! starts from then on (see `commands`); the container's own environment (its PID 1, a `docker exec` from
//! outside agenthold) keeps the variables it was created with, and a detached secret's old placeholder
//! there no longer stands for anything.
// enforces: E10 E12

use agenthold_core::AgentId;
use agenthold_core::sandbox::SandboxSpec;
use agenthold_core::secret::{PLACEHOLDER_PREFIX, Placeholder, SecretSpec, SecretTable, new_placeholder};

use super::{Runtime, admit, records};
use crate::error::{Error, Result};

impl Runtime {
    /// Replace `agent`'s secrets with `secrets` (an empty list detaches them all) and return their
    /// placeholders. A secret whose name the agent had keeps its placeholder; a new one gets a fresh one.
    /// Requests the gateway sees from now on are injected with the new set; the record (values sealed) is
    /// stored first, so a restarted runtime has the same set.
    ///
    /// A secret's `env` variable reaches every command the runtime starts from now on ([`Runtime::exec`],
    /// [`Runtime::exec_stream`], [`Runtime::open_terminal`]), not the container's own environment (see the
    /// module documentation in `docs/runtime.md`).
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown agent; [`Error::Unavailable`] when the runtime was built with a
    /// custom injector that has no per-agent table; a secret error (as [`SandboxSpec::split`]) for an
    /// invalid secret, two with one name or variable, or a variable the sandbox's own environment or the
    /// datapath sets. Nothing changes on an error.
    pub async fn set_secrets(&self, agent: &AgentId, secrets: Vec<SecretSpec>) -> Result<Vec<Placeholder>> {
        let table = self.injector.table().ok_or_else(|| Error::Unavailable {
            problem: "secrets are managed by the custom SecretInjector this runtime was built with".into(),
        })?;
        let _records = self.record_lock.lock().await;
        let mut record = self.record(agent).await?;
        check(&record.spec, &secrets)?;
        let with: Vec<(SecretSpec, String)> = secrets
            .into_iter()
            .map(|s| {
                let kept = record.secrets.iter().find(|r| r.name == s.name);
                let placeholder = kept.map_or_else(new_placeholder, |r| r.placeholder.clone());
                (s, placeholder)
            })
            .collect();
        record.secrets = records::seal(&with, &self.vault, agent)?;
        records::RECORDS.save(self.store.as_ref(), agent, &record).await?;
        let placeholders = table.set_with_placeholders(agent, with);
        tracing::info!(agent = %agent, secrets = placeholders.len(), "secrets replaced");
        Ok(placeholders)
    }

    /// `agent`'s secrets as the sandbox sees them: names, environment variables and placeholders (never
    /// values), from its stored record.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown agent; the store's error.
    pub async fn agent_secrets(&self, agent: &AgentId) -> Result<Vec<Placeholder>> {
        let record = self.record(agent).await?;
        Ok(record
            .secrets
            .into_iter()
            .map(|s| Placeholder {
                name: s.name,
                env: s.env,
                placeholder: s.placeholder,
            })
            .collect())
    }

    /// The secret table the runtime sets specs' secrets in (the default injector's; `None` with a custom
    /// injector that has none).
    #[must_use]
    pub fn secrets(&self) -> Option<&SecretTable> {
        self.injector.table()
    }
}

/// The checks a spec's secrets pass at creation ([`admit`]), against the sandbox's own environment: its
/// variables less the ones that hold a placeholder (set from secrets at creation, free for a secret again).
fn check(spec: &SandboxSpec, secrets: &[SecretSpec]) -> Result<()> {
    let mut probe = spec.clone();
    probe
        .env
        .retain(|_, value| !value.starts_with(PLACEHOLDER_PREFIX));
    probe.secrets = secrets.to_vec();
    admit(probe).map(drop)
}
