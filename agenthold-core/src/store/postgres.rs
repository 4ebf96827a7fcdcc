//! [`PgStore`]: the store in a PostgreSQL database (cargo feature `postgres`), for a platform that keeps its
//! state in the database it already backs up and monitors, and the first step past one host
//! (`docs/scale-out.md`).
//!
//! Layout: one table `agenthold_kv (tbl text, key bytea, value bytea, PRIMARY KEY (tbl, key))` holds every
//! store table; `agenthold_schema` holds the schema version. Both are created on first use, under an
//! advisory lock so that several processes opening a new database at once create them once. A binary
//! refuses a database whose schema is newer than the one it knows, instead of writing into it.
//!
//! Durability: every write is one transaction committed with `synchronous_commit = on` (set on every
//! connection, whatever the server's default), so an acknowledged write is on the server's disk. A batch is
//! one statement (one round trip, one transaction): its operations collapsed to the last one per key, the
//! deletes and the upserts of one `WITH … DELETE … INSERT … ON CONFLICT`. A prefix scan is a range query on the primary key (`bytea` compares bytewise, the
//! store's key order).
//!
//! When the database cannot be reached, calls fail with [`ErrorKind::Unavailable`] (the server answers 503):
//! reads retry with backoff for up to [`PgOptions::read_retry`] first; writes are tried once more on a
//! fresh connection (a put or a batch has the same effect when applied twice) and then fail, so a caller
//! learns quickly that nothing was written. Everything recovers by itself when the database is back:
//! broken connections are dropped from the pool and new ones made.
//!
//! The password is never part of a message: errors and logs name the URL with its password replaced by
//! `***`.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::config::SslMode;

use super::{BatchOp, Store, check_table, is_postgres_url, redact_url};
use crate::error::{Error, ErrorKind, Result};

/// The schema version this binary creates and understands.
pub const SCHEMA_VERSION: i32 = 1;

/// Key of the advisory lock held while the schema is checked and created (any fixed number: "agentho").
const SCHEMA_LOCK: i64 = 0x0061_6765_6e74_686f;

/// How a [`PgStore`] connects and how long it waits. Every field has a default, stated on it.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// `postgres://user[:password]@host[:port]/database[?sslmode=disable|prefer|require]`; `postgresql://`
    /// works too. A password in the URL works but belongs in [`PgOptions::password`] (from a file or the
    /// environment), so that the URL can be shown.
    pub url: String,
    /// The password, when not in the URL. Default: none.
    pub password: Option<String>,
    /// Extra CA certificates (PEM) trusted for TLS besides the web PKI roots, for a server whose certificate
    /// a private CA signed. Default: none.
    pub ca_pem: Option<Vec<u8>>,
    /// Connections kept at most. Default: `16`.
    pub max_connections: usize,
    /// Time to connect (TCP, TLS and authentication) to the server. Default: 5 s.
    pub connect_timeout: Duration,
    /// Time a call waits for a free connection of the pool. Default: 10 s.
    pub wait_timeout: Duration,
    /// How long a read keeps retrying while the database cannot be reached. Default: 2 s.
    pub read_retry: Duration,
    /// Longest time one statement may run on the server (`statement_timeout`). Default: 30 s.
    pub statement_timeout: Duration,
    /// Claim the database for this process: [`PgStore::connect`] fails with [`ErrorKind::Conflict`] while
    /// another process holds the claim, and the claim is held (and taken again after the database was
    /// away) for as long as the store lives. The runtime and the server set it: they assume they are the
    /// only process on their store (`docs/scale-out.md`). Default: `false`.
    pub exclusive: bool,
}

impl PgOptions {
    /// Options for `url` with every other field at its default.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            password: None,
            ca_pem: None,
            max_connections: 16,
            connect_timeout: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(10),
            read_retry: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(30),
            exclusive: false,
        }
    }
}

/// A [`Store`] in a PostgreSQL database (see the [module docs](self)). Cheap to share: clones of the
/// inside are reference-counted. Several stores, in one process or several, may use one database at once
/// (they see each other's writes); [`PgOptions::exclusive`] claims it for one. Must be used inside a tokio
/// runtime.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    /// The URL without its password, for messages.
    shown: Arc<str>,
    read_retry: Duration,
    /// The claim on the database ([`PgOptions::exclusive`]), released when the last clone goes.
    _claim: Option<Arc<Claim>>,
}

/// Holds the exclusive claim: a task that keeps the connection holding the advisory lock, and takes the
/// lock again on a new connection when that one broke (the database restarted).
struct Claim(tokio::task::JoinHandle<()>);

