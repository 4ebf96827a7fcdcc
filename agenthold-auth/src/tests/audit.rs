//! The audit log: ids, pages, concurrency, restarts.

use std::collections::HashSet;

use agenthold_core::authz::Credential;
use agenthold_core::store::BatchOp;
use agenthold_core::{ErrorKind, Store, UserId, WorkspaceId};

use super::{Env, T0, TestResult};
use crate::directory::rfc3339;
use crate::model::{AuditEntry, NewAuditEntry};

fn entry(ws: &WorkspaceId, target: &str) -> NewAuditEntry {
    NewAuditEntry {
        workspace: ws.clone(),
        actor: None,
        credential: Some(Credential::Token),
        action: "agent.exec".into(),
        target: target.into(),
        result: "ok".into(),
        reason: None,
    }
}

fn ids(entries: &[AuditEntry]) -> Vec<u64> {
    entries.iter().filter_map(|e| e.id.parse().ok()).collect()
}

async fn workspace(env: &Env) -> TestResult<(UserId, WorkspaceId)> {
    let ada = env.user("ada").await?;
    let ws = env.dir.create_workspace("w", &ada).await?.id;
    Ok((ada, ws))
}

// covers: P4
#[tokio::test]
async fn entries_get_monotonic_ids_and_the_time() -> TestResult {
    let env = Env::new()?;
    let (ada, ws) = workspace(&env).await?;
    env.at(5);
    let first = env
        .dir
        .audit(NewAuditEntry {
            actor: Some(ada.clone()),
            credential: Some(Credential::Session),
            reason: Some("no grant".into()),
            result: "denied".into(),
            ..entry(&ws, "agent a1")
        })
        .await?;
    assert_eq!(first.id, "00000000000000000001");
    assert_eq!(first.time, rfc3339(T0 + 5));
    assert_eq!(first.actor, Some(ada));
    assert_eq!(first.reason.as_deref(), Some("no grant"));
    let second = env.dir.audit(entry(&ws, "x")).await?;
    assert_eq!(second.id, "00000000000000000002");
    // Each workspace counts on its own.
    let (_, other) = workspace(&env).await?;
    assert_eq!(
        env.dir.audit(entry(&other, "x")).await?.id,
        "00000000000000000001"
    );
    let (page, next) = env.dir.audit_page(&ws, None, 10).await?;
    assert_eq!(page, [second, first]);
    assert_eq!(next, None);
    Ok(())
}

// covers: P4
#[tokio::test]
async fn entries_are_checked_and_free_text_is_made_safe() -> TestResult {
    let env = Env::new()?;
    let (_, ws) = workspace(&env).await?;
    for bad in [
        NewAuditEntry {
            result: "maybe".into(),
            ..entry(&ws, "x")
        },
        NewAuditEntry {
            action: String::new(),
            ..entry(&ws, "x")
        },
        NewAuditEntry {
            action: "a\nb".into(),
            ..entry(&ws, "x")
        },
    ] {
        assert_eq!(
            env.dir.audit(bad).await.err().map(|e| e.kind()),
            Some(ErrorKind::BadInput)
        );
    }
    let unknown = env.dir.audit(entry(&WorkspaceId::random(), "x")).await;
    assert_eq!(unknown.err().map(|e| e.kind()), Some(ErrorKind::NotFound));
    let stored = env
        .dir
        .audit(NewAuditEntry {
            reason: Some("r".repeat(5000)),
            ..entry(&ws, "file\n\u{1b}[31mfake entry")
        })
        .await?;
    assert_eq!(stored.target, "file\u{fffd}\u{fffd}[31mfake entry");
    assert_eq!(stored.reason.map(|r| r.chars().count()), Some(1000));
    // Nothing was numbered for the refused ones.
    assert_eq!(stored.id, "00000000000000000001");
    Ok(())
}

