//! The PostgreSQL store against a real server: the opener the suite and the crash test use (one database
//! per data directory, in one throwaway server per test process), and what only a database store has to
//! show: its schema versioning, its errors when the database is away (without the password), and recovery
//! without reopening when it comes back.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use agenthold_core::ErrorKind;
use agenthold_core::store::{PgOptions, PgStore, SCHEMA_VERSION, Store};
use agenthold_testsupport::{PG_PASSWORD, TestPostgres};

use super::{block_on, put};

/// Set for the crash test's child: the server's base URL (`postgres://user@127.0.0.1:port`), so that the
/// child uses the parent's server instead of starting its own.
pub(crate) const SERVER_ENV: &str = "AGENTHOLD_TEST_STORE_PG";

/// The `application_name` of the crash test's child connections.
const CHILD_APPLICATION: &str = "crash_child";

/// Wait until the server has no connection of a killed crash-test child left: until then, a transaction
/// whose COMMIT it received may still be committing, and the check would race it.
pub(crate) fn wait_for_children_gone() {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server().psql(
        "postgres",
        &format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{CHILD_APPLICATION}'"),
    ) != "0"
    {
        assert!(
            Instant::now() < deadline,
            "a killed child's connection stays open"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// This process's server, started on first use (stopped by its watcher when the process ends).
fn server() -> &'static TestPostgres {
    static SERVER: OnceLock<TestPostgres> = OnceLock::new();
    SERVER.get_or_init(TestPostgres::start)
}

/// The base URL of the server the tests of this process use.
pub(crate) fn base_url() -> String {
    match std::env::var(SERVER_ENV) {
        Ok(url) => url,
        Err(_) => server().url("").trim_end_matches('/').to_owned(),
    }
}

/// One database per data directory (named after its path), created when missing.
fn database_for(dir: &Path) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in dir.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("t{h:016x}")
}

async fn create_database(name: &str) {
    let options = options(&format!("{}/postgres", base_url()));
    let mut config: tokio_postgres::Config = options.url.parse().unwrap();
    config.password(PG_PASSWORD);
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    let task = tokio::spawn(connection);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.batch_execute(&format!("CREATE DATABASE {name}")).await {
            Ok(()) => break,
            // 42P04: it exists.
            Err(e) if e.code().is_some_and(|c| c.code() == "42P04") => break,
            // 55006: another session (a create killed a moment ago) still uses the template; 23505: a
            // concurrent create of the same name.
            Err(e)
                if e.code().is_some_and(|c| matches!(c.code(), "55006" | "23505"))
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("create database {name}: {e:?}"),
        }
    }
    drop(client);
    let _ = task.await;
}

fn options(url: &str) -> PgOptions {
    let mut options = PgOptions::new(url);
    options.password = Some(PG_PASSWORD.to_owned());
    options
}

/// The suite's opener: the database of `dir` in this process's server.
pub(crate) fn open_pg(dir: &Path) -> agenthold_core::Result<Box<dyn Store>> {
    let name = database_for(dir);
    let mut url = format!("{}/{name}", base_url());
    if std::env::var_os(SERVER_ENV).is_some() {
        // The crash test's child: named, so that the parent can wait until its connections are gone.
        url.push_str(&format!("?application_name={CHILD_APPLICATION}"));
    }
    block_on(async {
        create_database(&name).await;
        Ok(Box::new(PgStore::connect(options(&url)).await?) as Box<dyn Store>)
    })
}

/// A fresh database in this process's server and its URL (no password in it).
fn fresh_database(label: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let name = database_for(&dir.path().join(label));
    block_on(create_database(&name));
    format!("{}/{name}", base_url())
}

// covers: C2
/// A database written by a newer agenthold (a higher schema version) is refused with a message that says
/// so, and nothing is written into it; the schema is created once however many stores open a new
/// database at once.
#[test]
#[ignore = "needs PostgreSQL (Debian postgresql): run with make test"]
fn schema_is_versioned_and_a_newer_one_is_refused() {
    let url = fresh_database("schema");
    block_on(async {
        // Eight stores open the new database at once: one creates the schema, all succeed.
        let opens: Vec<_> = (0..8)
            .map(|_| tokio::spawn(PgStore::connect(options(&url))))
            .collect();
        for open in opens {
            open.await.unwrap().unwrap();
        }
    });
    let name = url.rsplit('/').next().unwrap();
    let pg = server();
    assert_eq!(
        pg.psql(name, "SELECT version FROM agenthold_schema"),
        SCHEMA_VERSION.to_string()
    );
    pg.psql(
        name,
        &format!("UPDATE agenthold_schema SET version = {}", SCHEMA_VERSION + 1),
    );
    let err = block_on(PgStore::connect(options(&url))).unwrap_err();
    let text = err.to_string() + &format!("{:?}", std::error::Error::source(&err));
    assert_eq!(err.kind(), ErrorKind::Storage, "{text}");
    assert!(
        text.contains("newer") && text.contains("upgrade agenthold"),
        "{text}"
    );
    assert_eq!(pg.psql(name, "SELECT count(*) FROM agenthold_kv"), "0");
}

