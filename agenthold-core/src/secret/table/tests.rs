use super::*;
use crate::secret::{AlsoIn, Preset, Redacted, SecretRule};

fn head(host: &str, path: &str, headers: &[(&str, &str)]) -> RequestHead {
    RequestHead {
        method: "GET".into(),
        host: host.into(),
        path_and_query: path.into(),
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
            .collect(),
    }
}

fn header<'a>(h: &'a RequestHead, name: &str) -> Vec<&'a [u8]> {
    h.headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_slice())
        .collect()
}

fn table(guard: LeakGuard) -> (SecretTable, AgentId, String) {
    table_with(guard, AlsoIn::default())
}

fn table_with(guard: LeakGuard, also_in: AlsoIn) -> (SecretTable, AgentId, String) {
    let t = SecretTable::new(guard);
    let a = AgentId::new("a").unwrap();
    let rule = SecretRule::header(&["api.example.test"], "Authorization", "Bearer {{.Value}}").unwrap();
    let rule = if also_in.is_empty() {
        rule
    } else {
        rule.with_also_in(also_in).unwrap()
    };
    let spec = SecretSpec::new("api", SecretValue::from("s3cr3t&=x"), Some("API_KEY"), vec![rule]).unwrap();
    let p = t.set(&a, vec![spec]).remove(0).placeholder;
    (t, a, p)
}

// covers: E11, E13
#[test]
fn sets_the_header_and_replaces_the_placeholder_only_where_named() {
    let (t, a, p) = table(LeakGuard::Block);
    let mut h = head(
        "api.example.test",
        "/v1?x=1",
        &[("authorization", &format!("Bearer {p}"))],
    );
    let out = t.rewrite(&a, Some("api.example.test"), &mut h);
    assert_eq!(
        out,
        InjectOutcome::Forward {
            injected: vec!["api".into()],
            leaked: vec![]
        }
    );
    assert_eq!(header(&h, "authorization"), [b"Bearer s3cr3t&=x".as_slice()]);
    assert_eq!(h.path_and_query, "/v1?x=1");
    // A rule that names further places replaces it there, and only there.
    let (t, a, p) = table_with(LeakGuard::Block, AlsoIn::new(&["api-key"], &["key"]).unwrap());
    let mut h = head(
        "api.example.test",
        &format!("/v1?key={p}&x=1"),
        &[("api-key", &p)],
    );
    let out = t.rewrite(&a, Some("api.example.test"), &mut h);
    assert!(matches!(out, InjectOutcome::Forward { .. }), "{out:?}");
    assert_eq!(header(&h, "api-key"), [b"s3cr3t&=x".as_slice()]);
    assert_eq!(h.path_and_query, "/v1?key=s3cr3t%26%3Dx&x=1");
}

// covers: E13
#[test]
fn a_placeholder_anywhere_else_on_a_rule_host_is_refused() {
    let (t, a, p) = table_with(LeakGuard::Log, AlsoIn::new(&["api-key"], &["key"]).unwrap());
    let upper = p.to_ascii_uppercase();
    let encoded: String = p.bytes().map(|b| format!("%{b:02x}")).collect();
    let cases: Vec<(String, Vec<(&str, String)>)> = vec![
        // Echoed headers: what made the upstream's error message return the key.
        ("/".into(), vec![("anthropic-beta", p.clone())]),
        ("/".into(), vec![("openai-organization", format!("org-{p}"))]),
        ("/".into(), vec![("cookie", format!("session={p}"))]),
        ("/".into(), vec![(p.as_str(), "1".into())]),
        (format!("/v1/{p}/x"), vec![]),
        (format!("/v1/{encoded}"), vec![]),
        (format!("/v1?other={p}"), vec![]),
        (format!("/v1?key=1;other={p}"), vec![]),
        (format!("/v1?{p}=1"), vec![]),
        // Named places, but not the placeholder as handed out: never replaced, so refused.
        (format!("/v1?key={upper}"), vec![]),
        (format!("/v1?key={encoded}"), vec![]),
        ("/".into(), vec![("api-key", upper)]),
    ];
    for (path, headers) in cases {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let mut h = head("api.example.test", &path, &headers);
        let out = t.rewrite(&a, Some("api.example.test"), &mut h);
        assert_eq!(
            out,
            InjectOutcome::Refuse {
                status: 403,
                reason: DenyReason::PlaceholderMisplaced,
                secret: Some("api".into())
            },
            "{path} {headers:?}"
        );
    }
}

