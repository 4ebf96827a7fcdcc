//! Provider logins (S3, E15) through the real server, against the OAuth stand-in
//! (`agenthold_testsupport::standin::oauth`) on loopback: plain HTTP for the server's code exchange, HTTPS
//! as `api.anthropic.com` and `platform.claude.com` for what the sandbox sends (the gateway's dangerous
//! connect-to mapping).
//!
//! - the flow: browser session only, wrong state, expired attempt, a code used twice, PKCE checked at the
//!   provider, another user sees nothing;
//! - in sandboxes: ownership on attach, the credential file holds placeholders only (the whole filesystem
//!   and environment grepped for the real tokens), the access token reaches the provider only inside
//!   `authorization` on API paths, two concurrent refreshes answered by the gateway one after the other
//!   (the second with the rotated token, no family revoked), rotated tokens in every agent the login is
//!   attached to, detached when the owner loses the grant or leaves, withdrawn.

use std::net::IpAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use agenthold_testsupport::standin::oauth::OAuth;
use agenthold_testsupport::standin::{FINAL_TEXT, PROVIDER_HOSTS, Reply, Routes, Standin, anthropic, openai};
use agenthold_testsupport::{TestCa, TestDns};
use serde_json::{Value, json};

use super::support::{Auth, TestServer};

/// Claude Code's OAuth client id (the default of `harness_logins.claude.client_id`).
const CLIENT: &str = "9d1c250a-e61b-44d9-88ed-5944d1962f5e";
/// Codex's (the default of `harness_logins.chatgpt.client_id`).
const CODEX_CLIENT: &str = "app_EMoamEEZ73f0CkXaXp7hrann";
const API: &str = "api.anthropic.com";
const AUTH: &str = "platform.claude.com";
/// Where codex sends a ChatGPT account's requests.
const CHATGPT: &str = "chatgpt.com";

