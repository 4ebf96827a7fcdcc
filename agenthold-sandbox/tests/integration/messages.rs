//! Agent messages from inside a real sandbox (P3, S4): `agenthold-send` on the PATH, used by a non-root
//! user who cannot read the boot token, reaches the runtime's hook with the sandbox's own agent as the
//! sender, whatever the request says.

use std::sync::{Arc, Mutex};

use agenthold_core::AgentId;
use agenthold_sandbox::Runtime;
use agenthold_sandbox::tunnel::{AgentMessages, MessageHarness, TunnelStatus};

use crate::support::*;

/// Records every message; refuses the target `nope`.
#[derive(Default)]
struct Recorder(Mutex<Vec<(AgentId, String, MessageHarness, String)>>);

#[async_trait::async_trait]
impl AgentMessages for Recorder {
    async fn send(
        &self,
        from: &AgentId,
        to_name: &str,
        harness: MessageHarness,
        prompt: &str,
    ) -> Result<String, String> {
        if to_name == "nope" {
            return Err("no agent named that in this workspace".into());
        }
        let mut calls = self.0.lock().unwrap();
        calls.push((from.clone(), to_name.to_owned(), harness, prompt.to_owned()));
        Ok(format!("run_{}", calls.len()))
    }
}

/// `setpriv` to the unprivileged `nobody` (65534) for `script`.
fn as_nobody(script: &str) -> String {
    format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups -- sh -c '{}'",
        script.replace('\'', "'\\''")
    )
}

// covers: S4
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_non_root_user_sends_and_the_sender_is_the_sandbox() {
    agenthold_testsupport::require_root();
    agenthold_testsupport::init_tracing();
    dev_image().await;
    let up = Upstreams::start().await;
    let dir = tempfile::Builder::new().prefix("ah-int-").tempdir().unwrap();
    let hook = Arc::new(Recorder::default());
    let runtime = Runtime::builder()
        .config(config(dir.path(), next_pool()))
        .dns_upstream(up.dns.addr())
        .dangerous(up.dangerous())
        .agent_messages(hook.clone())
        .build()
        .await
        .unwrap();
    let env = Env::from_parts(runtime, up, dir);
    env.guard(async {
        let a = env.sandbox(None).await;
        assert!(env.tunnel_comes_up(&a).await, "the tunnel does not come up");
        let out = env
            .sh(
                &a,
                &as_nobody(
                    "id -u; ls /.agenthold/boot.d 2>&1 >/dev/null; cat /proc/1/environ 2>&1 >/dev/null; \
                     stat -c %a /.agenthold/send.sock; \
                     command -v agenthold-send; \
                     agenthold-send \"the other\" \"I am agent x, not me\"; \
                     printf \"from stdin\" | agenthold-send --harness codex b -",
                ),
            )
            .await
            .ok();
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(lines.first(), Some(&"65534"), "{out}");
        // The token's directory and PID 1's memory are closed to the user, and the token is gone from the
        // file system.
        assert!(
            out.stdout.contains("/.agenthold/boot.d': Permission denied"),
            "{out}"
        );
        assert!(out.stdout.contains("/proc/1/environ: Permission denied"), "{out}");
        let left = env.sh(&a, "ls -A /.agenthold/boot.d").await.ok();
        assert_eq!(left.stdout, "", "the token is deleted once read");
        assert!(lines.contains(&"666"), "{out}");
        assert!(lines.contains(&"/usr/local/bin/agenthold-send"), "{out}");
        assert_eq!(
            lines.get(lines.len() - 2..),
            Some(&["run_1", "run_2"][..]),
            "{out}"
        );
        let calls = hook.0.lock().unwrap().clone();
        assert_eq!(
            calls,
            vec![
                (
                    a.clone(),
                    "the other".to_owned(),
                    MessageHarness::Claude,
                    "I am agent x, not me".to_owned()
                ),
                (
                    a.clone(),
                    "b".to_owned(),
                    MessageHarness::Codex,
                    "from stdin".to_owned()
                ),
            ]
        );
        let out = env.sh(&a, &as_nobody("agenthold-send nope hi")).await;
        assert_eq!(out.code, 1, "{out}");
        assert!(
            out.stderr
                .contains("refused: no agent named that in this workspace"),
            "{out}"
        );
        // The keep-alive tunnel is still up after the requests.
        assert_eq!(env.runtime.tunnel_status(&a), TunnelStatus::Connected);
    })
    .await;
}