// covers: E13
#[test]
fn plain_http_is_never_injected_and_placeholders_there_are_leaks() {
    let (t, a, p) = table(LeakGuard::Block);
    let mut h = head("api.example.test", "/", &[]);
    assert_eq!(
        t.rewrite(&a, None, &mut h),
        InjectOutcome::Forward {
            injected: vec![],
            leaked: vec![]
        }
    );
    assert!(header(&h, "authorization").is_empty());
    let mut h = head(
        "api.example.test",
        "/",
        &[("authorization", &format!("Bearer {p}"))],
    );
    assert!(matches!(
        t.rewrite(&a, None, &mut h),
        InjectOutcome::Refuse {
            status: 403,
            reason: DenyReason::PlaceholderLeak,
            ..
        }
    ));
}

#[test]
fn leak_guard_blocks_or_logs_placeholders_to_other_hosts() {
    let (t, a, p) = table(LeakGuard::Block);
    let mut h = head("echo.example.test", &format!("/?q={p}"), &[]);
    let out = t.rewrite(&a, Some("echo.example.test"), &mut h);
    assert_eq!(
        out,
        InjectOutcome::Refuse {
            status: 403,
            reason: DenyReason::PlaceholderLeak,
            secret: Some("api".into())
        }
    );
    let (t, a, p) = table(LeakGuard::Log);
    let mut h = head("echo.example.test", &format!("/?q={p}"), &[]);
    let out = t.rewrite(&a, Some("echo.example.test"), &mut h);
    assert_eq!(
        out,
        InjectOutcome::Forward {
            injected: vec![],
            leaked: vec!["api".into()]
        }
    );
    assert!(
        h.path_and_query.contains(&p),
        "a leaked placeholder is never replaced"
    );
}

#[test]
fn host_must_equal_sni() {
    let (t, a, _) = table(LeakGuard::Block);
    let mut h = head("other.example.test", "/", &[]);
    assert!(matches!(
        t.rewrite(&a, Some("api.example.test"), &mut h),
        InjectOutcome::Refuse {
            status: 421,
            reason: DenyReason::HostMismatch,
            secret: None
        }
    ));
    assert!(header(&h, "authorization").is_empty());
}

#[test]
fn another_agents_placeholder_is_not_replaced() {
    let (t, _, p) = table(LeakGuard::Block);
    let b = AgentId::new("b").unwrap();
    t.set(
        &b,
        vec![SecretSpec::preset("gh", Preset::GitHub, "ghp".into(), None).unwrap()],
    );
    let mut h = head("api.example.test", "/", &[("x-key", &p)]);
    let out = t.rewrite(&b, Some("api.example.test"), &mut h);
    assert_eq!(
        out,
        InjectOutcome::Forward {
            injected: vec![],
            leaked: vec![]
        }
    );
    assert_eq!(header(&h, "x-key"), [p.as_bytes()]);
    assert!(!t.intercepts(&b, "api.example.test"));
    assert!(t.intercepts(&b, "github.com"));
}

