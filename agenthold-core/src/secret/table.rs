//! [`SecretTable`], the default [`SecretInjector`]: per agent, the attached secrets, their placeholders,
//! where each placeholder may be replaced, and the redactor for answers.
//!
//! On a request to a host one of the agent's rules covers, over TLS whose SNI equals the request's host
//! (E13 as amended):
//! - a header rule sets its header from the template, and replaces the placeholder by the value only in the
//!   further headers (raw) and query parameters (percent-encoded) its `also_in` names, never in the path;
//! - a login rule replaces it only inside its one header, never adds that header, and only on its path
//!   prefixes, checked on paths in normal form only (E15);
//! - a placeholder anywhere else in that request (another header or a header name, the path, an unnamed
//!   query parameter, a cookie, a percent-encoded or case-changed form) is a leak attempt: refused with
//!   403 `placeholder_misplaced`, whatever the leak guard says.
//!
//! A placeholder on its way to a host outside its secret's rules, or over plain HTTP, is a leak: refused
//! with 403 `placeholder_leak`, or only reported when the leak guard is `log`. Request bodies are never
//! looked at. Every answer from an intercepted host goes through the agent's [`Redactor`] (E19).
// enforces: E12 E13

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, PoisonError, RwLock};

use zeroize::Zeroizing;

use super::placement::{Finder, Hit, Place, is_normal_path, replace_in_query, split_query};
use super::redact::{RedactSource, Redactor};
use super::{
    InjectOutcome, RequestHead, RuleKind, SecretInjector, SecretSpec, SecretValue, header_value_problem,
    new_placeholder,
};
use crate::config::LeakGuard;
use crate::ids::AgentId;
use crate::policy::DenyReason;

/// Values a token refresh replaced that the redactor keeps looking for (an old access token stays valid
/// for a while, and an upstream may still quote it).
const RETIRED_KEPT: usize = 2;

/// A secret's placeholder as the sandbox sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placeholder {
    /// The secret's name.
    pub name: String,
    /// The environment variable that carries the placeholder, if any.
    pub env: Option<String>,
    /// The placeholder (`agenthold-placeholder-…`).
    pub placeholder: String,
}

#[derive(Debug, Clone)]
struct Attached {
    spec: SecretSpec,
    placeholder: String,
    /// Earlier values replaced by token refreshes, newest last.
    retired: Vec<SecretValue>,
}

/// One agent's secrets and what is derived from them once, when they change.
#[derive(Debug)]
struct AgentSecrets {
    attached: Vec<Attached>,
    /// Finds the placeholders in request heads; secret `i` is `attached[i]`.
    finder: Option<Finder>,
    /// Scrubs every form of every value from answers.
    redactor: Option<Arc<Redactor>>,
}

impl AgentSecrets {
    fn new(attached: Vec<Attached>) -> Self {
        let finder = Finder::new(attached.iter().map(|a| a.placeholder.clone()).collect());
        let mut sources = Vec::new();
        for a in &attached {
            let rendered: Vec<Zeroizing<Vec<u8>>> = a
                .spec
                .rules
                .iter()
                .filter_map(|r| match &r.kind {
                    RuleKind::Header { template, .. } => Some(template.render(a.spec.value.expose())),
                    RuleKind::Login { .. } | RuleKind::TokenRefresh { .. } => None,
                })
                .collect();
            sources.push(RedactSource {
                value: a.spec.value.expose(),
                rendered,
                placeholder: &a.placeholder,
            });
            for old in &a.retired {
                sources.push(RedactSource {
                    value: old.expose(),
                    rendered: Vec::new(),
                    placeholder: &a.placeholder,
                });
            }
        }
        let redactor = Redactor::new(sources).map(Arc::new);
        Self {
            attached,
            finder,
            redactor,
        }
    }
}

/// Called with `(agent, secret name, new value)` when a token refresh renews a secret, so the owner can
/// persist it (in the vault).
pub type OnUpdate = Box<dyn Fn(&AgentId, &str, &SecretValue) + Send + Sync>;

/// The default [`SecretInjector`]. Cheap to share (`Arc`); every method takes `&self`.
#[derive(Default)]
pub struct SecretTable {
    agents: RwLock<HashMap<AgentId, Arc<AgentSecrets>>>,
    leak_guard: LeakGuard,
    on_update: Option<OnUpdate>,
    /// Refresh groups: `(agent, refresh secret name)` → group. Secrets of one group hold the same account's
    /// tokens in several agents (one provider login attached to several agents, E15): a refresh through
    /// one renews all of them, and the gateway lets one refresh of a group run at a time.
    groups: RwLock<HashMap<(AgentId, String), String>>,
}

