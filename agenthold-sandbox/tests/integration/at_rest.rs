//! Secrets at rest (E10, S15), attacked by a store writer who has no master key: the runtime's records
//! are edited between two runs (a rule pointed at another host, sealed values moved between secrets or
//! agents, an old-format record planted again) and the next runtime on the data directory must refuse to
//! use the value, naming the secret. No Docker: a `FakeSandbox` stands in for the engine.

use std::path::Path;
use std::sync::Arc;

use agenthold_core::sandbox::SandboxSpec;
use agenthold_core::secret::{InjectOutcome, RequestHead, SecretInjector, SecretRule, SecretSpec};
use agenthold_core::store::RedbStore;
use agenthold_core::{AgentId, Config, Store};
use agenthold_sandbox::Runtime;
use agenthold_sandbox::fake::FakeSandbox;
use base64::Engine as _;
use serde_json::Value;

/// The record of agent `legacy` as agenthold wrote it before rules were bound into the AAD (version 1,
/// AAD = the secret id), sealed under [`FIXTURE_KEY`]: secret `api-key` = `sk-legacy` for `allowed.test`.
const LEGACY_RECORD: &str = r#"{"pooled":false,"secrets":[{"env":"API_KEY","name":"api-key","placeholder":"agenthold-placeholder-6pvob5h4u7tcfmlxyaohvjbpk7qyylit","rules":[{"header":"authorization","hosts":["allowed.test"],"kind":"header","template":"Bearer {{.Value}}"}],"sealed":"AZFzPEkE/zVCNS8xTznf8DgBX7AhWw92ey9fo5eDo12LpvthqgTy42Bnl5Bt8gS68dM="}],"spec":{"cpus":null,"env":{"API_KEY":"agenthold-placeholder-6pvob5h4u7tcfmlxyaohvjbpk7qyylit"},"image":"agenthold/dev:latest","labels":{},"memory_bytes":null,"pids":null,"policy":{"entries":[],"mode":"open"},"runtime":null}}"#;

/// The master key the fixture was sealed under (written as the data directory's key file).
const FIXTURE_KEY: [u8; 32] = [0x42; 32];

/// A runtime on `dir` with no engine; its store is the data directory's redb.
async fn runtime(dir: &Path) -> agenthold_sandbox::Result<Runtime> {
    let config = Config {
        data_dir: dir.to_path_buf(),
        ..Config::default()
    };
    Runtime::builder()
        .config(config)
        .sandbox(Arc::new(FakeSandbox::new()))
        .dns_upstream("127.0.0.1:53".parse().unwrap())
        .build()
        .await
}

/// A data directory with the fixture's master key.
fn data_dir() -> tempfile::TempDir {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = tempfile::Builder::new().prefix("ah-rest-").tempdir().unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.path().join("master.key"))
        .unwrap();
    std::io::Write::write_all(&mut file, &FIXTURE_KEY).unwrap();
    dir
}

fn rule(host: &str, header: &str, template: &str) -> SecretRule {
    SecretRule::header(&[host], header, template).unwrap()
}

fn secret(name: &str, value: &str, host: &str) -> SecretSpec {
    SecretSpec::new(
        name,
        value.into(),
        Some(&name.to_uppercase().replace('-', "_")),
        vec![rule(host, "authorization", "Bearer {{.Value}}")],
    )
    .unwrap()
}

/// Create `agent` with `secrets` in a fresh runtime on `dir`, then stop that runtime.
async fn create(dir: &Path, agent: &AgentId, secrets: Vec<SecretSpec>) {
    let runtime = runtime(dir).await.expect("first runtime");
    let spec = SandboxSpec {
        secrets,
        ..SandboxSpec::default()
    };
    runtime.create_sandbox_with_id(agent, spec).await.unwrap();
    runtime.shutdown().await;
}

/// Edit `agent`'s stored record as JSON, as a store writer without the master key would.
async fn edit(dir: &Path, agent: &AgentId, change: impl FnOnce(&mut Value)) {
    let store = RedbStore::open_in_data_dir(dir).unwrap();
    let key = agent.as_str().as_bytes();
    let mut record: Value =
        serde_json::from_slice(&store.get("agents", key).await.unwrap().unwrap()).unwrap();
    change(&mut record);
    store
        .put("agents", key, &serde_json::to_vec(&record).unwrap())
        .await
        .unwrap();
}

/// The stored record of `agent`.
async fn stored(dir: &Path, agent: &AgentId) -> Value {
    let store = RedbStore::open_in_data_dir(dir).unwrap();
    serde_json::from_slice(
        &store
            .get("agents", agent.as_str().as_bytes())
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap()
}

/// What the gateway would send to `host` for `agent` (the injected `authorization`, if any).
fn injected(runtime: &Runtime, agent: &AgentId, host: &str) -> Option<String> {
    let table = runtime.secrets().unwrap();
    let mut head = RequestHead {
        method: "GET".into(),
        host: host.into(),
        path_and_query: "/".into(),
        headers: Vec::new(),
    };
    match table.rewrite(agent, Some(host), &mut head) {
        InjectOutcome::Forward { .. } => head
            .headers
            .iter()
            .find(|(k, _)| k == "authorization")
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned()),
        _ => None,
    }
}

