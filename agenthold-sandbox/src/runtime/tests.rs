//! The `Runtime`'s own logic on a [`FakeSandbox`]: no Docker, no root, no network namespace. Create and its
//! undo, the one check of a spec, the warm pool, restore after a restart, policies and commands.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agenthold_core::policy::{DenyReason, Destination, Verdict};
use agenthold_core::sandbox::{ExecChunk, ExecOutput, ExecRequest, SandboxSpec, SandboxState};
use agenthold_core::secret::{SecretRule, SecretSpec};
use agenthold_core::{AgentId, Config, ErrorKind, NetworkPolicy, PolicyMode};

use super::*;
use crate::fake::{Call, FakeSandbox, Op};

async fn runtime_on(dir: &Path, fake: &Arc<FakeSandbox>, warm: usize) -> Runtime {
    let config = Config {
        data_dir: dir.to_path_buf(),
        ..Config::default()
    };
    Runtime::builder()
        .config(config)
        .sandbox(Arc::clone(fake) as Arc<dyn Sandbox>)
        .dns_upstream("127.0.0.1:53".parse().unwrap())
        .warm_pool(warm)
        .build()
        .await
        .unwrap()
}

fn allow(hosts: &[&str]) -> NetworkPolicy {
    NetworkPolicy::parse(PolicyMode::Allowlist, hosts).unwrap()
}

fn secret() -> SecretSpec {
    let rule = SecretRule::header(&["api.example.test"], "authorization", "Bearer {{.Value}}").unwrap();
    SecretSpec::new("tok", "sk-test-1".into(), Some("TOKEN"), vec![rule]).unwrap()
}

fn full_spec() -> SandboxSpec {
    SandboxSpec {
        policy: allow(&["example.com"]),
        secrets: vec![secret()],
        env: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
        ..SandboxSpec::default()
    }
}

fn decide(runtime: &Runtime, agent: &AgentId, host: &str) -> Verdict {
    runtime
        .policy
        .decide(agent, &Destination::name(host.to_owned(), 443))
}

fn has_secrets(runtime: &Runtime, agent: &AgentId) -> bool {
    runtime.injector.has_secrets(agent)
}

async fn record(runtime: &Runtime, agent: &AgentId) -> Option<AgentRecord> {
    records::RECORDS
        .load(runtime.store.as_ref(), agent)
        .await
        .unwrap()
}

async fn wait_ready(runtime: &Runtime, n: usize) {
    for _ in 0..200 {
        if runtime.warm_pool_ready() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the warm pool never had {n} ready (has {})",
        runtime.warm_pool_ready()
    );
}

/// A create gives the sandbox runtime only the container half, with the secret's placeholder in its
/// environment; the gateway's tables get the policy and the secret; a remove takes everything back.
// covers: C2
#[tokio::test]
async fn create_splits_the_spec_and_remove_forgets_everything() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let runtime = runtime_on(dir.path(), &fake, 0).await;
    let agent = runtime.create_sandbox(full_spec()).await.unwrap();

    let spec = fake.spec(&agent).expect("created in the sandbox runtime");
    assert_eq!(spec.env().get("A").map(String::as_str), Some("1"));
    let placeholder = spec
        .env()
        .get("TOKEN")
        .expect("the placeholder is in the environment");
    assert!(
        !placeholder.contains("sk-test-1"),
        "the value never reaches the sandbox"
    );
    assert_eq!(decide(&runtime, &agent, "example.com"), Verdict::Allowed);
    assert_eq!(
        decide(&runtime, &agent, "example.org"),
        Verdict::Denied(DenyReason::NotInAllowlist)
    );
    assert!(has_secrets(&runtime, &agent));
    let stored = record(&runtime, &agent).await.expect("recorded");
    assert_eq!(stored.spec.policy, allow(&["example.com"]));
    assert_eq!(stored.secrets.len(), 1);
    assert_eq!(runtime.sandboxes().await.unwrap(), vec![agent.clone()]);

    runtime.remove(&agent).await.unwrap();
    assert!(fake.agents().is_empty());
    assert_eq!(
        decide(&runtime, &agent, "example.com"),
        Verdict::Denied(DenyReason::UnknownAgent)
    );
    assert!(!has_secrets(&runtime, &agent));
    assert!(record(&runtime, &agent).await.is_none());
    runtime.shutdown().await;
}