impl std::fmt::Debug for SecretTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let agents = self.agents.read().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("SecretTable")
            .field("agents", &agents)
            .field("leak_guard", &self.leak_guard)
            .finish()
    }
}

impl SecretTable {
    /// An empty table with the given leak-guard behaviour.
    #[must_use]
    pub fn new(leak_guard: LeakGuard) -> Self {
        Self {
            agents: RwLock::default(),
            leak_guard,
            on_update: None,
            groups: RwLock::default(),
        }
    }

    /// Call `on_update` whenever a token refresh renews one of an agent's secrets.
    #[must_use]
    pub fn with_on_update(mut self, on_update: OnUpdate) -> Self {
        self.on_update = Some(on_update);
        self
    }

    /// Put `agent`'s refresh-token secret `secret` in refresh group `group` (`None`: in none, its own).
    /// Every secret of a group holds the same account's tokens: a refresh answered for one of them renews
    /// the refresh secret and its access secret of every other member too (each reported to `on_update`),
    /// and [`SecretInjector::refresh_group`] names the group so the gateway runs one refresh of it at a
    /// time (providers rotate refresh tokens and revoke the whole family when an old one is reused).
    pub fn set_refresh_group(&self, agent: &AgentId, secret: &str, group: Option<String>) {
        let mut groups = self.groups.write().unwrap_or_else(PoisonError::into_inner);
        let key = (agent.clone(), secret.to_owned());
        match group {
            Some(g) => {
                groups.insert(key, g);
            }
            None => {
                groups.remove(&key);
            }
        }
    }

