//! The quickstart `make dev` runs: embed a runtime, create a sandbox with an allowlist and a secret, run a
//! command in it against a local upstream, and print the request log.
//!
//! The upstream is an HTTPS server on this machine's loopback (a stand-in for `api.example.com`); the
//! gateway refuses loopback addresses, so the example maps the name to it with the test-only `dangerous`
//! option. Against real hosts you would drop that and the extra trust anchor.
// enforces: C5
#![allow(clippy::print_stdout)] // printing is what an example does

use std::sync::Arc;

use agenthold_core::secret::{Preset, SecretRule, SecretSpec};
use agenthold_core::{NetworkPolicy, PolicyMode, SandboxSpec};
use agenthold_egress::Dangerous;
use agenthold_sandbox::Runtime;
use agenthold_testsupport::{EchoServer, TestCa};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("warn").init();
    // A local upstream that answers with the request it saw (so we can show the injected header).
    let ca = Arc::new(TestCa::new());
    let upstream = EchoServer::https_with_ca(Arc::clone(&ca), &["api.example.com"]).await;
    let data_dir = std::env::var("AGENTHOLD_DATA_DIR").unwrap_or_else(|_| "/tmp/agenthold-quickstart".into());
    let runtime = Runtime::builder()
        .data_dir(&data_dir)
        .dangerous(Dangerous {
            connect_to: vec![("api.example.com".into(), 443, upstream.addr())],
            upstream_ca_pem: Some(ca.pem().into_bytes()),
        })
        .build()
        .await?;
    println!("runtime ready (data dir {data_dir})");

    let api_key = SecretSpec::new(
        "api-key",
        "sk-quickstart-real-value".into(),
        Some("API_KEY"),
        vec![SecretRule::header(
            &["api.example.com"],
            "Authorization",
            "Bearer {{.Value}}",
        )?],
    )?;
    let _ = Preset::ALL; // presets exist for anthropic, openai, github, gitlab, openrouter
    let spec = SandboxSpec {
        policy: NetworkPolicy::parse(PolicyMode::Allowlist, &["api.example.com"])?,
        secrets: vec![api_key],
        ..SandboxSpec::default()
    };
    let agent = runtime.create_sandbox(spec).await?;
    println!("sandbox {agent} created");

    let script = "echo \"inside, API_KEY=$API_KEY\"; \
                  curl -sS https://api.example.com/v1/hello -H \"Authorization: Bearer $API_KEY\" | head -c 400; echo; \
                  curl -sS --noproxy '*' https://api.example.com/v1/transparent -o /dev/null -w 'transparent path: %{http_code}\\n'; \
                  curl -sS -m 5 https://example.org/ || echo 'example.org: refused (not on the allowlist)'";
    let out = runtime.exec(&agent, &["sh", "-c", script]).await?;
    println!(
        "--- command output (exit {}) ---\n{}",
        out.exit_code,
        String::from_utf8_lossy(&out.stdout)
    );
    if let Some(seen) = upstream.requests().last() {
        println!(
            "--- the upstream received Authorization: {:?}",
            seen.header("authorization")
        );
    }
    println!("--- request log ---");
    for entry in runtime.request_log(&agent) {
        println!("{}", entry.to_json_line());
    }
    runtime.remove(&agent).await?;
    runtime.shutdown().await;
    println!("sandbox removed");
    Ok(())
}
