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
pub use self::postgres::{PgOptions, PgStore, SCHEMA_VERSION};
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

/// Open the store `config` names (C2): the redb file `<data_dir>/db` when [`Config::store`] is empty, the
/// PostgreSQL database of its `postgres://` URL otherwise, with the password from
/// [`STORE_PASSWORD_ENV`] or `store_password_file` and the CA of `store_ca_file`.
///
/// # Errors
/// [`Error::Config`] for a password or CA file that cannot be read, or a `postgres://` store in a build
/// without the `postgres` feature; otherwise what the backend's open returns (naming the URL without its
/// password).
///
/// [`Config::store`]: crate::Config::store
/// [`STORE_PASSWORD_ENV`]: crate::config::STORE_PASSWORD_ENV
pub async fn open_configured(config: &crate::Config) -> Result<std::sync::Arc<dyn Store>> {
    if config.store.is_empty() {
        return Ok(std::sync::Arc::new(RedbStore::open_in_data_dir(
            config.data_dir()?,
        )?));
    }
    if !is_postgres_url(&config.store) {
        return Err(Error::Config {
            key: "store".into(),
            problem: format!(
                "{:?} must be empty (the redb file in data_dir) or a postgres:// URL",
                redact_url(&config.store)
            ),
        });
    }
    open_database(config).await
}

#[cfg(feature = "postgres")]
async fn open_database(config: &crate::Config) -> Result<std::sync::Arc<dyn Store>> {
    let mut options = PgOptions::new(config.store.clone());
    // The runtime and the server are the only process on their store (docs/scale-out.md).
    options.exclusive = true;
    options.password = match std::env::var(crate::config::STORE_PASSWORD_ENV) {
        Ok(password) if !password.is_empty() => Some(password),
        _ if !config.store_password_file.as_os_str().is_empty() => {
            let path = &config.store_password_file;
            let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
                key: "store_password_file".into(),
                problem: format!("{} cannot be read: {e}", path.display()),
            })?;
            let password = text.strip_suffix('\n').unwrap_or(&text);
            let password = password.strip_suffix('\r').unwrap_or(password);
            if password.is_empty() {
                return Err(Error::Config {
                    key: "store_password_file".into(),
                    problem: format!("{} is empty", path.display()),
                });
            }
            Some(password.to_owned())
        }
        _ => None,
    };
    if !config.store_ca_file.as_os_str().is_empty() {
        let path = &config.store_ca_file;
        options.ca_pem = Some(std::fs::read(path).map_err(|e| Error::Config {
            key: "store_ca_file".into(),
            problem: format!("{} cannot be read: {e}", path.display()),
        })?);
    }
    Ok(std::sync::Arc::new(PgStore::connect(options).await?))
}

#[cfg(not(feature = "postgres"))]
async fn open_database(config: &crate::Config) -> Result<std::sync::Arc<dyn Store>> {
    Err(Error::Config {
        key: "store".into(),
        problem: format!(
            "{} is a PostgreSQL database, and this build has no PostgreSQL support: build with the \
             cargo feature `postgres` (the agenthold binary and the Python package have it)",
            redact_url(&config.store)
        ),
    })
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

/// Whether `url` is a PostgreSQL URL (the `store` setting's test between the default file and a database).
#[must_use]
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// `url` with the password (in the user part or a `password=` parameter) replaced by `***`, for messages.
#[must_use]
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return redact_params(url);
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let mut out = url[..scheme_end].to_owned();
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..colon]);
                    out.push_str(":***");
                }
                None => out.push_str(userinfo),
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    out.push_str(&redact_params(&rest[authority_end..]));
    out
}

/// `password=…` parameters of a query string replaced by `password=***`.
fn redact_params(text: &str) -> String {
    let Some(q) = text.find('?') else {
        return text.to_owned();
    };
    let params: Vec<String> = text[q + 1..]
        .split('&')
        .map(|p| {
            if p.to_ascii_lowercase().starts_with("password=") {
                "password=***".to_owned()
            } else {
                p.to_owned()
            }
        })
        .collect();
    format!("{}?{}", &text[..q], params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_their_password() {
        assert_eq!(
            redact_url("postgres://agent:s3cret@db.internal:5432/agenthold"),
            "postgres://agent:***@db.internal:5432/agenthold"
        );
        assert_eq!(
            redact_url("postgresql://agent@db/agenthold?sslmode=require&password=s3cret"),
            "postgresql://agent@db/agenthold?sslmode=require&password=***"
        );
        assert_eq!(redact_url("postgres://db/x"), "postgres://db/x");
        assert_eq!(
            redact_url("postgres://a:p@ss@host/x"),
            "postgres://a:***@host/x",
            "an @ inside the password"
        );
        assert_eq!(redact_url("not a url ?password=x"), "not a url ?password=***");
    }

    #[test]
    fn only_postgres_urls_are_postgres_urls() {
        assert!(is_postgres_url("postgres://h/d"));
        assert!(is_postgres_url("postgresql://h/d"));
        assert!(!is_postgres_url(""));
        assert!(!is_postgres_url("mysql://h/d"));
        assert!(!is_postgres_url("/var/lib/agenthold"));
    }
}
