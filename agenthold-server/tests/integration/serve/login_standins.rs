//! Stand-ins for the identity providers, written here, served on loopback by axum in a thread of their own:
//! a GitHub (authorize → code, a token endpoint that checks PKCE S256 and refuses a reused code, `/user`,
//! `/user/emails`) and an OpenID Connect provider (discovery, JWKS, authorize, a token endpoint that checks
//! client_secret_basic and PKCE and returns ES256 ID tokens signed with a ring key, spoiled on request).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

pub(crate) const CLIENT_ID: &str = "agenthold-test";
pub(crate) const CLIENT_SECRET: &str = "s3cret-of-the-test";

/// Who the stand-in says logs in next.
#[derive(Debug, Clone)]
pub(crate) struct Person {
    pub(crate) subject: String,
    pub(crate) name: String,
    pub(crate) email: Option<String>,
    pub(crate) verified: bool,
}

impl Person {
    pub(crate) fn new(subject: &str, name: &str, email: Option<&str>, verified: bool) -> Self {
        Self {
            subject: subject.into(),
            name: name.into(),
            email: email.map(str::to_owned),
            verified,
        }
    }
}

/// How the OIDC stand-in spoils its next ID token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spoil {
    None,
    Nonce,
    Audience,
    Issuer,
    Expired,
    Signature,
    UnknownKid,
}

struct Grant {
    challenge: String,
    redirect_uri: String,
    nonce: Option<String>,
    person: Person,
}

/// What a stand-in saw and will do.
pub(crate) struct Shared {
    pub(crate) base: String,
    pub(crate) next_person: Person,
    pub(crate) spoil: Spoil,
    codes: HashMap<String, Grant>,
    used_codes: Vec<String>,
    tokens: HashMap<String, Person>,
    /// Token requests whose PKCE verifier matched the challenge.
    pub(crate) pkce_ok: usize,
    /// What the token endpoint refused, in order.
    pub(crate) refusals: Vec<String>,
    key: EcdsaKeyPair,
    kid: String,
    other_key: EcdsaKeyPair,
    counter: u64,
}

/// A running stand-in.
pub(crate) struct StandIn {
    pub(crate) base: String,
    pub(crate) shared: Arc<Mutex<Shared>>,
    _thread: std::thread::JoinHandle<()>,
}

impl StandIn {
    pub(crate) fn set_person(&self, p: Person) {
        self.shared.lock().unwrap().next_person = p;
    }

    pub(crate) fn spoil(&self, s: Spoil) {
        self.shared.lock().unwrap().spoil = s;
    }

    /// Sign from now on with a new key under a new `kid` (the JWK set serves only the new one).
    pub(crate) fn rotate_key(&self) {
        let mut shared = self.shared.lock().unwrap();
        shared.key = key();
        shared.kid = "k-rotated".into();
    }
}

fn key() -> EcdsaKeyPair {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap()
}

fn serve(app: Router<Arc<Mutex<Shared>>>) -> StandIn {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let base = format!("http://{addr}");
    let shared = Arc::new(Mutex::new(Shared {
        base: base.clone(),
        next_person: Person::new("1", "nobody", None, false),
        spoil: Spoil::None,
        codes: HashMap::new(),
        used_codes: Vec::new(),
        tokens: HashMap::new(),
        pkce_ok: 0,
        refusals: Vec::new(),
        key: key(),
        kid: "k1".into(),
        other_key: key(),
        counter: 0,
    }));
    let app = app.with_state(Arc::clone(&shared));
    listener.set_nonblocking(true).unwrap();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    StandIn {
        base,
        shared,
        _thread: thread,
    }
}

type S = State<Arc<Mutex<Shared>>>;

