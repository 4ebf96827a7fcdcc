//! The `Store` conformance suite and crash test (C2).
//!
//! The suite is written once, as functions over `&dyn Store`, and instantiated per backend by
//! `conformance!`: `redb::*` always, `sled::*` with `--features sled`, `postgres::*` with `--features
//! postgres` (against a throwaway PostgreSQL server on loopback, one database per test; `pg.rs`). The crash
//! test (`crash_redb`, `crash_sled`, `crash_postgres`) re-executes this binary as a writer
//! (`crash::crash_child`), kills it with SIGKILL at random moments and checks on reopen that nothing
//! acknowledged was lost, corrupted or half-applied; `crash_postgres_server` kills the database server
//! instead, mid-batch, and restarts it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::future::Future;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use agenthold_core::Error;
use agenthold_core::store::{BatchOp, RedbStore, Store};

/// Opens a backend inside a data directory.
type Opener = fn(&Path) -> agenthold_core::Result<Box<dyn Store>>;

fn open_redb(data_dir: &Path) -> agenthold_core::Result<Box<dyn Store>> {
    Ok(Box::new(RedbStore::open_in_data_dir(data_dir)?))
}

#[cfg(feature = "sled")]
fn open_sled(data_dir: &Path) -> agenthold_core::Result<Box<dyn Store>> {
    Ok(Box::new(agenthold_core::store::SledStore::open_in_data_dir(
        data_dir,
    )?))
}

/// Run a future to completion on the calling thread, inside the tests' shared tokio runtime (the
/// PostgreSQL store's connections are tokio tasks; the file stores never wait on anything but the disk).
/// Must not be called from inside the runtime.
fn block_on<F: Future>(future: F) -> F::Output {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
        })
        .block_on(future)
}

fn put(table: &str, key: &[u8], value: &[u8]) -> BatchOp {
    BatchOp::Put {
        table: table.to_owned(),
        key: key.to_vec(),
        value: value.to_vec(),
    }
}

fn del(table: &str, key: &[u8]) -> BatchOp {
    BatchOp::Delete {
        table: table.to_owned(),
        key: key.to_vec(),
    }
}

// The suite and the crash test live beside this file (`tests/store/`, which cargo does not build on its own).
#[path = "store/crash.rs"]
mod crash;
#[cfg(feature = "postgres")]
#[path = "store/pg.rs"]
mod pg;
#[path = "store/suite.rs"]
mod suite;

/// Instantiate the suite for one backend.
macro_rules! conformance {
    ($backend:ident, $open:path, [$($case:ident),* $(,)?], [$($path_case:ident),* $(,)?], #[$attr:meta]) => {
        mod $backend {
            $(
                #[test]
                #[$attr]
                fn $case() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = $open(dir.path()).unwrap();
                    super::block_on(super::suite::$case(&*store));
                }
            )*
            $(
                #[test]
                #[$attr]
                fn $path_case() {
                    let dir = tempfile::tempdir().unwrap();
                    super::suite::$path_case($open, dir.path());
                }
            )*
        }
    };
}

macro_rules! conformance_all {
    ($backend:ident, $open:path, [$($path_case:ident),* $(,)?], #[$attr:meta]) => {
        conformance!(
            $backend,
            $open,
            [
                get_missing,
                put_get_overwrite,
                delete_reports_presence,
                scan_prefix_order_and_bounds,
                tables_are_independent,
                batch_applies_all_in_order,
                batch_with_invalid_table_applies_nothing,
                invalid_table_names_rejected,
                concurrent_writers,
            ],
            [survives_reopen, vault_records_bind_their_rules, $($path_case),*],
            #[$attr]
        );
    };
}

