//! Personal tokens, browser sessions and the local admin login link.

use std::sync::Arc;
use std::time::Duration;

use agenthold_core::authz::{Credential, Principal};
use agenthold_core::{ErrorKind, UserId};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::{Env, T0, TestResult};
use crate::config::AuthConfig;
use crate::directory::rfc3339;
use crate::error::Error;
use crate::opaque::hash_hex;

fn token_of(user: &UserId) -> Option<Principal> {
    Some(Principal {
        user: user.clone(),
        credential: Credential::Token,
    })
}

fn session_of(user: &UserId) -> Option<Principal> {
    Some(Principal {
        user: user.clone(),
        credential: Credential::Session,
    })
}

// covers: S7
#[tokio::test]
async fn a_token_authenticates_its_user_and_only_its_hash_is_stored() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let (info, token) = env.dir.create_token(&ada, "laptop", None).await?;
    let body = token.strip_prefix("ahp_").ok_or("prefix")?;
    assert_eq!(body.len(), 43);
    assert_eq!(URL_SAFE_NO_PAD.decode(body)?.len(), 32);
    assert_eq!(info.prefix, &body[..8]);
    assert_eq!((info.user.clone(), info.name.as_str()), (ada.clone(), "laptop"));
    assert_eq!(info.expires_at, None);
    assert_eq!(env.dir.authenticate_token(&token).await?, token_of(&ada));

    let rows = env.dump().await?;
    assert!(
        rows.iter()
            .all(|(_, k, v)| !k.contains(body) && !v.contains(body))
    );
    assert!(
        rows.iter()
            .any(|(t, k, _)| t == "auth_tokens" && *k == hash_hex(&token))
    );
    // Two tokens are different.
    let (_, other) = env.dir.create_token(&ada, "ci", None).await?;
    assert_ne!(token, other);
    let names: Vec<_> = env.dir.tokens(&ada).await?.into_iter().map(|t| t.name).collect();
    assert_eq!(names.len(), 2);
    assert!(names.contains(&"laptop".to_owned()) && names.contains(&"ci".to_owned()));
    Ok(())
}

// covers: S7
#[tokio::test]
async fn a_token_is_refused_when_made_for_nobody_or_badly_named() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    assert!(matches!(
        env.dir.create_token(&UserId::random(), "x", None).await,
        Err(Error::NotFound { what: "user", .. })
    ));
    let bad_name = env.dir.create_token(&ada, "", None).await;
    assert_eq!(bad_name.err().map(|e| e.kind()), Some(ErrorKind::BadInput));
    let zero = env.dir.create_token(&ada, "x", Some(Duration::ZERO)).await;
    assert_eq!(zero.err().map(|e| e.kind()), Some(ErrorKind::BadInput));
    assert!(env.dir.tokens(&ada).await?.is_empty());
    Ok(())
}

// covers: S7
#[tokio::test]
async fn last_use_is_recorded_at_most_once_a_minute() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let (_, token) = env.dir.create_token(&ada, "t", None).await?;
    env.at(10);
    let writes = env.writes();
    assert!(env.dir.authenticate_token(&token).await?.is_some());
    assert_eq!(env.writes(), writes + 1);
    let last_used = |env: &Env| {
        let dir = env.dir.clone();
        let ada = ada.clone();
        async move {
            Ok::<_, Error>(
                dir.tokens(&ada)
                    .await?
                    .first()
                    .and_then(|t| t.last_used_at.clone()),
            )
        }
    };
    assert_eq!(last_used(&env).await?, Some(rfc3339(T0 + 10)));
    env.at(69);
    assert!(env.dir.authenticate_token(&token).await?.is_some());
    assert_eq!(env.writes(), writes + 1, "no write within the minute");
    assert_eq!(last_used(&env).await?, Some(rfc3339(T0 + 10)));
    env.at(70);
    assert!(env.dir.authenticate_token(&token).await?.is_some());
    assert_eq!(last_used(&env).await?, Some(rfc3339(T0 + 70)));
    Ok(())
}

// covers: S7
#[tokio::test]
async fn a_token_stops_working_at_its_expiry() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let (info, token) = env
        .dir
        .create_token(&ada, "t", Some(Duration::from_secs(10)))
        .await?;
    assert_eq!(info.expires_at, Some(rfc3339(T0 + 10)));
    env.at(9);
    assert_eq!(env.dir.authenticate_token(&token).await?, token_of(&ada));
    env.at(10);
    assert_eq!(env.dir.authenticate_token(&token).await?, None);
    // A part of a second counts as a whole one.
    let (info, token) = env
        .dir
        .create_token(&ada, "t", Some(Duration::from_millis(1500)))
        .await?;
    assert_eq!(info.expires_at, Some(rfc3339(T0 + 12)));
    env.at(11);
    assert!(env.dir.authenticate_token(&token).await?.is_some());
    env.at(12);
    assert!(env.dir.authenticate_token(&token).await?.is_none());
    Ok(())
}

