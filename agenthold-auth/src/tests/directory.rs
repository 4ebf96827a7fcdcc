//! Users, workspaces, members, agents and grants.

use agenthold_core::{AgentId, ErrorKind, WorkspaceId};

use super::{Env, TestResult, new_user};
use crate::error::Error;
use crate::model::{AgentRole, NewAuditEntry, NewUser, WorkspaceRole};

fn kind<T: std::fmt::Debug>(result: Result<T, Error>) -> Option<ErrorKind> {
    result.err().map(|e| e.kind())
}

fn problem<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(Error::BadInput { problem }) => problem,
        other => format!("not BadInput: {other:?}"),
    }
}

// covers: P4
#[tokio::test]
async fn users_are_created_validated_and_counted() -> TestResult {
    let env = Env::new()?;
    assert_eq!(env.dir.user_count().await?, 0);
    let user = env
        .dir
        .create_user(NewUser {
            name: "Ada Lovelace".into(),
            email: Some("ada@example.com".into()),
            provider: "github".into(),
            subject: Some("1234".into()),
        })
        .await?;
    assert_eq!(user.name, "Ada Lovelace");
    assert_eq!(user.created_at, "2027-01-15T08:00:00Z");
    assert_eq!(env.dir.user(&user.id).await?, Some(user.clone()));
    assert_eq!(
        env.dir.user_by_subject("github", "1234").await?,
        Some(user.clone())
    );
    assert_eq!(env.dir.user_by_subject("oidc", "1234").await?, None);
    // 100 characters (not bytes) is the limit.
    env.dir.create_user(new_user(&"é".repeat(100))).await?;
    assert_eq!(env.dir.user_count().await?, 2);

    assert!(problem(env.dir.create_user(new_user("")).await).starts_with("name:"));
    assert!(problem(env.dir.create_user(new_user(&"x".repeat(101))).await).starts_with("name:"));
    assert!(problem(env.dir.create_user(new_user("a\u{7}b")).await).starts_with("name:"));
    assert!(problem(env.dir.create_user(new_user("   ")).await).starts_with("name:"));
    for email in ["no-at-sign", "a @b", &format!("{}@x", "a".repeat(253))] {
        let new = NewUser {
            email: Some(email.to_owned()),
            ..new_user("x")
        };
        assert!(
            problem(env.dir.create_user(new).await).starts_with("email:"),
            "{email}"
        );
    }
    for provider in ["", "GitHub", "a/b", &"p".repeat(65)] {
        let new = NewUser {
            provider: provider.to_owned(),
            ..new_user("x")
        };
        assert!(
            problem(env.dir.create_user(new).await).starts_with("provider:"),
            "{provider}"
        );
    }
    let new = NewUser {
        subject: Some(String::new()),
        ..new_user("x")
    };
    assert!(problem(env.dir.create_user(new).await).starts_with("subject:"));
    // One user per (provider, subject).
    let again = NewUser {
        provider: "github".into(),
        subject: Some("1234".into()),
        ..new_user("Impostor")
    };
    assert_eq!(kind(env.dir.create_user(again).await), Some(ErrorKind::Conflict));
    assert_eq!(env.dir.user_count().await?, 2);
    Ok(())
}

// covers: P4
#[tokio::test]
async fn workspaces_are_created_renamed_and_listed_per_user() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let bob = env.user("bob").await?;
    let ws = env.dir.create_workspace("Research", &ada).await?;
    assert_eq!(
        env.dir.member_role(&ws.id, &ada).await?,
        Some(WorkspaceRole::Owner)
    );
    assert_eq!(env.dir.workspace(&ws.id).await?, Some(ws.clone()));
    let renamed = env.dir.rename_workspace(&ws.id, "Lab").await?;
    assert_eq!(renamed.name, "Lab");
    assert_eq!(
        env.dir.workspace(&ws.id).await?.map(|w| w.name),
        Some("Lab".into())
    );
    assert!(problem(env.dir.rename_workspace(&ws.id, "").await).starts_with("name:"));
    let unknown = WorkspaceId::random();
    assert_eq!(
        kind(env.dir.rename_workspace(&unknown, "x").await),
        Some(ErrorKind::NotFound)
    );
    assert_eq!(
        kind(env.dir.delete_workspace(&unknown).await),
        Some(ErrorKind::NotFound)
    );
    let ghost = agenthold_core::UserId::random();
    assert!(matches!(
        env.dir.create_workspace("x", &ghost).await,
        Err(Error::NotFound { what: "user", .. })
    ));

    let other = env.dir.create_workspace("Other", &bob).await?;
    assert!(env.dir.set_member(&other.id, &ada, WorkspaceRole::Member).await?);
    let mut mine = env.dir.workspaces_of(&ada).await?;
    mine.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    let mine: Vec<_> = mine.into_iter().map(|(w, r)| (w.name, r)).collect();
    assert_eq!(
        mine,
        [
            ("Lab".to_owned(), WorkspaceRole::Owner),
            ("Other".to_owned(), WorkspaceRole::Member)
        ]
    );
    assert_eq!(env.dir.workspaces_of(&bob).await?.len(), 1);
    Ok(())
}

