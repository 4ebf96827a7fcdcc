//! What every test here shares: the dev image (built once per process), loopback upstreams the gateway is
//! pointed at with the test-only `dangerous` switches, a [`Runtime`] on its own data directory, shell
//! helpers that run inside a sandbox, engine look-ups, and a cleanup that runs even when a test panics.
//!
//! Names: `allowed.test` (HTTPS and HTTP upstreams) and `*.allowed.test` are on the allowlist;
//! `denied.test` is not, but it is mapped to canary upstreams, so a policy hole would show up there rather
//! than as a connection failure. `www.allowed.test` resolves through the test DNS server (to a documentation
//! address nothing ever dials).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthold_core::sandbox::{ExecOutput, ExecRequest};
use agenthold_core::secret::{AlsoIn, SecretRule, SecretSpec};
use agenthold_core::{AgentId, Config, NetworkPolicy, PolicyMode, SandboxSpec};
use agenthold_egress::Dangerous;
use agenthold_sandbox::Runtime;
use agenthold_sandbox::docker::image::{DevImageOptions, ImageRef, ensure_dev_image};
use agenthold_testsupport::{EchoServer, TestCa, TestDns};
use bollard::Docker;
use futures_util::FutureExt;

pub use crate::engine::{container, engine_objects, host_config, network, sweep};

/// On the allowlist, served by [`Upstreams::https`] and [`Upstreams::http`].
pub const ALLOWED: &str = "allowed.test";
/// Not on the allowlist; mapped to canaries that must never see a request.
pub const DENIED: &str = "denied.test";
/// On the allowlist through `*.allowed.test`, resolved by the test DNS server (only resolved, never dialled).
pub const RESOLVED: &str = "www.allowed.test";
/// What [`RESOLVED`] resolves to upstream: a public address (the guard strips documentation ranges), which
/// no test ever connects to.
pub const RESOLVED_ADDR: Ipv4Addr = Ipv4Addr::new(93, 184, 215, 14);
/// The secret's real value: must reach the upstream, never the sandbox.
pub const SECRET_VALUE: &str = "sk-real-value-8f2c1e7a";
/// A regular expression matching [`SECRET_VALUE`] but not itself (so a `grep` for it does not find its own
/// command line in `/proc`).
pub const SECRET_REGEX: &str = "sk-real-value-8f2c1e7[a]";
/// The environment variable carrying the secret's placeholder.
pub const SECRET_ENV: &str = "API_KEY";

/// The longest one test body (or a runtime build) may take; every test here takes well under a minute alone.
pub const BODY_LIMIT: Duration = Duration::from_secs(600);

/// The dev image, built or reused once per test process.
pub async fn dev_image() -> ImageRef {
    static IMAGE: tokio::sync::OnceCell<ImageRef> = tokio::sync::OnceCell::const_new();
    IMAGE
        .get_or_init(|| async {
            let docker = docker().await;
            // One work directory for every test process (the image tests' too): its lock serialises builds.
            let work = std::env::temp_dir().join("agenthold-image-tests");
            let started = Instant::now();
            let image = ensure_dev_image(&docker, &work, &DevImageOptions::default())
                .await
                .expect("build or reuse agenthold/dev");
            eprintln!("dev image ready in {:?}", started.elapsed());
            image
        })
        .await
        .clone()
}

/// A version-negotiated engine client (one per call: a client must not outlive its tokio runtime).
pub async fn docker() -> Docker {
    Docker::connect_with_local_defaults()
        .expect("docker socket")
        .negotiate_version()
        .await
        .expect("docker engine")
}

/// Loopback upstreams and DNS the gateway is pointed at.
pub struct Upstreams {
    /// Trust anchor of the HTTPS upstreams.
    pub ca: Arc<TestCa>,
    /// `https://allowed.test`.
    pub https: EchoServer,
    /// `http://allowed.test`.
    pub http: EchoServer,
    /// `https://denied.test`: a canary.
    pub denied_https: EchoServer,
    /// `http://denied.test`: a canary.
    pub denied_http: EchoServer,
    /// The gateway's DNS upstream.
    pub dns: TestDns,
}

impl Upstreams {
    /// Start every upstream on loopback.
    pub async fn start() -> Self {
        let ca = Arc::new(TestCa::new());
        let https = EchoServer::https_with_ca(Arc::clone(&ca), &[ALLOWED]).await;
        let denied_https = EchoServer::https_with_ca(Arc::clone(&ca), &[DENIED]).await;
        let dns = TestDns::start([(RESOLVED, vec![IpAddr::V4(RESOLVED_ADDR)])], 60).await;
        Self {
            ca,
            https,
            http: EchoServer::http().await,
            denied_https,
            denied_http: EchoServer::http().await,
            dns,
        }
    }

