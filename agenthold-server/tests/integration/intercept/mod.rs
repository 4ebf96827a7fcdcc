//! TLS interception and secret injection through `agenthold run --secrets FILE` (issue 4, item 8; E10–E16),
//! with real clients inside the jail: curl (HTTP/1.1 and h2), Python `requests`, Node `fetch`, git, raw
//! TLS sockets and `openssl s_client`.
//!
//! Every upstream is on loopback: the `EchoServer` of `agenthold-testsupport` (answers with what it
//! received) and `upstream.py` (a quiet endpoint that never reflects a request, server-sent events, a
//! generated download, a WebSocket echo, an OAuth token endpoint and a git smart-HTTP server). Names are
//! mapped to them with `--dangerous-connect-to`, and the gateway trusts their CA (a `TestCa`) through
//! `--dangerous-upstream-ca`. The clients trust only what the jail gives them: the gateway's CA through
//! `SSL_CERT_FILE`, `CURL_CA_BUNDLE`, `REQUESTS_CA_BUNDLE`, `NODE_EXTRA_CA_CERTS` and `GIT_SSL_CAINFO`
//! (the tests that show a spliced connection trust the test CA on purpose, and say so).
//!
//! - [`clients`]: injection with each client, keep-alive, placeholders in headers and the query string,
//!   bodies untouched, presets, the request log (E11–E13, E16).
//! - [`git`]: `git clone` and `git push` with the `github` preset against a local smart-HTTP server.
//! - [`attacks`]: splicing of non-rule hosts, the leak guard, the value never readable inside.
//! - [`echoes`]: upstreams that quote the key back in every form and framing (E19), and placeholders
//!   refused outside the places their rule names (E13 as amended).
//! - [`hosts`]: Host ≠ SNI (421, no secret), also as absolute-form URI and as a second Host line.
//! - [`streams`]: server-sent events, a multi-gigabyte download with bounded memory, WebSocket.
//! - [`refresh`]: token refresh and login rules (E15), upstream certificate failures.

mod attacks;
mod clients;
mod echoes;
mod git;
mod hosts;
mod refresh;
mod streams;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use agenthold_testsupport::{EchoRequest, EchoServer, TestCa};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::support::{API, Env, OTHER, Outcome, agenthold};

/// The upstream script (see its docstring).
const UPSTREAM_PY: &str = include_str!("upstream.py");
/// Python from the distribution, for the upstreams (on the host; the standard library is enough).
const HOST_PYTHON: &str = "/usr/bin/python3";
/// Secret `api`: a header rule on api.example.test (`Authorization: Bearer VALUE`), value from `$API_TOKEN`,
/// placeholder in `$API_KEY`.
pub(super) const API_SECRET: &str = "- name: api\n  value_env: API_TOKEN\n  env: API_KEY\n  \
                                     hosts: [api.example.test]\n  header: Authorization\n  \
                                     template: \"Bearer {{.Value}}\"\n";
/// A second rule host (secret B) on the echo upstream.
pub(super) const B_HOST: &str = "b.example.test";
/// Secret `api` (header rule on api.example.test, value from `$API_TOKEN`, placeholder in `$API_KEY`) and
/// secret `bee` (X-Api-Key on b.example.test, value from `$B_TOKEN`, placeholder in `$B_KEY`).
pub(super) const TWO_SECRETS: &str = concat!(
    "- name: api\n  value_env: API_TOKEN\n  env: API_KEY\n  hosts: [api.example.test]\n",
    "  header: Authorization\n  template: \"Bearer {{.Value}}\"\n",
    "- name: bee\n  value_env: B_TOKEN\n  env: B_KEY\n  hosts: [b.example.test]\n  header: X-Api-Key\n",
);

/// The names the echo upstream answers for (`name:443` mapped to it, `name:80` to the plain echo).
const ECHO_NAMES: [&str; 6] = [
    API,
    OTHER,
    B_HOST,
    "api.anthropic.com",
    "api.openai.com",
    "api.github.com",
];
/// The longest a run of these tests may take (the download test gives its own).
const RUN_TIMEOUT: Duration = Duration::from_secs(40);

/// One test's world: the shared [`Env`] (data dir, DNS, the plain-HTTP echo, the run lock), an upstream CA
/// and an HTTPS echo for [`ECHO_NAMES`] issued by it.
pub(super) struct World {
    pub(super) env: Env,
    pub(super) ca: Arc<TestCa>,
    pub(super) echo: EchoServer,
    /// The upstream CA, PEM, for `--dangerous-upstream-ca` (never for the clients).
    ca_pem: PathBuf,
}

impl World {
    pub(super) async fn new() -> Self {
        let env = Env::new().await;
        let ca = Arc::new(TestCa::new());
        let echo = EchoServer::https_with_ca(Arc::clone(&ca), &ECHO_NAMES).await;
        let ca_pem = env.path("intercept-upstream-ca.pem");
        write_file(&ca_pem, ca.pem().as_bytes());
        Self {
            env,
            ca,
            echo,
            ca_pem,
        }
    }