// covers: P4
#[tokio::test]
async fn members_are_set_changed_and_listed() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let bob = env.user("bob").await?;
    let ws = env.dir.create_workspace("w", &ada).await?.id;
    assert!(env.dir.set_member(&ws, &bob, WorkspaceRole::Member).await?);
    assert!(!env.dir.set_member(&ws, &bob, WorkspaceRole::Admin).await?);
    assert_eq!(env.dir.member_role(&ws, &bob).await?, Some(WorkspaceRole::Admin));
    let members: Vec<_> = env
        .dir
        .members(&ws)
        .await?
        .into_iter()
        .map(|m| (m.user, m.role))
        .collect();
    assert_eq!(members.len(), 2);
    assert!(members.contains(&(ada.clone(), WorkspaceRole::Owner)));
    assert!(members.contains(&(bob.clone(), WorkspaceRole::Admin)));
    assert!(matches!(
        env.dir
            .set_member(&ws, &agenthold_core::UserId::random(), WorkspaceRole::Member)
            .await,
        Err(Error::NotFound { what: "user", .. })
    ));
    assert!(matches!(
        env.dir
            .set_member(&WorkspaceId::random(), &bob, WorkspaceRole::Member)
            .await,
        Err(Error::NotFound {
            what: "workspace",
            ..
        })
    ));
    assert!(env.dir.remove_member(&ws, &bob).await?);
    assert!(!env.dir.remove_member(&ws, &bob).await?);
    assert_eq!(env.dir.member_role(&ws, &bob).await?, None);
    assert!(env.dir.workspaces_of(&bob).await?.is_empty());
    Ok(())
}

// covers: P4
#[tokio::test]
async fn the_last_owner_can_be_neither_demoted_nor_removed() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let bob = env.user("bob").await?;
    let ws = env.dir.create_workspace("w", &ada).await?.id;
    assert_eq!(
        kind(env.dir.set_member(&ws, &ada, WorkspaceRole::Admin).await),
        Some(ErrorKind::Conflict)
    );
    assert_eq!(
        kind(env.dir.remove_member(&ws, &ada).await),
        Some(ErrorKind::Conflict)
    );
    assert_eq!(env.dir.member_role(&ws, &ada).await?, Some(WorkspaceRole::Owner));
    // With a second owner, the first may step down; then the second is the last.
    env.dir.set_member(&ws, &bob, WorkspaceRole::Owner).await?;
    env.dir.set_member(&ws, &ada, WorkspaceRole::Member).await?;
    assert_eq!(
        kind(env.dir.remove_member(&ws, &bob).await),
        Some(ErrorKind::Conflict)
    );
    assert_eq!(
        kind(env.dir.set_member(&ws, &bob, WorkspaceRole::Member).await),
        Some(ErrorKind::Conflict)
    );
    // Re-setting an owner as owner is not a demotion.
    assert!(!env.dir.set_member(&ws, &bob, WorkspaceRole::Owner).await?);
    Ok(())
}

// covers: P4
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_owners_stepping_down_at_once_leave_one_owner() -> TestResult {
    let env = Env::new()?;
    for round in 0..5 {
        let ada = env.user("ada").await?;
        let bob = env.user("bob").await?;
        let ws = env.dir.create_workspace(&format!("w{round}"), &ada).await?.id;
        env.dir.set_member(&ws, &bob, WorkspaceRole::Owner).await?;
        let (d1, d2) = (env.dir.clone(), env.dir.clone());
        let (w1, w2) = (ws.clone(), ws.clone());
        let a = tokio::spawn(async move { d1.set_member(&w1, &ada, WorkspaceRole::Admin).await });
        let b = tokio::spawn(async move { d2.remove_member(&w2, &bob).await });
        let (a, b) = (a.await?, b.await?);
        assert!(a.is_ok() != b.is_ok(), "exactly one may step down: {a:?} {b:?}");
        let owners = env
            .dir
            .members(&ws)
            .await?
            .into_iter()
            .filter(|m| m.role == WorkspaceRole::Owner)
            .count();
        assert_eq!(owners, 1);
    }
    Ok(())
}

