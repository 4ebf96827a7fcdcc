//! The default [`Store`] on redb: one database file, one redb table per store table, every write
//! transaction committed with immediate durability (fsync before the call returns).

use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadableDatabase, TableDefinition, TableError};

use super::{BatchOp, Store, check_table, create_private_dir, sync_dir};
use crate::error::{Error, Result};

/// Every store table is a redb table of byte keys to byte values.
type Bytes<'a> = TableDefinition<'a, &'static [u8], &'static [u8]>;

/// File name of the database inside the data directory.
const FILE_NAME: &str = "db";

/// A [`Store`] on a redb database file (the default backend, C2).
///
/// Each write (`put`, `delete`, `batch`) is one redb write transaction committed with
/// [`Durability::Immediate`]: the call returns only after the data is fsynced, so an acknowledged write
/// survives a crash of the process or the machine. Reads see the last committed state.
///
/// redb is synchronous: the `async` methods do their I/O on the calling thread and block it briefly (a
/// write costs an fsync, typically a few milliseconds). The store is meant for control-plane operations
/// (agents, secrets, grants), not for per-packet paths; a caller on a busy async runtime that writes
/// often can wrap calls in its runtime's blocking facility. Writes are serialized by redb; reads run
/// concurrently with each other and with a write.
///
/// The file is checked on open: the checksum of every committed page is verified (and a file left by a
/// crash is repaired), so a damaged file is reported as [`Error::Store`] instead of being trusted. This
/// reads the whole file once per open. A file can be open in one `RedbStore` (one process) at a time.
#[derive(Debug)]
pub struct RedbStore {
    db: Database,
    path: PathBuf,
}

impl RedbStore {
    /// Open the database file at `path`, creating it (but not its parent directory) when missing or
    /// empty. Creation is crash-safe: the file appears at `path` only once it is a complete, synced,
    /// empty database.
    ///
    /// # Errors
    /// [`Error::Store`] when the file cannot be opened or created, is not a redb database, is damaged
    /// beyond repair, or is already open (in this process or another); [`Error::Io`] when its directory
    /// cannot be synced.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let op = format!("open {}", path.display());
        match std::fs::metadata(&path) {
            Ok(meta) if meta.len() > 0 => {}
            Ok(_) => create_file(&path, &op, true)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_file(&path, &op, false)?,
            Err(e) => return Err(store_error(op, e)),
        }
        let db = Database::builder()
            .set_check_integrity_on_open(true)
            .open(&path)
            .map_err(|e| store_error(&op, e))?;
        tracing::debug!(path = %path.display(), "redb store opened");
        Ok(Self { db, path })
    }

    /// Open (or create) the database `<data_dir>/db`, creating `data_dir` and its parents when missing
    /// (a directory created here is private to the user on Unix, mode 0700).
    ///
    /// # Errors
    /// [`Error::Io`] when the directory cannot be created; otherwise as [`RedbStore::open`].
    pub fn open_in_data_dir(data_dir: impl AsRef<Path>) -> Result<Self> {
        let data_dir = data_dir.as_ref();
        create_private_dir(data_dir)?;
        // The data directory itself may be new.
        sync_dir(data_dir.parent().unwrap_or(data_dir))?;
        Self::open(data_dir.join(FILE_NAME))
    }

    /// The path of the database file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Create a new, empty database at `path` without a window in which a crash leaves a file there that
/// does not open: redb initialises a new file in place (a crash part-way leaves "not a redb database"
/// behind, found by the crash test), so the database is initialised and synced under a temporary name
/// first and then linked into place. `replace_empty` replaces an empty file found at `path`; otherwise
/// a file that appeared there in the meantime (another process) wins.
fn create_file(path: &Path, op: &str, replace_empty: bool) -> Result<()> {
    let mut temp_name = path.file_name().unwrap_or_default().to_os_string();
    temp_name.push(format!(".{}.new", std::process::id()));
    let temp = path.with_file_name(temp_name);
    match std::fs::remove_file(&temp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(store_error(op, e)),
    }
    let db = Database::builder()
        .create(&temp)
        .map_err(|e| store_error(op, e))?;
    db.close().map_err(|e| store_error(op, e))?;
    std::fs::File::open(&temp)
        .and_then(|f| f.sync_all())
        .map_err(|e| store_error(op, e))?;
    let linked = if replace_empty {
        std::fs::rename(&temp, path)
    } else {
        match std::fs::hard_link(&temp, path) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            // A file system without hard links: rename (which would replace a file created meanwhile).
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => std::fs::rename(&temp, path),
            other => other,
        }
    };
    linked.map_err(|e| store_error(op, e))?;
    match std::fs::remove_file(&temp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(store_error(op, e)),
    }
    sync_dir(path.parent().unwrap_or(Path::new("")))
}