/// The next runtime must refuse the edited record with an error naming the secret; the value is not used.
async fn refused(dir: &Path, agent: &AgentId, secret: &str) -> String {
    match runtime(dir).await {
        Ok(runtime) => {
            let leak = injected(&runtime, agent, "evil.test");
            runtime.shutdown().await;
            panic!("a tampered record was accepted (evil.test gets {leak:?})");
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(secret) && message.contains(agent.as_str()),
                "the error does not name the secret and its agent: {message}"
            );
            message
        }
    }
}

// covers: S15, E10
#[tokio::test]
async fn a_rule_changed_in_the_store_is_refused() {
    agenthold_testsupport::init_tracing();
    type Edit = fn(&mut Value);
    let edits: [(&str, Edit); 8] = [
        ("hosts", |s| {
            s["rules"][0]["hosts"] = serde_json::json!(["evil.test"]);
        }),
        ("hosts added", |s| {
            s["rules"][0]["hosts"] = serde_json::json!(["allowed.test", "evil.test"]);
        }),
        ("wildcard", |s| {
            s["rules"][0]["hosts"] = serde_json::json!(["*.test"]);
        }),
        ("header", |s| {
            s["rules"][0]["header"] = serde_json::json!("x-forwarded-to");
        }),
        ("template", |s| {
            s["rules"][0]["template"] = serde_json::json!("{{base64 .Value}}");
        }),
        ("rule added", |s| {
            let extra = serde_json::json!({"kind": "header", "hosts": ["evil.test"],
                "header": "authorization", "template": "{{.Value}}"});
            s["rules"].as_array_mut().unwrap().push(extra);
        }),
        ("kind", |s| {
            s["rules"][0] = serde_json::json!({"kind": "login", "hosts": ["evil.test"],
                "header": "authorization", "paths": []});
        }),
        ("token refresh", |s| {
            s["rules"][0] = serde_json::json!({"kind": "token_refresh", "hosts": ["evil.test"],
                "path": "/oauth/token", "access_secret": "api-key"});
        }),
    ];
    for (what, change) in edits {
        let dir = data_dir();
        let agent = AgentId::new("victim").unwrap();
        create(
            dir.path(),
            &agent,
            vec![secret("api-key", "sk-victim", "allowed.test")],
        )
        .await;
        edit(dir.path(), &agent, |r| change(&mut r["secrets"][0])).await;
        let message = refused(dir.path(), &agent, "api-key").await;
        assert!(!message.contains("sk-victim"), "{what}: {message}");
    }
}

// covers: S15, E10
#[tokio::test]
async fn sealed_values_moved_between_secrets_or_agents_are_refused() {
    agenthold_testsupport::init_tracing();
    // Two secrets of one agent swap their values (each keeps its own name and rules).
    let dir = data_dir();
    let agent = AgentId::new("victim").unwrap();
    create(
        dir.path(),
        &agent,
        vec![
            secret("api-key", "sk-victim", "allowed.test"),
            secret("other", "sk-other", "evil.test"),
        ],
    )
    .await;
    edit(dir.path(), &agent, |r| {
        let a = r["secrets"][0]["sealed"].take();
        let b = r["secrets"][1]["sealed"].take();
        r["secrets"][0]["sealed"] = b;
        r["secrets"][1]["sealed"] = a;
    })
    .await;
    refused(dir.path(), &agent, "api-key").await;

    // A secret takes the name and rules of another secret of the same agent, keeping its sealed value.
    let dir = data_dir();
    create(
        dir.path(),
        &agent,
        vec![
            secret("api-key", "sk-victim", "allowed.test"),
            secret("other", "sk-other", "evil.test"),
        ],
    )
    .await;
    edit(dir.path(), &agent, |r| {
        let other = r["secrets"][1].clone();
        r["secrets"][0]["rules"] = other["rules"].clone();
    })
    .await;
    refused(dir.path(), &agent, "api-key").await;

    // A secret of one agent is copied into another agent's record.
    let dir = data_dir();
    let thief = AgentId::new("thief").unwrap();
    create(
        dir.path(),
        &agent,
        vec![secret("api-key", "sk-victim", "allowed.test")],
    )
    .await;
    create(
        dir.path(),
        &thief,
        vec![secret("api-key", "sk-thief", "allowed.test")],
    )
    .await;
    let victims = stored(dir.path(), &agent).await["secrets"][0].clone();
    edit(dir.path(), &thief, |r| {
        let mut copy = victims;
        copy["rules"] = serde_json::json!([{"kind": "header", "hosts": ["evil.test"],
            "header": "authorization", "template": "{{.Value}}"}]);
        r["secrets"][0] = copy;
    })
    .await;
    refused(dir.path(), &thief, "api-key").await;
}