    /// `name` in the test's directory (visible inside the jail).
    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.env.path(name)
    }

    /// The upstream CA's PEM file (for the tests that show the client a spliced connection).
    pub(super) fn upstream_ca(&self) -> String {
        self.ca_pem.display().to_string()
    }

    /// `agenthold run` pointed at this world: every [`ECHO_NAMES`] name on the echo upstreams.
    pub(super) fn run(&self) -> Jailed<'_> {
        let mut maps = BTreeMap::new();
        for name in ECHO_NAMES {
            maps.insert((name.to_owned(), 443), self.echo.addr());
            maps.insert((name.to_owned(), 80), self.env.http.addr());
        }
        Jailed {
            world: self,
            flags: Vec::new(),
            vars: Vec::new(),
            maps,
            timeout: RUN_TIMEOUT,
            secrets_file: None,
        }
    }

    /// Requests the HTTPS echo received with SNI `sni`.
    pub(super) fn echoed(&self, sni: &str) -> Vec<EchoRequest> {
        self.echo
            .requests()
            .into_iter()
            .filter(|r| r.sni.as_deref() == Some(sni))
            .collect()
    }

    /// Start `upstream.py` with a certificate for `names` from `ca` (this world's CA unless given) and the
    /// extra `config`. Its state lives in the data dir, which the jail hides.
    pub(super) async fn upstream(
        &self,
        names: &[&str],
        ca: Option<&TestCa>,
        config: serde_json::Value,
    ) -> Upstream {
        let state = self.path("data").join(format!("upstream-{}", random_hex(4)));
        std::fs::create_dir_all(&state).unwrap();
        let (chain, key) = ca.unwrap_or(&self.ca).issue(names);
        let cert = state.join("cert.pem");
        let key_path = state.join("key.pem");
        write_file(&cert, pem("CERTIFICATE", chain[0].as_ref()).as_bytes());
        write_file(&key_path, pem("PRIVATE KEY", key.secret_der()).as_bytes());
        let mut cfg = serde_json::json!({
            "cert": cert, "key": key_path, "state": state, "alpn": ["http/1.1"],
        });
        if let serde_json::Value::Object(extra) = config {
            cfg.as_object_mut().unwrap().extend(extra);
        }
        let script = state.join("upstream.py");
        write_file(&script, UPSTREAM_PY.as_bytes());
        let cfg_path = state.join("config.json");
        write_file(&cfg_path, cfg.to_string().as_bytes());
        let mut child = Command::new(HOST_PYTHON)
            .arg(&script)
            .arg(&cfg_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start upstream.py");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("upstream.py did not start within 10 s")
            .unwrap()
            .expect("upstream.py exited before listening");
        let port: u16 = line
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse().ok())
            .expect("PORT line");
        Upstream {
            _child: child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            state,
        }
    }
}

/// A running `upstream.py`; killed when dropped.
pub(super) struct Upstream {
    _child: Child,
    pub(super) addr: SocketAddr,
    state: PathBuf,
}

impl Upstream {
    /// Everything it recorded so far (one JSON object per request or event).
    pub(super) fn records(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.state.join("records.jsonl")).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// Records of requests (those with a path) whose path starts with `prefix`.
    pub(super) fn requests(&self, prefix: &str) -> Vec<serde_json::Value> {
        self.records()
            .into_iter()
            .filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with(prefix)))
            .collect()
    }

    /// Let the SSE stream `tag` send the event after `event`.
    pub(super) fn go(&self, tag: &str, event: u32) {
        std::fs::write(self.state.join(format!("go-{tag}-{event}")), b"go").unwrap();
    }
}

/// The value of header `name` in an `upstream.py` request record.
pub(super) fn record_header<'a>(record: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    record["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
}

/// One `agenthold run` of an intercept test.
pub(super) struct Jailed<'a> {
    world: &'a World,
    flags: Vec<OsString>,
    vars: Vec<(String, String)>,
    maps: BTreeMap<(String, u16), SocketAddr>,
    timeout: Duration,
    secrets_file: Option<PathBuf>,
}

