//! Provider logins (S3, E15): a user connects their Claude or ChatGPT account from a browser session (the
//! server runs the provider's OAuth flow with PKCE; the user pastes the code back), owns it, and attaches
//! it to agents they administer. Not the browser login providers of `serve/providers`.
//!
//! On an agent, a login is two agent secrets next to the workspace secrets attached there (applied
//! together by [`crate::serve::secrets::apply`]): the access token with a login rule (replaced only inside
//! `Authorization`, only on the API paths) and the refresh token with a token-refresh rule on the
//! provider's token path (the gateway answers the harness's refresh itself). The sandbox gets the
//! harness's credential file with their placeholders ([`credfile`]).
//!
//! Refreshes: the runtime tells [`Logins`] about every rotated token ([`install`]); the new values are
//! kept at once in memory (so an agent attached next gets them) and sealed into the login's record
//! behind. Every agent the login is attached to is in one refresh group of the gateway's secret table:
//! one refresh of a login at a time, and a refresh through one agent renews the tokens of all of them.
//!
//! The owner must administer the agent for as long as the login stays attached: checked on every grant
//! and membership change, before a run, and every `harness_logins.recheck_secs`; a failed check detaches.
// enforces: S3 E15

mod credfile;
mod oauth;
pub(crate) mod record;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use agenthold_core::config::ProviderLoginConfig;
use agenthold_core::secret::{SecretSpec, SecretValue};
use agenthold_core::{
    Action, AgentId, AuthzDecision, Credential, Principal, Resource, SecretRule, UserId, WorkspaceId,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;
use zeroize::Zeroizing;

pub(crate) use oauth::{authorize_url, exchange, new_login_id, parse_pasted, random_value, state_hash};
use record::{AgentLogins, Attached, LoginRecord, Tokens};

use super::api::{ApiError, ApiResult};
use super::providers::http::Client;
use super::state::AppState;

/// A provider whose account a harness can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Provider {
    /// A Claude (claude.ai) account, for the `claude` harness.
    Claude,
    /// A ChatGPT account, for the `codex` harness.
    Chatgpt,
}

impl Provider {
    /// `claude` or `chatgpt`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Claude => "claude",
            Self::Chatgpt => "chatgpt",
        }
    }

    /// Its configuration.
    pub(crate) fn config(self, state: &AppState) -> &ProviderLoginConfig {
        match self {
            Self::Claude => &state.config.harness_logins.claude,
            Self::Chatgpt => &state.config.harness_logins.chatgpt,
        }
    }

    /// The provider whose account `harness` (`claude`, `codex`) uses.
    pub(crate) fn of_harness(harness: &str) -> Option<Self> {
        match harness {
            "claude" => Some(Self::Claude),
            "codex" => Some(Self::Chatgpt),
            _ => None,
        }
    }

    /// The agent secret that holds the access token.
    pub(crate) fn access_secret(self) -> String {
        format!("provider-login.{}", self.as_str())
    }

    /// The agent secret that holds the refresh token.
    pub(crate) fn refresh_secret(self) -> String {
        format!("provider-login.{}.refresh", self.as_str())
    }

    /// The provider and whether it is the refresh token, of an agent secret's name.
    fn of_secret(name: &str) -> Option<(Self, bool)> {
        [Self::Claude, Self::Chatgpt].into_iter().find_map(|p| {
            if name == p.access_secret() {
                Some((p, false))
            } else if name == p.refresh_secret() {
                Some((p, true))
            } else {
                None
            }
        })
    }
}

/// The newest tokens of a login, kept until its record has them.
#[derive(Default)]
struct Latest {
    access: Option<Zeroizing<String>>,
    refresh: Option<Zeroizing<String>>,
}

/// The server's provider-login state besides the store.
pub(crate) struct Logins {
    /// The HTTP client for token endpoints.
    pub(crate) client: Client,
    /// Tokens rotated by refreshes, by login id, until sealed into the record.
    latest: Mutex<HashMap<String, Latest>>,
    /// Which login each agent uses per provider (a copy of the store's, for the refresh listener).
    attached: Mutex<HashMap<(AgentId, Provider), String>>,
    /// Held while a login's record is read, changed and stored.
    pub(crate) record_lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Logins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Logins")
    }
}

