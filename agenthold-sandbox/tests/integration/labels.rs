//! Reserved labels (S15): agenthold finds its engine objects by their `agenthold.*` labels (installation,
//! role, agent), and its event watcher acts on the agent a label names. A spec that set them could make
//! agenthold act on another agent (a fresh boot token for it, breaking its tunnel) or take a sandbox for
//! the gateway holder; so every way into a create refuses them, whatever their spelling.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agenthold_core::{AgentId, Config, ErrorKind, SandboxSpec};
use agenthold_sandbox::Runtime;
use agenthold_sandbox::fake::FakeSandbox;
use agenthold_sandbox::tunnel::TunnelStatus;

use crate::support::*;

/// Label keys a spec must not set: agenthold's own in every spelling Docker or a reader might confuse
/// with them, Docker's reserved namespaces, and keys that are not printable ASCII.
pub const REFUSED: &[&str] = &[
    "agenthold.agent",
    "agenthold.role",
    "agenthold.instance",
    "agenthold.managed",
    "agenthold.inputs",
    "agenthold.future-label",
    "agenthold",
    "AGENTHOLD.AGENT",
    "Agenthold.Role",
    " agenthold.agent",
    "agenthold.agent ",
    "\tagenthold.agent",
    "agenthold.agent\n",
    "agenthold .agent",
    "agenthold\u{0}.agent",
    "\u{ff41}genthold.agent",
    "agenthold\u{200b}.agent",
    "com.docker.compose.project",
    "COM.DOCKER.network.bridge.name",
    "io.docker.anything",
    "org.dockerproject.anything",
    "",
    " ",
    "two words",
];

/// Label keys a spec may set.
const ACCEPTED: &[&str] = &[
    "team",
    "com.example.owner",
    "my.agenthold.agent",
    "agentholder",
    "x-agenthold",
];

fn labeled(key: &str, value: &str) -> SandboxSpec {
    SandboxSpec {
        labels: BTreeMap::from([(key.to_owned(), value.to_owned())]),
        ..SandboxSpec::default()
    }
}

// covers: S15
#[tokio::test]
async fn reserved_labels_are_refused_at_create() {
    agenthold_testsupport::init_tracing();
    let dir = tempfile::Builder::new().prefix("ah-labels-").tempdir().unwrap();
    let config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    let runtime = Runtime::builder()
        .config(config)
        .sandbox(Arc::new(FakeSandbox::new()))
        .dns_upstream("127.0.0.1:53".parse().unwrap())
        .build()
        .await
        .unwrap();
    for key in REFUSED {
        let agent = AgentId::random();
        for result in [
            runtime
                .create_sandbox_with_id(&agent, labeled(key, "x"))
                .await
                .map(drop),
            runtime.create_sandbox(labeled(key, "x")).await.map(drop),
        ] {
            let err = result.expect_err(&format!("label {key:?} was accepted"));
            assert_eq!(err.kind(), ErrorKind::BadInput, "{key:?}: {err}");
            assert!(
                err.to_string().contains(&format!("{key:?}")),
                "the error names the label: {err}"
            );
        }
    }
    // Among other labels too.
    let mut spec = labeled("team", "a");
    spec.labels
        .insert("agenthold.agent".into(), "someone-else".into());
    assert!(runtime.create_sandbox(spec).await.is_err());
    assert!(
        runtime.sandboxes().await.unwrap().is_empty(),
        "nothing was created"
    );
    for key in ACCEPTED {
        runtime
            .create_sandbox(labeled(key, "x"))
            .await
            .unwrap_or_else(|e| panic!("{key:?}: {e}"));
    }
    runtime.shutdown().await;
}

/// Agent A's spec names agent B in `agenthold.agent` (and the holder's role): the create is refused; a
/// container made behind agenthold's back with B's labels is ignored; B's tunnel stays up through the next
/// keep-alive rounds. Before the fix, A's container carried B's agent
/// label, the event watcher took A's start for B being started behind agenthold's back and gave B a new
/// boot token, which B's sandboxd never learns: B's tunnel went down for good.
// covers: S15, S2
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_spec_naming_another_agent_in_a_label_is_refused_and_its_tunnel_stays_up() {
    let env = Env::start().await;
    env.guard(async {
        let b = env.sandbox(None).await;
        assert!(env.tunnel_comes_up(&b).await, "B's tunnel does not come up");
        let mut results = Vec::new();
        for labels in [
            vec![("agenthold.agent", b.as_str())],
            vec![("Agenthold.Agent", b.as_str()), ("agenthold.role", "sandbox")],
            vec![("agenthold.role", "gateway")],
            vec![("agenthold.instance", "another-installation")],
        ] {
            let spec = SandboxSpec {
                labels: labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                ..spec()
            };
            let a = env.next_agent();
            results.push((
                labels,
                env.runtime.create_sandbox_with_id(&a, spec).await.map(drop),
            ));
        }
        // A container made outside agenthold with B's labels (by another user of the engine, or a create path
        // that skipped the check): the event watcher checks the name agenthold gives B's container and does
        // not act on it.
        let forged = format!("ah-forged-{}", AgentId::random());
        let started = host(
            "docker",
            &[
                "run",
                "-d",
                "--pull",
                "never",
                "--network",
                "none",
                "--name",
                &forged,
                "--label",
                &format!("agenthold.instance={}", env.instance),
                "--label",
                "agenthold.role=sandbox",
                "--label",
                &format!("agenthold.agent={b}"),
                &dev_image().await.name,
                "sleep",
                "60",
            ],
        );
        assert!(
            started.status.success(),
            "{}",
            String::from_utf8_lossy(&started.stderr)
        );
        // Past more than one keep-alive round (sandboxd pings every 10 s), B is still connected.
        let mut dropped = false;
        for _ in 0..25 {
            dropped |= env.runtime.tunnel_status(&b) != TunnelStatus::Connected;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        host("docker", &["rm", "-f", &forged]);
        for (labels, result) in &results {
            let err = result
                .as_ref()
                .expect_err(&format!("a create with {labels:?} was accepted"));
            assert!(err.to_string().contains("agenthold."), "{err}");
        }
        assert!(!dropped, "B's tunnel went down");
        assert_eq!(env.runtime.sandboxes().await.unwrap(), vec![b.clone()]);
        assert_eq!(
            sandboxes_of(&env.instance).await,
            vec![b.clone()],
            "no container was left"
        );
        env.sh(&b, &format!("curl -sS -m 10 https://{ALLOWED}/ >/dev/null"))
            .await
            .ok();
    })
    .await;
}
