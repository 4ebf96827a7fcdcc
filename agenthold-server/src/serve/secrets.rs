//! Workspace secrets as the server keeps them (E10, E12, S15), and which agents they are attached to.
//!
//! - Table `srv_secrets`, key `{workspace}/{secret id}`: name, rules (hosts, header, template), the preset
//!   they came from, a revision counter, and the value sealed by the vault. The vault's AAD binds the value
//!   to an id derived from workspace and secret id *and* to the rules, so a store writer without the master
//!   key can neither move a value to another secret or workspace nor point it at other hosts (S15).
//! - Table `srv_agent_secrets`, key agent id: the workspace secrets attached to that agent, each with its
//!   environment variable and the secret's revision last applied.
//!
//! The runtime keeps its own record of each agent's secrets (values sealed again under the agent, E10) and
//! takes it over after a restart; the server applies an agent's whole set with `Runtime::set_secrets`
//! whenever an attachment or an attached secret changes. [`reconcile`] repairs what a crash between the
//! two writes left behind: at start, an agent whose applied revisions or names differ from the runtime's
//! record gets its set applied again.
// enforces: E10 E12 S15

use agenthold_core::secret::{Placeholder, Preset, SecretRule, SecretSpec, SecretValue};
use agenthold_core::{AgentId, SecretId, Store, UserId, Vault, WorkspaceId};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::api::{ApiError, ApiResult};
use super::state::AppState;

const SECRETS: &str = "srv_secrets";
const ATTACHMENTS: &str = "srv_agent_secrets";

/// A secret of a workspace.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WorkspaceSecret {
    /// Its id.
    pub(crate) id: SecretId,
    /// Its workspace.
    pub(crate) workspace: WorkspaceId,
    /// Its name, unique in the workspace; also its name in every agent it is attached to.
    pub(crate) name: String,
    /// The preset its rules came from, if any.
    pub(crate) preset: Option<Preset>,
    /// Where it may be injected.
    pub(crate) rules: Vec<SecretRule>,
    /// The vault's sealed value, base64.
    sealed: String,
    /// Counts changes of value or rules (1 at creation).
    pub(crate) revision: u64,
    /// Who created it.
    pub(crate) created_by: UserId,
    /// When (RFC 3339).
    pub(crate) created_at: String,
    /// When its value or rules last changed (RFC 3339).
    pub(crate) updated_at: String,
}

impl WorkspaceSecret {
    /// A new secret with `value` sealed.
    pub(crate) fn new(
        vault: &Vault,
        workspace: WorkspaceId,
        name: String,
        preset: Option<Preset>,
        rules: Vec<SecretRule>,
        value: &SecretValue,
        created_by: UserId,
    ) -> ApiResult<Self> {
        let now = super::records::now_rfc3339();
        let mut secret = Self {
            id: SecretId::random(),
            workspace,
            name,
            preset,
            rules,
            sealed: String::new(),
            revision: 1,
            created_by,
            created_at: now.clone(),
            updated_at: now,
        };
        secret.seal(vault, value)?;
        Ok(secret)
    }

    /// The vault's id of this secret: derived from workspace and id, so a value sealed for one never opens
    /// for another (and never as one of the runtime's per-agent secrets, whose ids are derived otherwise).
    fn vault_id(&self) -> ApiResult<SecretId> {
        let digest = Sha256::digest(format!("workspace-secret/{}/{}", self.workspace, self.id).as_bytes());
        SecretId::new(format!("w{}", &hex::encode(digest)[..40])).map_err(|e| ApiError::internal(&e))
    }

    /// Seal `value` under the secret's id and its current rules.
    pub(crate) fn seal(&mut self, vault: &Vault, value: &SecretValue) -> ApiResult<()> {
        let sealed = vault.seal(&self.vault_id()?, &self.rules, value);
        self.sealed = base64::engine::general_purpose::STANDARD.encode(sealed);
        Ok(())
    }

