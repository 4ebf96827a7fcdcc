//! Browser sessions (S6): a 256-bit random cookie value, stored only as SHA-256, with an idle expiry that
//! slides on use and an absolute expiry that does not.
// enforces: S6

use agenthold_core::UserId;
use agenthold_core::authz::{Credential, Principal};
use serde::{Deserialize, Serialize};

use super::login_attempts::LoginAttempt;
use super::{Directory, LOGIN_ATTEMPTS, LOGIN_LINKS, SESSIONS, secs_i64};
use crate::error::Result;
use crate::opaque;

/// The idle expiry slides by writing the last use, at most this often (seconds). A session can therefore
/// end up to this much earlier than `session_idle_secs` after its last request.
const SLIDE_EVERY: i64 = 60;

/// A session as stored under the SHA-256 of its cookie value (unix seconds).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SessionRecord {
    user: UserId,
    created_unix: i64,
    last_seen_unix: i64,
}

/// A login link as stored under the SHA-256 of its token (unix seconds).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct LinkRecord {
    pub(super) expires_unix: i64,
}

impl Directory {
    /// Start a browser session for `user`. Returns the cookie value (43 characters, base64url), which is
    /// not kept.
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] when `user` does not exist; [`crate::Error::Store`].
    pub async fn create_session(&self, user: &UserId) -> Result<String> {
        self.require_user(user).await?;
        let cookie = opaque::new_value()?;
        let now = self.now();
        let record = SessionRecord {
            user: user.clone(),
            created_unix: now,
            last_seen_unix: now,
        };
        self.put_json(SESSIONS, &opaque::hash_hex(&cookie), &record)
            .await?;
        tracing::debug!(%user, "session created");
        Ok(cookie)
    }

    /// The principal a session cookie stands for: `None` when it is malformed (checked before any store
    /// lookup), unknown, deleted, idle too long or too old (an expired session is deleted). Slides the idle
    /// expiry, writing at most once a minute.
    ///
    /// # Errors
    /// [`crate::Error::Store`].
    pub async fn authenticate_session(&self, cookie: &str) -> Result<Option<Principal>> {
        if !opaque::is_well_formed(cookie) {
            return Ok(None);
        }
        let hash = opaque::hash_hex(cookie);
        let Some(record) = self.get_json::<SessionRecord>(SESSIONS, &hash).await? else {
            return Ok(None);
        };
        let now = self.now();
        if self.session_expired(&record, now) {
            let _guard = self.credential_lock.acquire().await;
            self.store.delete(SESSIONS, hash.as_bytes()).await?;
            return Ok(None);
        }
        if now.saturating_sub(record.last_seen_unix) >= SLIDE_EVERY {
            let _guard = self.credential_lock.acquire().await;
            // Re-read under the lock: a logout meanwhile must win over the slide.
            let Some(mut record) = self.get_json::<SessionRecord>(SESSIONS, &hash).await? else {
                return Ok(None);
            };
            record.last_seen_unix = now;
            self.put_json(SESSIONS, &hash, &record).await?;
        }
        Ok(Some(Principal {
            user: record.user,
            credential: Credential::Session,
        }))
    }

    /// End the session of `cookie` (logout). A malformed or unknown cookie is not an error.
    ///
    /// # Errors
    /// [`crate::Error::Store`].
    pub async fn delete_session(&self, cookie: &str) -> Result<()> {
        if !opaque::is_well_formed(cookie) {
            return Ok(());
        }
        let _guard = self.credential_lock.acquire().await;
        self.store
            .delete(SESSIONS, opaque::hash_hex(cookie).as_bytes())
            .await?;
        Ok(())
    }

    /// Delete the expired sessions, login links and login attempts that were never presented again (a server calls this
    /// now and then). Returns how many records went.
    ///
    /// # Errors
    /// [`crate::Error::Store`].
    pub async fn purge_expired(&self) -> Result<usize> {
        let now = self.now();
        let _guard = self.credential_lock.acquire().await;
        let mut gone = 0;
        for (key, record) in self.scan_json::<SessionRecord>(SESSIONS, "").await? {
            if self.session_expired(&record, now) && self.store.delete(SESSIONS, key.as_bytes()).await? {
                gone += 1;
            }
        }
        for (key, record) in self.scan_json::<LinkRecord>(LOGIN_LINKS, "").await? {
            if now >= record.expires_unix && self.store.delete(LOGIN_LINKS, key.as_bytes()).await? {
                gone += 1;
            }
        }
        for (key, record) in self.scan_json::<LoginAttempt>(LOGIN_ATTEMPTS, "").await? {
            if now >= record.expires_unix && self.store.delete(LOGIN_ATTEMPTS, key.as_bytes()).await? {
                gone += 1;
            }
        }
        Ok(gone)
    }

    /// Whether `record` is past its idle or its absolute expiry at `now`.
    fn session_expired(&self, record: &SessionRecord, now: i64) -> bool {
        let idle_end = record
            .last_seen_unix
            .saturating_add(secs_i64(self.config.session_idle_secs));
        let absolute_end = record
            .created_unix
            .saturating_add(secs_i64(self.config.session_absolute_secs));
        now >= idle_end || now >= absolute_end
    }
}