// covers: E15
#[test]
fn login_rules_replace_only_inside_their_header_and_paths() {
    let t = SecretTable::new(LeakGuard::Block);
    let a = AgentId::new("a").unwrap();
    let rule = SecretRule::login(&["chatgpt.com"], "Authorization", &["/backend-api/"]).unwrap();
    let spec = SecretSpec::new("login", "tok".into(), Some("TOKEN"), vec![rule]).unwrap();
    let p = t.set(&a, vec![spec]).remove(0).placeholder;
    let auth = format!("Bearer {p}");
    let mut h = head("chatgpt.com", "/backend-api/x", &[("authorization", &auth)]);
    let out = t.rewrite(&a, Some("chatgpt.com"), &mut h);
    assert_eq!(
        out,
        InjectOutcome::Forward {
            injected: vec!["login".into()],
            leaked: vec![]
        }
    );
    assert_eq!(header(&h, "authorization"), [b"Bearer tok".as_slice()]);
    let mut h = head(
        "chatgpt.com",
        "/backend-api/x",
        &[("authorization", &auth), ("x-copy", &p)],
    );
    assert!(
        matches!(
            t.rewrite(&a, Some("chatgpt.com"), &mut h),
            InjectOutcome::Refuse {
                reason: DenyReason::PlaceholderMisplaced,
                ..
            }
        ),
        "only the named header"
    );
    let mut h = head("chatgpt.com", "/backend-api/x", &[]);
    t.rewrite(&a, Some("chatgpt.com"), &mut h);
    assert!(header(&h, "authorization").is_empty(), "never added");
    let mut h = head("chatgpt.com", "/other", &[("authorization", &auth)]);
    t.rewrite(&a, Some("chatgpt.com"), &mut h);
    assert_eq!(
        header(&h, "authorization"),
        [auth.as_bytes()],
        "outside the paths"
    );
}

// covers: E15
#[test]
fn login_path_limits_hold_against_traversal_and_encodings() {
    let t = SecretTable::new(LeakGuard::Block);
    let a = AgentId::new("a").unwrap();
    let rule = SecretRule::login(&["chatgpt.com"], "authorization", &["/backend-api/"]).unwrap();
    let spec = SecretSpec::new("login", "tok".into(), None, vec![rule]).unwrap();
    let p = t.set(&a, vec![spec]).remove(0).placeholder;
    let auth = format!("Bearer {p}");
    for path in [
        "/backend-api/../../admin",
        "/backend-api/%2e%2e/admin",
        "/backend-api/%2E%2E/%2E%2E/admin",
        "/backend-api/..;/admin",
        "/backend-api//../admin",
        "/backend-api%2f..%2fadmin",
        "/backend-api/%252e%252e/admin",
        "/backend-api\\..\\admin",
        "/backend-api/./../admin?x=1",
    ] {
        let mut h = head("chatgpt.com", path, &[("authorization", &auth)]);
        let out = t.rewrite(&a, Some("chatgpt.com"), &mut h);
        assert_eq!(
            out,
            InjectOutcome::Refuse {
                status: 403,
                reason: DenyReason::AmbiguousPath,
                secret: Some("login".into())
            },
            "{path}"
        );
        assert!(
            !String::from_utf8_lossy(&h.headers[0].1).contains("tok"),
            "{path}"
        );
    }
    // Outside the prefix in normal form: forwarded with the placeholder, never the token.
    let mut h = head("chatgpt.com", "/backend-apix/admin", &[("authorization", &auth)]);
    t.rewrite(&a, Some("chatgpt.com"), &mut h);
    assert_eq!(header(&h, "authorization"), [auth.as_bytes()]);
    // A path in normal form under the prefix gets it, query and all.
    let mut h = head(
        "chatgpt.com",
        "/backend-api/me?a=%2F",
        &[("authorization", &auth)],
    );
    t.rewrite(&a, Some("chatgpt.com"), &mut h);
    assert_eq!(header(&h, "authorization"), [b"Bearer tok".as_slice()]);
}

// covers: E19
#[test]
fn the_redactor_covers_every_secret_and_rendered_value_and_follows_refreshes() {
    let (t, a, p) = table(LeakGuard::Block);
    let r = t.redactor(&a).unwrap();
    assert_eq!(
        r.redact(b"got s3cr3t&=x").unwrap(),
        format!("got {p}").into_bytes()
    );
    assert_eq!(
        r.redact(b"got Bearer s3cr3t&=x!").unwrap(),
        format!("got {p}!").into_bytes()
    );
    assert_eq!(
        r.redact(b"q=s3cr3t%26%3Dx").unwrap(),
        format!("q={p}").into_bytes()
    );
    assert!(t.update_value(&a, "api", &"n3w-v4lue-123".into()));
    let r = t.redactor(&a).unwrap();
    assert_eq!(r.redact(b"n3w-v4lue-123").unwrap(), p.as_bytes());
    assert_eq!(
        r.redact(b"s3cr3t&=x").unwrap(),
        p.as_bytes(),
        "the retired value too"
    );
    let mut s = r.stream();
    assert_eq!(s.push(b"hello"), Redacted::Unchanged);
    assert!(t.redactor(&AgentId::new("nobody").unwrap()).is_none());
}

