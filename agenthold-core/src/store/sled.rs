//! A second [`Store`] on sled (feature `sled`): one sled tree per store table, every write flushed
//! (fsync) before the call returns, batches as multi-tree sled transactions.

use std::collections::HashMap;
use std::convert::Infallible;
use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use sled::transaction::{ConflictableTransactionResult, TransactionError, Transactional};

use super::{BatchOp, Store, check_table, create_private_dir, sync_dir};
use crate::error::{Error, Result};

/// Directory of the database inside the data directory (not `db`, so that a data directory never
/// mixes the redb file with a sled directory).
const DIR_NAME: &str = "sled";

/// Store tables live in sled trees named with this prefix, which keeps them apart from sled's own
/// default tree (`__sled__default` is otherwise a valid table name).
const TREE_PREFIX: &[u8] = b"table/";

/// A [`Store`] on a sled database directory (feature `sled`, C2).
///
/// Each write (`put`, `delete`, `batch`) is followed by a flush of sled's log before the call returns,
/// so an acknowledged write survives a crash. sled 0.34's own flush is not a full fsync on Linux (it
/// uses `sync_file_range` for its log and never syncs the files of large values, its "blobs"), so the
/// store completes it: it fsyncs the log file, and any blob file (and the blob directory) it has not
/// synced before. A [`Store::batch`] is one sled transaction over every tree it touches: all of its
/// operations are recovered together or not at all.
///
/// sled is synchronous: the `async` methods do their I/O on the calling thread and block it briefly (a
/// write costs an fsync). The store is meant for control-plane operations, not for per-packet paths.
/// A directory can be open in one `SledStore` (one process) at a time.
///
/// sled 0.34 is the last stable release (2021) and pulls unmaintained crates; this backend exists to
/// show that storage is swappable. [`RedbStore`](super::RedbStore) is the default.
pub struct SledStore {
    db: sled::Db,
    path: PathBuf,
    /// Trees of the tables that exist, so that reading a table that was never written does not create it.
    trees: RwLock<HashMap<String, sled::Tree>>,
    /// sled's log file, opened again to fsync it.
    log: File,
    /// Blob files already fsynced, with their length then (sled writes a file per large value and
    /// never syncs it).
    synced_blobs: Mutex<HashMap<OsString, u64>>,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// How long [`SledStore::open`] keeps trying a database whose lock another handle holds.
const LOCK_WAIT: Duration = Duration::from_secs(3);

/// Open the sled database at `path`, trying again (for up to [`LOCK_WAIT`]) while sled reports its lock
/// taken; sled itself tries only once. A lock can outlive its holder's close for a moment when a process
/// forked by another thread at that moment shares the descriptor until it execs (the crash test, whose
/// parent spawns children from two threads, sees this). Trying sled's own open again, rather than probing
/// the lock first, matters: a probe's lock can leak the same way and then fail the open that follows it
/// (the crash test failed so on CI). A lock that stays taken is reported as sled reports it.
fn open_db(path: &Path, op: &str) -> Result<sled::Db> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match sled::Config::new().path(path).open() {
            Err(sled::Error::Io(e)) if is_lock_conflict(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            result => return result.map_err(|e| store_error(op, e)),
        }
    }
}

/// Whether `e` is sled 0.34's "could not acquire lock" (an `Other` error carrying fs2's `WouldBlock`;
/// sled keeps no other trace of the cause).
fn is_lock_conflict(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Other && e.to_string().starts_with("could not acquire lock")
}

fn store_error(op: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Store {
        backend: "sled",
        op: op.into(),
        source: Box::new(source),
    }
}

/// Create a new database at `path` atomically: sled writes its first files in a sibling directory, which
/// is renamed into place only once they are on disk. sled 0.34 cannot reopen a database whose creation a
/// crash interrupted ("Read corrupted data"); a database that never finished creating held no
/// acknowledged write, so what such a crash leaves is simply discarded here.
fn create(path: &Path, op: &str) -> Result<()> {
    let mut name = path.file_name().map(std::ffi::OsString::from).unwrap_or_default();
    name.push(".creating");
    let staging = path.with_file_name(name);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| Error::io(&staging, e))?;
    }
    let db = sled::Config::new()
        .path(&staging)
        .open()
        .map_err(|e| store_error(op, e))?;
    db.flush().map_err(|e| store_error(op, e))?;
    drop(db);
    for entry in std::fs::read_dir(&staging).map_err(|e| Error::io(&staging, e))? {
        let entry = entry.map_err(|e| Error::io(&staging, e))?;
        if entry.path().is_file() {
            File::open(entry.path())
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::io(entry.path(), e))?;
        }
    }
    sync_dir(&staging)?;
    std::fs::rename(&staging, path).map_err(|e| Error::io(path, e))?;
    sync_dir(path.parent().unwrap_or(path))
}

