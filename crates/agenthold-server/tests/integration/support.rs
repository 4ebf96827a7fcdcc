//! What every test needs: its own environment (data dir, loopback upstreams, `TestDns`), a builder for
//! `agenthold run` pointed at them, and checks of the host's namespaces, links and nftables tables.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthold_testsupport::{EchoServer, TestCa, TestDns};
use tokio::process::{Child, Command};
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Allowed in most tests; mapped to the loopback upstreams (443 → HTTPS echo, 80 → HTTP echo).
pub(crate) const API: &str = "api.example.test";
/// Mapped to the same upstreams as [`API`] but not allowed unless a test says so.
pub(crate) const OTHER: &str = "other.example.test";
/// Known to `TestDns` (198.51.100.7), never mapped, never allowed: the upstream must never be asked.
pub(crate) const DENIED: &str = "denied.example.test";
/// Unknown everywhere (`TestDns` answers NXDOMAIN for it).
pub(crate) const UNLISTED: &str = "unlisted.example.test";
/// Python from the distribution: the pyenv shim on PATH lives under /root, which the sudo caller
/// (uid 65534) cannot read.
pub(crate) const PYTHON: &str = "/usr/bin/python3";
/// The field names of a `--log` line, exactly (issue 3, items 6 and 7).
pub(crate) const CONTRACT_FIELDS: [&str; 13] = [
    "time",
    "agent",
    "kind",
    "host",
    "port",
    "method",
    "path",
    "status",
    "decision",
    "reason",
    "secret_injected",
    "bytes_up",
    "bytes_down",
];
/// No run in these tests takes more than a few seconds; a hung one fails the test instead of the suite.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// Held shared by every test while its runs are alive, exclusively by the one test that must see stale
/// namespaces survive until *its* next run (any run removes the stale namespaces of killed runs).
static RUNS: RwLock<()> = RwLock::const_new(());

/// One test's world: a data dir (0755, so the sudo caller can read the CA in it), an HTTPS and an HTTP
/// echo server on loopback, and a `TestDns` that knows [`DENIED`].
pub(crate) struct Env {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) https: EchoServer,
    pub(crate) http: EchoServer,
    pub(crate) dns: TestDns,
    /// The upstream CA, PEM (for `--dangerous-upstream-ca` and the clients' `--cacert`).
    pub(crate) ca: PathBuf,
    _shared: Option<RwLockReadGuard<'static, ()>>,
    _exclusive: Option<RwLockWriteGuard<'static, ()>>,
}

impl Env {
    /// A fresh environment; other tests may run agenthold at the same time.
    pub(crate) async fn new() -> Self {
        agenthold_testsupport::require_root();
        let shared = RUNS.read().await;
        Self::build(Some(shared), None).await
    }

    /// A fresh environment while no other test runs agenthold.
    pub(crate) async fn exclusive() -> Self {
        agenthold_testsupport::require_root();
        let exclusive = RUNS.write().await;
        Self::build(None, Some(exclusive)).await
    }

    async fn build(
        shared: Option<RwLockReadGuard<'static, ()>>,
        exclusive: Option<RwLockWriteGuard<'static, ()>>,
    ) -> Self {
        agenthold_testsupport::init_tracing();
        let dir = tempfile::Builder::new()
            .prefix("agenthold-it-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let ca = Arc::new(TestCa::new());
        let https = EchoServer::https_with_ca(Arc::clone(&ca), &[API, OTHER]).await;
        let http = EchoServer::http().await;
        let dns = TestDns::start([(DENIED, vec![IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7))])], 60).await;
        let ca_path = dir.path().join("upstream-ca.pem");
        std::fs::write(&ca_path, ca.pem()).unwrap();
        std::fs::set_permissions(&ca_path, std::fs::Permissions::from_mode(0o644)).unwrap();
        Self {
            dir,
            https,
            http,
            dns,
            ca: ca_path,
            _shared: shared,
            _exclusive: exclusive,
        }
    }

    /// `name` inside the test's directory.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA path as a string, for command lines.
    pub(crate) fn ca_str(&self) -> String {
        self.ca.display().to_string()
    }

    /// `agenthold run` with this environment's data dir, DNS upstream, upstream CA and name mappings.
    pub(crate) fn run(&self) -> Run<'_> {
        Run {
            env: self,
            flags: Vec::new(),
            vars: Vec::new(),
            data_dir: self.path("data"),
        }
    }

    /// Questions `TestDns` received for `name`.
    pub(crate) fn dns_queries_for(&self, name: &str) -> usize {
        self.dns.queries().iter().filter(|q| q.name == name).count()
    }

    /// Paths the HTTPS echo server received with SNI `sni`.
    pub(crate) fn https_paths(&self, sni: &str) -> Vec<String> {
        let requests = self.https.requests();
        requests
            .into_iter()
            .filter(|r| r.sni.as_deref() == Some(sni))
            .map(|r| r.path)
            .collect()
    }

    /// Paths the HTTP echo server received with `Host: host`.
    pub(crate) fn http_paths(&self, host: &str) -> Vec<String> {
        let requests = self.http.requests();
        requests
            .into_iter()
            .filter(|r| r.host == host)
            .map(|r| r.path)
            .collect()
    }
}

