//! The providers' OAuth endpoints for provider logins (Claude's `platform.claude.com/v1/oauth/token`,
//! ChatGPT's `auth.openai.com/oauth/token`), strict where the real ones are:
//!
//! - `GET <authorize>`: records the PKCE challenge (S256 only), client id and redirect URI, and answers
//!   `302` to `redirect_uri?code=…&state=…` with the same as JSON (`code`, `state`, `paste` = `code#state`,
//!   `redirect`), so a test plays the user's browser.
//! - `POST <token>` (JSON or form): `authorization_code` checks the code (once only), the client id, the
//!   redirect URI and the verifier against the challenge; `refresh_token` rotates: the old refresh token is
//!   spent, and presenting a spent one revokes the whole family (every token issued from that code), as
//!   providers do. Every grant is recorded with the token presented, and how many token calls ran at once.
//!
//! Tokens are unique strings (`standin-at-…`, `standin-rt-…`) a test can grep for anywhere.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Reply, Routes};
use crate::EchoRequest;

/// One token-endpoint call as the stand-in saw it.
#[derive(Debug, Clone)]
pub struct Grant {
    /// `authorization_code` or `refresh_token`.
    pub grant_type: String,
    /// The refresh token presented (refresh grants).
    pub refresh_token: Option<String>,
    /// Whether it succeeded.
    pub ok: bool,
    /// Why not (`invalid_grant: …`).
    pub error: Option<String>,
    /// The tokens issued (access, refresh).
    pub issued: Option<(String, String)>,
}

#[derive(Debug, Default)]
struct Family {
    access: String,
    refresh: String,
    spent: Vec<String>,
    revoked: bool,
    generation: u32,
}

#[derive(Debug)]
struct Code {
    challenge: String,
    client_id: String,
    redirect_uri: String,
    used: bool,
}

#[derive(Debug, Default)]
struct State {
    codes: HashMap<String, Code>,
    families: Vec<Family>,
    grants: Vec<Grant>,
}

/// The OAuth stand-in's state (cheap to clone; every clone is the same provider).
#[derive(Debug, Clone)]
pub struct OAuth {
    client_id: String,
    /// Whether answers carry an `id_token` (ChatGPT's do).
    id_tokens: bool,
    state: Arc<Mutex<State>>,
    serial: Arc<AtomicU64>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    /// How long each token call takes (so overlapping refreshes would show).
    delay: Duration,
}

impl OAuth {
    /// A provider that knows client `client_id`; with ID tokens (ChatGPT) or without (Claude). Each token
    /// call takes `delay`.
    pub fn new(client_id: &str, id_tokens: bool, delay: Duration) -> Self {
        Self {
            client_id: client_id.to_owned(),
            id_tokens,
            state: Arc::default(),
            serial: Arc::default(),
            in_flight: Arc::default(),
            max_in_flight: Arc::default(),
            delay,
        }
    }

    /// Serve `GET authorize` and `POST token` (paths) on `routes`.
    pub fn routes(&self, routes: &mut Routes, authorize: &str, token: &str) {
        let this = self.clone();
        routes.route("GET", authorize, move |r| this.authorize(r));
        let this = self.clone();
        routes.route("POST", token, move |r| this.token(r));
    }

    /// Every token call so far.
    pub fn grants(&self) -> Vec<Grant> {
        self.state.lock().expect("oauth lock").grants.clone()
    }

    /// The most token calls that ran at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    /// Whether `token` is a current access token of a family not revoked.
    pub fn access_valid(&self, token: &str) -> bool {
        let state = self.state.lock().expect("oauth lock");
        state.families.iter().any(|f| !f.revoked && f.access == token)
    }

    /// Whether any family was revoked (a spent refresh token came back).
    pub fn any_revoked(&self) -> bool {
        self.state
            .lock()
            .expect("oauth lock")
            .families
            .iter()
            .any(|f| f.revoked)
    }

    /// Every token issued so far (access and refresh), for greps.
    pub fn all_tokens(&self) -> Vec<String> {
        let state = self.state.lock().expect("oauth lock");
        let mut out = Vec::new();
        for f in &state.families {
            out.push(f.access.clone());
            out.push(f.refresh.clone());
            out.extend(f.spent.iter().cloned());
        }
        for g in &state.grants {
            if let Some((a, r)) = &g.issued {
                out.push(a.clone());
                out.push(r.clone());
            }
        }
        out.sort();
        out.dedup();
        out
    }

    fn next(&self, what: &str) -> String {
        let n = self.serial.fetch_add(1, Ordering::SeqCst);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        format!("standin-{what}-{n}-{nanos:09}")
    }

