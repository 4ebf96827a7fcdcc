//! [`TestPostgres`]: a throwaway PostgreSQL server from Debian's `postgresql` package, in a temp directory,
//! on a loopback port, run as an unprivileged user (initdb refuses root), with password authentication.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The role every test database belongs to.
pub const PG_USER: &str = "agenthold";
/// Its password (the server asks for it: scram-sha-256).
pub const PG_PASSWORD: &str = "test-only-pg-password-7d1c";
/// The uid and gid the server runs as when the tests run as root (`nobody`, `nogroup`).
const UNPRIVILEGED: u32 = 65534;
/// How long the server may take to start (initdb, recovery after a kill).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A PostgreSQL server that lives as long as this value (or, should the test process die, as long as the
/// process: a watcher stops it and removes its files when the process's end of a pipe closes).
pub struct TestPostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// Extra `-c` settings of every start (TLS).
    settings: Vec<String>,
    running: Mutex<Option<Running>>,
}

/// The server process and the watcher that stops it with the test process.
struct Running {
    server: Child,
    watcher: Child,
}

impl TestPostgres {
    /// Initialise a new cluster and start it. Panics with what to install when Debian's `postgresql` is
    /// missing (`make test` installs it).
    pub fn start() -> Self {
        Self::start_inner(None)
    }

    /// [`TestPostgres::start`] with TLS on (`ssl=on`), presenting a certificate `ca` issues for `localhost`
    /// and `127.0.0.1`. Clients may still connect in the clear (`sslmode=disable`).
    pub fn start_tls(ca: &crate::TestCa) -> Self {
        Self::start_inner(Some(ca))
    }

