//! The one typed configuration (E17): a YAML file whose keys match the seeds (`egress.proxy_port`, …), with
//! `AGENTHOLD_*` environment overrides, validated at load so that a bad key or value fails at start with a
//! message naming the key (or the variable that set it).
//!
//! Loading: the YAML is merged over [`Config::default`] (every default is stated on its field and in
//! `docs/configuration.md`), then every environment variable named `AGENTHOLD_` + the key path upper-cased
//! with `.` replaced by `_` (`AGENTHOLD_EGRESS_PROXY_PORT`, `AGENTHOLD_DATA_DIR`) overrides its key. The list
//! of keys is derived from the default configuration, so a new field gets its variable automatically. A list
//! key (`egress.deny_cidrs`) takes a comma-separated value.
//! Other `AGENTHOLD_*` variables (such as `AGENTHOLD_MASTER_KEY`) are ignored here. The process environment
//! is only ever read.
// enforces: E17

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

mod harness_logins;
pub use harness_logins::{HarnessLoginsConfig, ProviderLoginConfig};

/// Prefix of every environment variable that overrides a configuration key.
pub const ENV_PREFIX: &str = "AGENTHOLD_";

/// The environment variable holding the database password of a `postgres://` [`Config::store`] (read when
/// the store is opened, never stored; wins over `store_password_file`).
pub const STORE_PASSWORD_ENV: &str = "AGENTHOLD_STORE_PASSWORD";

/// Where [`EgressConfig::dns_upstream`] looks for a nameserver when `egress.dns_upstream` is empty.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// agenthold's configuration. Every field has a default (stated on it); an empty file is a valid
/// configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Directory for the database, the master key and the CA; an absolute path. Default: `""`, meaning
    /// `/var/lib/agenthold` when running as root, otherwise `$XDG_DATA_HOME/agenthold` or
    /// `~/.local/share/agenthold` (see [`Config::data_dir`]).
    pub data_dir: PathBuf,
    /// Where the state lives (agents, users, grants, sealed secrets, tokens, audit, run history): `""` for
    /// the redb file `<data_dir>/db`, or `postgres://user@host[:port]/database[?sslmode=require]` for a
    /// PostgreSQL database (needs the `postgres` cargo feature, on in the `agenthold` binary and the Python
    /// package). The password belongs in `store_password_file` or [`STORE_PASSWORD_ENV`]; one in the URL
    /// works but is shown as `***` in every message. Default: `""`.
    pub store: String,
    /// File holding the database password (a trailing newline is ignored); [`STORE_PASSWORD_ENV`] wins
    /// when set. An absolute path. Default: `""` (none).
    pub store_password_file: PathBuf,
    /// PEM file of CA certificates trusted for the database's TLS (`sslmode=require`), besides the public
    /// web PKI roots. An absolute path. Default: `""` (none).
    pub store_ca_file: PathBuf,
    /// The egress gateway.
    pub egress: EgressConfig,
    /// Secret storage.
    pub secrets: SecretsConfig,
    /// Sandboxes.
    pub sandbox: SandboxConfig,
    /// The HTTP API server.
    pub server: ServerConfig,
    /// The reference server's sessions, login links and rate limits.
    pub auth: AuthConfig,
    /// The reference server's provider logins (Claude, ChatGPT accounts for the harnesses).
    pub harness_logins: HarnessLoginsConfig,
}

