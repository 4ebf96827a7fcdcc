//! Reconcile (S12): a child process (this test binary run again, `reconcile_child`) builds a runtime and
//! creates a sandbox, then is killed with SIGKILL. A new runtime on the same data directory must take the
//! sandbox over without restarting it: same container, egress back within 5 s of `build()` returning, the
//! tunnel accepted again, the same placeholders (and the secret still injected), the same policy.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agenthold_core::AgentId;
use agenthold_egress::Dangerous;
use agenthold_sandbox::Runtime;
use agenthold_sandbox::tunnel::TunnelStatus;

use crate::support::*;

/// Set in the child's environment: a JSON [`ChildSetup`].
const CHILD_ENV: &str = "AGENTHOLD_TEST_RECONCILE_CHILD";

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ChildSetup {
    data_dir: PathBuf,
    pool: ipnet::Ipv4Net,
    agent: String,
    dns: SocketAddr,
    connect_to: Vec<(String, u16, SocketAddr)>,
    ca_pem: String,
}

/// The child: create a sandbox, check egress, print `READY <placeholder>`, then wait to be killed. Does
/// nothing without [`CHILD_ENV`] (so a plain `cargo test` passes it trivially).
#[tokio::test]
async fn reconcile_child() {
    let Ok(setup) = std::env::var(CHILD_ENV) else {
        return;
    };
    let setup: ChildSetup = serde_json::from_str(&setup).expect("child setup");
    let mut config = config(&setup.data_dir, setup.pool);
    // A pooled sandbox the parent's runtime must remove: it was never handed out.
    config.sandbox.warm_pool = 1;
    let runtime = Runtime::builder()
        .config(config)
        .dns_upstream(setup.dns)
        .dangerous(Dangerous {
            connect_to: setup.connect_to,
            upstream_ca_pem: Some(setup.ca_pem.into_bytes()),
        })
        .build()
        .await
        .expect("child: build the runtime");
    let agent = AgentId::new(setup.agent).unwrap();
    runtime
        .create_sandbox_with_id(&agent, spec())
        .await
        .expect("child: create the sandbox");
    let out = sh(
        &runtime,
        &agent,
        &format!("curl -sS -m 10 --noproxy '*' https://{ALLOWED}/child >/dev/null && echo ${SECRET_ENV}"),
    )
    .await;
    let placeholder = out.ok().stdout;
    let filled = wait_for(Duration::from_secs(90), || async {
        runtime.warm_pool_ready() == 1
    })
    .await;
    assert!(filled.is_some(), "child: the warm pool did not fill");
    println!("\nREADY {}", placeholder.trim());
    tokio::time::sleep(Duration::from_secs(120)).await;
    panic!("child: not killed within 120 s");
}

/// Kills the child when the test ends early.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// covers: S2, S12
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_killed_runtime_is_reconciled_without_restarting_sandboxes() {
    agenthold_testsupport::require_root();
    agenthold_testsupport::init_tracing();
    dev_image().await;
    let up = Upstreams::start().await;
    let dir = tempfile::Builder::new().prefix("ah-int-").tempdir().unwrap();
    let pool = next_pool();
    // Whatever happens from here on, nothing of this installation outlives the test.
    let _sweep = crate::engine::SweepOnDrop(instance_of(dir.path()));
    let agent = AgentId::random();
    let dangerous = up.dangerous();
    let setup = ChildSetup {
        data_dir: dir.path().to_path_buf(),
        pool,
        agent: agent.to_string(),
        dns: up.dns.addr(),
        connect_to: dangerous.connect_to,
        ca_pem: up.ca.pem(),
    };
    // In the data directory: removed with it.
    let child_log = dir.path().join("child-stderr.log");
    let mut child = Child(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "reconcile::reconcile_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, serde_json::to_string(&setup).unwrap())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&child_log).unwrap())
            .spawn()
            .expect("start the child"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some((_, placeholder)) = line.split_once("READY ") {
                let _ = tx.send(placeholder.to_owned());
            }
        }
    });
    let placeholder = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(120)))
        .await
        .unwrap();
    let Ok(placeholder) = placeholder else {
        let log = std::fs::read_to_string(&child_log).unwrap_or_default();
        panic!("the child did not get ready; its stderr:\n{log}");
    };
    let before = container(&agent).await;
    child.0.kill().expect("SIGKILL the child");
    let status = child.0.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9));

    let started = Instant::now();
    let runtime = build_runtime(config(dir.path(), pool), &up).await;
    let built = started.elapsed();
    let env = Env::from_parts(runtime, up, dir);
    env.guard(async {
        let started = Instant::now();
        let mut attempts = 0;
        let egress = loop {
            attempts += 1;
            let curl = format!(
                "curl -sS -m 2 --noproxy '*' -o /dev/null -w '%{{http_code}}' \
                 https://{ALLOWED}/after-{attempts}"
            );
            let out = env.sh(&agent, &curl).await;
            if out.stdout == "200" {
                break started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "egress not back after 20 s:\n{out}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let tunnel = wait_for(Duration::from_secs(20), || async {
            env.runtime.tunnel_status(&agent) == TunnelStatus::Connected
        })
        .await;
        eprintln!(
            "reconcile: build() took {built:.2?}; egress back {egress:.2?} after it returned \
             ({attempts} attempts); \
             tunnel connected after {tunnel:.2?}"
        );
        assert!(
            egress < Duration::from_secs(5),
            "S12: egress took {egress:?} after build()"
        );
        assert!(tunnel.is_some(), "the tunnel was not accepted again");

        let after = container(&agent).await;
        assert_eq!(
            (after.id, after.started_at),
            (before.id, before.started_at),
            "the sandbox was restarted"
        );
        assert_eq!(env.runtime.sandboxes().await.unwrap(), vec![agent.clone()]);
        assert_eq!(
            sandboxes_of(&env.instance).await,
            vec![agent.clone()],
            "the pooled sandbox of the killed runtime was not removed"
        );

        // Same placeholder, and it still works: the secret was restored from the vault.
        let out = env
            .sh(
                &agent,
                &format!(
                    "echo ${SECRET_ENV}; \
                     curl -sS -m 10 -H \"X-Key: ${SECRET_ENV}\" https://{ALLOWED}/reconciled >/dev/null"
                ),
            )
            .await
            .ok();
        assert_eq!(out.stdout.trim(), placeholder, "the placeholder changed");
        let seen = env
            .up
            .https
            .requests()
            .into_iter()
            .find(|r| r.path == "/reconciled")
            .expect("reached");
        assert_eq!(seen.header("x-key"), Some(SECRET_VALUE));
        assert_eq!(
            seen.header("authorization"),
            Some(format!("Bearer {SECRET_VALUE}").as_str())
        );

        // Same policy: the allowlist still refuses denied.test (DNS and proxy).
        let out = env
            .sh(
                &agent,
                &format!(
                    "getent hosts {DENIED}; echo rc=$?; \
                     curl -sS -m 5 -o /dev/null -w '%{{http_code}}' http://{DENIED}/"
                ),
            )
            .await;
        assert!(
            out.stdout.contains("rc=2") && out.stdout.ends_with("403"),
            "{out}"
        );
        assert_eq!(env.up.canary_requests(), 0);
    })
    .await;
}
