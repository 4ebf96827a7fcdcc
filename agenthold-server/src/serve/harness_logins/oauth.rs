//! The provider's side of a login (S3): the authorization URL (PKCE S256, a 256-bit `state`), what the
//! user pastes back (Claude's paste-code page shows `code#state`; ChatGPT redirects to the harness's local
//! callback, whose full address the user copies; a bare code is taken too, PKCE still binds it to this
//! login), the code exchange and a token answer's parts. Tokens and codes never appear in an error.
// enforces: S3

use agenthold_core::config::ProviderLoginConfig;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Provider;
use super::record::{TokenMeta, Tokens};
use crate::serve::api::{ApiError, ApiResult};
use crate::serve::providers::http::Client;

/// 256 random bits, base64url.
pub(crate) fn random_value() -> ApiResult<String> {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| ApiError::internal(&"no randomness available"))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// A new login id: `pl_` and 96 random bits in hex.
pub(crate) fn new_login_id() -> ApiResult<String> {
    let mut bytes = [0u8; 12];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| ApiError::internal(&"no randomness available"))?;
    Ok(format!("pl_{}", hex::encode(bytes)))
}

/// SHA-256 hex of a `state`.
pub(crate) fn state_hash(state: &str) -> String {
    hex::encode(Sha256::digest(state.as_bytes()))
}

/// The address the user opens to grant access.
pub(crate) fn authorize_url(
    provider: Provider,
    cfg: &ProviderLoginConfig,
    state: &str,
    verifier: &str,
) -> String {
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    let scope = cfg.scopes.join(" ");
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    if provider == Provider::Claude {
        // Claude's authorize page shows the code to paste (`code#state`) with `code=true`.
        pairs.push(("code", "true"));
    }
    pairs.extend([
        ("client_id", cfg.client_id.as_str()),
        ("response_type", "code"),
        ("redirect_uri", cfg.redirect_uri.as_str()),
        ("scope", scope.as_str()),
        ("code_challenge", challenge.as_str()),
        ("code_challenge_method", "S256"),
        ("state", state),
    ]);
    if provider == Provider::Chatgpt {
        // As codex asks (its simplified ChatGPT flow, organisations in the ID token).
        pairs.extend([
            ("id_token_add_organizations", "true"),
            ("codex_cli_simplified_flow", "true"),
            ("originator", "codex_cli_rs"),
        ]);
    }
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    let sep = if cfg.authorize_url.contains('?') { '&' } else { '?' };
    format!("{}{sep}{query}", cfg.authorize_url)
}

/// What the user pasted: the code and the state, when it carried one.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Pasted {
    pub(crate) code: String,
    pub(crate) state: Option<String>,
}

/// Read what the user pasted: `code#state`, a URL with `code` (and `state`) in its query, or a bare code.
pub(crate) fn parse_pasted(input: &str) -> ApiResult<Pasted> {
    let input = input.trim();
    if input.is_empty() || input.len() > 8192 {
        return Err(ApiError::bad_request(
            "code: paste the code (1 to 8192 characters)",
        ));
    }
    let bad = || ApiError::bad_request("code: not a code, a code#state, or an address with ?code=");
    if input.starts_with("http://") || input.starts_with("https://") {
        let query = input
            .split_once('?')
            .map(|(_, q)| q.split('#').next().unwrap_or_default())
            .ok_or_else(bad)?;
        let mut code = None;
        let mut state = None;
        let mut error = None;
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "code" => code = Some(v.into_owned()),
                "state" => state = Some(v.into_owned()),
                "error" => error = Some(v.into_owned()),
                _ => {}
            }
        }
        if let Some(error) = error {
            let shown: String = error.chars().filter(char::is_ascii_graphic).take(64).collect();
            return Err(ApiError::bad_request(format!(
                "the provider refused the login: {shown}"
            )));
        }
        let code = code.filter(|c| !c.is_empty()).ok_or_else(bad)?;
        return Ok(Pasted { code, state });
    }
    let (code, state) = match input.split_once('#') {
        Some((c, s)) => (c, Some(s.to_owned())),
        None => (input, None),
    };
    if code.is_empty() || !code.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad());
    }
    Ok(Pasted {
        code: code.to_owned(),
        state,
    })
}

/// A token endpoint's answer.
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    refresh_token: String,
    #[serde(default)]
    id_token: Option<String>,
    #[serde(default)]
    expires_in: Option<i64>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    account: Option<serde_json::Value>,
    #[serde(default)]
    subscription_type: Option<String>,
}

