//! What a sandbox is given: [`Policy`] (E8, E9) and [`Secret`] (E10–E13). Both are validated when they are
//! constructed, so a bad entry or template fails where it is written, not when a sandbox starts.

use agenthold_core::secret::{AlsoIn, Preset, SecretRule, SecretSpec, SecretValue};
use agenthold_core::{NetworkPolicy, PolicyMode};
use pyo3::prelude::*;

use crate::errors::{Class, core_err};

/// A network policy: which destinations a sandbox may reach.
///
/// Build one with `Policy.open()`, `Policy.allowlist([...])` or `Policy.report_only([...])`. Entries are
/// `github.com` (ports 80 and 443), `*.npmjs.org` (subdomains only), `github.com:22`,
/// `registry.example.com:*` (any port) and `203.0.113.0/24:443`. Under an allowlist, DNS queries for names
/// that no entry covers get NXDOMAIN. Private, loopback and metadata addresses are never reachable.
#[pyclass(frozen, module = "agenthold", name = "Policy")]
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub(crate) inner: NetworkPolicy,
    entries: Vec<String>,
}

impl Policy {
    fn parse(mode: PolicyMode, entries: Vec<String>) -> PyResult<Self> {
        let inner = NetworkPolicy::parse(mode, &entries).map_err(|e| {
            let (class, message) = crate::errors::classify(e.kind(), e.to_string());
            class.err(format!(
                "{message}; entries look like github.com, *.npmjs.org, github.com:22, \
                 registry.example.com:* or 203.0.113.0/24:443"
            ))
        })?;
        Ok(Self { inner, entries })
    }
}

#[pymethods]
impl Policy {
    /// Any public destination (the default). Private and metadata addresses stay unreachable.
    #[staticmethod]
    fn open() -> Self {
        Self {
            inner: NetworkPolicy::open(),
            entries: Vec::new(),
        }
    }

    /// Only the destinations the entries cover; other names get NXDOMAIN and other connections are
    /// refused. Raises `PolicyError` for an entry that does not parse.
    #[staticmethod]
    fn allowlist(entries: Vec<String>) -> PyResult<Self> {
        Self::parse(PolicyMode::Allowlist, entries)
    }

    /// Like an allowlist, but nothing is refused: the request log records what the allowlist would have
    /// denied (`reason` starts with `report_only:`). Raises `PolicyError` for an entry that does not parse.
    #[staticmethod]
    fn report_only(entries: Vec<String>) -> PyResult<Self> {
        Self::parse(PolicyMode::ReportOnly, entries)
    }

    /// `"open"`, `"allowlist"` or `"report_only"`.
    #[getter]
    fn mode(&self) -> &'static str {
        match self.inner.mode {
            PolicyMode::Open => "open",
            PolicyMode::Allowlist => "allowlist",
            PolicyMode::ReportOnly => "report_only",
        }
    }

    /// The entries as given.
    #[getter]
    fn entries(&self) -> Vec<String> {
        self.entries.clone()
    }

    fn __repr__(&self) -> String {
        match self.inner.mode {
            PolicyMode::Open => "Policy.open()".to_owned(),
            _ => format!("Policy.{}({:?})", self.mode(), self.entries),
        }
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.inner == other.inner
    }
}

/// A secret attached to a sandbox. Its value never enters the sandbox: the sandbox sees a placeholder
/// (`agenthold-placeholder-...`, in the environment variable `env` if given) and the egress gateway sets
/// `header` to `template` rendered with the value on HTTPS requests to `hosts`, replacing the placeholder
/// wherever it appears in request headers or the query string.
///
/// `template` uses `{{.Value}}`, `base64` and `print`, e.g. `Basic {{base64 (print "x-access-token:" .Value)}}`.
/// Defaults: `header="Authorization"`, `template="Bearer {{.Value}}"`.
///
/// The value is kept on the native side only: no attribute, `repr`, `str` or pickle gives it back.
/// Invalid names, hosts, headers and templates raise `SecretError` here.
#[pyclass(frozen, module = "agenthold", name = "Secret")]
#[derive(Debug)]
pub(crate) struct Secret {
    pub(crate) spec: SecretSpec,
    hosts: Vec<String>,
    header: Option<String>,
    template: Option<String>,
    preset: Option<&'static str>,
}

/// Re-attach the secret's name to a rule error (rules are validated before the secret has a name).
fn rule_err(name: &str, e: agenthold_core::Error) -> PyErr {
    match e {
        agenthold_core::Error::Secret { problem, .. } => {
            Class::Secret.err(format!("invalid secret {name:?}: {problem}"))
        }
        agenthold_core::Error::Template { template, position, problem } => Class::Secret.err(format!(
            "invalid secret {name:?}: template {template:?} at byte {position}: {problem}; templates look like \
             \"Bearer {{{{.Value}}}}\" or \"Basic {{{{base64 (print \\\"user:\\\" .Value)}}}}\""
        )),
        other => core_err(other),
    }
}