// covers: P4, S5
#[tokio::test]
async fn agents_are_registered_with_their_creator_as_admin_and_unregistered_with_their_grants() -> TestResult
{
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let bob = env.user("bob").await?;
    let ws = env.dir.create_workspace("w", &ada).await?.id;
    env.dir.set_member(&ws, &bob, WorkspaceRole::Member).await?;
    let agent = AgentId::new("agent-1")?;
    env.dir.register_agent(&ws, &agent, &bob).await?;
    assert_eq!(env.dir.agent_workspace(&agent).await?, Some(ws.clone()));
    assert_eq!(env.dir.agents_in(&ws).await?, std::slice::from_ref(&agent));
    let grants = env.dir.grants(&ws, &agent).await?;
    assert_eq!(grants.len(), 1);
    assert_eq!(
        (grants[0].user.clone(), grants[0].role),
        (bob.clone(), AgentRole::Admin)
    );
    assert_eq!(
        kind(env.dir.register_agent(&ws, &agent, &ada).await),
        Some(ErrorKind::Conflict)
    );
    let outsider = env.user("eve").await?;
    assert!(matches!(
        env.dir
            .register_agent(&ws, &AgentId::new("agent-2")?, &outsider)
            .await,
        Err(Error::NotFound { what: "member", .. })
    ));
    assert!(matches!(
        env.dir
            .register_agent(&WorkspaceId::random(), &AgentId::new("agent-3")?, &ada)
            .await,
        Err(Error::NotFound {
            what: "workspace",
            ..
        })
    ));

    env.dir.unregister_agent(&ws, &agent).await?;
    assert_eq!(env.dir.agent_workspace(&agent).await?, None);
    assert!(env.dir.agents_in(&ws).await?.is_empty());
    assert!(env.dir.grants(&ws, &agent).await?.is_empty());
    assert!(matches!(
        env.dir.unregister_agent(&ws, &agent).await,
        Err(Error::NotFound { what: "agent", .. })
    ));
    Ok(())
}

// covers: S5
#[tokio::test]
async fn grants_need_a_member_and_an_agent_of_the_workspace() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let bob = env.user("bob").await?;
    let eve = env.user("eve").await?;
    let ws = env.dir.create_workspace("w", &ada).await?.id;
    let ws2 = env.dir.create_workspace("w2", &ada).await?.id;
    env.dir.set_member(&ws, &bob, WorkspaceRole::Member).await?;
    let agent = AgentId::new("a1")?;
    let elsewhere = AgentId::new("a2")?;
    env.dir.register_agent(&ws, &agent, &ada).await?;
    env.dir.register_agent(&ws2, &elsewhere, &ada).await?;

    assert!(matches!(
        env.dir.set_grant(&ws, &agent, &eve, AgentRole::Viewer).await,
        Err(Error::NotFound { what: "member", .. })
    ));
    assert!(matches!(
        env.dir.set_grant(&ws, &elsewhere, &bob, AgentRole::Viewer).await,
        Err(Error::NotFound { what: "agent", .. })
    ));
    assert_eq!(env.dir.agent_role(&ws, &agent, &bob).await?, None);
    assert!(env.dir.set_grant(&ws, &agent, &bob, AgentRole::Viewer).await?);
    assert_eq!(
        env.dir.agent_role(&ws, &agent, &bob).await?,
        Some(AgentRole::Viewer)
    );
    assert!(!env.dir.set_grant(&ws, &agent, &bob, AgentRole::Operator).await?);
    assert_eq!(
        env.dir.agent_role(&ws, &agent, &bob).await?,
        Some(AgentRole::Operator)
    );
    // Owners and admins are agent admins without a grant; non-members have no role.
    env.dir.set_member(&ws, &eve, WorkspaceRole::Admin).await?;
    assert_eq!(
        env.dir.agent_role(&ws, &agent, &eve).await?,
        Some(AgentRole::Admin)
    );
    assert_eq!(
        env.dir.agent_role(&ws, &agent, &ada).await?,
        Some(AgentRole::Admin)
    );
    assert_eq!(env.dir.agent_role(&ws2, &elsewhere, &bob).await?, None);
    // An agent asked for through the wrong workspace has no role for anyone.
    assert_eq!(env.dir.agent_role(&ws, &elsewhere, &ada).await?, None);
    assert!(env.dir.remove_grant(&ws, &agent, &bob).await?);
    assert!(!env.dir.remove_grant(&ws, &agent, &bob).await?);
    assert_eq!(env.dir.agent_role(&ws, &agent, &bob).await?, None);
    Ok(())
}