impl Drop for Claim {
    fn drop(&mut self) {
        // The task owns the connection that holds the lock: aborting it closes the connection, and the
        // server releases the lock.
        self.0.abort();
    }
}

/// The advisory lock (two-key form: "agnt", 1) that the exclusive claim holds.
const CLAIM_LOCK: (i32, i32) = (0x6167_6e74, 1);

/// Take the claim lock on a connection of its own, or say who holds it.
async fn try_claim(pool: &Pool, shown: &str) -> Result<deadpool_postgres::ClientWrapper> {
    let op = "claim";
    let pg_error = |e: tokio_postgres::Error| classified(op, shown, e);
    let client = pool.get().await.map_err(|e| pool_error(op, shown, e))?;
    let got: bool = client
        .query_one(
            "SELECT pg_try_advisory_lock($1, $2)",
            &[&CLAIM_LOCK.0, &CLAIM_LOCK.1],
        )
        .await
        .map_err(pg_error)?
        .get(0);
    if got {
        return Ok(deadpool_postgres::Object::take(client));
    }
    let holder = client
        .query_opt(
            "SELECT coalesce(host(a.client_addr), 'a local socket'), a.pid, a.application_name \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
               AND l.classid::bigint = $1 AND l.objid::bigint = $2 LIMIT 1",
            &[&i64::from(CLAIM_LOCK.0), &i64::from(CLAIM_LOCK.1)],
        )
        .await
        .ok()
        .flatten()
        .map(|row| {
            let (addr, pid, app): (String, i32, String) = (row.get(0), row.get(1), row.get(2));
            format!(" (held by {app:?} connected from {addr}, server process {pid})")
        })
        .unwrap_or_default();
    Err(Error::backend(
        ErrorKind::Conflict,
        format!("postgres {op} ({shown})"),
        format!(
            "another agenthold process uses this database{holder}: run one server or runtime per \
             database (docs/scale-out.md)"
        ),
    ))
}

/// A pool error of `op`: the database's error classified, or out of reach (a timeout, a closed pool).
fn pool_error(op: &str, shown: &str, e: PoolError) -> Error {
    match e {
        PoolError::Backend(e) => classified(op, shown, e),
        other => Error::backend(
            ErrorKind::Unavailable,
            format!("postgres {op} ({shown})"),
            other.to_string(),
        ),
    }
}

