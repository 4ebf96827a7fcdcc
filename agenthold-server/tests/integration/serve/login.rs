//! Browser logins through OIDC and GitHub, end to end over real HTTP on loopback: a real `agenthold serve`,
//! identity provider stand-ins written in [`super::login_standins`], and a cookie-keeping client that does
//! not follow redirects, so every hop (start → provider → callback → `next`) is checked.

use std::time::Duration;

use serde_json::json;

use super::login_standins::{self as standins, CLIENT_SECRET, Person, Spoil};
use super::login_support::{Browser, cookie, invite, members, server, server_rated, workspace};
use super::support::Auth;

// covers: S6
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn github_login_with_pkce_binds_invitations_and_rotates_the_session() {
    let gh = standins::github();
    let (server, _secrets) = server(Some(&gh), None, "");
    let providers = server.call("GET", "/auth/providers", &Auth::None, None);
    assert_eq!(
        providers.body,
        json!({"providers": [
            {"id": "github", "name": "GitHub", "start": "/auth/github/start"},
            {"id": "local", "name": "Local admin link"}
        ]})
    );
    // Invitations: Ada by subject, Grace by email (verified at GitHub), Eve by an email GitHub has not verified.
    let (ws, owner) = workspace(&server);
    let ada_invite = invite(
        &server,
        &ws,
        &owner,
        &json!({"provider": "github", "subject": "1001", "role": "admin"}),
    );
    assert!(ada_invite["id"].as_str().unwrap().starts_with("inv_"));
    invite(
        &server,
        &ws,
        &owner,
        &json!({"email": "Grace@Example.com", "role": "member"}),
    );
    invite(
        &server,
        &ws,
        &owner,
        &json!({"email": "eve@example.com", "role": "member"}),
    );
    assert_eq!(
        members(&server, &ws, &owner)
            .iter()
            .filter(|m| m["pending"] == true)
            .count(),
        3
    );

    // Ada logs in: PKCE checked by the stand-in, 303 to next, a session, the invitation bound.
    gh.set_person(Person::new("1001", "Ada Lovelace", Some("ada@example.com"), true));
    let mut browser = Browser::new();
    let done = browser.login(&server, "github", "/w/team?tab=agents");
    assert_eq!(done.status, 303, "{done:?}\n{}", server.log());
    assert_eq!(done.location.as_deref(), Some("/w/team?tab=agents"));
    let session = cookie(&done, "agenthold_session");
    for attr in ["; Path=/", "; HttpOnly", "; SameSite=Lax", "; Max-Age=604800"] {
        assert!(session.contains(attr), "{session}");
    }
    assert!(!session.contains("Secure"), "{session}");
    // The binding cookie was set at start (short-lived, for /auth/ only) and dropped at the callback.
    let binding = browser
        .set_cookies
        .iter()
        .find(|c| c.starts_with("agenthold_login=") && !c.contains("Max-Age=0"))
        .unwrap();
    for attr in ["; Path=/auth/", "; HttpOnly", "; SameSite=Lax", "; Max-Age=600"] {
        assert!(binding.contains(attr), "{binding}");
    }
    assert!(cookie(&done, "agenthold_login").contains("Max-Age=0"));
    assert_eq!(gh.shared.lock().unwrap().pkce_ok, 1);
    let (status, me) = browser.me(&server);
    assert_eq!((status, me["name"].as_str()), (200, Some("Ada Lovelace")), "{me}");
    let list = members(&server, &ws, &owner);
    let ada = list.iter().find(|m| m["name"] == "Ada Lovelace").unwrap();
    assert_eq!(
        (ada["role"].as_str(), ada["pending"].as_bool()),
        (Some("admin"), Some(false))
    );

    // Logging in again from the same browser: a new session, and the old one is gone.
    let old = browser.session().unwrap();
    let again = browser.login(&server, "github", "/");
    assert_eq!(again.status, 303);
    let new = browser.session().unwrap();
    assert_ne!(old, new);
    let r = server.call("GET", "/api/v1/me", &Auth::Session(old), None);
    assert_eq!(r.status, 401, "the presented session must end at login");
    assert_eq!(browser.me(&server).0, 200);
    // Same subject, same user.
    assert_eq!(browser.me(&server).1["id"], me["id"]);

    // Grace: bound by her verified email. Eve: not bound (GitHub did not verify her address).
    gh.set_person(Person::new(
        "1002",
        "Grace Hopper",
        Some("grace@example.com"),
        true,
    ));
    assert_eq!(Browser::new().login(&server, "github", "/").status, 303);
    gh.set_person(Person::new("1003", "Eve", Some("eve@example.com"), false));
    assert_eq!(Browser::new().login(&server, "github", "/").status, 303);
    let list = members(&server, &ws, &owner);
    let grace = list.iter().find(|m| m["name"] == "Grace Hopper").unwrap();
    assert_eq!(grace["role"], "member");
    assert!(list.iter().all(|m| m["name"] != "Eve"), "{list:?}");
    let eve_pending = list.iter().find(|m| m["email"] == "eve@example.com").unwrap();
    assert_eq!(eve_pending["pending"], true);
    // A pending member is removed by its id.
    let id = eve_pending["id"].as_str().unwrap();
    let r = server.call(
        "DELETE",
        &format!("/api/v1/workspaces/{ws}/members/{id}"),
        &Auth::Token(owner.clone()),
        None,
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    assert!(
        members(&server, &ws, &owner)
            .iter()
            .all(|m| m["pending"] == false)
    );
    // The bindings are in the audit log.
    let audit = server.call(
        "GET",
        &format!("/api/v1/workspaces/{ws}/audit"),
        &Auth::Token(owner),
        None,
    );
    let binds = audit.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "member.bind_invitation")
        .count();
    assert_eq!(binds, 2, "{:?}", audit.body);

    // A replayed callback: the state is used up.
    let mut b = Browser::new();
    gh.set_person(Person::new("1004", "Mallory", None, false));
    let callback = b.until_callback(&server, "github", "/");
    assert_eq!(b.get(&callback).status, 303);
    let replay = b.get(&callback);
    assert_eq!(replay.status, 400);
    assert!(
        replay.body.contains("state unknown or expired"),
        "{}",
        replay.body
    );

    // A code issued for another attempt fails PKCE at the provider; a reused code is refused.
    let mut b = Browser::new();
    let first = b.until_callback(&server, "github", "/");
    let second = b.until_callback(&server, "github", "/");
    let code_of = |url: &str| {
        url.split("code=")
            .nth(1)
            .unwrap()
            .split('&')
            .next()
            .unwrap()
            .to_owned()
    };
    let state_of = |url: &str| {
        url.split("state=")
            .nth(1)
            .unwrap()
            .split('&')
            .next()
            .unwrap()
            .to_owned()
    };
    let swapped = format!(
        "{}/auth/github/callback?code={}&state={}",
        server.base,
        code_of(&first),
        state_of(&second)
    );
    let page = b.get(&swapped);
    assert_eq!(page.status, 401, "{page:?}");
    assert!(
        page.body.contains("the identity provider refused the code"),
        "{}",
        page.body
    );
    assert!(!page.body.contains(CLIENT_SECRET));
    assert_eq!(
        gh.shared.lock().unwrap().refusals.last().map(String::as_str),
        Some("PKCE verifier does not match the challenge")
    );
    let third = b.until_callback(&server, "github", "/");
    let reused = format!(
        "{}/auth/github/callback?code={}&state={}",
        server.base,
        code_of(&first),
        state_of(&third)
    );
    let page = b.get(&reused);
    assert_eq!(page.status, 401, "{page:?}");
    assert_eq!(
        gh.shared.lock().unwrap().refusals.last().map(String::as_str),
        Some("reused code")
    );
    // The failure page is CSP-clean and links back to the sign-in page.
    assert!(page.body.contains("href=\"/login\"") && !page.body.contains("<script"));
}