#[pymethods]
impl Secret {
    /// A secret injected as `header: template` on HTTPS requests to `hosts` (names or `*.` wildcards).
    /// `also_in={"headers": [...], "query": [...]}` names further headers and query parameters whose
    /// placeholder is replaced; a placeholder anywhere else in a request to `hosts` is refused (403).
    #[new]
    #[pyo3(signature = (name, value, env=None, hosts=Vec::new(), header=None, template=None, also_in=None))]
    fn new(
        name: &str,
        value: &str,
        env: Option<&str>,
        hosts: Vec<String>,
        header: Option<String>,
        template: Option<String>,
        also_in: Option<std::collections::HashMap<String, Vec<String>>>,
    ) -> PyResult<Self> {
        if hosts.is_empty() {
            return Err(Class::Secret.err(format!(
                "invalid secret {name:?}: give hosts=[...], the hosts the value may be sent to (for example \
                 [\"api.example.com\"]), or use Secret.preset(...)"
            )));
        }
        let header_name = header.as_deref().unwrap_or("Authorization");
        let template_src = template.as_deref().unwrap_or("Bearer {{.Value}}");
        let mut rule =
            SecretRule::header(&hosts, header_name, template_src).map_err(|e| rule_err(name, e))?;
        if let Some(mut places) = also_in {
            let headers = places.remove("headers").unwrap_or_default();
            let query = places.remove("query").unwrap_or_default();
            if let Some(other) = places.keys().next() {
                return Err(Class::Secret.err(format!(
                    "invalid secret {name:?}: also_in takes \"headers\" and \"query\", not {other:?}"
                )));
            }
            let places = AlsoIn::new(&headers, &query).map_err(|e| rule_err(name, e))?;
            rule = rule.with_also_in(places).map_err(|e| rule_err(name, e))?;
        }
        let spec = SecretSpec::new(name, SecretValue::from(value), env, vec![rule]).map_err(core_err)?;
        Ok(Self {
            spec,
            hosts,
            header,
            template,
            preset: None,
        })
    }

    /// A secret with a provider's built-in rules: `anthropic` (x-api-key on api.anthropic.com), `openai`,
    /// `github` (api.github.com and git over HTTPS on github.com), `gitlab`, `openrouter`. The secret is
    /// named after the preset. Raises `SecretError` for an unknown preset.
    #[staticmethod]
    #[pyo3(signature = (preset, value, env=None))]
    fn preset(preset: &str, value: &str, env: Option<&str>) -> PyResult<Self> {
        let p = Preset::from_name(preset).map_err(core_err)?;
        let spec = SecretSpec::preset(p.name(), p, SecretValue::from(value), env).map_err(core_err)?;
        let hosts = spec
            .rules
            .iter()
            .flat_map(|r| r.hosts.iter())
            .map(|h| match h {
                agenthold_core::policy::HostPattern::Exact(n) => n.clone(),
                agenthold_core::policy::HostPattern::Subdomains(s) => format!("*.{s}"),
                agenthold_core::policy::HostPattern::Network(n) => n.to_string(),
            })
            .collect();
        Ok(Self {
            spec,
            hosts,
            header: None,
            template: None,
            preset: Some(p.name()),
        })
    }

    /// The secret's name (unique per sandbox).
    #[getter]
    fn name(&self) -> &str {
        &self.spec.name
    }

    /// The environment variable that holds the placeholder inside the sandbox, if any.
    #[getter]
    fn env(&self) -> Option<&str> {
        self.spec.env.as_deref()
    }

    /// The hosts the value may be sent to.
    #[getter]
    fn hosts(&self) -> Vec<String> {
        self.hosts.clone()
    }

    /// The header set on requests to `hosts` (`None` for a preset or the default `Authorization`).
    #[getter]
    fn header(&self) -> Option<&str> {
        self.header.as_deref()
    }

    /// The header template (`None` for a preset or the default `Bearer {{.Value}}`).
    #[getter]
    fn template(&self) -> Option<&str> {
        self.template.as_deref()
    }

    /// The preset's name for `Secret.preset(...)`, else `None`.
    #[getter]
    fn preset_name(&self) -> Option<&'static str> {
        self.preset
    }

    fn __repr__(&self) -> String {
        let env = self
            .spec
            .env
            .as_deref()
            .map_or_else(|| "None".to_owned(), |e| format!("{e:?}"));
        match self.preset {
            Some(p) => format!("Secret.preset({p:?}, value=<hidden>, env={env})"),
            None => format!(
                "Secret({:?}, value=<hidden>, env={env}, hosts={:?})",
                self.spec.name, self.hosts
            ),
        }
    }

    fn __reduce__(&self) -> PyResult<()> {
        Err(Class::Secret.err("a Secret cannot be pickled or copied: its value stays on the native side"))
    }
}
