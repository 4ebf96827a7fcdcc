//! Login attempts of the OIDC and GitHub providers, and members invited before their first login.

use agenthold_core::WorkspaceId;

use super::{Env, TestResult};
use crate::directory::{AttemptRefusal, LOGIN_ATTEMPT_SECS, NewLoginAttempt, NewPendingMember};
use crate::model::{NewUser, WorkspaceRole};

fn attempt(provider: &str) -> NewLoginAttempt {
    NewLoginAttempt {
        provider: provider.to_owned(),
        verifier: "v".repeat(43),
        nonce: "n".repeat(43),
        next: "/w/x".to_owned(),
    }
}

// covers: S6
#[tokio::test]
async fn a_login_attempt_is_single_use_and_bound_to_its_browser() -> TestResult {
    let env = Env::new()?;
    let values = env.dir.create_login_attempt(attempt("github"), None).await?;
    assert_eq!(values.state.len(), 43);
    assert_ne!(values.state, values.binding);
    // Only the hash of the state is a key; neither value is stored.
    let dump = format!("{:?}", env.dump().await?);
    assert!(
        !dump.contains(&values.state) && !dump.contains(&values.binding),
        "{dump}"
    );

    let got = env
        .dir
        .take_login_attempt("github", &values.state, Some(&values.binding))
        .await?
        .map_err(|r| format!("{r:?}"))?;
    assert_eq!((got.next.as_str(), got.nonce.len()), ("/w/x", 43));
    // Replayed: gone.
    assert_eq!(
        env.dir
            .take_login_attempt("github", &values.state, Some(&values.binding))
            .await?,
        Err(AttemptRefusal::Unknown)
    );
    Ok(())
}

// covers: S6
#[tokio::test]
async fn a_login_attempt_fails_for_another_browser_provider_or_after_ten_minutes() -> TestResult {
    let env = Env::new()?;
    let a = env.dir.create_login_attempt(attempt("oidc"), None).await?;
    let b = env.dir.create_login_attempt(attempt("oidc"), None).await?;
    // A foreign binding cookie, or none: refused, and the attempt is used up.
    assert_eq!(
        env.dir
            .take_login_attempt("oidc", &a.state, Some(&b.binding))
            .await?,
        Err(AttemptRefusal::WrongBrowser)
    );
    assert_eq!(
        env.dir
            .take_login_attempt("oidc", &a.state, Some(&a.binding))
            .await?,
        Err(AttemptRefusal::Unknown)
    );
    assert_eq!(
        env.dir.take_login_attempt("oidc", &b.state, None).await?,
        Err(AttemptRefusal::WrongBrowser)
    );
    // Another provider's callback does not find it.
    let c = env.dir.create_login_attempt(attempt("oidc"), None).await?;
    assert_eq!(
        env.dir
            .take_login_attempt("github", &c.state, Some(&c.binding))
            .await?,
        Err(AttemptRefusal::Unknown)
    );
    // A binding cookie presented at start is reused (two tabs).
    let d = env
        .dir
        .create_login_attempt(attempt("oidc"), Some(&c.binding))
        .await?;
    assert_eq!(d.binding, c.binding);
    let e = env
        .dir
        .create_login_attempt(attempt("oidc"), Some("short"))
        .await?;
    assert_ne!(e.binding, "short");
    // Expiry, and the purge.
    env.at(LOGIN_ATTEMPT_SECS);
    assert_eq!(
        env.dir
            .take_login_attempt("oidc", &d.state, Some(&d.binding))
            .await?,
        Err(AttemptRefusal::Unknown)
    );
    assert!(env.dir.purge_expired().await? >= 1);
    assert!(!format!("{:?}", env.dump().await?).contains("auth_login_attempts"));
    // Malformed states never reach the store.
    let before = env.gets();
    assert_eq!(
        env.dir.take_login_attempt("oidc", "x", None).await?,
        Err(AttemptRefusal::Unknown)
    );
    assert_eq!(env.gets(), before);
    Ok(())
}

async fn workspace(env: &Env, owner: &agenthold_core::UserId) -> TestResult<WorkspaceId> {
    Ok(env.dir.create_workspace("team", owner).await?.id)
}

