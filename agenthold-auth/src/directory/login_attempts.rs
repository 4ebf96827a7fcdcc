//! Browser login attempts of the OIDC and GitHub providers (S6): what the callback needs to finish a login
//! that `…/start` began. Kept under the SHA-256 of the `state` value, for 10 minutes, single use; bound to
//! the browser that started it by the SHA-256 of a random cookie value (so a callback carrying someone
//! else's `state`, a login CSRF, fails).
// enforces: S6

use serde::{Deserialize, Serialize};

use super::{Directory, LOGIN_ATTEMPTS};
use crate::error::{Error, Result};
use crate::opaque;

/// How long a login attempt may take, start to callback (seconds).
pub const LOGIN_ATTEMPT_SECS: i64 = 600;

/// What a provider's start step keeps for its callback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewLoginAttempt {
    /// The provider (`oidc`, `github`): a callback of another provider does not find it.
    pub provider: String,
    /// The PKCE code verifier (RFC 7636).
    pub verifier: String,
    /// The OIDC nonce the ID token must carry (empty for providers without ID tokens).
    pub nonce: String,
    /// Where to go after the login: a local path, already sanitised by the caller.
    pub next: String,
}

/// A stored login attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoginAttempt {
    /// The provider that started it.
    pub provider: String,
    /// The PKCE code verifier.
    pub verifier: String,
    /// The nonce the ID token must carry.
    pub nonce: String,
    /// Where to go after the login (sanitised).
    pub next: String,
    /// SHA-256 hex of the browser-binding cookie value.
    binding_hash: String,
    /// Unix seconds after which the attempt is void.
    pub(super) expires_unix: i64,
}

/// Why [`Directory::take_login_attempt`] found no usable attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptRefusal {
    /// No attempt with this `state` (never made, already used, expired, or another provider's).
    Unknown,
    /// The attempt exists but the browser did not present its binding cookie (or presented another one).
    WrongBrowser,
}

/// The values [`Directory::create_login_attempt`] hands out: both 256-bit, base64url.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptValues {
    /// The OAuth `state` parameter.
    pub state: String,
    /// The browser-binding cookie value (the one passed in when it was well-formed, else a fresh one).
    pub binding: String,
}

impl Directory {
    /// Store a login attempt, valid [`LOGIN_ATTEMPT_SECS`]. `binding` is the browser's current binding
    /// cookie, if any: reused when well-formed (so two logins started in two tabs both work), else a fresh
    /// value is made.
    ///
    /// # Errors
    /// [`Error::BadInput`] for a provider that is not 1 to 64 characters of `a-z`, `0-9`, `_`, `-`;
    /// [`Error::Store`].
    pub async fn create_login_attempt(
        &self,
        new: NewLoginAttempt,
        binding: Option<&str>,
    ) -> Result<AttemptValues> {
        if new.provider.is_empty()
            || new.provider.len() > 64
            || !new
                .provider
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return Err(Error::bad_input(
                "provider: must be 1 to 64 characters of a-z, 0-9, '_' and '-'",
            ));
        }
        let binding = match binding.filter(|b| opaque::is_well_formed(b)) {
            Some(b) => b.to_owned(),
            None => opaque::new_value()?,
        };
        let state = opaque::new_value()?;
        let record = LoginAttempt {
            provider: new.provider,
            verifier: new.verifier,
            nonce: new.nonce,
            next: new.next,
            binding_hash: opaque::hash_hex(&binding),
            expires_unix: self.now().saturating_add(LOGIN_ATTEMPT_SECS),
        };
        self.put_json(LOGIN_ATTEMPTS, &opaque::hash_hex(&state), &record)
            .await?;
        Ok(AttemptValues { state, binding })
    }

    /// Consume the login attempt of `state` for `provider`, checking that `binding` (the browser's binding
    /// cookie) is the one it was made for. The attempt is deleted whatever the outcome, so a `state` works
    /// at most once.
    ///
    /// # Errors
    /// [`Error::Store`]. A refusal is `Ok(Err(_))`.
    pub async fn take_login_attempt(
        &self,
        provider: &str,
        state: &str,
        binding: Option<&str>,
    ) -> Result<std::result::Result<LoginAttempt, AttemptRefusal>> {
        if !opaque::is_well_formed(state) {
            return Ok(Err(AttemptRefusal::Unknown));
        }
        let key = opaque::hash_hex(state);
        let Some(record) = self.get_json::<LoginAttempt>(LOGIN_ATTEMPTS, &key).await? else {
            return Ok(Err(AttemptRefusal::Unknown));
        };
        // Of two concurrent callbacks with the same state, only the one whose delete removed it goes on.
        if !self.store.delete(LOGIN_ATTEMPTS, key.as_bytes()).await?
            || self.now() >= record.expires_unix
            || record.provider != provider
        {
            return Ok(Err(AttemptRefusal::Unknown));
        }
        let presented = binding
            .filter(|b| opaque::is_well_formed(b))
            .map(opaque::hash_hex);
        if presented.as_deref() != Some(record.binding_hash.as_str()) {
            return Ok(Err(AttemptRefusal::WrongBrowser));
        }
        Ok(Ok(record))
    }
}