// covers: S7
#[tokio::test]
async fn revoking_is_immediate_and_only_for_the_owner() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let eve = env.user("eve").await?;
    let (info, token) = env.dir.create_token(&ada, "t", None).await?;
    assert!(!env.dir.revoke_token(&eve, &info.id).await?);
    assert_eq!(env.dir.authenticate_token(&token).await?, token_of(&ada));
    assert!(!env.dir.revoke_token(&ada, "no-such-id").await?);
    assert!(!env.dir.revoke_token(&ada, &format!("{}/x", info.id)).await?);
    assert!(env.dir.revoke_token(&ada, &info.id).await?);
    assert_eq!(env.dir.authenticate_token(&token).await?, None);
    assert!(!env.dir.revoke_token(&ada, &info.id).await?);
    assert!(env.dir.tokens(&ada).await?.is_empty());
    assert!(
        env.dump()
            .await?
            .iter()
            .all(|(t, _, _)| !t.starts_with("auth_tokens"))
    );
    Ok(())
}

// covers: S7
#[tokio::test]
async fn malformed_tokens_are_refused_without_a_store_lookup() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let (_, token) = env.dir.create_token(&ada, "t", None).await?;
    let body = &token[4..];
    let cases = [
        String::new(),
        "ahp_".into(),
        format!("ahq_{body}"),
        format!("AHP_{body}"),
        format!("{token}A"),
        token[..token.len() - 1].to_owned(),
        format!("{token}\n"),
        format!(" {token}"),
        format!("ahp_{}", body.replacen(&body[..1], "+", 1)),
        format!("ahp_{}=", &body[..42]),
        format!("ahp_{}B", &body[..42]),
        format!("Bearer {token}"),
    ];
    let gets = env.gets();
    for bad in &cases {
        assert_eq!(env.dir.authenticate_token(bad).await?, None, "{bad:?}");
        assert_eq!(env.dir.authenticate_session(bad).await?, None, "{bad:?}");
        assert_eq!(env.dir.redeem_login_link(bad).await?, None, "{bad:?}");
    }
    // Without its prefix, a token is not one (though it has the form of a cookie).
    assert_eq!(env.dir.authenticate_token(body).await?, None);
    assert_eq!(env.gets(), gets, "a malformed value reached the store");
    // A well-formed unknown token is looked up, and refused.
    let unknown = format!("ahp_{}", URL_SAFE_NO_PAD.encode([7u8; 32]));
    assert_eq!(env.dir.authenticate_token(&unknown).await?, None);
    assert_eq!(env.gets(), gets + 1);
    // A session cookie is not a token, nor the other way round.
    let cookie = env.dir.create_session(&ada).await?;
    assert_eq!(env.dir.authenticate_token(&format!("ahp_{cookie}")).await?, None);
    assert_eq!(env.dir.authenticate_session(body).await?, None);
    Ok(())
}

fn session_config() -> AuthConfig {
    AuthConfig {
        session_idle_secs: 100,
        session_absolute_secs: 1000,
        ..AuthConfig::default()
    }
}

// covers: S6
#[tokio::test]
async fn a_session_ends_after_its_idle_time() -> TestResult {
    let env = Env::with_config(session_config())?;
    let ada = env.user("ada").await?;
    let cookie = env.dir.create_session(&ada).await?;
    assert_eq!(cookie.len(), 43);
    assert!(
        env.dump()
            .await?
            .iter()
            .all(|(_, k, v)| !k.contains(&cookie) && !v.contains(&cookie))
    );
    env.at(99);
    assert_eq!(env.dir.authenticate_session(&cookie).await?, session_of(&ada));
    // Used at 99: idle until 199.
    env.at(198);
    assert_eq!(env.dir.authenticate_session(&cookie).await?, session_of(&ada));
    env.at(298);
    assert_eq!(env.dir.authenticate_session(&cookie).await?, None);
    // Expired sessions are deleted, and stay dead.
    assert!(env.dump().await?.iter().all(|(t, _, _)| t != "auth_sessions"));
    env.at(0);
    assert_eq!(env.dir.authenticate_session(&cookie).await?, None);
    Ok(())
}

// covers: S6
#[tokio::test]
async fn the_idle_expiry_slides_at_most_once_a_minute() -> TestResult {
    let env = Env::with_config(session_config())?;
    let ada = env.user("ada").await?;
    let cookie = env.dir.create_session(&ada).await?;
    let writes = env.writes();
    env.at(59);
    assert!(env.dir.authenticate_session(&cookie).await?.is_some());
    assert_eq!(env.writes(), writes, "no write within the minute");
    // Not slid at 59, so idle ends at 100.
    env.at(100);
    assert_eq!(env.dir.authenticate_session(&cookie).await?, None);
    Ok(())
}

