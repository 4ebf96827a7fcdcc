//! Secrets (E10–E13, E15): values that never enter a sandbox, the rules that say where the gateway may inject
//! them, presets for common providers, placeholders, and the [`SecretInjector`] trait with its default
//! implementation, [`SecretTable`].
// enforces: E11 E12

mod placement;
mod redact;
mod table;

pub use redact::{MIN_DERIVED_FORM, RedactSource, RedactStream, Redacted, Redactor};
pub use table::{OnUpdate, Placeholder, SecretTable};

use std::fmt;

use zeroize::Zeroizing;

use crate::error::Error;
use crate::ids::AgentId;
use crate::policy::{DenyReason, HostPattern, PolicyEntry, PortSpec};
use crate::template::Template;

/// The prefix of every placeholder a sandbox sees instead of a secret value.
pub const PLACEHOLDER_PREFIX: &str = "agenthold-placeholder-";

/// A secret value. Zeroized on drop; its `Debug` never shows the value, it has no `Display` and no
/// `Serialize`, so it cannot reach a log line or an API response by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(Zeroizing<Vec<u8>>);

impl SecretValue {
    /// Wrap bytes.
    #[must_use]
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(Zeroizing::new(bytes.into()))
    }

    /// The value's bytes; keep the borrow short and never log it.
    #[must_use]
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl From<String> for SecretValue {
    fn from(s: String) -> Self {
        Self::new(s.into_bytes())
    }
}

impl From<&str> for SecretValue {
    fn from(s: &str) -> Self {
        Self::new(s.as_bytes().to_vec())
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// What a rule does on requests to its hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleKind {
    /// Set `header` to the rendered `template` (E11, E13). The placeholder is replaced by the value only
    /// where `also_in` names it; anywhere else in a request to the rule's hosts it is refused as a leak.
    Header {
        /// Header to set (lower case).
        header: String,
        /// Its value.
        template: Template,
        /// Further places the placeholder is replaced in (none by default).
        also_in: AlsoIn,
    },
    /// Account login (E15): replace the placeholder only inside `header`, never add the header, and only on
    /// paths starting with one of `path_prefixes` (all paths when empty).
    Login {
        /// The one header the placeholder may be replaced in (lower case).
        header: String,
        /// URL path prefixes the rule is limited to.
        path_prefixes: Vec<String>,
    },
    /// Token refresh (E15): this secret is an OAuth refresh token. A `POST` to `path` on the rule's hosts is
    /// answered by the gateway itself: it sends the refresh upstream with the real refresh token, keeps the
    /// new tokens (this secret and `access_secret` are updated), and hands the sandbox placeholders only.
    /// The refresh token never leaves the gateway.
    TokenRefresh {
        /// Path of the provider's token endpoint (`/oauth/token`).
        path: String,
        /// Name of the agent's secret that holds the access token this refresh renews.
        access_secret: String,
    },
}

/// Further places of a request where a header rule replaces its placeholder by the value: named headers
/// (raw) and named query parameters (percent-encoded). Never the path. Empty by default: most APIs take a
/// key in one header, and every further place is one more an upstream may echo back.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlsoIn {
    /// Header names (lower case).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<String>,
    /// Query parameter names (exact, after percent-decoding).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<String>,
}