/// A create the sandbox runtime fails leaves no record, no policy and no secret behind.
#[tokio::test]
async fn a_failed_create_is_undone() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let runtime = runtime_on(dir.path(), &fake, 0).await;
    fake.fail_once(Op::Create);
    let agent = AgentId::new("doomed").unwrap();
    let err = runtime
        .create_sandbox_with_id(&agent, full_spec())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Upstream, "{err}");
    assert_eq!(
        fake.calls_of(Op::Create).len(),
        1,
        "the sandbox runtime was asked"
    );
    assert!(record(&runtime, &agent).await.is_none());
    assert_eq!(
        decide(&runtime, &agent, "example.com"),
        Verdict::Denied(DenyReason::UnknownAgent)
    );
    assert!(!has_secrets(&runtime, &agent));
    assert!(runtime.sandboxes().await.unwrap().is_empty());

    // The same id works once the sandbox runtime does; a second create of it is refused.
    runtime.create_sandbox_with_id(&agent, full_spec()).await.unwrap();
    let again = runtime
        .create_sandbox_with_id(&agent, SandboxSpec::default())
        .await
        .unwrap_err();
    assert_eq!(again.kind(), ErrorKind::BadInput);
    assert!(
        has_secrets(&runtime, &agent),
        "a refused create leaves the existing sandbox alone"
    );
    runtime.shutdown().await;
}

/// A spec is checked once, where it enters: an invalid one never reaches the sandbox runtime, whichever
/// create it came through.
// covers: S15
#[tokio::test]
async fn an_invalid_spec_never_reaches_the_sandbox_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let runtime = runtime_on(dir.path(), &fake, 1).await;
    wait_ready(&runtime, 1).await;
    fake.clear_calls();
    let bad = [
        SandboxSpec {
            labels: BTreeMap::from([("agenthold.agent".to_owned(), "x".to_owned())]),
            ..SandboxSpec::default()
        },
        SandboxSpec {
            cpus: Some(0.0),
            ..SandboxSpec::default()
        },
        SandboxSpec {
            env: BTreeMap::from([("HTTPS_PROXY".to_owned(), "http://evil".to_owned())]),
            ..SandboxSpec::default()
        },
        SandboxSpec {
            secrets: vec![secret(), secret()],
            ..SandboxSpec::default()
        },
    ];
    for spec in bad {
        let err = runtime.create_sandbox(spec.clone()).await.unwrap_err();
        assert!(err.kind().is_bad_input(), "{err}: {:?}", err.kind());
        let err = runtime
            .create_sandbox_with_id(&AgentId::random(), spec)
            .await
            .unwrap_err();
        assert!(err.kind().is_bad_input(), "{err}: {:?}", err.kind());
    }
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    assert_eq!(runtime.warm_pool_ready(), 1, "no pooled sandbox was handed out");
    runtime.shutdown().await;
}

