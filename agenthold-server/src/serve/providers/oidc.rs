//! Generic OpenID Connect (authorization code flow with PKCE S256, state and nonce). Discovery from
//! `{issuer}/.well-known/openid-configuration` (cached an hour; its `issuer` must equal the configured
//! one), the JWK set from its `jwks_uri` (cached, fetched again for an unknown `kid`, at most every 10 s),
//! the code exchanged at the token endpoint with `client_secret_basic` (or `client_secret_post` when the
//! provider offers only that), and the ID token checked: signature, `iss`, `aud` (and `azp` when there are
//! several audiences), `exp`/`iat` with 60 s leeway, and the attempt's `nonce`. When the ID token carries
//! neither `name` nor `email`, they are read from the userinfo endpoint (same `sub` required).
// enforces: S6

use std::time::{Duration, Instant};

use agenthold_core::config::{OidcConfig, is_https_or_loopback};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Mutex;

use super::http::Client;
use super::jwt::{self, Jwk, JwkSet};
use super::{Failure, Identity, query_join};

/// How long discovery is trusted.
const DISCOVERY_TTL: Duration = Duration::from_secs(3600);
/// How long a JWK set is used before it is fetched again anyway.
const JWKS_TTL: Duration = Duration::from_secs(3600);
/// The JWK set is fetched again for an unknown `kid` at most this often.
const JWKS_MIN_REFRESH: Duration = Duration::from_secs(10);
/// Clock skew allowed on `exp` and `iat`.
const LEEWAY_SECS: i64 = 60;

/// The parts of the discovery document used here.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Discovery {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
    #[serde(default)]
    token_endpoint_auth_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    userinfo_endpoint: Option<String>,
}

/// An OIDC provider.
pub(crate) struct Oidc {
    pub(crate) config: OidcConfig,
    secret: String,
    redirect_uri: String,
    discovery: Mutex<Option<(Discovery, Instant)>>,
    jwks: Mutex<Option<(Vec<Jwk>, Instant)>>,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("issuer", &self.config.issuer)
            .field("client_id", &self.config.client_id)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    id_token: Option<String>,
    access_token: Option<String>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error: Option<String>,
}

impl Oidc {
    pub(crate) fn new(config: OidcConfig, secret: String, public_url: &str) -> Self {
        Self {
            config,
            secret,
            redirect_uri: format!("{public_url}/auth/oidc/callback"),
            discovery: Mutex::new(None),
            jwks: Mutex::new(None),
        }
    }

    /// The discovery document (cached).
    async fn discovery(&self, client: &Client) -> Result<Discovery, Failure> {
        let mut cached = self.discovery.lock().await;
        if let Some((d, at)) = cached.as_ref()
            && at.elapsed() < DISCOVERY_TTL
        {
            return Ok(d.clone());
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.config.issuer.trim_end_matches('/')
        );
        let answer = client
            .get(&url, &[("accept", "application/json")])
            .await
            .map_err(Failure::unreachable)?;
        if answer.status != 200 {
            return Err(Failure::unreachable(format!("{url}: status {}", answer.status)));
        }
        let d: Discovery = answer.json("discovery").map_err(Failure::unreachable)?;
        if d.issuer != self.config.issuer {
            return Err(Failure::unreachable(format!(
                "the discovery document names issuer {:?}, not the configured {:?}",
                d.issuer, self.config.issuer
            )));
        }
        for (what, url) in [
            ("authorization_endpoint", &d.authorization_endpoint),
            ("token_endpoint", &d.token_endpoint),
            ("jwks_uri", &d.jwks_uri),
        ] {
            if !is_https_or_loopback(url) {
                return Err(Failure::unreachable(format!(
                    "the discovery document's {what} must be https unless the host is loopback"
                )));
            }
        }
        *cached = Some((d.clone(), Instant::now()));
        Ok(d)
    }

    /// Where the browser goes to sign in.
    pub(crate) async fn authorize_url(
        &self,
        client: &Client,
        state: &str,
        nonce: &str,
        challenge: &str,
    ) -> Result<String, Failure> {
        let d = self.discovery(client).await?;
        let scope = self.config.scopes.join(" ");
        let query = form_urlencoded::Serializer::new(String::new())
            .extend_pairs([
                ("response_type", "code"),
                ("client_id", self.config.client_id.as_str()),
                ("redirect_uri", self.redirect_uri.as_str()),
                ("scope", scope.as_str()),
                ("state", state),
                ("nonce", nonce),
                ("code_challenge", challenge),
                ("code_challenge_method", "S256"),
            ])
            .finish();
        Ok(query_join(&d.authorization_endpoint, &query))
    }