/// The `agenthold` binary with a clean environment: no sudo variables (tests that simulate sudo set
/// them), no proxy variables, warnings only.
pub(crate) fn agenthold() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agenthold"));
    for var in [
        "SUDO_UID",
        "SUDO_GID",
        "SUDO_USER",
        "SUDO_COMMAND",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("AGENTHOLD_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// One `agenthold run` being put together.
pub(crate) struct Run<'a> {
    env: &'a Env,
    flags: Vec<OsString>,
    vars: Vec<(String, String)>,
    data_dir: PathBuf,
}

impl Run<'_> {
    /// `--allow ENTRY`.
    pub(crate) fn allow(mut self, entry: &str) -> Self {
        self.flags.extend(["--allow".into(), entry.into()]);
        self
    }

    /// `--data-dir DIR` instead of the environment's own.
    pub(crate) fn data_dir(mut self, dir: &Path) -> Self {
        dir.clone_into(&mut self.data_dir);
        self
    }

    /// `--report-only`.
    pub(crate) fn report_only(mut self) -> Self {
        self.flags.push("--report-only".into());
        self
    }

    /// `--log FILE`.
    pub(crate) fn log(mut self, file: &Path) -> Self {
        self.flags.extend(["--log".into(), file.into()]);
        self
    }

    /// An environment variable for agenthold itself (e.g. `SUDO_UID`).
    pub(crate) fn env(mut self, key: &str, value: &str) -> Self {
        self.vars.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The whole command line, `-- command…` last.
    pub(crate) fn command(&self, command: &[&str]) -> Command {
        let env = self.env;
        let https = env.https.addr();
        let http = env.http.addr();
        let mut cmd = agenthold();
        cmd.arg("run")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--dns-upstream")
            .arg(env.dns.addr().to_string())
            .arg("--dangerous-upstream-ca")
            .arg(&env.ca);
        for name in [API, OTHER] {
            cmd.arg("--dangerous-connect-to")
                .arg(format!("{name}:443={https}"));
            cmd.arg("--dangerous-connect-to").arg(format!("{name}:80={http}"));
        }
        cmd.args(&self.flags).arg("--").args(command);
        for (key, value) in &self.vars {
            cmd.env(key, value);
        }
        cmd
    }

    /// Starts the run.
    pub(crate) fn spawn(&self, command: &[&str]) -> Child {
        self.command(command).spawn().expect("start agenthold")
    }

    /// Runs to the end and collects what it printed.
    pub(crate) async fn output(&self, command: &[&str]) -> Outcome {
        finish(self.spawn(command)).await
    }

    /// [`Run::output`] of `sh -c SCRIPT`.
    pub(crate) async fn sh(&self, script: &str) -> Outcome {
        self.output(&["sh", "-c", script]).await
    }
}

/// How a finished `agenthold` process ended.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// agenthold's pid (its namespaces are named `ahr-<pid>-…`).
    pub(crate) pid: u32,
    /// Its exit code (`None` if a signal killed agenthold itself).
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Outcome {
    /// Panics, showing everything, unless the exit code is `code`.
    #[track_caller]
    pub(crate) fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, Some(code), "exit code; {self:#?}");
        self
    }
}

