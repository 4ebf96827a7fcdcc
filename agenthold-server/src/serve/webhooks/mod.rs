//! Webhooks (P2, S8): a URL that starts a harness run on an agent with the request body as untrusted data.
//!
//! - Table `srv_webhooks`, key `{agent}/{id}`: the hook's settings (harness, argv, instructions), who
//!   created it, the SHA-256 of its URL token and, when HMAC is on, its secret sealed by the vault (the
//!   server must recompute signatures, so the secret is kept recoverably, never in the clear; the vault's
//!   id binds it to workspace, agent and hook).
//! - Table `srv_webhook_tokens`, key the token's SHA-256 (hex): `{agent}/{id}`. A delivery hashes the token
//!   from its URL and looks the hash up, so an unknown token costs the same as a known one up to the answer
//!   and the store never holds a usable URL.
//!
//! Tokens and secrets are 256 bits from the operating system's generator, 64 hex digits, shown once (at
//! create and rotate). A delivery ([`deliver`]) reads at most [`BODY_CAP`] bytes, checks the signature in
//! constant time when the hook has a secret, builds the prompt ([`prompt`]) with a fresh nonce, and starts
//! a run as the hook's creator with origin `webhook`; the creator must still be allowed to operate the
//! agent. Every delivery is audited in the agent's workspace (outcome, size, run), never with its payload.
// enforces: P2, S8

pub(crate) mod prompt;

use agenthold_core::secret::SecretValue;
use agenthold_core::{
    Action, AgentId, AuthzDecision, Credential, Principal, Resource, SecretId, Store, UserId,
};
use agenthold_core::{Vault, WorkspaceId};
use axum::http::HeaderMap;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::api::{ApiError, ApiResult};
use super::records::now_rfc3339;
use super::state::AppState;

const HOOKS: &str = "srv_webhooks";
const TOKENS: &str = "srv_webhook_tokens";

/// Largest delivery body (S8).
pub(crate) const BODY_CAP: usize = 256 * 1024;
/// Most webhooks per agent.
pub(crate) const MAX_PER_AGENT: usize = 32;
/// Our signature header.
pub(crate) const SIGNATURE_HEADER: &str = "x-agenthold-signature-256";
/// GitHub's signature header (same format).
pub(crate) const GITHUB_SIGNATURE_HEADER: &str = "x-hub-signature-256";
/// Attempts at a nonce the payload does not contain (one suffices unless 128 bits were guessed).
const NONCE_TRIES: usize = 4;

/// A webhook as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Webhook {
    /// `wh_…`.
    pub(crate) id: String,
    /// The agent's workspace.
    pub(crate) workspace: WorkspaceId,
    /// The agent whose runs it starts.
    pub(crate) agent: AgentId,
    /// A label for people.
    pub(crate) name: Option<String>,
    /// `claude`, `codex` or `custom`.
    pub(crate) harness: String,
    /// The command of a `custom` harness.
    pub(crate) argv: Option<Vec<String>>,
    /// What the run is told before the payload.
    pub(crate) instructions: Option<String>,
    /// SHA-256 (hex) of the URL token.
    token_hash: String,
    /// The HMAC secret sealed by the vault (base64), when signatures are required.
    sealed_secret: Option<String>,
    /// Who created it (runs start as them).
    pub(crate) created_by: UserId,
    /// When (RFC 3339).
    pub(crate) created_at: String,
    /// When its URL (and secret) last changed.
    pub(crate) rotated_at: Option<String>,
    /// When a delivery last started a run.
    pub(crate) last_delivery_at: Option<String>,
    /// Deliveries that started a run.
    pub(crate) deliveries: u64,
}

impl Webhook {
    /// Whether deliveries must be signed.
    pub(crate) fn hmac(&self) -> bool {
        self.sealed_secret.is_some()
    }
}

/// What a new hook is made of (checked by the API).
#[derive(Debug)]
pub(crate) struct NewWebhook {
    /// Require signatures.
    pub(crate) hmac: bool,
    /// `claude`, `codex` or `custom`.
    pub(crate) harness: String,
    /// The command of a `custom` harness.
    pub(crate) argv: Option<Vec<String>>,
    /// A label.
    pub(crate) name: Option<String>,
    /// What the run is told before the payload.
    pub(crate) instructions: Option<String>,
}

/// The credentials of a hook, shown once.
#[derive(Debug)]
pub(crate) struct Shown {
    /// The URL token (64 hex digits).
    pub(crate) token: String,
    /// The HMAC secret (64 hex digits), when signatures are required.
    pub(crate) secret: Option<String>,
}