impl Logins {
    /// Empty state with a client for the token endpoints.
    pub(crate) fn new() -> anyhow::Result<Self> {
        Ok(Self {
            client: Client::new()?,
            latest: Mutex::default(),
            attached: Mutex::default(),
            record_lock: tokio::sync::Mutex::new(()),
        })
    }

    fn login_of(&self, agent: &AgentId, provider: Provider) -> Option<String> {
        self.attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(agent.clone(), provider))
            .cloned()
    }

    /// The tokens of `login`: the record's, with whatever a refresh rotated since.
    fn tokens(&self, vault: &agenthold_core::Vault, login: &LoginRecord) -> ApiResult<Tokens> {
        let mut tokens = login.open(vault)?;
        let latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(l) = latest.get(&login.id) {
            if let Some(a) = &l.access {
                tokens.access_token = a.to_string();
            }
            if let Some(r) = &l.refresh {
                tokens.refresh_token = r.to_string();
            }
        }
        Ok(tokens)
    }
}

/// Listen to the runtime's token refreshes, restore what the store says is attached (refresh groups
/// included), and check ownership every `harness_logins.recheck_secs` until `shutdown`.
pub(crate) async fn install(state: &AppState, shutdown: CancellationToken) {
    let (logins, store, vault) = (
        Arc::clone(&state.logins),
        Arc::clone(&state.store),
        Arc::clone(&state.vault),
    );
    let handle = tokio::runtime::Handle::current();
    state.runtime.on_token_refresh(Arc::new(move |agent: &AgentId, name: &str, value: &SecretValue| {
        let Some((provider, is_refresh)) = Provider::of_secret(name) else {
            return;
        };
        let Some(login) = logins.login_of(agent, provider) else {
            return;
        };
        let Ok(text) = std::str::from_utf8(value.expose()) else {
            return;
        };
        {
            let mut latest = logins.latest.lock().unwrap_or_else(PoisonError::into_inner);
            let entry = latest.entry(login.clone()).or_default();
            let slot = if is_refresh { &mut entry.refresh } else { &mut entry.access };
            *slot = Some(Zeroizing::new(text.to_owned()));
        }
        let (logins, store, vault) = (Arc::clone(&logins), Arc::clone(&store), Arc::clone(&vault));
        handle.spawn(async move {
            if let Err(e) = persist(&logins, store.as_ref(), &vault, &login).await {
                tracing::error!(login = %login, error = %e.detail(), "could not store a provider login's refreshed tokens");
            }
        });
    }));
    match record::all_agent_logins(state.store.as_ref()).await {
        Ok(rows) => {
            for (agent, logins) in rows {
                for item in &logins.items {
                    remember(state, &agent, item.provider, Some(&item.login));
                }
            }
        }
        Err(e) => tracing::warn!(error = %e.detail(), "could not read the agents' provider logins"),
    }
    let state = state.clone();
    tokio::spawn(async move {
        let every = std::time::Duration::from_secs(state.config.harness_logins.recheck_secs);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            recheck(&state, None).await;
        }
    });
}

/// Seal the newest tokens of `login` into its record.
async fn persist(
    logins: &Logins,
    store: &dyn agenthold_core::Store,
    vault: &agenthold_core::Vault,
    login: &str,
) -> ApiResult<()> {
    let _records = logins.record_lock.lock().await;
    let Some(mut rec) = record::load(store, login).await? else {
        return Ok(());
    };
    if !rec.connected() {
        return Ok(());
    }
    let tokens = logins.tokens(vault, &rec)?;
    rec.seal(vault, &tokens)?;
    if let Some(meta) = rec.meta.as_mut() {
        meta.last_refresh = super::records::now_rfc3339();
    }
    record::save(store, &rec).await
}