    /// The test-only switches: every name mapped to its loopback upstream, the test CA trusted upstream.
    pub fn dangerous(&self) -> Dangerous {
        Dangerous {
            connect_to: vec![
                (ALLOWED.into(), 443, self.https.addr()),
                (ALLOWED.into(), 80, self.http.addr()),
                (DENIED.into(), 443, self.denied_https.addr()),
                (DENIED.into(), 80, self.denied_http.addr()),
            ],
            upstream_ca_pem: Some(self.ca.pem().into_bytes()),
        }
    }

    /// Requests the canaries received (must stay empty).
    pub fn canary_requests(&self) -> usize {
        self.denied_https.requests().len() + self.denied_http.requests().len()
    }
}

/// The allowlist every test agent starts with.
pub fn allowlist() -> NetworkPolicy {
    NetworkPolicy::parse(PolicyMode::Allowlist, &[ALLOWED, "*.allowed.test"]).expect("valid allowlist")
}

/// A secret injected as `Authorization: Bearer …` for `allowed.test`, its placeholder in `API_KEY`, also
/// replaced in the `X-Key` header and the `key` query parameter (`also_in`, E13).
pub fn secret() -> SecretSpec {
    let rule = SecretRule::header(&[ALLOWED], "Authorization", "Bearer {{.Value}}")
        .and_then(|r| r.with_also_in(AlsoIn::new(&["x-key"], &["key"])?))
        .expect("valid rule");
    SecretSpec::new("api-key", SECRET_VALUE.into(), Some(SECRET_ENV), vec![rule]).expect("valid secret")
}

/// A spec: allowlist, the secret, small limits.
pub fn spec() -> SandboxSpec {
    SandboxSpec {
        policy: allowlist(),
        secrets: vec![secret()],
        memory_bytes: Some(256 * 1024 * 1024),
        pids: Some(128),
        ..SandboxSpec::default()
    }
}

/// The installation label a runtime on `data_dir` puts on its objects.
pub fn instance_of(data_dir: &Path) -> String {
    agenthold_sandbox::docker::engine::instance_label(data_dir)
}

/// A runtime on its own data directory, with its upstreams.
pub struct Env {
    /// The runtime under test.
    pub runtime: Runtime,
    /// Its upstreams.
    pub up: Upstreams,
    /// Its data directory (removed on drop).
    pub dir: tempfile::TempDir,
    /// Its installation label.
    pub instance: String,
    /// Random prefix of this environment's agent ids.
    pub prefix: String,
    agents: std::sync::atomic::AtomicU32,
}

/// A distinct /22 per environment in this process, inside 10.214.0.0/16, so that parallel runtimes never
/// race for the same /24 (the default pool is left to
/// other users of the engine).
pub fn next_pool() -> ipnet::Ipv4Net {
    static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 64;
    format!("10.214.{}.0/22", n * 4).parse().expect("valid pool")
}

/// A configuration for `dir` and `pool` with the seeds' defaults otherwise.
pub fn config(dir: &Path, pool: ipnet::Ipv4Net) -> Config {
    let mut config = Config {
        data_dir: dir.to_path_buf(),
        ..Config::default()
    };
    config.sandbox.subnet_pool = pool;
    config
}

/// Build a runtime with `config` pointed at `up`.
pub async fn build_runtime(config: Config, up: &Upstreams) -> Runtime {
    Runtime::builder()
        .config(config)
        .dns_upstream(up.dns.addr())
        .dangerous(up.dangerous())
        .build()
        .await
        .expect("build the runtime")
}

