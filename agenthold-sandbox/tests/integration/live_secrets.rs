//! Secrets changed on a running sandbox (`Runtime::set_secrets`): attached after creation and injected by
//! the gateway into a request from inside, replaced (same placeholder, new value upstream), detached (no
//! longer injected), and the stored record taken over by a second runtime on the same data directory.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use agenthold_core::SandboxSpec;
use agenthold_core::secret::{SecretRule, SecretSpec};
use futures_util::FutureExt;

use crate::support::*;

/// `curl` from inside `agent` to `https://allowed.test{path}` (`-k` when nothing is intercepted, since the
/// sandbox does not trust the upstream's test CA); the HTTP status.
async fn request(env: &Env, agent: &agenthold_core::AgentId, path: &str, insecure: bool) -> u16 {
    let k = if insecure { "-k" } else { "" };
    let out = env
        .sh(
            agent,
            &format!("curl -sS -m 10 {k} -o /dev/null -w '%{{http_code}}' https://{ALLOWED}{path}"),
        )
        .await;
    out.stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("curl:\n{out}"))
}

/// The `authorization` header the upstream received with the request for `path`.
fn upstream_saw(env: &Env, path: &str) -> Option<String> {
    let seen = env.up.https.requests().into_iter().find(|r| r.path == path);
    let seen = seen.unwrap_or_else(|| panic!("{path} never reached the upstream"));
    seen.header("authorization").map(str::to_owned)
}

fn with_value(value: &str) -> SecretSpec {
    let rule = SecretRule::header(&[ALLOWED], "Authorization", "Bearer {{.Value}}").expect("rule");
    SecretSpec::new("api-key", value.into(), Some(SECRET_ENV), vec![rule]).expect("secret")
}

// covers: E10, E12, E13, E16
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn secrets_attach_replace_and_detach_on_a_running_sandbox() {
    let env = Env::start().await;
    let spec = SandboxSpec {
        secrets: Vec::new(),
        ..spec()
    };
    let agent = env.sandbox(Some(spec)).await;
    let config = env.runtime.config().clone();
    let phase_one = AssertUnwindSafe(async {
        assert!(env.runtime.agent_secrets(&agent).await.unwrap().is_empty());

        // Attach: injected at once into a request from inside; the variable reaches new commands.
        let placeholders = env.runtime.set_secrets(&agent, vec![secret()]).await.unwrap();
        let placeholder = placeholders[0].placeholder.clone();
        assert_eq!(request(&env, &agent, "/live-attached", false).await, 200);
        assert_eq!(
            upstream_saw(&env, "/live-attached").as_deref(),
            Some(format!("Bearer {SECRET_VALUE}").as_str())
        );
        let out = env.sh(&agent, &format!("echo ${SECRET_ENV}")).await.ok();
        assert_eq!(out.stdout.trim(), placeholder);
        let log = env.runtime.request_log(&agent);
        let injected = log
            .iter()
            .rev()
            .find(|e| e.secret_injected)
            .expect("logged as injected");
        assert_eq!(injected.secret.as_deref(), Some("api-key"));
        assert!(
            env.runtime
                .request_log_since(&agent, injected.seq)
                .iter()
                .all(|e| e.seq > injected.seq),
            "resumes after the seq"
        );

        // Replace: same placeholder, the new value upstream.
        let replaced = env
            .runtime
            .set_secrets(&agent, vec![with_value("sk-second-value-5d1")])
            .await
            .unwrap();
        assert_eq!(
            replaced[0].placeholder, placeholder,
            "a kept name keeps its placeholder"
        );
        assert_eq!(request(&env, &agent, "/live-replaced", false).await, 200);
        assert_eq!(
            upstream_saw(&env, "/live-replaced").as_deref(),
            Some("Bearer sk-second-value-5d1")
        );
        placeholder
    })
    .catch_unwind()
    .await;
    let placeholder = match phase_one {
        Ok(p) => p,
        Err(panic) => {
            env.cleanup().await;
            std::panic::resume_unwind(panic);
        }
    };

    // A second runtime on the same data directory has the record: same placeholder, still injected.
    env.runtime.shutdown().await;
    let Env { runtime, up, dir, .. } = env;
    drop(runtime);
    let runtime = build_runtime(config, &up).await;
    let env = Env::from_parts(runtime, up, dir);
    env.guard(async {
        let kept = env.runtime.agent_secrets(&agent).await.unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].placeholder, placeholder);
        let back = wait_for(Duration::from_secs(10), || async {
            request(&env, &agent, "/live-restarted", false).await == 200
        });
        assert!(back.await.is_some(), "egress did not come back after the restart");
        assert_eq!(
            upstream_saw(&env, "/live-restarted").as_deref(),
            Some("Bearer sk-second-value-5d1")
        );

        // Detach: nothing injected any more (TLS to the host is spliced again, untouched).
        assert!(
            env.runtime
                .set_secrets(&agent, Vec::new())
                .await
                .unwrap()
                .is_empty()
        );
        assert!(env.runtime.agent_secrets(&agent).await.unwrap().is_empty());
        assert_eq!(request(&env, &agent, "/live-detached", true).await, 200);
        assert_eq!(upstream_saw(&env, "/live-detached"), None);
    })
    .await;
}