// covers: S6
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn oidc_login_checks_state_browser_and_every_part_of_the_id_token() {
    let idp = standins::oidc();
    let (server, _secrets) = server(None, Some(&idp), "");
    let providers = server.call("GET", "/auth/providers", &Auth::None, None);
    assert_eq!(
        providers.body["providers"][0],
        json!({"id": "oidc", "name": "Test IdP", "start": "/auth/oidc/start"})
    );
    let (ws, owner) = workspace(&server);
    invite(
        &server,
        &ws,
        &owner,
        &json!({"email": "kim@example.com", "role": "member"}),
    );
    invite(
        &server,
        &ws,
        &owner,
        &json!({"email": "lee@example.com", "role": "member"}),
    );

    // Success: unverified email first (no binding), then a verified one.
    idp.set_person(Person::new("lee-sub", "Lee", Some("lee@example.com"), false));
    let mut lee = Browser::new();
    let done = lee.login(&server, "oidc", "/w/team");
    assert_eq!(
        (done.status, done.location.as_deref()),
        (303, Some("/w/team")),
        "{done:?}\n{}",
        server.log()
    );
    assert_eq!(lee.me(&server).1["name"], "Lee");
    idp.set_person(Person::new("kim-sub", "Kim", Some("kim@example.com"), true));
    let mut kim = Browser::new();
    assert_eq!(kim.login(&server, "oidc", "/").status, 303);
    let list = members(&server, &ws, &owner);
    assert!(
        list.iter().any(|m| m["name"] == "Kim" && m["pending"] == false),
        "{list:?}"
    );
    assert!(
        list.iter()
            .any(|m| m["email"] == "lee@example.com" && m["pending"] == true),
        "{list:?}"
    );

    // Each spoiled ID token is refused with its reason.
    for (spoil, reason) in [
        (Spoil::Nonce, "ID token nonce mismatch"),
        (Spoil::Audience, "ID token audience does not include this client"),
        (Spoil::Issuer, "ID token issuer mismatch"),
        (Spoil::Expired, "ID token expired"),
        (Spoil::Signature, "ID token signature does not verify"),
        (
            Spoil::UnknownKid,
            "no key in the provider JWK set fits the ID token",
        ),
    ] {
        idp.spoil(spoil);
        let mut b = Browser::new();
        let page = b.login(&server, "oidc", "/");
        assert_eq!(page.status, 401, "{spoil:?}: {page:?}");
        assert!(page.body.contains(reason), "{spoil:?}: {}", page.body);
        assert!(b.session().is_none(), "{spoil:?}");
        assert_eq!(b.me(&server).0, 401);
    }
    idp.spoil(Spoil::None);

    // A tampered state.
    let mut b = Browser::new();
    let callback = b.until_callback(&server, "oidc", "/");
    let tampered = callback.replace("state=", "state=A");
    let page = b.get(&tampered);
    assert_eq!(page.status, 400);
    assert!(page.body.contains("state unknown or expired"), "{}", page.body);

    // The callback without the browser's binding cookie (a login CSRF: someone else's state and code).
    let mut attacker = Browser::new();
    let callback = attacker.until_callback(&server, "oidc", "/");
    let mut victim = Browser::new();
    let page = victim.get(&callback);
    assert_eq!(page.status, 400, "{page:?}");
    assert!(page.body.contains("not started in this browser"), "{}", page.body);
    assert!(victim.session().is_none());
    // ... or with another browser's binding cookie.
    let callback = attacker.until_callback(&server, "oidc", "/");
    let _ = victim.until_callback(&server, "oidc", "/");
    let page = victim.get(&callback);
    assert_eq!(page.status, 400, "{page:?}");
    assert!(page.body.contains("not started in this browser"), "{}", page.body);

    // A replayed callback.
    let mut b = Browser::new();
    let callback = b.until_callback(&server, "oidc", "/");
    assert_eq!(b.get(&callback).status, 303);
    let page = b.get(&callback);
    assert_eq!(page.status, 400);
    assert!(page.body.contains("state unknown or expired"), "{}", page.body);
    // The failure pages carry a CSP without script.
    assert!(!page.body.contains("<script"));
}