    /// Exchange `code` and validate the ID token against `nonce`.
    pub(crate) async fn finish(
        &self,
        client: &Client,
        code: &str,
        verifier: &str,
        nonce: &str,
    ) -> Result<Identity, Failure> {
        let d = self.discovery(client).await?;
        // client_secret_basic is the default when the provider does not say (OpenID Connect Discovery §3).
        let post = d.token_endpoint_auth_methods_supported.as_ref().is_some_and(|m| {
            !m.iter().any(|m| m == "client_secret_basic") && m.iter().any(|m| m == "client_secret_post")
        });
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", self.redirect_uri.as_str()),
            ("code_verifier", verifier),
        ];
        let basic;
        let mut headers = vec![("accept", "application/json")];
        if post {
            form.push(("client_id", self.config.client_id.as_str()));
            form.push(("client_secret", self.secret.as_str()));
        } else {
            let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            basic = format!(
                "Basic {}",
                STANDARD.encode(format!("{}:{}", enc(&self.config.client_id), enc(&self.secret)))
            );
            headers.push(("authorization", basic.as_str()));
        }
        let answer = client
            .post_form(&d.token_endpoint, &headers, &form)
            .await
            .map_err(Failure::unreachable)?;
        if answer.status != 200 {
            let error = answer.json::<ErrorAnswer>("token").ok().and_then(|e| e.error);
            return Err(Failure::refused(error.as_deref()));
        }
        let token: TokenAnswer = answer.json("token").map_err(Failure::unreachable)?;
        let id_token = token
            .id_token
            .ok_or_else(|| Failure::invalid_token("the token endpoint returned no ID token"))?;
        let jws = jwt::parse(&id_token).map_err(Failure::invalid_token)?;
        if !jwt::ALGORITHMS.contains(&jws.alg.as_str()) {
            return Err(Failure::invalid_token(format!(
                "ID token algorithm {:?} is not accepted",
                jws.alg
            )));
        }
        let key = self.key_for(client, &d, &jws).await?;
        if !key.verifies(&jws) {
            return Err(Failure::invalid_token("ID token signature does not verify"));
        }
        let mut identity = self.check_claims(&jws.claims, nonce, now())?;
        // Some providers (node oidc-provider by default) put profile and email claims only in userinfo.
        if jws.claims.get("email").is_none()
            && jws.claims.get("name").is_none()
            && let (Some(url), Some(access)) = (&d.userinfo_endpoint, &token.access_token)
        {
            self.add_userinfo(client, url, access, &mut identity).await;
        }
        Ok(identity)
    }

    /// Fill name and email from the userinfo endpoint (best effort: the ID token already identified the
    /// user; a userinfo answer for another `sub` is ignored, OpenID Connect Core §5.3.2).
    async fn add_userinfo(&self, client: &Client, url: &str, access: &str, identity: &mut Identity) {
        if !is_https_or_loopback(url) {
            return;
        }
        let auth = format!("Bearer {access}");
        let info = match client
            .get(
                url,
                &[("accept", "application/json"), ("authorization", auth.as_str())],
            )
            .await
        {
            Ok(a) if a.status == 200 => a.json::<Value>("userinfo").ok(),
            _ => None,
        };
        let Some(info) =
            info.filter(|i| i.get("sub").and_then(Value::as_str) == Some(identity.subject.as_str()))
        else {
            return;
        };
        let s = |k: &str| info.get(k).and_then(Value::as_str).map(str::to_owned);
        if let Some(name) = s("name")
            .or_else(|| s("preferred_username"))
            .or_else(|| s("email"))
        {
            identity.name = name;
        }
        if let Some(email) = s("email") {
            identity.email_verified = info.get("email_verified") == Some(&Value::Bool(true));
            identity.email = Some(email);
        }
    }

    /// The key that should verify `jws`: by `kid` (fetching the set again once for an unknown one), or the
    /// only key that fits the algorithm.
    async fn key_for(&self, client: &Client, d: &Discovery, jws: &jwt::Jws) -> Result<Jwk, Failure> {
        let mut cached = self.jwks.lock().await;
        for attempt in 0..2 {
            let stale = cached.as_ref().is_none_or(|(_, at)| at.elapsed() >= JWKS_TTL);
            let may_refresh = cached
                .as_ref()
                .is_none_or(|(_, at)| at.elapsed() >= JWKS_MIN_REFRESH);
            if stale || (attempt == 1 && may_refresh) {
                let answer = client
                    .get(&d.jwks_uri, &[("accept", "application/json")])
                    .await
                    .map_err(Failure::unreachable)?;
                if answer.status != 200 {
                    return Err(Failure::unreachable(format!(
                        "{}: status {}",
                        d.jwks_uri, answer.status
                    )));
                }
                let set: JwkSet = answer.json("JWK set").map_err(Failure::unreachable)?;
                *cached = Some((set.keys, Instant::now()));
            }
            let keys = cached.as_ref().map(|(k, _)| k.as_slice()).unwrap_or_default();
            let found: Vec<&Jwk> = keys
                .iter()
                .filter(|k| k.fits(&jws.alg) && (jws.kid.is_none() || k.kid == jws.kid))
                .collect();
            if let [one] = found.as_slice() {
                return Ok((*one).clone());
            }
            if found.len() > 1 {
                return Err(Failure::invalid_token(
                    "several keys fit the ID token and it names none (kid)",
                ));
            }
        }
        Err(Failure::invalid_token(format!(
            "no key in the provider JWK set fits the ID token (kid {:?}, alg {})",
            jws.kid.as_deref().unwrap_or("none"),
            jws.alg
        )))
    }

    /// `iss`, `aud`/`azp`, `exp`, `iat`, `nonce`, `sub`; then the identity.
    fn check_claims(&self, claims: &Value, nonce: &str, now: i64) -> Result<Identity, Failure> {
        let str_claim = |name: &str| claims.get(name).and_then(Value::as_str);
        if str_claim("iss") != Some(self.config.issuer.as_str()) {
            return Err(Failure::invalid_token("ID token issuer mismatch"));
        }
        let client_id = self.config.client_id.as_str();
        let audiences: Vec<&str> = match claims.get("aud") {
            Some(Value::String(a)) => vec![a.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !audiences.contains(&client_id) {
            return Err(Failure::invalid_token(
                "ID token audience does not include this client",
            ));
        }
        let azp = str_claim("azp");
        if (audiences.len() > 1 && azp != Some(client_id)) || azp.is_some_and(|a| a != client_id) {
            return Err(Failure::invalid_token(
                "ID token authorized party (azp) is not this client",
            ));
        }
        let exp = claims.get("exp").and_then(Value::as_i64);
        if exp.is_none_or(|exp| now >= exp.saturating_add(LEEWAY_SECS)) {
            return Err(Failure::invalid_token("ID token expired"));
        }
        let iat = claims.get("iat").and_then(Value::as_i64);
        if iat.is_none_or(|iat| iat > now.saturating_add(LEEWAY_SECS)) {
            return Err(Failure::invalid_token(
                "ID token issued in the future (or no iat)",
            ));
        }
        if str_claim("nonce") != Some(nonce) {
            return Err(Failure::invalid_token("ID token nonce mismatch"));
        }
        let subject = str_claim("sub")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| Failure::invalid_token("ID token has no subject"))?;
        let email = str_claim("email").map(str::to_owned);
        let name = str_claim("name")
            .or_else(|| str_claim("preferred_username"))
            .or(email.as_deref())
            .unwrap_or(subject)
            .to_owned();
        Ok(Identity {
            provider: "oidc",
            subject: subject.to_owned(),
            name,
            email_verified: email.is_some() && claims.get("email_verified") == Some(&Value::Bool(true)),
            email,
        })
    }
}

