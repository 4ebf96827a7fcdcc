//! A custom `EgressPolicy`: the platform decides, agenthold enforces. This one allows the hosts of a
//! per-agent "project" (a real platform would look them up in its own database), lets every agent resolve
//! only those names, and counts its decisions. The address guard still applies after it: no policy can
//! open private or metadata addresses.
#![allow(clippy::print_stdout)] // printing is what an example does

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agenthold_core::policy::{DenyReason, Destination, EgressPolicy, Verdict, is_strict_subdomain};
use agenthold_core::{AgentId, SandboxSpec};
use agenthold_egress::Dangerous;
use agenthold_sandbox::Runtime;
use agenthold_testsupport::{EchoServer, TestCa};

/// Hosts per project; agents are mapped to projects when they are created.
struct ProjectPolicy {
    projects: HashMap<&'static str, Vec<&'static str>>,
    agents: std::sync::RwLock<HashMap<AgentId, &'static str>>,
    decisions: AtomicU64,
}

impl ProjectPolicy {
    fn hosts(&self, agent: &AgentId) -> Vec<&'static str> {
        let agents = self
            .agents
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        agents
            .get(agent)
            .and_then(|p| self.projects.get(p))
            .cloned()
            .unwrap_or_default()
    }

    fn covers(&self, agent: &AgentId, name: &str) -> bool {
        self.hosts(agent)
            .iter()
            .any(|h| name == *h || is_strict_subdomain(name, h))
    }
}

impl EgressPolicy for ProjectPolicy {
    fn decide(&self, agent: &AgentId, dest: &Destination) -> Verdict {
        self.decisions.fetch_add(1, Ordering::Relaxed);
        match &dest.name {
            Some(name) if self.covers(agent, name) && matches!(dest.port, 80 | 443) => Verdict::Allowed,
            Some(_) => Verdict::Denied(DenyReason::NotInAllowlist),
            None => Verdict::Denied(DenyReason::NoName),
        }
    }

    fn may_resolve(&self, agent: &AgentId, name: &str) -> Verdict {
        if self.covers(agent, name) {
            Verdict::Allowed
        } else {
            Verdict::Denied(DenyReason::NotInAllowlist)
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("warn").init();
    let ca = Arc::new(TestCa::new());
    let docs = EchoServer::https_with_ca(Arc::clone(&ca), &["docs.example.com"]).await;
    let policy = Arc::new(ProjectPolicy {
        projects: HashMap::from([("docs", vec!["example.com"])]),
        agents: std::sync::RwLock::default(),
        decisions: AtomicU64::new(0),
    });
    let data_dir =
        std::env::var("AGENTHOLD_DATA_DIR").unwrap_or_else(|_| "/tmp/agenthold-custom-policy".into());
    let runtime = Runtime::builder()
        .data_dir(&data_dir)
        .policy(Arc::clone(&policy) as Arc<dyn EgressPolicy>)
        .dangerous(Dangerous {
            connect_to: vec![("docs.example.com".into(), 443, docs.addr())],
            upstream_ca_pem: None,
        })
        .build()
        .await?;
    let agent = AgentId::random();
    policy
        .agents
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(agent.clone(), "docs");
    runtime
        .create_sandbox_with_id(&agent, SandboxSpec::default())
        .await?;
    // The sandbox trusts the gateway's CA, not the test upstream's: a spliced connection (no secret here)
    // shows the upstream's own certificate, so give curl that CA for this demonstration.
    runtime
        .write_file(&agent, "/tmp/upstream-ca.pem", ca.pem().as_bytes())
        .await?;
    let script = "curl -sS --cacert /tmp/upstream-ca.pem https://docs.example.com/ -o /dev/null -w 'docs.example.com: %{http_code}\\n'; \
                  curl -sS -m 5 https://example.org/ -o /dev/null || echo 'example.org: refused by the project policy'";
    let out = runtime.exec(&agent, &["sh", "-c", script]).await?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    println!(
        "decisions made by the custom policy: {}",
        policy.decisions.load(Ordering::Relaxed)
    );
    runtime.remove(&agent).await?;
    runtime.shutdown().await;
    Ok(())
}