    fn start_inner(ca: Option<&crate::TestCa>) -> Self {
        let bin = postgres_bin_dir();
        let dir = std::env::temp_dir().join(format!(
            "agenthold-pg-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let pwfile = dir.join("pwfile");
        std::fs::write(&pwfile, PG_PASSWORD).unwrap();
        if is_root() {
            for path in [dir.as_path(), &dir.join("data"), &pwfile] {
                std::os::unix::fs::chown(path, Some(UNPRIVILEGED), Some(UNPRIVILEGED)).unwrap();
            }
        }
        let out = unprivileged(Command::new(bin.join("initdb")))
            .arg("-D")
            .arg(dir.join("data"))
            .args([
                "-U",
                PG_USER,
                "-A",
                "scram-sha-256",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut settings = Vec::new();
        if let Some(ca) = ca {
            let (chain, key) = ca.issue(&["localhost", "127.0.0.1"]);
            let cert = dir.join("server.crt");
            let key_file = dir.join("server.key");
            std::fs::write(&cert, pem("CERTIFICATE", chain[0].as_ref())).unwrap();
            std::fs::write(&key_file, pem("PRIVATE KEY", key.secret_der())).unwrap();
            std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            if is_root() {
                for path in [&cert, &key_file] {
                    std::os::unix::fs::chown(path, Some(UNPRIVILEGED), Some(UNPRIVILEGED)).unwrap();
                }
            }
            settings.extend([
                "ssl=on".to_owned(),
                format!("ssl_cert_file={}", cert.display()),
                format!("ssl_key_file={}", key_file.display()),
            ]);
        }
        let pg = Self {
            bin,
            dir,
            port: free_port(),
            settings,
            running: Mutex::new(None),
        };
        pg.start_again();
        pg
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of `database` without the password ([`PG_PASSWORD`] goes separately).
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{PG_USER}@127.0.0.1:{}/{database}", self.port)
    }

    /// The URL of `database` with the password in it.
    pub fn url_with_password(&self, database: &str) -> String {
        format!(
            "postgres://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    /// `program` (a client of the server's package: createdb, psql) pointed at the server as [`PG_USER`].
    fn client(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", PG_USER])
            .env("PGPASSWORD", PG_PASSWORD)
            .stdin(Stdio::null());
        command
    }

    /// Create `database` (no error when it exists).
    pub fn create_database(&self, database: &str) {
        let out = self.client("createdb").arg(database).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || stderr.contains("already exists"),
            "createdb {database}: {stderr}"
        );
    }

    /// Run one SQL statement in `database` with psql and return its output (unaligned, tuples only).
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let out = self
            .client("psql")
            .args([
                "-d",
                database,
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Kill the server and all its processes with SIGKILL (as a power cut would), and wait until they are
    /// gone. No-op when it is not running.
    pub fn kill(&self) {
        let Some(mut running) = self.lock_running().take() else {
            return;
        };
        use nix::sys::signal::{Signal, kill, killpg};
        use nix::unistd::Pid;
        let postmaster = running.server.id() as i32;
        let pgid = Pid::from_raw(postmaster);
        // PostgreSQL's children (backends, background workers) each lead a process group of their own
        // (`setsid` in `InitPostmasterChild`), so the postmaster's group is not the whole server: a backend
        // left alive for a moment still answered its client (a put "succeeded" after the kill) and kept
        // the shared memory attached (the restart refused to start). Freeze the postmaster so it forks no
        // more, kill every child's group, then the postmaster's.
        let _ = kill(pgid, Signal::SIGSTOP);
        let children = children_of(postmaster);
        for child in &children {
            let _ = killpg(Pid::from_raw(*child), Signal::SIGKILL);
            let _ = kill(Pid::from_raw(*child), Signal::SIGKILL);
        }
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = running.server.wait();
        let _ = running.watcher.kill();
        let _ = running.watcher.wait();
        // Wait until none of them is left (a zombie counts as gone), so that a restart does not find the old
        // shared memory still attached.
        let deadline = Instant::now() + Duration::from_secs(10);
        while killpg(pgid, None).is_ok() || children.iter().any(|c| alive(*c)) {
            if Instant::now() >= deadline {
                // From `Drop` while a test unwinds, a second panic would abort every test of the binary.
                assert!(std::thread::panicking(), "postgres processes outlive SIGKILL");
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Start the server (again, after [`TestPostgres::kill`]) and wait until it accepts connections
    /// (after crash recovery when it was killed). No-op when it is running.
    pub fn start_again(&self) {
        let mut running = self.lock_running();
        if running.is_some() {
            return;
        }
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .unwrap();
        if is_root() {
            std::os::unix::fs::chown(
                self.dir.join("server.log"),
                Some(UNPRIVILEGED),
                Some(UNPRIVILEGED),
            )
            .unwrap();
        }
        let mut command = unprivileged(Command::new(self.bin.join("postgres")));
        command
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-h", "127.0.0.1", "-k"])
            .arg(&self.dir)
            .args([
                "-c",
                "max_connections=300",
                "-c",
                "shared_buffers=32MB",
                "-c",
                "fsync=on",
                // The write-ahead log may otherwise grow to 1 GB per server before a checkpoint recycles
                // it; the store tests run several servers at once, and a CI host with little disk free ran
                // out ("No space left on device" in crash recovery).
                "-c",
                "max_wal_size=64MB",
                "-c",
                "min_wal_size=32MB",
            ])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group: `kill` reaches the backends too.
            .process_group(0);
        let server = command.spawn().unwrap();
        // The watcher ends the server when the test process dies without dropping this value: its stdin is
        // a pipe from this process, closed by the kernel when the process ends.
        let watcher = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "read _ignored; kill -KILL -- -{pid} 2>/dev/null; sleep 1; rm -rf '{dir}'",
                pid = server.id(),
                dir = self.dir.display()
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        *running = Some(Running { server, watcher });
        drop(running);
        self.wait_ready();
    }

    /// Wait until the server accepts connections (`pg_isready`).
    fn wait_ready(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                // Our own Unix socket, in our directory: a server of someone else on the port (had it been
                // taken) cannot pass for ours.
                .arg("-h")
                .arg(&self.dir)
                .args(["-p", &self.port.to_string(), "-t", "1", "-q"])
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            // Read the exit status with the lock held, panic without it: a panic under the lock poisons it,
            // and `Drop`'s `kill` then panicked a second time, which aborted the whole test binary.
            let exited = self
                .lock_running()
                .as_mut()
                .and_then(|running| running.server.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!("postgres exited ({status}): {}", self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections within {START_TIMEOUT:?}: {}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The running server's handles. A lock poisoned by a panicking test still guards sound data (the
    /// handles are replaced whole), and `Drop` must still reach the server to kill it.
    fn lock_running(&self) -> std::sync::MutexGuard<'_, Option<Running>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The end of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let bytes = std::fs::read(self.dir.join("server.log")).unwrap_or_default();
        String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(2000)..]).into_owned()
    }

    /// The directory holding the cluster and its log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Debian's server binaries: `$AGENTHOLD_TEST_PG_BIN`, else the newest `/usr/lib/postgresql/*/bin`.
fn postgres_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("AGENTHOLD_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/postgres): `make test` installs it \
             (apt-get install postgresql), or set AGENTHOLD_TEST_PG_BIN"
        ),
    }
}

/// DER bytes as a PEM block.
fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `command` run as `nobody` when the tests run as root (PostgreSQL refuses root).
fn unprivileged(mut command: Command) -> Command {
    if is_root() {
        command.uid(UNPRIVILEGED).gid(UNPRIVILEGED).env("HOME", "/tmp");
    }
    command
}

/// The state and parent of process `pid` from `/proc/<pid>/stat` (`None` when it is gone).
fn stat_of(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold anything: the fields start after the last `)`.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

/// Processes whose parent is `parent`.
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| stat_of(*pid).is_some_and(|(_, p)| p == parent))
        .collect()
}

/// Whether `pid` still runs (a zombie does not).
fn alive(pid: i32) -> bool {
    stat_of(pid).is_some_and(|(state, _)| state != 'Z')
}

/// A loopback TCP port for a new server: free now, below Linux's ephemeral range (32768-60999) so that no
/// `bind(0)` (another test's upstream, an outgoing connection) takes it while the server is down between a
/// kill and a restart, and never handed to two servers of this process.
fn free_port() -> u16 {
    static TAKEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut taken = TAKEN.lock().unwrap();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default()
        ^ std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..1000 {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let port = 20_000 + (seed >> 8) as u16 % 12_000;
        if !taken.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            taken.push(port);
            return port;
        }
    }
    panic!("no free loopback port in 20000-31999 for PostgreSQL");
}