    /// The value, opened under the secret's id and its stored rules. A record changed outside agenthold
    /// (rules, value, id or workspace) does not open: a 500 whose logged cause names the secret, never a
    /// value.
    pub(crate) fn open(&self, vault: &Vault) -> ApiResult<SecretValue> {
        let fail = |problem: &dyn std::fmt::Display| {
            ApiError::internal(&format!(
                "workspace secret {} ({}) of workspace {} does not open: {problem}",
                self.id, self.name, self.workspace
            ))
        };
        let sealed = base64::engine::general_purpose::STANDARD
            .decode(&self.sealed)
            .map_err(|e| fail(&e))?;
        vault
            .open(&self.vault_id()?, &self.rules, &sealed)
            .map_err(|e| fail(&e))
    }
}

fn secret_key(ws: &WorkspaceId, id: &SecretId) -> Vec<u8> {
    format!("{ws}/{id}").into_bytes()
}

fn decode<T: for<'de> Deserialize<'de>>(what: &str, bytes: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::internal(&format!("the stored {what} is unreadable: {e}")))
}

/// The secret `id` of workspace `ws`.
pub(crate) async fn load(
    store: &dyn Store,
    ws: &WorkspaceId,
    id: &SecretId,
) -> ApiResult<Option<WorkspaceSecret>> {
    match store.get(SECRETS, &secret_key(ws, id)).await? {
        Some(bytes) => decode(&format!("workspace secret {id}"), &bytes).map(Some),
        None => Ok(None),
    }
}

/// Every secret of `ws`, by name.
pub(crate) async fn list(store: &dyn Store, ws: &WorkspaceId) -> ApiResult<Vec<WorkspaceSecret>> {
    let rows = store.scan_prefix(SECRETS, format!("{ws}/").as_bytes()).await?;
    let mut out = rows
        .iter()
        .map(|(_, bytes)| decode::<WorkspaceSecret>("workspace secret", bytes))
        .collect::<ApiResult<Vec<_>>>()?;
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Store a secret (durable on return).
pub(crate) async fn save(store: &dyn Store, secret: &WorkspaceSecret) -> ApiResult<()> {
    let bytes = serde_json::to_vec(secret).map_err(|e| ApiError::internal(&e))?;
    store
        .put(SECRETS, &secret_key(&secret.workspace, &secret.id), &bytes)
        .await?;
    Ok(())
}

/// Remove a secret's record.
pub(crate) async fn delete(store: &dyn Store, ws: &WorkspaceId, id: &SecretId) -> ApiResult<()> {
    store.delete(SECRETS, &secret_key(ws, id)).await?;
    Ok(())
}

/// A workspace secret attached to an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Attachment {
    /// The workspace secret.
    pub(crate) secret: SecretId,
    /// The variable that holds its placeholder in the sandbox, if any (E12).
    pub(crate) env: Option<String>,
    /// The secret's revision last applied to the agent.
    pub(crate) revision: u64,
    /// When it was attached (RFC 3339).
    pub(crate) attached_at: String,
}

/// The workspace secrets attached to one agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Attachments {
    /// The agent's workspace (where its secrets live).
    pub(crate) workspace: WorkspaceId,
    /// Attached secrets, in the order they were attached.
    pub(crate) items: Vec<Attachment>,
}

/// The attachments of `agent` (none: an empty list in `ws`).
pub(crate) async fn attachments(
    store: &dyn Store,
    ws: &WorkspaceId,
    agent: &AgentId,
) -> ApiResult<Attachments> {
    match store.get(ATTACHMENTS, agent.as_str().as_bytes()).await? {
        Some(bytes) => decode(&format!("secret attachments of agent {agent}"), &bytes),
        None => Ok(Attachments {
            workspace: ws.clone(),
            items: Vec::new(),
        }),
    }
}

/// Store an agent's attachments (an empty list removes the record).
pub(crate) async fn save_attachments(
    store: &dyn Store,
    agent: &AgentId,
    atts: &Attachments,
) -> ApiResult<()> {
    if atts.items.is_empty() {
        store.delete(ATTACHMENTS, agent.as_str().as_bytes()).await?;
    } else {
        let bytes = serde_json::to_vec(atts).map_err(|e| ApiError::internal(&e))?;
        store.put(ATTACHMENTS, agent.as_str().as_bytes(), &bytes).await?;
    }
    Ok(())
}

/// Forget a deleted agent's attachments.
pub(crate) async fn forget_agent(store: &dyn Store, agent: &AgentId) {
    if let Err(e) = store.delete(ATTACHMENTS, agent.as_str().as_bytes()).await {
        tracing::warn!(agent = %agent, error = %e, "could not remove the agent's secret attachments");
    }
}