/// The authorize step of both: check the request, issue a code, send the browser back.
fn authorize(shared: &mut Shared, q: &HashMap<String, String>) -> Response {
    if q.get("client_id").map(String::as_str) != Some(CLIENT_ID)
        || q.get("code_challenge_method").map(String::as_str) != Some("S256")
    {
        return (StatusCode::BAD_REQUEST, "bad client_id or no S256 challenge").into_response();
    }
    let (Some(challenge), Some(redirect_uri), Some(state)) =
        (q.get("code_challenge"), q.get("redirect_uri"), q.get("state"))
    else {
        return (StatusCode::BAD_REQUEST, "missing parameters").into_response();
    };
    shared.counter += 1;
    let code = format!("code-{}", shared.counter);
    shared.codes.insert(
        code.clone(),
        Grant {
            challenge: challenge.clone(),
            redirect_uri: redirect_uri.clone(),
            nonce: q.get("nonce").cloned(),
            person: shared.next_person.clone(),
        },
    );
    let target = format!(
        "{redirect_uri}?{}",
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs([("code", code.as_str()), ("state", state.as_str())])
            .finish()
    );
    Redirect::to(&target).into_response()
}

/// The code check of both token endpoints: single use, same redirect URI, PKCE S256.
fn redeem(shared: &mut Shared, form: &HashMap<String, String>) -> Result<Grant, String> {
    let code = form.get("code").cloned().unwrap_or_default();
    if shared.used_codes.contains(&code) {
        return Err("reused code".into());
    }
    let grant = shared.codes.remove(&code).ok_or("unknown code")?;
    shared.used_codes.push(code);
    if form.get("redirect_uri") != Some(&grant.redirect_uri) {
        return Err("redirect_uri differs".into());
    }
    let verifier = form.get("code_verifier").ok_or("no code_verifier")?;
    if URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes())) != grant.challenge {
        return Err("PKCE verifier does not match the challenge".into());
    }
    shared.pkce_ok += 1;
    Ok(grant)
}

/// A GitHub stand-in.
pub(crate) fn github() -> StandIn {
    async fn authorize_gh(State(s): S, Query(q): Query<HashMap<String, String>>) -> Response {
        authorize(&mut s.lock().unwrap(), &q)
    }
    async fn token(State(s): S, headers: HeaderMap, body: Bytes) -> Response {
        let form = parse_form(&body);
        let mut shared = s.lock().unwrap();
        if headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) != Some("application/json") {
            return (StatusCode::NOT_ACCEPTABLE, "form answers are not served here").into_response();
        }
        if form.get("client_id").map(String::as_str) != Some(CLIENT_ID)
            || form.get("client_secret").map(String::as_str) != Some(CLIENT_SECRET)
        {
            shared.refusals.push("client".into());
            return axum::Json(json!({"error": "incorrect_client_credentials"})).into_response();
        }
        match redeem(&mut shared, &form) {
            Ok(grant) => {
                shared.counter += 1;
                let token = format!("gho_{}", shared.counter);
                shared.tokens.insert(token.clone(), grant.person);
                axum::Json(
                    json!({"access_token": token, "token_type": "bearer", "scope": "read:user,user:email"}),
                )
                .into_response()
            }
            Err(why) => {
                shared.refusals.push(why);
                // GitHub answers 200 with an error field.
                axum::Json(json!({"error": "bad_verification_code"})).into_response()
            }
        }
    }
    fn person(s: &S, headers: &HeaderMap) -> Option<Person> {
        let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let token = auth.strip_prefix("Bearer ")?;
        s.lock().unwrap().tokens.get(token).cloned()
    }
    async fn user(s: S, headers: HeaderMap) -> Response {
        match person(&s, &headers) {
            Some(p) => axum::Json(json!({"id": p.subject.parse::<u64>().unwrap(), "login": p.name.to_lowercase(), "name": p.name}))
                .into_response(),
            None => StatusCode::UNAUTHORIZED.into_response(),
        }
    }
    async fn emails(s: S, headers: HeaderMap) -> Response {
        match person(&s, &headers) {
            Some(p) => {
                let list: Vec<Value> = p
                    .email
                    .iter()
                    .map(|e| json!({"email": e, "primary": true, "verified": p.verified, "visibility": "private"}))
                    .chain([json!({"email": "secondary@example.org", "primary": false, "verified": true})])
                    .collect();
                axum::Json(list).into_response()
            }
            None => StatusCode::UNAUTHORIZED.into_response(),
        }
    }
    serve(
        Router::new()
            .route("/login/oauth/authorize", get(authorize_gh))
            .route("/login/oauth/access_token", post(token))
            .route("/api/user", get(user))
            .route("/api/user/emails", get(emails)),
    )
}