fn store_error(op: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Store {
        backend: "redb",
        op: op.into(),
        source: Box::new(source),
    }
}

fn definition(table: &str) -> Bytes<'_> {
    TableDefinition::new(table)
}

impl RedbStore {
    /// Begin a write transaction that commits with immediate durability.
    fn begin_write(&self, op: &str) -> Result<redb::WriteTransaction> {
        let mut txn = self.db.begin_write().map_err(|e| store_error(op, e))?;
        // Immediate is redb's default; set it anyway so that the guarantee does not rest on a default.
        txn.set_durability(Durability::Immediate)
            .map_err(|e| store_error(op, e))?;
        Ok(txn)
    }

    /// Open `table` for reading; `None` when it was never written.
    fn read_table(
        &self,
        table: &str,
        op: &str,
    ) -> Result<Option<redb::ReadOnlyTable<&'static [u8], &'static [u8]>>> {
        let txn = self.db.begin_read().map_err(|e| store_error(op, e))?;
        match txn.open_table(definition(table)) {
            Ok(t) => Ok(Some(t)),
            Err(TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(store_error(op, e)),
        }
    }

    fn get_blocking(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_table(table)?;
        let op = format!("get {table}");
        let Some(t) = self.read_table(table, &op)? else {
            return Ok(None);
        };
        let value = t.get(key).map_err(|e| store_error(&op, e))?;
        Ok(value.map(|v| v.value().to_vec()))
    }

    fn put_blocking(&self, table: &str, key: &[u8], value: &[u8]) -> Result<()> {
        check_table(table)?;
        let op = format!("put {table}");
        let txn = self.begin_write(&op)?;
        {
            let mut t = txn
                .open_table(definition(table))
                .map_err(|e| store_error(&op, e))?;
            t.insert(key, value).map_err(|e| store_error(&op, e))?;
        }
        txn.commit().map_err(|e| store_error(&op, e))
    }

    fn delete_blocking(&self, table: &str, key: &[u8]) -> Result<bool> {
        check_table(table)?;
        let op = format!("delete {table}");
        let txn = self.begin_write(&op)?;
        let present = {
            let mut t = txn
                .open_table(definition(table))
                .map_err(|e| store_error(&op, e))?;
            let old = t.remove(key).map_err(|e| store_error(&op, e))?;
            old.is_some()
        };
        if present {
            txn.commit().map_err(|e| store_error(&op, e))?;
        } else {
            // Nothing changed (opening the table may have created it): roll back rather than pay an
            // fsync. Write transactions are serialized and each commit is durable before the next one
            // begins, so the absence observed here is already durable.
            txn.abort().map_err(|e| store_error(&op, e))?;
        }
        Ok(present)
    }

    fn scan_blocking(&self, table: &str, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        check_table(table)?;
        let op = format!("scan {table}");
        let Some(t) = self.read_table(table, &op)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        // Keys sharing the prefix are contiguous in key order: start at the prefix, stop at the first
        // key without it (no upper bound to compute, which keeps prefixes ending in 0xff simple).
        for entry in t.range::<&[u8]>(prefix..).map_err(|e| store_error(&op, e))? {
            let (k, v) = entry.map_err(|e| store_error(&op, e))?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push((k.value().to_vec(), v.value().to_vec()));
        }
        Ok(out)
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
        let txn = self.begin_write(&op_name)?;
        for op in ops {
            // One open table at a time: redb refuses to open the same table twice concurrently.
            let mut t = txn
                .open_table(definition(op.table()))
                .map_err(|e| store_error(&op_name, e))?;
            match op {
                BatchOp::Put { key, value, .. } => {
                    t.insert(key.as_slice(), value.as_slice())
                        .map_err(|e| store_error(&op_name, e))?;
                }
                BatchOp::Delete { key, .. } => {
                    t.remove(key.as_slice()).map_err(|e| store_error(&op_name, e))?;
                }
            }
        }
        // On any error above, dropping `txn` aborts it: nothing of the batch is applied.
        txn.commit().map_err(|e| store_error(&op_name, e))
    }
}

#[async_trait::async_trait]
impl Store for RedbStore {
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
