//! Durable key-value storage (C2): the [`Store`] trait, its default implementation on redb
//! ([`RedbStore`]), one in a PostgreSQL database behind the `postgres` feature (`PgStore`), and one on sled
//! behind the `sled` feature.
//!
//! Contract of every implementation:
//! - Data lives in named tables of byte keys and byte values; a table springs into existence on first write,
//!   and reading a table that was never written is the same as reading an empty one.
//! - A write (`put`, `delete`, `batch`) is durable when the call returns: after a crash or `SIGKILL` of the
//!   process at any later moment, it is present on reopen.
//! - A [`Store::batch`] applies all of its operations or none of them.
//! - `scan_prefix` returns entries in ascending key order.
//! - Table names are 1 to 64 characters of `a-z`, `0-9`, `_` and `-`; anything else is
//!   [`crate::Error::InvalidId`].

#[cfg(feature = "postgres")]
mod postgres;
mod redb;
#[cfg(feature = "sled")]
mod sled;

#[cfg(feature = "postgres")]
pub use self::postgres::{PgOptions, PgStore, SCHEMA_VERSION, is_postgres_url, redact_url};
pub use self::redb::RedbStore;
#[cfg(feature = "sled")]
pub use self::sled::SledStore;

use crate::error::{Error, Result};

/// One operation of an atomic [`Store::batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    /// Set `key` to `value` in `table`.
    Put {
        /// Table name.
        table: String,
        /// Key bytes.
        key: Vec<u8>,
        /// Value bytes.
        value: Vec<u8>,
    },
    /// Remove `key` from `table` (no error when absent).
    Delete {
        /// Table name.
        table: String,
        /// Key bytes.
        key: Vec<u8>,
    },
}

impl BatchOp {
    /// The table this operation touches.
    #[must_use]
    pub fn table(&self) -> &str {
        match self {
            Self::Put { table, .. } | Self::Delete { table, .. } => table,
        }
    }
}

/// Durable key-value tables with atomic batches. See the [module docs](self) for the contract.
#[async_trait::async_trait]
pub trait Store: Send + Sync {
    /// The value of `key` in `table`, if any.
    async fn get(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Set `key` to `value` in `table`; durable on return.
    async fn put(&self, table: &str, key: &[u8], value: &[u8]) -> Result<()>;
    /// Remove `key` from `table`; durable on return. Returns whether the key was present.
    async fn delete(&self, table: &str, key: &[u8]) -> Result<bool>;
    /// Every entry of `table` whose key starts with `prefix`, in ascending key order.
    async fn scan_prefix(&self, table: &str, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Apply all of `ops` atomically; durable on return.
    async fn batch(&self, ops: Vec<BatchOp>) -> Result<()>;
}

/// Check a table name against the rules in the [module docs](self).
pub(crate) fn check_table(table: &str) -> Result<()> {
    let problem = if table.is_empty() || table.len() > 64 {
        Some("must be 1 to 64 characters")
    } else if !table
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        Some("may contain only a-z, 0-9, '_' and '-'")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(Error::InvalidId {
            kind: "table name",
            value: table.to_owned(),
            problem,
        }),
        None => Ok(()),
    }
}

/// Create `dir` and its missing parents; on Unix the directories created here are mode 0700 (the store
/// holds sealed secrets and grants: private to the user running agenthold).
fn create_private_dir(dir: &std::path::Path) -> Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| Error::io(dir, e))
}

/// Flush the entries of directory `dir` (files or directories created in it) to disk, so that a newly
/// created database survives a power loss along with its contents. A no-op where directories cannot be
/// synced (outside Unix).
fn sync_dir(dir: &std::path::Path) -> Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        dir
    };
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}
