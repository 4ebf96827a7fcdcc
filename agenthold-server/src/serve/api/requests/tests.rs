//! The live tail's own logic on a runtime with a fake sandbox: replay then live entries, one agent only,
//! filters, a receiver that fell behind the broadcast catching up from the ring without loss or
//! duplicates, and the end when the agent is deleted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use agenthold_core::Config;
use agenthold_core::policy::{DenyReason, Verdict};
use agenthold_sandbox::fake::FakeSandbox;

use super::*;

async fn runtime(dir: &std::path::Path) -> Arc<Runtime> {
    let config = Config {
        data_dir: dir.to_path_buf(),
        ..Config::default()
    };
    let runtime = Runtime::builder()
        .config(config)
        .sandbox(Arc::new(FakeSandbox::new()))
        .dns_upstream("127.0.0.1:53".parse().unwrap())
        .build()
        .await
        .unwrap();
    Arc::new(runtime)
}

fn record(runtime: &Runtime, agent: &AgentId, path: &str, verdict: Verdict) {
    let mut entry = LogEntry::new(agent, LogKind::Http, verdict).to("api.example.test", 443);
    entry.path = Some(path.to_owned());
    runtime.gateway().log().record(entry);
}

fn tail(runtime: &Arc<Runtime>, agent: &AgentId, after: u64, filter: Filter) -> Tail {
    let live = runtime.subscribe_requests();
    Tail {
        runtime: Arc::clone(runtime),
        agent: agent.clone(),
        key: agent.to_string(),
        filter,
        live,
        gone: CancellationToken::new(),
        queue: runtime.request_log_since(agent, after).into(),
        last: Arc::new(AtomicU64::new(after)),
        done: false,
    }
}

/// The paths of the next `n` entries (each within a second).
async fn paths(tail: &mut Tail, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        match tokio::time::timeout(Duration::from_secs(1), tail.next()).await {
            Ok(Some(Item::Entry(e))) => out.push(e.path.clone().unwrap()),
            other => panic!("after {out:?}: {other:?}"),
        }
    }
    out
}

async fn quiet(tail: &mut Tail) -> bool {
    tokio::time::timeout(Duration::from_millis(200), tail.next())
        .await
        .is_err()
}

// covers: E16
#[tokio::test]
async fn replays_then_follows_one_agent() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path()).await;
    let (a, b) = (AgentId::random(), AgentId::random());
    record(&rt, &a, "/1", Verdict::Allowed);
    record(&rt, &a, "/2", Verdict::Allowed);
    let first = rt.request_log_since(&a, 0)[0].seq;
    let mut t = tail(&rt, &a, first, Filter::default());
    record(&rt, &b, "/other", Verdict::Allowed);
    record(&rt, &a, "/3", Verdict::Allowed);
    assert_eq!(
        paths(&mut t, 2).await,
        ["/2", "/3"],
        "after the resume point, this agent only"
    );
    assert!(quiet(&mut t).await);
    t.gone.cancel();
    let last = rt.request_log_since(&a, 0).last().unwrap().seq;
    assert!(matches!(t.next().await, Some(Item::End(n, "agent deleted")) if n == last));
    assert!(t.next().await.is_none());
}

// covers: E16
#[tokio::test]
async fn filters_still_move_the_resume_point() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path()).await;
    let a = AgentId::random();
    let denied = Filter::parse(Some("denied"), None, None).unwrap();
    let mut t = tail(&rt, &a, 0, denied);
    record(&rt, &a, "/ok", Verdict::Allowed);
    record(&rt, &a, "/no", Verdict::Denied(DenyReason::NotInAllowlist));
    record(&rt, &a, "/ok2", Verdict::Allowed);
    assert_eq!(paths(&mut t, 1).await, ["/no"]);
    assert!(quiet(&mut t).await);
    let newest = rt.request_log_since(&a, 0).last().unwrap().seq;
    assert_eq!(t.last.load(Ordering::Relaxed), newest);
}

// covers: E16
#[tokio::test]
async fn a_lagging_receiver_catches_up_without_loss_or_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path()).await;
    let (a, b) = (AgentId::random(), AgentId::random());
    record(&rt, &a, "/0", Verdict::Allowed);
    let mut t = tail(&rt, &a, 0, Filter::default());
    // More than the broadcast holds (1024), before the subscriber reads anything.
    for i in 1..=1500 {
        record(&rt, &a, &format!("/{i}"), Verdict::Allowed);
        if i % 10 == 0 {
            record(&rt, &b, "/b", Verdict::Allowed);
        }
    }
    let got = paths(&mut t, 1501).await;
    let want: Vec<String> = (0..=1500).map(|i| format!("/{i}")).collect();
    assert_eq!(got, want);
    record(&rt, &a, "/after", Verdict::Allowed);
    assert_eq!(paths(&mut t, 1).await, ["/after"]);
    assert!(quiet(&mut t).await, "nothing repeated");
}