/// Now, in unix seconds.
fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    fn oidc() -> Oidc {
        Oidc::new(
            OidcConfig {
                issuer: "https://id.example".into(),
                client_id: "app".into(),
                ..OidcConfig::default()
            },
            "s".into(),
            "https://agents.example",
        )
    }

    // covers: S6
    #[test]
    fn claims_are_checked() {
        let o = oidc();
        let good = json!({"iss": "https://id.example", "aud": "app", "exp": 1000, "iat": 900, "nonce": "n", "sub": "u1",
            "email": "a@b.c", "email_verified": true, "name": "Ada"});
        let id = o.check_claims(&good, "n", 950).unwrap();
        assert_eq!(
            (id.subject.as_str(), id.name.as_str(), id.email_verified),
            ("u1", "Ada", true)
        );
        let with = |k: &str, v: Value| {
            let mut c = good.clone();
            c[k] = v;
            c
        };
        for (claims, reason) in [
            (with("iss", json!("https://other")), "issuer"),
            (with("aud", json!("other")), "audience"),
            (with("aud", json!(["app", "other"])), "azp"),
            (with("azp", json!("other")), "azp"),
            (with("exp", json!(880)), "expired"),
            (with("iat", json!(1100)), "future"),
            (with("nonce", json!("m")), "nonce mismatch"),
            (with("sub", json!("")), "subject"),
        ] {
            let e = o.check_claims(&claims, "n", 950).unwrap_err();
            assert!(e.reason.contains(reason), "{claims}: {}", e.reason);
        }
        let mut several = with("aud", json!(["app", "other"]));
        several["azp"] = json!("app");
        o.check_claims(&several, "n", 950).unwrap();
        let unverified = o
            .check_claims(&with("email_verified", json!("true")), "n", 950)
            .unwrap();
        assert!(!unverified.email_verified);
    }
}