/// `egress.*`: the gateway's ports, upstream DNS, request log, timeouts, address deny list and DNS budgets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// `true`: sandboxes have no network access at all. Default: `false`.
    pub disabled: bool,
    /// Port of the transparent proxy (all redirected TCP). Default: `15001`.
    pub proxy_port: u16,
    /// Port of the explicit proxy, the `HTTPS_PROXY` target. Default: `15002`.
    pub explicit_port: u16,
    /// Port of the DNS resolver (UDP and TCP). Default: `15053`.
    pub dns_port: u16,
    /// Port of the sandboxd tunnel. Default: `15003`.
    pub tunnel_port: u16,
    /// Upstream DNS server: `IP` or `IP:PORT` (`[IPv6]:PORT`), port 53 when omitted. Default: `""`, meaning
    /// the first nameserver of `/etc/resolv.conf` (see [`EgressConfig::dns_upstream`]).
    pub dns_upstream: String,
    /// Request log entries kept per agent (the newest are kept). Default: `5000`.
    pub log_keep: usize,
    /// What to do with a request that carries a secret's placeholder to a host outside that secret's rule.
    /// Default: `block`.
    pub leak_guard: LeakGuard,
    /// Seconds to wait for a ClientHello or a request head. Default: `10`.
    pub sniff_timeout_secs: u64,
    /// Seconds to wait for an upstream connection. Default: `10`.
    pub connect_timeout_secs: u64,
    /// Seconds after which a spliced or proxied connection idle in both directions is closed. Default: `600`.
    pub idle_timeout_secs: u64,
    /// Bytes of request log kept per agent, besides `log_keep` (fields are cut to documented lengths; the
    /// oldest entries go first and are counted). Default: `2097152` (2 MiB); at least `4096`.
    pub log_max_bytes: usize,
    /// Connections the gateway holds at once, all agents together (each may use six descriptors).
    /// Default: `0`, meaning derived from the descriptor limit (raised to its hard limit at start).
    pub max_connections: usize,
    /// Connections one agent may hold at once: client connections, CONNECT tunnels and WebSockets.
    /// Default: `1024`.
    pub max_connections_per_agent: usize,
    /// Requests one agent may have in flight upstream at once (HTTP and intercepted HTTPS). Default: `256`.
    pub max_requests_per_agent: usize,
    /// Address ranges the gateway never dials, on top of the built-in guard (IANA special-purpose ranges,
    /// the host's own addresses, provider endpoints): IPv4 or IPv6 CIDRs without host bits. In the
    /// environment: comma-separated. Default: `[]`.
    pub deny_cidrs: Vec<IpNet>,
    /// DNS queries per second each agent may send (token bucket rate; at least 1). Default: `200`.
    pub dns_agent_qps: u32,
    /// DNS queries an agent may send in a burst (token bucket size; at least 1). Default: `400`.
    pub dns_agent_burst: u32,
    /// DNS queries per second for all agents together (at least 1). Default: `2000`.
    pub dns_gateway_qps: u32,
    /// DNS queries in a burst for all agents together (at least 1). Default: `4000`.
    pub dns_gateway_burst: u32,
    /// Of the gateway-wide burst, this many queries are kept for agents that have used less than half of
    /// their own burst, so agents flooding DNS cannot starve the others (less than `dns_gateway_burst`).
    /// Default: `1000`.
    pub dns_gateway_reserve: u32,
    /// Answers the resolver caches, all agents together (each agent has its own entries); `0` disables the
    /// cache. Default: `10000`.
    pub dns_cache_entries: usize,
    /// Shortest time a positive answer stays cached, whatever its TTL. Default: `0` (the TTL is honoured).
    pub dns_cache_min_ttl_secs: u64,
    /// Longest time a positive answer stays cached (at least `dns_cache_min_ttl_secs`). Default: `3600`.
    pub dns_cache_max_ttl_secs: u64,
    /// Longest time a negative answer (NXDOMAIN, NODATA) stays cached; it is otherwise cached for the SOA's
    /// negative TTL (RFC 2308), or not at all without an SOA. Default: `300`.
    pub dns_cache_max_negative_ttl_secs: u64,
    /// UDP sockets the resolver keeps open towards the upstream at most (each on a random port, renewed
    /// regularly; at least 1). Default: `32`.
    pub dns_upstream_sockets: usize,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            disabled: false,
            proxy_port: 15001,
            explicit_port: 15002,
            dns_port: 15053,
            tunnel_port: 15003,
            dns_upstream: String::new(),
            log_keep: 5000,
            leak_guard: LeakGuard::Block,
            sniff_timeout_secs: 10,
            connect_timeout_secs: 10,
            idle_timeout_secs: 600,
            log_max_bytes: 2 * 1024 * 1024,
            max_connections: 0,
            max_connections_per_agent: 1024,
            max_requests_per_agent: 256,
            deny_cidrs: Vec::new(),
            dns_agent_qps: 200,
            dns_agent_burst: 400,
            dns_gateway_qps: 2000,
            dns_gateway_burst: 4000,
            dns_gateway_reserve: 1000,
            dns_cache_entries: 10_000,
            dns_cache_min_ttl_secs: 0,
            dns_cache_max_ttl_secs: 3600,
            dns_cache_max_negative_ttl_secs: 300,
            dns_upstream_sockets: 32,
        }
    }
}

/// `egress.leak_guard`: what happens to a request carrying a placeholder to a host outside its secret's
/// rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LeakGuard {
    /// Refuse the request (the default).
    #[default]
    Block,
    /// Forward it and record the leak in the request log.
    Log,
}

/// `secrets.*`: where the master key lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsConfig {
    /// The master key file (32 raw bytes, mode 0600, created on first start); an absolute path. Default:
    /// `""`, meaning `<data_dir>/master.key`. `AGENTHOLD_MASTER_KEY` (base64), when set, is used instead.
    pub master_key_file: PathBuf,
}

/// `sandbox.*`: container runtime, image and limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// OCI runtime for sandboxes. Default: `runc`.
    pub runtime: ContainerRuntime,
    /// Image for new sandboxes. Default: `agenthold/dev:latest`.
    pub image: String,
    /// CPU limit per sandbox, in CPUs. Default: `2.0`.
    pub cpus: f64,
    /// Memory limit per sandbox, in bytes (at least 16 MiB). Default: `2147483648` (2 GiB).
    pub memory_bytes: u64,
    /// Process limit per sandbox (at least 16). Default: `512`.
    pub pids: u32,
    /// IPv4 pool the agent networks are taken from, one `/subnet_prefix` each; its prefix must be at most
    /// `subnet_prefix`. Default: `10.213.0.0/16`.
    pub subnet_pool: Ipv4Net,
    /// Prefix length of each new agent network taken from `subnet_pool`, 16 to 29 (a network needs the
    /// gateway's `.2`, the gateway holder's join address, the sandbox's address and room for the network
    /// and broadcast addresses). Agents created earlier keep the network in their record, whatever its
    /// size. Default: `28` (16 addresses; 4096 agents in a `/16`).
    pub subnet_prefix: u8,
    /// Sandboxes kept created and started, ready to hand out (no egress until handed out). Only plain
    /// specs use them: the default image, runtime and limits, no environment, secrets or labels. Default:
    /// `0` (off).
    pub warm_pool: usize,
}

