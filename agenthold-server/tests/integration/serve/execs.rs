//! Execs as server-side objects against a real server and sandbox: the contract call, exact bytes through
//! base64, SSE streams with disconnect and reattach, detach, cancel of a whole process group, timeouts, a
//! server killed while an exec runs (S12), and the refusals of bad requests (S9).

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use super::fixture::{Fixture, stdout_of};
use super::support::Auth;

// covers: P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn the_contract_call_answers_text_and_exact_bytes() {
    let f = Fixture::new();
    let r = f.exec(&json!({"argv": ["sh", "-c", "echo hi"]}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.content_type, "application/json");
    assert_eq!(r.body["stdout"], "hi\n");
    assert_eq!(r.body["exit_code"], 0);
    assert_eq!(r.body["stdout_b64"], "aGkK");
    assert_eq!(r.body["state"], "exited");
    let id = r.body["id"].as_str().unwrap().to_owned();

    // Bytes that are not UTF-8: replaced in the text, exact in base64; stderr and the exit code too.
    let r = f.exec(&json!({
        "argv": ["sh", "-c", "printf '\\377\\000a\\342\\202\\254'; printf err >&2; exit 3"],
        "env": {"X": "1"}, "cwd": "/tmp", "timeout": 60
    }));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let bytes = STANDARD.decode(r.body["stdout_b64"].as_str().unwrap()).unwrap();
    assert_eq!(bytes, b"\xff\x00a\xe2\x82\xac");
    assert_eq!(r.body["stdout"], "\u{fffd}\u{0}a€");
    assert_eq!(r.body["stderr"], "err");
    assert_eq!(r.body["exit_code"], 3);

    // Environment, working directory and standard input (text and base64).
    let r = f.exec(
        &json!({"argv": ["sh", "-c", "echo $X $(pwd); cat"], "env": {"X": "v"}, "cwd": "/tmp",
        "stdin": "from stdin"}),
    );
    assert_eq!(r.body["stdout"], "v /tmp\nfrom stdin", "{:?}", r.body);
    let r = f.exec(&json!({"argv": ["cat"], "stdin_b64": STANDARD.encode([0u8, 1, 2, 255])}));
    assert_eq!(r.body["stdout_b64"], STANDARD.encode([0u8, 1, 2, 255]));

    // The exec is kept: get, list (newest first), and its events replay.
    let got = f
        .server
        .call("GET", &f.path(&format!("/execs/{id}")), &f.auth, None);
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(got.body["state"], "exited");
    assert_eq!(got.body["argv"], json!(["sh", "-c", "echo hi"]));
    assert_eq!(got.body["truncated"], false);
    assert!(got.body["ended_at"].is_string());
    let list = f.server.call("GET", &f.path("/execs?limit=2"), &f.auth, None);
    assert_eq!(list.status, 200, "{:?}", list.body);
    let items = list.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["argv"], json!(["cat"]));
    let cursor = list.body["next_cursor"].as_str().unwrap();
    let page = f
        .server
        .call("GET", &f.path(&format!("/execs?cursor={cursor}")), &f.auth, None);
    let rest: Vec<_> = page.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].clone())
        .collect();
    assert_eq!(rest.len(), 2);
    assert_eq!(rest.last().unwrap(), &json!(id));
    let mut replay = f.sse("GET", &f.path(&format!("/execs/{id}/events")), None, None);
    assert_eq!(replay.status, 200);
    let events = replay.rest();
    assert_eq!(stdout_of(&events), "hi\n");
    let kinds: Vec<_> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(kinds, ["stdout", "exit", "end"]);
    assert_eq!(events[1].data["exit_code"], 0);

    // More than 8 MiB of output: the oldest is dropped, the exec says so, the tail is whole.
    let r = f.exec(&json!({"argv": ["sh", "-c", "head -c 9437184 /dev/zero | tr '\\0' a; echo END"]}));
    assert_eq!(r.status, 200);
    assert_eq!(r.body["truncated"], true);
    let out = r.body["stdout"].as_str().unwrap();
    assert!(
        out.len() <= 8 * 1024 * 1024 && out.len() > 7 * 1024 * 1024,
        "{}",
        out.len()
    );
    assert!(out.ends_with("aaaEND\n"));
}