/// Waits (at most [`RUN_TIMEOUT`]) for `child` to end and collects its output.
pub(crate) async fn finish(child: Child) -> Outcome {
    let pid = child.id().expect("a running child has a pid");
    let output = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .expect("agenthold did not finish in time (killed)")
        .expect("wait for agenthold");
    Outcome {
        pid,
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Waits for `child` to exit (at most 10 s) and returns its exit code (`None` when killed by a signal).
pub(crate) async fn wait_exit(child: &mut Child) -> Option<i32> {
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("agenthold did not exit within 10 s")
        .expect("wait for agenthold");
    status.code()
}

/// Waits (at most 10 s) until `path` exists and is not empty; returns its contents.
pub(crate) async fn wait_for_file(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.trim().is_empty()
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear within 10 s",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`wait_for_file`] for a file that the command of `child` writes: panics with agenthold's output if it
/// exits first.
pub(crate) async fn wait_for_file_from(path: &Path, child: &mut Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.trim().is_empty()
        {
            return text;
        }
        if let Some(status) = child.try_wait().expect("poll agenthold") {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = tokio::io::AsyncReadExt::read_to_string(&mut pipe, &mut stderr).await;
            }
            panic!(
                "agenthold ended ({status}) before {} appeared; stderr:\n{stderr}",
                path.display()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear within 10 s",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether process `pid` exists and is not a zombie (an orphan's zombie waits for a reaper that may
/// never come: it runs nothing).
pub(crate) fn process_alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) STATE …`: comm may contain spaces and parentheses, the state follows the last ')'.
    let state = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some(Some('Z' | 'X')) | None)
}

/// Waits (at most `within`) until process `pid` is gone; returns whether it is.
pub(crate) async fn wait_gone(pid: i32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while process_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// The pid written (as the first word) in `path`.
pub(crate) async fn read_pid(path: &Path) -> i32 {
    let text = wait_for_file(path).await;
    text.split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .expect("a pid in the file")
}

/// Every line of a `--log` file, parsed.
pub(crate) fn read_log(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Log entries whose `host` is `host`.
pub(crate) fn entries_for<'a>(log: &'a [serde_json::Value], host: &str) -> Vec<&'a serde_json::Value> {
    log.iter().filter(|e| e["host"] == host).collect()
}

/// The value of `Key:` in a `/proc/PID/status` dump.
pub(crate) fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':').map(str::trim))
}

/// Names in `ip netns list` that start with `ahr-<pid>-` (the namespaces of one `agenthold run`).
pub(crate) fn namespaces_of(pid: u32) -> Vec<String> {
    let prefix = format!("ahr-{pid}-");
    ip_netns_list()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Every name in `ip netns list`.
pub(crate) fn ip_netns_list() -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    assert!(
        out.status.success(),
        "ip netns list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The run's tag (`ahr-<pid>-<tag>-…`, interfaces `ahg<tag>`/`ahs<tag>`) from `ip -o link` printed inside.
pub(crate) fn sandbox_tag(ip_link_output: &str) -> Option<String> {
    ip_link_output.split([' ', ':', '@']).find_map(|word| {
        let tag = word.strip_prefix("ahs")?;
        (tag.len() == 6 && tag.chars().all(|c| c.is_ascii_alphanumeric())).then(|| tag.to_owned())
    })
}

/// The host's veth interfaces and nftables tables at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostSnapshot {
    pub(crate) veths: BTreeSet<String>,
    pub(crate) nft_tables: BTreeSet<String>,
}

impl HostSnapshot {
    pub(crate) fn take() -> Self {
        let link = std::process::Command::new("ip")
            .args(["-o", "link", "show", "type", "veth"])
            .output();
        let link = link.expect("ip link");
        let veths = String::from_utf8_lossy(&link.stdout)
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|name| name.split('@').next().unwrap_or(name).to_owned())
            .collect();
        let nft = std::process::Command::new("nft")
            .args(["list", "tables"])
            .output()
            .expect("nft list tables");
        assert!(
            nft.status.success(),
            "nft list tables: {}",
            String::from_utf8_lossy(&nft.stderr)
        );
        let nft_tables = String::from_utf8_lossy(&nft.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        Self { veths, nft_tables }
    }

    /// Panics unless run `pid` (tag `tag`) left nothing behind: no `ahr-<pid>-*` namespace, no host link
    /// of its veth pair (nor any `ahg*`/`ahs*` link: they never belong on the host), and no nftables
    /// table on the host that was not there before and looks like agenthold's. Other test suites on
    /// this machine may add links and tables of their own meanwhile, so only agenthold's names are
    /// compared strictly; the counts are in the message.
    #[track_caller]
    pub(crate) fn assert_left_nothing(&self, pid: u32, tag: Option<&str>) {
        let namespaces = namespaces_of(pid);
        assert!(
            namespaces.is_empty(),
            "namespaces of run {pid} remain: {namespaces:?}"
        );
        if let Some(tag) = tag {
            let all = ip_netns_list();
            assert!(
                !all.iter().any(|n| n.contains(tag)),
                "a namespace with tag {tag} remains: {all:?}"
            );
        }
        let after = Self::take();
        let ours: Vec<_> = after
            .veths
            .iter()
            .filter(|v| v.starts_with("ahg") || v.starts_with("ahs") || tag.is_some_and(|t| v.contains(t)))
            .collect();
        assert!(
            ours.is_empty(),
            "agenthold links on the host: {ours:?} (host veths before: {}, after: {})",
            self.veths.len(),
            after.veths.len()
        );
        let new_tables: Vec<_> = after.nft_tables.difference(&self.nft_tables).collect();
        let ours: Vec<_> = new_tables
            .iter()
            .filter(|t| t.contains("agenthold") || t.contains("ahr"))
            .collect();
        assert!(
            ours.is_empty(),
            "new agenthold nftables tables on the host: {ours:?} (tables before: {}, after: {})",
            self.nft_tables.len(),
            after.nft_tables.len()
        );
    }
}