    /// The other members of `agent`'s secret `secret`'s refresh group: (agent, refresh secret name).
    fn group_peers(&self, agent: &AgentId, secret: &str) -> Vec<(AgentId, String)> {
        let groups = self.groups.read().unwrap_or_else(PoisonError::into_inner);
        let Some(group) = groups.get(&(agent.clone(), secret.to_owned())) else {
            return Vec::new();
        };
        groups
            .iter()
            .filter(|((a, s), g)| *g == group && !(a == agent && s == secret))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Attach `secrets` to `agent`, replacing what it had. A secret that keeps its name keeps its
    /// placeholder (the sandbox's environment stays valid); new ones get fresh random placeholders.
    pub fn set(&self, agent: &AgentId, secrets: Vec<SecretSpec>) -> Vec<Placeholder> {
        let old = self.get(agent);
        let with = secrets
            .into_iter()
            .map(|spec| {
                let kept = old
                    .iter()
                    .flat_map(|v| v.attached.iter())
                    .find(|a| a.spec.name == spec.name);
                let placeholder = kept.map_or_else(new_placeholder, |a| a.placeholder.clone());
                (spec, placeholder)
            })
            .collect();
        self.set_with_placeholders(agent, with)
    }

    /// Attach secrets with known placeholders (restoring an agent after a restart: the sandbox still holds
    /// the old ones).
    pub fn set_with_placeholders(
        &self,
        agent: &AgentId,
        secrets: Vec<(SecretSpec, String)>,
    ) -> Vec<Placeholder> {
        let attached: Vec<Attached> = secrets
            .into_iter()
            .map(|(spec, placeholder)| Attached {
                spec,
                placeholder,
                retired: Vec::new(),
            })
            .collect();
        let out = placeholders_of(&attached);
        self.agents
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(agent.clone(), Arc::new(AgentSecrets::new(attached)));
        out
    }

    /// The placeholders of `agent`'s secrets.
    #[must_use]
    pub fn placeholders(&self, agent: &AgentId) -> Vec<Placeholder> {
        self.get(agent)
            .map(|a| placeholders_of(&a.attached))
            .unwrap_or_default()
    }

    /// Replace the value of `agent`'s secret `name` (a refreshed token); false when there is no such secret.
    /// The redactor keeps looking for the replaced value too.
    pub fn update_value(&self, agent: &AgentId, name: &str, value: &SecretValue) -> bool {
        let mut agents = self.agents.write().unwrap_or_else(PoisonError::into_inner);
        let Some(current) = agents.get(agent) else {
            return false;
        };
        let mut updated = false;
        let next: Vec<Attached> = current
            .attached
            .iter()
            .map(|a| {
                let mut a = a.clone();
                if a.spec.name == name && a.spec.value != *value {
                    let old = std::mem::replace(&mut a.spec.value, value.clone());
                    a.retired.push(old);
                    if a.retired.len() > RETIRED_KEPT {
                        a.retired.remove(0);
                    }
                }
                updated |= a.spec.name == name;
                a
            })
            .collect();
        agents.insert(agent.clone(), Arc::new(AgentSecrets::new(next)));
        updated
    }

    /// Forget `agent`'s secrets.
    pub fn remove(&self, agent: &AgentId) {
        self.agents
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(agent);
    }

    fn get(&self, agent: &AgentId) -> Option<Arc<AgentSecrets>> {
        self.agents
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(agent)
            .cloned()
    }
}

fn placeholders_of(attached: &[Attached]) -> Vec<Placeholder> {
    attached
        .iter()
        .map(|a| Placeholder {
            name: a.spec.name.clone(),
            env: a.spec.env.clone(),
            placeholder: a.placeholder.clone(),
        })
        .collect()
}

/// `haystack` with every `needle` replaced by `with`, or `None` when there is none.
fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Option<Vec<u8>> {
    let mut hits = memchr::memmem::find_iter(haystack, needle).peekable();
    hits.peek()?;
    let mut out = Vec::with_capacity(haystack.len() + with.len());
    let mut last = 0;
    for at in hits {
        out.extend_from_slice(haystack.get(last..at).unwrap_or_default());
        out.extend_from_slice(with);
        last = at + needle.len();
    }
    out.extend_from_slice(haystack.get(last..).unwrap_or_default());
    Some(out)
}

/// Percent-encode everything but RFC 3986 unreserved characters, for values put into a query string.
fn percent_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Whether `path` (with its query) is under one of `prefixes`: `Some(false)` outside them, `None` when the
/// path is not in normal form and so cannot be judged (all paths are fine when there are no prefixes).
fn path_allowed(path_and_query: &str, prefixes: &[String]) -> Option<bool> {
    if prefixes.is_empty() {
        return Some(true);
    }
    let (path, _) = split_query(path_and_query);
    if !is_normal_path(path) {
        return None;
    }
    Some(prefixes.iter().any(|p| path.starts_with(p.as_str())))
}

/// Whether `hit` sits where one of `secret`'s rules for `host` replaces (or overwrites) its placeholder.
fn in_its_place(secret: &Attached, host: &str, hit: &Hit) -> bool {
    secret
        .spec
        .rules
        .iter()
        .filter(|r| r.covers(host))
        .any(|rule| match (&rule.kind, &hit.place) {
            // The rule's own header is set from the template: whatever the sandbox wrote there is dropped.
            (RuleKind::Header { header, .. }, Place::Header(name)) if name == header => true,
            (RuleKind::Header { also_in, .. }, Place::Header(name)) => {
                hit.exact && also_in.headers.contains(name)
            }
            (RuleKind::Header { also_in, .. }, Place::Query(name)) => {
                hit.exact && also_in.query.contains(name)
            }
            (RuleKind::Login { header, .. }, Place::Header(name)) => name == header,
            _ => false,
        })
}

impl SecretInjector for SecretTable {
    fn table(&self) -> Option<&SecretTable> {
        Some(self)
    }

    fn has_secrets(&self, agent: &AgentId) -> bool {
        self.get(agent).is_some_and(|a| !a.attached.is_empty())
    }

    fn intercepts(&self, agent: &AgentId, host: &str) -> bool {
        self.get(agent)
            .is_some_and(|a| a.attached.iter().any(|s| s.spec.covers(host)))
    }

