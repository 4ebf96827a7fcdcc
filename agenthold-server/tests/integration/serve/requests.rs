//! The request log through the API (E16): a page of allowed and denied entries after traffic from inside a
//! real sandbox, filters and cursors; its live tail (SSE) resumed without loss or duplicates, refusing
//! resume ids of other streams or from the future, and ending when the agent is deleted; and the
//! suggestions of E8, whose approval lets the next request through.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use super::world::{API, OTHER, Sse, World};

/// Every field of E16, as the runtime writes them.
const FIELDS: [&str; 16] = [
    "seq",
    "time",
    "agent",
    "kind",
    "host",
    "port",
    "method",
    "path",
    "status",
    "decision",
    "reason",
    "secret_injected",
    "secret",
    "bytes_up",
    "bytes_down",
    "phase",
];

fn items(body: &Value) -> Vec<Value> {
    body["items"].as_array().cloned().unwrap_or_default()
}

fn seqs(entries: &[Value]) -> Vec<u64> {
    entries.iter().map(|e| e["seq"].as_u64().unwrap()).collect()
}

// covers: E16, E9, S5
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn request_log_lists_filters_and_pages() {
    let world = World::start();
    let s = &world.server;
    let agent = world.agent("a", &json!({"mode": "allowlist", "entries": [API]}));
    let log = world.path(&format!("/agents/{agent}/requests"));
    assert_eq!(world.curl(&agent, API, "/logged"), 200);
    assert_eq!(
        world.curl(&agent, OTHER, "/refused"),
        0,
        "an unlisted name does not resolve (E9)"
    );

    let page = s.call("GET", &log, &world.alice, None);
    assert_eq!(page.status, 200, "{:?}", page.body);
    let all = items(&page.body);
    let seq = seqs(&all);
    assert!(seq.windows(2).all(|w| w[0] > w[1]), "newest first: {seq:?}");
    for e in &all {
        for field in FIELDS {
            assert!(e.get(field).is_some(), "{field} missing in {e}");
        }
        assert_eq!(e["agent"], agent.as_str());
    }
    let allowed = all
        .iter()
        .find(|e| e["host"] == API && e["decision"] == "allowed" && e["kind"] != "dns")
        .unwrap_or_else(|| panic!("no allowed connection to {API}: {all:?}"));
    assert_eq!(allowed["port"], 443);
    let denied = all
        .iter()
        .find(|e| e["host"] == OTHER && e["decision"] == "denied")
        .unwrap_or_else(|| panic!("no denied entry for {OTHER}: {all:?}"));
    // Through the explicit proxy (HTTPS_PROXY is set in the sandbox) or a DNS query (E9).
    assert!(denied["kind"] == "connect" || denied["kind"] == "dns", "{denied}");
    assert_eq!(denied["reason"], "not_in_allowlist");

    // Filters.
    let only = |query: &str| items(&s.call("GET", &format!("{log}?{query}"), &world.alice, None).body);
    assert!(only("verdict=denied").iter().all(|e| e["decision"] == "denied"));
    assert!(!only("verdict=denied").is_empty());
    assert!(only("verdict=allowed").iter().all(|e| e["decision"] == "allowed"));
    assert!(
        only(&format!("host={}", OTHER.to_uppercase()))
            .iter()
            .all(|e| e["host"] == OTHER)
    );
    assert!(!only(&format!("host={OTHER}")).is_empty());
    assert!(only("kind=tls").iter().all(|e| e["kind"] == "tls"));
    assert!(!only("kind=tls").is_empty() || !only("kind=connect").is_empty());

    // Pages of one: every entry once, in order, then no cursor.
    let mut walked = Vec::new();
    let mut cursor = String::new();
    for _ in 0..=all.len() {
        let page = s.call(
            "GET",
            &format!("{log}?limit=1&cursor={cursor}"),
            &world.alice,
            None,
        );
        walked.extend(seqs(&items(&page.body)));
        match page.body["next_cursor"].as_str() {
            Some(c) => cursor = c.to_owned(),
            None => break,
        }
    }
    assert_eq!(walked, seq[..walked.len()].to_vec());
    assert!(walked.len() >= seq.len(), "{walked:?} vs {seq:?}");

    // Bad queries are 400s; a member without a grant, or a non-member, sees nothing.
    for query in [
        "verdict=maybe",
        "limit=0",
        "limit=501",
        "kind=ftp",
        "cursor=abc",
        "unknown=1",
        "limit=x",
    ] {
        let r = s.call("GET", &format!("{log}?{query}"), &world.alice, None);
        assert_eq!(r.status, 400, "{query}: {:?}", r.body);
    }
    let (_, bob) = world.member("bob", "member");
    assert_eq!(s.call("GET", &log, &bob, None).status, 404);
    let huge = "a".repeat(5000);
    assert_eq!(
        s.call(
            "GET",
            &world.path(&format!("/agents/{huge}/requests")),
            &world.alice,
            None
        )
        .status,
        404
    );
}

