//! One real `agenthold serve` per test: its own data directory and port, admin commands through the real
//! binary, HTTP through a real client (ureq), and on drop a SIGTERM and a sweep of whatever engine objects
//! (containers, networks, volumes, host rules) the server's installation left.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// `postgres`: every test server keeps its state in its own database of one throwaway PostgreSQL server
/// (started by the first server of the process) instead of the redb file; `make test` runs the API tests
/// once each way.
pub(crate) const STORE_ENV: &str = "AGENTHOLD_TEST_SERVER_STORE";

/// The binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_agenthold");
/// How long a server may take to answer `/healthz` after starting.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How a request authenticates.
#[derive(Debug, Clone)]
pub(crate) enum Auth {
    /// No credentials.
    None,
    /// `Authorization: Bearer`.
    Token(String),
    /// The session cookie.
    Session(String),
}

/// A response: status, headers of interest, and the body (JSON when it parses, else a string value).
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) content_type: String,
    pub(crate) retry_after: Option<String>,
    pub(crate) body: Value,
    pub(crate) raw: Vec<u8>,
}

/// A running server.
pub(crate) struct TestServer {
    child: Option<Child>,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) config: PathBuf,
    pub(crate) base: String,
    pub(crate) extra_args: Vec<String>,
    /// The `postgres://` URL of the server's store (none: the redb file in its data directory).
    pub(crate) store_url: Option<String>,
    agent: ureq::Agent,
}

/// The PostgreSQL server behind `url`: the shared one (a server started with its own is read through the
/// shared one's binaries, on the URL's port).
fn shared_or_own_postgres(url: &str) -> &'static agenthold_testsupport::TestPostgres {
    let pg = shared_postgres();
    assert!(
        url.contains(&format!(":{}/", pg.port())),
        "store_at_rest reads the shared PostgreSQL server only"
    );
    pg
}

/// The PostgreSQL server of this process's test servers ([`STORE_ENV`]).
fn shared_postgres() -> &'static agenthold_testsupport::TestPostgres {
    static SERVER: std::sync::OnceLock<agenthold_testsupport::TestPostgres> = std::sync::OnceLock::new();
    SERVER.get_or_init(agenthold_testsupport::TestPostgres::start)
}

/// The database a new test server uses: none (redb) unless [`STORE_ENV`] is `postgres`, then a new
/// database in the process's shared PostgreSQL server.
fn default_store() -> Option<String> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    if std::env::var(STORE_ENV).as_deref() != Ok("postgres") {
        return None;
    }
    let pg = shared_postgres();
    let name = format!(
        "server_{}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    pg.create_database(&name);
    Some(pg.url(&name))
}