fn key(agent: &AgentId, id: &str) -> Vec<u8> {
    format!("{agent}/{id}").into_bytes()
}

/// 256 random bits as 64 hex digits.
fn random_hex32() -> ApiResult<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::internal(&format!("random generator: {e}")))?;
    Ok(hex::encode(bytes))
}

/// A new nonce for the markers: [`prompt::NONCE_BYTES`] random bytes, hex.
fn new_nonce() -> ApiResult<String> {
    let mut bytes = [0u8; prompt::NONCE_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::internal(&format!("random generator: {e}")))?;
    Ok(hex::encode(bytes))
}

fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether `token` has the form of a URL token (64 lower-case hex digits), checked before any lookup.
fn is_well_formed(token: &str) -> bool {
    token.len() == 64 && token.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The vault id of a hook's secret: derived from workspace, agent and hook, so a sealed secret opens for
/// no other hook (and never as a workspace or agent secret, whose ids are derived otherwise).
fn vault_id(hook: &Webhook) -> ApiResult<SecretId> {
    let digest = Sha256::digest(format!(
        "webhook-secret/{}/{}/{}",
        hook.workspace, hook.agent, hook.id
    ));
    SecretId::new(format!("h{}", &hex::encode(digest)[..40])).map_err(|e| ApiError::internal(&e))
}

fn seal_secret(vault: &Vault, hook: &Webhook, secret: &str) -> ApiResult<String> {
    let sealed = vault.seal(&vault_id(hook)?, &[], &SecretValue::from(secret));
    Ok(base64::engine::general_purpose::STANDARD.encode(sealed))
}

fn open_secret(vault: &Vault, hook: &Webhook, sealed: &str) -> ApiResult<SecretValue> {
    let fail = |e: &dyn std::fmt::Display| {
        ApiError::internal(&format!("the secret of webhook {} does not open: {e}", hook.id))
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(sealed)
        .map_err(|e| fail(&e))?;
    vault.open(&vault_id(hook)?, &[], &bytes).map_err(|e| fail(&e))
}

fn decode(bytes: &[u8]) -> ApiResult<Webhook> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::internal(&format!("a stored webhook is unreadable: {e}")))
}

async fn save(store: &dyn Store, hook: &Webhook) -> ApiResult<()> {
    let bytes = serde_json::to_vec(hook).map_err(|e| ApiError::internal(&e))?;
    store.put(HOOKS, &key(&hook.agent, &hook.id), &bytes).await?;
    Ok(())
}

/// The webhooks of `agent`, oldest first.
pub(crate) async fn list(store: &dyn Store, agent: &AgentId) -> ApiResult<Vec<Webhook>> {
    let rows = store.scan_prefix(HOOKS, format!("{agent}/").as_bytes()).await?;
    let mut out = rows
        .iter()
        .map(|(_, b)| decode(b))
        .collect::<ApiResult<Vec<_>>>()?;
    out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.id.cmp(&b.id)));
    Ok(out)
}

/// The webhook `id` of `agent`.
pub(crate) async fn load(store: &dyn Store, agent: &AgentId, id: &str) -> ApiResult<Option<Webhook>> {
    match store.get(HOOKS, &key(agent, id)).await? {
        Some(bytes) => decode(&bytes).map(Some),
        None => Ok(None),
    }
}

/// Give `hook` a new token (and a new secret when it signs), store it, and index the token. The old token
/// stops working when this returns.
async fn issue(state: &AppState, hook: &mut Webhook, hmac: bool) -> ApiResult<Shown> {
    let token = random_hex32()?;
    let secret = if hmac { Some(random_hex32()?) } else { None };
    let old_hash = std::mem::replace(&mut hook.token_hash, hash_token(&token));
    hook.sealed_secret = match &secret {
        Some(s) => Some(seal_secret(&state.vault, hook, s)?),
        None => None,
    };
    save(state.store.as_ref(), hook).await?;
    state
        .store
        .put(TOKENS, hook.token_hash.as_bytes(), &key(&hook.agent, &hook.id))
        .await?;
    if !old_hash.is_empty() {
        state.store.delete(TOKENS, old_hash.as_bytes()).await?;
    }
    Ok(Shown { token, secret })
}

