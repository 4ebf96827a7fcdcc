//! `kill -9` during a burst of writes: every write the server acknowledged (2xx) before it died is there
//! after a restart on the same data directory (workspaces, members, tokens made from a session, the agent's
//! network policy), the credentials made before still work, and the agent's sandbox has its egress back under
//! its policy (S12): an allowed name answers from inside the sandbox, a name outside the policy does not.

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agenthold_testsupport::{EchoServer, TestDns};
use serde_json::{Value, json};

use super::client::{self, Answer};
use super::support::{Auth, TestServer};

/// Allowed for the agent, mapped to the loopback HTTP echo server.
const API: &str = "api.example.test";
/// Known to the test's DNS, never allowed: the gateway must refuse it.
const DENIED: &str = "denied.example.test";
/// Members the member-writer can add (one each, so every acknowledged role is the last one).
const MEMBERS: usize = 40;

/// A random number from the standard library's per-process hasher keys.
fn random() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(Instant::now())
}

/// `curl` inside the agent's sandbox: the HTTP status it printed (`000` when it got none).
fn curl_inside(agent: &str, url: &str) -> String {
    let out = Command::new("docker")
        .args(["exec", &format!("agenthold-{agent}"), "curl", "-sS", "-m", "10"])
        .args(["-o", "/dev/null", "-w", "%{http_code}", url])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Poll (up to 60 s) until an allowed request from inside the sandbox reaches the upstream.
fn egress_works(agent: &str, upstream: &EchoServer, probe: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = curl_inside(agent, &format!("http://{API}{probe}"));
        if status == "200" && upstream.requests().iter().any(|r| r.path == probe) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no egress from the sandbox: curl said {status:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What one writer thread got acknowledged, and what it had in flight when the server died.
#[derive(Debug, Default)]
struct Acked {
    workspaces: Vec<String>,
    members: BTreeMap<String, String>,
    tokens: Vec<String>,
    /// Policies the server acknowledged, in order.
    policies: Vec<Value>,
    /// A policy sent without an answer (it may or may not have been applied).
    in_flight_policy: Option<Value>,
}

/// Keep writing one kind of thing until the server stops answering.
fn writer(base: &str, kind: usize, ctx: &Context) -> Acked {
    let mut acked = Acked::default();
    for i in 0.. {
        if ctx.stop.load(Ordering::Relaxed) {
            break;
        }
        let (method, path, auth, body) = match kind {
            0 => (
                "POST",
                "/api/v1/workspaces".to_owned(),
                &ctx.token,
                json!({"name": format!("w{i}")}),
            ),
            1 => {
                let Some(user) = ctx.users.get(i) else { break };
                let role = if i % 2 == 0 { "member" } else { "admin" };
                let path = format!("/api/v1/workspaces/{}/members/{user}", ctx.ws);
                ("PUT", path, &ctx.token, json!({ "role": role }))
            }
            2 => (
                "POST",
                "/api/v1/me/tokens".to_owned(),
                &ctx.session,
                json!({"name": format!("t{i}")}),
            ),
            _ => {
                let path = format!(
                    "/api/v1/workspaces/{}/agents/{}/network-policy",
                    ctx.ws, ctx.agent
                );
                let entries = json!([API, format!("n{i}.example.test")]);
                (
                    "PUT",
                    path,
                    &ctx.token,
                    json!({"mode": "allowlist", "entries": entries}),
                )
            }
        };
        if kind == 3 {
            acked.in_flight_policy = Some(body["entries"].clone());
        }
        let answer: Answer = match client::request(base, method, &path, auth, Some(&body), &[]) {
            Ok(a) => a,
            Err(_) => break,
        };
        assert!(
            (200..300).contains(&answer.status),
            "{method} {path}: {} {:?}",
            answer.status,
            answer.body
        );
        match kind {
            0 => acked
                .workspaces
                .push(answer.body["id"].as_str().unwrap().to_owned()),
            1 => {
                acked.members.insert(
                    answer.body["user"].as_str().unwrap().to_owned(),
                    body["role"].as_str().unwrap().to_owned(),
                );
            }
            2 => acked
                .tokens
                .push(answer.body["token"].as_str().unwrap().to_owned()),
            _ => {
                acked.policies.push(answer.body["entries"].clone());
                acked.in_flight_policy = None;
            }
        }
        ctx.acks[kind].fetch_add(1, Ordering::Relaxed);
    }
    acked
}

/// What the writers share.
struct Context {
    token: Auth,
    session: Auth,
    ws: String,
    agent: String,
    users: Vec<String>,
    acks: [AtomicUsize; 4],
    stop: AtomicBool,
}

// covers: S12, S7, E8
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn writes_acknowledged_before_kill_9_survive_it() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let denied_addr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7));
    let (http, dns) = rt.block_on(async {
        (
            EchoServer::http().await,
            TestDns::start([(DENIED, vec![denied_addr])], 60).await,
        )
    });
    let config = format!(
        "auth:\n  rate_per_user: 0\n  rate_per_token: 0\n  rate_unauthenticated: 0\negress:\n  dns_upstream: {}\n{}",
        dns.addr(),
        client::own_pool(4)
    );
    let connect = format!("{API}:80={}", http.addr());
    let mut server = TestServer::start_with(&config, &["--dangerous-connect-to", &connect]);
    let (user, token) = server.user("durable");
    let token = Auth::Token(token);
    let session = Auth::Session(server.session(&user));
    let call = |s: &TestServer, method: &str, path: &str, auth: &Auth, body: Option<&Value>| {
        client::call(&s.base, method, path, auth, body, &[])
    };
    let ws = call(
        &server,
        "POST",
        "/api/v1/workspaces",
        &token,
        Some(&json!({"name": "home"})),
    );
    assert_eq!(ws.status, 201, "{ws:?}");
    let ws = ws.body["id"].as_str().unwrap().to_owned();
    let policy = json!({"mode": "allowlist", "entries": [API]});
    let agents = format!("/api/v1/workspaces/{ws}/agents");
    let agent = call(
        &server,
        "POST",
        &agents,
        &token,
        Some(&json!({"name": "a", "policy": policy})),
    );
    assert_eq!(agent.status, 201, "{agent:?}");
    let agent = agent.body["id"].as_str().unwrap().to_owned();
    egress_works(&agent, &http, "/before-the-kill");
    let users = (0..MEMBERS)
        .map(|i| server.admin(&["user", "create", "--name", &format!("m{i}")]))
        .collect();

    // The burst: four writers, killed at a random moment once each has had a few writes acknowledged.
    let ctx = Arc::new(Context {
        token: token.clone(),
        session: session.clone(),
        ws: ws.clone(),
        agent: agent.clone(),
        users,
        acks: Default::default(),
        stop: AtomicBool::new(false),
    });
    let writers: Vec<_> = (0..4)
        .map(|kind| {
            let (base, ctx) = (server.base.clone(), Arc::clone(&ctx));
            std::thread::spawn(move || writer(&base, kind, &ctx))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ctx.acks.iter().any(|a| a.load(Ordering::Relaxed) < 3) {
        assert!(
            Instant::now() < deadline,
            "the writers got too few answers: {:?}",
            ctx.acks
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(random() % 800));
    server.kill9();
    ctx.stop.store(true, Ordering::Relaxed);
    let acked: Vec<Acked> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let counts: Vec<usize> = ctx.acks.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    println!("crash: acknowledged before kill -9 (workspaces, members, tokens, policies): {counts:?}");

    server.spawn();
    for ws in &acked[0].workspaces {
        let answer = call(&server, "GET", &format!("/api/v1/workspaces/{ws}"), &token, None);
        assert_eq!(
            answer.status, 200,
            "acknowledged workspace {ws} is gone: {answer:?}"
        );
    }
    let members = call(
        &server,
        "GET",
        &format!("/api/v1/workspaces/{ws}/members"),
        &token,
        None,
    )
    .body;
    for (user, role) in &acked[1].members {
        let found = members["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["user"] == user.as_str());
        assert_eq!(
            found.map(|m| &m["role"]),
            Some(&json!(role)),
            "acknowledged member {user} as {role}: {members}"
        );
    }
    for made in &acked[2].tokens {
        let answer = call(&server, "GET", "/api/v1/me", &Auth::Token(made.clone()), None);
        assert_eq!(answer.status, 200, "acknowledged token: {answer:?}");
    }
    let policy_path = format!("{agents}/{agent}/network-policy");
    let entries = call(&server, "GET", &policy_path, &token, None).body["entries"].clone();
    let last = acked[3].policies.last().unwrap();
    assert!(
        entries == *last || Some(&entries) == acked[3].in_flight_policy.as_ref(),
        "the policy after restart {entries} is neither the last acknowledged {last} nor the one in flight {:?}",
        acked[3].in_flight_policy
    );
    for auth in [&token, &session] {
        let answer = call(&server, "GET", "/api/v1/me", auth, None);
        assert_eq!(
            answer.status, 200,
            "a credential made before the kill: {answer:?}"
        );
    }

    // The sandbox still has egress, under its policy: the allowed name answers, the other one does not.
    egress_works(&agent, &http, "/after-the-restart");
    let status = curl_inside(&agent, &format!("http://{DENIED}/never"));
    assert_ne!(
        status, "200",
        "a name outside the policy answered after the restart"
    );
    let asked = dns
        .queries()
        .iter()
        .filter(|q| q.name.trim_end_matches('.') == DENIED)
        .count();
    assert_eq!(asked, 0, "the gateway resolved a name outside the policy");
    let shown = call(&server, "GET", &format!("{agents}/{agent}"), &token, None);
    assert_eq!(shown.body["state"], "running", "{shown:?}");
}