/// The warm pool works on any sandbox runtime: pooled sandboxes refuse everything until handed out, a
/// plain spec takes one (with its policy); any other spec needs a runtime that can reconfigure (the fake
/// cannot), else it is created afresh; shutdown removes the rest.
#[tokio::test]
async fn the_warm_pool_hands_out_plain_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let runtime = runtime_on(dir.path(), &fake, 1).await;
    wait_ready(&runtime, 1).await;
    let pooled = fake.agents();
    assert_eq!(pooled.len(), 1);
    let pooled = pooled[0].clone();
    assert_eq!(
        decide(&runtime, &pooled, "example.com"),
        Verdict::Denied(DenyReason::NotInAllowlist),
        "a pooled sandbox refuses everything"
    );
    assert!(
        runtime.sandboxes().await.unwrap().is_empty(),
        "pooled sandboxes are not listed"
    );

    let spec = SandboxSpec {
        policy: allow(&["example.com"]),
        ..SandboxSpec::default()
    };
    let agent = runtime.create_sandbox(spec).await.unwrap();
    assert_eq!(agent, pooled, "the plain spec took the pooled sandbox");
    assert_eq!(decide(&runtime, &agent, "example.com"), Verdict::Allowed);
    assert!(!record(&runtime, &agent).await.unwrap().pooled);
    assert_eq!(runtime.sandboxes().await.unwrap(), vec![agent.clone()]);
    wait_ready(&runtime, 1).await;

    // Not plain, on a sandbox runtime that cannot reconfigure: the pooled sandbox it was offered is
    // removed (it may carry part of the spec), the spec is created afresh, and later specs leave the pool
    // alone.
    let offered = fake.agents().into_iter().find(|a| *a != agent).unwrap();
    let creates = fake.calls_of(Op::Create).len();
    let other = runtime.create_sandbox(full_spec()).await.unwrap();
    assert_ne!(other, offered);
    assert!(
        fake.calls().contains(&Call::Remove {
            agent: offered.clone(),
            keep_volume: false
        }),
        "a pooled sandbox whose hand-out failed is removed, never put back"
    );
    assert!(record(&runtime, &offered).await.is_none());
    assert!(!has_secrets(&runtime, &offered));
    assert!(has_secrets(&runtime, &other));
    wait_ready(&runtime, 1).await;
    assert_eq!(
        fake.calls_of(Op::Create).len(),
        creates + 2,
        "afresh, and the refill"
    );
    let third = runtime.create_sandbox(full_spec()).await.unwrap();
    assert_eq!(runtime.warm_pool_ready(), 1, "not offered again");
    assert_eq!(fake.calls_of(Op::Create).len(), creates + 3);

    let refill = fake
        .agents()
        .into_iter()
        .find(|a| *a != agent && *a != other && *a != third)
        .unwrap();
    runtime.shutdown().await;
    assert!(
        fake.calls().contains(&Call::Remove {
            agent: refill.clone(),
            keep_volume: false
        }),
        "shutdown removes the pool"
    );
    assert_eq!(fake.agents().len(), 3, "handed-out sandboxes stay");
}

/// A runtime started again on the same store restores policies and secrets from its records, hands the
/// sandbox runtime the agents it knows to reconcile, and removes pooled sandboxes never handed out.
// covers: S12
#[tokio::test]
async fn a_restarted_runtime_restores_its_agents() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let (agent, placeholder, pooled) = {
        let runtime = runtime_on(dir.path(), &fake, 1).await;
        wait_ready(&runtime, 1).await;
        let agent = runtime.create_sandbox(full_spec()).await.unwrap();
        // The fake cannot reconfigure: the spec was created afresh, and the pool refilled.
        wait_ready(&runtime, 1).await;
        let pooled = fake.agents().into_iter().find(|a| *a != agent).unwrap();
        let placeholder = fake.spec(&agent).unwrap().env()["TOKEN"].clone();
        // Dropped without a shutdown, as a killed process would be: the pool is not drained.
        (agent, placeholder, pooled)
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    fake.clear_calls();

    let runtime = runtime_on(dir.path(), &fake, 0).await;
    let reconciled = fake
        .calls()
        .into_iter()
        .find_map(|c| match c {
            Call::Reconcile(agents) => Some(agents),
            _ => None,
        })
        .expect("the sandbox runtime was asked to reconcile");
    assert!(
        reconciled.contains(&agent) && reconciled.contains(&pooled),
        "{reconciled:?}"
    );
    assert_eq!(decide(&runtime, &agent, "example.com"), Verdict::Allowed);
    assert!(has_secrets(&runtime, &agent));
    let table = runtime.secrets().unwrap();
    let restored: Vec<_> = table.placeholders(&agent);
    assert!(
        restored.iter().any(|p| p.placeholder == placeholder),
        "the sandbox keeps its placeholder: {restored:?}"
    );
    assert_eq!(runtime.sandboxes().await.unwrap(), vec![agent.clone()]);
    assert!(
        fake.calls().contains(&Call::Remove {
            agent: pooled.clone(),
            keep_volume: false
        }),
        "the leftover pooled sandbox is removed"
    );
    assert!(record(&runtime, &pooled).await.is_none());
    assert_eq!(fake.agents(), vec![agent]);
    runtime.shutdown().await;
}