/// The stand-ins and a server pointed at them.
struct Setup {
    server: TestServer,
    oauth: OAuth,
    chatgpt: OAuth,
    https: Standin,
    http: Standin,
    _dns: TestDns,
    _ca_dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl Setup {
    fn start(extra_yaml: &str, delay: Duration) -> Self {
        agenthold_testsupport::require_root();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(3)
            .enable_all()
            .build()
            .unwrap();
        let ca = Arc::new(TestCa::new());
        let oauth = OAuth::new(CLIENT, false, delay);
        let chatgpt = OAuth::new(CODEX_CLIENT, true, delay);
        let mut routes = Routes::new();
        oauth.routes(&mut routes, "/oauth/authorize", "/v1/oauth/token");
        chatgpt.routes(&mut routes, "/chatgpt/oauth/authorize", "/chatgpt/oauth/token");
        // The Messages API for the real `claude`; other paths answer 200 for the probes below.
        anthropic::routes(&mut routes, agenthold_testsupport::standin::TOOL_COMMAND);
        // The Responses API for the real `codex`, also at chatgpt.com's `/backend-api/codex/`.
        openai::routes(&mut routes, agenthold_testsupport::standin::TOOL_COMMAND);
        routes.route("*", "/v1/", |_| Reply::json(200, &json!({"ok": true})));
        routes.route("*", "/other/", |_| Reply::json(200, &json!({"ok": true})));
        let (https, http, dns) = rt.block_on(async {
            let any = "127.0.0.1:0".parse().unwrap();
            let https = Standin::start(any, Some(Arc::clone(&ca)), PROVIDER_HOSTS, routes.clone())
                .await
                .unwrap();
            let http = Standin::start(any, None, &[], routes).await.unwrap();
            let dns = TestDns::start(Vec::<(&str, Vec<IpAddr>)>::new(), 60).await;
            (https, http, dns)
        });
        let ca_dir = tempfile::tempdir().unwrap();
        let ca_path = ca_dir.path().join("upstream-ca.pem");
        std::fs::write(&ca_path, ca.pem()).unwrap();
        let plain = http.addr();
        let yaml = format!(
            "egress:\n  dns_upstream: {}\nharness_logins:\n  claude:\n    authorize_url: http://{plain}/oauth/authorize\n    \
             token_url: http://{plain}/v1/oauth/token\n    refresh_host: {AUTH}\n  chatgpt:\n    \
             authorize_url: http://{plain}/chatgpt/oauth/authorize\n    token_url: http://{plain}/chatgpt/oauth/token\n    \
             refresh_host: auth.openai.com\n    refresh_path: /oauth/token\n{extra_yaml}",
            dns.addr()
        );
        let up = https.addr();
        let server = TestServer::start_with(
            &yaml,
            &[
                "--dangerous-connect-to",
                &format!("{API}:443={up}"),
                "--dangerous-connect-to",
                &format!("{AUTH}:443={up}"),
                "--dangerous-connect-to",
                &format!("{CHATGPT}:443={up}"),
                "--dangerous-upstream-ca",
                ca_path.to_str().unwrap(),
            ],
        );
        Self {
            server,
            oauth,
            chatgpt,
            https,
            http,
            _dns: dns,
            _ca_dir: ca_dir,
            rt,
        }
    }

    /// A user with a token and a session.
    fn person(&self, name: &str) -> (String, Auth, Auth) {
        let (id, token) = self.server.user(name);
        let session = self.server.session(&id);
        (id, Auth::Token(token), Auth::Session(session))
    }

    /// Start a Claude login as `session`; (id, the stand-in's `code#state`).
    fn start_login(&self, session: &Auth) -> (String, Value) {
        self.start_provider_login(session, "claude")
    }

    /// Start a login of `provider` as `session`; (id, what the stand-in's authorize answered).
    fn start_provider_login(&self, session: &Auth, provider: &str) -> (String, Value) {
        let r = self.server.call(
            "POST",
            "/api/v1/me/provider-logins",
            session,
            Some(&json!({"provider": provider, "name": "mine"})),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
        assert_eq!(r.body["state"], "pending");
        let url = r.body["authorize_url"].as_str().unwrap().to_owned();
        assert!(url.contains("code_challenge_method=S256"), "{url}");
        // The user's browser: the stand-in answers with the code it would show.
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .build()
            .new_agent();
        let mut answer = agent.get(&url).call().unwrap();
        assert_eq!(answer.status(), 302);
        let page: Value = serde_json::from_str(&answer.body_mut().read_to_string().unwrap()).unwrap();
        (r.body["id"].as_str().unwrap().to_owned(), page)
    }

    fn complete(&self, session: &Auth, id: &str, code: &str) -> super::support::Reply {
        self.server.call(
            "POST",
            &format!("/api/v1/me/provider-logins/{id}/complete"),
            session,
            Some(&json!({"code": code})),
        )
    }

    /// A connected Claude login of `session`'s user.
    fn connect(&self, session: &Auth) -> String {
        let (id, page) = self.start_login(session);
        let r = self.complete(session, &id, page["paste"].as_str().unwrap());
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body["state"], "connected");
        id
    }
}

/// `sh -c script` in the agent's container: exit code and stdout.
fn sh(agent: &str, script: &str) -> (i32, String) {
    let out = Command::new("docker")
        .args(["ps", "-q", "--filter", &format!("label=agenthold.agent={agent}")])
        .output()
        .unwrap();
    let ids = String::from_utf8_lossy(&out.stdout);
    let container = ids.split_whitespace().next().expect("the agent's container runs");
    let out = Command::new("timeout")
        .args(["120", "docker", "exec", container, "sh", "-c", script])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The agent's Claude credential file, parsed (`None` when absent).
fn credentials(agent: &str) -> Option<Value> {
    let (code, out) = sh(agent, "cat /workspace/.claude/.credentials.json");
    (code == 0).then(|| serde_json::from_str(&out).unwrap())
}

/// `curl` from inside the agent: the HTTP status.
fn curl(agent: &str, args: &str) -> u16 {
    let (_, out) = sh(
        agent,
        &format!("curl -sk -m 20 -o /dev/null -w '%{{http_code}}' {args}"),
    );
    out.trim().parse().unwrap_or(0)
}

/// The `authorization` the HTTPS stand-in received for `path`.
fn received(setup: &Setup, path: &str) -> Option<String> {
    setup
        .https
        .requests()
        .into_iter()
        .find(|r| r.path == path)
        .and_then(|r| r.header("authorization").map(str::to_owned))
}

fn agent_json(setup: &Setup, auth: &Auth, ws: &str, agent: &str) -> Value {
    let r = setup.server.call(
        "GET",
        &format!("/api/v1/workspaces/{ws}/agents/{agent}"),
        auth,
        None,
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body
}

// covers: S3
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn the_flow_needs_a_session_the_right_state_a_fresh_code_and_pkce() {
    let setup = Setup::start("  attempt_secs: 4\n", Duration::ZERO);
    let s = &setup.server;
    let (_, alice_token, alice) = setup.person("alice");
    let (_, bob_token, bob) = setup.person("bob");
    // A token cannot connect an account (S3, like S7).
    let r = s.call(
        "POST",
        "/api/v1/me/provider-logins",
        &alice_token,
        Some(&json!({"provider": "claude"})),
    );
    assert_eq!(r.status, 403, "{:?}", r.body);
    let (id, page) = setup.start_login(&alice);
    let r = setup.complete(&alice_token, &id, page["paste"].as_str().unwrap());
    assert_eq!(r.status, 403, "a token completed a login: {:?}", r.body);
    // Another user's login does not exist for them.
    let r = setup.complete(&bob, &id, page["paste"].as_str().unwrap());
    assert_eq!(r.status, 404, "{:?}", r.body);
    assert_eq!(
        s.call(
            "DELETE",
            &format!("/api/v1/me/provider-logins/{id}"),
            &bob_token,
            None
        )
        .status,
        404
    );
    // Wrong state: refused before anything reaches the provider.
    let code = page["code"].as_str().unwrap();
    let r = setup.complete(&alice, &id, &format!("{code}#not-the-state"));
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert!(
        setup.oauth.grants().is_empty(),
        "a wrong state reached the provider"
    );
    // The right one connects; the tokens appear nowhere in the answer.
    let r = setup.complete(&alice, &id, page["paste"].as_str().unwrap());
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["state"], "connected");
    assert_eq!(r.body["account"], "owner@example.test");
    for t in setup.oauth.all_tokens() {
        assert!(!String::from_utf8_lossy(&r.raw).contains(&t));
    }
    // Used once: a second complete is a conflict.
    let r = setup.complete(&alice, &id, page["paste"].as_str().unwrap());
    assert_eq!(r.status, 409, "{:?}", r.body);
    // The same code for another attempt (its own state): the provider refuses a replayed code.
    let (id2, page2) = setup.start_login(&alice);
    let r = setup.complete(
        &alice,
        &id2,
        &format!("{code}#{}", page2["state"].as_str().unwrap()),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        setup.oauth.grants().last().unwrap().error.as_deref(),
        Some("code already used")
    );
    // A code issued for another PKCE challenge: the provider refuses the verifier.
    let (id3, page3) = setup.start_login(&alice);
    let (_, foreign) = setup.start_login(&bob);
    let r = setup.complete(
        &alice,
        &id3,
        &format!(
            "{}#{}",
            foreign["code"].as_str().unwrap(),
            page3["state"].as_str().unwrap()
        ),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        setup.oauth.grants().last().unwrap().error.as_deref(),
        Some("PKCE verification failed")
    );
    // Too late: refused without asking the provider.
    let (id4, page4) = setup.start_login(&alice);
    std::thread::sleep(Duration::from_secs(5));
    let before = setup.oauth.grants().len();
    let r = setup.complete(&alice, &id4, page4["paste"].as_str().unwrap());
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert!(
        r.body["detail"].as_str().unwrap().contains("expired"),
        "{:?}",
        r.body
    );
    assert_eq!(setup.oauth.grants().len(), before);
    // Lists: alice sees hers (the token may list and withdraw), bob sees none of them.
    let mine = s.call("GET", "/api/v1/me/provider-logins", &alice_token, None);
    let mut states: Vec<&str> = mine.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["state"].as_str().unwrap())
        .collect();
    states.sort_unstable();
    assert_eq!(
        states,
        ["connected", "expired", "failed", "failed"],
        "{:?}",
        mine.body
    );
    let theirs = s.call("GET", "/api/v1/me/provider-logins", &bob_token, None);
    assert_eq!(
        theirs.body["items"].as_array().unwrap().len(),
        1,
        "bob's own pending one only"
    );
    assert_eq!(
        s.call(
            "DELETE",
            &format!("/api/v1/me/provider-logins/{id}"),
            &alice_token,
            None
        )
        .status,
        204
    );
    let _ = &setup.rt;
    let _ = &setup.http;
}

// covers: S3, E15
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn an_attached_login_stays_on_the_gateway_and_follows_its_owner() {
    let mut setup = Setup::start("", Duration::from_millis(400));
    let s = &setup.server;
    let (alice_id, alice_token, alice) = setup.person("alice");
    let ws = s.call(
        "POST",
        "/api/v1/workspaces",
        &alice_token,
        Some(&json!({"name": "w"})),
    );
    let ws = ws.body["id"].as_str().unwrap().to_owned();
    let path = |rest: &str| format!("/api/v1/workspaces/{ws}{rest}");
    let policy = json!({"mode": "allowlist", "entries": [API, AUTH]});
    let mut agents = Vec::new();
    for name in ["a", "b"] {
        let r = s.call(
            "POST",
            &path("/agents"),
            &alice_token,
            Some(&json!({"name": name, "policy": policy})),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
        agents.push(r.body["id"].as_str().unwrap().to_owned());
    }
    let (a, b) = (agents[0].clone(), agents[1].clone());
    let login = setup.connect(&alice);

    // Ownership: a member with an admin grant cannot attach alice's login; an operator cannot attach
    // their own; nobody else sees alice's.
    let (bob_id, bob_token, bob) = setup.person("bob");
    let (carol_id, carol_token, carol) = setup.person("carol");
    for (id, grant) in [(&bob_id, "admin"), (&carol_id, "operator")] {
        assert_eq!(
            s.call(
                "PUT",
                &path(&format!("/members/{id}")),
                &alice_token,
                Some(&json!({"role": "member"}))
            )
            .status,
            201
        );
        let r = s.call(
            "PUT",
            &path(&format!("/agents/{a}/grants/{id}")),
            &alice_token,
            Some(&json!({"role": grant})),
        );
        assert!(r.status == 201 || r.status == 200, "{:?}", r.body);
    }
    let r = s.call(
        "PUT",
        &path(&format!("/agents/{a}/provider-login")),
        &bob_token,
        Some(&json!({"login": login})),
    );
    assert_eq!(r.status, 400, "bob attached alice's login: {:?}", r.body);
    let carols = setup.connect(&carol);
    let r = s.call(
        "PUT",
        &path(&format!("/agents/{a}/provider-login")),
        &carol_token,
        Some(&json!({"login": carols})),
    );
    assert_eq!(r.status, 403, "an operator attached a login: {:?}", r.body);
    let r = s.call("GET", "/api/v1/me/provider-logins", &bob, None);
    assert!(r.body["items"].as_array().unwrap().is_empty(), "{:?}", r.body);

    // Attach to both agents; the agent shows whose login it uses.
    for agent in [&a, &b] {
        let r = s.call(
            "PUT",
            &path(&format!("/agents/{agent}/provider-login")),
            &alice_token,
            Some(&json!({"login": login})),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body["owner"], alice_id.as_str());
    }
    let view = agent_json(&setup, &alice_token, &ws, &a);
    assert_eq!(view["provider_login"]["id"], login.as_str(), "{view}");
    assert_eq!(view["provider_login"]["owner_name"], "alice");

    // The credential file: placeholders only, 0600; the real tokens nowhere in the sandbox.
    let file = credentials(&a).expect("the credential file is written");
    let access_ph = file["claudeAiOauth"]["accessToken"].as_str().unwrap().to_owned();
    let refresh_ph = file["claudeAiOauth"]["refreshToken"].as_str().unwrap().to_owned();
    assert!(access_ph.starts_with("agenthold-placeholder"), "{file}");
    assert!(refresh_ph.starts_with("agenthold-placeholder"), "{file}");
    assert_eq!(
        sh(&a, "stat -c %a /workspace/.claude/.credentials.json").1.trim(),
        "600"
    );
    let real = setup.oauth.all_tokens();
    let needles: Vec<String> = real.iter().map(|t| format!("-e '{t}'")).collect();
    // A control file proves the search sees the filesystem (its needle is written only there).
    let control = "control-needle-7f3a9";
    let (code, hits) = sh(
        &a,
        &format!(
            "printf '%s%s' control- needle-7f3a9 > /tmp/control; \
             grep -rlsF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e '{control}' {} / ; \
             (env; cat /proc/[0-9]*/environ) | tr '\\0' '\\n' | grep -F {}",
            needles.join(" "),
            needles.join(" ")
        ),
    );
    assert_eq!(
        hits.trim(),
        "/tmp/control",
        "a real token is in the sandbox, or the search saw nothing ({code})"
    );

    // The access token: only inside `authorization`, only on API paths.
    let bearer = format!("-H 'authorization: Bearer {access_ph}'");
    assert_eq!(curl(&a, &format!("{bearer} https://{API}/v1/probe-1")), 200);
    let first_access = setup.oauth.grants()[0].issued.clone().unwrap().0;
    assert_eq!(
        received(&setup, "/v1/probe-1"),
        Some(format!("Bearer {first_access}"))
    );
    assert_eq!(curl(&a, &format!("{bearer} https://{API}/other/x")), 200);
    assert_eq!(
        received(&setup, "/other/x"),
        Some(format!("Bearer {access_ph}")),
        "injected outside the API paths"
    );
    assert_eq!(
        curl(
            &a,
            &format!("{bearer} -H 'x-copy: {access_ph}' https://{API}/v1/probe-2")
        ),
        403
    );
    assert!(
        setup.https.requests_to("/v1/probe-2").is_empty(),
        "a misplaced placeholder reached the provider"
    );

    // Two refreshes at once from the sandbox: the gateway answers both, one after the other, the second
    // with the rotated token; the sandbox gets placeholders; no family is revoked.
    let body =
        format!(r#"{{"grant_type":"refresh_token","refresh_token":"{refresh_ph}","client_id":"{CLIENT}"}}"#);
    let refresh = format!(
        "curl -sk -m 30 -H 'content-type: application/json' -d '{body}' https://{AUTH}/v1/oauth/token"
    );
    let (_, out) = sh(
        &a,
        &format!(
            "({refresh} > /tmp/r1 &); ({refresh} > /tmp/r2 &); sleep 0.2; while pgrep curl >/dev/null; do sleep 0.1; done; cat /tmp/r1; echo; cat /tmp/r2"
        ),
    );
    let answers: Vec<Value> = out
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 2, "{out}");
    for answer in &answers {
        assert_eq!(answer["access_token"], access_ph.as_str(), "{answer}");
        assert_eq!(answer["refresh_token"], refresh_ph.as_str(), "{answer}");
    }
    let grants = setup.oauth.grants();
    let refreshes: Vec<_> = grants
        .iter()
        .filter(|g| g.grant_type == "refresh_token")
        .collect();
    assert_eq!(refreshes.len(), 2, "{grants:#?}");
    assert!(refreshes.iter().all(|g| g.ok), "{grants:#?}");
    assert_eq!(
        refreshes[1].refresh_token,
        refreshes[0].issued.as_ref().map(|i| i.1.clone())
    );
    assert_eq!(
        setup.oauth.max_in_flight(),
        1,
        "two refreshes of one login overlapped"
    );
    assert!(!setup.oauth.any_revoked());
    // The newest access token, in this agent and in the other one the login is attached to.
    let newest = refreshes[1].issued.clone().unwrap().0;
    assert_eq!(curl(&a, &format!("{bearer} https://{API}/v1/probe-3")), 200);
    assert_eq!(received(&setup, "/v1/probe-3"), Some(format!("Bearer {newest}")));
    let b_access = credentials(&b).unwrap()["claudeAiOauth"]["accessToken"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        curl(
            &b,
            &format!("-H 'authorization: Bearer {b_access}' https://{API}/v1/probe-4")
        ),
        200
    );
    assert_eq!(received(&setup, "/v1/probe-4"), Some(format!("Bearer {newest}")));
    // Never the refresh token upstream outside the token endpoint, never a token in the sandbox.
    let (_, hits) = sh(
        &a,
        &format!(
            "grep -rlsF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev {} /",
            setup
                .oauth
                .all_tokens()
                .iter()
                .map(|t| format!("-e '{t}'"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    );
    assert!(hits.trim().is_empty(), "a real token is in the sandbox: {hits}");

    // After a restart: both agents still send the newest token (the runtime kept the rotated values), and
    // attaching the login again takes them from the login's record (sealed there by the refresh).
    setup.server.stop();
    setup.server.spawn();
    let s = &setup.server;
    assert_eq!(curl(&a, &format!("{bearer} https://{API}/v1/probe-6")), 200);
    assert_eq!(received(&setup, "/v1/probe-6"), Some(format!("Bearer {newest}")));
    assert_eq!(
        s.call(
            "DELETE",
            &path(&format!("/agents/{b}/provider-login")),
            &alice_token,
            None
        )
        .status,
        204
    );
    assert!(credentials(&b).is_none());
    let r = s.call(
        "PUT",
        &path(&format!("/agents/{b}/provider-login")),
        &alice_token,
        Some(&json!({"login": login})),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let b_access = credentials(&b).unwrap()["claudeAiOauth"]["accessToken"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        curl(
            &b,
            &format!("-H 'authorization: Bearer {b_access}' https://{API}/v1/probe-7")
        ),
        200
    );
    assert_eq!(
        received(&setup, "/v1/probe-7"),
        Some(format!("Bearer {newest}")),
        "the record kept an old token"
    );

    // A ChatGPT login on the same agent: codex's file, placeholders and an ID token that is not the
    // provider's (same claims, no valid signature).
    let (cid, page) = setup.start_provider_login(&alice, "chatgpt");
    assert_eq!(
        setup
            .complete(&alice, &cid, page["redirect"].as_str().unwrap())
            .status,
        200
    );
    let r = s.call(
        "PUT",
        &path(&format!("/agents/{a}/provider-login")),
        &alice_token,
        Some(&json!({"login": cid})),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        agent_json(&setup, &alice_token, &ws, &a)["provider_logins"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let (code, out) = sh(&a, "cat /workspace/.codex/auth.json");
    assert_eq!(code, 0, "{out}");
    let auth: Value = serde_json::from_str(&out).unwrap();
    assert!(auth["OPENAI_API_KEY"].is_null());
    assert!(
        auth["tokens"]["access_token"]
            .as_str()
            .unwrap()
            .starts_with("agenthold-placeholder"),
        "{auth}"
    );
    assert!(
        auth["tokens"]["refresh_token"]
            .as_str()
            .unwrap()
            .starts_with("agenthold-placeholder"),
        "{auth}"
    );
    assert_eq!(auth["tokens"]["account_id"], "acct-standin");
    let id_token = auth["tokens"]["id_token"].as_str().unwrap();
    assert!(
        !id_token.ends_with(".c3RhbmRpbi1zaWduYXR1cmU"),
        "the provider's ID token went in: {id_token}"
    );
    assert!(id_token.split('.').nth(1).is_some());
    for t in setup.chatgpt.all_tokens() {
        assert!(!out.contains(&t), "a ChatGPT token is in auth.json");
    }

    // Dave (member, admin grant on b) attaches his own login to b; lowering his grant detaches it.
    let (dave_id, dave_token, dave) = setup.person("dave");
    assert_eq!(
        s.call(
            "PUT",
            &path(&format!("/members/{dave_id}")),
            &alice_token,
            Some(&json!({"role": "member"}))
        )
        .status,
        201
    );
    let grant = |role: &str| {
        let r = s.call(
            "PUT",
            &path(&format!("/agents/{b}/grants/{dave_id}")),
            &alice_token,
            Some(&json!({"role": role})),
        );
        assert!(r.status == 200 || r.status == 201, "{:?}", r.body);
    };
    grant("admin");
    let daves = setup.connect(&dave);
    let r = s.call(
        "PUT",
        &path(&format!("/agents/{b}/provider-login")),
        &dave_token,
        Some(&json!({"login": daves})),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        agent_json(&setup, &alice_token, &ws, &b)["provider_login"]["owner"],
        dave_id.as_str()
    );
    grant("operator");
    assert!(
        agent_json(&setup, &alice_token, &ws, &b)["provider_login"].is_null(),
        "still attached after the grant was lowered"
    );
    assert!(credentials(&b).is_none(), "the credential file stayed");
    // Admin again, attached again; leaving the workspace detaches it.
    grant("admin");
    let r = s.call(
        "PUT",
        &path(&format!("/agents/{b}/provider-login")),
        &dave_token,
        Some(&json!({"login": daves})),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        s.call(
            "DELETE",
            &path(&format!("/members/{dave_id}")),
            &alice_token,
            None
        )
        .status,
        204
    );
    assert!(
        agent_json(&setup, &alice_token, &ws, &b)["provider_login"].is_null(),
        "still attached after leaving"
    );

    // Withdraw: gone from every agent; the old placeholder stands for nothing.
    assert_eq!(
        s.call(
            "DELETE",
            &format!("/api/v1/me/provider-logins/{login}"),
            &alice,
            None
        )
        .status,
        204
    );
    let left = agent_json(&setup, &alice_token, &ws, &a)["provider_logins"].clone();
    assert_eq!(left.as_array().unwrap().len(), 1, "{left}");
    assert_eq!(left[0]["provider"], "chatgpt", "{left}");
    assert!(credentials(&a).is_none());
    assert_eq!(
        sh(&a, "test -f /workspace/.codex/auth.json").0,
        0,
        "the other login's file went too"
    );
    assert_eq!(curl(&a, &format!("{bearer} https://{API}/v1/probe-5")), 200);
    assert_eq!(
        received(&setup, "/v1/probe-5"),
        Some(format!("Bearer {access_ph}")),
        "injected after the withdrawal"
    );
    let _ = (&setup.rt, &setup.http, &carol);
}

/// The harness image (`agenthold image build-harness`).
const HARNESS_IMAGE: &str = "agenthold/harness:latest";

// covers: S3, E15, P1
#[test]
#[ignore = "needs root, Docker and agenthold/harness:latest; make test runs it"]
fn the_real_claude_runs_on_an_attached_login_and_its_refresh_is_answered_by_the_gateway() {
    let present = Command::new("docker")
        .args(["image", "inspect", HARNESS_IMAGE])
        .output()
        .unwrap();
    assert!(
        present.status.success(),
        "{HARNESS_IMAGE} is missing: run `agenthold image build-harness` first"
    );
    let setup = Setup::start("", Duration::ZERO);
    let s = &setup.server;
    let (_, alice_token, alice) = setup.person("alice");
    let ws = s.call(
        "POST",
        "/api/v1/workspaces",
        &alice_token,
        Some(&json!({"name": "w"})),
    );
    let ws = ws.body["id"].as_str().unwrap().to_owned();
    let path = |rest: &str| format!("/api/v1/workspaces/{ws}{rest}");
    let policy = json!({"mode": "allowlist", "entries": [API, AUTH]});
    let r = s.call(
        "POST",
        &path("/agents"),
        &alice_token,
        Some(&json!({"name": "c", "image": HARNESS_IMAGE, "policy": policy})),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let agent = r.body["id"].as_str().unwrap().to_owned();
    let login = setup.connect(&alice);
    let r = s.call(
        "PUT",
        &path(&format!("/agents/{agent}/provider-login")),
        &alice_token,
        Some(&json!({"login": login})),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        sh(&agent, "stat -c '%U %a' /workspace/.claude/.credentials.json")
            .1
            .trim(),
        "agent 600"
    );
    // Force a refresh: the access token "expired" long ago.
    let (code, out) = sh(
        &agent,
        "sed -i 's/\"expiresAt\": [0-9]*/\"expiresAt\": 1000/' /workspace/.claude/.credentials.json && \
         grep -c '\"expiresAt\": 1000' /workspace/.claude/.credentials.json",
    );
    assert_eq!((code, out.trim()), (0, "1"));
    let before = setup.oauth.grants().len();
    let env = json!({
        "HOME": "/workspace", "USER": "agent", "LOGNAME": "agent",
        "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    });
    let argv = json!([
        "setpriv",
        "--reuid=agent",
        "--regid=agent",
        "--init-groups",
        "--",
        "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--dangerously-skip-permissions",
    ]);
    let r = s.call(
        "POST",
        &path(&format!("/agents/{agent}/execs")),
        &alice_token,
        Some(&json!({"argv": argv, "env": env, "cwd": "/workspace", "stdin": "Run the tool, then say what it printed.", "timeout": 180})),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let (stdout, stderr) = (
        r.body["stdout"].as_str().unwrap_or_default(),
        r.body["stderr"].as_str().unwrap_or_default(),
    );
    assert_eq!(r.body["exit_code"], 0, "claude failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(FINAL_TEXT),
        "no final message:\n{stdout}\n{stderr}"
    );
    // The refresh went through the gateway to the provider with the real refresh token.
    let grants = setup.oauth.grants();
    let refreshes: Vec<_> = grants[before..]
        .iter()
        .filter(|g| g.grant_type == "refresh_token")
        .collect();
    assert!(
        !refreshes.is_empty() && refreshes.iter().all(|g| g.ok),
        "no refresh: {grants:#?}\n{stderr}"
    );
    let newest = refreshes.last().unwrap().issued.clone().unwrap().0;
    // The Messages API got the refreshed access token, injected, in `authorization` only.
    let messages = setup.https.requests_to("/v1/messages");
    assert!(
        !messages.is_empty(),
        "claude never called the Messages API:\n{stderr}"
    );
    for m in &messages {
        assert_eq!(
            m.header("authorization"),
            Some(format!("Bearer {newest}").as_str()),
            "{m:?}"
        );
        assert!(m.header("x-api-key").is_none());
    }
    // The sandbox holds placeholders only, also after claude rewrote its file.
    let file = credentials(&agent).unwrap();
    assert!(
        file["claudeAiOauth"]["accessToken"]
            .as_str()
            .unwrap()
            .starts_with("agenthold-placeholder"),
        "{file}"
    );
    let needles: Vec<String> = setup
        .oauth
        .all_tokens()
        .iter()
        .map(|t| format!("-e '{t}'"))
        .collect();
    let (_, hits) = sh(
        &agent,
        &format!(
            "grep -rlsF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev {} /",
            needles.join(" ")
        ),
    );
    assert!(hits.trim().is_empty(), "a real token is in the sandbox: {hits}");
    let _ = (&setup.rt, &setup.http, &alice);
}

// covers: S3, E15 (the real codex on a ChatGPT login keeps its built-in provider: every call reaches
// chatgpt.com's backend with the account's token injected by the gateway, none goes to the API-key endpoint,
// and the sandbox holds placeholders only). The stand-in does not implement the backend's workspace routing
// discovery (`GET /backend-api/wham/accounts/check`, an undocumented answer), so codex ends its turn there
// and the run fails: this test proves where the token goes, not a whole ChatGPT-backed turn.
#[test]
#[ignore = "needs root, Docker and agenthold/harness:latest; make test runs it"]
fn the_real_codex_on_a_chatgpt_login_reaches_the_backend_only_with_the_injected_token() {
    let present = Command::new("docker")
        .args(["image", "inspect", HARNESS_IMAGE])
        .output()
        .unwrap();
    assert!(present.status.success(), "{HARNESS_IMAGE} is missing");
    let setup = Setup::start("", Duration::ZERO);
    let s = &setup.server;
    let (_, alice_token, alice) = setup.person("alice");
    let ws = s.call(
        "POST",
        "/api/v1/workspaces",
        &alice_token,
        Some(&json!({"name": "w"})),
    );
    let ws = ws.body["id"].as_str().unwrap().to_owned();
    let path = |rest: &str| format!("/api/v1/workspaces/{ws}{rest}");
    let policy = json!({"mode": "allowlist", "entries": [CHATGPT]});
    let r = s.call(
        "POST",
        &path("/agents"),
        &alice_token,
        Some(&json!({"name": "x", "image": HARNESS_IMAGE, "policy": policy})),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let agent = r.body["id"].as_str().unwrap().to_owned();
    let (login, page) = setup.start_provider_login(&alice, "chatgpt");
    let r = setup.complete(&alice, &login, page["redirect"].as_str().unwrap());
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = s.call(
        "PUT",
        &path(&format!("/agents/{agent}/provider-login")),
        &alice_token,
        Some(&json!({"login": login})),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let access = setup
        .chatgpt
        .grants()
        .iter()
        .rev()
        .find(|g| g.grant_type == "authorization_code" && g.ok)
        .and_then(|g| g.issued.clone())
        .map(|t| t.0)
        .expect("the code exchange issued tokens");

    let r = s.call(
        "POST",
        &path(&format!("/agents/{agent}/runs")),
        &alice_token,
        Some(
            &json!({"harness": "codex", "prompt": "Run the tool, then say what it printed.",
                     "model": "gpt-5-codex"}),
        ),
    );
    assert_eq!(r.status, 202, "{:?}", r.body);
    let run = r.body["id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let state = loop {
        let r = s.call(
            "GET",
            &path(&format!("/agents/{agent}/runs/{run}")),
            &alice_token,
            None,
        );
        let state = r.body["state"].as_str().unwrap_or_default().to_owned();
        if state != "running" && state != "queued" {
            break state;
        }
        assert!(std::time::Instant::now() < deadline, "the codex run did not end");
        std::thread::sleep(Duration::from_millis(500));
    };
    let output = s.call(
        "GET",
        &path(&format!("/agents/{agent}/runs/{run}/output")),
        &alice_token,
        None,
    );
    assert!(
        state == "succeeded" || output.body.to_string().contains("workspace routing discovery"),
        "codex ended for another reason: {:?}",
        output.body
    );
    // Codex called the ChatGPT backend: on the rule's paths (the Responses API and the account check)
    // every call carried the account's real token, put there by the gateway; elsewhere (plugins) only the
    // placeholder; nothing went to the API-key provider's endpoint.
    let calls = setup.https.requests_to("/backend-api/");
    assert!(
        calls
            .iter()
            .any(|c| c.path.starts_with("/backend-api/wham/accounts/check")),
        "codex never made its account check: {:?}",
        output.body
    );
    for c in &calls {
        let on_rule = c.path.starts_with("/backend-api/codex/") || c.path.starts_with("/backend-api/wham/");
        let auth = c.header("authorization").unwrap_or_default();
        if on_rule {
            assert_eq!(auth, format!("Bearer {access}"), "{c:?}");
        } else {
            assert!(auth.starts_with("Bearer agenthold-placeholder-"), "{c:?}");
        }
    }
    assert!(
        setup.https.requests_to("/v1/").is_empty(),
        "the API-key provider was used"
    );
    // The sandbox holds placeholders only.
    let needles: Vec<String> = setup
        .chatgpt
        .all_tokens()
        .iter()
        .map(|t| format!("-e '{t}'"))
        .collect();
    let (_, hits) = sh(
        &agent,
        &format!(
            "grep -rlsF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev {} /",
            needles.join(" ")
        ),
    );
    assert!(hits.trim().is_empty(), "a real token is in the sandbox: {hits}");
    let _ = (&setup.rt, &setup.http);
}
