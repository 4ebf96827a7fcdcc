//! Harness runs through the real server and a real sandbox (P1, S9, S12). The harness is `custom`: a small
//! Python script in the dev image that reads its prompt from standard input and prints Claude-style
//! stream-json lines (plus a line that is not JSON and a line on standard error), so these tests do not
//! depend on the harness image; the real `claude` and `codex` binaries are tested with the harness image.

use std::time::Duration;

use serde_json::{Value, json};

use super::fixture::{Fixture, SseEvent};

/// A Claude stand-in: keeps its standard input in `/tmp/run-prompt`, prints an init line, a message with a
/// tool call, its result, a line that is not JSON, a line on standard error, then a result whose text is the
/// prompt. With an argument, sleeps that long between lines.
const CLAUDE_LIKE: &str = r#"
import json, sys, time
prompt = sys.stdin.buffer.read()
open('/tmp/run-prompt', 'wb').write(prompt)
pause = float(sys.argv[1]) if len(sys.argv) > 1 else 0
def out(o):
    print(json.dumps(o), flush=True)
    time.sleep(pause)
out({"type": "system", "subtype": "init", "session_id": "sess-1", "model": "stand-in"})
out({"type": "assistant", "message": {"role": "assistant", "content": [
    {"type": "text", "text": "looking"},
    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]}})
