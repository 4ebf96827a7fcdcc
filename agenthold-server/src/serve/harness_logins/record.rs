//! What the server stores about provider logins (S3):
//!
//! - Table `srv_provider_logins`, key the login id (`pl_…`): owner, provider, state; while pending, the
//!   SHA-256 of the OAuth `state`, the PKCE verifier and the expiry; once connected, the tokens sealed by
//!   the vault under an id derived from the login's id and owner (a store writer without the master key
//!   can neither read them nor move them to another login or user), and what the harness's credential file
//!   needs besides them (expiry, scopes, the ID token's claims).
//! - Table `srv_agent_provider_logins`, key the agent id: the logins attached to that agent (one per
//!   provider).

use agenthold_core::secret::SecretValue;
use agenthold_core::{AgentId, SecretId, Store, UserId, Vault, WorkspaceId};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::Provider;
use crate::serve::api::{ApiError, ApiResult};

const LOGINS: &str = "srv_provider_logins";
const AGENTS: &str = "srv_agent_provider_logins";

/// A started login, waiting for its code.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Pending {
    /// SHA-256 hex of the OAuth `state`.
    pub(crate) state_hash: String,
    /// The PKCE code verifier.
    pub(crate) verifier: String,
    /// Unix seconds after which the attempt is void.
    pub(crate) expires_unix: i64,
}

/// What the harness's credential file needs besides the tokens (none of it is a credential).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct TokenMeta {
    /// When the access token expires (Unix milliseconds).
    pub(crate) expires_at_ms: i64,
    /// The scopes granted.
    pub(crate) scopes: Vec<String>,
    /// Claude: the subscription (`pro`, `max`, …) when the provider said.
    pub(crate) subscription_type: Option<String>,
    /// ChatGPT: the ID token's header and claims (its signature is never kept outside the sealed tokens).
    pub(crate) id_header: Option<serde_json::Value>,
    /// ChatGPT: the ID token's claims.
    pub(crate) id_claims: Option<serde_json::Value>,
    /// ChatGPT: the account id (`chatgpt_account_id`).
    pub(crate) account_id: Option<String>,
    /// Who the provider says the account is (an email), for the owner's list.
    pub(crate) account: Option<String>,
    /// When the tokens were last renewed (RFC 3339).
    pub(crate) last_refresh: String,
}

/// The tokens, as sealed.
#[derive(Serialize, Deserialize)]
pub(crate) struct Tokens {
    pub(crate) access_token: String,
    pub(crate) refresh_token: String,
    #[serde(default)]
    pub(crate) id_token: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens(<redacted>)")
    }
}

/// A provider login.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LoginRecord {
    /// `pl_` and 24 hex digits.
    pub(crate) id: String,
    /// The user it belongs to.
    pub(crate) owner: UserId,
    /// Claude or ChatGPT.
    pub(crate) provider: Provider,
    /// A name the owner gave it.
    pub(crate) name: Option<String>,
    /// When it was started (RFC 3339).
    pub(crate) created_at: String,
    /// When the code was exchanged (RFC 3339).
    pub(crate) connected_at: Option<String>,
    /// While pending.
    pub(crate) pending: Option<Pending>,
    /// Once connected: the tokens sealed, base64.
    pub(crate) sealed: Option<String>,
    /// Once connected.
    pub(crate) meta: Option<TokenMeta>,
}

impl LoginRecord {
    /// Whether the code was exchanged.
    pub(crate) fn connected(&self) -> bool {
        self.sealed.is_some()
    }

    /// The vault's id for this login's tokens.
    fn vault_id(&self) -> ApiResult<SecretId> {
        let digest = Sha256::digest(format!("provider-login/{}/{}", self.id, self.owner).as_bytes());
        SecretId::new(format!("p{}", &hex::encode(digest)[..40])).map_err(|e| ApiError::internal(&e))
    }

    /// Seal `tokens` into the record.
    pub(crate) fn seal(&mut self, vault: &Vault, tokens: &Tokens) -> ApiResult<()> {
        let json = Zeroizing::new(serde_json::to_vec(tokens).map_err(|e| ApiError::internal(&e))?);
        let sealed = vault.seal(&self.vault_id()?, &[], &SecretValue::new(json.to_vec()));
        self.sealed = Some(base64::engine::general_purpose::STANDARD.encode(sealed));
        Ok(())
    }

