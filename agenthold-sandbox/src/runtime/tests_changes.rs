//! The `Runtime`'s surface for a server on a [`FakeSandbox`]: the request log resumed by `seq`, secrets
//! changed on a live agent (and kept across a restart), files checked before any runtime sees them,
//! terminals and exec liveness.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use agenthold_core::policy::Verdict;
use agenthold_core::sandbox::{ExecChunk, ExecRequest, SandboxSpec, TerminalEvent, TerminalRequest};
use agenthold_core::secret::{InjectOutcome, RequestHead, SecretRule, SecretSpec};
use agenthold_core::{AgentId, Config, ErrorKind};
use agenthold_egress::log::{LogEntry, LogKind};

use super::*;
use crate::fake::{Call, FakeSandbox, Op};

async fn runtime_on(dir: &Path, fake: &Arc<FakeSandbox>) -> Runtime {
    let config = Config {
        data_dir: dir.to_path_buf(),
        ..Config::default()
    };
    Runtime::builder()
        .config(config)
        .sandbox(Arc::clone(fake) as Arc<dyn Sandbox>)
        .dns_upstream("127.0.0.1:53".parse().unwrap())
        .build()
        .await
        .unwrap()
}

fn secret(name: &str, value: &str, host: &str, env: Option<&str>) -> SecretSpec {
    let rule = SecretRule::header(&[host], "authorization", "Bearer {{.Value}}").unwrap();
    SecretSpec::new(name, value.into(), env, vec![rule]).unwrap()
}

/// What the gateway's injector does to a request for `host` carrying nothing.
fn injected(runtime: &Runtime, agent: &AgentId, host: &str) -> Option<String> {
    if !runtime.injector.intercepts(agent, host) {
        return None;
    }
    let mut head = RequestHead {
        method: "GET".into(),
        host: host.into(),
        path_and_query: "/".into(),
        headers: Vec::new(),
    };
    match runtime.injector.rewrite(agent, Some(host), &mut head) {
        InjectOutcome::Forward { injected, .. } if !injected.is_empty() => head
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned()),
        _ => None,
    }
}

/// The environment of the last command the fake was asked to run.
fn last_exec_env(fake: &FakeSandbox) -> std::collections::BTreeMap<String, String> {
    match fake.calls_of(Op::ExecStream).pop() {
        Some(Call::ExecStream { request, .. }) => request.env,
        other => panic!("no exec: {other:?}"),
    }
}

// covers: E16 (a reader resumes the request log from the last seq it saw)
#[tokio::test]
async fn the_request_log_resumes_after_a_seq_and_streams_live() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let runtime = runtime_on(dir.path(), &fake).await;
    let (a, b) = (AgentId::new("a").unwrap(), AgentId::new("b").unwrap());
    let log = runtime.gateway().log();
    let mut live = runtime.subscribe_requests();
    for agent in [&a, &b, &a] {
        log.record(LogEntry::new(agent, LogKind::Dns, Verdict::Allowed));
    }
    let seqs: Vec<u64> = runtime.request_log(&a).iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 3]);
    let after: Vec<u64> = runtime.request_log_since(&a, 1).iter().map(|e| e.seq).collect();
    assert_eq!(after, [3]);
    assert!(runtime.request_log_since(&a, 3).is_empty());
    for seq in 1..=3 {
        assert_eq!(live.recv().await.unwrap().seq, seq);
    }
    runtime.shutdown().await;
}