// covers: E15
#[test]
fn token_refresh_keeps_real_tokens_on_the_gateway() {
    let updates = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&updates);
    let t = SecretTable::new(LeakGuard::Block).with_on_update(Box::new(move |_, name, value| {
        seen.lock()
            .unwrap()
            .push((name.to_owned(), value.expose().to_vec()));
    }));
    let a = AgentId::new("a").unwrap();
    let access_rule = SecretRule::login(&["chatgpt.com"], "authorization", &["/backend-api/"]).unwrap();
    let refresh_rule = SecretRule::token_refresh(&["auth.openai.com"], "/oauth/token", "access").unwrap();
    let ph = t.set(
        &a,
        vec![
            SecretSpec::new("access", "at-1".into(), Some("ACCESS"), vec![access_rule]).unwrap(),
            SecretSpec::new("refresh", "rt-1".into(), Some("REFRESH"), vec![refresh_rule]).unwrap(),
        ],
    );
    let (access_ph, refresh_ph) = (ph[0].placeholder.clone(), ph[1].placeholder.clone());
    let mut h = head("auth.openai.com", "/oauth/token", &[]);
    h.method = "POST".into();
    assert_eq!(
        t.rewrite(&a, Some("auth.openai.com"), &mut h),
        InjectOutcome::Refresh {
            secret: "refresh".into()
        }
    );
    let body = format!(r#"{{"grant_type":"refresh_token","refresh_token":"{refresh_ph}"}}"#);
    let up = t
        .refresh_request(&a, "refresh", "application/json", body.as_bytes())
        .unwrap();
    assert_eq!(
        &up[..],
        br#"{"grant_type":"refresh_token","refresh_token":"rt-1"}"#
    );
    assert!(
        t.refresh_request(&a, "refresh", "application/json", b"{}")
            .is_none()
    );
    let answer = br#"{"access_token":"at-2","refresh_token":"rt-2","id_token":"id","expires_in":3600}"#;
    let out: serde_json::Value =
        serde_json::from_slice(&t.refresh_response(&a, "refresh", answer).unwrap()).unwrap();
    assert_eq!(out["access_token"], access_ph.as_str());
    assert_eq!(out["refresh_token"], refresh_ph.as_str());
    assert_eq!(out["id_token"], "id");
    let seen = updates.lock().unwrap().clone();
    assert!(
        seen.contains(&("access".into(), b"at-2".to_vec()))
            && seen.contains(&("refresh".into(), b"rt-2".to_vec()))
    );
    let mut h = head(
        "chatgpt.com",
        "/backend-api/me",
        &[("authorization", &format!("Bearer {access_ph}"))],
    );
    t.rewrite(&a, Some("chatgpt.com"), &mut h);
    assert_eq!(header(&h, "authorization"), [b"Bearer at-2".as_slice()]);
    let up = t.refresh_request(
        &a,
        "refresh",
        "application/x-www-form-urlencoded",
        format!("refresh_token={refresh_ph}").as_bytes(),
    );
    assert_eq!(&up.unwrap()[..], b"refresh_token=rt-2");
    // A refused refresh that quotes the token it refused gives the sandbox the placeholder instead.
    let refused = br#"{"error":"invalid_grant","error_description":"token rt-2 was revoked"}"#;
    let answer = String::from_utf8(t.refresh_error(&a, "refresh", refused)).unwrap();
    assert!(
        !answer.contains("rt-2") && answer.contains(&refresh_ph),
        "{answer}"
    );
}

