//! Tests of the directory and the authz table, on the redb store in a temporary directory, with a clock
//! the tests move.

mod audit;
mod authz;
mod credentials;
mod directory;
mod login;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use agenthold_core::store::{BatchOp, RedbStore};
use agenthold_core::{Store, UserId};
use tempfile::TempDir;

use crate::config::AuthConfig;
use crate::directory::{Directory, TABLES};
use crate::model::NewUser;

pub(crate) type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The clock's start: 2027-01-15T08:00:00Z.
pub(crate) const T0: i64 = 1_800_000_000;

/// A store that counts the calls reaching it, and can make scans slow (to widen races).
pub(crate) struct CountingStore {
    inner: RedbStore,
    pub(crate) gets: AtomicUsize,
    pub(crate) writes: AtomicUsize,
    pub(crate) slow_scans: AtomicBool,
}

#[async_trait::async_trait]
impl Store for CountingStore {
    async fn get(&self, table: &str, key: &[u8]) -> agenthold_core::Result<Option<Vec<u8>>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get(table, key).await
    }
    async fn put(&self, table: &str, key: &[u8], value: &[u8]) -> agenthold_core::Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.put(table, key, value).await
    }
    async fn delete(&self, table: &str, key: &[u8]) -> agenthold_core::Result<bool> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.delete(table, key).await
    }
    async fn scan_prefix(
        &self,
        table: &str,
        prefix: &[u8],
    ) -> agenthold_core::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        if self.slow_scans.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.inner.scan_prefix(table, prefix).await
    }
    async fn batch(&self, ops: Vec<BatchOp>) -> agenthold_core::Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.batch(ops).await
    }
}

/// A directory on a fresh store, with a clock at [`T0`].
pub(crate) struct Env {
    pub(crate) dir: Arc<Directory>,
    pub(crate) store: Arc<CountingStore>,
    pub(crate) clock: Arc<AtomicI64>,
    config: AuthConfig,
    _tmp: TempDir,
}

impl Env {
    pub(crate) fn new() -> TestResult<Self> {
        Self::with_config(AuthConfig::default())
    }

    pub(crate) fn with_config(config: AuthConfig) -> TestResult<Self> {
        let tmp = tempfile::tempdir()?;
        let store = Arc::new(CountingStore {
            inner: RedbStore::open(tmp.path().join("db"))?,
            gets: AtomicUsize::new(0),
            writes: AtomicUsize::new(0),
            slow_scans: AtomicBool::new(false),
        });
        let clock = Arc::new(AtomicI64::new(T0));
        Ok(Self {
            dir: directory(&store, &config, &clock),
            store,
            clock,
            config,
            _tmp: tmp,
        })
    }

    /// A new directory over the same store and clock, as after a restart of the server.
    pub(crate) fn reopen(&self) -> Arc<Directory> {
        directory(&self.store, &self.config, &self.clock)
    }

    /// Move the clock to `T0 + secs`.
    pub(crate) fn at(&self, secs: i64) {
        self.clock.store(T0 + secs, Ordering::SeqCst);
    }

    pub(crate) fn gets(&self) -> usize {
        self.store.gets.load(Ordering::SeqCst)
    }

    pub(crate) fn writes(&self) -> usize {
        self.store.writes.load(Ordering::SeqCst)
    }

    /// A new user named `name`.
    pub(crate) async fn user(&self, name: &str) -> TestResult<UserId> {
        Ok(self.dir.create_user(new_user(name)).await?.id)
    }

    /// Every (table, key, value) of every table the directory writes, as text.
    pub(crate) async fn dump(&self) -> TestResult<Vec<(String, String, String)>> {
        let mut out = Vec::new();
        for table in TABLES {
            for (key, value) in self.store.inner.scan_prefix(table, b"").await? {
                out.push((
                    table.to_owned(),
                    String::from_utf8(key)?,
                    String::from_utf8(value)?,
                ));
            }
        }
        Ok(out)
    }
}

fn directory(store: &Arc<CountingStore>, config: &AuthConfig, clock: &Arc<AtomicI64>) -> Arc<Directory> {
    let clock = clock.clone();
    Arc::new(Directory::with_clock(
        store.clone(),
        config.clone(),
        Arc::new(move || clock.load(Ordering::SeqCst)),
    ))
}

pub(crate) fn new_user(name: &str) -> NewUser {
    NewUser {
        name: name.to_owned(),
        email: None,
        provider: "test".to_owned(),
        subject: None,
    }
}