/// Read `agent`'s stream into `got` until the entry of the request for `path`; that event's id.
fn take(tail: &mut Sse, agent: &str, got: &mut Vec<u64>, path: &str) -> String {
    loop {
        let e = tail
            .next(Duration::from_secs(15))
            .unwrap_or_else(|| panic!("no event for {path} within 15 s"));
        assert_eq!(e.event, "request", "{e:?}");
        assert_eq!(e.data["type"], "request");
        assert_eq!(e.data["agent"], agent, "only this agent's entries");
        let n = e.data["seq"].as_u64().unwrap();
        assert_eq!(e.id, format!("{agent}.{n}"));
        got.push(n);
        if e.data["path"] == path {
            return e.id;
        }
    }
}

// covers: E16
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn live_tail_resumes_without_loss_or_duplicates() {
    let mut world = World::start();
    let s = &world.server;
    let agent = world.agent("a", &json!({"mode": "allowlist", "entries": [API]}));
    let other = world.agent("b", &json!({"mode": "allowlist", "entries": [API]}));
    let stream = world.path(&format!("/agents/{agent}/requests/stream"));
    let log = world.path(&format!("/agents/{agent}/requests"));
    assert_eq!(world.curl_http(&agent, API, "/before"), 200);

    // From the start: what is held, then live entries.
    let mut tail = Sse::open(s, &stream, &world.alice, &[]);
    assert_eq!(tail.status, 200);
    let mut got: Vec<u64> = Vec::new();
    take(&mut tail, &agent, &mut got, "/before");
    assert_eq!(world.curl_http(&other, API, "/other-agent"), 200);
    assert_eq!(world.curl_http(&agent, API, "/live"), 200);
    let last_id = take(&mut tail, &agent, &mut got, "/live");
    drop(tail);

    // While away: more traffic. Resume: exactly what came after, once each.
    assert_eq!(world.curl_http(&agent, API, "/away-1"), 200);
    assert_eq!(world.curl_http(&agent, API, "/away-2"), 200);
    let mut tail = Sse::open(s, &stream, &world.alice, &[("Last-Event-ID", &last_id)]);
    assert_eq!(tail.status, 200);
    take(&mut tail, &agent, &mut got, "/away-2");
    assert_eq!(world.curl_http(&agent, API, "/after-resume"), 200);
    take(&mut tail, &agent, &mut got, "/after-resume");
    let unique: BTreeSet<u64> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "no duplicates: {got:?}");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "in order: {got:?}");
    let mut held = seqs(&items(
        &s.call("GET", &format!("{log}?limit=500"), &world.alice, None)
            .body,
    ));
    held.reverse();
    let upto = *got.last().unwrap();
    held.retain(|n| *n <= upto);
    assert_eq!(got, held, "no loss: the stream has every entry the log has");

    // Refused resume points: another stream's id, a malformed one, one from the future.
    let bad = [
        format!("{other}.{}", got[0]),
        "garbage".to_owned(),
        format!("{agent}.{}", upto + 1_000_000),
    ];
    for id in &bad {
        let r = Sse::open(s, &stream, &world.alice, &[("Last-Event-ID", id.as_str())]);
        assert_eq!(r.status, 400, "{id}");
        let body = r.body();
        assert!(body.contains("\"status\":400"), "a problem+json body: {body}");
    }
    let r = Sse::open(
        s,
        &format!("{stream}?after={agent}.{}", upto + 1_000_000),
        &world.alice,
        &[],
    );
    assert_eq!(r.status, 400);

    // Deleting the agent ends the stream with `end`.
    let r = s.call(
        "DELETE",
        &world.path(&format!("/agents/{agent}")),
        &world.alice,
        None,
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let end = tail.next(Duration::from_secs(15)).expect("an end event");
    assert_eq!(end.event, "end", "{end:?}");
    assert_eq!(end.data["type"], "end");
    assert!(tail.next(Duration::from_secs(5)).is_none(), "nothing after end");

    // Stopping the server ends a stream with `end` too.
    let stream = world.path(&format!("/agents/{other}/requests/stream"));
    let mut tail = Sse::open(&world.server, &stream, &world.alice, &[]);
    assert_eq!(tail.status, 200);
    take(&mut tail, &other, &mut Vec::new(), "/other-agent");
    assert_eq!(world.server.stop(), Some(0));
    let end = tail.next(Duration::from_secs(15)).expect("an end event");
    assert_eq!(
        (end.event.as_str(), &end.data["reason"]),
        ("end", &json!("server shutting down"))
    );
}