out({"type": "user", "message": {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt", "is_error": False}]}})
print("not json at all", flush=True)
sys.stderr.write("a warning\n"); sys.stderr.flush()
out({"type": "result", "subtype": "success", "is_error": False, "result": prompt.decode("utf-8"),
     "session_id": "sess-1", "total_cost_usd": 0.25, "usage": {"input_tokens": 3, "output_tokens": 4}})
"#;

fn start(f: &Fixture, body: &Value) -> String {
    let r = f.server.call("POST", &f.path("/runs"), &f.auth, Some(body));
    assert_eq!(r.status, 202, "{:?}", r.body);
    assert!(r.body["id"].as_str().unwrap().starts_with("run_"), "{:?}", r.body);
    r.body["id"].as_str().unwrap().to_owned()
}

fn claude_like(prompt: &str, pause: Option<&str>) -> Value {
    let mut argv = vec!["python3", "-c", CLAUDE_LIKE];
    argv.extend(pause);
    json!({"harness": "custom", "prompt": prompt, "argv": argv})
}

fn events(f: &Fixture, run: &str, last: Option<&str>) -> Vec<SseEvent> {
    let mut s = f.sse("GET", &f.path(&format!("/runs/{run}/events")), None, last);
    assert_eq!(s.status, 200);
    assert!(s.content_type.starts_with("text/event-stream"));
    s.rest()
}

fn types(events: &[SseEvent]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}

// covers: P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn a_run_streams_normalised_events_and_ends() {
    let f = Fixture::new();
    let run = start(&f, &claude_like("hello", None));
    let all = events(&f, &run, None);
    // The order of lines across stdout and stderr is the sandbox's: compare the parsed ones in order and
    // the raw ones as a set.
    let parsed: Vec<&SseEvent> = all.iter().filter(|e| e.event != "raw").collect();
    let kinds: Vec<&str> = parsed.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "state",
            "session",
            "message",
            "tool_call",
            "tool_result",
            "usage",
            "result",
            "state",
            "end"
        ],
        "{all:?}"
    );
    for (i, e) in all.iter().enumerate() {
        assert_eq!(e.id, format!("{run}.{}", i + 1));
        assert_eq!(e.data["type"], e.event.as_str());
    }
    assert_eq!(parsed[0].data["state"], "running");
    assert_eq!(parsed[1].data["session_id"], "sess-1");
    assert_eq!(
        parsed[2].data,
        json!({"type": "message", "role": "assistant", "text": "looking"})
    );
    assert_eq!(parsed[3].data["name"], "Bash");
    assert_eq!(parsed[3].data["input"], json!({"command": "ls"}));
    assert_eq!(parsed[4].data["output"], "a.txt");
    assert_eq!(parsed[4].data["id"], "toolu_1");
    let mut raws: Vec<(String, String)> = all
        .iter()
        .filter(|e| e.event == "raw")
        .map(|e| {
            (
                e.data["stream"].as_str().unwrap().to_owned(),
                e.data["line"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    raws.sort();
    assert_eq!(
        raws,
        [
            ("stderr".to_owned(), "a warning".to_owned()),
            ("stdout".to_owned(), "not json at all".to_owned())
        ]
    );
    assert_eq!(parsed[5].data["cost_usd"], 0.25);
    assert_eq!(parsed[6].data["text"], "hello");
    let end = all.last().unwrap();
    assert_eq!(
        end.data,
        json!({"type": "end", "state": "succeeded", "exit_code": 0})
    );

    let got = f
        .server
        .call("GET", &f.path(&format!("/runs/{run}")), &f.auth, None);
    assert_eq!(got.status, 200);
    let b = &got.body;
    assert_eq!(b["state"], "succeeded");
    assert_eq!(b["exit_code"], 0);
    assert_eq!(b["harness"], "custom");
    assert_eq!(b["session_id"], "sess-1");
    assert_eq!(b["result"], "hello");
    assert_eq!(
        b["usage"],
        json!({"input_tokens": 3, "output_tokens": 4, "cost_usd": 0.25})
    );
    assert_eq!(b["prompt_bytes"], 5);
    assert_eq!(b["origin"]["kind"], "user");
    assert_eq!(b["depth"], 0);
    assert_eq!(b["truncated"], false);
    assert!(b["ended_at"].is_string());
    // The raw lines are kept; the list shows it newest first; a failing harness is `failed`.
    let output = f
        .server
        .call("GET", &f.path(&format!("/runs/{run}/output")), &f.auth, None);
    assert_eq!(output.status, 200);
    assert_eq!(output.body["lines"].as_array().unwrap().len(), 5);
    let failed = start(
        &f,
        &json!({"harness": "custom", "prompt": "", "argv": ["sh", "-c", "echo oops; exit 3"]}),
    );
    let end = events(&f, &failed, None).pop().unwrap();
    assert_eq!(
        end.data,
        json!({"type": "end", "state": "failed", "exit_code": 3})
    );
    let list = f.server.call("GET", &f.path("/runs"), &f.auth, None);
    let ids: Vec<_> = list.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [failed.as_str(), run.as_str()]);
    // A line past 1 MiB is cut there and the run says it was truncated; the next line still comes through.
    let long = start(
        &f,
        &json!({"harness": "custom", "prompt": "", "argv": ["python3", "-c",
            "import sys; sys.stdout.write('x' * (1024 * 1024 + 10) + '\\nafter\\n')"]}),
    );
    let all = events(&f, &long, None);
    let raws: Vec<usize> = all
        .iter()
        .filter(|e| e.event == "raw")
        .map(|e| e.data["line"].as_str().unwrap().len())
        .collect();
    assert_eq!(raws, [1024 * 1024, 5]);
    let got = f
        .server
        .call("GET", &f.path(&format!("/runs/{long}")), &f.auth, None);
    assert_eq!(got.body["truncated"], true);
    assert_eq!(got.body["state"], "succeeded");
    // Start and cancel are audited.
    let audit = f.server.call(
        "GET",
        &format!("/api/v1/workspaces/{}/audit", f.ws),
        &f.auth,
        None,
    );
    assert!(
        audit.body["items"].as_array().unwrap().iter().any(|e| e["action"]
            == "POST /api/v1/workspaces/{ws}/agents/{agent}/runs"
            && e["result"] == "ok"),
        "{:?}",
        audit.body
    );
}

// covers: P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn a_run_survives_a_disconnect_and_replays_from_last_event_id() {
    let f = Fixture::new();
    let run = start(&f, &claude_like("slow", Some("0.4")));
    let mut first = f.sse("GET", &f.path(&format!("/runs/{run}/events")), None, None);
    let seen: Vec<SseEvent> = (0..3).map(|_| first.next().unwrap()).collect();
    drop(first);
    // Gone for a while: the run goes on without a client.
    std::thread::sleep(Duration::from_millis(900));
    let last = seen.last().unwrap().id.clone();
    let rest = events(&f, &run, Some(&last));
    let mut all = seen;
    all.extend(rest.iter().cloned());
    let numbers: Vec<u64> = all.iter().map(SseEvent::n).collect();
    assert_eq!(
        numbers,
        (1..=numbers.len() as u64).collect::<Vec<_>>(),
        "each event exactly once"
    );
    assert_eq!(all.last().unwrap().event, "end");
    assert_eq!(all.last().unwrap().data["state"], "succeeded");
    // `?after=` replays an ended run; a foreign or future id is a 400.
    let mut after = f.sse(
        "GET",
        &f.path(&format!("/runs/{run}/events?after={}", all[1].id)),
        None,
        None,
    );
    assert_eq!(after.rest().len(), all.len() - 2);
    let other = f.server.call_with(
        "GET",
        &f.path(&format!("/runs/{run}/events")),
        &f.auth,
        None,
        &[("Last-Event-ID", "run_other.1")],
    );
    assert_eq!(other.status, 400, "{:?}", other.body);
    let future = f.server.call(
        "GET",
        &f.path(&format!("/runs/{run}/events?after={run}.999")),
        &f.auth,
        None,
    );
    assert_eq!(future.status, 400, "{:?}", future.body);
}

// covers: P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn cancel_kills_the_runs_process_group_and_roles_hold() {
    let f = Fixture::new();
    let run = start(
        &f,
        &json!({"harness": "custom", "prompt": "p", "argv": ["sh", "-c", "sleep 1005 & sleep 1005"]}),
    );
    f.eventually(Duration::from_secs(10), "both sleeps run", || {
        f.processes_with("sleep 1005") == 2
    });
    let viewer = f.grant("bob", "viewer");
    // A viewer reads, cannot start or cancel.
    let path = f.path(&format!("/runs/{run}"));
    assert_eq!(f.server.call("GET", &path, &viewer, None).status, 200);
    assert_eq!(f.server.call("GET", &f.path("/runs"), &viewer, None).status, 200);
    let refused = f.server.call("POST", &format!("{path}/cancel"), &viewer, None);
    assert_eq!(refused.status, 403, "{:?}", refused.body);
    let refused = f
        .server
        .call("POST", &f.path("/runs"), &viewer, Some(&claude_like("x", None)));
    assert_eq!(refused.status, 403, "{:?}", refused.body);
    let stranger = f.server.user("mallory").1;
    let hidden = f
        .server
        .call("GET", &path, &super::support::Auth::Token(stranger), None);
    assert_eq!(hidden.status, 404);

    let cancelled = f.server.call("POST", &format!("{path}/cancel"), &f.auth, None);
    assert_eq!(cancelled.status, 200, "{:?}", cancelled.body);
    assert_eq!(cancelled.body["state"], "cancelled");
    f.eventually(
        Duration::from_secs(10),
        "no sleep is left (the child too)",
        || f.processes_with("sleep 1005") == 0,
    );
    let end = events(&f, &run, None).pop().unwrap();
    assert_eq!(end.data["state"], "cancelled");
    // Cancelling again changes nothing.
    let again = f.server.call("POST", &format!("{path}/cancel"), &f.auth, None);
    assert_eq!(again.status, 200);
    assert_eq!(again.body["state"], "cancelled");
}

// covers: P1, S9
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn the_prompt_reaches_stdin_byte_exact_and_is_never_interpreted() {
    let f = Fixture::new();
    let nasty = "$(touch /tmp/pwned) `touch /tmp/pwned` ; touch /tmp/pwned | & && \"quoted\" 'single' \\ \
                 \n\nsecond line\r\n\ttab -- --help -p ü € 😀 \u{202e}rtl\u{0} end\n";
    let run = start(&f, &claude_like(nasty, None));
    let all = events(&f, &run, None);
    let result = all.iter().find(|e| e.event == "result").unwrap();
    assert_eq!(result.data["text"], nasty);
    assert_eq!(
        f.sh("sha256sum < /tmp/run-prompt | cut -c1-64").trim(),
        sha256_hex(nasty.as_bytes())
    );
    assert_eq!(f.sh("ls /tmp/pwned 2>/dev/null | wc -l").trim(), "0");

    // 256 KiB exactly is accepted (and arrives whole); one byte more is 413 prompt_too_large.
    let max = "a".repeat(256 * 1024);
    let run = start(
        &f,
        &json!({"harness": "custom", "prompt": max, "argv": ["wc", "-c"]}),
    );
    let all = events(&f, &run, None);
    let raw = all.iter().find(|e| e.event == "raw").unwrap();
    assert_eq!(raw.data["line"].as_str().unwrap().trim(), "262144");
    let over = format!("{max}a");
    let r = f.server.call(
        "POST",
        &f.path("/runs"),
        &f.auth,
        Some(&json!({"harness": "custom", "prompt": over, "argv": ["wc", "-c"]})),
    );
    assert_eq!(r.status, 413, "{:?}", r.body);
    assert_eq!(r.body["code"], "prompt_too_large");

    // Bad requests: argv where it does not belong, none where it must be, option-like values, unknown fields.
    for body in [
        json!({"harness": "claude", "prompt": "x", "argv": ["sh"]}),
        json!({"harness": "custom", "prompt": "x"}),
        json!({"harness": "custom", "prompt": "x", "argv": []}),
        json!({"harness": "claude", "prompt": "x", "resume": "--dangerous"}),
        json!({"harness": "codex", "prompt": "x", "model": "a b"}),
        json!({"harness": "custom", "prompt": "x", "argv": ["true"], "model": "m"}),
    ] {
        let r = f.server.call("POST", &f.path("/runs"), &f.auth, Some(&body));
        assert_eq!(r.status, 400, "{body}: {:?}", r.body);
    }
    for body in [
        json!({"harness": "bash", "prompt": "x"}),
        json!({"harness": "custom", "prompt": "x", "argv": ["true"], "shell": true}),
    ] {
        let r = f.server.call("POST", &f.path("/runs"), &f.auth, Some(&body));
        assert_eq!(r.status, 422, "{body}: {:?}", r.body);
    }
    let unknown = f
        .server
        .call("GET", &f.path("/runs/run_nosuchrun0"), &f.auth, None);
    assert_eq!(unknown.status, 404);
    let bad = f.server.call("GET", &f.path("/runs/..%2Fx"), &f.auth, None);
    assert_eq!(bad.status, 404);
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

// covers: S12, P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn a_run_going_when_the_server_dies_is_lost() {
    let mut f = Fixture::new();
    let run = start(
        &f,
        &json!({"harness": "custom", "prompt": "", "argv": ["sh", "-c", "echo up; sleep 1006"]}),
    );
    f.eventually(Duration::from_secs(10), "the run's process runs", || {
        f.processes_with("sleep 1006") == 1
    });
    f.server.kill9();
    f.server.spawn();
    let got = f
        .server
        .call("GET", &f.path(&format!("/runs/{run}")), &f.auth, None);
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(got.body["state"], "lost");
    assert!(got.body["ended_at"].is_string());
    let all = events(&f, &run, None);
    assert_eq!(types(&all), ["state", "end"]);
    assert_eq!(all[1].data["state"], "lost");
    assert_eq!(f.processes_with("sleep 1006"), 0);
    // The agent takes new runs.
    let again = start(&f, &claude_like("again", None));
    assert_eq!(events(&f, &again, None).pop().unwrap().data["state"], "succeeded");
}