// covers: S6
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn cookies_are_host_prefixed_and_secure_when_the_public_url_is_https() {
    let gh = standins::github();
    // The server listens on plain HTTP here; only its cookies' attributes follow the public URL.
    let (server, _secrets) = server(Some(&gh), None, "  public_url: https://agents.example\n");
    gh.set_person(Person::new("7", "Tls", None, false));
    let mut b = Browser::new();
    let start = b.get(&format!("{}/auth/github/start?next=/x", server.base));
    let binding = cookie(&start, "__Host-agenthold_login");
    for attr in [
        "; Path=/",
        "; HttpOnly",
        "; SameSite=Lax",
        "; Secure",
        "; Max-Age=600",
    ] {
        assert!(binding.contains(attr), "{binding}");
    }
    // The redirect URI registered with the provider is under the public URL.
    let authorize = start.location.unwrap();
    assert!(
        authorize.contains("redirect_uri=https%3A%2F%2Fagents.example%2Fauth%2Fgithub%2Fcallback"),
        "{authorize}"
    );
    let back = b.get(&authorize).location.unwrap();
    let local = back.replace("https://agents.example", &server.base);
    let done = b.get(&local);
    assert_eq!(done.status, 303, "{done:?}");
    let session = cookie(&done, "__Host-agenthold_session");
    for attr in [
        "; Path=/",
        "; HttpOnly",
        "; SameSite=Lax",
        "; Secure",
        "; Max-Age=604800",
    ] {
        assert!(session.contains(attr), "{session}");
    }
}