// covers: E8, E16, S5, P4
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn suggestions_show_denials_and_approval_allows_at_once() {
    let world = World::start();
    let s = &world.server;
    let agent = world.agent("a", &json!({"mode": "allowlist", "entries": [API]}));
    let (bob_id, bob) = world.member("bob", "member");
    let grant = s.call(
        "PUT",
        &world.path(&format!("/agents/{agent}/grants/{bob_id}")),
        &world.alice,
        Some(&json!({"role": "viewer"})),
    );
    assert_eq!(grant.status, 201, "{:?}", grant.body);
    assert_eq!(world.curl(&agent, OTHER, "/first"), 0);
    assert_eq!(world.curl(&agent, OTHER, "/second"), 0);

    let list = world.path(&format!("/agents/{agent}/network-policy/suggestions"));
    let approve = format!("{list}/approve");
    let r = s.call("GET", &list, &bob, None);
    assert_eq!(r.status, 200, "a viewer sees suggestions: {:?}", r.body);
    let found = items(&r.body);
    let other = found
        .iter()
        .find(|g| g["host"] == OTHER)
        .unwrap_or_else(|| panic!("{OTHER} suggested: {found:?}"));
    // Refused at CONNECT (port 443) or at DNS (no port): either way the entry is the bare host.
    assert!(other["port"] == 443 || other["port"] == Value::Null, "{other}");
    assert_eq!(other["entry"], OTHER);
    assert!(other["count"].as_u64().unwrap() >= 2, "{other}");
    assert!(other["last_time"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert!(
        found.iter().all(|g| g["host"] != API),
        "allowed hosts are no suggestion"
    );

    // A viewer may not approve; bad bodies are refused and change nothing.
    let policy = world.path(&format!("/agents/{agent}/network-policy"));
    let before = s.call("GET", &policy, &world.alice, None).body;
    assert_eq!(
        s.call("POST", &approve, &bob, Some(&json!({"host": OTHER})))
            .status,
        403
    );
    for (body, status) in [
        (json!({"host": OTHER, "extra": 1}), 422),
        (json!({"host": OTHER, "port": "443"}), 422),
        (json!({"host": OTHER, "port": 70000}), 422),
        (json!({"host": OTHER, "port": 0}), 400),
        (json!({"host": ""}), 400),
        (json!({"host": "bad host!"}), 400),
        (json!({"host": "x".repeat(10_000)}), 400),
        (json!({"port": 443}), 422),
    ] {
        let r = s.call("POST", &approve, &world.alice, Some(&body));
        assert_eq!(r.status, status, "{body}: {:?}", r.body);
    }
    assert_eq!(
        s.call("GET", &policy, &world.alice, None).body,
        before,
        "nothing changed"
    );

    // Approve: the entry is in the policy, the next request goes through, the suggestion is gone.
    let r = s.call(
        "POST",
        &approve,
        &world.alice,
        Some(&json!({"host": OTHER, "port": null})),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["entries"], json!([API, OTHER]));
    assert_eq!(world.curl(&agent, OTHER, "/approved"), 200, "allowed at once");
    assert!(world.upstream("/approved").is_some());
    let r = s.call("GET", &list, &world.alice, None);
    assert!(items(&r.body).iter().all(|g| g["host"] != OTHER), "{:?}", r.body);
    // Approving again changes nothing.
    let r = s.call("POST", &approve, &world.alice, Some(&json!({"host": OTHER})));
    assert_eq!(r.body["entries"], json!([API, OTHER]));
    let audit = s.call("GET", &world.path("/audit"), &world.alice, None);
    assert!(
        audit.body.to_string().contains("suggestions/approve"),
        "audited: {:?}",
        audit.body
    );

    // An open policy has nothing to approve.
    let open = world.agent("open", &json!({"mode": "open"}));
    let r = s.call(
        "POST",
        &world.path(&format!("/agents/{open}/network-policy/suggestions/approve")),
        &world.alice,
        Some(&json!({"host": OTHER})),
    );
    assert_eq!(r.status, 409, "{:?}", r.body);
}

/// CPU seconds `pid` has used (user and system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    #[allow(clippy::cast_precision_loss)]
    let seconds = ticks as f64 / 100.0;
    seconds
}

// covers: E16, E20
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn a_thousand_subscribers_on_one_agent_stay_cheap() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    // Two sockets per subscriber in this process and the server it starts (which inherits the limit).
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some_and(|c| c < 4096) {
        let raised = limit.maximum.map_or(8192, |m| m.min(8192));
        setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(raised),
                maximum: limit.maximum,
            },
        )
        .unwrap();
    }
    let world = World::start_with("auth:\n  rate_per_user: 0\n  rate_per_token: 0\n");
    let s = &world.server;
    let agent = world.agent("a", &json!({"mode": "allowlist", "entries": [API]}));
    let stream = world.path(&format!("/agents/{agent}/requests/stream"));
    let mut tails: Vec<Sse> = (0..1000)
        .map(|_| Sse::open(s, &stream, &world.alice, &[]))
        .collect();
    assert!(tails.iter().all(|t| t.status == 200));

    // Idle subscribers cost nothing: no polling.
    let pid = s.pid().unwrap();
    let before = cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(3));
    let idle = cpu_seconds(pid) - before;
    assert!(idle < 0.5, "1000 idle subscribers used {idle:.2} s of CPU in 3 s");

    // One request reaches every subscriber.
    let started = std::time::Instant::now();
    assert_eq!(world.curl_http(&agent, API, "/fan-out"), 200);
    for (i, tail) in tails.iter_mut().enumerate() {
        loop {
            let e = tail
                .next(Duration::from_secs(30))
                .unwrap_or_else(|| panic!("subscriber {i} got nothing"));
            if e.data["path"] == "/fan-out" {
                break;
            }
        }
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(20),
        "fan-out to 1000 took {elapsed:?}"
    );
    eprintln!("fan-out of one request to 1000 subscribers: {elapsed:?}; idle CPU {idle:.2} s in 3 s");
    assert_eq!(
        s.call(
            "GET",
            &world.path(&format!("/agents/{agent}")),
            &world.alice,
            None
        )
        .status,
        200
    );
}
