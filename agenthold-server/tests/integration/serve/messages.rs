//! Agent-to-agent messages (P3, S4) through a real server and real sandboxes: `agenthold-send` inside a
//! sandbox, as a non-root user, asks over the tunnel; the server knows the sender by its tunnel, finds the
//! target by name in the sender's workspace only, requires the sender's owner to be an operator of the
//! target, starts a run there marked as from the sender, keeps and audits the message on both sides, and
//! stops a chain of runs that each send on at depth 4.
//!
//! The targets run a stand-in `claude` (a shell script installed in their sandboxes, run by the server's
//! real harness command line as the user `agent`) that logs its prompt and sends on to the next name in
//! it, so a chain is real runs sending real messages.

use std::time::Duration;

use serde_json::{Value, json};

use super::fixture::Fixture;
use super::support::{Auth, TestServer};

/// Create agent `name` in `ws` (retrying a subnet picked at the same moment by another test's server).
fn agent(server: &TestServer, auth: &Auth, ws: &str, name: &str) -> String {
    for tries in 1..=5u64 {
        let r = server.call(
            "POST",
            &format!("/api/v1/workspaces/{ws}/agents"),
            auth,
            Some(&json!({ "name": name })),
        );
        let overlap = r.status == 502 && r.body["detail"].as_str().is_some_and(|d| d.contains("overlaps"));
        if !overlap {
            assert_eq!(r.status, 201, "{:?}", r.body);
            return r.body["id"].as_str().unwrap().to_owned();
        }
        std::thread::sleep(Duration::from_millis(300 * tries));
    }
    panic!("could not create agent {name}");
}

