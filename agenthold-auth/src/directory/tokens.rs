//! Personal API tokens (S7): `ahp_` + 256 random bits in base64url, shown once, stored only as SHA-256,
//! optional expiry, last-used time, revocable with immediate effect.
// enforces: S7

use std::time::Duration;

use agenthold_core::UserId;
use agenthold_core::authz::{Credential, Principal};
use serde::{Deserialize, Serialize};

use super::{Directory, TOKENS, TOKENS_BY_USER, check_name, delete_op, put_op, rfc3339, secs_i64};
use crate::error::{Error, Result};
use crate::model::TokenInfo;
use crate::opaque;

/// The prefix of every personal token, so secret scanners can recognise leaked ones.
pub(crate) const TOKEN_PREFIX: &str = "ahp_";

/// The last-used time is written at most this often (seconds).
const LAST_USED_EVERY: i64 = 60;

/// A token as stored under the SHA-256 of its value. Expiry and last use are kept as unix seconds
/// beside their RFC 3339 forms, so comparisons never parse strings.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TokenRecord {
    info: TokenInfo,
    expires_unix: Option<i64>,
    last_used_unix: Option<i64>,
}

impl Directory {
    /// Create a personal token for `user`, named `name`, expiring after `expires_in` (whole seconds,
    /// rounded up) or never. Returns its metadata and the token itself, which is not kept and cannot be
    /// shown again.
    ///
    /// # Errors
    /// [`Error::BadInput`] for a bad name (1 to 100 characters, no control characters) or a zero
    /// `expires_in`; [`Error::NotFound`] when `user` does not exist; [`Error::Store`].
    pub async fn create_token(
        &self,
        user: &UserId,
        name: &str,
        expires_in: Option<Duration>,
    ) -> Result<(TokenInfo, String)> {
        check_name("name", name)?;
        let expires_in = match expires_in {
            Some(d) if d.is_zero() => return Err(Error::bad_input("expires_in: must be positive")),
            Some(d) => Some(secs_i64(d.as_secs()).saturating_add(i64::from(d.subsec_nanos() > 0))),
            None => None,
        };
        self.require_user(user).await?;
        let token = format!("{TOKEN_PREFIX}{}", opaque::new_value()?);
        let now = self.now();
        let expires_unix = expires_in.map(|secs| now.saturating_add(secs));
        let info = TokenInfo {
            id: opaque::new_id()?,
            user: user.clone(),
            name: name.to_owned(),
            prefix: token[TOKEN_PREFIX.len()..TOKEN_PREFIX.len() + 8].to_owned(),
            created_at: rfc3339(now),
            expires_at: expires_unix.map(rfc3339),
            last_used_at: None,
        };
        let hash = opaque::hash_hex(&token);
        let record = TokenRecord {
            info: info.clone(),
            expires_unix,
            last_used_unix: None,
        };
        self.store
            .batch(vec![
                put_op(TOKENS, hash.clone(), &record)?,
                put_op(TOKENS_BY_USER, format!("{user}/{}", info.id), &hash)?,
            ])
            .await?;
        tracing::debug!(%user, token = %info.id, "token created");
        Ok((info, token))
    }

    /// The tokens of `user` (expired ones too, until revoked), oldest first.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn tokens(&self, user: &UserId) -> Result<Vec<TokenInfo>> {
        let mut out = Vec::new();
        for (_, hash) in self
            .scan_json::<String>(TOKENS_BY_USER, &format!("{user}/"))
            .await?
        {
            if let Some(record) = self.get_json::<TokenRecord>(TOKENS, &hash).await? {
                out.push(record.info);
            }
        }
        out.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
        Ok(out)
    }

    /// Revoke `user`'s token `token_id`, effective immediately. Returns whether it existed; the id of
    /// another user's token is answered `false` and left alone.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn revoke_token(&self, user: &UserId, token_id: &str) -> Result<bool> {
        let _guard = self.credential_lock.acquire().await;
        let index_key = format!("{user}/{token_id}");
        let Some(hash) = self.get_json::<String>(TOKENS_BY_USER, &index_key).await? else {
            return Ok(false);
        };
        self.store
            .batch(vec![
                delete_op(TOKENS, hash),
                delete_op(TOKENS_BY_USER, index_key),
            ])
            .await?;
        tracing::debug!(%user, token = %token_id, "token revoked");
        Ok(true)
    }

    /// The principal a presented token stands for: `None` when it is malformed (checked before any store
    /// lookup), unknown, revoked or expired. Records the last use, at most once a minute.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn authenticate_token(&self, presented: &str) -> Result<Option<Principal>> {
        let well_formed = presented
            .strip_prefix(TOKEN_PREFIX)
            .is_some_and(opaque::is_well_formed);
        if !well_formed {
            return Ok(None);
        }
        let hash = opaque::hash_hex(presented);
        let Some(record) = self.get_json::<TokenRecord>(TOKENS, &hash).await? else {
            return Ok(None);
        };
        let now = self.now();
        if record.expires_unix.is_some_and(|at| now >= at) {
            return Ok(None);
        }
        let user = record.info.user.clone();
        if record
            .last_used_unix
            .is_none_or(|at| now.saturating_sub(at) >= LAST_USED_EVERY)
            && !self.touch_token(&hash, now).await?
        {
            // Revoked between the lookup and the update.
            return Ok(None);
        }
        Ok(Some(Principal {
            user,
            credential: Credential::Token,
        }))
    }

    /// Set the last use of the token stored under `hash` to `now`, unless it was revoked meanwhile.
    /// Returns whether it still exists.
    async fn touch_token(&self, hash: &str, now: i64) -> Result<bool> {
        let _guard = self.credential_lock.acquire().await;
        let Some(mut record) = self.get_json::<TokenRecord>(TOKENS, hash).await? else {
            return Ok(false);
        };
        record.last_used_unix = Some(now);
        record.info.last_used_at = Some(rfc3339(now));
        self.put_json(TOKENS, hash, &record).await?;
        Ok(true)
    }
}