// covers: P4
#[tokio::test]
async fn pages_run_newest_first_by_cursor() -> TestResult {
    let env = Env::new()?;
    let (_, ws) = workspace(&env).await?;
    for i in 1..=25 {
        env.dir.audit(entry(&ws, &format!("t{i}"))).await?;
    }
    let (page, next) = env.dir.audit_page(&ws, None, 10).await?;
    assert_eq!(ids(&page), (16..=25).rev().collect::<Vec<_>>());
    assert_eq!(next.as_deref(), Some("00000000000000000016"));
    let (page, next) = env.dir.audit_page(&ws, next.as_deref(), 10).await?;
    assert_eq!(ids(&page), (6..=15).rev().collect::<Vec<_>>());
    let (page, next) = env.dir.audit_page(&ws, next.as_deref(), 10).await?;
    assert_eq!(ids(&page), (1..=5).rev().collect::<Vec<_>>());
    assert_eq!(next, None);
    // A page that ends exactly at the oldest entry has no next cursor.
    let (page, next) = env.dir.audit_page(&ws, Some("00000000000000000011"), 10).await?;
    assert_eq!(ids(&page), (1..=10).rev().collect::<Vec<_>>());
    assert_eq!(next, None);
    // The limit is clamped to at least one; a cursor past the newest starts at the newest.
    let (page, next) = env.dir.audit_page(&ws, Some("09999999999999999999"), 0).await?;
    assert_eq!(ids(&page), [25]);
    assert_eq!(next.as_deref(), Some("00000000000000000025"));
    for bad in [
        "",
        "25",
        "0000000000000000002x",
        "000000000000000000250",
        "99999999999999999999",
    ] {
        let result = env.dir.audit_page(&ws, Some(bad), 10).await;
        assert_eq!(
            result.err().map(|e| e.kind()),
            Some(ErrorKind::BadInput),
            "{bad:?}"
        );
    }
    Ok(())
}

// covers: P4
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_never_share_an_id() -> TestResult {
    let env = Env::new()?;
    let (_, ws) = workspace(&env).await?;
    // Every task finds the counter not yet loaded and loads it slowly, side by side with the others.
    env.store
        .slow_scans
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let (dir, ws) = (env.dir.clone(), ws.clone());
            tokio::spawn(async move { dir.audit(entry(&ws, &format!("t{i}"))).await })
        })
        .collect();
    let mut seen = HashSet::new();
    for task in tasks {
        assert!(seen.insert(task.await??.id));
    }
    assert_eq!(seen.len(), 100);
    let (page, next) = env.dir.audit_page(&ws, None, 1000).await?;
    assert_eq!(ids(&page), (1..=100).rev().collect::<Vec<_>>());
    assert_eq!(next, None);
    let targets: HashSet<_> = page.into_iter().map(|e| e.target).collect();
    assert_eq!(targets.len(), 100, "every append kept its own entry");
    Ok(())
}

// covers: P4
#[tokio::test]
async fn numbering_continues_after_a_restart_and_pages_cross_key_blocks() -> TestResult {
    let env = Env::new()?;
    let (_, ws) = workspace(&env).await?;
    // Entries 990..=1009 as an earlier run left them, across the boundary of two 1000-key blocks.
    let mut ops = Vec::new();
    for seq in 990u64..=1009 {
        let stored = AuditEntry {
            id: format!("{seq:020}"),
            time: rfc3339(T0),
            workspace: ws.clone(),
            actor: None,
            credential: None,
            action: "old".into(),
            target: format!("t{seq}"),
            result: "ok".into(),
            reason: None,
        };
        ops.push(BatchOp::Put {
            table: "auth_audit".into(),
            key: format!("{ws}/{seq:020}").into_bytes(),
            value: serde_json::to_vec(&stored)?,
        });
    }
    env.store.batch(ops).await?;
    let dir = env.reopen();
    assert_eq!(dir.audit(entry(&ws, "new")).await?.id, "00000000000000001010");
    let (page, next) = dir.audit_page(&ws, None, 15).await?;
    assert_eq!(ids(&page), (996..=1010).rev().collect::<Vec<_>>());
    let (page, next) = dir.audit_page(&ws, next.as_deref(), 15).await?;
    assert_eq!(ids(&page), (990..=995).rev().collect::<Vec<_>>());
    assert_eq!(next, None);
    Ok(())
}

// covers: P4
#[tokio::test]
async fn a_deleted_workspace_takes_its_log_along() -> TestResult {
    let env = Env::new()?;
    let (ada, ws) = workspace(&env).await?;
    env.dir.audit(entry(&ws, "x")).await?;
    env.dir.delete_workspace(&ws).await?;
    let page = env.dir.audit_page(&ws, None, 10).await;
    assert_eq!(page.err().map(|e| e.kind()), Some(ErrorKind::NotFound));
    let fresh = env.dir.create_workspace("again", &ada).await?.id;
    assert_eq!(
        env.dir.audit(entry(&fresh, "x")).await?.id,
        "00000000000000000001"
    );
    Ok(())
}