fn invite(email: Option<&str>, subject: Option<(&str, &str)>) -> NewPendingMember {
    NewPendingMember {
        email: email.map(str::to_owned),
        provider: subject.map(|(p, _)| p.to_owned()),
        subject: subject.map(|(_, s)| s.to_owned()),
        role: WorkspaceRole::Admin,
    }
}

async fn login_user(env: &Env, provider: &str, subject: &str) -> TestResult<agenthold_core::UserId> {
    Ok(env
        .dir
        .create_user(NewUser {
            name: subject.to_owned(),
            email: None,
            provider: provider.to_owned(),
            subject: Some(subject.to_owned()),
        })
        .await?
        .id)
}

// covers: S6, P4
#[tokio::test]
async fn pending_members_bind_by_subject_or_verified_email() -> TestResult {
    let env = Env::new()?;
    let owner = env.user("owner").await?;
    let ws = workspace(&env, &owner).await?;
    let (by_subject, new) = env
        .dir
        .add_pending_member(&ws, invite(None, Some(("github", "42"))), &owner)
        .await?;
    assert!(new && by_subject.id.starts_with("inv_"));
    env.dir
        .add_pending_member(&ws, invite(Some("Grace@Example.com"), None), &owner)
        .await?;
    assert_eq!(env.dir.pending_members(&ws).await?.len(), 2);
    // The same person again: the same invitation, with the new role.
    let mut again = invite(Some("grace@example.COM"), None);
    again.role = WorkspaceRole::Member;
    let (p, new) = env.dir.add_pending_member(&ws, again, &owner).await?;
    assert!(!new && p.role == WorkspaceRole::Member);
    assert_eq!(env.dir.pending_members(&ws).await?.len(), 2);
    // Bad input.
    assert!(
        env.dir
            .add_pending_member(&ws, invite(None, None), &owner)
            .await
            .is_err()
    );
    assert!(
        env.dir
            .add_pending_member(&ws, invite(Some("nope"), None), &owner)
            .await
            .is_err()
    );
    assert!(
        env.dir
            .add_pending_member(&ws, invite(None, Some(("local", "admin"))), &owner)
            .await
            .is_err()
    );

    // Another subject of the same provider binds nothing; nor does an unverified email.
    let other = login_user(&env, "github", "43").await?;
    assert!(
        env.dir
            .bind_pending_members(&other, "github", "43", None)
            .await?
            .is_empty()
    );
    // The local admin never binds by email.
    assert!(
        env.dir
            .bind_pending_members(&other, "local", "admin", Some("grace@example.com"))
            .await?
            .is_empty()
    );

    let ada = login_user(&env, "github", "42").await?;
    let bound = env.dir.bind_pending_members(&ada, "github", "42", None).await?;
    assert_eq!(bound.len(), 1);
    assert!(!bound[0].by_email);
    assert_eq!(env.dir.member_role(&ws, &ada).await?, Some(WorkspaceRole::Admin));

    let grace = login_user(&env, "oidc", "g").await?;
    let bound = env
        .dir
        .bind_pending_members(&grace, "oidc", "g", Some("GRACE@example.com"))
        .await?;
    assert_eq!(bound.len(), 1);
    assert!(bound[0].by_email);
    assert_eq!(
        env.dir.member_role(&ws, &grace).await?,
        Some(WorkspaceRole::Member)
    );
    assert!(env.dir.pending_members(&ws).await?.is_empty());

    // Removing one.
    let (p, _) = env
        .dir
        .add_pending_member(&ws, invite(Some("x@y.z"), None), &owner)
        .await?;
    assert!(env.dir.remove_pending_member(&ws, &p.id).await?.is_some());
    assert!(env.dir.remove_pending_member(&ws, &p.id).await?.is_none());
    // Deleting the workspace takes its invitations.
    env.dir
        .add_pending_member(&ws, invite(Some("x@y.z"), None), &owner)
        .await?;
    env.dir.delete_workspace(&ws).await?;
    assert!(!format!("{:?}", env.dump().await?).contains("auth_pending_members"));
    Ok(())
}