/// `set_policy` replaces the policy in the gateway's table and in the record; unknown agents are not
/// found; a custom policy without a table makes it unavailable (and disables the pool).
// covers: E8
#[tokio::test]
async fn set_policy_applies_at_once_and_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let runtime = runtime_on(dir.path(), &fake, 0).await;
    let agent = runtime.create_sandbox(SandboxSpec::default()).await.unwrap();
    assert_eq!(decide(&runtime, &agent, "example.org"), Verdict::Allowed);
    runtime.set_policy(&agent, allow(&["example.com"])).await.unwrap();
    assert_eq!(
        decide(&runtime, &agent, "example.org"),
        Verdict::Denied(DenyReason::NotInAllowlist)
    );
    assert_eq!(
        record(&runtime, &agent).await.unwrap().spec.policy,
        allow(&["example.com"])
    );
    let err = runtime
        .set_policy(&AgentId::new("nobody").unwrap(), NetworkPolicy::open())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    runtime.shutdown().await;

    struct Mine;
    impl EgressPolicy for Mine {
        fn decide(&self, _: &AgentId, _: &Destination) -> Verdict {
            Verdict::Allowed
        }
        fn may_resolve(&self, _: &AgentId, _: &str) -> Verdict {
            Verdict::Allowed
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder()
        .config(Config {
            data_dir: dir.path().to_path_buf(),
            ..Config::default()
        })
        .sandbox(Arc::clone(&fake) as Arc<dyn Sandbox>)
        .policy(Arc::new(Mine))
        .dns_upstream("127.0.0.1:53".parse().unwrap())
        .warm_pool(2)
        .build()
        .await
        .unwrap();
    let agent = runtime.create_sandbox(SandboxSpec::default()).await.unwrap();
    let err = runtime
        .set_policy(&agent, NetworkPolicy::open())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(runtime.warm_pool_ready(), 0, "no pool without a per-agent table");
    runtime.shutdown().await;
}

/// Commands, streams, cancels and files go to the sandbox runtime, whatever it is.
// covers: P1
#[tokio::test]
async fn commands_and_files_go_through_the_trait() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSandbox::new());
    let runtime = runtime_on(dir.path(), &fake, 0).await;
    let agent = runtime.create_sandbox(SandboxSpec::default()).await.unwrap();

    fake.push_output(ExecOutput {
        exit_code: 0,
        stdout: b"hello\n".to_vec(),
        stderr: Vec::new(),
    });
    let out = runtime.exec(&agent, &["echo", "hello"]).await.unwrap();
    assert_eq!(out.stdout, b"hello\n");

    fake.push_exec(vec![
        ExecChunk::Stdout(b"1".to_vec()),
        ExecChunk::Stderr(b"2".to_vec()),
        ExecChunk::Exit(7),
    ]);
    let mut stream = runtime.exec_stream(&agent, ExecRequest::default()).await.unwrap();
    let mut got = Vec::new();
    while let Some(chunk) = stream.next().await {
        got.push(chunk.unwrap());
    }
    assert_eq!(
        got,
        vec![
            ExecChunk::Stdout(b"1".to_vec()),
            ExecChunk::Stderr(b"2".to_vec()),
            ExecChunk::Exit(7)
        ]
    );
    runtime.cancel_exec(&agent, stream.id()).await.unwrap();
    assert!(fake.calls().contains(&Call::CancelExec {
        agent: agent.clone(),
        exec_id: stream.id().to_owned()
    }));

    runtime.write_file(&agent, "/workspace/a", b"data").await.unwrap();
    assert_eq!(runtime.read_file(&agent, "/workspace/a").await.unwrap(), b"data");
    runtime.stop(&agent).await.unwrap();
    assert_eq!(
        runtime.inspect(&agent).await.unwrap().state,
        SandboxState::Stopped
    );
    runtime.start(&agent).await.unwrap();
    assert_eq!(fake.sandbox_state(&agent), Some(SandboxState::Running));

    fake.fail(Op::ExecStream);
    let err = runtime.exec(&agent, &["true"]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Upstream);
    let err = runtime
        .exec(&AgentId::new("ghost").unwrap(), &["true"])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Upstream, "told to fail comes first: {err}");
    fake.heal(Op::ExecStream);
    let err = runtime
        .exec(&AgentId::new("ghost").unwrap(), &["true"])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    runtime.shutdown().await;
}