/// Create a webhook on `agent`.
///
/// # Errors
/// 409 past [`MAX_PER_AGENT`]; store errors.
pub(crate) async fn create(
    state: &AppState,
    ws: &WorkspaceId,
    agent: &AgentId,
    user: &UserId,
    new: NewWebhook,
) -> ApiResult<(Webhook, Shown)> {
    let _edits = state.edits.lock().await;
    if list(state.store.as_ref(), agent).await?.len() >= MAX_PER_AGENT {
        return Err(ApiError::conflict(format!(
            "an agent has at most {MAX_PER_AGENT} webhooks"
        )));
    }
    let mut hook = Webhook {
        id: format!("wh_{}", &random_hex32()?[..20]),
        workspace: ws.clone(),
        agent: agent.clone(),
        name: new.name,
        harness: new.harness,
        argv: new.argv,
        instructions: new.instructions,
        token_hash: String::new(),
        sealed_secret: None,
        created_by: user.clone(),
        created_at: now_rfc3339(),
        rotated_at: None,
        last_delivery_at: None,
        deliveries: 0,
    };
    let shown = issue(state, &mut hook, new.hmac).await?;
    Ok((hook, shown))
}

/// A new URL token (and secret, when the hook signs) for webhook `id` of `agent`; `None` when it does not
/// exist.
pub(crate) async fn rotate(
    state: &AppState,
    agent: &AgentId,
    id: &str,
) -> ApiResult<Option<(Webhook, Shown)>> {
    let _edits = state.edits.lock().await;
    let Some(mut hook) = load(state.store.as_ref(), agent, id).await? else {
        return Ok(None);
    };
    let hmac = hook.hmac();
    hook.rotated_at = Some(now_rfc3339());
    let shown = issue(state, &mut hook, hmac).await?;
    Ok(Some((hook, shown)))
}

/// Delete webhook `id` of `agent`; whether it existed.
pub(crate) async fn delete(state: &AppState, agent: &AgentId, id: &str) -> ApiResult<bool> {
    let _edits = state.edits.lock().await;
    let store = state.store.as_ref();
    let Some(hook) = load(store, agent, id).await? else {
        return Ok(false);
    };
    store.delete(TOKENS, hook.token_hash.as_bytes()).await?;
    store.delete(HOOKS, &key(agent, id)).await?;
    Ok(true)
}

/// Delete every webhook of a deleted agent (their URLs answer 404 from now on).
pub(crate) async fn forget_agent(state: &AppState, agent: &AgentId) {
    let result = async {
        for hook in list(state.store.as_ref(), agent).await? {
            delete(state, agent, &hook.id).await?;
        }
        ApiResult::Ok(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(agent = %agent, error = %e, "could not delete the agent's webhooks");
    }
}

/// The hook a URL token belongs to. A malformed token is looked up like any other (as a hash that exists
/// nowhere), so its answer takes the same path.
async fn lookup(store: &dyn Store, token: &str) -> ApiResult<Option<Webhook>> {
    let hash = hash_token(token);
    let Some(at) = store.get(TOKENS, hash.as_bytes()).await? else {
        return Ok(None);
    };
    if !is_well_formed(token) {
        return Ok(None);
    }
    let Some((agent, id)) = std::str::from_utf8(&at).ok().and_then(|s| s.split_once('/')) else {
        return Ok(None);
    };
    let Ok(agent) = AgentId::new(agent) else {
        return Ok(None);
    };
    Ok(load(store, &agent, id).await?.filter(|h| h.token_hash == hash))
}

/// Why a signature was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadSignature {
    /// Neither header.
    Missing,
    /// Not `sha256=` and 64 hex digits.
    Malformed,
    /// Does not match the body.
    Mismatch,
}

impl BadSignature {
    fn reason(self) -> &'static str {
        match self {
            Self::Missing => "signature missing",
            Self::Malformed => "signature malformed",
            Self::Mismatch => "signature does not match",
        }
    }
}

/// Check the HMAC-SHA256 of `body` under `secret` against `X-Agenthold-Signature-256` (or, when that is
/// absent, GitHub's `X-Hub-Signature-256`), `sha256=<64 hex>`, in constant time (`verify_slice`).
pub(crate) fn check_signature(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<(), BadSignature> {
    let value = headers
        .get(SIGNATURE_HEADER)
        .or_else(|| headers.get(GITHUB_SIGNATURE_HEADER))
        .ok_or(BadSignature::Missing)?;
    let hex_part = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().strip_prefix("sha256="))
        .ok_or(BadSignature::Malformed)?;
    if hex_part.len() != 64 {
        return Err(BadSignature::Malformed);
    }
    let expected = hex::decode(hex_part).map_err(|_| BadSignature::Malformed)?;
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).map_err(|_| BadSignature::Mismatch)?;
    mac.update(body);
    mac.verify_slice(&expected).map_err(|_| BadSignature::Mismatch)
}

