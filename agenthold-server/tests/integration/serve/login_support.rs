//! The client side of the login tests: a cookie-keeping browser that follows no redirect, and a server
//! configured with the provider stand-ins.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::login_standins::{CLIENT_ID, CLIENT_SECRET, StandIn};
use super::support::{Auth, TestServer};

/// A browser: keeps cookies (by name), follows no redirect, remembers every `Set-Cookie` it saw.
pub(crate) struct Browser {
    agent: ureq::Agent,
    pub(crate) jar: BTreeMap<String, String>,
    pub(crate) set_cookies: Vec<String>,
}

/// One answer.
#[derive(Debug)]
pub(crate) struct Hop {
    pub(crate) status: u16,
    pub(crate) location: Option<String>,
    pub(crate) body: String,
    pub(crate) set_cookies: Vec<String>,
}

impl Browser {
    pub(crate) fn new() -> Self {
        Self {
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_redirects(0)
                .timeout_global(Some(Duration::from_secs(30)))
                .build()
                .new_agent(),
            jar: BTreeMap::new(),
            set_cookies: Vec::new(),
        }
    }

    pub(crate) fn get(&mut self, url: &str) -> Hop {
        let mut req = self.agent.get(url);
        if !self.jar.is_empty() {
            let cookie = self
                .jar
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("; ");
            req = req.header("Cookie", cookie);
        }
        let mut response = req.call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let location = header("location");
        let set_cookies: Vec<String> = response
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_owned))
            .collect();
        for c in &set_cookies {
            let (pair, attrs) = c.split_once(';').unwrap_or((c, ""));
            let (name, value) = pair.split_once('=').unwrap();
            if attrs.contains("Max-Age=0") {
                self.jar.remove(name);
            } else {
                self.jar.insert(name.to_owned(), value.to_owned());
            }
        }
        self.set_cookies.extend(set_cookies.iter().cloned());
        let body = response.body_mut().read_to_string().unwrap_or_default();
        Hop {
            status: response.status().as_u16(),
            location,
            body,
            set_cookies,
        }
    }

    /// Start a login at `server` through `provider` with `next`; returns the callback URL the provider sent
    /// the browser to (not yet visited).
    pub(crate) fn until_callback(&mut self, server: &TestServer, provider: &str, next: &str) -> String {
        let next = form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>();
        let start = self.get(&format!("{}/auth/{provider}/start?next={next}", server.base));
        assert_eq!(start.status, 303, "start: {start:?}\n{}", server.log());
        let authorize = self.get(&start.location.unwrap());
        assert!(
            matches!(authorize.status, 302 | 303 | 307),
            "authorize: {authorize:?}"
        );
        let callback = authorize.location.unwrap();
        assert!(
            callback.starts_with(&format!("{}/auth/{provider}/callback?", server.base)),
            "{callback}"
        );
        callback
    }

    /// A whole login: the final hop (303 to `next`, or the failure page).
    pub(crate) fn login(&mut self, server: &TestServer, provider: &str, next: &str) -> Hop {
        let callback = self.until_callback(server, provider, next);
        self.get(&callback)
    }

    /// The session cookie's value, if any.
    pub(crate) fn session(&self) -> Option<String> {
        self.jar
            .iter()
            .find(|(k, _)| k.ends_with("agenthold_session"))
            .map(|(_, v)| v.clone())
    }

    /// `GET /api/v1/me` with the browser's cookies: (status, body).
    pub(crate) fn me(&mut self, server: &TestServer) -> (u16, Value) {
        let hop = self.get(&format!("{}/api/v1/me", server.base));
        (hop.status, serde_json::from_str(&hop.body).unwrap_or(Value::Null))
    }
}

/// A server with the GitHub and/or OIDC stand-in configured (secret file in the test's directory).
pub(crate) fn server(
    github: Option<&StandIn>,
    oidc: Option<&StandIn>,
    server_keys: &str,
) -> (TestServer, tempfile::TempDir) {
    server_rated(github, oidc, server_keys, 0)
}

/// [`server`] with `auth.rate_unauthenticated` set (`0`: off).
pub(crate) fn server_rated(
    github: Option<&StandIn>,
    oidc: Option<&StandIn>,
    server_keys: &str,
    rate: u32,
) -> (TestServer, tempfile::TempDir) {
    let secrets = tempfile::tempdir().unwrap();
    let secret = secrets.path().join("client-secret");
    std::fs::write(&secret, format!("{CLIENT_SECRET}\n")).unwrap();
    let mut yaml = format!("auth:\n  rate_unauthenticated: {rate}\n");
    if let Some(g) = github {
        yaml.push_str(&format!(
            "  github:\n    client_id: {CLIENT_ID}\n    client_secret_file: {}\n    authorize_url: {b}/login/oauth/authorize\n    token_url: {b}/login/oauth/access_token\n    api_url: {b}/api\n",
            secret.display(),
            b = g.base
        ));
    }
    if let Some(o) = oidc {
        yaml.push_str(&format!(
            "  oidc:\n    issuer: {}\n    client_id: {CLIENT_ID}\n    client_secret_file: {}\n    name: Test IdP\n",
            o.base,
            secret.display()
        ));
    }
    (TestServer::start_configured(server_keys, &yaml, &[]), secrets)
}

/// A workspace owned by a fresh user; returns (ws, owner token).
pub(crate) fn workspace(server: &TestServer) -> (String, String) {
    let (_, token) = server.user("owner");
    let r = server.call(
        "POST",
        "/api/v1/workspaces",
        &Auth::Token(token.clone()),
        Some(&json!({"name": "team"})),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    (r.body["id"].as_str().unwrap().to_owned(), token)
}

pub(crate) fn members(server: &TestServer, ws: &str, token: &str) -> Vec<Value> {
    let r = server.call(
        "GET",
        &format!("/api/v1/workspaces/{ws}/members"),
        &Auth::Token(token.to_owned()),
        None,
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body["items"].as_array().unwrap().clone()
}

pub(crate) fn invite(server: &TestServer, ws: &str, token: &str, body: &Value) -> Value {
    let r = server.call(
        "POST",
        &format!("/api/v1/workspaces/{ws}/members"),
        &Auth::Token(token.to_owned()),
        Some(body),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["pending"], true, "{:?}", r.body);
    r.body
}

pub(crate) fn cookie<'a>(hop: &'a Hop, name: &str) -> &'a str {
    hop.set_cookies
        .iter()
        .find(|c| c.starts_with(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} cookie in {:?}", hop.set_cookies))
}