// covers: S6
#[tokio::test]
async fn a_session_ends_at_its_absolute_expiry_however_busy() -> TestResult {
    let env = Env::with_config(session_config())?;
    let ada = env.user("ada").await?;
    let cookie = env.dir.create_session(&ada).await?;
    for t in (60..1000).step_by(60) {
        env.at(t);
        assert!(env.dir.authenticate_session(&cookie).await?.is_some(), "at {t}");
    }
    env.at(1000);
    assert_eq!(env.dir.authenticate_session(&cookie).await?, None);
    Ok(())
}

// covers: S6
#[tokio::test]
async fn a_deleted_session_cannot_be_replayed() -> TestResult {
    let env = Env::new()?;
    let ada = env.user("ada").await?;
    let cookie = env.dir.create_session(&ada).await?;
    let other = env.dir.create_session(&ada).await?;
    assert_ne!(cookie, other);
    env.dir.delete_session(&cookie).await?;
    assert_eq!(env.dir.authenticate_session(&cookie).await?, None);
    // Even after the slide interval, and only that session ended.
    env.at(120);
    assert_eq!(env.dir.authenticate_session(&cookie).await?, None);
    assert_eq!(env.dir.authenticate_session(&other).await?, session_of(&ada));
    env.dir.delete_session("not a cookie").await?;
    assert!(matches!(
        env.dir.create_session(&UserId::random()).await,
        Err(Error::NotFound { what: "user", .. })
    ));
    Ok(())
}

// covers: S6
#[tokio::test]
async fn a_login_link_works_once_and_always_for_the_same_admin() -> TestResult {
    let env = Env::new()?;
    let link = env.dir.create_login_link().await?;
    assert_eq!(link.len(), 43);
    assert!(
        env.dump()
            .await?
            .iter()
            .all(|(_, k, v)| !k.contains(&link) && !v.contains(&link))
    );
    let admin = env.dir.redeem_login_link(&link).await?.ok_or("first redeem")?;
    assert_eq!(env.dir.redeem_login_link(&link).await?, None, "single use");
    let user = env.dir.user(&admin).await?.ok_or("admin user")?;
    assert_eq!((user.name.as_str(), user.provider.as_str()), ("admin", "local"));
    let second = env.dir.create_login_link().await?;
    assert_ne!(second, link);
    assert_eq!(env.dir.redeem_login_link(&second).await?, Some(admin));
    assert_eq!(env.dir.user_count().await?, 1);
    Ok(())
}

// covers: S6
#[tokio::test]
async fn a_login_link_expires_and_is_consumed_by_a_late_try() -> TestResult {
    let env = Env::with_config(AuthConfig {
        login_link_secs: 900,
        ..AuthConfig::default()
    })?;
    let late = env.dir.create_login_link().await?;
    let in_time = env.dir.create_login_link().await?;
    env.at(899);
    assert!(env.dir.redeem_login_link(&in_time).await?.is_some());
    env.at(900);
    assert_eq!(env.dir.redeem_login_link(&late).await?, None);
    env.at(0);
    assert_eq!(
        env.dir.redeem_login_link(&late).await?,
        None,
        "gone, even with the clock back"
    );
    Ok(())
}

// covers: S6
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_redeems_of_one_link_let_one_in() -> TestResult {
    let env = Env::new()?;
    let link = Arc::new(env.dir.create_login_link().await?);
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (dir, link) = (env.dir.clone(), link.clone());
            tokio::spawn(async move { dir.redeem_login_link(&link).await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        if task.await??.is_some() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 1);
    assert_eq!(env.dir.user_count().await?, 1);
    Ok(())
}

// covers: S6
#[tokio::test]
async fn purging_removes_only_expired_sessions_and_links() -> TestResult {
    let env = Env::with_config(AuthConfig {
        login_link_secs: 100,
        ..session_config()
    })?;
    let ada = env.user("ada").await?;
    let old_session = env.dir.create_session(&ada).await?;
    let old_link = env.dir.create_login_link().await?;
    env.at(50);
    let new_session = env.dir.create_session(&ada).await?;
    let new_link = env.dir.create_login_link().await?;
    env.at(100);
    assert_eq!(env.dir.purge_expired().await?, 2);
    assert_eq!(env.dir.purge_expired().await?, 0);
    let gets = env.gets();
    assert_eq!(env.dir.authenticate_session(&old_session).await?, None);
    assert_eq!(env.dir.redeem_login_link(&old_link).await?, None);
    assert!(env.gets() > gets);
    assert!(env.dir.authenticate_session(&new_session).await?.is_some());
    assert!(env.dir.redeem_login_link(&new_link).await?.is_some());
    Ok(())
}