// covers: P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn a_stream_survives_a_disconnect_and_reattaches_exactly_once() {
    let f = Fixture::new();
    let script = "for i in 1 2 3 4 5 6 7 8; do echo line$i; sleep 0.4; done";
    let mut first = f.sse(
        "POST",
        &f.path("/execs"),
        Some(&json!({"argv": ["sh", "-c", script]})),
        None,
    );
    assert_eq!(first.status, 200);
    assert!(
        first.content_type.starts_with("text/event-stream"),
        "{}",
        first.content_type
    );
    let mut seen = Vec::new();
    while stdout_of(&seen).lines().count() < 2 {
        seen.push(first.next().unwrap());
    }
    drop(first);
    let last = seen.last().unwrap().id.clone();
    let exec = last.rsplit_once('.').unwrap().0.to_owned();
    // Gone for a while: the exec goes on without a client.
    std::thread::sleep(Duration::from_millis(900));
    let mut again = f.sse(
        "GET",
        &f.path(&format!("/execs/{exec}/events")),
        None,
        Some(&last),
    );
    assert_eq!(again.status, 200);
    let rest = again.rest();
    let mut all = seen.clone();
    all.extend(rest.iter().cloned());
    let numbers: Vec<u64> = all.iter().map(super::fixture::SseEvent::n).collect();
    assert!(
        numbers.windows(2).all(|w| w[1] > w[0]),
        "ids not increasing: {numbers:?}"
    );
    let expected: String = (1..=8).map(|i| format!("line{i}\n")).collect();
    assert_eq!(stdout_of(&all), expected);
    assert_eq!(rest[rest.len() - 2].event, "exit");
    assert_eq!(rest[rest.len() - 2].data["state"], "exited");
    assert_eq!(rest.last().unwrap().event, "end");

    // `?after=` of a finished exec replays what follows; an id of another stream or from the future is a 400.
    let mut after = f.sse(
        "GET",
        &f.path(&format!("/execs/{exec}/events?after={}", all[0].id)),
        None,
        None,
    );
    assert_eq!(after.rest().len(), all.len() - 1);
    let other = f.server.call_with(
        "GET",
        &f.path(&format!("/execs/{exec}/events")),
        &f.auth,
        None,
        &[("Last-Event-ID", "xother.1")],
    );
    assert_eq!(other.status, 400, "{:?}", other.body);
    let future = f.server.call(
        "GET",
        &f.path(&format!("/execs/{exec}/events?after={exec}.999")),
        &f.auth,
        None,
    );
    assert_eq!(future.status, 400, "{:?}", future.body);

    // Detached: 202 at once, then followed from the start by two clients at the same time.
    let detached = f.server.call(
        "POST",
        &f.path("/execs?detach=true"),
        &f.auth,
        Some(&json!({"argv": ["sh", "-c", "sleep 1; echo done"]})),
    );
    assert_eq!(detached.status, 202, "{:?}", detached.body);
    assert_eq!(detached.body["state"], "running");
    let id = detached.body["id"].as_str().unwrap();
    let events = f.path(&format!("/execs/{id}/events"));
    let (mut a, mut b) = (
        f.sse("GET", &events, None, None),
        f.sse("GET", &events, None, None),
    );
    let (a, b) = (a.rest(), b.rest());
    assert_eq!(stdout_of(&a), "done\n");
    assert_eq!(stdout_of(&b), "done\n");
    let got = f
        .server
        .call("GET", &f.path(&format!("/execs/{id}")), &f.auth, None);
    assert_eq!(got.body["state"], "exited");
}

// covers: P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn cancel_kills_the_whole_process_group() {
    let f = Fixture::new();
    let started = f.server.call(
        "POST",
        &f.path("/execs?detach=true"),
        &f.auth,
        Some(&json!({"argv": ["sh", "-c", "sleep 1001 & sleep 1001"]})),
    );
    assert_eq!(started.status, 202, "{:?}", started.body);
    let id = started.body["id"].as_str().unwrap().to_owned();
    f.eventually(Duration::from_secs(10), "both sleeps run", || {
        f.processes_with("sleep 1001") == 2
    });
    let viewer = f.grant("bob", "viewer");
    let refused = f
        .server
        .call("POST", &f.path(&format!("/execs/{id}/cancel")), &viewer, None);
    assert_eq!(refused.status, 403, "{:?}", refused.body);
    let cancelled = f
        .server
        .call("POST", &f.path(&format!("/execs/{id}/cancel")), &f.auth, None);
    assert_eq!(cancelled.status, 200, "{:?}", cancelled.body);
    assert_eq!(cancelled.body["state"], "cancelled");
    f.eventually(Duration::from_secs(10), "no sleep is left", || {
        f.processes_with("sleep 1001") == 0
    });
    // Cancelling an ended exec changes nothing.
    let again = f
        .server
        .call("POST", &f.path(&format!("/execs/{id}/cancel")), &f.auth, None);
    assert_eq!(again.status, 200);
    assert_eq!(again.body["state"], "cancelled");
    let done = f.server.call(
        "POST",
        &f.path("/execs"),
        &f.auth,
        Some(&json!({"argv": ["true"]})),
    );
    let done_id = done.body["id"].as_str().unwrap();
    let noop = f.server.call(
        "POST",
        &f.path(&format!("/execs/{done_id}/cancel")),
        &f.auth,
        None,
    );
    assert_eq!(noop.status, 200);
    assert_eq!(noop.body["state"], "exited");
}