/// Default prefix length of an agent network (`sandbox.subnet_prefix`).
pub const DEFAULT_SUBNET_PREFIX: u8 = 28;
/// Shortest allowed prefix length of an agent network (`sandbox.subnet_prefix`).
pub const MIN_SUBNET_PREFIX: u8 = 16;
/// Longest allowed prefix length of an agent network (`sandbox.subnet_prefix`): a /29 has six host
/// addresses, enough for `.1`, the gateway's `.2`, the sandbox and the holder's join address.
pub const MAX_SUBNET_PREFIX: u8 = 29;

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            runtime: ContainerRuntime::Runc,
            image: "agenthold/dev:latest".into(),
            cpus: 2.0,
            memory_bytes: 2 * 1024 * 1024 * 1024,
            pids: 512,
            subnet_pool: Ipv4Net::new_assert(std::net::Ipv4Addr::new(10, 213, 0, 0), 16),
            subnet_prefix: DEFAULT_SUBNET_PREFIX,
            warm_pool: 0,
        }
    }
}

/// `sandbox.runtime`: the OCI runtime sandboxes run under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum ContainerRuntime {
    /// `runc`, Docker's default (the default).
    #[default]
    #[serde(rename = "runc")]
    Runc,
    /// `runsc`: gVisor.
    #[serde(rename = "runsc")]
    Runsc,
    /// `sysbox-runc`: Sysbox.
    #[serde(rename = "sysbox-runc")]
    SysboxRunc,
}

impl ContainerRuntime {
    /// The runtime's name as the container engine knows it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Runsc => "runsc",
            Self::SysboxRunc => "sysbox-runc",
        }
    }
}

/// `server.*`: the HTTP API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the HTTP API listens on. Default: `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// The URL users reach the server at (`https://agents.example.com`), without a path; it sets the
    /// origin that cross-origin checks compare with and the links the server prints. Default: `""`,
    /// meaning `http://` + `server.listen`.
    pub public_url: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            public_url: String::new(),
        }
    }
}

impl ServerConfig {
    /// The public URL without a trailing slash: `server.public_url`, or `http://` + `server.listen`.
    #[must_use]
    pub fn public_url(&self) -> String {
        if self.public_url.is_empty() {
            format!("http://{}", self.listen)
        } else {
            self.public_url.trim_end_matches('/').to_owned()
        }
    }
}

/// `auth.*`: browser sessions, the local admin link and rate limits of the reference server (S6, S7, S13).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// A browser session ends after this many seconds without a request. Default: `43200` (12 hours).
    pub session_idle_secs: u64,
    /// A browser session ends this many seconds after login whatever its use. Default: `604800` (7 days).
    pub session_absolute_secs: u64,
    /// A local admin link is valid this many seconds (and once). Default: `900` (15 minutes).
    pub login_link_secs: u64,
    /// Requests per second one user may make (bursts of 4× pass); `0` turns the limit off. Default: `50`.
    pub rate_per_user: u32,
    /// Requests per second one personal token may make (bursts of 4× pass); `0` turns the limit off.
    /// Default: `50`.
    pub rate_per_token: u32,
    /// Unauthenticated or failed requests per second from one client address, an IPv6 client counted by
    /// its /64 (bursts of 4× pass); `0` turns the limit off. Default: `5`.
    pub rate_unauthenticated: u32,
    /// `auth.oidc`: log in with an OpenID Connect provider. Default: absent (off); the provider is on when
    /// the section is present.
    pub oidc: Option<OidcConfig>,
    /// `auth.github`: log in with GitHub (OAuth app). Default: absent (off); the provider is on when the
    /// section is present.
    pub github: Option<GithubConfig>,
}

/// `auth.oidc.*`: an OpenID Connect provider (Keycloak, Google, Entra ID, Dex, …). The redirect URI to
/// register with it is `server.public_url` + `/auth/oidc/callback`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OidcConfig {
    /// The issuer URL (`https://accounts.google.com`); discovery is read from
    /// `{issuer}/.well-known/openid-configuration` and its `issuer` must equal this. HTTPS unless the host
    /// is loopback. Required.
    pub issuer: String,
    /// The client id registered with the provider. Required.
    pub client_id: String,
    /// A file holding the client secret (read once at start; surrounding whitespace is ignored); an absolute
    /// path. Required.
    pub client_secret_file: PathBuf,
    /// The name on the sign-in button ("Sign in with NAME"). Default: `OIDC`.
    pub name: String,
    /// The scopes asked for; must include `openid`. Default: `[openid, email, profile]`.
    pub scopes: Vec<String>,
}

impl Default for OidcConfig {
    fn default() -> Self {
        Self {
            issuer: String::new(),
            client_id: String::new(),
            client_secret_file: PathBuf::new(),
            name: "OIDC".into(),
            scopes: vec!["openid".into(), "email".into(), "profile".into()],
        }
    }
}

/// `auth.github.*`: a GitHub OAuth app. The callback URL to register is `server.public_url` +
/// `/auth/github/callback`. The endpoints can be changed for GitHub Enterprise Server (or a test stand-in).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GithubConfig {
    /// The OAuth app's client id. Required.
    pub client_id: String,
    /// A file holding the OAuth app's client secret (read once at start; surrounding whitespace is
    /// ignored); an absolute path. Required.
    pub client_secret_file: PathBuf,
    /// The authorization endpoint. Default: `https://github.com/login/oauth/authorize`.
    pub authorize_url: String,
    /// The token endpoint. Default: `https://github.com/login/oauth/access_token`.
    pub token_url: String,
    /// The REST API root (`/user`, `/user/emails` are read from it). Default: `https://api.github.com`.
    pub api_url: String,
}

