//! `harness_logins.*`: the OAuth endpoints of the provider logins the reference server connects (S3, E15):
//! a user's Claude or ChatGPT account, used by the `claude` and `codex` harnesses inside agents. The
//! defaults are the providers' public values as the real harness binaries use them (`claude` 2.1.332,
//! `codex` 0.171.0); a deployment changes them only to point at a stand-in or a provider's other
//! environment.

use serde::{Deserialize, Serialize};

use super::is_https_or_loopback;

/// `harness_logins.*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HarnessLoginsConfig {
    /// How long a started login may wait for its code, in seconds. Default: `600`.
    pub attempt_secs: u64,
    /// Every this many seconds the server checks that each attached login's owner still administers the
    /// agent, and detaches it otherwise (it also checks on every membership or grant change and before a
    /// run starts). Default: `60`.
    pub recheck_secs: u64,
    /// `harness_logins.claude.*`: a Claude (claude.ai) account for the `claude` harness.
    pub claude: ProviderLoginConfig,
    /// `harness_logins.chatgpt.*`: a ChatGPT account for the `codex` harness.
    pub chatgpt: ProviderLoginConfig,
}

impl Default for HarnessLoginsConfig {
    fn default() -> Self {
        Self {
            attempt_secs: 600,
            recheck_secs: 60,
            claude: ProviderLoginConfig::claude(),
            chatgpt: ProviderLoginConfig::chatgpt(),
        }
    }
}

/// One provider's OAuth client as its harness is registered (public client, PKCE S256).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderLoginConfig {
    /// The authorization endpoint the user's browser is sent to.
    pub authorize_url: String,
    /// The token endpoint the server exchanges the code at (and, unless `refresh_host`/`refresh_path` say
    /// otherwise, where the harness inside the sandbox sends its refreshes, answered by the gateway).
    pub token_url: String,
    /// The harness's OAuth client id.
    pub client_id: String,
    /// The redirect URI registered for that client (the provider shows the code there, or redirects to it
    /// with `code` and `state` in the query).
    pub redirect_uri: String,
    /// The scopes asked for.
    pub scopes: Vec<String>,
    /// The API hosts the harness sends the access token to (in `Authorization`).
    pub api_hosts: Vec<String>,
    /// The API paths (prefixes) the access token is injected on; other paths of the API hosts get the
    /// placeholder only.
    pub api_paths: Vec<String>,
    /// The host the harness sends refreshes to; empty: the host of `token_url`.
    #[serde(default)]
    pub refresh_host: String,
    /// The path the harness sends refreshes to; empty: the path of `token_url`.
    #[serde(default)]
    pub refresh_path: String,
}

impl ProviderLoginConfig {
    /// Claude Code's values (`claude` 2.1.332: the claude.ai login with the manual paste-code redirect).
    #[must_use]
    pub fn claude() -> Self {
        Self {
            authorize_url: "https://claude.com/cai/oauth/authorize".into(),
            token_url: "https://platform.claude.com/v1/oauth/token".into(),
            client_id: "9d1c250a-e61b-44d9-88ed-5944d1962f5e".into(),
            redirect_uri: "https://platform.claude.com/oauth/code/callback".into(),
            scopes: [
                "user:profile",
                "user:inference",
                "user:sessions:claude_code",
                "user:mcp_servers",
                "user:file_upload",
            ]
            .map(String::from)
            .to_vec(),
            api_hosts: vec!["api.anthropic.com".into()],
            api_paths: vec!["/v1/".into()],
            refresh_host: String::new(),
            refresh_path: String::new(),
        }
    }

    /// Codex's values (`codex` 0.171.0: the ChatGPT login; its redirect goes to the local callback port
    /// codex listens on, so the user copies the address the browser was sent to).
    #[must_use]
    pub fn chatgpt() -> Self {
        Self {
            authorize_url: "https://auth.openai.com/oauth/authorize".into(),
            token_url: "https://auth.openai.com/oauth/token".into(),
            client_id: "app_EMoamEEZ73f0CkXaXp7hrann".into(),
            redirect_uri: "http://localhost:1455/auth/callback".into(),
            scopes: [
                "openid",
                "profile",
                "email",
                "offline_access",
                "api.connectors.read",
                "api.connectors.invoke",
            ]
            .map(String::from)
            .to_vec(),
            api_hosts: vec!["chatgpt.com".into()],
            // The Responses API, and the account check codex makes before every turn (its "workspace
            // routing discovery", `GET /backend-api/wham/accounts/check`): without the token there, no
            // turn starts. Plugin and connector paths (`/backend-api/ps/`) stay without it.
            api_paths: vec!["/backend-api/codex/".into(), "/backend-api/wham/".into()],
            refresh_host: String::new(),
            refresh_path: String::new(),
        }
    }