// covers: S15, E10
#[tokio::test]
async fn an_untouched_record_still_opens_and_injects_only_to_its_hosts() {
    agenthold_testsupport::init_tracing();
    let dir = data_dir();
    let agent = AgentId::new("victim").unwrap();
    create(
        dir.path(),
        &agent,
        vec![secret("api-key", "sk-victim", "allowed.test")],
    )
    .await;
    let runtime = runtime(dir.path()).await.expect("an untouched record opens");
    assert_eq!(
        injected(&runtime, &agent, "allowed.test").as_deref(),
        Some("Bearer sk-victim")
    );
    assert_eq!(injected(&runtime, &agent, "evil.test"), None);
    runtime.shutdown().await;
    drop(runtime);
    let sealed = stored(dir.path(), &agent).await["secrets"][0]["sealed"].clone();
    let sealed = base64::engine::general_purpose::STANDARD
        .decode(sealed.as_str().unwrap())
        .unwrap();
    assert_eq!(sealed[0], 2, "sealed in the current format");
}

/// Plant the legacy record of agent `legacy` in the store of `dir` (with `rules` instead of its own, when
/// given).
async fn plant_legacy(dir: &Path, rules: Option<Value>) {
    let mut record: Value = serde_json::from_str(LEGACY_RECORD).unwrap();
    if let Some(rules) = rules {
        record["secrets"][0]["rules"] = rules;
    }
    let store = RedbStore::open_in_data_dir(dir).unwrap();
    store
        .put("agents", b"legacy", &serde_json::to_vec(&record).unwrap())
        .await
        .unwrap();
}

fn sealed_version(record: &Value) -> u8 {
    let sealed = record["secrets"][0]["sealed"].as_str().unwrap();
    base64::engine::general_purpose::STANDARD.decode(sealed).unwrap()[0]
}

// covers: S15, E10
#[tokio::test]
async fn an_old_record_migrates_once_and_then_opens_only_with_its_rules() {
    agenthold_testsupport::init_tracing();
    let agent = AgentId::new("legacy").unwrap();
    let dir = data_dir();
    plant_legacy(dir.path(), None).await;
    assert_eq!(sealed_version(&stored(dir.path(), &agent).await), 1);

    // The first start migrates it: opened under the old AAD, sealed again with its rules.
    let runtime = runtime(dir.path()).await.expect("the old record is migrated");
    assert_eq!(
        injected(&runtime, &agent, "allowed.test").as_deref(),
        Some("Bearer sk-legacy")
    );
    runtime.shutdown().await;
    drop(runtime);
    let migrated = stored(dir.path(), &agent).await;
    assert_eq!(sealed_version(&migrated), 2, "re-sealed in the current format");
    let before: Value = serde_json::from_str(LEGACY_RECORD).unwrap();
    assert_eq!(migrated["secrets"][0]["rules"], before["secrets"][0]["rules"]);
    assert_eq!(
        migrated["secrets"][0]["placeholder"],
        before["secrets"][0]["placeholder"]
    );

    // From now on its rules are bound.
    edit(dir.path(), &agent, |r| {
        r["secrets"][0]["rules"][0]["hosts"] = serde_json::json!(["evil.test"]);
    })
    .await;
    refused(dir.path(), &agent, "api-key").await;

    // And the old format is not accepted again: planting the old record (with its own rules or others) after
    // the migration is refused.
    for rules in [
        None,
        Some(
            serde_json::json!([{"kind": "header", "hosts": ["evil.test"], "header": "authorization",
            "template": "{{.Value}}"}]),
        ),
    ] {
        plant_legacy(dir.path(), rules).await;
        let message = refused(dir.path(), &agent, "api-key").await;
        assert!(message.contains("old format"), "{message}");
    }
}

// covers: S15, E10
#[tokio::test]
async fn an_old_record_tampered_before_the_migration_is_refused() {
    agenthold_testsupport::init_tracing();
    let agent = AgentId::new("legacy").unwrap();
    // Bytes or id changed: the old AAD still catches it.
    let dir = data_dir();
    plant_legacy(dir.path(), None).await;
    edit(dir.path(), &agent, |r| {
        r["secrets"][0]["name"] = serde_json::json!("renamed");
    })
    .await;
    refused(dir.path(), &agent, "renamed").await;
    let dir = data_dir();
    plant_legacy(dir.path(), None).await;
    edit(dir.path(), &agent, |r| {
        let sealed = r["secrets"][0]["sealed"].as_str().unwrap();
        let mut bytes = base64::engine::general_purpose::STANDARD.decode(sealed).unwrap();
        bytes[30] ^= 1;
        r["secrets"][0]["sealed"] =
            serde_json::json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    })
    .await;
    refused(dir.path(), &agent, "api-key").await;
    // A failed migration migrates nothing and does not mark the store migrated.
    let store = RedbStore::open_in_data_dir(dir.path()).unwrap();
    assert_eq!(store.get("vault", b"legacy_migrated").await.unwrap(), None);
}