impl Default for GithubConfig {
    fn default() -> Self {
        Self {
            client_id: String::new(),
            client_secret_file: PathBuf::new(),
            authorize_url: "https://github.com/login/oauth/authorize".into(),
            token_url: "https://github.com/login/oauth/access_token".into(),
            api_url: "https://api.github.com".into(),
        }
    }
}

/// Read a client secret file: its content without surrounding whitespace. `key` names the setting in
/// errors (`auth.github.client_secret_file`). The secret itself never appears in an error or a log.
///
/// # Errors
/// [`Error::Config`] naming `key` when the file cannot be read, is not UTF-8 or is empty.
pub fn read_client_secret(key: &str, path: &Path) -> Result<String> {
    let fail = |problem: String| Error::Config {
        key: key.to_owned(),
        problem,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?;
    let text = String::from_utf8(bytes).map_err(|_| fail(format!("{} is not UTF-8 text", path.display())))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(fail(format!("{} is empty", path.display())));
    }
    Ok(secret.to_owned())
}

/// Whether `url` is `https://HOST…`, or `http://` with a loopback host (`127.0.0.0/8`, `[::1]`,
/// `localhost`): the rule for every URL of a login provider.
#[must_use]
pub fn is_https_or_loopback(url: &str) -> bool {
    if let Some(rest) = url.strip_prefix("https://") {
        return !host_of(rest).is_empty();
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = host_of(rest);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The host of the part of a URL after `scheme://`: up to the first `/`, `?` or `#`, without a port.
fn host_of(rest: &str) -> &str {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return "";
    }
    if authority.starts_with('[') {
        return authority.split_inclusive(']').next().unwrap_or_default();
    }
    authority.split(':').next().unwrap_or_default()
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            session_idle_secs: 12 * 3600,
            session_absolute_secs: 7 * 24 * 3600,
            login_link_secs: 900,
            rate_per_user: 50,
            rate_per_token: 50,
            rate_unauthenticated: 5,
            oidc: None,
            github: None,
        }
    }
}

impl Config {
    /// Load the configuration: the YAML file at `path` when given (no file means all defaults), then the
    /// `AGENTHOLD_*` variables of the process environment.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read; [`Error::Config`] naming the key (or the variable) for
    /// invalid YAML, an unknown key or an invalid value.
    pub fn load(path: Option<&Path>) -> Result<Self> {
        let text = match path {
            Some(path) => std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?,
            None => String::new(),
        };
        let known = leaf_keys()?;
        let mut env = Vec::new();
        for (name, value) in std::env::vars_os() {
            let Some(name) = name.to_str().filter(|n| known.contains_key(*n)) else {
                continue;
            };
            let value = value.into_string().map_err(|_| Error::Config {
                key: name.to_owned(),
                problem: "is not valid UTF-8".into(),
            })?;
            env.push((name.to_owned(), value));
        }
        Self::from_yaml(&text, env).map_err(|e| match (e, path) {
            (Error::Config { key, problem }, Some(path)) if key == DOCUMENT => Error::Config {
                key: path.display().to_string(),
                problem,
            },
            (e, _) => e,
        })
    }

    /// Parse `text` (YAML; empty means all defaults) and apply the `AGENTHOLD_*` variables among `env`
    /// (others are ignored). Pure: reads neither files nor the process environment.
    ///
    /// A section given without keys (`egress:`) keeps its defaults; a key given without a value is an
    /// error. An environment value for a text key is taken verbatim; for other keys it is parsed as a YAML
    /// scalar (`15001`, `true`, `2.5`).
    ///
    /// # Errors
    /// [`Error::Config`] whose `key` is the dotted key path (`egress.proxy_port`) or, for a value that came
    /// from the environment, the variable's name.
    pub fn from_yaml(text: &str, env: impl IntoIterator<Item = (String, String)>) -> Result<Self> {
        let mut tree = defaults_tree()?;
        let user: Value = serde_saphyr::from_str(text).map_err(|e| Error::Config {
            key: DOCUMENT.into(),
            problem: format!("invalid YAML: {e}"),
        })?;
        match user {
            Value::Null => {}
            Value::Object(user) => merge(&mut tree, user, "")?,
            other => {
                return Err(Error::Config {
                    key: DOCUMENT.into(),
                    problem: format!("expected a mapping of sections, found {}", kind_of(&other)),
                });
            }
        }
        let known = leaf_keys()?;
        // key path -> variable that set it, to name the variable in errors.
        let mut origin = BTreeMap::new();
        for (name, raw) in env {
            let Some(leaf) = known.get(&name) else { continue };
            let value = if leaf.default.is_string() {
                Value::String(raw)
            } else if leaf.default.is_array() {
                // A list from the environment: comma-separated items, each taken verbatim (trimmed).
                Value::Array(
                    raw.split(',')
                        .map(str::trim)
                        .filter(|item| !item.is_empty())
                        .map(|item| Value::String(item.to_owned()))
                        .collect(),
                )
            } else {
                parse_scalar(&raw).ok_or_else(|| Error::Config {
                    key: name.clone(),
                    problem: if raw.trim().is_empty() {
                        format!("is empty (sets {})", leaf.path)
                    } else {
                        format!("{raw:?} is not a single value (sets {})", leaf.path)
                    },
                })?
            };
            set_path(&mut tree, &leaf.path, value);
            tracing::debug!(variable = %name, key = %leaf.path, "configuration key set from the environment");
            origin.insert(leaf.path.clone(), name);
        }
        // Blame the first key involved that an environment variable set (a list item, `key[1]`, counts as its
        // list's key), else the first key.
        let set_by = |k: &str| {
            let list = k.split_once('[').map_or(k, |(list, _)| list);
            origin.get(k).or_else(|| origin.get(list))
        };
        let name_key = |keys: Vec<String>, problem: String| match keys
            .iter()
            .find_map(|k| set_by(k).map(|var| (k, var)))
        {
            Some((path, var)) => Error::Config {
                key: var.clone(),
                problem: format!("{problem} (sets {path})"),
            },
            None => Error::Config {
                key: keys.into_iter().next().unwrap_or_default(),
                problem,
            },
        };
        let config: Self = serde_path_to_error::deserialize(tree)
            .map_err(|e| name_key(vec![e.path().to_string()], e.inner().to_string()))?;
        config
            .validate()
            .map_err(|(keys, problem)| name_key(keys, problem))?;
        Ok(config)
    }

