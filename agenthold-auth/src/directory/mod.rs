//! [`Directory`]: users, workspaces, members, agent grants, credentials and the audit log over the core
//! [`Store`]. One submodule per concern; this one holds the handle, the table names and the helpers they
//! share.
//!
//! Records are JSON values. Keys join ids with `/` (ids never contain it), so a prefix scan of `ws/`
//! finds exactly one workspace's rows:
//!
//! | table | key | value |
//! |---|---|---|
//! | `auth_users` | user | [`User`](crate::User) |
//! | `auth_user_subjects` | provider `/` subject | user id |
//! | `auth_workspaces` | ws | [`Workspace`](crate::Workspace) |
//! | `auth_members` | ws `/` user | [`Membership`](crate::Membership) |
//! | `auth_member_of` | user `/` ws | [`Membership`](crate::Membership) (the same, indexed by user) |
//! | `auth_agents` | agent | the agent's workspace and creator |
//! | `auth_workspace_agents` | ws `/` agent | empty |
//! | `auth_grants` | ws `/` agent `/` user | [`Grant`](crate::Grant) |
//! | `auth_tokens` | SHA-256 hex of the token | token record |
//! | `auth_tokens_by_user` | user `/` token id | SHA-256 hex of the token |
//! | `auth_sessions` | SHA-256 hex of the cookie | session record |
//! | `auth_login_links` | SHA-256 hex of the link's token | expiry |
//! | `auth_audit` | ws `/` 20-digit sequence number | [`AuditEntry`](crate::AuditEntry) |
//! | `auth_login_attempts` | SHA-256 hex of the OAuth `state` | [`LoginAttempt`](crate::LoginAttempt) |
//! | `auth_pending_members` | ws `/` invitation id | [`PendingMember`](crate::PendingMember) |
// enforces: P4

mod agents;
mod audit;
mod login_attempts;
mod login_link;
mod members;
mod pending;
mod sessions;
mod tokens;
mod users;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use agenthold_core::store::BatchOp;
use agenthold_core::{ErrorKind, Store, WorkspaceId};
use serde::Serialize;
use serde::de::DeserializeOwned;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::config::AuthConfig;
use crate::error::{Error, Result};
use crate::lock::WriteLock;

pub(crate) const USERS: &str = "auth_users";
pub(crate) const USER_SUBJECTS: &str = "auth_user_subjects";
pub(crate) const WORKSPACES: &str = "auth_workspaces";
pub(crate) const MEMBERS: &str = "auth_members";
pub(crate) const MEMBER_OF: &str = "auth_member_of";
pub(crate) const AGENTS: &str = "auth_agents";
pub(crate) const WORKSPACE_AGENTS: &str = "auth_workspace_agents";
pub(crate) const GRANTS: &str = "auth_grants";
pub(crate) const TOKENS: &str = "auth_tokens";
pub(crate) const TOKENS_BY_USER: &str = "auth_tokens_by_user";
pub(crate) const SESSIONS: &str = "auth_sessions";
pub(crate) const LOGIN_LINKS: &str = "auth_login_links";
pub(crate) const AUDIT: &str = "auth_audit";
pub(crate) const LOGIN_ATTEMPTS: &str = "auth_login_attempts";
pub(crate) const PENDING: &str = "auth_pending_members";

pub use login_attempts::{AttemptRefusal, AttemptValues, LOGIN_ATTEMPT_SECS, LoginAttempt, NewLoginAttempt};
pub use pending::{BoundInvitation, NewPendingMember, PENDING_PREFIX, PendingMember};

/// Every table the directory writes (for tests that look for leftovers).
#[cfg(test)]
pub(crate) const TABLES: [&str; 15] = [
    USERS,
    USER_SUBJECTS,
    WORKSPACES,
    MEMBERS,
    MEMBER_OF,
    AGENTS,
    WORKSPACE_AGENTS,
    GRANTS,
    TOKENS,
    TOKENS_BY_USER,
    SESSIONS,
    LOGIN_LINKS,
    AUDIT,
    LOGIN_ATTEMPTS,
    PENDING,
];

/// The current time as unix seconds.
type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Users, workspaces, members, agent grants, credentials and the audit log, kept in a [`Store`].
///
/// Every write is durable when the call returns; a change of several keys is one [`Store::batch`].
/// Changes whose validity depends on what is stored (the last owner, a grant only for a member) are
/// serialised inside the process, which is enough because a store is open in one process at a time.
pub struct Directory {
    store: Arc<dyn Store>,
    config: AuthConfig,
    clock: Clock,
    /// Serialises read-check-write changes of users, members, agents and grants.
    write_lock: WriteLock,
    /// Serialises the updates of token and session records (last use, sliding expiry) with their
    /// deletion, so that an update can never bring back a revoked token or a deleted session.
    credential_lock: WriteLock,
    /// The last audit sequence number handed out, per workspace (loaded from the store on first use).
    audit_seq: Mutex<HashMap<WorkspaceId, u64>>,
}

