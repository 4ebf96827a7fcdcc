//! Users: create, look up by id or by login subject, count.

use agenthold_core::UserId;

use super::{Directory, USER_SUBJECTS, USERS, check_name, put_op, rfc3339};
use crate::error::{Error, Result};
use crate::model::{NewUser, User};

impl Directory {
    /// Create a user with a fresh id.
    ///
    /// # Errors
    /// [`Error::BadInput`] for a name that is not 1 to 100 characters or has control characters, an email
    /// without `@` or longer than 254 characters, a provider that is not 1 to 64 characters of `a-z`, `0-9`,
    /// `_`, `-`, or a subject that is empty, longer than 255 characters or has control characters;
    /// [`Error::Conflict`] when a user with the same provider and subject exists; [`Error::Store`].
    pub async fn create_user(&self, new: NewUser) -> Result<User> {
        check_new_user(&new)?;
        let _guard = self.write_lock.acquire().await;
        self.create_user_locked(new).await
    }

    /// [`Directory::create_user`] for a caller holding the write lock, with `new` already checked.
    pub(super) async fn create_user_locked(&self, new: NewUser) -> Result<User> {
        let user = User {
            id: UserId::random(),
            name: new.name,
            email: new.email,
            provider: new.provider,
            subject: new.subject,
            created_at: rfc3339(self.now()),
        };
        let mut ops = vec![put_op(USERS, user.id.to_string(), &user)?];
        if let Some(subject) = &user.subject {
            let key = subject_key(&user.provider, subject);
            if self.store.get(USER_SUBJECTS, key.as_bytes()).await?.is_some() {
                return Err(Error::conflict(format!(
                    "a user with provider {:?} and subject {subject:?} already exists",
                    user.provider
                )));
            }
            ops.push(put_op(USER_SUBJECTS, key, &user.id)?);
        }
        self.store.batch(ops).await?;
        tracing::debug!(user = %user.id, provider = %user.provider, "user created");
        Ok(user)
    }

    /// The user `id`, if it exists.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn user(&self, id: &UserId) -> Result<Option<User>> {
        self.get_json(USERS, id.as_str()).await
    }

    /// The user who logs in through `provider` as `subject`, if any.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn user_by_subject(&self, provider: &str, subject: &str) -> Result<Option<User>> {
        let id: Option<UserId> = self
            .get_json(USER_SUBJECTS, &subject_key(provider, subject))
            .await?;
        match id {
            Some(id) => self.user(&id).await,
            None => Ok(None),
        }
    }

    /// How many users exist.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn user_count(&self) -> Result<usize> {
        Ok(self.store.scan_prefix(USERS, b"").await?.len())
    }

    /// The user `id`, or [`Error::NotFound`].
    pub(super) async fn require_user(&self, id: &UserId) -> Result<User> {
        self.user(id)
            .await?
            .ok_or_else(|| Error::not_found("user", id.as_str()))
    }
}

/// The key of the subject index. The provider cannot contain `/`, so the first `/` separates the two.
fn subject_key(provider: &str, subject: &str) -> String {
    format!("{provider}/{subject}")
}

/// The rules of [`NewUser`]'s fields.
pub(super) fn check_new_user(new: &NewUser) -> Result<()> {
    check_name("name", &new.name)?;
    if let Some(email) = &new.email {
        let len = email.chars().count();
        if !email.contains('@') || len > 254 || email.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(Error::bad_input(
                "email: must contain '@', be at most 254 characters and have no spaces or control characters",
            ));
        }
    }
    let provider = &new.provider;
    if provider.is_empty()
        || provider.len() > 64
        || !provider
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return Err(Error::bad_input(
            "provider: must be 1 to 64 characters of a-z, 0-9, '_' and '-'",
        ));
    }
    if let Some(subject) = &new.subject {
        let len = subject.chars().count();
        if len == 0 || len > 255 || subject.chars().any(char::is_control) {
            return Err(Error::bad_input(
                "subject: must be 1 to 255 characters without control characters",
            ));
        }
    }
    Ok(())
}