// covers: P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn a_timeout_kills_the_exec_and_marks_it_timed_out() {
    let f = Fixture::new();
    let begun = Instant::now();
    let r = f.exec(&json!({"argv": ["sh", "-c", "echo before; sleep 1004 & sleep 1004"], "timeout": 1}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(
        begun.elapsed() < Duration::from_secs(20),
        "took {:?}",
        begun.elapsed()
    );
    assert_eq!(r.body["state"], "timed_out");
    assert_eq!(r.body["stdout"], "before\n");
    assert_ne!(r.body["exit_code"], 0);
    f.eventually(Duration::from_secs(10), "no sleep is left", || {
        f.processes_with("sleep 1004") == 0
    });
}

// covers: S12, P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn an_exec_running_when_the_server_dies_is_lost_and_the_agent_still_works() {
    let mut f = Fixture::new();
    let started = f.server.call(
        "POST",
        &f.path("/execs?detach=true"),
        &f.auth,
        Some(&json!({"argv": ["sh", "-c", "echo up; sleep 1002"]})),
    );
    assert_eq!(started.status, 202, "{:?}", started.body);
    let id = started.body["id"].as_str().unwrap().to_owned();
    f.eventually(Duration::from_secs(10), "the exec runs", || {
        f.processes_with("sleep 1002") == 1
    });
    f.server.kill9();
    f.server.spawn();
    let got = f
        .server
        .call("GET", &f.path(&format!("/execs/{id}")), &f.auth, None);
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(got.body["state"], "lost");
    assert!(got.body["ended_at"].is_string());
    let mut events = f.sse("GET", &f.path(&format!("/execs/{id}/events")), None, None);
    let events = events.rest();
    let kinds: Vec<_> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(kinds, ["exit", "end"]);
    assert_eq!(events[0].data["state"], "lost");
    // Its process was killed; the agent runs on and takes new execs.
    assert_eq!(f.processes_with("sleep 1002"), 0);
    let agent = f.server.call("GET", &f.path(""), &f.auth, None);
    assert_eq!(agent.body["state"], "running", "{:?}", agent.body);
    assert_eq!(f.sh("echo again"), "again\n");
}

// covers: S9, S5
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn bad_exec_requests_are_refused() {
    let f = Fixture::new();
    let status = |body: &serde_json::Value| f.exec(body).status;
    assert_eq!(status(&json!({"argv": []})), 400);
    let many: Vec<String> = (0..4097).map(|i| i.to_string()).collect();
    assert_eq!(status(&json!({"argv": many})), 400);
    assert_eq!(status(&json!({"argv": ["true"], "timeout": 0})), 400);
    assert_eq!(status(&json!({"argv": ["true"], "timeout": 86_401})), 400);
    assert_eq!(status(&json!({"argv": ["true"], "timeout": -1})), 422);
    assert_eq!(status(&json!({"argv": ["true"], "shell": true})), 422);
    assert_eq!(status(&json!({"argv": ["true"], "cwd": "tmp"})), 400);
    assert_eq!(status(&json!({"argv": ["true"], "cwd": "/tmp/../etc"})), 400);
    assert_eq!(status(&json!({"argv": ["a\u{0}b"]})), 400);
    assert_eq!(status(&json!({"argv": ["true"], "env": {"A=B": "c"}})), 400);
    assert_eq!(
        status(&json!({"argv": ["true"], "stdin": "a", "stdin_b64": "YQ=="})),
        400
    );
    assert_eq!(
        status(&json!({"argv": ["true"], "stdin_b64": "not base64!"})),
        400
    );
    let huge = "x".repeat(9 * 1024 * 1024);
    let r = f.exec(&json!({"argv": ["true", huge]}));
    assert_eq!(r.status, 413, "{:?}", r.content_type);
    assert_eq!(r.content_type, "application/problem+json");
    // Roles: a viewer may look but not run; a stranger sees nothing.
    let viewer = f.grant("bob", "viewer");
    let r = f.server.call(
        "POST",
        &f.path("/execs"),
        &viewer,
        Some(&json!({"argv": ["true"]})),
    );
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(f.server.call("GET", &f.path("/execs"), &viewer, None).status, 200);
    let (_, stranger) = f.server.user("eve");
    let r = f.server.call(
        "POST",
        &f.path("/execs"),
        &Auth::Token(stranger),
        Some(&json!({"argv": ["true"]})),
    );
    assert_eq!(r.status, 404);
    for missing in [
        "/execs/xnosuchexec",
        "/execs/NOT.AN.ID",
        "/execs/xnosuchexec/events",
    ] {
        assert_eq!(
            f.server.call("GET", &f.path(missing), &f.auth, None).status,
            404,
            "{missing}"
        );
    }
}