    /// Every environment variable that overrides a key, with the key's dotted path, in key order.
    ///
    /// # Errors
    /// [`Error::Config`] only if the default configuration cannot be represented (a bug).
    pub fn environment_variables() -> Result<Vec<(String, String)>> {
        Ok(leaf_keys()?
            .into_iter()
            .map(|(var, leaf)| (var, leaf.path))
            .collect())
    }

    /// The data directory: `data_dir`, or when empty `/var/lib/agenthold` for root (effective uid 0), else
    /// `$XDG_DATA_HOME/agenthold` (when set and absolute) or `$HOME/.local/share/agenthold`.
    ///
    /// # Errors
    /// [`Error::Config`] for `data_dir` when it is empty, the process is not root and neither
    /// `XDG_DATA_HOME` nor `HOME` gives a directory.
    pub fn data_dir(&self) -> Result<PathBuf> {
        if !self.data_dir.as_os_str().is_empty() {
            return Ok(self.data_dir.clone());
        }
        let xdg = std::env::var_os("XDG_DATA_HOME");
        let home = std::env::var_os("HOME");
        default_data_dir(
            rustix::process::geteuid().is_root(),
            xdg.as_deref(),
            home.as_deref(),
        )
        .ok_or_else(|| Error::Config {
            key: "data_dir".into(),
            problem: "is empty and neither XDG_DATA_HOME nor HOME is set; set data_dir or \
                          AGENTHOLD_DATA_DIR"
                .into(),
        })
    }

    /// The master key file: `secrets.master_key_file`, or `<data_dir>/master.key` when empty.
    ///
    /// # Errors
    /// As [`Config::data_dir`].
    pub fn master_key_file(&self) -> Result<PathBuf> {
        if self.secrets.master_key_file.as_os_str().is_empty() {
            Ok(self.data_dir()?.join("master.key"))
        } else {
            Ok(self.secrets.master_key_file.clone())
        }
    }