// covers: E12, E13 (secrets replaced on a live agent: placeholders kept by name, injection follows at once)
#[tokio::test]
async fn secrets_change_on_a_live_agent_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let runtime = runtime_on(dir.path(), &fake).await;
    let spec = SandboxSpec {
        secrets: vec![secret("first", "v1", "one.example.test", Some("FIRST"))],
        env: [("OWN".to_owned(), "mine".to_owned())].into(),
        ..SandboxSpec::default()
    };
    let agent = runtime.create_sandbox(spec).await.unwrap();
    let first = runtime.agent_secrets(&agent).await.unwrap();
    assert_eq!(first.len(), 1);
    let first_placeholder = first[0].placeholder.clone();

    // Attach a second secret: the first keeps its placeholder, the second is injected at once and its
    // variable reaches the next command.
    let placeholders = runtime
        .set_secrets(
            &agent,
            vec![
                secret("first", "v1b", "one.example.test", Some("FIRST")),
                secret("second", "v2", "two.example.test", Some("SECOND")),
            ],
        )
        .await
        .unwrap();
    assert_eq!(placeholders.len(), 2);
    assert_eq!(placeholders[0].placeholder, first_placeholder);
    assert_ne!(placeholders[1].placeholder, first_placeholder);
    assert_eq!(runtime.agent_secrets(&agent).await.unwrap(), placeholders);
    assert_eq!(
        injected(&runtime, &agent, "one.example.test").as_deref(),
        Some("Bearer v1b")
    );
    assert_eq!(
        injected(&runtime, &agent, "two.example.test").as_deref(),
        Some("Bearer v2")
    );
    runtime.exec(&agent, &["env"]).await.unwrap();
    let env = last_exec_env(&fake);
    assert_eq!(env.get("SECOND"), Some(&placeholders[1].placeholder));
    assert_eq!(env.get("FIRST"), Some(&first_placeholder));
    // A variable the request sets itself is left alone.
    let request = ExecRequest {
        argv: vec!["env".into()],
        env: [("SECOND".to_owned(), "mine".to_owned())].into(),
        ..ExecRequest::default()
    };
    runtime.exec_request(&agent, request).await.unwrap();
    assert_eq!(
        last_exec_env(&fake).get("SECOND").map(String::as_str),
        Some("mine")
    );
    let stored = record(&runtime, &agent).await;
    let on_disk =
        serde_json::to_string(&stored.secrets.iter().map(|s| &s.sealed).collect::<Vec<_>>()).unwrap();
    assert!(!on_disk.contains("v2"), "E10: sealed, not in clear");

    // A restart on the same data directory has the same set, with the same placeholders.
    runtime.shutdown().await;
    drop(runtime);
    let runtime = runtime_on(dir.path(), &fake).await;
    assert_eq!(runtime.agent_secrets(&agent).await.unwrap(), placeholders);
    assert_eq!(
        injected(&runtime, &agent, "two.example.test").as_deref(),
        Some("Bearer v2")
    );

    // Detach all: nothing is injected, the record says so, a later attach gets a fresh placeholder.
    assert!(runtime.set_secrets(&agent, Vec::new()).await.unwrap().is_empty());
    assert_eq!(injected(&runtime, &agent, "one.example.test"), None);
    assert!(runtime.agent_secrets(&agent).await.unwrap().is_empty());
    let again = runtime
        .set_secrets(
            &agent,
            vec![secret("first", "v1", "one.example.test", Some("FIRST"))],
        )
        .await
        .unwrap();
    assert_ne!(again[0].placeholder, first_placeholder);
    runtime.shutdown().await;
}

