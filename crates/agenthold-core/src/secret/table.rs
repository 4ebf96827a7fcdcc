//! [`SecretTable`], the default [`SecretInjector`]: per agent, the attached secrets and their placeholders.
//!
//! On a request to a host one of the agent's rules covers, over TLS whose SNI equals the request's host:
//! header rules set their header from the template and replace the placeholder wherever it appears in
//! header values (raw) and the query string (percent-encoded); login rules replace it only inside their one
//! header, never add that header, and only on their path prefixes. A placeholder on its way anywhere else
//! (another host, plain HTTP) is a leak: refused with 403, or only reported when the leak guard is `log`.
//! Bodies are never looked at.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, PoisonError, RwLock};

use memchr::memmem;
use zeroize::Zeroizing;

use super::{
    InjectOutcome, PLACEHOLDER_PREFIX, RequestHead, RuleKind, SecretInjector, SecretSpec, SecretValue,
    header_value_problem, new_placeholder,
};
use crate::config::LeakGuard;
use crate::ids::AgentId;
use crate::policy::DenyReason;

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

#[derive(Debug)]
struct Attached {
    spec: SecretSpec,
    placeholder: String,
}

/// Called with `(agent, secret name, new value)` when a token refresh renews a secret, so the owner can
/// persist it (in the vault).
pub type OnUpdate = Box<dyn Fn(&AgentId, &str, &SecretValue) + Send + Sync>;

/// The default [`SecretInjector`]. Cheap to share (`Arc`); every method takes `&self`.
#[derive(Default)]
pub struct SecretTable {
    agents: RwLock<HashMap<AgentId, Arc<Vec<Attached>>>>,
    leak_guard: LeakGuard,
    on_update: Option<OnUpdate>,
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
        }
    }

    /// Call `on_update` whenever a token refresh renews one of an agent's secrets.
    #[must_use]
    pub fn with_on_update(mut self, on_update: OnUpdate) -> Self {
        self.on_update = Some(on_update);
        self
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
                    .flat_map(|v| v.iter())
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
            .map(|(spec, placeholder)| Attached { spec, placeholder })
            .collect();
        let out = placeholders_of(&attached);
        self.agents
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(agent.clone(), Arc::new(attached));
        out
    }

    /// The placeholders of `agent`'s secrets.
    #[must_use]
    pub fn placeholders(&self, agent: &AgentId) -> Vec<Placeholder> {
        self.get(agent).map(|a| placeholders_of(&a)).unwrap_or_default()
    }

    /// Replace the value of `agent`'s secret `name` (a refreshed token); false when there is no such secret.
    pub fn update_value(&self, agent: &AgentId, name: &str, value: &SecretValue) -> bool {
        let mut agents = self.agents.write().unwrap_or_else(PoisonError::into_inner);
        let Some(current) = agents.get(agent) else {
            return false;
        };
        let mut updated = false;
        let next: Vec<Attached> = current
            .iter()
            .map(|a| {
                let mut spec = a.spec.clone();
                if spec.name == name {
                    spec.value = value.clone();
                    updated = true;
                }
                Attached {
                    spec,
                    placeholder: a.placeholder.clone(),
                }
            })
            .collect();
        agents.insert(agent.clone(), Arc::new(next));
        updated
    }

    /// Forget `agent`'s secrets.
    pub fn remove(&self, agent: &AgentId) {
        self.agents
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(agent);
    }

    fn get(&self, agent: &AgentId) -> Option<Arc<Vec<Attached>>> {
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

/// Whether `haystack` contains `needle`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memmem::find(haystack, needle).is_some()
}

/// `haystack` with every `needle` replaced by `with`, or `None` when there is none.
fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Option<Vec<u8>> {
    let mut hits = memmem::find_iter(haystack, needle).peekable();
    hits.peek()?;
    let mut out = Vec::with_capacity(haystack.len() + with.len());
    let mut last = 0;
    for at in hits {
        out.extend_from_slice(&haystack[last..at]);
        out.extend_from_slice(with);
        last = at + needle.len();
    }
    out.extend_from_slice(&haystack[last..]);
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

/// Whether the request head mentions the placeholder prefix at all (the common case is no).
fn mentions_placeholders(head: &RequestHead) -> bool {
    // Built once: this runs on every request of every agent with secrets.
    static PREFIX: std::sync::LazyLock<memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memmem::Finder::new(PLACEHOLDER_PREFIX.as_bytes()));
    PREFIX.find(head.path_and_query.as_bytes()).is_some()
        || head.headers.iter().any(|(_, v)| PREFIX.find(v).is_some())
}