/// A database error of `op` as a core error, by [`classify`]: out of reach is [`ErrorKind::Unavailable`],
/// a refused login, database or TLS handshake [`ErrorKind::Config`], anything else a store error.
fn classified(op: &str, shown: &str, e: tokio_postgres::Error) -> Error {
    match classify(&e) {
        ErrorKind::Unavailable => Error::backend(
            ErrorKind::Unavailable,
            format!("postgres {op} ({shown}): the database cannot be reached"),
            e,
        ),
        ErrorKind::Config if e.as_db_error().is_none() => Error::backend(
            ErrorKind::Config,
            format!(
                "postgres {op} ({shown}): TLS with the server fails (is its certificate signed by a public \
                 root or by store_ca_file, for the URL's host?)"
            ),
            e,
        ),
        ErrorKind::Config => Error::backend(
            ErrorKind::Config,
            format!("postgres {op} ({shown}): the server refuses the login or the database"),
            e,
        ),
        _ => Error::Store {
            backend: "postgres",
            op: format!("{op} ({shown})"),
            source: Box::new(e),
        },
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &self.shown)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connect to the database at `options.url`, check it answers, and create or check the schema.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for a URL that does not parse, a CA that does not parse, a login, database or
    /// server certificate the server or the client refuses; [`ErrorKind::Unavailable`] when the server
    /// cannot be reached;
    /// [`ErrorKind::Storage`] when the schema is newer than this binary's or cannot be created;
    /// [`ErrorKind::Conflict`] when [`PgOptions::exclusive`] is set and another process holds the claim.
    /// Every message names the URL without its password.
    pub async fn connect(options: PgOptions) -> Result<Self> {
        let shown: Arc<str> = redact_url(&options.url).into();
        let config_error = |problem: String| Error::Config {
            key: "store".into(),
            problem: format!("{shown}: {problem}"),
        };
        if !is_postgres_url(&options.url) {
            return Err(config_error(
                "not a PostgreSQL URL (postgres://user@host:port/database)".into(),
            ));
        }
        let mut pg = tokio_postgres::Config::from_str(&options.url).map_err(|e| {
            config_error(format!(
                "does not parse: {}",
                redact_text(&e.to_string(), &options)
            ))
        })?;
        if let Some(password) = &options.password {
            pg.password(password.as_bytes());
        }
        if pg.get_dbname().is_none() {
            return Err(config_error(
                "names no database (postgres://user@host/DATABASE)".into(),
            ));
        }
        pg.connect_timeout(options.connect_timeout);
        if pg.get_application_name().is_none() {
            pg.application_name("agenthold");
        }
        // Durability on return must not rest on the server's default (C2).
        pg.options(format!(
            "-c synchronous_commit=on -c statement_timeout={}",
            options.statement_timeout.as_millis()
        ));
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match pg.get_ssl_mode() {
            SslMode::Disable => Manager::from_config(pg, tokio_postgres::NoTls, manager_config),
            _ => {
                let tls = tls_config(options.ca_pem.as_deref()).map_err(config_error)?;
                Manager::from_config(
                    pg,
                    tokio_postgres_rustls::MakeRustlsConnect::new(tls),
                    manager_config,
                )
            }
        };
        let pool = Pool::builder(manager)
            .max_size(options.max_connections.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.wait_timeout))
            .create_timeout(Some(options.connect_timeout + Duration::from_secs(1)))
            .recycle_timeout(Some(options.connect_timeout))
            .build()
            .map_err(|e| config_error(format!("connection pool: {e}")))?;
        let mut store = Self {
            pool,
            shown,
            read_retry: options.read_retry,
            _claim: None,
        };
        if options.exclusive {
            store._claim = Some(Arc::new(store.claim().await?));
        }
        store.migrate().await?;
        tracing::debug!(url = %store.shown, "postgres store opened");
        Ok(store)
    }

    /// The URL the store connects to, without its password.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// Create the schema, or check the one found.
    async fn migrate(&self) -> Result<()> {
        let op = "open";
        let mut client = self.client(op).await?;
        let txn = client.transaction().await.map_err(|e| self.error(op, e))?;
        txn.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
            .await
            .map_err(|e| self.error(op, e))?;
        txn.batch_execute(
            "CREATE TABLE IF NOT EXISTS agenthold_schema (\
                 id int PRIMARY KEY CHECK (id = 1), version int NOT NULL)",
        )
        .await
        .map_err(|e| self.error(op, e))?;
        let found: Option<i32> = txn
            .query_opt("SELECT version FROM agenthold_schema WHERE id = 1", &[])
            .await
            .map_err(|e| self.error(op, e))?
            .map(|row| row.get(0));
        match found {
            Some(version) if version > SCHEMA_VERSION => {
                return Err(Error::Store {
                    backend: "postgres",
                    op: format!("open {}", self.shown),
                    source: format!(
                        "the database has schema version {version}, newer than this binary's \
                         ({SCHEMA_VERSION}): a newer agenthold wrote it; upgrade agenthold"
                    )
                    .into(),
                });
            }
            Some(_) => {}
            None => {
                txn.batch_execute(
                    "CREATE TABLE IF NOT EXISTS agenthold_kv (\
                         tbl text NOT NULL, key bytea NOT NULL, value bytea NOT NULL, \
                         PRIMARY KEY (tbl, key))",
                )
                .await
                .map_err(|e| self.error(op, e))?;
                txn.execute(
                    "INSERT INTO agenthold_schema (id, version) VALUES (1, $1)",
                    &[&SCHEMA_VERSION],
                )
                .await
                .map_err(|e| self.error(op, e))?;
            }
        }
        txn.commit().await.map_err(|e| self.error(op, e))
    }

    /// A connection from the pool.
    async fn client(&self, op: &str) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(|e| pool_error(op, &self.shown, e))
    }

    /// A database error of `op`, classified.
    fn error(&self, op: &str, e: tokio_postgres::Error) -> Error {
        classified(op, &self.shown, e)
    }

    /// Hold the claim on the database from now on (see [`PgOptions::exclusive`]).
    async fn claim(&self) -> Result<Claim> {
        let first = try_claim(&self.pool, &self.shown).await?;
        let (pool, shown) = (self.pool.clone(), Arc::clone(&self.shown));
        Ok(Claim(tokio::spawn(async move {
            let mut held = Some(first);
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if held.as_ref().is_some_and(|c| !c.is_closed()) {
                    continue;
                }
                if held.take().is_some() {
                    tracing::warn!(url = %shown, "the connection holding the claim on the database broke");
                }
                match try_claim(&pool, &shown).await {
                    Ok(client) => {
                        tracing::info!(url = %shown, "the claim on the database is held again");
                        held = Some(client);
                    }
                    Err(e) if e.kind() == ErrorKind::Conflict => {
                        tracing::error!(url = %shown, error = %e, "another process took the database");
                        tokio::time::sleep(Duration::from_secs(10)).await;
                    }
                    Err(_) => {} // still away: try again in a second
                }
            }
        })))
    }

    /// Run a read, retrying with backoff while the database cannot be reached, for up to `read_retry`.
    async fn read<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let deadline = tokio::time::Instant::now() + self.read_retry;
        let mut pause = Duration::from_millis(25);
        loop {
            match attempt().await {
                Err(e)
                    if e.kind() == ErrorKind::Unavailable
                        && tokio::time::Instant::now() + pause < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                other => return other,
            }
        }
    }

    /// Run a write; when the database could not be reached, try once more on a fresh connection (a stale
    /// pooled connection whose server restarted fails its first use).
    async fn write<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        match attempt().await {
            Err(e) if e.kind() == ErrorKind::Unavailable => attempt().await,
            other => other,
        }
    }

    async fn try_get(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let op = "get";
        let client = self.client(op).await?;
        let stmt = client
            .prepare_cached("SELECT value FROM agenthold_kv WHERE tbl = $1 AND key = $2")
            .await
            .map_err(|e| self.error(op, e))?;
        let row = client
            .query_opt(&stmt, &[&table, &key])
            .await
            .map_err(|e| self.error(op, e))?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn try_put(&self, table: &str, key: &[u8], value: &[u8]) -> Result<()> {
        let op = "put";
        let client = self.client(op).await?;
        let stmt = client
            .prepare_cached(UPSERT)
            .await
            .map_err(|e| self.error(op, e))?;
        client
            .execute(&stmt, &[&table, &key, &value])
            .await
            .map_err(|e| self.error(op, e))?;
        Ok(())
    }

    async fn try_delete(&self, table: &str, key: &[u8]) -> Result<bool> {
        let op = "delete";
        let client = self.client(op).await?;
        let stmt = client
            .prepare_cached(DELETE)
            .await
            .map_err(|e| self.error(op, e))?;
        let n = client
            .execute(&stmt, &[&table, &key])
            .await
            .map_err(|e| self.error(op, e))?;
        Ok(n > 0)
    }

    async fn try_scan(&self, table: &str, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let op = "scan_prefix";
        let client = self.client(op).await?;
        let rows = match prefix_end(prefix) {
            Some(end) => {
                let stmt = client
                    .prepare_cached(
                        "SELECT key, value FROM agenthold_kv \
                         WHERE tbl = $1 AND key >= $2 AND key < $3 ORDER BY key",
                    )
                    .await
                    .map_err(|e| self.error(op, e))?;
                client.query(&stmt, &[&table, &prefix, &end]).await
            }
            None => {
                let stmt = client
                    .prepare_cached(
                        "SELECT key, value FROM agenthold_kv WHERE tbl = $1 AND key >= $2 ORDER BY key",
                    )
                    .await
                    .map_err(|e| self.error(op, e))?;
                client.query(&stmt, &[&table, &prefix]).await
            }
        }
        .map_err(|e| self.error(op, e))?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn try_batch(&self, ops: &[BatchOp]) -> Result<()> {
        let op = "batch";
        // Applying the operations in order leaves each key as its last operation says: collapse them to
        // that, then write everything with one statement (one round trip, atomic like any statement).
        let mut last: BTreeMap<(&str, &[u8]), Option<&[u8]>> = BTreeMap::new();
        for item in ops {
            match item {
                BatchOp::Put { table, key, value } => {
                    last.insert((table.as_str(), key.as_slice()), Some(value.as_slice()))
                }
                BatchOp::Delete { table, key } => last.insert((table.as_str(), key.as_slice()), None),
            };
        }
        let (mut gone_tables, mut gone_keys) = (Vec::new(), Vec::new());
        let (mut tables, mut keys, mut values) = (Vec::new(), Vec::new(), Vec::new());
        for ((table, key), value) in last {
            match value {
                Some(value) => {
                    tables.push(table);
                    keys.push(key);
                    values.push(value);
                }
                None => {
                    gone_tables.push(table);
                    gone_keys.push(key);
                }
            }
        }
        let client = self.client(op).await?;
        let stmt = client
            .prepare_cached(BATCH)
            .await
            .map_err(|e| self.error(op, e))?;
        client
            .execute(&stmt, &[&gone_tables, &gone_keys, &tables, &keys, &values])
            .await
            .map_err(|e| self.error(op, e))?;
        Ok(())
    }
}

const UPSERT: &str = "INSERT INTO agenthold_kv (tbl, key, value) VALUES ($1, $2, $3) \
                      ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value";
const DELETE: &str = "DELETE FROM agenthold_kv WHERE tbl = $1 AND key = $2";
/// A whole batch: the keys whose last operation deletes them ($1, $2), and those it sets ($3-$5); the
/// two sets are disjoint, so the delete and the upsert of one statement never touch the same row.
const BATCH: &str = "WITH gone AS (\
                         DELETE FROM agenthold_kv k USING unnest($1::text[], $2::bytea[]) AS d(tbl, key) \
                         WHERE k.tbl = d.tbl AND k.key = d.key) \
                     INSERT INTO agenthold_kv (tbl, key, value) \
                     SELECT * FROM unnest($3::text[], $4::bytea[], $5::bytea[]) \
                     ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value";

#[async_trait::async_trait]
impl Store for PgStore {
    async fn get(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_table(table)?;
        self.read(|| self.try_get(table, key)).await
    }

    async fn put(&self, table: &str, key: &[u8], value: &[u8]) -> Result<()> {
        check_table(table)?;
        self.write(|| self.try_put(table, key, value)).await
    }

    async fn delete(&self, table: &str, key: &[u8]) -> Result<bool> {
        check_table(table)?;
        // A retried delete whose first attempt committed unseen reports the key absent: the effect is the
        // same, only the answer differs, and only when the database failed during that very call.
        self.write(|| self.try_delete(table, key)).await
    }

    async fn scan_prefix(&self, table: &str, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        check_table(table)?;
        self.read(|| self.try_scan(table, prefix)).await
    }

    async fn batch(&self, ops: Vec<BatchOp>) -> Result<()> {
        for op in &ops {
            check_table(op.table())?;
        }
        if ops.is_empty() {
            return Ok(());
        }
        self.write(|| self.try_batch(&ops)).await
    }
}

/// The smallest key greater than every key starting with `prefix`, or `None` when there is none (an empty
/// prefix, or one of only `0xff` bytes).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// What a database error means for the caller: [`ErrorKind::Unavailable`] when the database is out of
/// reach (no answer, connection refused, reset or closed, the server shutting down or starting up),
/// [`ErrorKind::Config`] when it refuses the login or does not know the database, [`ErrorKind::Storage`]
/// when it refused the statement.
fn classify(e: &tokio_postgres::Error) -> ErrorKind {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        return if code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300") {
            // 08: connection exception; 57P01-03: admin shutdown, crash shutdown, cannot connect now;
            // 53300: too many connections.
            ErrorKind::Unavailable
        } else if code.starts_with("28") || code == "3D000" {
            // 28: invalid authorization; 3D000: no such database.
            ErrorKind::Config
        } else {
            ErrorKind::Storage
        };
    }
    let text = e.to_string();
    if text.starts_with("error serializing") || text.starts_with("error deserializing") {
        ErrorKind::Storage
    } else if text.starts_with("error performing TLS handshake") {
        // The server answers but its certificate is not trusted (or TLS is misconfigured): the
        // configuration's to fix (`store_ca_file`, `sslmode`), not a passing outage.
        ErrorKind::Config
    } else {
        // No server answer at all: I/O, closed, timeout, TLS, connect errors.
        ErrorKind::Unavailable
    }
}