    /// The host the harness refreshes at: `refresh_host`, else `token_url`'s host.
    #[must_use]
    pub fn refresh_host(&self) -> String {
        if !self.refresh_host.is_empty() {
            return self.refresh_host.clone();
        }
        let rest = self.token_url.split_once("://").map_or("", |(_, r)| r);
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        authority
            .rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(authority, |(host, _)| host)
            .to_owned()
    }

    /// The path the harness refreshes at: `refresh_path`, else `token_url`'s path.
    #[must_use]
    pub fn refresh_path(&self) -> String {
        if !self.refresh_path.is_empty() {
            return self.refresh_path.clone();
        }
        let rest = self.token_url.split_once("://").map_or("", |(_, r)| r);
        let path = rest.find('/').map_or("/", |i| &rest[i..]);
        path.split(['?', '#']).next().unwrap_or("/").to_owned()
    }

    /// The first rule broken: (key below the section, problem).
    pub(super) fn validate(&self) -> Result<(), (String, String)> {
        let fail = |key: &str, problem: String| Err((key.to_owned(), problem));
        for (key, url) in [
            ("authorize_url", &self.authorize_url),
            ("token_url", &self.token_url),
        ] {
            if !is_https_or_loopback(url) {
                return fail(key, format!("{url:?} must be https unless the host is loopback"));
            }
            if url.contains('#') {
                return fail(key, format!("{url:?} must not have a fragment"));
            }
        }
        if self.client_id.trim().is_empty() {
            return fail("client_id", "must not be empty".into());
        }
        if !(self.redirect_uri.starts_with("https://") || self.redirect_uri.starts_with("http://")) {
            return fail(
                "redirect_uri",
                format!("{:?} must be an http(s) URL", self.redirect_uri),
            );
        }
        if self.api_hosts.is_empty() || self.api_hosts.iter().any(|h| h.trim().is_empty()) {
            return fail("api_hosts", "must name at least one host, none empty".into());
        }
        if self.api_paths.is_empty() || self.api_paths.iter().any(|p| !p.starts_with('/')) {
            return fail(
                "api_paths",
                "must name at least one path, each starting with '/'".into(),
            );
        }
        if !self.refresh_path.is_empty() && !self.refresh_path.starts_with('/') {
            return fail("refresh_path", "must start with '/'".into());
        }
        if self.refresh_host().is_empty() {
            return fail("refresh_host", "is empty and token_url has no host".into());
        }
        Ok(())
    }
}

impl HarnessLoginsConfig {
    /// The first rule broken: (full key, problem).
    pub(super) fn validate(&self) -> Result<(), (String, String)> {
        if self.attempt_secs == 0 {
            return Err(("harness_logins.attempt_secs".into(), "must be at least 1".into()));
        }
        if self.recheck_secs == 0 {
            return Err(("harness_logins.recheck_secs".into(), "must be at least 1".into()));
        }
        for (name, p) in [("claude", &self.claude), ("chatgpt", &self.chatgpt)] {
            p.validate()
                .map_err(|(key, problem)| (format!("harness_logins.{name}.{key}"), problem))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_target_defaults_to_the_token_url() {
        let c = ProviderLoginConfig::claude();
        assert_eq!(c.refresh_host(), "platform.claude.com");
        assert_eq!(c.refresh_path(), "/v1/oauth/token");
        let mut t = ProviderLoginConfig::chatgpt();
        t.token_url = "http://127.0.0.1:8080/oauth/token?x=1".into();
        assert_eq!(t.refresh_host(), "127.0.0.1");
        assert_eq!(t.refresh_path(), "/oauth/token");
        t.refresh_host = "auth.openai.com".into();
        assert_eq!(t.refresh_host(), "auth.openai.com");
        assert!(HarnessLoginsConfig::default().validate().is_ok());
        t.token_url = "http://auth.example.com/oauth/token".into();
        assert!(t.validate().is_err());
    }
}