fn carries(head: &RequestHead, placeholder: &str) -> bool {
    let p = placeholder.as_bytes();
    contains(head.path_and_query.as_bytes(), p) || head.headers.iter().any(|(_, v)| contains(v, p))
}

/// Whether `path` (with its query) is under one of `prefixes` (all paths when there are none).
fn path_allowed(path_and_query: &str, prefixes: &[String]) -> bool {
    let path = path_and_query.split('?').next().unwrap_or_default();
    prefixes.is_empty() || prefixes.iter().any(|p| path.starts_with(p.as_str()))
}

impl SecretInjector for SecretTable {
    fn has_secrets(&self, agent: &AgentId) -> bool {
        self.get(agent).is_some_and(|a| !a.is_empty())
    }

    fn intercepts(&self, agent: &AgentId, host: &str) -> bool {
        self.get(agent)
            .is_some_and(|a| a.iter().any(|s| s.spec.covers(host)))
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
            && let Some(s) = refresh_secret(&secrets, &head.host, &head.path_and_query)
        {
            return InjectOutcome::Refresh {
                secret: s.spec.name.clone(),
            };
        }
        // The leak guard: a placeholder heading anywhere its secret may not go.
        let mut leaked = Vec::new();
        let mentions = mentions_placeholders(head);
        if mentions {
            for s in secrets.iter() {
                let may_go = tls_host.is_some() && s.spec.covers(&head.host);
                if !may_go && carries(head, &s.placeholder) {
                    match self.leak_guard {
                        LeakGuard::Block => {
                            return InjectOutcome::Refuse {
                                status: 403,
                                reason: DenyReason::PlaceholderLeak,
                                secret: Some(s.spec.name.clone()),
                            };
                        }
                        LeakGuard::Log => leaked.push(s.spec.name.clone()),
                    }
                }
            }
        }
        let mut injected = Vec::new();
        if tls_host.is_none() {
            // Plain HTTP is never injected (E13).
            return InjectOutcome::Forward { injected, leaked };
        }
        let host = head.host.clone();
        for s in secrets.iter() {
            for rule in s.spec.rules.iter().filter(|r| r.covers(&host)) {
                let did = match &rule.kind {
                    RuleKind::Header { header, template } => {
                        inject_header(head, header, &template.render(s.spec.value.expose()));
                        if mentions {
                            replace_everywhere(head, &s.placeholder, s.spec.value.expose());
                        }
                        true
                    }
                    RuleKind::Login {
                        header,
                        path_prefixes,
                    } => {
                        path_allowed(&head.path_and_query, path_prefixes)
                            && replace_in_header(head, header, &s.placeholder, s.spec.value.expose())
                    }
                    RuleKind::TokenRefresh { .. } => false,
                };
                if did && !injected.contains(&s.spec.name) {
                    injected.push(s.spec.name.clone());
                }
            }
        }
        InjectOutcome::Forward { injected, leaked }
    }

    fn refresh_request(
        &self,
        agent: &AgentId,
        secret: &str,
        content_type: &str,
        body: &[u8],
    ) -> Option<Zeroizing<Vec<u8>>> {
        let secrets = self.get(agent)?;
        let s = secrets.iter().find(|s| s.spec.name == secret)?;
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
        let (refresh, access) = refresh_pair(&secrets, secret)?;
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
        for (name, value) in updates {
            if header_value_problem(value.expose()).is_some() {
                return None;
            }
            self.update_value(agent, &name, &value);
            if let Some(on_update) = &self.on_update {
                on_update(agent, &name, &value);
            }
        }
        Some(sanitized)
    }

    fn refresh_error(&self, agent: &AgentId, secret: &str, body: &[u8]) -> Vec<u8> {
        let generic = br#"{"error":"token_refresh_failed"}"#.to_vec();
        let Some(secrets) = self.get(agent) else {
            return generic;
        };
        match refresh_pair(&secrets, secret) {
            Some((refresh, access)) => redact_values(body, &[refresh, access]),
            None => generic,
        }
    }
}