fn parse_form(body: &[u8]) -> HashMap<String, String> {
    form_urlencoded::parse(body).into_owned().collect()
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// An OpenID Connect stand-in; its issuer is its base URL.
pub(crate) fn oidc() -> StandIn {
    async fn discovery(State(s): S) -> Response {
        let base = s.lock().unwrap().base.clone();
        axum::Json(json!({
            "issuer": base,
            "authorization_endpoint": format!("{base}/authorize"),
            "token_endpoint": format!("{base}/token"),
            "jwks_uri": format!("{base}/jwks"),
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            "code_challenge_methods_supported": ["S256"],
        }))
        .into_response()
    }
    async fn jwks(State(s): S) -> Response {
        let shared = s.lock().unwrap();
        let point = shared.key.public_key().as_ref();
        axum::Json(
            json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": shared.kid, "use": "sig", "alg": "ES256",
            "x": b64(&point[1..33]), "y": b64(&point[33..])}]}),
        )
        .into_response()
    }
    async fn authorize_oidc(State(s): S, Query(q): Query<HashMap<String, String>>) -> Response {
        let scope = q.get("scope").cloned().unwrap_or_default();
        if !scope.split(' ').any(|x| x == "openid")
            || q.get("response_type").map(String::as_str) != Some("code")
        {
            return (StatusCode::BAD_REQUEST, "not an OpenID request").into_response();
        }
        authorize(&mut s.lock().unwrap(), &q)
    }
    async fn token(State(s): S, headers: HeaderMap, body: Bytes) -> Response {
        let form = parse_form(&body);
        let mut shared = s.lock().unwrap();
        let expected = format!(
            "Basic {}",
            STANDARD.encode(format!("{CLIENT_ID}:{CLIENT_SECRET}"))
        );
        if headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some(expected.as_str()) {
            shared.refusals.push("client authentication".into());
            return (
                StatusCode::UNAUTHORIZED,
                axum::Json(json!({"error": "invalid_client"})),
            )
                .into_response();
        }
        if form.get("grant_type").map(String::as_str) != Some("authorization_code") {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"error": "unsupported_grant_type"})),
            )
                .into_response();
        }
        let grant = match redeem(&mut shared, &form) {
            Ok(g) => g,
            Err(why) => {
                shared.refusals.push(why);
                return (
                    StatusCode::BAD_REQUEST,
                    axum::Json(json!({"error": "invalid_grant"})),
                )
                    .into_response();
            }
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let spoil = shared.spoil;
        let p = &grant.person;
        let mut claims = json!({
            "iss": shared.base,
            "sub": p.subject,
            "aud": CLIENT_ID,
            "exp": now + 300,
            "iat": now,
            "nonce": grant.nonce,
            "name": p.name,
            "email": p.email,
            "email_verified": p.verified,
        });
        match spoil {
            Spoil::Nonce => claims["nonce"] = json!("another-nonce"),
            Spoil::Audience => claims["aud"] = json!("someone-else"),
            Spoil::Issuer => claims["iss"] = json!("http://127.0.0.1:1/evil"),
            Spoil::Expired => {
                claims["exp"] = json!(now - 600);
                claims["iat"] = json!(now - 900);
            }
            _ => {}
        }
        let kid = if spoil == Spoil::UnknownKid {
            "k2".to_owned()
        } else {
            shared.kid.clone()
        };
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": kid});
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let rng = SystemRandom::new();
        let signer = if matches!(spoil, Spoil::Signature | Spoil::UnknownKid) {
            &shared.other_key
        } else {
            &shared.key
        };
        let sig = signer.sign(&rng, input.as_bytes()).unwrap();
        let id_token = format!("{input}.{}", b64(sig.as_ref()));
        axum::Json(
            json!({"access_token": "at", "token_type": "Bearer", "expires_in": 300, "id_token": id_token}),
        )
        .into_response()
    }
    serve(
        Router::new()
            .route("/.well-known/openid-configuration", get(discovery))
            .route("/jwks", get(jwks))
            .route("/authorize", get(authorize_oidc))
            .route("/token", post(token)),
    )
}