/// Forget every secret of a deleted workspace.
pub(crate) async fn forget_workspace(store: &dyn Store, ws: &WorkspaceId) -> ApiResult<()> {
    for (key, _) in store.scan_prefix(SECRETS, format!("{ws}/").as_bytes()).await? {
        store.delete(SECRETS, &key).await?;
    }
    Ok(())
}

/// The agents of `ws` that `secret` is attached to, with their attachments.
pub(crate) async fn attached_to(
    state: &AppState,
    ws: &WorkspaceId,
    secret: &SecretId,
) -> ApiResult<Vec<(AgentId, Attachments)>> {
    let mut out = Vec::new();
    for agent in state.dir.agents_in(ws).await? {
        let atts = attachments(state.store.as_ref(), ws, &agent).await?;
        if atts.items.iter().any(|a| a.secret == *secret) {
            out.push((agent, atts));
        }
    }
    Ok(out)
}

/// Apply `atts` as `agent`'s whole secret set in the runtime (values opened here, handed over, and
/// zeroized when the runtime's copies are dropped), then store them with the revisions applied. A secret
/// that no longer exists is dropped from the set. Returns the placeholders, by secret name.
///
/// Callers hold [`AppState::edits`].
pub(crate) async fn apply(
    state: &AppState,
    agent: &AgentId,
    mut atts: Attachments,
) -> ApiResult<Vec<Placeholder>> {
    let mut specs = Vec::with_capacity(atts.items.len());
    let mut kept = Vec::with_capacity(atts.items.len());
    for mut item in atts.items {
        let Some(secret) = load(state.store.as_ref(), &atts.workspace, &item.secret).await? else {
            continue;
        };
        let value = secret.open(&state.vault)?;
        specs.push(SecretSpec::new(
            &secret.name,
            value,
            item.env.as_deref(),
            secret.rules.clone(),
        )?);
        item.revision = secret.revision;
        kept.push(item);
    }
    atts.items = kept;
    // The provider logins attached to the agent are agent secrets too (E15).
    specs.extend(super::harness_logins::specs_for(state, agent).await?);
    let placeholders = state.runtime.set_secrets(agent, specs).await?;
    save_attachments(state.store.as_ref(), agent, &atts).await?;
    Ok(placeholders)
}

/// At start: every agent whose attachments the runtime's record does not reflect (a secret changed or
/// removed after the set was applied, another set of names or variables) gets its set applied again.
/// Problems are logged; the server starts anyway.
pub(crate) async fn reconcile(state: &AppState) {
    let rows = match state.store.scan_prefix(ATTACHMENTS, b"").await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the secret attachments");
            return;
        }
    };
    let _edits = state.edits.lock().await;
    for (key, bytes) in rows {
        let Ok(agent) = AgentId::new(String::from_utf8_lossy(&key).into_owned()) else {
            continue;
        };
        let result = async {
            let atts: Attachments = decode("secret attachments", &bytes)?;
            if in_step(state, &agent, &atts).await? {
                return Ok(false);
            }
            apply(state, &agent, atts).await.map(|_| true)
        }
        .await;
        match result {
            Ok(true) => tracing::info!(agent = %agent, "secrets applied again after a restart"),
            Ok(false) => {}
            Err(e) => tracing::warn!(agent = %agent, error = %e, "could not apply the agent's secrets"),
        }
    }
}

/// Whether the runtime's record of `agent` matches `atts`: same names and variables, every revision the
/// current one.
async fn in_step(state: &AppState, agent: &AgentId, atts: &Attachments) -> ApiResult<bool> {
    let mut want = Vec::new();
    for item in &atts.items {
        match load(state.store.as_ref(), &atts.workspace, &item.secret).await? {
            Some(secret) if secret.revision == item.revision => want.push((secret.name, item.env.clone())),
            _ => return Ok(false),
        }
    }
    for spec in super::harness_logins::specs_for(state, agent).await? {
        want.push((spec.name, None));
    }
    let mut have: Vec<_> = state
        .runtime
        .agent_secrets(agent)
        .await?
        .into_iter()
        .map(|p| (p.name, p.env))
        .collect();
    want.sort();
    have.sort();
    Ok(want == have)
}