/// A free loopback port.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl TestServer {
    /// Start a server with an empty data directory and `extra_yaml` appended to its configuration.
    pub(crate) fn start_with(extra_yaml: &str, extra_args: &[&str]) -> Self {
        Self::start_configured("", extra_yaml, extra_args)
    }

    /// [`TestServer::start_with`] with more keys of the `server` section (`"  public_url: …\n"`).
    pub(crate) fn start_configured(server_keys: &str, extra_yaml: &str, extra_args: &[&str]) -> Self {
        Self::start_full(server_keys, extra_yaml, extra_args, default_store())
    }

    /// [`TestServer::start_with`] on the PostgreSQL database `store_url` (its password is
    /// [`agenthold_testsupport::PG_PASSWORD`], given in the environment).
    pub(crate) fn start_on_store(store_url: &str, extra_yaml: &str, extra_args: &[&str]) -> Self {
        Self::start_full("", extra_yaml, extra_args, Some(store_url.to_owned()))
    }

    fn start_full(
        server_keys: &str,
        extra_yaml: &str,
        extra_args: &[&str],
        store_url: Option<String>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("config.yaml");
        let store_line = store_url
            .as_ref()
            .map(|url| format!("store: {url}\n"))
            .unwrap_or_default();
        let yaml = format!(
            "data_dir: {}\n{store_line}server:\n  listen: 127.0.0.1:{port}\n{server_keys}{extra_yaml}",
            dir.path().join("data").display()
        );
        std::fs::write(&config, yaml).unwrap();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .new_agent();
        let mut server = Self {
            child: None,
            dir,
            config,
            base: format!("http://127.0.0.1:{port}"),
            extra_args: extra_args.iter().map(|s| (*s).to_owned()).collect(),
            store_url,
            agent,
        };
        server.spawn();
        server
    }

    /// Start a server with the default configuration.
    pub(crate) fn start() -> Self {
        Self::start_with("", &[])
    }

    /// The data directory.
    pub(crate) fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server's store, opened beside it (the server stopped, for a file store): to read or change
    /// records as a writer of the store would. Call inside a tokio runtime.
    pub(crate) async fn open_store(&self) -> std::sync::Arc<dyn agenthold_core::Store> {
        match &self.store_url {
            Some(url) => {
                let mut options = agenthold_core::store::PgOptions::new(url.clone());
                options.password = Some(agenthold_testsupport::PG_PASSWORD.to_owned());
                std::sync::Arc::new(agenthold_core::store::PgStore::connect(options).await.unwrap())
            }
            None => std::sync::Arc::new(
                agenthold_core::store::RedbStore::open_in_data_dir(self.data_dir()).unwrap(),
            ),
        }
    }

    /// Every byte the store holds, as it is at rest: the redb file, or every key and value of the
    /// database's table (non-printable bytes escaped), to search for what must not be there in the clear.
    pub(crate) fn store_at_rest(&self) -> Vec<u8> {
        match &self.store_url {
            Some(url) => {
                let database = url.rsplit('/').next().unwrap_or_default();
                shared_or_own_postgres(url)
                    .psql(
                        database,
                        "SELECT string_agg(encode(key, 'escape') || ' ' || encode(value, 'escape'), ' ') \
                         FROM agenthold_kv",
                    )
                    .into_bytes()
            }
            None => std::fs::read(self.data_dir().join("db")).unwrap(),
        }
    }

    /// (Re)start the process on the same data directory and wait for `/healthz`.
    pub(crate) fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("serve.log"))
            .unwrap();
        let mut command = Command::new(BIN);
        if self.store_url.is_some() {
            command.env(
                agenthold_core::config::STORE_PASSWORD_ENV,
                agenthold_testsupport::PG_PASSWORD,
            );
        }
        let child = command
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .args(&self.extra_args)
            .env("AGENTHOLD_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(r) = self.agent.get(format!("{}/healthz", self.base)).call()
                && r.status() == 200
            {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("agenthold serve exited with {status}:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "agenthold serve did not answer /healthz:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server process's id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What the server printed so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// `kill -9` the process (no graceful anything).
    pub(crate) fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait (bounded) for a clean exit; returns its exit code.
    pub(crate) fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Run `agenthold admin ARGS… --config` and return its one line of output.
    pub(crate) fn admin(&self, args: &[&str]) -> String {
        let out = Command::new(BIN)
            .arg("admin")
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "agenthold admin {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// A new user and a personal token of theirs.
    pub(crate) fn user(&self, name: &str) -> (String, String) {
        let id = self.admin(&["user", "create", "--name", name]);
        let token = self.admin(&["token", "create", "--user", &id]);
        (id, token)
    }

    /// A browser session (cookie value) for a user.
    pub(crate) fn session(&self, user: &str) -> String {
        self.admin(&["session", "create", "--user", user])
    }

    /// Send a request; `body` as JSON when given.
    pub(crate) fn call(&self, method: &str, path: &str, auth: &Auth, body: Option<&Value>) -> Reply {
        self.call_with(method, path, auth, body, &[])
    }

    /// [`TestServer::call`] with extra headers.
    pub(crate) fn call_with(
        &self,
        method: &str,
        path: &str,
        auth: &Auth,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let bytes = body.map(|b| serde_json::to_vec(b).unwrap());
        self.raw(method, path, auth, bytes.as_deref(), "application/json", headers)
    }

    /// Send raw bytes with a content type.
    pub(crate) fn raw(
        &self,
        method: &str,
        path: &str,
        auth: &Auth,
        body: Option<&[u8]>,
        content_type: &str,
        headers: &[(&str, &str)],
    ) -> Reply {
        let url = format!("{}{path}", self.base);
        let mut req = ureq::http::Request::builder().method(method).uri(&url);
        match auth {
            Auth::None => {}
            Auth::Token(t) => req = req.header("Authorization", format!("Bearer {t}")),
            Auth::Session(s) => req = req.header("Cookie", format!("agenthold_session={s}")),
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let response = match body {
            Some(b) => {
                let req = req.header("Content-Type", content_type).body(b.to_vec()).unwrap();
                self.agent.run(req)
            }
            // An explicit empty body: without it ureq sends a POST's empty body chunked, in a write of its
            // own; a handler that answers without reading it (a 403, a bodyless action) may then leave
            // hyper closing the connection after the answer, and the next request on the pooled
            // connection fails with "Peer disconnected".
            None => self
                .agent
                .run(req.header("Content-Length", "0").body(()).unwrap()),
        }
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let content_type = header("content-type").unwrap_or_default();
        let retry_after = header("retry-after");
        let raw = response
            .into_body()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_vec()
            .unwrap_or_default();
        let body = serde_json::from_slice(&raw)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&raw).into_owned()));
        Reply {
            status,
            content_type,
            retry_after,
            body,
            raw,
        }
    }
}

/// The engine objects of the installation whose data directory is `data_dir`: containers, networks,
/// volumes (by their `agenthold.instance` label).
pub(crate) fn engine_objects(data_dir: &Path) -> Vec<String> {
    let instance = agenthold_sandbox::docker::engine::instance_label(data_dir);
    let label = format!("label=agenthold.instance={instance}");
    let mut out = Vec::new();
    for args in [
        vec!["ps", "-aq", "--filter", &label],
        vec!["network", "ls", "-q", "--filter", &label],
        vec!["volume", "ls", "-q", "--filter", &label],
    ] {
        if let Ok(o) = Command::new("docker").args(&args).output() {
            out.extend(
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .map(str::to_owned),
            );
        }
    }
    out
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
        let data_dir = self.data_dir();
        let instance = agenthold_sandbox::docker::engine::instance_label(&data_dir);
        let label = format!("label=agenthold.instance={instance}");
        let list = |args: &[&str]| -> Vec<String> {
            Command::new("docker")
                .args(args)
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let containers = list(&["ps", "-aq", "--filter", &label]);
        if !containers.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-fv"])
                .args(&containers)
                .output();
        }
        for net in list(&["network", "ls", "-q", "--filter", &label]) {
            let bridge = Command::new("docker")
                .args([
                    "network",
                    "inspect",
                    "-f",
                    "{{index .Options \"com.docker.network.bridge.name\"}}",
                    &net,
                ])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default();
            if !bridge.is_empty() {
                let _ = agenthold_sandbox::docker::hostfw::disallow_bridge(&bridge);
            }
            let _ = Command::new("docker").args(["network", "rm", &net]).output();
        }
        let volumes = list(&["volume", "ls", "-q", "--filter", &label]);
        if !volumes.is_empty() {
            let _ = Command::new("docker")
                .args(["volume", "rm", "-f"])
                .args(&volumes)
                .output();
        }
        let _ = agenthold_sandbox::docker::hostfw::apply_host_table(&instance, &[]);
    }
}