/// The prompt for `payload`: `instructions` and the payload in a block with a fresh nonce, drawn again
/// in the (128-bit-guess) case that the payload contains it.
pub(crate) fn prompt_for(instructions: &str, payload: &[u8]) -> ApiResult<(String, prompt::Encoding)> {
    for _ in 0..NONCE_TRIES {
        if let Some(built) = prompt::build(instructions, payload, &new_nonce()?) {
            return Ok(built);
        }
    }
    Err(ApiError::internal(
        &"no nonce absent from the payload after several draws",
    ))
}

/// What a delivery reports.
#[derive(Debug)]
pub(crate) struct Delivered {
    /// The run it started.
    pub(crate) run: String,
}

/// Handle `POST /hooks/{token}` once the body was read (at most [`BODY_CAP`] bytes): 404 for a token no
/// hook has, 401 for a missing or bad signature, 403 when the hook's creator may no longer operate the
/// agent, else start the run. Audited in the agent's workspace (without the payload).
pub(crate) async fn deliver(
    state: &AppState,
    hook: Webhook,
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<Delivered> {
    let target = format!("agents/{}/webhooks/{}", hook.agent, hook.id);
    let audit = |result: &'static str, reason: String| {
        let (ws, target) = (hook.workspace.clone(), target.clone());
        async move {
            state
                .audit(
                    &ws,
                    None,
                    "webhook delivery".to_owned(),
                    target,
                    result,
                    Some(reason),
                )
                .await;
        }
    };
    if let Some(sealed) = &hook.sealed_secret {
        let secret = open_secret(&state.vault, &hook, sealed)?;
        if let Err(bad) = check_signature(secret.expose(), headers, body) {
            audit("denied", format!("{}; {} bytes", bad.reason(), body.len())).await;
            return Err(ApiError::new(
                axum::http::StatusCode::UNAUTHORIZED,
                "bad_signature",
                format!(
                    "{}: sign the raw body with HMAC-SHA256 as `X-Agenthold-Signature-256: sha256=<hex>`",
                    bad.reason()
                ),
            ));
        }
    }
    // The run starts as the hook's creator: they must still be allowed to operate the agent.
    let creator = Principal {
        user: hook.created_by.clone(),
        credential: Credential::Token,
    };
    let on = Resource::Agent {
        workspace: hook.workspace.clone(),
        agent: hook.agent.clone(),
    };
    if state.authz.check(&creator, Action::Operate, &on).await? != AuthzDecision::Allow {
        audit(
            "denied",
            "the webhook's creator may no longer operate the agent".to_owned(),
        )
        .await;
        return Err(ApiError::forbidden(
            "the webhook's creator may no longer run this agent; an agent admin can make a new webhook",
        ));
    }
    let (prompt, encoding) = prompt_for(hook.instructions.as_deref().unwrap_or(""), body)?;
    let started = run::start(state, &hook, prompt).await;
    let run = match started {
        Ok(run) => run,
        Err(e) => {
            audit(
                "failed",
                format!("the run did not start ({}); {} bytes", e.status(), body.len()),
            )
            .await;
            return Err(e);
        }
    };
    let encoded = match encoding {
        prompt::Encoding::Text => "text",
        prompt::Encoding::Base64 => "base64",
    };
    audit("ok", format!("run {run}; {} bytes ({encoded})", body.len())).await;
    record_delivery(state, &hook.agent, &hook.id).await;
    Ok(Delivered { run })
}

/// Count a delivery (best effort). Under [`AppState::edits`], as rotate and delete, so a count never
/// brings back an old token hash or a deleted hook.
async fn record_delivery(state: &AppState, agent: &AgentId, id: &str) {
    let _edits = state.edits.lock().await;
    let store = state.store.as_ref();
    if let Ok(Some(mut hook)) = load(store, agent, id).await {
        hook.deliveries += 1;
        hook.last_delivery_at = Some(now_rfc3339());
        if let Err(e) = save(store, &hook).await {
            tracing::warn!(webhook = %id, error = %e, "could not record a delivery");
        }
    }
}

/// The hook of a URL token, for [`deliver`].
pub(crate) async fn find(state: &AppState, token: &str) -> ApiResult<Option<Webhook>> {
    lookup(state.store.as_ref(), token).await
}

mod run;

#[cfg(test)]
mod tests;