// covers: C2
/// Bad URLs and a database that is not there fail at connect with a message naming the URL without the
/// password; the password never appears in any message.
#[test]
#[ignore = "needs PostgreSQL (Debian postgresql): run with make test"]
fn connect_errors_name_the_url_without_the_password() {
    let secret = "pw-that-must-not-leak-91";
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cases: Vec<(PgOptions, ErrorKind, &str)> = vec![
        (
            PgOptions::new(format!("postgres://agenthold:{secret}@127.0.0.1:{closed_port}/x")),
            ErrorKind::Unavailable,
            "cannot be reached",
        ),
        (
            PgOptions::new(format!("mysql://agenthold:{secret}@127.0.0.1/x")),
            ErrorKind::Config,
            "not a PostgreSQL URL",
        ),
        (
            PgOptions::new(format!(
                "postgres://agenthold:{secret}@127.0.0.1:{closed_port}/x?bogus=1"
            )),
            ErrorKind::Config,
            "does not parse",
        ),
        (
            {
                let mut o = PgOptions::new(format!("{}/postgres", base_url()));
                o.password = Some(secret.to_owned());
                o
            },
            ErrorKind::Config,
            "refuses the login",
        ),
        (
            options(&format!("{}/no_such_database", base_url())),
            ErrorKind::Config,
            "refuses the login or the database",
        ),
    ];
    for (options, kind, says) in cases {
        let started = Instant::now();
        let err = block_on(PgStore::connect(options.clone())).unwrap_err();
        let mut text = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            text.push_str(&format!(" / {s}"));
            source = s.source();
        }
        text.push_str(&format!(" / {err:?}"));
        assert_eq!(err.kind(), kind, "{}: {text}", options.url);
        assert!(text.contains(says), "{}: {text}", options.url);
        assert!(!text.contains(secret), "the password leaks: {text}");
        assert!(text.contains("127.0.0.1"), "the message names the server: {text}");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "bounded by the connect timeout"
        );
    }
}