    fn rewrite(&self, agent: &AgentId, tls_host: Option<&str>, head: &mut RequestHead) -> InjectOutcome {
        let Some(secrets) = self.get(agent) else {
            return InjectOutcome::Forward {
                injected: Vec::new(),
                leaked: Vec::new(),
            };
        };
        if let Some(sni) = tls_host
            && head.host != sni
        {
            // A request for another host on a connection opened for a rule host: no secret goes with it.
            return InjectOutcome::Refuse {
                status: 421,
                reason: DenyReason::HostMismatch,
                secret: None,
            };
        }
        if tls_host.is_some()
            && head.method == "POST"
            && let Some(s) = refresh_secret(&secrets.attached, &head.host, &head.path_and_query)
        {
            return InjectOutcome::Refresh {
                secret: s.spec.name.clone(),
            };
        }
        let hits = secrets.finder.as_ref().map(|f| f.scan(head)).unwrap_or_default();
        let mut leaked = Vec::new();
        for hit in &hits {
            let Some(s) = secrets.attached.get(hit.secret) else {
                continue;
            };
            let name = &s.spec.name;
            if tls_host.is_none() || !s.spec.covers(&head.host) {
                // The leak guard: a placeholder heading where its secret may never go.
                match self.leak_guard {
                    LeakGuard::Block => return refuse(DenyReason::PlaceholderLeak, name),
                    LeakGuard::Log if !leaked.contains(name) => leaked.push(name.clone()),
                    LeakGuard::Log => {}
                }
            } else if !in_its_place(s, &head.host, hit) {
                return refuse(DenyReason::PlaceholderMisplaced, name);
            }
        }
        let mut injected = Vec::new();
        if tls_host.is_none() {
            // Plain HTTP is never injected (E13).
            return InjectOutcome::Forward { injected, leaked };
        }
        let host = head.host.clone();
        for (index, s) in secrets.attached.iter().enumerate() {
            let carried = hits.iter().any(|h| h.secret == index);
            for rule in s.spec.rules.iter().filter(|r| r.covers(&host)) {
                let value = s.spec.value.expose();
                let did = match &rule.kind {
                    RuleKind::Header {
                        header,
                        template,
                        also_in,
                    } => {
                        inject_header(head, header, &template.render(value));
                        if carried {
                            for name in &also_in.headers {
                                replace_in_header(head, name, &s.placeholder, value);
                            }
                            let encoded = percent_encode(value);
                            for name in &also_in.query {
                                if let Some(new) =
                                    replace_in_query(&head.path_and_query, name, &s.placeholder, &encoded)
                                {
                                    head.path_and_query = new;
                                }
                            }
                        }
                        true
                    }
                    RuleKind::Login {
                        header,
                        path_prefixes,
                    } => match path_allowed(&head.path_and_query, path_prefixes) {
                        Some(true) => replace_in_header(head, header, &s.placeholder, value),
                        None if carries_in_header(head, header, &s.placeholder) => {
                            return refuse(DenyReason::AmbiguousPath, &s.spec.name);
                        }
                        Some(false) | None => false,
                    },
                    RuleKind::TokenRefresh { .. } => false,
                };
                if did && !injected.contains(&s.spec.name) {
                    injected.push(s.spec.name.clone());
                }
            }
        }
        InjectOutcome::Forward { injected, leaked }
    }

    fn redactor(&self, agent: &AgentId) -> Option<Arc<Redactor>> {
        self.get(agent).and_then(|a| a.redactor.clone())
    }

    fn refresh_request(
        &self,
        agent: &AgentId,
        secret: &str,
        content_type: &str,
        body: &[u8],
    ) -> Option<Zeroizing<Vec<u8>>> {
        let secrets = self.get(agent)?;
        let s = secrets.attached.iter().find(|s| s.spec.name == secret)?;
        let value = s.spec.value.expose();
        let encoded: Zeroizing<Vec<u8>> = if content_type.contains("json") {
            Zeroizing::new(json_string_body(value)?)
        } else if content_type.contains("x-www-form-urlencoded") {
            Zeroizing::new(percent_encode(value).into_bytes())
        } else {
            Zeroizing::new(value.to_vec())
        };
        replace_all(body, s.placeholder.as_bytes(), &encoded).map(Zeroizing::new)
    }

    fn refresh_response(&self, agent: &AgentId, secret: &str, body: &[u8]) -> Option<Vec<u8>> {
        let secrets = self.get(agent)?;
        let (refresh, access) = refresh_pair(&secrets.attached, secret)?;
        let mut json: serde_json::Value = serde_json::from_slice(body).ok()?;
        let object = json.as_object_mut()?;
        let mut updates = Vec::new();
        for (field, attached) in [("refresh_token", refresh), ("access_token", access)] {
            if let Some(v) = object.get_mut(field) {
                let token = v.as_str()?;
                updates.push((attached.spec.name.clone(), SecretValue::from(token)));
                *v = serde_json::Value::String(attached.placeholder.clone());
            }
        }
        let sanitized = serde_json::to_vec(&json).ok()?;
        if updates
            .iter()
            .any(|(_, value)| header_value_problem(value.expose()).is_some())
        {
            return None;
        }
        let access_name = access.spec.name.clone();
        for (name, value) in &updates {
            self.update_value(agent, name, value);
            if let Some(on_update) = &self.on_update {
                on_update(agent, name, value);
            }
        }
        // The same account in other agents: their copies of the rotated tokens are renewed too (the old
        // refresh token is spent).
        for (peer, peer_refresh) in self.group_peers(agent, secret) {
            let Some(peer_secrets) = self.get(&peer) else {
                continue;
            };
            let Some((_, peer_access)) = refresh_pair(&peer_secrets.attached, &peer_refresh) else {
                continue;
            };
            let peer_access = peer_access.spec.name.clone();
            for (name, value) in &updates {
                let target = if *name == access_name {
                    peer_access.as_str()
                } else {
                    peer_refresh.as_str()
                };
                if self.update_value(&peer, target, value)
                    && let Some(on_update) = &self.on_update
                {
                    on_update(&peer, target, value);
                }
            }
        }
        Some(sanitized)
    }