fn tree_name(table: &str) -> Vec<u8> {
    [TREE_PREFIX, table.as_bytes()].concat()
}

impl SledStore {
    /// Open the sled database directory at `path`, creating it when missing.
    ///
    /// When another handle holds the database's lock, this keeps trying for up to three seconds
    /// before failing.
    ///
    /// # Errors
    /// [`Error::Store`] when the directory cannot be opened, holds no sled database, is damaged, or is
    /// already open (in this process or another); [`Error::Io`] when its files cannot be synced.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let op = format!("open {}", path.display());
        if !path.exists() {
            create(&path, &op)?;
        }
        let db = open_db(&path, &op)?;
        let mut trees = HashMap::new();
        for name in db.tree_names() {
            let Some(table) = name.strip_prefix(TREE_PREFIX) else {
                continue;
            };
            // Names under the prefix were written by this store; skip anything else rather than trust it.
            let Ok(table) = std::str::from_utf8(table) else {
                continue;
            };
            if check_table(table).is_err() {
                continue;
            }
            let tree = db.open_tree(&name).map_err(|e| store_error(&op, e))?;
            trees.insert(table.to_owned(), tree);
        }
        let tables = trees.len();
        let log_path = path.join("db");
        let log = File::options()
            .read(true)
            .write(true)
            .open(&log_path)
            .map_err(|e| Error::io(&log_path, e))?;
        let store = Self {
            db,
            path,
            trees: RwLock::new(trees),
            log,
            synced_blobs: Mutex::new(HashMap::new()),
        };
        // Whatever sled recovered or created is on disk before the first write is acknowledged.
        store.sync(&op)?;
        sync_dir(&store.path)?;
        sync_dir(store.path.parent().unwrap_or(&store.path))?;
        tracing::debug!(path = %store.path.display(), tables, "sled store opened");
        Ok(store)
    }

    /// Open (or create) the database directory `<data_dir>/sled`, creating `data_dir` and its parents
    /// when missing (a directory created here is private to the user on Unix, mode 0700).
    ///
    /// # Errors
    /// [`Error::Io`] when the directory cannot be created; otherwise as [`SledStore::open`].
    pub fn open_in_data_dir(data_dir: impl AsRef<Path>) -> Result<Self> {
        let data_dir = data_dir.as_ref();
        create_private_dir(data_dir)?;
        Self::open(data_dir.join(DIR_NAME))
    }

    /// The path of the database directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tree of `table` if the table exists.
    fn existing_tree(&self, table: &str) -> Option<sled::Tree> {
        // The map is only ever inserted into whole, so a panic elsewhere cannot leave it inconsistent.
        self.trees
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(table)
            .cloned()
    }

    /// The tree of `table`, created when missing.
    fn tree(&self, table: &str, op: &str) -> Result<sled::Tree> {
        if let Some(tree) = self.existing_tree(table) {
            return Ok(tree);
        }
        let mut trees = self.trees.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(tree) = trees.get(table) {
            return Ok(tree.clone());
        }
        let tree = self
            .db
            .open_tree(tree_name(table))
            .map_err(|e| store_error(op, e))?;
        trees.insert(table.to_owned(), tree.clone());
        Ok(tree)
    }

    /// Make every write so far durable.
    fn flush(&self, op: &str) -> Result<()> {
        self.db.flush().map_err(|e| store_error(op, e))?;
        self.sync(op)
    }

    /// Complete sled's flush with an fsync of the log file and of new blob files (see the type docs).
    fn sync(&self, op: &str) -> Result<()> {
        self.log.sync_all().map_err(|e| store_error(op, e))?;
        let blobs = self.path.join("blobs");
        let entries = match std::fs::read_dir(&blobs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(store_error(op, e)),
        };
        let mut synced = self.synced_blobs.lock().unwrap_or_else(PoisonError::into_inner);
        let mut present = HashMap::new();
        let mut new = false;
        for entry in entries {
            let entry = entry.map_err(|e| store_error(op, e))?;
            let name = entry.file_name();
            // A blob is written once, but another thread's may still be growing: it counts as synced
            // only at the length it had when it was synced.
            let synced_len = synced.get(&name).copied();
            let len = match entry.metadata().map(|m| m.len()).and_then(|len| {
                if synced_len != Some(len) {
                    File::open(blobs.join(&name))?.sync_all()?;
                }
                Ok(len)
            }) {
                Ok(len) => len,
                // sled removes blobs it no longer needs; one may vanish between listing and syncing.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(store_error(op, e)),
            };
            new |= synced_len != Some(len);
            present.insert(name, len);
        }
        *synced = present;
        if new {
            sync_dir(&blobs)?;
        }
        Ok(())
    }

    fn get_blocking(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_table(table)?;
        let Some(tree) = self.existing_tree(table) else {
            return Ok(None);
        };
        let value = tree
            .get(key)
            .map_err(|e| store_error(format!("get {table}"), e))?;
        Ok(value.map(|v| v.to_vec()))
    }

    fn put_blocking(&self, table: &str, key: &[u8], value: &[u8]) -> Result<()> {
        check_table(table)?;
        let op = format!("put {table}");
        let tree = self.tree(table, &op)?;
        tree.insert(key, value).map_err(|e| store_error(&op, e))?;
        self.flush(&op)
    }

    fn delete_blocking(&self, table: &str, key: &[u8]) -> Result<bool> {
        check_table(table)?;
        let op = format!("delete {table}");
        let Some(tree) = self.existing_tree(table) else {
            return Ok(false);
        };
        let present = tree.remove(key).map_err(|e| store_error(&op, e))?.is_some();
        // Flush even when the key was absent: a concurrent delete of the same key may have removed it
        // without having flushed yet, and "absent" must be durable when this call says so.
        self.flush(&op)?;
        Ok(present)
    }

    fn scan_blocking(&self, table: &str, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        check_table(table)?;
        let Some(tree) = self.existing_tree(table) else {
            return Ok(Vec::new());
        };
        tree.scan_prefix(prefix)
            .map(|entry| {
                entry
                    .map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(|e| store_error(format!("scan {table}"), e))
            })
            .collect()
    }

    fn batch_blocking(&self, ops: &[BatchOp]) -> Result<()> {
        // Validate everything before touching the database: an invalid op anywhere applies nothing.
        for op in ops {
            check_table(op.table())?;
        }
        if ops.is_empty() {
            return Ok(());
        }
        let op_name = format!("batch of {} operations", ops.len());
        // One entry per distinct table: a sled transaction must not list a tree twice.
        let mut tables: Vec<&str> = Vec::new();
        let mut plan: Vec<(usize, &BatchOp)> = Vec::with_capacity(ops.len());
        for op in ops {
            let index = match tables.iter().position(|t| *t == op.table()) {
                Some(index) => index,
                None => {
                    tables.push(op.table());
                    tables.len() - 1
                }
            };
            plan.push((index, op));
        }
        let trees = tables
            .iter()
            .map(|t| self.tree(t, &op_name))
            .collect::<Result<Vec<_>>>()?;
        let result: Result<(), TransactionError<Infallible>> =
            trees
                .as_slice()
                .transaction(|views| -> ConflictableTransactionResult<(), Infallible> {
                    for (index, op) in &plan {
                        let view = &views[*index];
                        match op {
                            BatchOp::Put { key, value, .. } => {
                                view.insert(key.as_slice(), value.as_slice())?;
                            }
                            BatchOp::Delete { key, .. } => {
                                view.remove(key.as_slice())?;
                            }
                        }
                    }
                    Ok(())
                });
        match result {
            Ok(()) => {}
            Err(TransactionError::Abort(never)) => match never {},
            Err(TransactionError::Storage(e)) => return Err(store_error(&op_name, e)),
        }
        self.flush(&op_name)
    }
}

#[async_trait::async_trait]
impl Store for SledStore {
    async fn get(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_blocking(table, key)
    }

    async fn put(&self, table: &str, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_blocking(table, key, value)
    }

    async fn delete(&self, table: &str, key: &[u8]) -> Result<bool> {
        self.delete_blocking(table, key)
    }

    async fn scan_prefix(&self, table: &str, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.scan_blocking(table, prefix)
    }

    async fn batch(&self, ops: Vec<BatchOp>) -> Result<()> {
        self.batch_blocking(&ops)
    }
}
