//! Files by role for the harness user, whose home is `/workspace` (S10), and "credentials inside
//! sandbox" (S11): a login made inside the sandbox (its credential file written by a command there) marks
//! the agent, in its JSON and in the list, until the file is gone; a file holding only placeholders (as the
//! server writes them) does not.

use std::time::Duration;

use serde_json::{Value, json};

use super::fixture::Fixture;

const REAL: &str = r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-inside","refreshToken":"sk-ant-ort01-inside","expiresAt":1}}"#;

/// The agent as its admin sees it, alone and in the list.
fn agent_views(f: &Fixture) -> (Value, Value) {
    let one = f.server.call("GET", &f.path(""), &f.auth, None);
    assert_eq!(one.status, 200, "{:?}", one.body);
    let list = f.server.call(
        "GET",
        &format!("/api/v1/workspaces/{}/agents", f.ws),
        &f.auth,
        None,
    );
    assert_eq!(list.status, 200, "{:?}", list.body);
    let listed = list.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == f.agent.as_str())
        .unwrap()
        .clone();
    (one.body, listed)
}

fn marked_with(f: &Fixture, files: &[&str]) {
    f.eventually(
        Duration::from_secs(20),
        &format!("the agent shows credentials at {files:?}"),
        || {
            let (one, listed) = agent_views(f);
            let want: Vec<Value> = files.iter().map(|p| json!(p)).collect();
            one["credentials_inside"] == json!(!files.is_empty())
                && listed["credentials_inside"] == json!(!files.is_empty())
                && one["credentials_files"] == json!(want)
                && listed["credentials_files"] == json!(want)
        },
    );
}

// covers: S10
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn a_viewer_cannot_read_the_harness_users_credentials_by_any_path() {
    let f = Fixture::new();
    // The harness (user `agent`, HOME=/workspace, CODEX_HOME=/workspace/.codex) logged in; then the agent
    // planted links to the files, relative ones and ones that climb with `..`.
    f.sh(&format!(
        "mkdir -p /workspace/.claude /workspace/.codex /workspace/deep/er /tmp/a/b \
         && printf '%s' '{REAL}' > /workspace/.claude/.credentials.json \
         && printf '%s' '{{\"OPENAI_API_KEY\":\"sk-proj-inside\"}}' > /workspace/.codex/auth.json \
         && printf '%s' '{{\"primaryApiKey\":\"sk-ant-api03-inside\"}}' > /workspace/.claude.json \
         && ln -s .claude/.credentials.json /workspace/notes.md \
         && ln -s ../../.codex/auth.json /workspace/deep/er/readme \
         && ln -s ../../../workspace/.claude /tmp/a/b/cfg \
         && ln -s /workspace/.codex /workspace/cx \
         && ln -s /workspace/notes.md /tmp/chain \
         && ln -s /workspace/deep/er/../../.claude.json /tmp/settings \
         && echo fine > /workspace/plain.txt"
    ));
    let viewer = f.grant("vic", "viewer");
    let operator = f.grant("opal", "operator");
    let read = |auth, path: &str| {
        f.server
            .call("GET", &f.path(&format!("/files/content?path={path}")), auth, None)
    };
    for path in [
        "/workspace/.claude/.credentials.json",
        "/workspace/.codex/auth.json",
        "/workspace/.claude.json",
        "/workspace/notes.md",
        "/workspace/deep/er/readme",
        "/tmp/a/b/cfg/.credentials.json",
        "/workspace/cx/auth.json",
        "/tmp/chain",
        "/tmp/settings",
        "/workspace//.claude/./.credentials.json",
        "/.agenthold/boot",
    ] {
        let r = read(&viewer, path);
        assert_eq!(r.status, 403, "viewer read {path}: {:?}", r.body);
    }
    // `..` in the request itself is refused outright.
    assert_eq!(
        read(&viewer, "/workspace/deep/../.claude/.credentials.json").status,
        400
    );
    assert_eq!(read(&viewer, "/workspace/plain.txt").status, 200);
    for path in ["/workspace/notes.md", "/tmp/a/b/cfg/.credentials.json"] {
        let r = read(&operator, path);
        assert_eq!(r.status, 200, "operator read {path}");
        assert_eq!(r.raw, REAL.as_bytes());
    }
}

// covers: S11
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn a_login_made_inside_the_sandbox_marks_the_agent_until_it_is_gone() {
    let f = Fixture::new();
    let (one, listed) = agent_views(&f);
    assert_eq!(one["credentials_inside"], false);
    assert_eq!(listed["credentials_inside"], false);
    assert_eq!(one["credentials_files"], json!([]));

    // A file with placeholders only (as the server writes them for an attached login) does not count.
    let ph = "agenthold-placeholder-0123456789abcdef0123456789abcdef";
    f.sh(&format!(
        "mkdir -p /workspace/.codex && printf '%s' '{{\"tokens\":{{\"access_token\":\"{ph}\",\"refresh_token\":\"{ph}\",\"id_token\":\"x.y.z\"}}}}' \
         > /workspace/.codex/auth.json"
    ));
    // `claude /login` inside the sandbox: the harness writes its credential file.
    f.sh(&format!(
        "mkdir -p /workspace/.claude && printf '%s' '{REAL}' > /workspace/.claude/.credentials.json"
    ));
    marked_with(&f, &["/workspace/.claude/.credentials.json"]);

    // A viewer sees the mark but not the file, also not through a link planted next to it.
    let viewer = f.grant("vic", "viewer");
    let seen = f.server.call("GET", &f.path(""), &viewer, None);
    assert_eq!(seen.body["credentials_inside"], true);
    f.sh("ln -s /workspace/.claude/.credentials.json /workspace/todo.txt");
    for path in ["/workspace/.claude/.credentials.json", "/workspace/todo.txt"] {
        let r = f.server.call(
            "GET",
            &f.path(&format!("/files/content?path={path}")),
            &viewer,
            None,
        );
        assert_eq!(r.status, 403, "{path}");
    }

    // A real token in the codex file and an API key in Claude's settings count too.
    f.sh(&format!(
        "printf '%s' '{{\"tokens\":{{\"access_token\":\"eyJreal\",\"refresh_token\":\"{ph}\"}}}}' > /workspace/.codex/auth.json \
         && printf '%s' '{{\"primaryApiKey\":\"sk-ant-api03-x\"}}' > /root/.claude.json"
    ));
    marked_with(
        &f,
        &[
            "/workspace/.claude/.credentials.json",
            "/workspace/.codex/auth.json",
            "/root/.claude.json",
        ],
    );

    // Logged out (files removed): the mark goes.
    f.sh("rm -f /workspace/.claude/.credentials.json /workspace/.codex/auth.json /root/.claude.json");
    marked_with(&f, &[]);

    // The audit log has both changes.
    let audit = f.server.call(
        "GET",
        &format!("/api/v1/workspaces/{}/audit?limit=500", f.ws),
        &f.auth,
        None,
    );
    let actions: Vec<&str> = audit.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert!(actions.contains(&"credentials inside sandbox"), "{actions:?}");
    assert!(actions.contains(&"credentials gone from sandbox"), "{actions:?}");
}
