//! The local admin login link (SERVER.md §2): a 256-bit single-use token, valid `login_link_secs`, only its
//! SHA-256 stored. Redeeming one logs in as the local admin user, created on first use.
// enforces: S6

use agenthold_core::UserId;

use super::sessions::LinkRecord;
use super::{Directory, LOGIN_LINKS, secs_i64};
use crate::error::Result;
use crate::model::NewUser;
use crate::opaque;

/// Provider and subject of the local admin user.
const LOCAL_PROVIDER: &str = "local";
const LOCAL_SUBJECT: &str = "admin";

impl Directory {
    /// A new login link token (43 characters, base64url), valid once for `login_link_secs`. The caller
    /// puts it in the fragment of the link it prints.
    ///
    /// # Errors
    /// [`crate::Error::Store`].
    pub async fn create_login_link(&self) -> Result<String> {
        let token = opaque::new_value()?;
        let record = LinkRecord {
            expires_unix: self.now().saturating_add(secs_i64(self.config.login_link_secs)),
        };
        self.put_json(LOGIN_LINKS, &opaque::hash_hex(&token), &record)
            .await?;
        Ok(token)
    }

    /// Consume a login link token: the local admin user's id, or `None` when the token is malformed,
    /// unknown, already used or expired. The first successful redeem creates the user `admin` (provider
    /// `local`); later ones return that same user.
    ///
    /// # Errors
    /// [`crate::Error::Store`].
    pub async fn redeem_login_link(&self, token: &str) -> Result<Option<UserId>> {
        if !opaque::is_well_formed(token) {
            return Ok(None);
        }
        let hash = opaque::hash_hex(token);
        let Some(record) = self.get_json::<LinkRecord>(LOGIN_LINKS, &hash).await? else {
            return Ok(None);
        };
        // The store's delete says whether the key was still there: of two concurrent redeems, one wins.
        if !self.store.delete(LOGIN_LINKS, hash.as_bytes()).await? || self.now() >= record.expires_unix {
            return Ok(None);
        }
        let _guard = self.write_lock.acquire().await;
        if let Some(user) = self.user_by_subject(LOCAL_PROVIDER, LOCAL_SUBJECT).await? {
            return Ok(Some(user.id));
        }
        let user = self
            .create_user_locked(NewUser {
                name: "admin".to_owned(),
                email: None,
                provider: LOCAL_PROVIDER.to_owned(),
                subject: Some(LOCAL_SUBJECT.to_owned()),
            })
            .await?;
        tracing::info!(user = %user.id, "local admin user created");
        Ok(Some(user.id))
    }
}