// covers: C2
/// With its server killed, the store answers Unavailable (writes at once, reads after retrying), and the
/// same store works again once the server is back, without being reopened; nothing acknowledged is lost.
#[test]
#[ignore = "needs PostgreSQL (Debian postgresql): run with make test"]
fn database_away_then_back() {
    let pg = TestPostgres::start();
    pg.create_database("away");
    let mut opts = options(&pg.url("away"));
    opts.read_retry = Duration::from_millis(600);
    let store = block_on(PgStore::connect(opts)).unwrap();
    block_on(store.put("t", b"before", b"1")).unwrap();
    pg.kill();

    let started = Instant::now();
    let err = block_on(store.put("t", b"during", b"2")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(!format!("{err:?}").contains(PG_PASSWORD));
    assert!(started.elapsed() < Duration::from_secs(3), "a write fails fast");
    let err = block_on(store.batch(vec![put("t", b"b", b"3")])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let started = Instant::now();
    let err = block_on(store.get("t", b"before")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "a read retries before giving up ({:?})",
        started.elapsed()
    );

    // A read that starts while the server is down and ends after it is back succeeds.
    let reader = {
        let store = store.clone();
        std::thread::spawn(move || block_on(async move { store.get("t", b"before").await }))
    };
    pg.start_again();
    let late = reader.join().unwrap();
    // The reader may have given up before the restart finished (recovery takes a moment): either way it
    // never returns a wrong answer.
    match late {
        Ok(value) => assert_eq!(value.as_deref(), Some(&b"1"[..])),
        Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
    }
    block_on(async {
        assert_eq!(
            store.get("t", b"before").await.unwrap().as_deref(),
            Some(&b"1"[..])
        );
        assert_eq!(store.get("t", b"during").await.unwrap(), None);
        store.put("t", b"after", b"4").await.unwrap();
        assert_eq!(store.scan_prefix("t", b"").await.unwrap().len(), 2);
    });
}

// covers: C2
/// `sslmode=require` speaks TLS (rustls) and checks the server's certificate: trusted through the CA
/// given, refused without it (a configuration error, not an outage); `sslmode=disable` stays in the clear.
#[test]
#[ignore = "needs PostgreSQL (Debian postgresql): run with make test"]
fn tls_when_the_url_asks_for_it() {
    let ca = agenthold_testsupport::TestCa::new();
    let pg = TestPostgres::start_tls(&ca);
    pg.create_database("tls");
    let url = format!(
        "postgres://{}@localhost:{}/tls",
        agenthold_testsupport::PG_USER,
        pg.port()
    );
    let mut trusted = options(&format!("{url}?sslmode=require"));
    trusted.ca_pem = Some(ca.pem().into_bytes());
    let store = block_on(PgStore::connect(trusted)).unwrap();
    block_on(store.put("t", b"k", b"over tls")).unwrap();
    // The server says the session is encrypted.
    let ssl = pg.psql(
        "tls",
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = 'agenthold' AND s.ssl",
    );
    assert_ne!(ssl, "0", "the store's connection uses TLS");

    let err = block_on(PgStore::connect(options(&format!("{url}?sslmode=require")))).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("TLS"), "{err}");

    let clear = block_on(PgStore::connect(options(&format!("{url}?sslmode=disable")))).unwrap();
    assert_eq!(
        block_on(clear.get("t", b"k")).unwrap().as_deref(),
        Some(&b"over tls"[..])
    );
}

// covers: C2
/// An exclusive store (what the runtime and the server open) claims the database: a second exclusive
/// open is refused with Conflict and says who holds it, a plain store still opens, and the claim goes
/// with the store (and is taken again after the database restarted).
#[test]
#[ignore = "needs PostgreSQL (Debian postgresql): run with make test"]
fn an_exclusive_store_claims_the_database() {
    let pg = TestPostgres::start();
    pg.create_database("claim");
    let exclusive = || {
        let mut o = options(&pg.url("claim"));
        o.exclusive = true;
        o
    };
    let first = block_on(PgStore::connect(exclusive())).unwrap();
    let err = block_on(PgStore::connect(exclusive())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    let text = format!("{err} {:?}", std::error::Error::source(&err));
    assert!(
        text.contains("another agenthold process") && text.contains("agenthold"),
        "{text}"
    );
    block_on(PgStore::connect(options(&pg.url("claim")))).unwrap();

    // Restarted database: the first store takes its claim again.
    pg.kill();
    pg.start_again();
    let deadline = Instant::now() + Duration::from_secs(15);
    while pg.psql(
        "claim",
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
    ) != "1"
    {
        assert!(Instant::now() < deadline, "the claim is not taken again");
        std::thread::sleep(Duration::from_millis(100));
    }
    let err = block_on(PgStore::connect(exclusive())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");

    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match block_on(PgStore::connect(exclusive())) {
            Ok(_) => break,
            Err(e) if e.kind() == ErrorKind::Conflict && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the claim is not released with the store: {e}"),
        }
    }
}

// covers: C2, E17
/// What `store:` in the configuration opens: the database, with the password from `store_password_file`
/// (a trailing newline ignored), claimed for this process; a password file that cannot be read or is empty
/// is a configuration error naming the key.
#[test]
#[ignore = "needs PostgreSQL (Debian postgresql): run with make test"]
fn the_configured_store_reads_its_password_file() {
    let url = fresh_database("configured");
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("pw");
    std::fs::write(&password_file, format!("{PG_PASSWORD}\n")).unwrap();
    let yaml = |file: &Path| {
        format!(
            "data_dir: {}\nstore: {url}\nstore_password_file: {}\n",
            dir.path().join("data").display(),
            file.display()
        )
    };
    let config = agenthold_core::Config::from_yaml(&yaml(&password_file), Vec::new()).unwrap();
    let store = block_on(agenthold_core::store::open_configured(&config)).unwrap();
    block_on(store.put("t", b"k", b"v")).unwrap();
    assert!(
        !dir.path().join("data").join("db").exists(),
        "no redb file beside a database store"
    );
    // Claimed: a second runtime or server on the same database is refused.
    let err = block_on(agenthold_core::store::open_configured(&config))
        .map(drop)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    drop(store);

    for (file, says) in [
        (dir.path().join("missing"), "cannot be read"),
        (
            {
                let empty = dir.path().join("empty");
                std::fs::write(&empty, "\n").unwrap();
                empty
            },
            "is empty",
        ),
    ] {
        let config = agenthold_core::Config::from_yaml(&yaml(&file), Vec::new()).unwrap();
        match block_on(agenthold_core::store::open_configured(&config)).map(drop) {
            Err(agenthold_core::Error::Config { key, problem }) => {
                assert_eq!(key, "store_password_file");
                assert!(problem.contains(says), "{problem}");
            }
            other => panic!("{file:?}: {other:?}"),
        }
    }
}
