//! The server on a PostgreSQL store whose database goes away while it serves: writes answer 503 at once,
//! reads answer 503 after retrying, the gateway keeps enforcing the policy it holds (allowed hosts still
//! reachable, the others still refused: never fail open), and everything works again once the database
//! is back, without restarting the server. Also: a database that is down at start fails the start with a
//! message naming the URL, never the password.

use std::time::{Duration, Instant};

use agenthold_testsupport::{PG_PASSWORD, TestPostgres};
use serde_json::json;

use super::support::BIN;
use super::world::{API, OTHER, World};

// covers: C2, E9
#[test]
#[ignore = "needs root, Docker and PostgreSQL: run with make test"]
fn database_down_while_serving() {
    let pg = TestPostgres::start();
    pg.create_database("serve");
    let world = World::start_on_store(&pg.url("serve"));
    let agent = world.agent("a", &json!({"mode": "allowlist", "entries": [API]}));
    assert_eq!(world.curl(&agent, API, "/before"), 200);
    assert_eq!(world.curl(&agent, OTHER, "/refused-before"), 0);

    pg.kill();
    let started = Instant::now();
    let write = world.server.call(
        "POST",
        "/api/v1/workspaces",
        &world.alice,
        Some(&json!({"name": "while-down"})),
    );
    assert_eq!(
        write.status, 503,
        "a write while the database is down: {:?}",
        write.body
    );
    assert_eq!(write.body["code"], "unavailable", "{:?}", write.body);
    assert!(write.content_type.starts_with("application/problem+json"));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a write fails fast ({:?})",
        started.elapsed()
    );
    let read = world
        .server
        .call("GET", &world.path("/agents"), &world.alice, None);
    assert_eq!(
        read.status, 503,
        "a read while the database is down: {:?}",
        read.body
    );
    for reply in [&write, &read] {
        let text = String::from_utf8_lossy(&reply.raw);
        assert!(!text.contains(PG_PASSWORD), "the password in an answer: {text}");
    }

    // The gateway holds the agent's policy in memory: what was allowed still is, the rest still is not.
    assert_eq!(world.curl(&agent, API, "/during"), 200);
    assert!(world.upstream("/during").is_some(), "the allowed request arrived");
    assert_eq!(world.curl(&agent, OTHER, "/refused-during"), 0, "never fail open");
    assert!(world.upstream("/refused-during").is_none());

    // Back without a restart of the server.
    pg.start_again();
    let deadline = Instant::now() + Duration::from_secs(30);
    let r = loop {
        let r = world.server.call(
            "POST",
            "/api/v1/workspaces",
            &world.alice,
            Some(&json!({"name": "after"})),
        );
        if r.status != 503 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(r.status, 201, "a write after the database is back: {:?}", r.body);
    let r = world
        .server
        .call("GET", &world.path("/agents"), &world.alice, None);
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(r.raw.windows(agent.len()).any(|w| w == agent.as_bytes()));
    assert_eq!(world.curl(&agent, API, "/after"), 200);
    let log = world.server.log();
    assert!(!log.contains(PG_PASSWORD), "the password in the server's log");
    assert!(!log.contains("panicked"), "{log}");
    // The server holds its claim on the database again (one server per database).
    let deadline = Instant::now() + Duration::from_secs(15);
    while pg.psql(
        "serve",
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
    ) != "1"
    {
        assert!(Instant::now() < deadline, "the server's claim is not taken again");
        std::thread::sleep(Duration::from_millis(100));
    }
}

// covers: C2
/// `agenthold serve` with its database down: a start error that names the URL without the password, and
/// no panic.
#[test]
#[ignore = "needs PostgreSQL: run with make test"]
fn database_down_at_start() {
    let pg = TestPostgres::start();
    pg.create_database("start");
    let url = pg.url_with_password("start");
    pg.kill();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "data_dir: {}\nstore: {url}\nserver:\n  listen: 127.0.0.1:0\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new("timeout")
        .args(["60", BIN, "serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&pg.url("start").replace(
            &format!("{}@", agenthold_testsupport::PG_USER),
            &format!("{}:***@", agenthold_testsupport::PG_USER)
        )),
        "the URL, its password replaced: {stderr}"
    );
    assert!(stderr.contains("cannot be reached"), "{stderr}");
    assert!(!stderr.contains(PG_PASSWORD), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