// A file store is one process's (a second open is refused); a database is shared by design (server
// replicas), so the PostgreSQL store shows the second handle sees the first one's writes instead.
// The attribute goes on every test of the backend (`cfg(all())`, always true: none).
conformance_all!(redb, crate::open_redb, [second_open_is_an_error], #[cfg(all())]);
#[cfg(feature = "sled")]
conformance_all!(sled, crate::open_sled, [second_open_is_an_error], #[cfg(all())]);
#[cfg(feature = "postgres")]
conformance_all!(
    postgres,
    crate::pg::open_pg,
    [second_open_shares_the_data],
    #[ignore = "needs PostgreSQL (Debian postgresql): run with make test"]
);

/// The store is usable as a shared trait object (object safety, `Send + Sync`).
#[test]
fn store_is_a_shared_trait_object() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::from(open_redb(dir.path()).unwrap());
    let other = Arc::clone(&store);
    std::thread::spawn(move || block_on(other.put("t", b"k", b"v")).unwrap())
        .join()
        .unwrap();
    assert_eq!(
        block_on(store.get("t", b"k")).unwrap().as_deref(),
        Some(&b"v"[..])
    );
}

/// A file that is not a redb database, or a damaged one, is an error (or a repaired file), never a panic.
#[test]
fn redb_damaged_file_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage");
    std::fs::write(&path, vec![0x5a; 64 * 1024]).unwrap();
    let err = RedbStore::open(&path).unwrap_err();
    assert!(
        matches!(&err, Error::Store { backend: "redb", op, .. } if op.starts_with("open ")),
        "{err:?}"
    );

    // Flip bytes all over a real database: every outcome but a panic is acceptable, and a store that
    // opens must answer reads without panicking.
    let data_dir = dir.path().join("data");
    {
        let store = RedbStore::open_in_data_dir(&data_dir).unwrap();
        for i in 0..200u32 {
            block_on(store.put("t", &i.to_be_bytes(), &[i as u8; 300])).unwrap();
        }
    }
    let db = data_dir.join("db");
    let pristine = std::fs::read(&db).unwrap();
    for (n, offset) in (0..pristine.len()).step_by(4096 / 2 + 7).enumerate() {
        let mut bytes = pristine.clone();
        bytes[offset] ^= 0xa5;
        if let Some(b) = bytes.get_mut(offset + 1) {
            *b ^= 0x3c;
        }
        std::fs::write(&db, &bytes).unwrap();
        if let Ok(store) = RedbStore::open(&db) {
            let _ = block_on(store.scan_prefix("t", b""));
            let _ = block_on(store.get("t", &7u32.to_be_bytes()));
        }
        if n > 40 {
            break;
        }
    }
    // A truncated file, likewise.
    for len in [pristine.len() / 2, 4096, 100] {
        std::fs::write(&db, &pristine[..len]).unwrap();
        if let Ok(store) = RedbStore::open(&db) {
            let _ = block_on(store.scan_prefix("t", b""));
        }
    }
}

/// `RedbStore::open` does not create a missing parent directory (only `open_in_data_dir` does).
#[test]
fn redb_open_reports_missing_parent() {
    let dir = tempfile::tempdir().unwrap();
    let err = RedbStore::open(dir.path().join("missing").join("db")).unwrap_err();
    assert!(matches!(err, Error::Store { backend: "redb", .. }), "{err:?}");
}

// covers: C2
/// A sled lock that another descriptor still holds for a moment (a process forked by another thread
/// shares it until it execs) does not fail the open: the open tries again until the lock is free. The
/// crash test's parent once failed its reopen so on CI.
#[cfg(feature = "sled")]
#[test]
fn sled_open_waits_out_a_lock_released_a_moment_later() {
    let dir = tempfile::tempdir().unwrap();
    drop(open_sled(dir.path()).unwrap());
    let holder = std::fs::File::options()
        .read(true)
        .write(true)
        .open(dir.path().join("sled").join("db"))
        .unwrap();
    holder.lock().unwrap();
    let released = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(holder);
    });
    let store = open_sled(dir.path()).unwrap();
    released.join().unwrap();
    block_on(store.put("t", b"k", b"v")).unwrap();
}