impl Jailed<'_> {
    /// `--secrets FILE` with `yaml` written to a fresh file in the test's directory.
    pub(super) fn secrets(mut self, yaml: &str) -> Self {
        let path = self.world.path(&format!("secrets-{}.yaml", random_hex(4)));
        write_file(&path, yaml.as_bytes());
        self.flags.extend(["--secrets".into(), path.clone().into()]);
        self.secrets_file = Some(path);
        self
    }

    /// The file given with `--secrets`, if any.
    pub(super) fn secrets_path(&self) -> Option<&Path> {
        self.secrets_file.as_deref()
    }

    /// `--log FILE`.
    pub(super) fn log(mut self, file: &Path) -> Self {
        self.flags.extend(["--log".into(), file.into()]);
        self
    }

    /// `--dangerous-connect-to NAME:PORT=ADDR` (replacing the default mapping of that name and port).
    pub(super) fn map(mut self, name: &str, port: u16, addr: SocketAddr) -> Self {
        self.maps.insert((name.to_owned(), port), addr);
        self
    }

    /// An environment variable of agenthold (the command inherits it unless it carries a secret value).
    pub(super) fn env(mut self, key: &str, value: &str) -> Self {
        self.vars.push((key.to_owned(), value.to_owned()));
        self
    }

    /// `--share-home`: for clients installed in root's home (pyenv's Python with `requests`).
    pub(super) fn share_home(mut self) -> Self {
        self.flags.push("--share-home".into());
        self
    }

    /// How long the run may take.
    pub(super) fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn command(&self, command: &[&str]) -> Command {
        let env = &self.world.env;
        let mut cmd = agenthold();
        cmd.arg("run")
            .arg("--data-dir")
            .arg(env.path("data"))
            .arg("--dns-upstream")
            .arg(env.dns.addr().to_string())
            .arg("--dangerous-upstream-ca")
            .arg(&self.world.ca_pem);
        for ((name, port), addr) in &self.maps {
            cmd.arg("--dangerous-connect-to")
                .arg(format!("{name}:{port}={addr}"));
        }
        cmd.args(&self.flags).arg("--").args(command);
        // The jail shows the working directory (the test's, with the clients' scripts) and hides /tmp.
        cmd.current_dir(env.dir.path());
        for (key, value) in &self.vars {
            cmd.env(key, value);
        }
        cmd
    }

    /// Starts the run.
    pub(super) fn spawn(&self, command: &[&str]) -> Child {
        self.command(command).spawn().expect("start agenthold")
    }

    /// Runs to the end and collects what it printed.
    pub(super) async fn output(&self, command: &[&str]) -> Outcome {
        finish_within(self.spawn(command), self.timeout).await
    }

    /// [`Jailed::output`] of `sh -c SCRIPT`.
    pub(super) async fn sh(&self, script: &str) -> Outcome {
        self.output(&["sh", "-c", script]).await
    }
}

/// Waits (at most `timeout`) for `child` to end and collects its output.
pub(super) async fn finish_within(child: Child, timeout: Duration) -> Outcome {
    let pid = child.id().expect("a running child has a pid");
    let output = tokio::time::timeout(timeout, child.wait_with_output())
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

/// Writes `bytes` to `path`, readable by everyone (the command may run as another user).
pub(super) fn write_file(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// Writes a client script into the test's directory and returns its path.
pub(super) fn script(world: &World, name: &str, source: &str) -> String {
    let path = world.path(name);
    write_file(&path, source.as_bytes());
    path.display().to_string()
}

/// `n` random bytes from the kernel, hex.
pub(super) fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh secret value that no file or earlier run holds: `TAG-<random>`.
pub(super) fn secret_value(tag: &str) -> String {
    format!("{tag}-{}", random_hex(12))
}

/// Standard base64 with padding.
pub(super) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// DER bytes as a PEM block.
fn pem(label: &str, der: &[u8]) -> String {
    let body = base64(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// A Python interpreter on this machine that has `requests` (the pyenv one, or the distribution's with
/// python3-requests), by its real path: inside the jail no pyenv shim is needed. The pyenv one lives in
/// root's home, which the jail shows only with `--share-home` ([`Jailed::share_home`]).
pub(super) fn python_with_requests() -> &'static str {
    static FOUND: OnceLock<String> = OnceLock::new();
    FOUND.get_or_init(|| {
        for candidate in ["python3", HOST_PYTHON] {
            let out = std::process::Command::new(candidate)
                .args(["-c", "import requests, sys; print(sys.executable)"])
                .output();
            if let Ok(out) = out
                && out.status.success()
            {
                return String::from_utf8_lossy(&out.stdout).trim().to_owned();
            }
        }
        panic!("no python3 with `requests` on this machine: apt-get install python3-requests");
    })
}

/// `KEY=value` lines printed by a client, as a map.
pub(super) fn printed(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect()
}

/// Panics unless `text` looks like an agenthold placeholder.
#[track_caller]
pub(super) fn assert_placeholder(text: &str) {
    let rest = text
        .strip_prefix("agenthold-placeholder-")
        .unwrap_or_else(|| panic!("not a placeholder: {text:?}"));
    assert!(
        rest.len() >= 26 && rest.bytes().all(|b| b.is_ascii_alphanumeric()),
        "not a placeholder: {text:?}"
    );
}

/// Waits (at most `within`) until `check` holds; returns whether it did.
pub(super) async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn base64_matches_the_rfc_vectors() {
    for (plain, encoded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64(plain.as_bytes()), encoded);
    }
}