// covers: E15
#[test]
fn a_refresh_group_renews_every_member_and_shares_one_key() {
    let updates = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&updates);
    let t = SecretTable::new(LeakGuard::Block).with_on_update(Box::new(move |agent, name, value| {
        seen.lock()
            .unwrap()
            .push((agent.to_string(), name.to_owned(), value.expose().to_vec()));
    }));
    let (a, b, c) = (
        AgentId::new("a").unwrap(),
        AgentId::new("b").unwrap(),
        AgentId::new("c").unwrap(),
    );
    let specs = || {
        vec![
            SecretSpec::new(
                "access",
                "at-1".into(),
                None,
                vec![SecretRule::login(&["api.anthropic.com"], "authorization", &["/v1/"]).unwrap()],
            )
            .unwrap(),
            SecretSpec::new(
                "refresh",
                "rt-1".into(),
                None,
                vec![
                    SecretRule::token_refresh(&["platform.claude.com"], "/v1/oauth/token", "access").unwrap(),
                ],
            )
            .unwrap(),
        ]
    };
    for agent in [&a, &b, &c] {
        t.set(agent, specs());
    }
    t.set_refresh_group(&a, "refresh", Some("login-1".into()));
    t.set_refresh_group(&b, "refresh", Some("login-1".into()));
    assert_eq!(t.refresh_group(&a, "refresh"), t.refresh_group(&b, "refresh"));
    assert_ne!(t.refresh_group(&a, "refresh"), t.refresh_group(&c, "refresh"));
    let answer = br#"{"access_token":"at-2","refresh_token":"rt-2"}"#;
    assert!(t.refresh_response(&a, "refresh", answer).is_some());
    // b's next refresh goes up with the rotated token; c (another login) keeps its own.
    let b_ph = t.placeholders(&b)[1].placeholder.clone();
    let up = t
        .refresh_request(&b, "refresh", "application/json", b_ph.as_bytes())
        .unwrap();
    assert_eq!(&up[..], b"rt-2");
    let c_ph = t.placeholders(&c)[1].placeholder.clone();
    let up = t
        .refresh_request(&c, "refresh", "application/json", c_ph.as_bytes())
        .unwrap();
    assert_eq!(&up[..], b"rt-1");
    let seen = updates.lock().unwrap().clone();
    for want in [
        ("a", "access", "at-2"),
        ("b", "access", "at-2"),
        ("b", "refresh", "rt-2"),
    ] {
        assert!(
            seen.contains(&(want.0.into(), want.1.into(), want.2.as_bytes().to_vec())),
            "{want:?}: {seen:?}"
        );
    }
    assert!(!seen.iter().any(|(agent, _, _)| agent == "c"));
    t.set_refresh_group(&b, "refresh", None);
    assert_ne!(t.refresh_group(&a, "refresh"), t.refresh_group(&b, "refresh"));
}

#[test]
fn placeholders_survive_a_reset_and_values_update() {
    let (t, a, p) = table(LeakGuard::Block);
    let spec = SecretSpec::preset("api", Preset::OpenAi, "v2".into(), None).unwrap();
    assert_eq!(t.set(&a, vec![spec])[0].placeholder, p);
    assert!(t.update_value(&a, "api", &"v3".into()));
    let mut h = head("api.openai.com", "/", &[]);
    t.rewrite(&a, Some("api.openai.com"), &mut h);
    assert_eq!(header(&h, "authorization"), [b"Bearer v3".as_slice()]);
    assert!(!t.update_value(&a, "nope", &"x".into()));
}

#[test]
fn secret_values_must_be_header_safe() {
    let r = Preset::OpenAi.rules();
    assert!(SecretSpec::new("n", "a\r\nx-evil: 1".into(), None, r.clone()).is_err());
    assert!(SecretSpec::new("n", "a\0b".into(), None, r).is_err());
    assert!(SecretRule::header(&["h.test"], "x", "{{.Value}}\\n").is_ok());
    assert!(SecretRule::header(&["h.test"], "x", "{{print .Value \"\\n\"}}").is_err());
}