impl Env {
    /// An environment around a runtime built elsewhere.
    pub fn from_parts(runtime: Runtime, up: Upstreams, dir: tempfile::TempDir) -> Self {
        let instance = instance_of(dir.path());
        let prefix = AgentId::random().to_string();
        Self {
            runtime,
            up,
            dir,
            instance,
            prefix,
            agents: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Upstreams, a data directory and a runtime; the dev image exists.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// [`Env::start`], with the runtime's configuration changed by `tune` first.
    pub async fn start_with(tune: impl FnOnce(&mut Config)) -> Self {
        agenthold_testsupport::require_root();
        agenthold_testsupport::init_tracing();
        dev_image().await;
        let up = Upstreams::start().await;
        let dir = tempfile::Builder::new()
            .prefix("ah-int-")
            .tempdir()
            .expect("data dir");
        let mut config = config(dir.path(), next_pool());
        tune(&mut config);
        let runtime = tokio::time::timeout(BODY_LIMIT, build_runtime(config, &up))
            .await
            .unwrap_or_else(|_| panic!("building the runtime took over {BODY_LIMIT:?}"));
        Self::from_parts(runtime, up, dir)
    }

    /// A sandbox with [`spec`] (or `spec` when given).
    ///
    /// Agent ids are `<random prefix>-NNN`, increasing within an environment (readable in logs; the order
    /// of network names once mattered: `lifecycle::agents_are_created_whatever_their_names_sort_to`).
    pub async fn sandbox(&self, spec: Option<SandboxSpec>) -> AgentId {
        let agent = self.next_agent();
        let spec = spec.unwrap_or_else(self::spec);
        self.runtime
            .create_sandbox_with_id(&agent, spec)
            .await
            .expect("create a sandbox");
        agent
    }

    /// Whether `agent`'s sandboxd gets a live tunnel within 30 s.
    pub async fn tunnel_comes_up(&self, agent: &AgentId) -> bool {
        wait_for(Duration::from_secs(30), || async {
            self.runtime.tunnel_status(agent) == agenthold_sandbox::tunnel::TunnelStatus::Connected
        })
        .await
        .is_some()
    }

    /// A fresh agent id, greater than every id this environment handed out before.
    pub fn next_agent(&self) -> AgentId {
        let n = self.agents.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        AgentId::new(format!("{}-{n:03}", self.prefix)).expect("a valid agent id")
    }

    /// Run `body`, then remove everything this environment made, also when `body` panicked.
    ///
    /// The body is bounded by [`BODY_LIMIT`]: a hang fails the test (after the cleanup) instead of
    /// stalling the whole suite.
    pub async fn guard(&self, body: impl Future<Output = ()>) {
        let outcome = tokio::time::timeout(BODY_LIMIT, AssertUnwindSafe(body).catch_unwind()).await;
        self.cleanup().await;
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => panic!("the test body did not finish within {BODY_LIMIT:?}"),
        }
    }

    /// Remove every sandbox through the runtime, stop it, then sweep anything left with this installation's
    /// label (a failed test must not leave containers behind for the next one).
    pub async fn cleanup(&self) {
        for agent in self.runtime.sandboxes().await.unwrap_or_default() {
            if let Err(e) = self.runtime.remove(&agent).await {
                eprintln!("cleanup: removing {agent} failed: {e}");
            }
        }
        self.runtime.shutdown().await;
        sweep(&self.instance).await;
    }

    /// `bash -c script` in `agent`, to completion.
    pub async fn sh(&self, agent: &AgentId, script: &str) -> Out {
        sh(&self.runtime, agent, script).await
    }
}

/// Agents with a sandbox container of `instance` on the engine (by label), running or not.
pub async fn sandboxes_of(instance: &str) -> Vec<AgentId> {
    use agenthold_sandbox::docker::engine::{LABEL_AGENT, LABEL_INSTANCE, LABEL_ROLE};
    let filters = std::collections::HashMap::from([(
        "label".to_owned(),
        vec![
            format!("{LABEL_INSTANCE}={instance}"),
            format!("{LABEL_ROLE}=sandbox"),
        ],
    )]);
    let options = bollard::query_parameters::ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    docker()
        .await
        .list_containers(Some(options))
        .await
        .expect("list containers")
        .into_iter()
        .filter_map(|c| c.labels?.get(LABEL_AGENT).cloned())
        .filter_map(|a| AgentId::new(a).ok())
        .collect()
}

/// A finished command, with its output as text.
#[derive(Debug, Clone)]
pub struct Out {
    /// Exit code.
    pub code: i64,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl From<ExecOutput> for Out {
    fn from(o: ExecOutput) -> Self {
        Self {
            code: o.exit_code,
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

impl Out {
    /// Panics (with the output) unless the command exited 0.
    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "command failed:\n{self}");
        self
    }
}

/// `bash -c script` in `agent` through `runtime`, with a 60 s timeout.
pub async fn sh(runtime: &Runtime, agent: &AgentId, script: &str) -> Out {
    let request = ExecRequest {
        argv: vec!["bash".into(), "-c".into(), script.into()],
        timeout: Some(Duration::from_secs(60)),
        ..ExecRequest::default()
    };
    runtime.exec_request(agent, request).await.expect("exec").into()
}

/// Run a Python program in `agent` (stdin-fed), with a timeout.
pub async fn python(runtime: &Runtime, agent: &AgentId, program: &str) -> Out {
    let request = ExecRequest {
        argv: vec!["python3".into(), "-".into()],
        stdin: Some(program.as_bytes().to_vec()),
        timeout: Some(Duration::from_secs(90)),
        ..ExecRequest::default()
    };
    runtime.exec_request(agent, request).await.expect("exec").into()
}

/// Poll `check` every 100 ms until it returns true or `limit` passes; the time it took, or `None`.
pub async fn wait_for<F, Fut>(limit: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if check().await {
            return Some(started.elapsed());
        }
        if started.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Run a host command, returning stdout (panics when it cannot run).
pub fn host(program: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

/// The `n`th address of `subnet` (counting from its network address).
pub fn nth(subnet: ipnet::Ipv4Net, n: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()) + u32::from(n))
}

/// The gateway holder's address on `subnet`: the last before broadcast (`.254` of a /24, `.14` of a /28).
pub fn holder_addr(subnet: ipnet::Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.broadcast()) - 1)
}