    fn authorize(&self, r: &EchoRequest) -> Reply {
        let query = r.path.split_once('?').map_or("", |(_, q)| q);
        let params: HashMap<String, String> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        let get = |k: &str| params.get(k).cloned().unwrap_or_default();
        if get("code_challenge_method") != "S256"
            || get("code_challenge").is_empty()
            || get("client_id") != self.client_id
        {
            return Reply::json(400, &json!({"error": "invalid_request"}));
        }
        let code = self.next("code");
        self.state.lock().expect("oauth lock").codes.insert(
            code.clone(),
            Code {
                challenge: get("code_challenge"),
                client_id: get("client_id"),
                redirect_uri: get("redirect_uri"),
                used: false,
            },
        );
        let state = get("state");
        let redirect = format!(
            "{}?{}",
            get("redirect_uri"),
            form_urlencoded::Serializer::new(String::new())
                .append_pair("code", &code)
                .append_pair("state", &state)
                .finish()
        );
        let mut reply = Reply::json(
            302,
            &json!({"code": code, "state": state, "paste": format!("{code}#{state}"), "redirect": redirect}),
        );
        reply.headers.push(("location".into(), redirect));
        reply
    }

    fn token(&self, r: &EchoRequest) -> Reply {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        let reply = self.token_now(r);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        reply
    }

    fn token_now(&self, r: &EchoRequest) -> Reply {
        let content_type = r.header("content-type").unwrap_or_default();
        let params: HashMap<String, String> = if content_type.contains("json") {
            serde_json::from_slice::<Value>(&r.body)
                .ok()
                .and_then(|v| v.as_object().cloned())
                .map(|o| {
                    o.into_iter()
                        .filter_map(|(k, v)| v.as_str().map(|s| (k, s.to_owned())))
                        .collect()
                })
                .unwrap_or_default()
        } else {
            form_urlencoded::parse(&r.body).into_owned().collect()
        };
        let get = |k: &str| params.get(k).cloned().unwrap_or_default();
        let grant_type = get("grant_type");
        let mut state = self.state.lock().expect("oauth lock");
        let mut grant = Grant {
            grant_type: grant_type.clone(),
            refresh_token: params.get("refresh_token").cloned(),
            ok: false,
            error: None,
            issued: None,
        };
        let outcome: Result<usize, String> = match grant_type.as_str() {
            "authorization_code" => (|| {
                let code = state.codes.get_mut(&get("code")).ok_or("unknown code")?;
                if code.used {
                    return Err("code already used".to_owned());
                }
                code.used = true;
                if code.client_id != get("client_id") || get("client_id") != self.client_id {
                    return Err("client_id mismatch".into());
                }
                if code.redirect_uri != get("redirect_uri") {
                    return Err("redirect_uri mismatch".into());
                }
                let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(get("code_verifier").as_bytes()));
                if challenge != code.challenge {
                    return Err("PKCE verification failed".into());
                }
                state.families.push(Family::default());
                Ok(state.families.len() - 1)
            })(),
            "refresh_token" => (|| {
                let presented = get("refresh_token");
                if get("client_id") != self.client_id {
                    return Err("client_id mismatch".to_owned());
                }
                if let Some(i) = state.families.iter().position(|f| f.spent.contains(&presented)) {
                    state.families[i].revoked = true;
                    return Err("refresh token reused: family revoked".into());
                }
                let i = state
                    .families
                    .iter()
                    .position(|f| f.refresh == presented)
                    .ok_or("unknown refresh token")?;
                if state.families[i].revoked {
                    return Err("family revoked".into());
                }
                let old = std::mem::take(&mut state.families[i].refresh);
                state.families[i].spent.push(old);
                Ok(i)
            })(),
            _ => Err("unsupported_grant_type".into()),
        };
        let reply = match outcome {
            Ok(i) => {
                let (access, refresh) = (self.next("at"), self.next("rt"));
                let family = &mut state.families[i];
                family.access = access.clone();
                family.refresh = refresh.clone();
                family.generation += 1;
                grant.ok = true;
                grant.issued = Some((access.clone(), refresh.clone()));
                let mut body = json!({
                    "access_token": access,
                    "refresh_token": refresh,
                    "token_type": "Bearer",
                    "expires_in": 3600,
                    "scope": "user:inference user:profile",
                    "account": {"uuid": "acc-uuid", "email_address": "owner@example.test"},
                });
                if self.id_tokens {
                    body["id_token"] = json!(id_token());
                }
                Reply::json(200, &body)
            }
            Err(e) => {
                grant.error = Some(e.clone());
                Reply::json(400, &json!({"error": "invalid_grant", "error_description": e}))
            }
        };
        state.grants.push(grant);
        reply
    }
}

/// An ID token as ChatGPT's (claims codex reads), signed with nothing anyone checks.
fn id_token() -> String {
    let part = |v: &Value| URL_SAFE_NO_PAD.encode(v.to_string());
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": "standin"});
    let claims = json!({
        "email": "owner@example.test",
        "https://api.openai.com/auth": {"chatgpt_account_id": "acct-standin", "chatgpt_plan_type": "pro"},
        "exp": 4_000_000_000u64,
    });
    format!("{}.{}.c3RhbmRpbi1zaWduYXR1cmU", part(&header), part(&claims))
}
