//! What the runtime persists per agent: the spec (without secret values), and each secret's rules,
//! placeholder and value sealed by the vault. A restarted runtime rebuilds policies and secret tables from
//! these, so sandboxes keep their placeholders.
//!
//! The vault binds each value to a secret id derived from agent and name *and* to the secret's rules (E10,
//! S15): a store writer without the master key who edits a record (other hosts, header or template, a value
//! moved to another secret or agent) makes that secret fail to open, with an error naming it. Records from
//! before rules were bound (vault format 1) are migrated once, when a runtime first starts on the store
//! (see [`AgentRecord::migrate_legacy`] and `docs/secrets.md`).

use agenthold_core::sandbox::SandboxSpec;
use agenthold_core::secret::{Placeholder, SecretRule, SecretSpec};
use agenthold_core::vault::is_legacy;
use agenthold_core::{AgentId, SecretId, Vault};
use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::table::AgentTable;

/// Store table of runtime-level agent records.
const TABLE: &str = "agents";

/// One stored secret.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct StoredSecret {
    pub(crate) name: String,
    pub(crate) env: Option<String>,
    pub(crate) placeholder: String,
    pub(crate) rules: Vec<SecretRule>,
    /// The vault's sealed value, base64.
    pub(crate) sealed: String,
}

/// One agent as the runtime keeps it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct AgentRecord {
    pub(crate) spec: SandboxSpec,
    pub(crate) secrets: Vec<StoredSecret>,
    /// A warm-pool sandbox not handed out yet.
    #[serde(default)]
    pub(crate) pooled: bool,
}

/// The vault id of `agent`'s secret `name`: values sealed for one agent or name never open for another.
pub(crate) fn secret_id(agent: &AgentId, name: &str) -> Result<SecretId> {
    let digest = Sha256::digest(format!("{agent}/{name}").as_bytes());
    Ok(SecretId::new(format!("s{}", &hex::encode(digest)[..40]))?)
}

impl AgentRecord {
    pub(crate) fn new(
        spec: &SandboxSpec,
        secrets: &[SecretSpec],
        placeholders: &[Placeholder],
        vault: &Vault,
        agent: &AgentId,
    ) -> Result<Self> {
        let with: Vec<(SecretSpec, String)> = secrets
            .iter()
            .map(|s| {
                let placeholder = placeholders
                    .iter()
                    .find(|p| p.name == s.name)
                    .map(|p| p.placeholder.clone())
                    .unwrap_or_default();
                (s.clone(), placeholder)
            })
            .collect();
        Ok(Self {
            spec: spec.clone(),
            secrets: seal(&with, vault, agent)?,
            pooled: false,
        })
    }

    /// The secrets with their values opened (each under its id and its stored rules), and their
    /// placeholders.
    ///
    /// # Errors
    /// [`Error::StoredSecret`] naming the agent and the secret when one does not open: its rules, value or
    /// name were changed outside agenthold, it was sealed under another master key, or it is still in the
    /// old format after the store's migration. No value of the record is returned then.
    pub(crate) fn open_secrets(&self, vault: &Vault, agent: &AgentId) -> Result<Vec<(SecretSpec, String)>> {
        self.secrets
            .iter()
            .map(|s| {
                let sealed = s.sealed_bytes(agent)?;
                let value = vault
                    .open(&secret_id(agent, &s.name)?, &s.rules, &sealed)
                    .map_err(|e| stored_secret(agent, &s.name, e))?;
                let spec = SecretSpec::new(&s.name, value, s.env.as_deref(), s.rules.clone())
                    .map_err(|e| stored_secret(agent, &s.name, e))?;
                Ok((spec, s.placeholder.clone()))
            })
            .collect()
    }

    /// The one-way migration of secrets sealed before rules were bound (vault format 1): each is opened
    /// under its old AAD (its id), then sealed again with its id and its stored rules. Returns whether
    /// anything changed (the caller stores the record again). Only a runtime starting on a store that was
    /// never migrated calls this; see [`agenthold_core::vault::legacy_migrated`].
    ///
    /// # Errors
    /// [`Error::StoredSecret`] when an old-format value does not open for its id (tampered bytes, a value
    /// moved from another secret, another master key); the record is left as it was.
    pub(crate) fn migrate_legacy(&mut self, vault: &Vault, agent: &AgentId) -> Result<bool> {
        let mut resealed = Vec::new();
        for (i, s) in self.secrets.iter().enumerate() {
            let sealed = s.sealed_bytes(agent)?;
            if !is_legacy(&sealed) {
                continue;
            }
            let (_, new) = vault
                .migrate(&secret_id(agent, &s.name)?, &s.rules, &sealed)
                .map_err(|e| stored_secret(agent, &s.name, e))?;
            resealed.push((i, new));
        }
        let changed = !resealed.is_empty();
        for (i, new) in resealed {
            self.secrets[i].sealed = base64::engine::general_purpose::STANDARD.encode(new);
        }
        Ok(changed)
    }
}

/// Each secret with its placeholder as stored: rules and placeholder in clear, the value sealed by the vault
/// under the secret's id and rules.
pub(crate) fn seal(
    with: &[(SecretSpec, String)],
    vault: &Vault,
    agent: &AgentId,
) -> Result<Vec<StoredSecret>> {
    with.iter()
        .map(|(s, placeholder)| {
            let sealed = vault.seal(&secret_id(agent, &s.name)?, &s.rules, &s.value);
            Ok(StoredSecret {
                name: s.name.clone(),
                env: s.env.clone(),
                placeholder: placeholder.clone(),
                rules: s.rules.clone(),
                sealed: base64::engine::general_purpose::STANDARD.encode(sealed),
            })
        })
        .collect()
}

impl StoredSecret {
    /// The sealed value's bytes.
    fn sealed_bytes(&self, agent: &AgentId) -> Result<Vec<u8>> {
        base64::engine::general_purpose::STANDARD
            .decode(&self.sealed)
            .map_err(|e| Error::BadInput {
                problem: format!("stored secret {:?} of agent {agent}: {e}", self.name),
            })
    }
}

fn stored_secret(agent: &AgentId, name: &str, source: agenthold_core::Error) -> Error {
    Error::StoredSecret {
        agent: agent.to_string(),
        secret: name.to_owned(),
        source,
    }
}

/// The runtime's agent records.
pub(crate) const RECORDS: AgentTable<AgentRecord> = AgentTable::new(TABLE, "agent record");