    /// Check the values serde cannot: ranges, distinct ports, parseable addresses. Returns the key paths
    /// involved (the offending one first) and the problem.
    fn validate(&self) -> Result<(), (Vec<String>, String)> {
        let fail = |key: &str, problem: String| Err((vec![key.to_owned()], problem));
        if !self.store.is_empty() && !crate::store::is_postgres_url(&self.store) {
            return fail(
                "store",
                format!(
                    "{:?} must be empty (the redb file in data_dir) or a postgres:// URL",
                    crate::store::redact_url(&self.store)
                ),
            );
        }
        for (key, path) in [
            ("data_dir", &self.data_dir),
            ("secrets.master_key_file", &self.secrets.master_key_file),
            ("store_password_file", &self.store_password_file),
            ("store_ca_file", &self.store_ca_file),
        ] {
            if !path.as_os_str().is_empty() && !path.is_absolute() {
                return fail(
                    key,
                    format!(
                        "{} must be an absolute path (or empty for the default)",
                        path.display()
                    ),
                );
            }
        }
        let e = &self.egress;
        let ports = [
            ("egress.proxy_port", e.proxy_port),
            ("egress.explicit_port", e.explicit_port),
            ("egress.dns_port", e.dns_port),
            ("egress.tunnel_port", e.tunnel_port),
        ];
        for (i, (key, port)) in ports.iter().enumerate() {
            if *port == 0 {
                return fail(key, "must be a port from 1 to 65535, found 0".into());
            }
            if let Some((other, _)) = ports[..i].iter().find(|(_, p)| p == port) {
                let problem =
                    format!("port {port} is both {other} and {key}; the egress ports must all differ");
                return Err((vec![(*key).to_owned(), (*other).to_owned()], problem));
            }
        }
        if e.log_keep == 0 {
            return fail("egress.log_keep", "must be at least 1, found 0".into());
        }
        let a = &self.auth;
        for (key, value) in [
            ("auth.session_idle_secs", a.session_idle_secs),
            ("auth.session_absolute_secs", a.session_absolute_secs),
            ("auth.login_link_secs", a.login_link_secs),
        ] {
            if value == 0 {
                return fail(key, "must be at least 1, found 0".into());
            }
        }
        if let Some(o) = &a.oidc {
            validate_oidc(o).map_err(|(key, problem)| (vec![key], problem))?;
        }
        if let Some(g) = &a.github {
            validate_github(g).map_err(|(key, problem)| (vec![key], problem))?;
        }
        let url = &self.server.public_url;
        if !url.is_empty() {
            let rest = url
                .strip_prefix("https://")
                .or_else(|| url.strip_prefix("http://"));
            let ok = rest.is_some_and(|r| {
                let host = r.trim_end_matches('/');
                !host.is_empty() && !host.contains(['/', '?', '#', ' ', '@'])
            });
            if !ok {
                return fail(
                    "server.public_url",
                    format!(
                        "{url:?} must be http:// or https:// followed by a host (and port), without a path"
                    ),
                );
            }
        }
        if e.log_max_bytes < 4096 {
            return fail(
                "egress.log_max_bytes",
                format!("must be at least 4096, found {}", e.log_max_bytes),
            );
        }
        for (key, n) in [
            ("egress.max_connections_per_agent", e.max_connections_per_agent),
            ("egress.max_requests_per_agent", e.max_requests_per_agent),
            ("egress.dns_upstream_sockets", e.dns_upstream_sockets),
        ] {
            if n == 0 {
                return fail(key, "must be at least 1, found 0".into());
            }
        }
        if !e.dns_upstream.is_empty() && parse_dns_upstream(&e.dns_upstream).is_none() {
            return fail(
                "egress.dns_upstream",
                format!(
                    "{:?} is not an IP address or IP:PORT (e.g. 192.0.2.53 or [2001:db8::53]:53)",
                    e.dns_upstream
                ),
            );
        }
        for (i, net) in e.deny_cidrs.iter().enumerate() {
            if net.trunc() != *net {
                return fail(
                    &format!("egress.deny_cidrs[{i}]"),
                    format!("{net} has host bits set; did you mean {}?", net.trunc()),
                );
            }
        }
        for (key, value) in [
            ("egress.dns_agent_qps", e.dns_agent_qps),
            ("egress.dns_agent_burst", e.dns_agent_burst),
            ("egress.dns_gateway_qps", e.dns_gateway_qps),
            ("egress.dns_gateway_burst", e.dns_gateway_burst),
        ] {
            if value == 0 {
                return fail(key, "must be at least 1, found 0".into());
            }
        }
        if e.dns_gateway_reserve >= e.dns_gateway_burst {
            let problem = format!(
                "{} must be less than egress.dns_gateway_burst ({})",
                e.dns_gateway_reserve, e.dns_gateway_burst
            );
            return Err((
                vec![
                    "egress.dns_gateway_reserve".into(),
                    "egress.dns_gateway_burst".into(),
                ],
                problem,
            ));
        }
        if e.dns_cache_min_ttl_secs > e.dns_cache_max_ttl_secs {
            return Err((
                vec![
                    "egress.dns_cache_min_ttl_secs".into(),
                    "egress.dns_cache_max_ttl_secs".into(),
                ],
                format!(
                    "{} must not exceed egress.dns_cache_max_ttl_secs ({})",
                    e.dns_cache_min_ttl_secs, e.dns_cache_max_ttl_secs
                ),
            ));
        }
        for (key, secs) in [
            ("egress.sniff_timeout_secs", e.sniff_timeout_secs),
            ("egress.connect_timeout_secs", e.connect_timeout_secs),
            ("egress.idle_timeout_secs", e.idle_timeout_secs),
        ] {
            if secs == 0 {
                return fail(key, "must be at least 1 second, found 0".into());
            }
        }
        if let Err((key, problem)) = self.harness_logins.validate() {
            return Err((vec![key], problem));
        }
        let s = &self.sandbox;
        if s.image.trim().is_empty() {
            return fail("sandbox.image", "must not be empty".into());
        }
        if !(s.cpus.is_finite() && s.cpus > 0.0) {
            return fail(
                "sandbox.cpus",
                format!("must be greater than 0, found {}", s.cpus),
            );
        }
        if s.memory_bytes < MIN_MEMORY_BYTES {
            return fail(
                "sandbox.memory_bytes",
                format!(
                    "must be at least {MIN_MEMORY_BYTES} (16 MiB), found {}",
                    s.memory_bytes
                ),
            );
        }
        if s.pids < 16 {
            return fail("sandbox.pids", format!("must be at least 16, found {}", s.pids));
        }
        if !(MIN_SUBNET_PREFIX..=MAX_SUBNET_PREFIX).contains(&s.subnet_prefix) {
            return fail(
                "sandbox.subnet_prefix",
                format!(
                    "must be {MIN_SUBNET_PREFIX} to {MAX_SUBNET_PREFIX}, found {}",
                    s.subnet_prefix
                ),
            );
        }
        if s.subnet_pool.prefix_len() > s.subnet_prefix {
            return fail(
                "sandbox.subnet_pool",
                format!(
                    "{} is smaller than one /{} (sandbox.subnet_prefix); use a prefix of {} or less",
                    s.subnet_pool, s.subnet_prefix, s.subnet_prefix
                ),
            );
        }
        if s.subnet_pool.trunc() != s.subnet_pool {
            return fail(
                "sandbox.subnet_pool",
                format!(
                    "{} has host bits set; did you mean {}?",
                    s.subnet_pool,
                    s.subnet_pool.trunc()
                ),
            );
        }
        Ok(())
    }
}

