//! The warm pool (`sandbox.warm_pool`): ready sandboxes are handed out to plain specs, have no egress
//! before, follow the caller's policy after, are not listed, and go with the runtime.

use std::time::{Duration, Instant};

use agenthold_core::{AgentId, SandboxSpec};
use agenthold_sandbox::Runtime;

use crate::support::*;

async fn wait_ready(runtime: &Runtime, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while runtime.warm_pool_ready() < want {
        assert!(Instant::now() < deadline, "the warm pool did not fill");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `curl` over plain HTTP through the transparent path: the HTTP status, 0 when refused before HTTP.
async fn http_status(runtime: &Runtime, agent: &AgentId, url: &str) -> u16 {
    let out = sh(
        runtime,
        agent,
        &format!("curl -s -m 5 --noproxy '*' -o /dev/null -w '%{{http_code}}' {url}"),
    )
    .await;
    out.stdout.trim().parse().unwrap_or(0)
}

// covers: P1, E8 (a pooled sandbox has no egress until handed out)
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_warm_pool_hands_out_ready_sandboxes() {
    let env = Env::start_with(|c| c.sandbox.warm_pool = 1).await;
    env.guard(async {
        let runtime = &env.runtime;
        wait_ready(runtime, 1).await;
        let pooled = sandboxes_of(&env.instance).await;
        assert_eq!(pooled.len(), 1, "one pooled sandbox: {pooled:?}");
        assert!(
            runtime.sandboxes().await.unwrap().is_empty(),
            "pooled sandboxes are not listed"
        );
        let url = format!("http://{ALLOWED}/pool");
        assert_eq!(
            http_status(runtime, &pooled[0], &url).await,
            0,
            "no egress before it is handed out"
        );

        // Handed out: the caller's policy applies at once.
        let started = Instant::now();
        let spec = SandboxSpec {
            policy: allowlist(),
            ..SandboxSpec::default()
        };
        let agent = runtime.create_sandbox(spec).await.expect("create from the pool");
        eprintln!("handed out in {:?}", started.elapsed());
        assert_eq!(agent, pooled[0], "the ready sandbox was handed out");
        assert_eq!(http_status(runtime, &agent, &url).await, 200);
        assert_eq!(
            http_status(runtime, &agent, &format!("http://{DENIED}/")).await,
            0,
            "denied name"
        );
        assert_eq!(runtime.sandboxes().await.unwrap(), std::slice::from_ref(&agent));

        // A spec with an environment cannot use a pooled container (its environment is fixed at creation).
        wait_ready(runtime, 1).await;
        let refill = sandboxes_of(&env.instance)
            .await
            .into_iter()
            .find(|a| *a != agent)
            .expect("the refill");
        let mut env_spec = SandboxSpec {
            policy: allowlist(),
            ..SandboxSpec::default()
        };
        env_spec.env.insert("GREETING".into(), "hello".into());
        let other = runtime.create_sandbox(env_spec).await.expect("create with env");
        assert_ne!(other, refill, "a spec with env does not take a pooled sandbox");
        assert_eq!(sh(runtime, &other, "echo $GREETING").await.stdout.trim(), "hello");
        assert_eq!(runtime.warm_pool_ready(), 1);

        // Shutdown removes what is still pooled; handed-out sandboxes are the caller's.
        runtime.remove(&agent).await.expect("remove");
        runtime.remove(&other).await.expect("remove");
        runtime.shutdown().await;
        assert!(
            sandboxes_of(&env.instance).await.is_empty(),
            "pooled sandboxes outlived the runtime"
        );
    })
    .await;
}
