//! What the runtime persists per agent: the spec (without secret values), and each secret's rules,
//! placeholder and value sealed by the vault (E10; AAD = a secret id derived from agent and name). A
//! restarted runtime rebuilds policies and secret tables from these, so sandboxes keep their placeholders.

use agenthold_core::sandbox::SandboxSpec;
use agenthold_core::secret::{Placeholder, SecretRule, SecretSpec};
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
        let mut stored = Vec::with_capacity(secrets.len());
        for s in secrets {
            let placeholder = placeholders
                .iter()
                .find(|p| p.name == s.name)
                .map(|p| p.placeholder.clone())
                .unwrap_or_default();
            let sealed = vault.seal(&secret_id(agent, &s.name)?, &s.value);
            stored.push(StoredSecret {
                name: s.name.clone(),
                env: s.env.clone(),
                placeholder,
                rules: s.rules.clone(),
                sealed: base64::engine::general_purpose::STANDARD.encode(sealed),
            });
        }
        Ok(Self {
            spec: spec.clone(),
            secrets: stored,
            pooled: false,
        })
    }

    /// The secrets with their values opened, and their placeholders.
    pub(crate) fn open_secrets(&self, vault: &Vault, agent: &AgentId) -> Result<Vec<(SecretSpec, String)>> {
        self.secrets
            .iter()
            .map(|s| {
                let sealed = base64::engine::general_purpose::STANDARD
                    .decode(&s.sealed)
                    .map_err(|e| Error::BadInput {
                        problem: format!("stored secret {} of {agent}: {e}", s.name),
                    })?;
                let value = vault.open(&secret_id(agent, &s.name)?, &sealed)?;
                let spec = SecretSpec::new(&s.name, value, s.env.as_deref(), s.rules.clone())?;
                Ok((spec, s.placeholder.clone()))
            })
            .collect()
    }
}

/// The runtime's agent records.
pub(crate) const RECORDS: AgentTable<AgentRecord> = AgentTable::new(TABLE, "agent record");