impl EgressConfig {
    /// The upstream DNS server: `dns_upstream` when set, otherwise the first usable nameserver of
    /// `/etc/resolv.conf` (see [`parse_resolv_conf`]).
    ///
    /// # Errors
    /// [`Error::Io`] when resolv.conf cannot be read; [`Error::Config`] for `egress.dns_upstream` when it
    /// is invalid, or empty and resolv.conf names no usable nameserver.
    pub fn dns_upstream(&self) -> Result<SocketAddr> {
        let fail = |problem: String| Error::Config {
            key: "egress.dns_upstream".into(),
            problem,
        };
        if !self.dns_upstream.is_empty() {
            return parse_dns_upstream(&self.dns_upstream)
                .ok_or_else(|| fail(format!("{:?} is not an IP address or IP:PORT", self.dns_upstream)));
        }
        let text = std::fs::read_to_string(RESOLV_CONF).map_err(|e| Error::io(RESOLV_CONF, e))?;
        parse_resolv_conf(&text).ok_or_else(|| {
            fail(format!(
                "is empty and {RESOLV_CONF} names no usable nameserver; set egress.dns_upstream"
            ))
        })
    }

    /// `sniff_timeout_secs` as a duration.
    #[must_use]
    pub fn sniff_timeout(&self) -> Duration {
        Duration::from_secs(self.sniff_timeout_secs)
    }

    /// `connect_timeout_secs` as a duration.
    #[must_use]
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout_secs)
    }

    /// `idle_timeout_secs` as a duration.
    #[must_use]
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout_secs)
    }
}

/// The default data directory: `/var/lib/agenthold` for root, else `<xdg_data_home>/agenthold` when that is
/// an absolute path (relative values are ignored, as the XDG specification says), else
/// `<home>/.local/share/agenthold`; `None` when no directory can be derived.
#[must_use]
pub fn default_data_dir(
    is_root: bool,
    xdg_data_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Option<PathBuf> {
    if is_root {
        return Some(PathBuf::from("/var/lib/agenthold"));
    }
    if let Some(xdg) = xdg_data_home.map(Path::new).filter(|p| p.is_absolute()) {
        return Some(xdg.join("agenthold"));
    }
    home.filter(|h| !h.is_empty())
        .map(|h| Path::new(h).join(".local/share/agenthold"))
}

/// The first usable nameserver of a resolv.conf text, on port 53. Comments (`#`, `;`) and other options
/// are skipped; an IPv6 address with a numeric zone (`fe80::1%2`) keeps it as the scope id, one with an
/// interface name (`fe80::1%eth0`) is skipped, as are entries that do not parse.
#[must_use]
pub fn parse_resolv_conf(text: &str) -> Option<SocketAddr> {
    text.lines().find_map(|line| {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            return None;
        }
        let addr = words.next()?;
        match addr.split_once('%') {
            None => addr.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)),
            Some((ip, zone)) => {
                let ip: Ipv6Addr = ip.parse().ok()?;
                let scope: u32 = zone.parse().ok()?;
                Some(SocketAddr::V6(SocketAddrV6::new(ip, 53, 0, scope)))
            }
        }
    })
}

/// `IP`, `IP:PORT` or `[IPv6]:PORT`, or `[IPv6]`; port 53 when omitted; port 0 is refused.
fn parse_dns_upstream(text: &str) -> Option<SocketAddr> {
    let text = text.trim();
    let addr = text
        .parse::<SocketAddr>()
        .ok()
        .or_else(|| text.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))
        .or_else(|| {
            let inner = text.strip_prefix('[')?.strip_suffix(']')?;
            inner
                .parse::<Ipv6Addr>()
                .ok()
                .map(|ip| SocketAddr::new(IpAddr::V6(ip), 53))
        })?;
    (addr.port() != 0).then_some(addr)
}

const MIN_MEMORY_BYTES: u64 = 16 * 1024 * 1024;