impl fmt::Debug for Directory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Directory")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Directory {
    /// A directory over `store`, with the system clock.
    #[must_use]
    pub fn new(store: Arc<dyn Store>, config: AuthConfig) -> Self {
        Self::with_clock(
            store,
            config,
            Arc::new(|| OffsetDateTime::now_utc().unix_timestamp()),
        )
    }

    /// A directory whose notion of "now" (unix seconds) is `clock`: for tests of expiry.
    #[doc(hidden)]
    #[must_use]
    pub fn with_clock(
        store: Arc<dyn Store>,
        config: AuthConfig,
        clock: Arc<dyn Fn() -> i64 + Send + Sync>,
    ) -> Self {
        Self {
            store,
            config,
            clock,
            write_lock: WriteLock::default(),
            credential_lock: WriteLock::default(),
            audit_seq: Mutex::new(HashMap::new()),
        }
    }

    /// The settings this directory was made with.
    #[must_use]
    pub fn config(&self) -> &AuthConfig {
        &self.config
    }

    /// Now, as unix seconds.
    fn now(&self) -> i64 {
        (self.clock)()
    }

    /// The record at `key` of `table`, parsed.
    async fn get_json<T: DeserializeOwned>(&self, table: &str, key: &str) -> Result<Option<T>> {
        match self.store.get(table, key.as_bytes()).await? {
            Some(bytes) => decode(table, key.as_bytes(), &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Set `key` of `table` to `value` as JSON.
    async fn put_json<T: Serialize>(&self, table: &str, key: &str, value: &T) -> Result<()> {
        let bytes = encode(table, key, value)?;
        Ok(self.store.put(table, key.as_bytes(), &bytes).await?)
    }

    /// Every record of `table` under `prefix`, parsed, in key order, with its key.
    async fn scan_json<T: DeserializeOwned>(&self, table: &str, prefix: &str) -> Result<Vec<(String, T)>> {
        self.store
            .scan_prefix(table, prefix.as_bytes())
            .await?
            .into_iter()
            .map(|(key, bytes)| {
                let value = decode(table, &key, &bytes)?;
                Ok((String::from_utf8_lossy(&key).into_owned(), value))
            })
            .collect()
    }

    /// The keys of `table` under `prefix`, in key order.
    async fn scan_keys(&self, table: &str, prefix: &str) -> Result<Vec<String>> {
        Ok(self
            .store
            .scan_prefix(table, prefix.as_bytes())
            .await?
            .into_iter()
            .map(|(key, _)| String::from_utf8_lossy(&key).into_owned())
            .collect())
    }
}

/// Parse a stored record; bytes that do not parse are an integrity failure naming the record.
fn decode<T: DeserializeOwned>(table: &str, key: &[u8], bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        Error::backend(
            ErrorKind::Integrity,
            format!(
                "stored record {table}/{} does not parse",
                String::from_utf8_lossy(key)
            ),
            e,
        )
    })
}

/// `value` as JSON bytes.
fn encode<T: Serialize>(table: &str, key: &str, value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value)
        .map_err(|e| Error::backend(ErrorKind::Internal, format!("encode {table}/{key}"), e))
}

/// A batch operation setting `key` of `table` to `value` as JSON.
fn put_op<T: Serialize>(table: &str, key: String, value: &T) -> Result<BatchOp> {
    let value = encode(table, &key, value)?;
    Ok(BatchOp::Put {
        table: table.to_owned(),
        key: key.into_bytes(),
        value,
    })
}

/// A batch operation removing `key` of `table`.
fn delete_op(table: &str, key: String) -> BatchOp {
    BatchOp::Delete {
        table: table.to_owned(),
        key: key.into_bytes(),
    }
}

/// `secs` (unix seconds) as RFC 3339 UTC; times outside years 1970 to 9999 are clamped into them.
pub(crate) fn rfc3339(secs: i64) -> String {
    let secs = secs.clamp(0, 253_402_300_799);
    OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| String::from("1970-01-01T00:00:00Z"))
}

/// `secs` as a signed offset, saturating.
fn secs_i64(secs: u64) -> i64 {
    i64::try_from(secs).unwrap_or(i64::MAX)
}

/// A display name: 1 to 100 characters, not blank, no control characters.
pub(crate) fn check_name(field: &str, value: &str) -> Result<()> {
    let len = value.chars().count();
    if len == 0 || len > 100 {
        Err(Error::bad_input(format!(
            "{field}: must be 1 to 100 characters (got {len})"
        )))
    } else if value.trim().is_empty() {
        Err(Error::bad_input(format!("{field}: must not be blank")))
    } else if value.chars().any(char::is_control) {
        Err(Error::bad_input(format!(
            "{field}: must not contain control characters"
        )))
    } else {
        Ok(())
    }
}