// covers: S6
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn open_redirects_through_next_land_on_the_root() {
    let gh = standins::github();
    let (server, _secrets) = server(Some(&gh), None, "");
    gh.set_person(Person::new("9", "Nat", None, false));
    for next in [
        "//evil.example",
        "/\\evil.example",
        "https://evil.example/",
        "/%2Fevil.example",
        "/\t/evil.example",
        "javascript:alert(1)",
        "",
    ] {
        let mut b = Browser::new();
        let done = b.login(&server, "github", next);
        assert_eq!(
            (done.status, done.location.as_deref()),
            (303, Some("/")),
            "{next:?}"
        );
    }
    // The local admin link answers the sanitised next too.
    let link = server.admin(&["login-link"]);
    let token = link.split('#').nth(1).unwrap();
    let r = server.call(
        "POST",
        "/auth/local",
        &Auth::None,
        Some(&json!({"token": token, "next": "//evil.example"})),
    );
    assert_eq!((r.status, &r.body), (200, &json!({"next": "/"})));
    let link = server.admin(&["login-link"]);
    let token = link.split('#').nth(1).unwrap();
    let r = server.call(
        "POST",
        "/auth/local",
        &Auth::None,
        Some(&json!({"token": token, "next": "/w/team"})),
    );
    assert_eq!((r.status, &r.body), (200, &json!({"next": "/w/team"})));
}

// covers: S6
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn a_rotated_signing_key_is_fetched_when_a_token_names_it() {
    let idp = standins::oidc();
    let (server, _secrets) = server(None, Some(&idp), "");
    idp.set_person(Person::new("rot", "Rot", None, false));
    assert_eq!(Browser::new().login(&server, "oidc", "/").status, 303);
    // The provider rotates its key; the server's cached set lacks the new kid and is fetched again
    // (at most every 10 s).
    idp.rotate_key();
    std::thread::sleep(Duration::from_millis(10_500));
    let done = Browser::new().login(&server, "oidc", "/");
    assert_eq!(done.status, 303, "{done:?}");
}

// covers: S6, S13
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn failed_callbacks_are_rate_limited_per_client_address() {
    let gh = standins::github();
    let (server, _secrets) = server_rated(Some(&gh), None, "", 1);
    let mut b = Browser::new();
    let url = format!("{}/auth/github/callback?code=x&state=forged", server.base);
    let statuses: Vec<u16> = (0..8).map(|_| b.get(&url).status).collect();
    // A burst of 4 failures passes (with their page), then 429.
    assert_eq!(&statuses[..4], &[400; 4], "{statuses:?}");
    assert!(statuses[4..].contains(&429), "{statuses:?}");
    // Successful logins are not what is limited: after a pause, a real login goes through.
    std::thread::sleep(Duration::from_millis(2100));
    gh.set_person(Person::new("5", "Pat", None, false));
    assert_eq!(b.login(&server, "github", "/").status, 303);
}

// covers: S6
#[test]
fn a_missing_client_secret_file_fails_the_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "data_dir: {}\nauth:\n  github:\n    client_id: x\n    client_secret_file: {}/missing\n",
            dir.path().join("data").display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(super::support::BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("auth.github.client_secret_file: cannot read"),
        "{stderr}"
    );
}