/// `body` with every raw, JSON-escaped and percent-encoded occurrence of each secret's value replaced by its
/// placeholder.
fn redact_values(body: &[u8], secrets: &[&Attached]) -> Vec<u8> {
    let mut out = body.to_vec();
    for s in secrets {
        let value = s.spec.value.expose();
        let mut forms = vec![value.to_vec(), percent_encode(value).into_bytes()];
        forms.extend(json_string_body(value));
        for form in forms.iter().filter(|f| !f.is_empty()) {
            if let Some(replaced) = replace_all(&out, form, s.placeholder.as_bytes()) {
                out = replaced;
            }
        }
    }
    out
}

/// The agent's refresh-token secret whose rule covers this host and exactly this path, if any.
fn refresh_secret<'a>(secrets: &'a [Attached], host: &str, path_and_query: &str) -> Option<&'a Attached> {
    let path = path_and_query.split('?').next().unwrap_or_default();
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

/// Replace the placeholder in every header value (raw) and in the query string (percent-encoded).
fn replace_everywhere(head: &mut RequestHead, placeholder: &str, value: &[u8]) {
    for (_, v) in &mut head.headers {
        if let Some(new) = replace_all(v, placeholder.as_bytes(), value) {
            *v = new;
        }
    }
    let encoded = percent_encode(value);
    if let Some(new) = replace_all(
        head.path_and_query.as_bytes(),
        placeholder.as_bytes(),
        encoded.as_bytes(),
    ) {
        // Only ASCII went in (the path was ASCII and the value is percent-encoded).
        head.path_and_query = String::from_utf8_lossy(&new).into_owned();
    }
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
mod tests {
    use super::*;
    use crate::secret::{Preset, SecretRule};

    fn head(host: &str, path: &str, headers: &[(&str, &str)]) -> RequestHead {
        RequestHead {
            method: "GET".into(),
            host: host.into(),
            path_and_query: path.into(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    fn header<'a>(h: &'a RequestHead, name: &str) -> Vec<&'a [u8]> {
        h.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
            .collect()
    }

    fn table(guard: LeakGuard) -> (SecretTable, AgentId, String) {
        let t = SecretTable::new(guard);
        let a = AgentId::new("a").unwrap();
        let spec = SecretSpec::new(
            "api",
            SecretValue::from("s3cr3t&=x"),
            Some("API_KEY"),
            vec![SecretRule::header(&["api.example.test"], "Authorization", "Bearer {{.Value}}").unwrap()],
        )
        .unwrap();
        let p = t.set(&a, vec![spec]).remove(0).placeholder;
        (t, a, p)
    }

    // covers: E11, E13
    #[test]
    fn sets_the_header_and_replaces_placeholders_in_headers_and_query() {
        let (t, a, p) = table(LeakGuard::Block);
        let mut h = head(
            "api.example.test",
            &format!("/v1?key={p}&x=1"),
            &[("x-other", &format!("k={p}"))],
        );
        let out = t.rewrite(&a, Some("api.example.test"), &mut h);
        assert_eq!(
            out,
            InjectOutcome::Forward {
                injected: vec!["api".into()],
                leaked: vec![]
            }
        );
        assert_eq!(header(&h, "authorization"), [b"Bearer s3cr3t&=x".as_slice()]);
        assert_eq!(header(&h, "x-other"), [b"k=s3cr3t&=x".as_slice()]);
        assert_eq!(h.path_and_query, "/v1?key=s3cr3t%26%3Dx&x=1");
    }

    // covers: E13
    #[test]
    fn plain_http_is_never_injected_and_placeholders_there_are_leaks() {
        let (t, a, p) = table(LeakGuard::Block);
        let mut h = head("api.example.test", "/", &[]);
        assert_eq!(
            t.rewrite(&a, None, &mut h),
            InjectOutcome::Forward {
                injected: vec![],
                leaked: vec![]
            }
        );
        assert!(header(&h, "authorization").is_empty());
        let mut h = head(
            "api.example.test",
            "/",
            &[("authorization", &format!("Bearer {p}"))],
        );
        assert!(matches!(
            t.rewrite(&a, None, &mut h),
            InjectOutcome::Refuse {
                status: 403,
                reason: DenyReason::PlaceholderLeak,
                ..
            }
        ));
    }

    #[test]
    fn leak_guard_blocks_or_logs_placeholders_to_other_hosts() {
        let (t, a, p) = table(LeakGuard::Block);
        let mut h = head("echo.example.test", &format!("/?q={p}"), &[]);
        let out = t.rewrite(&a, Some("echo.example.test"), &mut h);
        assert_eq!(
            out,
            InjectOutcome::Refuse {
                status: 403,
                reason: DenyReason::PlaceholderLeak,
                secret: Some("api".into())
            }
        );
        let (t, a, p) = table(LeakGuard::Log);
        let mut h = head("echo.example.test", &format!("/?q={p}"), &[]);
        let out = t.rewrite(&a, Some("echo.example.test"), &mut h);
        assert_eq!(
            out,
            InjectOutcome::Forward {
                injected: vec![],
                leaked: vec!["api".into()]
            }
        );
        assert!(
            h.path_and_query.contains(&p),
            "a leaked placeholder is never replaced"
        );
    }

    #[test]
    fn host_must_equal_sni() {
        let (t, a, _) = table(LeakGuard::Block);
        let mut h = head("other.example.test", "/", &[]);
        assert!(matches!(
            t.rewrite(&a, Some("api.example.test"), &mut h),
            InjectOutcome::Refuse {
                status: 421,
                reason: DenyReason::HostMismatch,
                secret: None
            }
        ));
        assert!(header(&h, "authorization").is_empty());
    }

    #[test]
    fn another_agents_placeholder_is_not_replaced() {
        let (t, _, p) = table(LeakGuard::Block);
        let b = AgentId::new("b").unwrap();
        t.set(
            &b,
            vec![SecretSpec::preset("gh", Preset::GitHub, "ghp".into(), None).unwrap()],
        );
        let mut h = head("api.example.test", "/", &[("x-key", &p)]);
        let out = t.rewrite(&b, Some("api.example.test"), &mut h);
        assert_eq!(
            out,
            InjectOutcome::Forward {
                injected: vec![],
                leaked: vec![]
            }
        );
        assert_eq!(header(&h, "x-key"), [p.as_bytes()]);
        assert!(!t.intercepts(&b, "api.example.test"));
        assert!(t.intercepts(&b, "github.com"));
    }

    // covers: E15
    #[test]
    fn login_rules_replace_only_inside_their_header_and_paths() {
        let t = SecretTable::new(LeakGuard::Block);
        let a = AgentId::new("a").unwrap();
        let rule = SecretRule::login(&["chatgpt.com"], "Authorization", &["/backend-api/"]).unwrap();
        let spec = SecretSpec::new("login", "tok".into(), Some("TOKEN"), vec![rule]).unwrap();
        let p = t.set(&a, vec![spec]).remove(0).placeholder;
        let auth = format!("Bearer {p}");
        let mut h = head(
            "chatgpt.com",
            "/backend-api/x",
            &[("authorization", &auth), ("x-copy", &p)],
        );
        let out = t.rewrite(&a, Some("chatgpt.com"), &mut h);
        assert_eq!(
            out,
            InjectOutcome::Forward {
                injected: vec!["login".into()],
                leaked: vec![]
            }
        );
        assert_eq!(header(&h, "authorization"), [b"Bearer tok".as_slice()]);
        assert_eq!(header(&h, "x-copy"), [p.as_bytes()], "only the named header");
        let mut h = head("chatgpt.com", "/backend-api/x", &[]);
        t.rewrite(&a, Some("chatgpt.com"), &mut h);
        assert!(header(&h, "authorization").is_empty(), "never added");
        let mut h = head("chatgpt.com", "/other", &[("authorization", &auth)]);
        t.rewrite(&a, Some("chatgpt.com"), &mut h);
        assert_eq!(
            header(&h, "authorization"),
            [auth.as_bytes()],
            "outside the paths"
        );
    }

    // covers: E15
    #[test]
    fn token_refresh_keeps_real_tokens_on_the_gateway() {
        let updates = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&updates);
        let t = SecretTable::new(LeakGuard::Block).with_on_update(Box::new(move |_, name, value| {
            seen.lock()
                .unwrap()
                .push((name.to_owned(), value.expose().to_vec()));
        }));
        let a = AgentId::new("a").unwrap();
        let access_rule = SecretRule::login(&["chatgpt.com"], "authorization", &["/backend-api/"]).unwrap();
        let refresh_rule = SecretRule::token_refresh(&["auth.openai.com"], "/oauth/token", "access").unwrap();
        let ph = t.set(
            &a,
            vec![
                SecretSpec::new("access", "at-1".into(), Some("ACCESS"), vec![access_rule]).unwrap(),
                SecretSpec::new("refresh", "rt-1".into(), Some("REFRESH"), vec![refresh_rule]).unwrap(),
            ],
        );
        let (access_ph, refresh_ph) = (ph[0].placeholder.clone(), ph[1].placeholder.clone());
        let mut h = head("auth.openai.com", "/oauth/token", &[]);
        h.method = "POST".into();
        assert_eq!(
            t.rewrite(&a, Some("auth.openai.com"), &mut h),
            InjectOutcome::Refresh {
                secret: "refresh".into()
            }
        );
        let body = format!(r#"{{"grant_type":"refresh_token","refresh_token":"{refresh_ph}"}}"#);
        let up = t
            .refresh_request(&a, "refresh", "application/json", body.as_bytes())
            .unwrap();
        assert_eq!(
            &up[..],
            br#"{"grant_type":"refresh_token","refresh_token":"rt-1"}"#
        );
        assert!(
            t.refresh_request(&a, "refresh", "application/json", b"{}")
                .is_none()
        );
        let answer = br#"{"access_token":"at-2","refresh_token":"rt-2","id_token":"id","expires_in":3600}"#;
        let out: serde_json::Value =
            serde_json::from_slice(&t.refresh_response(&a, "refresh", answer).unwrap()).unwrap();
        assert_eq!(out["access_token"], access_ph.as_str());
        assert_eq!(out["refresh_token"], refresh_ph.as_str());
        assert_eq!(out["id_token"], "id");
        let seen = updates.lock().unwrap().clone();
        assert!(
            seen.contains(&("access".into(), b"at-2".to_vec()))
                && seen.contains(&("refresh".into(), b"rt-2".to_vec()))
        );
        let mut h = head(
            "chatgpt.com",
            "/backend-api/me",
            &[("authorization", &format!("Bearer {access_ph}"))],
        );
        t.rewrite(&a, Some("chatgpt.com"), &mut h);
        assert_eq!(header(&h, "authorization"), [b"Bearer at-2".as_slice()]);
        let up = t.refresh_request(
            &a,
            "refresh",
            "application/x-www-form-urlencoded",
            format!("refresh_token={refresh_ph}").as_bytes(),
        );
        assert_eq!(&up.unwrap()[..], b"refresh_token=rt-2");
        // A refused refresh that quotes the token it refused gives the sandbox the placeholder instead.
        let refused = br#"{"error":"invalid_grant","error_description":"token rt-2 was revoked"}"#;
        let answer = String::from_utf8(t.refresh_error(&a, "refresh", refused)).unwrap();
        assert!(
            !answer.contains("rt-2") && answer.contains(&refresh_ph),
            "{answer}"
        );
    }

    #[test]
    fn placeholders_survive_a_reset_and_values_update() {
        let (t, a, p) = table(LeakGuard::Block);
        let spec = SecretSpec::preset("api", Preset::OpenAi, "v2".into(), None).unwrap();
        assert_eq!(t.set(&a, vec![spec])[0].placeholder, p);
        assert!(t.update_value(&a, "api", &"v3".into()));
        let mut h = head("api.openai.com", "/", &[]);
        t.rewrite(&a, Some("api.openai.com"), &mut h);
        assert_eq!(header(&h, "authorization"), [b"Bearer v3".as_slice()]);
        assert!(!t.update_value(&a, "nope", &"x".into()));
    }

    #[test]
    fn secret_values_must_be_header_safe() {
        let r = Preset::OpenAi.rules();
        assert!(SecretSpec::new("n", "a\r\nx-evil: 1".into(), None, r.clone()).is_err());
        assert!(SecretSpec::new("n", "a\0b".into(), None, r).is_err());
        assert!(SecretRule::header(&["h.test"], "x", "{{.Value}}\\n").is_ok());
        assert!(SecretRule::header(&["h.test"], "x", "{{print .Value \"\\n\"}}").is_err());
    }
}