    /// The tokens, opened.
    pub(crate) fn open(&self, vault: &Vault) -> ApiResult<Tokens> {
        let fail = |problem: &dyn std::fmt::Display| {
            ApiError::internal(&format!("provider login {} does not open: {problem}", self.id))
        };
        let sealed = self.sealed.as_deref().ok_or_else(|| fail(&"not connected"))?;
        let sealed = base64::engine::general_purpose::STANDARD
            .decode(sealed)
            .map_err(|e| fail(&e))?;
        let value = vault
            .open(&self.vault_id()?, &[], &sealed)
            .map_err(|e| fail(&e))?;
        serde_json::from_slice(value.expose()).map_err(|_| fail(&"the sealed tokens are not readable"))
    }
}

fn decode<T: for<'de> Deserialize<'de>>(what: &str, bytes: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::internal(&format!("the stored {what} is unreadable: {e}")))
}

/// The login `id`.
pub(crate) async fn load(store: &dyn Store, id: &str) -> ApiResult<Option<LoginRecord>> {
    match store.get(LOGINS, id.as_bytes()).await? {
        Some(bytes) => decode(&format!("provider login {id}"), &bytes).map(Some),
        None => Ok(None),
    }
}

/// Every login (of every user), oldest first.
pub(crate) async fn all(store: &dyn Store) -> ApiResult<Vec<LoginRecord>> {
    let mut out = store
        .scan_prefix(LOGINS, b"")
        .await?
        .iter()
        .map(|(_, bytes)| decode::<LoginRecord>("provider login", bytes))
        .collect::<ApiResult<Vec<_>>>()?;
    out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    Ok(out)
}

/// Store a login.
pub(crate) async fn save(store: &dyn Store, login: &LoginRecord) -> ApiResult<()> {
    let bytes = serde_json::to_vec(login).map_err(|e| ApiError::internal(&e))?;
    store.put(LOGINS, login.id.as_bytes(), &bytes).await?;
    Ok(())
}

/// Remove a login's record.
pub(crate) async fn delete(store: &dyn Store, id: &str) -> ApiResult<()> {
    store.delete(LOGINS, id.as_bytes()).await?;
    Ok(())
}

/// A login attached to an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Attached {
    /// Its provider (one login per provider per agent).
    pub(crate) provider: Provider,
    /// The login.
    pub(crate) login: String,
    /// Its owner (who attached it).
    pub(crate) owner: UserId,
    /// When (RFC 3339).
    pub(crate) attached_at: String,
}

/// The logins attached to one agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AgentLogins {
    /// The agent's workspace.
    pub(crate) workspace: WorkspaceId,
    /// One per provider at most.
    pub(crate) items: Vec<Attached>,
}

/// The logins attached to `agent`.
pub(crate) async fn agent_logins(store: &dyn Store, agent: &AgentId) -> ApiResult<Option<AgentLogins>> {
    match store.get(AGENTS, agent.as_str().as_bytes()).await? {
        Some(bytes) => decode(&format!("provider logins of agent {agent}"), &bytes).map(Some),
        None => Ok(None),
    }
}

/// Store an agent's logins (none: the record goes).
pub(crate) async fn save_agent_logins(
    store: &dyn Store,
    agent: &AgentId,
    logins: &AgentLogins,
) -> ApiResult<()> {
    if logins.items.is_empty() {
        store.delete(AGENTS, agent.as_str().as_bytes()).await?;
    } else {
        let bytes = serde_json::to_vec(logins).map_err(|e| ApiError::internal(&e))?;
        store.put(AGENTS, agent.as_str().as_bytes(), &bytes).await?;
    }
    Ok(())
}

/// Every agent with a login attached.
pub(crate) async fn all_agent_logins(store: &dyn Store) -> ApiResult<Vec<(AgentId, AgentLogins)>> {
    let mut out = Vec::new();
    for (key, bytes) in store.scan_prefix(AGENTS, b"").await? {
        let Ok(agent) = AgentId::new(String::from_utf8_lossy(&key).into_owned()) else {
            continue;
        };
        out.push((agent, decode("provider logins of an agent", &bytes)?));
    }
    Ok(out)
}

/// Forget a deleted agent's logins.
pub(crate) async fn forget_agent(store: &dyn Store, agent: &AgentId) {
    if let Err(e) = store.delete(AGENTS, agent.as_str().as_bytes()).await {
        tracing::warn!(agent = %agent, error = %e, "could not forget the agent's provider logins");
    }
}