/// Exchange `code` (with the PKCE `verifier`) at the provider's token endpoint.
pub(crate) async fn exchange(
    client: &Client,
    provider: Provider,
    cfg: &ProviderLoginConfig,
    code: &str,
    state: &str,
    verifier: &str,
) -> ApiResult<(Tokens, TokenMeta)> {
    let answer = match provider {
        Provider::Claude => {
            let body = serde_json::json!({
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": cfg.redirect_uri,
                "client_id": cfg.client_id,
                "code_verifier": verifier,
                "state": state,
            });
            client.post_json(&cfg.token_url, &[("accept", "application/json")], &body).await
        }
        Provider::Chatgpt => {
            let form = [
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", cfg.redirect_uri.as_str()),
                ("client_id", cfg.client_id.as_str()),
                ("code_verifier", verifier),
            ];
            client.post_form(&cfg.token_url, &[("accept", "application/json")], &form).await
        }
    }
    .map_err(|e| {
        tracing::warn!(provider = provider.as_str(), error = %e, "provider login: token endpoint unreachable");
        ApiError::new(
            http::StatusCode::BAD_GATEWAY,
            "provider_unreachable",
            "the provider's token endpoint could not be reached",
        )
    })?;
    if !(200..300).contains(&answer.status) {
        // The body may quote the code: only its OAuth error code is passed on.
        let error = serde_json::from_slice::<serde_json::Value>(&answer.body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_default();
        let shown: String = error.chars().filter(char::is_ascii_graphic).take(64).collect();
        return Err(ApiError::bad_request(format!(
            "the provider refused the code (status {}{})",
            answer.status,
            if shown.is_empty() {
                String::new()
            } else {
                format!(", {shown}")
            }
        )));
    }
    let t: TokenAnswer = answer
        .json("token answer")
        .map_err(|e| ApiError::new(http::StatusCode::BAD_GATEWAY, "provider_answer", e))?;
    let now_ms = time::OffsetDateTime::now_utc()
        .unix_timestamp()
        .saturating_mul(1000);
    let mut meta = TokenMeta {
        expires_at_ms: now_ms.saturating_add(t.expires_in.unwrap_or(3600).saturating_mul(1000)),
        scopes: t.scope.as_deref().map_or_else(
            || cfg.scopes.clone(),
            |s| s.split_whitespace().map(str::to_owned).collect(),
        ),
        subscription_type: t.subscription_type,
        last_refresh: crate::serve::records::now_rfc3339(),
        ..TokenMeta::default()
    };
    meta.account = t
        .account
        .as_ref()
        .and_then(|a| a.get("email_address").and_then(|e| e.as_str()).map(str::to_owned));
    if let Some(id_token) = &t.id_token {
        let (header, claims) = jwt_parts(id_token).ok_or_else(|| {
            ApiError::new(
                http::StatusCode::BAD_GATEWAY,
                "provider_answer",
                "the ID token is not a JWT",
            )
        })?;
        meta.account_id = claims
            .get("https://api.openai.com/auth")
            .and_then(|a| a.get("chatgpt_account_id"))
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        meta.account = claims.get("email").and_then(|e| e.as_str()).map(str::to_owned);
        meta.id_header = Some(header);
        meta.id_claims = Some(claims);
    }
    if t.access_token.is_empty() || t.refresh_token.is_empty() {
        return Err(ApiError::new(
            http::StatusCode::BAD_GATEWAY,
            "provider_answer",
            "the provider's answer lacks a token",
        ));
    }
    Ok((
        Tokens {
            access_token: t.access_token,
            refresh_token: t.refresh_token,
            id_token: t.id_token,
        },
        meta,
    ))
}

/// A JWT's header and claims, unverified (the token came from the provider over TLS; only its claims
/// are copied into the harness's file, never the token).
fn jwt_parts(jwt: &str) -> Option<(serde_json::Value, serde_json::Value)> {
    let mut parts = jwt.split('.');
    let (h, c) = (parts.next()?, parts.next()?);
    let decode = |p: &str| {
        URL_SAFE_NO_PAD
            .decode(p.trim_end_matches('='))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
    };
    Some((decode(h)?, decode(c)?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    // covers: S3
    #[test]
    fn pasted_codes() {
        assert_eq!(
            parse_pasted(" abc#st ").unwrap(),
            Pasted {
                code: "abc".into(),
                state: Some("st".into())
            }
        );
        assert_eq!(
            parse_pasted("abc").unwrap(),
            Pasted {
                code: "abc".into(),
                state: None
            }
        );
        assert_eq!(
            parse_pasted("http://localhost:1455/auth/callback?code=c%2F1&scope=x&state=s").unwrap(),
            Pasted {
                code: "c/1".into(),
                state: Some("s".into())
            }
        );
        assert!(parse_pasted("http://localhost:1455/auth/callback?error=access_denied").is_err());
        assert!(parse_pasted("http://localhost:1455/auth/callback").is_err());
        assert!(parse_pasted("").is_err());
        assert!(parse_pasted("a b").is_err());
        assert!(parse_pasted(&"a".repeat(9000)).is_err());
    }

    #[test]
    fn authorize_urls_carry_pkce_and_state() {
        let cfg = ProviderLoginConfig::claude();
        let url = authorize_url(Provider::Claude, &cfg, "st", "verifier");
        assert!(
            url.starts_with("https://claude.com/cai/oauth/authorize?code=true&client_id="),
            "{url}"
        );
        assert!(
            url.contains("code_challenge_method=S256") && url.contains("state=st"),
            "{url}"
        );
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(b"verifier"));
        assert!(url.contains(&format!("code_challenge={challenge}")), "{url}");
        assert!(!url.contains("verifier"), "{url}");
        let url = authorize_url(Provider::Chatgpt, &ProviderLoginConfig::chatgpt(), "st", "v");
        assert!(
            url.contains("redirect_uri=http%3A%2F%2Flocalhost%3A1455%2Fauth%2Fcallback"),
            "{url}"
        );
        assert!(url.contains("codex_cli_simplified_flow=true"), "{url}");
    }
}