/// The rules of `auth.oidc`: (key, problem) of the first one broken.
fn validate_oidc(o: &OidcConfig) -> std::result::Result<(), (String, String)> {
    let fail = |key: &str, problem: String| Err((format!("auth.oidc.{key}"), problem));
    if o.issuer.is_empty() {
        return fail("issuer", "is required (the provider's issuer URL)".into());
    }
    if !is_https_or_loopback(&o.issuer) {
        return fail("issuer", "must be https unless the host is loopback".into());
    }
    if o.issuer.contains(['?', '#']) {
        return fail(
            "issuer",
            format!("{:?} must not have a query or fragment", o.issuer),
        );
    }
    if o.client_id.is_empty() {
        return fail("client_id", "is required".into());
    }
    if o.client_secret_file.as_os_str().is_empty() || !o.client_secret_file.is_absolute() {
        return fail(
            "client_secret_file",
            "is required and must be an absolute path".into(),
        );
    }
    if o.name.trim().is_empty() || o.name.chars().count() > 64 || o.name.chars().any(char::is_control) {
        return fail(
            "name",
            "must be 1 to 64 characters without control characters".into(),
        );
    }
    if !o.scopes.iter().any(|s| s == "openid") {
        return fail("scopes", "must include openid".into());
    }
    if let Some(bad) = o
        .scopes
        .iter()
        .find(|s| s.is_empty() || !s.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\'))
    {
        return fail("scopes", format!("{bad:?} is not a valid scope"));
    }
    Ok(())
}

/// The rules of `auth.github`: (key, problem) of the first one broken.
fn validate_github(g: &GithubConfig) -> std::result::Result<(), (String, String)> {
    let fail = |key: &str, problem: String| Err((format!("auth.github.{key}"), problem));
    if g.client_id.is_empty() {
        return fail("client_id", "is required".into());
    }
    if g.client_secret_file.as_os_str().is_empty() || !g.client_secret_file.is_absolute() {
        return fail(
            "client_secret_file",
            "is required and must be an absolute path".into(),
        );
    }
    for (key, url) in [
        ("authorize_url", &g.authorize_url),
        ("token_url", &g.token_url),
        ("api_url", &g.api_url),
    ] {
        if !is_https_or_loopback(url) {
            return fail(key, "must be https unless the host is loopback".into());
        }
        if url.contains('#') {
            return fail(key, format!("{url:?} must not have a fragment"));
        }
    }
    Ok(())
}

/// The optional sections (absent by default) with the defaults their keys get when the section is given:
/// their keys are known (unknown ones are refused, environment variables exist) even though the default
/// configuration has none.
fn optional_sections() -> Result<Vec<(&'static str, Value)>> {
    let value = |v: serde_json::Result<Value>| {
        v.map_err(|e| Error::Config {
            key: DOCUMENT.into(),
            problem: format!("default configuration: {e}"),
        })
    };
    Ok(vec![
        ("auth.oidc", value(serde_json::to_value(OidcConfig::default()))?),
        (
            "auth.github",
            value(serde_json::to_value(GithubConfig::default()))?,
        ),
    ])
}

/// The template of the optional section at `path`, if it is one.
fn optional_section(path: &str) -> Option<Value> {
    optional_sections()
        .ok()?
        .into_iter()
        .find_map(|(p, v)| (p == path).then_some(v))
}

/// The `key` of errors about the document as a whole (bad YAML, not a mapping).
const DOCUMENT: &str = "(document)";

/// A leaf key: its dotted path and its default value.
struct Leaf {
    path: String,
    default: Value,
}

fn defaults_tree() -> Result<Value> {
    serde_json::to_value(Config::default()).map_err(|e| Error::Config {
        key: DOCUMENT.into(),
        problem: format!("default configuration: {e}"),
    })
}

/// Environment variable name -> leaf, from the default configuration.
fn leaf_keys() -> Result<BTreeMap<String, Leaf>> {
    fn walk(value: &Value, path: &str, out: &mut BTreeMap<String, Leaf>) {
        if let Value::Object(map) = value {
            for (key, child) in map {
                let child_path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                walk(child, &child_path, out);
            }
        } else {
            let var = format!("{ENV_PREFIX}{}", path.to_ascii_uppercase().replace('.', "_"));
            out.insert(
                var,
                Leaf {
                    path: path.to_owned(),
                    default: value.clone(),
                },
            );
        }
    }
    let mut tree = defaults_tree()?;
    for (path, template) in optional_sections()? {
        set_path(&mut tree, path, template);
    }
    let mut out = BTreeMap::new();
    walk(&tree, "", &mut out);
    Ok(out)
}

/// Merge the user's mapping into the defaults, refusing keys the defaults do not have.
fn merge(tree: &mut Value, user: Map<String, Value>, path: &str) -> Result<()> {
    let Value::Object(defaults) = tree else {
        return Ok(());
    };
    let known = defaults.keys().cloned().collect::<Vec<_>>().join(", ");
    for (key, value) in user {
        let key_path = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        let Some(slot) = defaults.get_mut(&key) else {
            let place = if path.is_empty() {
                "at the top level".to_owned()
            } else {
                format!("in {path}")
            };
            return Err(Error::Config {
                key: key_path,
                problem: format!("unknown key; known keys {place}: {known}"),
            });
        };
        if slot.is_null()
            && value.is_object()
            && let Some(template) = optional_section(&key_path)
        {
            *slot = template;
        }
        match (slot.is_object(), value) {
            (true, Value::Null) => {}
            // An optional section written as `null` (or without keys): it stays off.
            (false, Value::Null) if slot.is_null() && optional_section(&key_path).is_some() => {}
            (true, Value::Object(inner)) => merge(slot, inner, &key_path)?,
            (true, other) => {
                let keys = slot
                    .as_object()
                    .map(|m| m.keys().cloned().collect::<Vec<_>>().join(", "));
                return Err(Error::Config {
                    key: key_path,
                    problem: format!(
                        "expected a section with keys {}, found {}",
                        keys.unwrap_or_default(),
                        kind_of(&other)
                    ),
                });
            }
            (false, Value::Null) => {
                return Err(Error::Config {
                    key: key_path,
                    problem: format!("has no value; remove the key to use the default ({slot})"),
                });
            }
            (false, value) => *slot = value,
        }
    }
    Ok(())
}

/// An environment value as a YAML scalar; `None` for an empty value, a mapping or a sequence.
fn parse_scalar(raw: &str) -> Option<Value> {
    match serde_saphyr::from_str::<Value>(raw) {
        Ok(v @ (Value::Bool(_) | Value::Number(_) | Value::String(_))) => Some(v),
        Ok(_) => None,
        // Not YAML (`[1`): keep the text, so the type error names the expected type.
        Err(_) => Some(Value::String(raw.to_owned())),
    }
}

/// Set the key at dotted `path`; an absent optional section on the way is given its template first (an
/// environment variable of one of its keys turns it on).
fn set_path(tree: &mut Value, path: &str, value: Value) {
    let mut node = tree;
    let mut walked = String::new();
    for part in path.split('.') {
        if node.is_null()
            && let Some(template) = optional_section(&walked)
        {
            *node = template;
        }
        let Value::Object(map) = node else { return };
        node = map.entry(part.to_owned()).or_insert(Value::Null);
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(part);
    }
    *node = value;
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a sequence",
        Value::Object(_) => "a mapping",
    }
}
