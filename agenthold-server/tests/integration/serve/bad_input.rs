//! Bad input and refused credentials: every one gets a clear 4xx `application/problem+json` (with `status`
//! and `code`) and changes nothing (the lists read the same after, and the audit log has no new success).
//! Also the rate limits (S13: 429 with `Retry-After`, per token and per client address) and cross-origin
//! protection (S6: a cookie-authenticated write from another site is refused; a bearer token from a
//! program is not).

use std::time::Duration;

use serde_json::{Value, json};

use super::client::{self, Answer};
use super::support::{Auth, TestServer};

/// No rate limits (the rate limits have their own test).
const NO_LIMITS: &str = "auth:\n  rate_per_user: 0\n  rate_per_token: 0\n  rate_unauthenticated: 0\n";

fn call(server: &TestServer, method: &str, path: &str, auth: &Auth, body: Option<&Value>) -> Answer {
    client::call(&server.base, method, path, auth, body, &[])
}

/// Fails unless `answer` is a problem+json with `status`.
#[track_caller]
fn refused(what: &str, answer: &Answer, status: u16) {
    assert_eq!(answer.status, status, "{what}: {answer:?}");
    assert!(
        answer.is_problem(),
        "{what}: not a problem+json with status and code: {answer:?}"
    );
}

/// Everything a refused request could have changed, as the owner reads it: workspaces, members, agents,
/// the agent's policy, tokens (by id) and the successful entries of the audit log.
fn snapshot(server: &TestServer, owner: &Auth, ws: &str, agent: &str) -> Value {
    let get = |path: &str| {
        let answer = call(server, "GET", path, owner, None);
        assert_eq!(answer.status, 200, "GET {path}: {answer:?}");
        answer.body
    };
    let tokens: Vec<Value> = get("/api/v1/me/tokens")["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].clone())
        .collect();
    let audit_ok: Vec<Value> = get(&format!("/api/v1/workspaces/{ws}/audit?limit=500"))["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["result"] == "ok")
        .cloned()
        .collect();
    json!({
        "workspaces": get("/api/v1/workspaces"),
        "members": get(&format!("/api/v1/workspaces/{ws}/members")),
        "agents": get(&format!("/api/v1/workspaces/{ws}/agents")),
        "policy": get(&format!("/api/v1/workspaces/{ws}/agents/{agent}/network-policy")),
        "tokens": tokens,
        "audit_ok": audit_ok,
    })
}

/// The raw request head of a JSON write with the owner's token.
fn head(method: &str, path: &str, token: &str, content_type: Option<&str>, length: usize) -> String {
    let content_type = content_type
        .map(|t| format!("\r\nContent-Type: {t}"))
        .unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nAuthorization: Bearer {token}\r\nAccept: application/json\r\n\
         Content-Length: {length}{content_type}"
    )
}

// covers: S5, S7, S9
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn bad_requests_and_refused_credentials_get_a_problem_and_change_nothing() {
    let server = TestServer::start_with(&format!("{NO_LIMITS}{}", client::own_pool(1)), &[]);
    let (alice, token) = server.user("alice");
    let (bob, bob_token) = server.user("bob");
    let owner = Auth::Token(token.clone());
    let bob_auth = Auth::Token(bob_token);
    let ws = call(
        &server,
        "POST",
        "/api/v1/workspaces",
        &owner,
        Some(&json!({"name": "w"})),
    );
    assert_eq!(ws.status, 201, "{ws:?}");
    let ws = ws.body["id"].as_str().unwrap().to_owned();
    let policy = json!({"mode": "allowlist", "entries": ["api.example.test"]});
    let agents = format!("/api/v1/workspaces/{ws}/agents");
    let agent = call(
        &server,
        "POST",
        &agents,
        &owner,
        Some(&json!({"name": "a", "policy": policy})),
    );
    assert_eq!(agent.status, 201, "{agent:?}");
    let agent = agent.body["id"].as_str().unwrap().to_owned();
    let agent_path = format!("{agents}/{agent}");
    let policy_path = format!("{agent_path}/network-policy");
    let token_id = call(&server, "GET", "/api/v1/me/tokens", &owner, None).body["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let nonexistent = call(
        &server,
        "GET",
        "/api/v1/workspaces/nosuchworkspace0",
        &owner,
        None,
    );
    refused("a workspace that does not exist", &nonexistent, 404);
    // Credentials that will be no good: an expiring token, a revoked one, a session that logs out.
    let expired = server.admin(&["token", "create", "--user", &alice, "--expires-in", "1"]);
    let expiring = std::time::Instant::now();
    let session = server.session(&alice);
    let body = json!({"name": "gone"});
    let minted = call(
        &server,
        "POST",
        "/api/v1/me/tokens",
        &Auth::Session(session.clone()),
        Some(&body),
    );
    assert_eq!(minted.status, 201, "{minted:?}");
    let revoked = minted.body["token"].as_str().unwrap().to_owned();
    let path = format!("/api/v1/me/tokens/{}", minted.body["id"].as_str().unwrap());
    assert_eq!(call(&server, "DELETE", &path, &owner, None).status, 204);
    let logout = call(
        &server,
        "POST",
        "/auth/logout",
        &Auth::Session(session.clone()),
        None,
    );
    assert!((200..300).contains(&logout.status), "{logout:?}");
    let before = snapshot(&server, &owner, &ws, &agent);

    // Bodies: malformed, wrong types, unknown fields, no Content-Type, over the cap.
    let raw = |method: &str, path: &str, content_type: Option<&str>, body: &[u8]| {
        client::raw(
            &server.base,
            &head(method, path, &token, content_type, body.len()),
            body,
        )
    };
    let json_type = Some("application/json");
    refused(
        "malformed JSON",
        &raw("POST", "/api/v1/workspaces", json_type, b"{\"name\":"),
        400,
    );
    refused(
        "not JSON at all",
        &raw("POST", "/api/v1/workspaces", json_type, b"\x00\xff"),
        400,
    );
    for (what, path, method, body) in [
        (
            "a number for a name",
            "/api/v1/workspaces".to_owned(),
            "POST",
            json!({"name": 5}),
        ),
        (
            "an unknown field",
            "/api/v1/workspaces".to_owned(),
            "POST",
            json!({"name": "w", "owner": "bob"}),
        ),
        ("no name", "/api/v1/workspaces".to_owned(), "POST", json!({})),
        ("a list for a body", agents.clone(), "POST", json!(["a"])),
        (
            "an unknown role",
            format!("/api/v1/workspaces/{ws}/members/{bob}"),
            "PUT",
            json!({"role": "king"}),
        ),
        (
            "a number for a role",
            format!("{agent_path}/grants/{bob}"),
            "PUT",
            json!({"role": 1}),
        ),
        (
            "entries as a string",
            policy_path.clone(),
            "PUT",
            json!({"mode": "allowlist", "entries": "x.com"}),
        ),
    ] {
        let answer = call(&server, method, &path, &owner, Some(&body));
        // 422 as a rule; serde_json reports a number where an enum is expected as a syntax error (400).
        let status = if answer.status == 400 { 400 } else { 422 };
        refused(what, &answer, status);
    }
    let answer = raw("POST", "/api/v1/workspaces", None, br#"{"name": "w2"}"#);
    refused("no Content-Type", &answer, 415);
    let answer = raw(
        "POST",
        "/api/v1/workspaces",
        Some("text/plain"),
        br#"{"name": "w2"}"#,
    );
    refused("Content-Type text/plain", &answer, 415);
    let mut big = br#"{"name": ""#.to_vec();
    big.resize(9 * 1024 * 1024, b'a');
    big.extend_from_slice(b"\"}");
    refused(
        "a 9 MiB body",
        &raw("POST", "/api/v1/workspaces", json_type, &big),
        413,
    );
    let mut big = br#"{"mode": "allowlist", "entries": ["#.to_vec();
    while big.len() < 9 * 1024 * 1024 {
        big.extend_from_slice(b"\"a.example.com\",");
    }
    big.extend_from_slice(b"\"b.example.com\"]}");
    refused("a 9 MiB policy", &raw("PUT", &policy_path, json_type, &big), 413);

    // Invalid policy entries: 400 naming the entry, on replace and on create.
    for entry in ["bad entry!!", "http://x.com/path", "*.*.com", "x.com:99999", ""] {
        let body = json!({"mode": "allowlist", "entries": ["api.example.test", entry]});
        let answer = call(&server, "PUT", &policy_path, &owner, Some(&body));
        refused(&format!("policy entry {entry:?}"), &answer, 400);
        let detail = answer.body["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(&format!("{entry:?}")) || (!entry.is_empty() && detail.contains(entry)),
            "{entry:?} not named: {detail}"
        );
    }
    let body = json!({"name": "b", "policy": {"mode": "allowlist", "entries": ["bad entry!!"]}});
    let answer = call(&server, "POST", &agents, &owner, Some(&body));
    refused("an agent with a bad policy entry", &answer, 400);
    assert!(
        answer.body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("bad entry!!"),
        "{answer:?}"
    );
    let answer = call(
        &server,
        "PUT",
        &policy_path,
        &owner,
        Some(&json!({"mode": "closed", "entries": []})),
    );
    refused("policy mode closed", &answer, 400);

    // Ids: 10 kB, or not ids at all: the 404 of an id that does not exist.
    let huge = "a".repeat(10 * 1024);
    for id in [
        huge.as_str(),
        "UPPER",
        "..",
        "a%20b",
        "%00",
        "-x",
        "a.b",
        &"b".repeat(64),
    ] {
        for (method, path) in [
            ("GET", format!("/api/v1/workspaces/{id}")),
            ("DELETE", format!("/api/v1/workspaces/{id}")),
            ("GET", format!("{agents}/{id}")),
            ("PUT", format!("{agents}/{id}/network-policy")),
            ("DELETE", format!("/api/v1/workspaces/{ws}/members/{id}")),
            ("DELETE", format!("/api/v1/me/tokens/{id}")),
        ] {
            let body = (method == "PUT").then(|| json!({"mode": "open", "entries": []}));
            let answer = call(&server, method, &path, &owner, body.as_ref());
            refused(&format!("{method} with id {:.20}", id), &answer, 404);
            assert_eq!(answer.body, nonexistent.body, "{method} {path:.80}");
        }
    }

    // Credentials that are no good: expired, revoked, a session after logout: 401.
    std::thread::sleep(Duration::from_secs(2).saturating_sub(expiring.elapsed()));
    for (what, auth) in [
        ("an expired token", Auth::Token(expired)),
        ("a revoked token", Auth::Token(revoked)),
        ("a session cookie after logout", Auth::Session(session)),
        (
            "a token never issued",
            Auth::Token(format!("ahp_{}", "A".repeat(43))),
        ),
    ] {
        for (method, path, body) in [
            ("GET", "/api/v1/me".to_owned(), None),
            (
                "POST",
                "/api/v1/workspaces".to_owned(),
                Some(json!({"name": "sneaky"})),
            ),
            (
                "PUT",
                policy_path.clone(),
                Some(json!({"mode": "open", "entries": []})),
            ),
            ("DELETE", agent_path.clone(), None),
        ] {
            refused(
                &format!("{what}: {method} {path}"),
                &call(&server, method, &path, &auth, body.as_ref()),
                401,
            );
        }
    }

    // Another user's token on my resources: the 404 of an id that does not exist (S5).
    for (method, path, body) in [
        ("GET", format!("/api/v1/workspaces/{ws}"), None),
        (
            "PATCH",
            format!("/api/v1/workspaces/{ws}"),
            Some(json!({"name": "mine"})),
        ),
        ("DELETE", format!("/api/v1/workspaces/{ws}"), None),
        (
            "PUT",
            format!("/api/v1/workspaces/{ws}/members/{bob}"),
            Some(json!({"role": "owner"})),
        ),
        ("GET", agent_path.clone(), None),
        ("PUT", policy_path, Some(json!({"mode": "open", "entries": []}))),
        ("DELETE", agent_path, None),
        ("DELETE", format!("/api/v1/me/tokens/{token_id}"), None),
    ] {
        let answer = call(&server, method, &path, &bob_auth, body.as_ref());
        refused(&format!("bob: {method} {path}"), &answer, 404);
        assert_eq!(answer.body, nonexistent.body, "bob: {method} {path}");
    }

    assert_eq!(
        snapshot(&server, &owner, &ws, &agent),
        before,
        "a refused request changed something"
    );
    assert_eq!(
        call(&server, "GET", "/api/v1/me", &owner, None).status,
        200,
        "my token still works"
    );
}

// covers: S13
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn rate_limits_answer_429_with_retry_after() {
    let config = format!(
        "auth:\n  rate_per_token: 2\n  rate_per_user: 1000\n{}",
        client::own_pool(2)
    );
    let server = TestServer::start_with(&config, &[]);
    let (user, token) = server.user("hammer");
    let other = server.admin(&["token", "create", "--user", &user]);
    let hammer = |auth: &Auth| -> (usize, Answer) {
        for n in 1..=200 {
            let answer = call(&server, "GET", "/api/v1/me", auth, None);
            if answer.status == 429 {
                return (n, answer);
            }
            assert!(matches!(answer.status, 200 | 401), "{answer:?}");
        }
        panic!("200 requests without a 429");
    };
    let seconds = |answer: &Answer| -> u64 {
        let value = answer
            .retry_after
            .as_deref()
            .unwrap_or_else(|| panic!("no Retry-After: {answer:?}"));
        value
            .parse()
            .unwrap_or_else(|_| panic!("Retry-After {value:?} is not whole seconds"))
    };

    // Per token: 2 a second (a burst of 8), then 429 with Retry-After; another token of the same user is
    // not held back by it; after Retry-After the first is let in again.
    let (sent, limited) = hammer(&Auth::Token(token.clone()));
    assert!(sent > 2, "limited after {sent} requests");
    refused("over the token's rate", &limited, 429);
    assert_eq!(limited.body["code"], "rate_limited");
    let wait = seconds(&limited);
    assert!(wait >= 1, "Retry-After {wait}");
    assert_eq!(
        call(&server, "GET", "/api/v1/me", &Auth::Token(other), None).status,
        200
    );
    std::thread::sleep(Duration::from_secs(wait));
    assert_eq!(
        call(&server, "GET", "/api/v1/me", &Auth::Token(token), None).status,
        200
    );

    // Unauthenticated (no credentials, or a bad token) from one address: 401s, then 429.
    let (sent, limited) = hammer(&Auth::None);
    assert!(sent > 1, "limited after {sent} requests");
    refused("unauthenticated burst", &limited, 429);
    assert!(seconds(&limited) >= 1);
    let bad = call(
        &server,
        "GET",
        "/api/v1/me",
        &Auth::Token("ahp_nope".into()),
        None,
    );
    refused("a bad token from a limited address", &bad, 429);
}

// covers: S6
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn cross_origin_cookie_writes_are_refused_and_bearer_writes_are_not() {
    let server = TestServer::start_with(&format!("{NO_LIMITS}{}", client::own_pool(3)), &[]);
    let (user, token) = server.user("carol");
    let cookie = Auth::Session(server.session(&user));
    let bearer = Auth::Token(token);
    let ws = call(
        &server,
        "POST",
        "/api/v1/workspaces",
        &bearer,
        Some(&json!({"name": "home"})),
    );
    assert_eq!(ws.status, 201, "{ws:?}");
    let ws = ws.body["id"].as_str().unwrap().to_owned();
    let ws_path = format!("/api/v1/workspaces/{ws}");
    let list = || call(&server, "GET", "/api/v1/workspaces", &bearer, None).body;
    let before = list();
    let audit = |s: &TestServer| call(s, "GET", &format!("{ws_path}/audit"), &bearer, None).body;
    let audit_before = audit(&server);

    let foreign: [&[(&str, &str)]; 3] = [
        &[("Sec-Fetch-Site", "cross-site")],
        &[("Origin", "http://evil.example")],
        &[("Sec-Fetch-Site", "same-site"), ("Origin", "http://evil.example")],
    ];
    for headers in foreign {
        for (method, path, body) in [
            (
                "POST",
                "/api/v1/workspaces".to_owned(),
                Some(json!({"name": "evil"})),
            ),
            ("PATCH", ws_path.clone(), Some(json!({"name": "evil"}))),
            ("DELETE", ws_path.clone(), None),
            (
                "POST",
                "/api/v1/me/tokens".to_owned(),
                Some(json!({"name": "evil"})),
            ),
        ] {
            let answer = client::call(&server.base, method, &path, &cookie, body.as_ref(), headers);
            refused(&format!("{method} {path} with {headers:?}"), &answer, 403);
        }
        // Reading is not a write: a cross-site GET is answered.
        let read = client::call(&server.base, "GET", &ws_path, &cookie, None, headers);
        assert_eq!(read.status, 200, "{read:?}");
    }
    assert_eq!(
        list(),
        before,
        "a refused cross-origin write changed the workspaces"
    );
    assert_eq!(
        audit(&server),
        audit_before,
        "a refused cross-origin write reached the audit log"
    );

    // The same writes from the UI's own origin, and from a program with a token (no browser headers).
    let own = server.base.clone();
    let same: [&[(&str, &str)]; 2] = [&[("Sec-Fetch-Site", "same-origin")], &[("Origin", own.as_str())]];
    for headers in same {
        let answer = client::call(
            &server.base,
            "PATCH",
            &ws_path,
            &cookie,
            Some(&json!({"name": "renamed"})),
            headers,
        );
        assert_eq!(answer.status, 200, "same-origin {headers:?}: {answer:?}");
    }
    let answer = call(
        &server,
        "POST",
        "/api/v1/workspaces",
        &bearer,
        Some(&json!({"name": "scripted"})),
    );
    assert_eq!(answer.status, 201, "{answer:?}");
    let answer = call(&server, "DELETE", &ws_path, &bearer, None);
    assert_eq!(answer.status, 204, "{answer:?}");
}