// covers: S5, P4
#[tokio::test]
async fn removing_a_member_drops_their_grants_in_that_workspace_only() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let bob = env.user("bob").await?;
    let carl = env.user("carl").await?;
    let ws = env.dir.create_workspace("w", &ada).await?.id;
    let ws2 = env.dir.create_workspace("w2", &ada).await?.id;
    let (a1, a2, b1) = (AgentId::new("a1")?, AgentId::new("a2")?, AgentId::new("b1")?);
    for (w, agent) in [(&ws, &a1), (&ws, &a2), (&ws2, &b1)] {
        env.dir.register_agent(w, agent, &ada).await?;
        env.dir.set_member(w, &bob, WorkspaceRole::Member).await?;
        env.dir.set_member(w, &carl, WorkspaceRole::Member).await?;
        env.dir.set_grant(w, agent, &bob, AgentRole::Operator).await?;
        env.dir.set_grant(w, agent, &carl, AgentRole::Viewer).await?;
    }
    assert!(env.dir.remove_member(&ws, &bob).await?);
    for agent in [&a1, &a2] {
        assert_eq!(env.dir.agent_role(&ws, agent, &bob).await?, None);
        let users: Vec<_> = env
            .dir
            .grants(&ws, agent)
            .await?
            .into_iter()
            .map(|g| g.user)
            .collect();
        assert!(!users.contains(&bob));
        assert!(users.contains(&carl) && users.contains(&ada));
    }
    assert_eq!(
        env.dir.agent_role(&ws2, &b1, &bob).await?,
        Some(AgentRole::Operator)
    );
    // Rejoining does not bring the grants back.
    env.dir.set_member(&ws, &bob, WorkspaceRole::Member).await?;
    assert_eq!(env.dir.agent_role(&ws, &a1, &bob).await?, None);
    Ok(())
}

// covers: P4
#[tokio::test]
async fn deleting_a_workspace_removes_everything_of_it_and_nothing_else() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let bob = env.user("bob").await?;
    let mut workspaces = Vec::new();
    for (name, agent) in [("doomed", "d-agent"), ("kept", "k-agent")] {
        let ws = env.dir.create_workspace(name, &ada).await?.id;
        env.dir.set_member(&ws, &bob, WorkspaceRole::Member).await?;
        let agent = AgentId::new(agent)?;
        env.dir.register_agent(&ws, &agent, &ada).await?;
        env.dir.set_grant(&ws, &agent, &bob, AgentRole::Viewer).await?;
        for _ in 0..3 {
            env.dir
                .audit(NewAuditEntry {
                    workspace: ws.clone(),
                    actor: Some(ada.clone()),
                    credential: None,
                    action: "agent.create".into(),
                    target: agent.to_string(),
                    result: "ok".into(),
                    reason: None,
                })
                .await?;
        }
        workspaces.push((ws, agent));
    }
    let [(doomed, d_agent), (kept, k_agent)] = <[_; 2]>::try_from(workspaces).map_err(|_| "two")?;
    let before = env.dump().await?;
    assert!(
        before
            .iter()
            .any(|(_, k, v)| k.contains(doomed.as_str()) || v.contains(doomed.as_str()))
    );

    env.dir.delete_workspace(&doomed).await?;
    let after = env.dump().await?;
    let left: Vec<_> = after
        .iter()
        .filter(|(_, k, v)| {
            k.contains(doomed.as_str())
                || v.contains(doomed.as_str())
                || k.contains("d-agent")
                || v.contains("d-agent")
        })
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert_eq!(env.dir.workspace(&doomed).await?, None);
    assert_eq!(env.dir.agent_workspace(&d_agent).await?, None);
    assert_eq!(env.dir.workspaces_of(&bob).await?.len(), 1);
    // The other workspace is whole: everything of it is still there.
    let kept_rows = |rows: &[(String, String, String)]| {
        rows.iter()
            .filter(|(_, k, v)| k.contains(kept.as_str()) || v.contains(kept.as_str()))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(kept_rows(&before), kept_rows(&after));
    assert!(kept_rows(&after).len() >= 9);
    assert_eq!(
        env.dir.agent_role(&kept, &k_agent, &bob).await?,
        Some(AgentRole::Viewer)
    );
    assert_eq!(env.dir.audit_page(&kept, None, 10).await?.0.len(), 3);
    // Users stay.
    assert_eq!(env.dir.user_count().await?, 2);
    assert_eq!(
        kind(env.dir.delete_workspace(&doomed).await),
        Some(ErrorKind::NotFound)
    );
    Ok(())
}