/// `sh -c script` as root in `agent`: (exit code, stdout, stderr).
fn sh(f: &Fixture, auth: &Auth, ws: &str, agent: &str, script: &str) -> (i64, String, String) {
    let r = f.server.call(
        "POST",
        &format!("/api/v1/workspaces/{ws}/agents/{agent}/execs"),
        auth,
        Some(&json!({"argv": ["sh", "-c", script], "timeout": 120})),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    (
        r.body["exit_code"].as_i64().unwrap_or(-1),
        r.body["stdout"].as_str().unwrap_or_default().to_owned(),
        r.body["stderr"].as_str().unwrap_or_default().to_owned(),
    )
}

/// `agenthold-send ARGS` as the unprivileged `nobody` in `agent` (the boot token is root's alone).
fn send(f: &Fixture, auth: &Auth, ws: &str, agent: &str, args: &str) -> (i64, String, String) {
    sh(
        f,
        auth,
        ws,
        agent,
        &format!("exec setpriv --reuid=65534 --regid=65534 --clear-groups -- agenthold-send {args}"),
    )
}

/// The stand-in `claude`: logs its prompt (and who it runs as), then sends the rest of the prompt on to the
/// first name in it. Installed as root with a user `agent` for the harness command line's `setpriv`.
const FAKE_CLAUDE: &str = r#"set -e
grep -q '^agent:' /etc/passwd || { echo 'agent:x:1000:1000::/workspace:/bin/sh' >> /etc/passwd; echo 'agent:x:1000:' >> /etc/group; }
cat > /usr/local/bin/claude <<'EOS'
#!/bin/sh
# Stand-in harness: the prompt is on stdin.
prompt=$(cat)
log=/tmp/hop-$(date +%s%N)
echo "as=$(id -un) prompt=$prompt" > "$log"
sleep 1
set -- $prompt
[ "$1" = hop ] || exit 0
shift
[ $# -gt 0 ] || exit 0
next=$1
shift
agenthold-send "$next" "hop $*" >> "$log" 2>&1 || echo "send-failed" >> "$log"
EOS
chmod 755 /usr/local/bin/claude
"#;

/// A new user, member of the fixture's workspace: (id, token).
fn member(f: &Fixture, name: &str) -> (String, Auth) {
    let (id, token) = f.server.user(name);
    let r = f.server.call(
        "PUT",
        &format!("/api/v1/workspaces/{}/members/{id}", f.ws),
        &f.auth,
        Some(&json!({"role": "member"})),
    );
    assert!(r.status == 200 || r.status == 201, "{:?}", r.body);
    (id, Auth::Token(token))
}

/// Give `user` `role` on `agent` of the fixture's workspace.
fn grant(f: &Fixture, agent: &str, user: &str, role: &str) {
    let r = f.server.call(
        "PUT",
        &format!("/api/v1/workspaces/{}/agents/{agent}/grants/{user}", f.ws),
        &f.auth,
        Some(&json!({ "role": role })),
    );
    assert!(r.status == 200 || r.status == 201, "{:?}", r.body);
}

fn messages(f: &Fixture, auth: &Auth, ws: &str, agent: &str) -> Vec<Value> {
    let r = f.server.call(
        "GET",
        &format!("/api/v1/workspaces/{ws}/agents/{agent}/messages"),
        auth,
        None,
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body["items"].as_array().unwrap().clone()
}

fn audit(f: &Fixture, ws: &str) -> Vec<Value> {
    let r = f.server.call(
        "GET",
        &format!("/api/v1/workspaces/{ws}/audit?limit=500"),
        &f.auth,
        None,
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body["items"].as_array().unwrap().clone()
}

// covers: P3, S4
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn messages_start_runs_only_within_the_workspace_and_the_owners_rights() {
    let f = Fixture::new();
    let (ws, sender) = (f.ws.clone(), f.agent.clone());
    let target = agent(&f.server, &f.auth, &ws, "target b");
    assert_eq!(sh(&f, &f.auth, &ws, &target, FAKE_CLAUDE).0, 0);

    // Allowed: a run starts on the target, marked as from the sender, whatever the prompt claims.
    let (code, out, err) = send(
        &f,
        &f.auth,
        &ws,
        &sender,
        "'target b' 'FROM: agent x. I am not who you think'",
    );
    assert_eq!(code, 0, "{out}{err}");
    let run = out.trim().to_owned();
    assert!(run.starts_with("run_"), "{out}");
    let sent = messages(&f, &f.auth, &ws, &sender);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["direction"], "sent");
    assert_eq!(sent[0]["from_agent"], json!(sender));
    assert_eq!(sent[0]["to_agent"], json!(target));
    assert_eq!(sent[0]["run"], json!(run));
    assert_eq!(sent[0]["depth"], 1);
    assert_eq!(sent[0]["outcome"], "started");
    let received = messages(&f, &f.auth, &ws, &target);
    assert_eq!(received[0]["direction"], "received");
    assert_eq!(received[0]["from_agent"], json!(sender));
    assert_eq!(received[0]["id"], sent[0]["id"]);
    // The stand-in harness got the prompt on stdin and ran as `agent`.
    f.eventually(Duration::from_secs(20), "the target's run", || {
        sh(&f, &f.auth, &ws, &target, "cat /tmp/hop-* 2>/dev/null")
            .1
            .contains("as=agent prompt=FROM: agent x. I am not who you think")
    });
    // The run is marked as from the sender, started on its owner's rights.
    let got = f.server.call(
        "GET",
        &format!("/api/v1/workspaces/{ws}/agents/{target}/runs/{run}"),
        &f.auth,
        None,
    );
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(got.body["origin"]["kind"], "agent", "{:?}", got.body);
    assert_eq!(got.body["origin"]["agent"], json!(sender));
    assert!(
        got.body["origin"].get("run").is_none(),
        "an exec is no run: {:?}",
        got.body
    );
    assert_eq!(got.body["depth"], 1);
    assert_eq!(got.body["harness"], "claude");

    // Unknown, and another workspace's agent: the same refusal.
    let other_ws = f.server.call(
        "POST",
        "/api/v1/workspaces",
        &f.auth,
        Some(&json!({"name": "w2"})),
    );
    let other_ws = other_ws.body["id"].as_str().unwrap().to_owned();
    let far = agent(&f.server, &f.auth, &other_ws, "far");
    for name in ["ghost", "far"] {
        let (code, out, err) = send(&f, &f.auth, &ws, &sender, &format!("{name} hi"));
        assert_eq!((code, out.as_str()), (1, ""), "{err}");
        assert!(
            err.contains(&format!("refused: no agent named \"{name}\" in this workspace")),
            "{err}"
        );
    }
    assert!(messages(&f, &f.auth, &other_ws, &far).is_empty());

    // An agent whose owner (bob) may only view the target is refused; as an operator it may send.
    let (bob_id, bob) = member(&f, "bob");
    grant(&f, &target, &bob_id, "viewer");
    let bobs = agent(&f.server, &bob, &ws, "bobs");
    let (code, _, err) = send(&f, &bob, &ws, &bobs, "'target b' hi");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("refused: the owner of this agent needs the operator role on \"target b\""),
        "{err}"
    );
    let refused = messages(&f, &f.auth, &ws, &target);
    assert_eq!(refused[0]["outcome"], "refused", "{refused:?}");
    assert_eq!(refused[0]["from_agent"], json!(bobs));
    grant(&f, &target, &bob_id, "operator");
    let (code, out, err) = send(&f, &bob, &ws, &bobs, "'target b' hi");
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("run_"));

    // Oversize prompt (stdin), malformed requests straight on the socket, a request as root.
    let (code, _, err) = sh(
        &f,
        &f.auth,
        &ws,
        &sender,
        "head -c 262145 /dev/zero | tr '\\0' x | agenthold-send 'target b' -",
    );
    assert_eq!(code, 1);
    assert!(err.contains("prompt too large"), "{err}");
    let (_, out, _) = sh(
        &f,
        &f.auth,
        &ws,
        &sender,
        "python3 - <<'EOF'\nimport socket\nfor req in [b'SEND claude 8 2\\ntarget bhi', b'SEND custom 1 1\\nxy', b'HELLO\\n', b'SEND claude 1 262145\\n']:\n    s = socket.socket(socket.AF_UNIX); s.connect('/.agenthold/send.sock'); s.sendall(req); s.shutdown(socket.SHUT_WR)\n    print(s.recv(300).decode().strip())\nEOF",
    );
    let answers: Vec<&str> = out.lines().collect();
    assert!(answers[0].starts_with("STARTED run_"), "{out}");
    assert_eq!(
        &answers[1..],
        [
            "ERR unknown harness (claude or codex)",
            "ERR malformed SEND request",
            "ERR prompt too large (at most 262144 bytes)"
        ],
        "{out}"
    );

    // Audited on both sides.
    let entries = audit(&f, &ws);
    let with = |action: &str, side: &str| {
        entries
            .iter()
            .filter(|e| {
                e["action"] == action
                    && e["target"]
                        .as_str()
                        .unwrap()
                        .starts_with(&format!("agents/{side} "))
            })
            .count()
    };
    assert!(with("agent.message.send", &sender) >= 4, "{entries:?}");
    assert!(with("agent.message.receive", &target) >= 3, "{entries:?}");
    let first = entries
        .iter()
        .find(|e| e["action"] == "agent.message.receive" && e["result"] == "ok")
        .unwrap();
    assert!(
        first["target"]
            .as_str()
            .unwrap()
            .contains(&format!("from={sender} to={target}")),
        "{first:?}"
    );

    // Deleted with the agent.
    let r = f.server.call(
        "DELETE",
        &format!("/api/v1/workspaces/{ws}/agents/{target}"),
        &f.auth,
        None,
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let r = f.server.call(
        "GET",
        &format!("/api/v1/workspaces/{ws}/agents/{target}/messages"),
        &f.auth,
        None,
    );
    assert_eq!(r.status, 404);
}

/// A chain of runs that each send on: sender → c1 → c2 → c1 → c2 (depth 4) → c1 is refused at depth 5.
// covers: P3
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn a_chain_of_messages_stops_at_depth_four() {
    let f = Fixture::new();
    let (ws, sender) = (f.ws.clone(), f.agent.clone());
    let c1 = agent(&f.server, &f.auth, &ws, "c1");
    let c2 = agent(&f.server, &f.auth, &ws, "c2");
    for a in [&c1, &c2] {
        assert_eq!(sh(&f, &f.auth, &ws, a, FAKE_CLAUDE).0, 0);
    }
    let (code, out, err) = send(&f, &f.auth, &ws, &sender, "c1 'hop c2 c1 c2 c1'");
    assert_eq!(code, 0, "{out}{err}");
    f.eventually(Duration::from_secs(60), "the refusal at depth 5", || {
        messages(&f, &f.auth, &ws, &c2)
            .iter()
            .any(|m| m["direction"] == "sent" && m["outcome"] == "refused")
    });
    let depths = |agent: &str, direction: &str| -> Vec<(i64, String)> {
        let mut v: Vec<(i64, String)> = messages(&f, &f.auth, &ws, agent)
            .iter()
            .filter(|m| m["direction"] == direction)
            .map(|m| {
                (
                    m["depth"].as_i64().unwrap(),
                    m["outcome"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let started = |d| (d, "started".to_owned());
    assert_eq!(depths(&sender, "sent"), [started(1)]);
    assert_eq!(
        depths(&c1, "received"),
        [started(1), started(3), (5, "refused".to_owned())]
    );
    assert_eq!(depths(&c1, "sent"), [started(2), started(4)]);
    assert_eq!(depths(&c2, "sent"), [started(3), (5, "refused".to_owned())]);
    assert_eq!(depths(&c2, "received"), [started(2), started(4)]);
    // Each hop's run names the run that sent it, and runs on the owner's rights.
    let run_at = |agent: &str, depth: i64| -> String {
        messages(&f, &f.auth, &ws, agent)
            .iter()
            .find(|m| m["direction"] == "received" && m["depth"] == depth)
            .and_then(|m| m["run"].as_str())
            .unwrap()
            .to_owned()
    };
    let (r1, r2) = (run_at(&c1, 1), run_at(&c2, 2));
    let got = f.server.call(
        "GET",
        &format!("/api/v1/workspaces/{ws}/agents/{c2}/runs/{r2}"),
        &f.auth,
        None,
    );
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(
        got.body["origin"],
        json!({"kind": "agent", "agent": c1, "run": r1}),
        "{:?}",
        got.body
    );
    assert_eq!(got.body["depth"], 2);
    let me = f.server.call("GET", "/api/v1/me", &f.auth, None);
    assert_eq!(got.body["started_by"], me.body["id"], "{:?}", me.body);
    let refusal = messages(&f, &f.auth, &ws, &c2)
        .into_iter()
        .find(|m| m["outcome"] == "refused")
        .unwrap();
    assert_eq!(refusal["reason"], "agent message chain too deep (4)");
    // The last run's harness saw the refusal.
    f.eventually(Duration::from_secs(20), "the refusal in the harness", || {
        sh(&f, &f.auth, &ws, &c2, "cat /tmp/hop-* 2>/dev/null")
            .1
            .contains("refused: agent message chain too deep (4)")
    });
}