#[tokio::test]
async fn bad_secret_changes_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let runtime = runtime_on(dir.path(), &fake).await;
    let spec = SandboxSpec {
        secrets: vec![secret("first", "v1", "one.example.test", Some("FIRST"))],
        env: [("OWN".to_owned(), "mine".to_owned())].into(),
        ..SandboxSpec::default()
    };
    let agent = runtime.create_sandbox(spec).await.unwrap();
    let before = runtime.agent_secrets(&agent).await.unwrap();
    let s = |name: &str, env: Option<&str>| secret(name, "v", "x.example.test", env);
    for (secrets, kind) in [
        (vec![s("a", Some("OWN"))], ErrorKind::BadInput),
        (vec![s("a", Some("HTTPS_PROXY"))], ErrorKind::BadInput),
        (vec![s("a", None), s("a", None)], ErrorKind::Secret),
        (vec![s("a", Some("K")), s("b", Some("K"))], ErrorKind::Secret),
        (
            vec![SecretSpec {
                rules: Vec::new(),
                ..s("a", None)
            }],
            ErrorKind::Secret,
        ),
    ] {
        let err = runtime.set_secrets(&agent, secrets).await.unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
    }
    assert_eq!(runtime.agent_secrets(&agent).await.unwrap(), before);
    assert_eq!(
        injected(&runtime, &agent, "one.example.test").as_deref(),
        Some("Bearer v1")
    );
    // The variable a secret had at creation is free for another secret.
    let moved = runtime
        .set_secrets(&agent, vec![s("other", Some("FIRST"))])
        .await
        .unwrap();
    assert_eq!(moved[0].env.as_deref(), Some("FIRST"));
    let ghost = AgentId::new("ghost").unwrap();
    let err = runtime.set_secrets(&ghost, Vec::new()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(
        runtime.agent_secrets(&ghost).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    runtime.shutdown().await;
}

/// An injector of the platform's own, with no per-agent table.
struct OwnInjector;

impl agenthold_core::SecretInjector for OwnInjector {
    fn has_secrets(&self, _: &AgentId) -> bool {
        false
    }
    fn intercepts(&self, _: &AgentId, _: &str) -> bool {
        false
    }
    fn rewrite(&self, _: &AgentId, _: Option<&str>, _: &mut RequestHead) -> InjectOutcome {
        InjectOutcome::Forward {
            injected: Vec::new(),
            leaked: Vec::new(),
        }
    }
}

#[tokio::test]
async fn a_custom_injector_without_a_table_cannot_take_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    let runtime = Runtime::builder()
        .config(config)
        .sandbox(Arc::clone(&fake) as Arc<dyn Sandbox>)
        .injector(Arc::new(OwnInjector))
        .dns_upstream("127.0.0.1:53".parse().unwrap())
        .build()
        .await
        .unwrap();
    let agent = runtime.create_sandbox(SandboxSpec::default()).await.unwrap();
    let err = runtime.set_secrets(&agent, Vec::new()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    runtime.shutdown().await;
}

// covers: S10 (paths are checked before any sandbox runtime sees them; symlinks resolve)
#[tokio::test]
async fn files_terminals_and_liveness_go_through_the_sandbox_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let runtime = runtime_on(dir.path(), &fake).await;
    let spec = SandboxSpec {
        secrets: vec![secret("tok", "v", "x.example.test", Some("TOKEN"))],
        ..SandboxSpec::default()
    };
    let agent = runtime.create_sandbox(spec).await.unwrap();
    runtime
        .write_file(&agent, "/root/.codex/auth.json", b"{}")
        .await
        .unwrap();
    fake.symlink(&agent, "/workspace/innocent", "/root/.codex")
        .unwrap();
    assert_eq!(
        runtime
            .resolve_path(&agent, "/workspace//innocent/auth.json")
            .await
            .unwrap(),
        "/root/.codex/auth.json"
    );
    assert_eq!(
        runtime.list_dir(&agent, "/root/").await.unwrap()[0].name,
        ".codex"
    );
    fake.clear_calls();
    for bad in ["relative", "/workspace/../root", "/a\0"] {
        for err in [
            runtime.list_dir(&agent, bad).await.unwrap_err(),
            runtime.remove_path(&agent, bad).await.unwrap_err(),
            runtime.resolve_path(&agent, bad).await.unwrap_err(),
        ] {
            assert_eq!(err.kind(), ErrorKind::BadInput, "{bad:?}: {err}");
        }
    }
    assert!(
        fake.calls().is_empty(),
        "refused before the sandbox runtime: {:?}",
        fake.calls()
    );
    runtime.remove_path(&agent, "/root/.codex").await.unwrap();
    assert!(runtime.list_dir(&agent, "/root").await.unwrap().is_empty());

    // A terminal gets the secrets' variables too, and its id is an exec id.
    let mut term = runtime
        .open_terminal(&agent, TerminalRequest::default())
        .await
        .unwrap();
    let Some(Call::OpenTerminal { request, .. }) = fake.calls_of(Op::OpenTerminal).pop() else {
        panic!("no terminal opened");
    };
    assert!(request.env["TOKEN"].starts_with("agenthold-placeholder-"));
    term.write("hi").await.unwrap();
    assert_eq!(
        term.next().await.unwrap().unwrap(),
        TerminalEvent::Output("hi".into())
    );
    assert!(runtime.exec_running(&agent, term.id()).await.unwrap());
    let id = term.id().to_owned();
    drop(term);
    assert!(!runtime.exec_running(&agent, &id).await.unwrap());
    fake.push_exec(vec![ExecChunk::Stdout(b"long".to_vec())]);
    let stream = runtime.exec_stream(&agent, ExecRequest::default()).await.unwrap();
    assert!(runtime.exec_running(&agent, stream.id()).await.unwrap());
    runtime.cancel_exec(&agent, stream.id()).await.unwrap();
    assert!(!runtime.exec_running(&agent, stream.id()).await.unwrap());
    runtime.shutdown().await;
}

async fn record(runtime: &Runtime, agent: &AgentId) -> records::AgentRecord {
    records::RECORDS
        .load(runtime.store.as_ref(), agent)
        .await
        .unwrap()
        .unwrap()
}