/// `text` with the password of `options` (given or in the URL) replaced by `***`: a parser's message may
/// quote the part of the URL it did not understand.
fn redact_text(text: &str, options: &PgOptions) -> String {
    let mut out = text.to_owned();
    let from_url = tokio_postgres::Config::from_str(&options.url)
        .ok()
        .and_then(|c| c.get_password().map(<[u8]>::to_vec));
    for secret in [options.password.clone().map(String::into_bytes), from_url]
        .into_iter()
        .flatten()
    {
        if let Ok(secret) = String::from_utf8(secret)
            && !secret.is_empty()
        {
            out = out.replace(&secret, "***");
        }
    }
    if let Some(start) = options.url.find("://")
        && let Some(at) = options.url[start + 3..].find('@')
        && let Some(colon) = options.url[start + 3..start + 3 + at].find(':')
    {
        let password = &options.url[start + 3 + colon + 1..start + 3 + at];
        if !password.is_empty() {
            out = out.replace(password, "***");
        }
    }
    out
}

/// The TLS client configuration: the web PKI roots plus the extra CA certificates in `ca_pem`.
fn tls_config(ca_pem: Option<&[u8]>) -> std::result::Result<rustls::ClientConfig, String> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = ca_pem {
        let mut added = 0;
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| format!("the CA file does not parse as PEM: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("a certificate of the CA file is not usable: {e}"))?;
            added += 1;
        }
        if added == 0 {
            return Err("the CA file holds no certificate".into());
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(prefix_end(b""), None);
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0, 0xff, 0xff]), Some(vec![1]));
    }
}