impl AlsoIn {
    /// Whether nothing is named.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty() && self.query.is_empty()
    }

    /// Validated: header names are tokens (lower-cased), query names are non-empty printable ASCII.
    ///
    /// # Errors
    /// [`Error::Secret`] naming the bad entry.
    pub fn new<S: AsRef<str>>(headers: &[S], query: &[S]) -> Result<Self, Error> {
        let headers = headers
            .iter()
            .map(|h| parse_header_name(h.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let query = query
            .iter()
            .map(|q| {
                let q = q.as_ref();
                if q.is_empty() || !q.bytes().all(|b| b.is_ascii_graphic() && !b"&;=#".contains(&b)) {
                    Err(bad_rule(format!(
                        "also_in query parameter {q:?} must be printable ASCII without '&', ';', '=' or '#'"
                    )))
                } else {
                    Ok(q.to_owned())
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { headers, query })
    }
}

/// Where and how a secret may be injected. Serialised in its textual form (`{"kind": "header", "hosts":
/// […], "header": …, "template": …}`) and validated again when read back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "RuleRepr", try_from = "RuleRepr")]
pub struct SecretRule {
    /// Hosts the secret may be sent to: exact names or `*.` wildcards, never addresses.
    pub hosts: Vec<HostPattern>,
    /// What to do on requests to those hosts.
    pub kind: RuleKind,
}

impl SecretRule {
    /// A header rule from textual hosts, header name and template source.
    ///
    /// # Errors
    /// [`Error::Secret`] for an address, a port or an invalid name in `hosts`, an invalid header name, or a
    /// template that does not parse.
    pub fn header<S: AsRef<str>>(hosts: &[S], header: &str, template: &str) -> Result<Self, Error> {
        let template = Template::parse(template)?;
        // Literals are the only part of a rendering a value cannot vouch for: check them once, here.
        if let Some(problem) = header_value_problem(&template.render(b"x")) {
            return Err(bad_rule(format!(
                "template {:?} renders a value that {problem}",
                template.source()
            )));
        }
        Ok(Self {
            hosts: parse_rule_hosts(hosts)?,
            kind: RuleKind::Header {
                header: parse_header_name(header)?,
                template,
                also_in: AlsoIn::default(),
            },
        })
    }

    /// This header rule, also replacing its placeholder in the places `also_in` names.
    ///
    /// # Errors
    /// [`Error::Secret`] when the rule is not a header rule, or `also_in` names the rule's own header.
    pub fn with_also_in(mut self, also_in: AlsoIn) -> Result<Self, Error> {
        match &mut self.kind {
            RuleKind::Header {
                header,
                also_in: slot,
                ..
            } => {
                if also_in.headers.contains(header) {
                    return Err(bad_rule(format!(
                        "also_in names {header:?}, the header the rule sets anyway"
                    )));
                }
                *slot = also_in;
                Ok(self)
            }
            RuleKind::Login { .. } | RuleKind::TokenRefresh { .. } => {
                Err(bad_rule("also_in is only for header rules".into()))
            }
        }
    }

    /// A login rule (see [`RuleKind::Login`]).
    ///
    /// # Errors
    /// As [`SecretRule::header`]; path prefixes must start with `/`.
    pub fn login<S: AsRef<str>>(hosts: &[S], header: &str, path_prefixes: &[S]) -> Result<Self, Error> {
        let path_prefixes = path_prefixes
            .iter()
            .map(|p| {
                let p = p.as_ref();
                if p.starts_with('/') {
                    Ok(p.to_owned())
                } else {
                    Err(bad_rule(format!("path prefix {p:?} must start with '/'")))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            hosts: parse_rule_hosts(hosts)?,
            kind: RuleKind::Login {
                header: parse_header_name(header)?,
                path_prefixes,
            },
        })
    }

    /// A token-refresh rule (see [`RuleKind::TokenRefresh`]).
    ///
    /// # Errors
    /// As [`SecretRule::header`]; the path must start with `/`.
    pub fn token_refresh<S: AsRef<str>>(hosts: &[S], path: &str, access_secret: &str) -> Result<Self, Error> {
        if !path.starts_with('/') {
            return Err(bad_rule(format!("token path {path:?} must start with '/'")));
        }
        Ok(Self {
            hosts: parse_rule_hosts(hosts)?,
            kind: RuleKind::TokenRefresh {
                path: path.to_owned(),
                access_secret: access_secret.to_owned(),
            },
        })
    }

    /// Whether `host` (normalised) is covered by this rule.
    #[must_use]
    pub fn covers(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h.matches_name(host))
    }
}

/// The textual form of a [`SecretRule`].
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum RuleRepr {
    Header {
        hosts: Vec<String>,
        header: String,
        template: String,
        #[serde(default, skip_serializing_if = "AlsoIn::is_empty")]
        also_in: AlsoIn,
    },
    Login {
        hosts: Vec<String>,
        header: String,
        paths: Vec<String>,
    },
    TokenRefresh {
        hosts: Vec<String>,
        path: String,
        access_secret: String,
    },
}

impl From<SecretRule> for RuleRepr {
    fn from(rule: SecretRule) -> Self {
        let hosts = rule
            .hosts
            .iter()
            .map(|h| match h {
                HostPattern::Exact(n) => n.clone(),
                HostPattern::Subdomains(s) => format!("*.{s}"),
                // Rules are built through parse_rule_hosts, which refuses addresses.
                HostPattern::Network(n) => n.to_string(),
            })
            .collect();
        match rule.kind {
            RuleKind::Header {
                header,
                template,
                also_in,
            } => Self::Header {
                hosts,
                header,
                template: template.source().to_owned(),
                also_in,
            },
            RuleKind::Login {
                header,
                path_prefixes,
            } => Self::Login {
                hosts,
                header,
                paths: path_prefixes,
            },
            RuleKind::TokenRefresh { path, access_secret } => Self::TokenRefresh {
                hosts,
                path,
                access_secret,
            },
        }
    }
}

impl TryFrom<RuleRepr> for SecretRule {
    type Error = Error;
    fn try_from(repr: RuleRepr) -> Result<Self, Error> {
        match repr {
            RuleRepr::Header {
                hosts,
                header,
                template,
                also_in,
            } => {
                let rule = Self::header(&hosts, &header, &template)?;
                if also_in.is_empty() {
                    Ok(rule)
                } else {
                    rule.with_also_in(AlsoIn::new(&also_in.headers, &also_in.query)?)
                }
            }
            RuleRepr::Login { hosts, header, paths } => Self::login(&hosts, &header, &paths),
            RuleRepr::TokenRefresh {
                hosts,
                path,
                access_secret,
            } => Self::token_refresh(&hosts, &path, &access_secret),
        }
    }
}

fn bad_rule(problem: String) -> Error {
    Error::Secret {
        name: String::new(),
        problem,
    }
}

/// Parse rule hosts: names and `*.` wildcards, without ports or addresses.
fn parse_rule_hosts<S: AsRef<str>>(hosts: &[S]) -> Result<Vec<HostPattern>, Error> {
    if hosts.is_empty() {
        return Err(bad_rule("a rule needs at least one host".into()));
    }
    hosts
        .iter()
        .map(|h| {
            let h = h.as_ref();
            let entry = PolicyEntry::parse(h).map_err(|e| bad_rule(e.to_string()))?;
            match (entry.host, entry.ports) {
                (HostPattern::Network(_), _) => Err(bad_rule(format!(
                    "rule host {h:?} must be a name, not an address"
                ))),
                (_, PortSpec::One(_) | PortSpec::Any) => {
                    Err(bad_rule(format!("rule host {h:?} must not have a port")))
                }
                (host, PortSpec::Web) => Ok(host),
            }
        })
        .collect()
}

/// Why `bytes` cannot be an HTTP header value (RFC 9110 field-value: visible characters, spaces, tabs and
/// obs-text; no CR, LF, NUL or other controls), if it cannot.
pub(crate) fn header_value_problem(bytes: &[u8]) -> Option<&'static str> {
    if bytes.iter().any(|&b| b == b'\r' || b == b'\n') {
        Some("contains a line break")
    } else if bytes.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        Some("contains a control character")
    } else {
        None
    }
}

/// Validate an HTTP header name (RFC 9110 token) and lower-case it.
fn parse_header_name(name: &str) -> Result<String, Error> {
    const SPECIALS: &[u8] = b"!#$%&'*+-.^_`|~";
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || SPECIALS.contains(&b))
    {
        return Err(bad_rule(format!("{name:?} is not a valid HTTP header name")));
    }
    Ok(name.to_ascii_lowercase())
}