    fn refresh_group(&self, agent: &AgentId, secret: &str) -> String {
        let groups = self.groups.read().unwrap_or_else(PoisonError::into_inner);
        match groups.get(&(agent.clone(), secret.to_owned())) {
            Some(group) => format!("group\n{group}"),
            None => format!("secret\n{agent}\n{secret}"),
        }
    }

    fn refresh_error(&self, agent: &AgentId, secret: &str, body: &[u8]) -> Vec<u8> {
        let generic = br#"{"error":"token_refresh_failed"}"#.to_vec();
        let Some(secrets) = self.get(agent) else {
            return generic;
        };
        if refresh_pair(&secrets.attached, secret).is_none() {
            return generic;
        }
        // Every form of every value the agent holds, the refreshed pair included.
        match &secrets.redactor {
            Some(r) => r.redact(body).unwrap_or_else(|| body.to_vec()),
            None => generic,
        }
    }
}

fn refuse(reason: DenyReason, secret: &str) -> InjectOutcome {
    InjectOutcome::Refuse {
        status: 403,
        reason,
        secret: Some(secret.to_owned()),
    }
}

/// The agent's refresh-token secret whose rule covers this host and exactly this path, if any.
fn refresh_secret<'a>(secrets: &'a [Attached], host: &str, path_and_query: &str) -> Option<&'a Attached> {
    let (path, _) = split_query(path_and_query);
    secrets.iter().find(|s| {
        s.spec
            .rules
            .iter()
            .any(|r| r.covers(host) && matches!(&r.kind, RuleKind::TokenRefresh { path: p, .. } if p == path))
    })
}

/// The refresh secret `secret` and the access secret its rule renews.
fn refresh_pair<'a>(secrets: &'a [Attached], secret: &str) -> Option<(&'a Attached, &'a Attached)> {
    let refresh = secrets.iter().find(|s| s.spec.name == secret)?;
    let access_name = refresh.spec.rules.iter().find_map(|r| match &r.kind {
        RuleKind::TokenRefresh { access_secret, .. } => Some(access_secret.as_str()),
        _ => None,
    })?;
    let access = secrets.iter().find(|s| s.spec.name == access_name)?;
    Some((refresh, access))
}

/// `value` as the inside of a JSON string (quotes not included).
fn json_string_body(value: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(value).ok()?;
    let quoted = serde_json::to_vec(text).ok()?;
    quoted.get(1..quoted.len().saturating_sub(1)).map(<[u8]>::to_vec)
}

/// Set `name` to `value`, replacing every existing value of it.
fn inject_header(head: &mut RequestHead, name: &str, value: &[u8]) {
    head.headers.retain(|(n, _)| n != name);
    head.headers.push((name.to_owned(), value.to_vec()));
}

/// Whether header `name` carries `placeholder` as handed out.
fn carries_in_header(head: &RequestHead, name: &str, placeholder: &str) -> bool {
    head.headers
        .iter()
        .any(|(n, v)| n == name && memchr::memmem::find(v, placeholder.as_bytes()).is_some())
}

/// Replace the placeholder inside header `name` only; whether anything was replaced.
fn replace_in_header(head: &mut RequestHead, name: &str, placeholder: &str, value: &[u8]) -> bool {
    let mut did = false;
    for (n, v) in &mut head.headers {
        if n == name
            && let Some(new) = replace_all(v, placeholder.as_bytes(), value)
        {
            *v = new;
            did = true;
        }
    }
    did
}

#[cfg(test)]
mod tests;