/// Note (or forget, with `None`) which login `agent` uses for `provider`, and its refresh group.
fn remember(state: &AppState, agent: &AgentId, provider: Provider, login: Option<&str>) {
    {
        let mut attached = state
            .logins
            .attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match login {
            Some(l) => attached.insert((agent.clone(), provider), l.to_owned()),
            None => attached.remove(&(agent.clone(), provider)),
        };
    }
    if let Some(table) = state.runtime.secrets() {
        table.set_refresh_group(
            agent,
            &provider.refresh_secret(),
            login.map(|l| format!("provider-login/{l}")),
        );
    }
}

/// The agent secrets of the logins attached to `agent` (for [`crate::serve::secrets::apply`]).
pub(crate) async fn specs_for(state: &AppState, agent: &AgentId) -> ApiResult<Vec<SecretSpec>> {
    let Some(logins) = record::agent_logins(state.store.as_ref(), agent).await? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for item in &logins.items {
        let Some(login) = record::load(state.store.as_ref(), &item.login).await? else {
            continue;
        };
        if !login.connected() {
            continue;
        }
        let tokens = state.logins.tokens(&state.vault, &login)?;
        let cfg = item.provider.config(state);
        let bad = |e: agenthold_core::Error| ApiError::internal(&format!("provider login rules: {e}"));
        out.push(
            SecretSpec::new(
                &item.provider.access_secret(),
                SecretValue::from(tokens.access_token.as_str()),
                None,
                vec![SecretRule::login(&cfg.api_hosts, "authorization", &cfg.api_paths).map_err(bad)?],
            )
            .map_err(bad)?,
        );
        out.push(
            SecretSpec::new(
                &item.provider.refresh_secret(),
                SecretValue::from(tokens.refresh_token.as_str()),
                None,
                vec![
                    SecretRule::token_refresh(
                        &[cfg.refresh_host()],
                        &cfg.refresh_path(),
                        &item.provider.access_secret(),
                    )
                    .map_err(bad)?,
                ],
            )
            .map_err(bad)?,
        );
    }
    Ok(out)
}

/// Apply `agent`'s whole secret set again (workspace secrets and logins). Callers hold `state.edits`.
async fn reapply(
    state: &AppState,
    ws: &WorkspaceId,
    agent: &AgentId,
) -> ApiResult<Vec<agenthold_core::secret::Placeholder>> {
    let atts = super::secrets::attachments(state.store.as_ref(), ws, agent).await?;
    super::secrets::apply(state, agent, atts).await
}

/// Whether `user` administers `agent`.
pub(crate) async fn administers(
    state: &AppState,
    user: &UserId,
    ws: &WorkspaceId,
    agent: &AgentId,
) -> ApiResult<bool> {
    let principal = Principal {
        user: user.clone(),
        credential: Credential::Session,
    };
    let on = Resource::Agent {
        workspace: ws.clone(),
        agent: agent.clone(),
    };
    Ok(state.authz.check(&principal, Action::Administer, &on).await? == AuthzDecision::Allow)
}

/// Attach `login` (owned by `user`, who administers the agent: checked by the caller) to `agent`,
/// replacing the agent's login of the same provider.
pub(crate) async fn attach(
    state: &AppState,
    user: &UserId,
    ws: &WorkspaceId,
    agent: &AgentId,
    login: &str,
) -> ApiResult<LoginRecord> {
    let _edits = state.edits.lock().await;
    let rec = record::load(state.store.as_ref(), login)
        .await?
        .filter(|l| l.owner == *user && l.connected())
        .ok_or_else(|| ApiError::bad_request("login: no connected provider login of yours has this id"))?;
    if !administers(state, user, ws, agent).await? {
        return Err(ApiError::forbidden(
            "a provider login is attached only by its owner, on an agent they administer",
        ));
    }
    let mut logins = record::agent_logins(state.store.as_ref(), agent)
        .await?
        .unwrap_or_else(|| AgentLogins {
            workspace: ws.clone(),
            items: Vec::new(),
        });
    logins.items.retain(|i| i.provider != rec.provider);
    logins.items.push(Attached {
        provider: rec.provider,
        login: rec.id.clone(),
        owner: user.clone(),
        attached_at: super::records::now_rfc3339(),
    });
    record::save_agent_logins(state.store.as_ref(), agent, &logins).await?;
    remember(state, agent, rec.provider, Some(&rec.id));
    let placeholders = match reapply(state, ws, agent).await {
        Ok(p) => p,
        Err(e) => {
            // Undo: the agent keeps what it had.
            logins.items.retain(|i| i.login != rec.id);
            record::save_agent_logins(state.store.as_ref(), agent, &logins).await?;
            remember(state, agent, rec.provider, None);
            return Err(e);
        }
    };
    write_file(state, agent, &rec, &placeholders).await;
    state
        .audit(
            ws,
            Some((user, Credential::Session)),
            "provider_login.attach".into(),
            format!("agent/{agent}"),
            "ok",
            Some(format!("{} login {}", rec.provider.as_str(), rec.id)),
        )
        .await;
    Ok(rec)
}