/// Built-in rules for common providers (E11). Each sets exactly the header its provider's own SDK and CLI
/// send the key in, so that the SDK works unchanged under E13's rule (a placeholder anywhere but the rule's
/// header is refused): `x-api-key` for the Anthropic SDK, `Authorization` for OpenAI's, OpenRouter's
/// (OpenAI-compatible) and GitHub's (`gh`, git), `PRIVATE-TOKEN` for GitLab's (`python-gitlab`, `glab`).
/// None names further places (`also_in`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// `x-api-key: VALUE` on api.anthropic.com.
    Anthropic,
    /// `Authorization: Bearer VALUE` on api.openai.com.
    #[serde(rename = "openai")]
    OpenAi,
    /// `Authorization: Bearer VALUE` on api.github.com, and
    /// `Authorization: Basic base64(x-access-token:VALUE)` on github.com (git over HTTPS).
    #[serde(rename = "github")]
    GitHub,
    /// `PRIVATE-TOKEN: VALUE` on gitlab.com (the API, as `python-gitlab` and `glab` send it), and
    /// `Authorization: Basic base64(oauth2:VALUE)` on gitlab.com (git over HTTPS).
    #[serde(rename = "gitlab")]
    GitLab,
    /// `Authorization: Bearer VALUE` on openrouter.ai.
    #[serde(rename = "openrouter")]
    OpenRouter,
}

impl Preset {
    /// Every preset.
    pub const ALL: [Self; 5] = [
        Self::Anthropic,
        Self::OpenAi,
        Self::GitHub,
        Self::GitLab,
        Self::OpenRouter,
    ];

    /// The preset's lower-case name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
            Self::GitHub => "github",
            Self::GitLab => "gitlab",
            Self::OpenRouter => "openrouter",
        }
    }

    /// Look a preset up by name (case-insensitive).
    ///
    /// # Errors
    /// [`Error::Secret`] listing the known presets.
    pub fn from_name(name: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| Error::Secret {
                name: name.to_owned(),
                problem: format!(
                    "unknown preset; known presets: {}",
                    Self::ALL.map(Self::name).join(", ")
                ),
            })
    }

    /// The preset's rules.
    #[must_use]
    pub fn rules(self) -> Vec<SecretRule> {
        let rule = |host: &str, header: &str, template: &str| SecretRule {
            hosts: vec![HostPattern::Exact(host.to_owned())],
            kind: RuleKind::Header {
                header: header.to_owned(),
                template: Template::parse(template).unwrap_or_else(|e| unreachable!("preset template: {e}")),
                also_in: AlsoIn::default(),
            },
        };
        match self {
            Self::Anthropic => vec![rule("api.anthropic.com", "x-api-key", "{{.Value}}")],
            Self::OpenAi => vec![rule("api.openai.com", "authorization", "Bearer {{.Value}}")],
            Self::GitHub => vec![
                rule("api.github.com", "authorization", "Bearer {{.Value}}"),
                rule(
                    "github.com",
                    "authorization",
                    r#"Basic {{base64 (print "x-access-token:" .Value)}}"#,
                ),
            ],
            Self::GitLab => vec![
                rule("gitlab.com", "private-token", "{{.Value}}"),
                rule(
                    "gitlab.com",
                    "authorization",
                    r#"Basic {{base64 (print "oauth2:" .Value)}}"#,
                ),
            ],
            Self::OpenRouter => vec![rule("openrouter.ai", "authorization", "Bearer {{.Value}}")],
        }
    }
}

/// A secret attached to an agent: its value, the rules that say where it may go, and the environment
/// variable that carries its placeholder inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSpec {
    /// Name, unique per agent (letters, digits, `_`, `-`, `.`; 1–64 characters).
    pub name: String,
    /// The value (never enters the sandbox).
    pub value: SecretValue,
    /// Environment variable that holds the placeholder in the sandbox, if any.
    pub env: Option<String>,
    /// Injection rules.
    pub rules: Vec<SecretRule>,
}