/// Write the credential file of `rec` into `agent` from its placeholders; problems are logged (the file
/// is written again before the next run).
async fn write_file(
    state: &AppState,
    agent: &AgentId,
    rec: &LoginRecord,
    placeholders: &[agenthold_core::secret::Placeholder],
) {
    let find = |name: String| {
        placeholders
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.placeholder.clone())
    };
    let (Some(access), Some(refresh), Some(meta)) = (
        find(rec.provider.access_secret()),
        find(rec.provider.refresh_secret()),
        rec.meta.as_ref(),
    ) else {
        tracing::warn!(agent = %agent, login = %rec.id, "provider login attached without its placeholders");
        return;
    };
    let data = credfile::content(rec.provider, meta, &access, &refresh);
    if let Err(e) = credfile::write(state, agent, rec.provider, data).await {
        tracing::warn!(agent = %agent, error = %e.detail(), "could not write the provider login's file");
    }
}

/// Detach `agent`'s login of `provider` (every provider: `None`); `why` goes to the audit log. Callers
/// must not hold `state.edits`.
pub(crate) async fn detach(
    state: &AppState,
    agent: &AgentId,
    provider: Option<Provider>,
    actor: Option<(&UserId, Credential)>,
    why: &str,
) -> ApiResult<bool> {
    let _edits = state.edits.lock().await;
    detach_locked(state, agent, provider, actor, why).await
}

async fn detach_locked(
    state: &AppState,
    agent: &AgentId,
    provider: Option<Provider>,
    actor: Option<(&UserId, Credential)>,
    why: &str,
) -> ApiResult<bool> {
    let Some(mut logins) = record::agent_logins(state.store.as_ref(), agent).await? else {
        return Ok(false);
    };
    let (gone, kept): (Vec<Attached>, Vec<Attached>) = logins
        .items
        .drain(..)
        .partition(|i| provider.is_none_or(|p| p == i.provider));
    if gone.is_empty() {
        logins.items = kept;
        return Ok(false);
    }
    logins.items = kept;
    record::save_agent_logins(state.store.as_ref(), agent, &logins).await?;
    for item in &gone {
        remember(state, agent, item.provider, None);
    }
    if let Err(e) = reapply(state, &logins.workspace, agent).await {
        // The record no longer lists the login: the next apply (or a restart's reconcile) drops its secrets.
        tracing::error!(agent = %agent, error = %e.detail(), "could not remove a detached provider login's secrets");
    }
    for item in &gone {
        credfile::remove(state, agent, item.provider).await;
        state
            .audit(
                &logins.workspace,
                actor,
                "provider_login.detach".into(),
                format!("agent/{agent}"),
                "ok",
                Some(format!("{} login {}: {why}", item.provider.as_str(), item.login)),
            )
            .await;
    }
    Ok(true)
}