impl SecretSpec {
    /// A secret with explicit rules, validated.
    ///
    /// # Errors
    /// [`Error::Secret`] for a bad name or environment variable name, or no rules.
    pub fn new(
        name: &str,
        value: SecretValue,
        env: Option<&str>,
        rules: Vec<SecretRule>,
    ) -> Result<Self, Error> {
        let spec = Self {
            name: name.to_owned(),
            value,
            env: env.map(str::to_owned),
            rules,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Check the rules [`SecretSpec::new`] enforces (the fields are public, so a spec built field by field
    /// is checked again where it is used).
    ///
    /// # Errors
    /// [`Error::Secret`] for a bad name or environment variable name, no rules, or a value that cannot be
    /// sent in an HTTP header.
    pub fn validate(&self) -> Result<(), Error> {
        let fail = |problem: String| Error::Secret {
            name: self.name.clone(),
            problem,
        };
        let name = self.name.as_str();
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        {
            return Err(fail(
                "names are 1-64 characters of letters, digits, '_', '-' and '.'".into(),
            ));
        }
        if let Some(env) = &self.env
            && (env.is_empty()
                || env.as_bytes()[0].is_ascii_digit()
                || !env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        {
            return Err(fail(format!("{env:?} is not a valid environment variable name")));
        }
        if self.rules.is_empty() {
            return Err(fail("a secret needs at least one rule".into()));
        }
        if let Some(problem) = header_value_problem(self.value.expose()) {
            return Err(fail(format!(
                "the value {problem}; it must be usable in an HTTP header"
            )));
        }
        Ok(())
    }

    /// A secret with a preset's rules.
    ///
    /// # Errors
    /// As [`SecretSpec::new`].
    pub fn preset(name: &str, preset: Preset, value: SecretValue, env: Option<&str>) -> Result<Self, Error> {
        Self::new(name, value, env, preset.rules())
    }

    /// Whether any rule covers `host` (normalised).
    #[must_use]
    pub fn covers(&self, host: &str) -> bool {
        self.rules.iter().any(|r| r.covers(host))
    }
}

/// A fresh placeholder: the prefix and 32 base32 characters (160 random bits).
#[must_use]
pub fn new_placeholder() -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut bytes = [0u8; 32];
    // A placeholder from a broken generator would be guessable by another agent; stopping is better.
    #[allow(clippy::expect_used)]
    getrandom::fill(&mut bytes).expect("operating system random number generator failed");
    let mut out = String::with_capacity(PLACEHOLDER_PREFIX.len() + 32);
    out.push_str(PLACEHOLDER_PREFIX);
    out.extend(bytes.iter().map(|b| char::from(ALPHABET[usize::from(b & 31)])));
    out
}

/// The head of one HTTP request, as the gateway hands it to a [`SecretInjector`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Method (`GET`, …).
    pub method: String,
    /// The normalised host the request is for (`Host` or `:authority`, without port).
    pub host: String,
    /// Path and query (`/a/b?c=d`).
    pub path_and_query: String,
    /// Header names (lower case) and values, in order.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// What the injector did to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InjectOutcome {
    /// Forward the (possibly rewritten) request; names the secrets that were injected.
    Forward {
        /// Names of the secrets injected (never their values).
        injected: Vec<String>,
        /// Names of secrets whose placeholder the request carried to a host outside their rules, when the
        /// leak guard only logs.
        leaked: Vec<String>,
    },
    /// The request is a token refresh the gateway answers itself (see [`RuleKind::TokenRefresh`]), for
    /// this refresh-token secret.
    Refresh {
        /// Name of the refresh-token secret.
        secret: String,
    },
    /// Refuse the request with this HTTP status.
    Refuse {
        /// HTTP status to answer (403, 421).
        status: u16,
        /// Why.
        reason: DenyReason,
        /// Name of the secret concerned, if any.
        secret: Option<String>,
    },
}

/// Decides which TLS connections to intercept, rewrites request heads on them, and says how to redact the
/// answers.
///
/// Contract: `intercepts` is true only for hosts covered by one of the agent's secret rules (E13); only then
/// does the gateway terminate TLS. `rewrite` is called for every request on an intercepted connection with
/// `tls_host` = the connection's SNI, and for every plain-HTTP request with `tls_host = None`, in which case
/// it must never inject (E13) but may refuse a request that carries a placeholder (leak guard). It replaces
/// a placeholder only in the places the secret's rule names, and refuses a request that carries one
/// anywhere else. It never touches request bodies. `redactor` gives what the gateway scrubs from every
/// answer of an intercepted host (E19). The methods run per connection or request and must not block.
pub trait SecretInjector: Send + Sync {
    /// Whether `agent` has any secret at all; when false the gateway skips [`SecretInjector::rewrite`].
    fn has_secrets(&self, agent: &AgentId) -> bool;
    /// Whether TLS connections from `agent` to `host` (normalised SNI) are intercepted.
    fn intercepts(&self, agent: &AgentId, host: &str) -> bool;
    /// Rewrite one request head.
    fn rewrite(&self, agent: &AgentId, tls_host: Option<&str>, head: &mut RequestHead) -> InjectOutcome;

    /// The redactor for `agent`'s answers from intercepted hosts (E19): it replaces every form of every
    /// value the agent's secrets hold by the secret's placeholder. `None` (the default) passes answers on
    /// untouched; [`SecretTable`] always gives one when the agent has a secret.
    fn redactor(&self, _agent: &AgentId) -> Option<std::sync::Arc<Redactor>> {
        None
    }

    /// For a refresh `rewrite` announced with [`InjectOutcome::Refresh`]: the body to send upstream, with
    /// the refresh placeholder replaced by the real token (encoded for `content_type`); `None` refuses the
    /// request (no placeholder in it, or no such secret). The default refuses every refresh.
    fn refresh_request(
        &self,
        _agent: &AgentId,
        _secret: &str,
        _content_type: &str,
        _body: &[u8],
    ) -> Option<zeroize::Zeroizing<Vec<u8>>> {
        None
    }

    /// The upstream answered a refresh successfully with `body` (JSON): keep the new tokens and return the
    /// body the sandbox gets, tokens replaced by placeholders; `None` when the body cannot be made safe
    /// (then the sandbox gets an error). The default refuses.
    fn refresh_response(&self, _agent: &AgentId, _secret: &str, _body: &[u8]) -> Option<Vec<u8>> {
        None
    }

    /// The key of the refresh group `agent`'s refresh secret `secret` belongs to: the gateway runs one
    /// refresh per key at a time, so a rotated refresh token is never sent twice. The default: each secret
    /// of each agent is its own group.
    fn refresh_group(&self, agent: &AgentId, secret: &str) -> String {
        format!("secret\n{agent}\n{secret}")
    }

    /// The upstream refused a refresh with `body` (an error such as `invalid_grant`): what the sandbox gets
    /// instead, with every form of the real tokens replaced by placeholders (a provider may quote the token
    /// it refused). The default answers a generic error and passes nothing on.
    fn refresh_error(&self, _agent: &AgentId, _secret: &str, _body: &[u8]) -> Vec<u8> {
        br#"{"error":"token_refresh_failed"}"#.to_vec()
    }

    /// The per-agent table the runtime sets secrets in, when this injector has one (capability). The
    /// default [`SecretTable`] is its own; a platform's injector that finds values by itself answers `None`
    /// (the default): the runtime then keeps specs' secrets sealed in its records but injects none of them.
    fn table(&self) -> Option<&SecretTable> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_is_never_debug_printed() {
        let v = SecretValue::from("sk-live-123");
        assert!(!format!("{v:?}").contains("sk-live"));
        let spec = SecretSpec::preset("k", Preset::Anthropic, v, Some("KEY")).unwrap();
        assert!(!format!("{spec:?}").contains("sk-live"));
    }

    #[test]
    fn rules_validate() {
        assert!(SecretRule::header(&["api.example.com"], "Authorization", "Bearer {{.Value}}").is_ok());
        assert!(SecretRule::header(&["*.example.com"], "x-api-key", "{{.Value}}").is_ok());
        let empty: [&str; 0] = [];
        for (hosts, header) in [
            (&["10.0.0.1"][..], "a"),
            (&["example.com:443"][..], "a"),
            (&["example.com"][..], "bad header"),
            (&["example.com"][..], ""),
            (&empty[..], "a"),
        ] {
            assert!(
                SecretRule::header(hosts, header, "{{.Value}}").is_err(),
                "{hosts:?} {header:?}"
            );
        }
        assert!(SecretRule::login(&["chatgpt.com"], "authorization", &["backend-api/"]).is_err());
    }

    #[test]
    fn rules_round_trip_through_json_and_are_validated() {
        for rule in [
            SecretRule::header(
                &["api.example.com", "*.example.org"],
                "X-Key",
                "Bearer {{.Value}}",
            )
            .unwrap(),
            SecretRule::login(&["chatgpt.com"], "authorization", &["/backend-api/"]).unwrap(),
            SecretRule::token_refresh(&["auth.openai.com"], "/oauth/token", "access").unwrap(),
            SecretRule::header(&["api.example.com"], "x-key", "{{.Value}}")
                .unwrap()
                .with_also_in(AlsoIn::new(&["Api-Key"], &["key"]).unwrap())
                .unwrap(),
        ] {
            let json = serde_json::to_string(&rule).unwrap();
            assert_eq!(serde_json::from_str::<SecretRule>(&json).unwrap(), rule, "{json}");
        }
        let bad = r#"{"kind":"header","hosts":["10.0.0.1"],"header":"x","template":"{{.Value}}"}"#;
        assert!(serde_json::from_str::<SecretRule>(bad).is_err());
        // A rule without `also_in` serialises as it always did (stored rules keep their bytes).
        let plain = SecretRule::header(&["a.test"], "x", "{{.Value}}").unwrap();
        assert!(!serde_json::to_string(&plain).unwrap().contains("also_in"));
        for bad in [
            r#"{"kind":"header","hosts":["a.test"],"header":"x","template":"{{.Value}}","also_in":{"headers":["bad header"]}}"#,
            r#"{"kind":"header","hosts":["a.test"],"header":"x","template":"{{.Value}}","also_in":{"headers":["x"]}}"#,
            r#"{"kind":"header","hosts":["a.test"],"header":"x","template":"{{.Value}}","also_in":{"query":["a&b"]}}"#,
            r#"{"kind":"header","hosts":["a.test"],"header":"x","template":"{{.Value}}","also_in":{"path":true}}"#,
        ] {
            assert!(serde_json::from_str::<SecretRule>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn presets_cover_their_hosts() {
        for p in Preset::ALL {
            assert_eq!(Preset::from_name(p.name()).unwrap(), p);
            assert!(!p.rules().is_empty());
        }
        let header_of = |p: Preset| -> Vec<String> {
            p.rules()
                .iter()
                .map(|r| match &r.kind {
                    RuleKind::Header { header, also_in, .. } => {
                        assert!(also_in.is_empty(), "{p:?}");
                        header.clone()
                    }
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        // Exactly the header each provider's SDK sends its key in.
        assert_eq!(header_of(Preset::Anthropic), ["x-api-key"]);
        assert_eq!(header_of(Preset::OpenAi), ["authorization"]);
        assert_eq!(header_of(Preset::OpenRouter), ["authorization"]);
        assert_eq!(header_of(Preset::GitHub), ["authorization", "authorization"]);
        assert_eq!(header_of(Preset::GitLab), ["private-token", "authorization"]);
        let gh = SecretSpec::preset("gh", Preset::GitHub, "t".into(), None).unwrap();
        assert!(gh.covers("github.com") && gh.covers("api.github.com") && !gh.covers("gist.github.com"));
        assert!(
            Preset::from_name("nope")
                .unwrap_err()
                .to_string()
                .contains("anthropic")
        );
    }

    #[test]
    fn placeholders_are_random_and_prefixed() {
        let a = new_placeholder();
        assert!(a.starts_with(PLACEHOLDER_PREFIX));
        assert_eq!(a.len(), PLACEHOLDER_PREFIX.len() + 32);
        assert_ne!(a, new_placeholder());
    }

    #[test]
    fn secret_names_and_env_validate() {
        let r = Preset::OpenAi.rules();
        assert!(SecretSpec::new("ok.name-1", "v".into(), Some("OPENAI_API_KEY"), r.clone()).is_ok());
        assert!(SecretSpec::new("bad name", "v".into(), None, r.clone()).is_err());
        assert!(SecretSpec::new("n", "v".into(), Some("1X"), r.clone()).is_err());
        assert!(SecretSpec::new("n", "v".into(), Some("A-B"), r).is_err());
        assert!(SecretSpec::new("n", "v".into(), None, vec![]).is_err());
    }
}