/// Detach every attachment whose owner no longer administers its agent (in workspace `ws`, or
/// everywhere). Fails closed: an agent whose check fails is detached too.
pub(crate) async fn recheck(state: &AppState, ws: Option<&WorkspaceId>) {
    let rows = match record::all_agent_logins(state.store.as_ref()).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e.detail(), "could not read the agents' provider logins");
            return;
        }
    };
    for (agent, logins) in rows {
        if ws.is_some_and(|w| *w != logins.workspace) {
            continue;
        }
        recheck_agent(state, &logins.workspace, &agent, &logins).await;
    }
}

async fn recheck_agent(state: &AppState, ws: &WorkspaceId, agent: &AgentId, logins: &AgentLogins) {
    for item in &logins.items {
        let keep = administers(state, &item.owner, ws, agent).await.unwrap_or(false);
        if !keep
            && let Err(e) = detach(
                state,
                agent,
                Some(item.provider),
                None,
                "the owner no longer administers the agent",
            )
            .await
        {
            tracing::error!(agent = %agent, error = %e.detail(), "could not detach a provider login");
        }
    }
}

/// Before a run of `harness` on `agent`: detach logins whose owner lost admin (fail closed), then make sure
/// the harness's credential file is there when a login of its provider is attached.
pub(crate) async fn before_run(
    state: &AppState,
    ws: &WorkspaceId,
    agent: &AgentId,
    harness: &str,
) -> ApiResult<()> {
    let Some(logins) = record::agent_logins(state.store.as_ref(), agent).await? else {
        return Ok(());
    };
    recheck_agent(state, ws, agent, &logins).await;
    let Some(provider) = Provider::of_harness(harness) else {
        return Ok(());
    };
    let Some(login) = state.logins.login_of(agent, provider) else {
        return Ok(());
    };
    let Some(rec) = record::load(state.store.as_ref(), &login).await? else {
        return Ok(());
    };
    let present = state
        .runtime
        .read_file(agent, credfile::path(provider))
        .await
        .is_ok();
    if !present {
        let placeholders = state.runtime.agent_secrets(agent).await?;
        write_file(state, agent, &rec, &placeholders).await;
    }
    Ok(())
}

/// Withdraw `login` (its owner's call): detached from every agent, then deleted.
pub(crate) async fn withdraw(
    state: &AppState,
    owner: &UserId,
    credential: Credential,
    login: &str,
) -> ApiResult<bool> {
    let Some(rec) = record::load(state.store.as_ref(), login)
        .await?
        .filter(|l| l.owner == *owner)
    else {
        return Ok(false);
    };
    for (agent, logins) in record::all_agent_logins(state.store.as_ref()).await? {
        if let Some(item) = logins.items.iter().find(|i| i.login == rec.id) {
            detach(
                state,
                &agent,
                Some(item.provider),
                Some((owner, credential)),
                "withdrawn by its owner",
            )
            .await?;
        }
    }
    let _records = state.logins.record_lock.lock().await;
    record::delete(state.store.as_ref(), &rec.id).await?;
    state
        .logins
        .latest
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&rec.id);
    Ok(true)
}

/// The agents `login` is attached to.
pub(crate) async fn agents_of(state: &AppState, login: &str) -> ApiResult<Vec<(WorkspaceId, AgentId)>> {
    Ok(record::all_agent_logins(state.store.as_ref())
        .await?
        .into_iter()
        .filter(|(_, l)| l.items.iter().any(|i| i.login == login))
        .map(|(a, l)| (l.workspace, a))
        .collect())
}

/// The logins attached to `agent`.
pub(crate) async fn of_agent(state: &AppState, agent: &AgentId) -> ApiResult<Vec<Attached>> {
    Ok(record::agent_logins(state.store.as_ref(), agent)
        .await?
        .map(|l| l.items)
        .unwrap_or_default())
}

/// Forget a deleted agent's logins.
pub(crate) async fn forget_agent(state: &AppState, agent: &AgentId) {
    if let Ok(Some(logins)) = record::agent_logins(state.store.as_ref(), agent).await {
        for item in &logins.items {
            remember(state, agent, item.provider, None);
        }
    }
    record::forget_agent(state.store.as_ref(), agent).await;
}
