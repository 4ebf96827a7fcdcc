//! A custom sandbox runtime on agenthold's real gateway, without Docker: a "process sandbox" that gives each
//! agent a directory and runs each command as a child process on the host, its proxy set to the agent's
//! own explicit-proxy listener on the runtime's gateway. The runtime builds it through
//! `RuntimeBuilder::sandbox_factory`, which hands it the gateway and the CA; policies, secrets and the
//! request log are the runtime's as with Docker.
//!
//! This is a demonstration of the seam, NOT a sandbox: a host process is not isolated, and its traffic
//! goes through the gateway only because it honours `HTTPS_PROXY`. A real runtime (a VM, a jail, a remote
//! machine) must make the gateway its only way out, as the Docker runtime does with a network namespace.
//!
//! The upstream is an HTTPS server on loopback standing in for `api.example.com` (the gateway refuses
//! loopback, so the test-only `dangerous` option maps the name to it). Needs `curl` on the host.
#![allow(clippy::print_stdout)] // printing is what an example does

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use agenthold_core::sandbox::{ContainerSpec, ExecChunk, ExecRequest, ExecStream, SandboxInfo, SandboxState};
use agenthold_core::secret::{SecretRule, SecretSpec};
use agenthold_core::{AgentId, ErrorKind, NetworkPolicy, PolicyMode, Sandbox, SandboxSpec};
use agenthold_egress::datapath::{CaPaths, sandbox_env_via};
use agenthold_egress::gateway::AgentSockets;
use agenthold_egress::{Dangerous, Gateway};
use agenthold_sandbox::Runtime;
use agenthold_testsupport::{EchoServer, TestCa};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// Exit code of a command killed by `cancel_exec` (128 + SIGKILL), as the Docker runtime reports it.
const KILLED: i64 = 137;
/// Exit code of a command killed by its timeout, as `sandboxd run` reports it.
const TIMED_OUT: i64 = 124;

/// One agent of the process sandbox.
struct Agent {
    spec: ContainerSpec,
    dir: PathBuf,
    /// The agent's explicit-proxy listener on the gateway, while it runs.
    proxy: Option<SocketAddr>,
    /// Running commands, to kill by id.
    running: HashMap<String, oneshot::Sender<()>>,
}

/// Agents as directories and commands as host processes, every one proxied through the gateway.
struct ProcessSandbox {
    root: PathBuf,
    gateway: Arc<Gateway>,
    ca_pem: String,
    agents: Arc<Mutex<HashMap<AgentId, Agent>>>,
    next_exec: std::sync::atomic::AtomicU64,
}

fn lock(agents: &Mutex<HashMap<AgentId, Agent>>) -> MutexGuard<'_, HashMap<AgentId, Agent>> {
    agents.lock().unwrap_or_else(PoisonError::into_inner)
}

fn err(kind: ErrorKind, context: String, problem: &'static str) -> agenthold_core::Error {
    agenthold_core::Error::backend(kind, context, problem)
}

fn not_found(agent: &AgentId) -> agenthold_core::Error {
    agenthold_core::Error::NotFound {
        what: "sandbox",
        id: agent.to_string(),
    }
}

/// Where Debian keeps the host's trusted roots.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

fn io(context: String, e: std::io::Error) -> agenthold_core::Error {
    agenthold_core::Error::backend(ErrorKind::Upstream, context, e)
}

impl ProcessSandbox {
    fn agents(&self) -> MutexGuard<'_, HashMap<AgentId, Agent>> {
        lock(&self.agents)
    }

    /// Serve `agent` on a new explicit-proxy listener of the gateway (loopback, any port).
    fn attach(&self, agent: &AgentId) -> agenthold_core::Result<SocketAddr> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| io("bind".into(), e))?;
        let addr = listener.local_addr().map_err(|e| io("bind".into(), e))?;
        let sockets = AgentSockets {
            explicit: Some(listener),
            ..AgentSockets::default()
        };
        self.gateway
            .attach(agent, sockets)
            .map_err(|e| agenthold_core::Error::backend(ErrorKind::Upstream, "attach", e))?;
        Ok(addr)
    }

    /// `path` (absolute, inside the sandbox) on the host: under the agent's directory, never above it.
    fn host_path(&self, agent: &AgentId, path: &str) -> agenthold_core::Result<PathBuf> {
        let relative = path
            .strip_prefix('/')
            .filter(|p| {
                Path::new(p)
                    .components()
                    .all(|c| matches!(c, Component::Normal(_)))
            })
            .ok_or_else(|| {
                err(
                    ErrorKind::BadInput,
                    format!("{path:?}"),
                    "give an absolute path without '..'",
                )
            })?;
        let agents = self.agents();
        let a = agents.get(agent).ok_or_else(|| not_found(agent))?;
        Ok(a.dir.join(relative))
    }
}

#[async_trait::async_trait]
impl Sandbox for ProcessSandbox {
    async fn create(&self, agent: &AgentId, spec: &ContainerSpec) -> agenthold_core::Result<SandboxInfo> {
        let dir = self.root.join(agent.as_str());
        // The CA the gateway signs intercepted hosts with, where the commands' TLS clients look (E14).
        let ca_dir = dir.join(".agenthold");
        std::fs::create_dir_all(&ca_dir).map_err(|e| io(format!("create {}", ca_dir.display()), e))?;
        std::fs::write(ca_dir.join("ca.crt"), &self.ca_pem).map_err(|e| io("write the CA".into(), e))?;
        // The bundle: the host's roots (for hosts spliced untouched) and the CA (for intercepted ones).
        let mut bundle = std::fs::read(SYSTEM_BUNDLE).unwrap_or_default();
        bundle.extend_from_slice(self.ca_pem.as_bytes());
        std::fs::write(ca_dir.join("bundle.pem"), bundle).map_err(|e| io("write the CA bundle".into(), e))?;
        let proxy = self.attach(agent)?;
        self.agents().insert(
            agent.clone(),
            Agent {
                spec: spec.clone(),
                dir,
                proxy: Some(proxy),
                running: HashMap::new(),
            },
        );
        self.inspect(agent).await
    }

    async fn start(&self, agent: &AgentId) -> agenthold_core::Result<()> {
        if self
            .agents()
            .get(agent)
            .ok_or_else(|| not_found(agent))?
            .proxy
            .is_some()
        {
            return Ok(());
        }
        let proxy = self.attach(agent)?;
        if let Some(a) = self.agents().get_mut(agent) {
            a.proxy = Some(proxy);
        }
        Ok(())
    }

    async fn stop(&self, agent: &AgentId) -> agenthold_core::Result<()> {
        let running = {
            let mut agents = self.agents();
            let a = agents.get_mut(agent).ok_or_else(|| not_found(agent))?;
            a.proxy = None;
            std::mem::take(&mut a.running)
        };
        for (_, kill) in running {
            let _ = kill.send(());
        }
        self.gateway.detach(agent);
        Ok(())
    }

    async fn remove(&self, agent: &AgentId, _keep_volume: bool) -> agenthold_core::Result<()> {
        if self.agents().contains_key(agent) {
            self.stop(agent).await?;
        }
        if let Some(a) = self.agents().remove(agent) {
            std::fs::remove_dir_all(&a.dir).map_err(|e| io(format!("remove {}", a.dir.display()), e))?;
        }
        Ok(())
    }

    async fn exec_stream(&self, agent: &AgentId, request: ExecRequest) -> agenthold_core::Result<ExecStream> {
        let Some((program, args)) = request.argv.split_first() else {
            return Err(err(ErrorKind::BadInput, "exec".into(), "exec needs a command"));
        };
        let cwd = match &request.cwd {
            Some(cwd) => self.host_path(agent, cwd)?,
            None => self.root.join(agent.as_str()),
        };
        let (spec_env, dir, proxy) = {
            let agents = self.agents();
            let a = agents.get(agent).ok_or_else(|| not_found(agent))?;
            let proxy = a.proxy.ok_or_else(|| {
                err(
                    ErrorKind::BadInput,
                    format!("exec in {agent}"),
                    "the sandbox is stopped",
                )
            })?;
            (a.spec.env().clone(), a.dir.clone(), proxy)
        };
        // The one sandbox environment (proxy and CA variables), pointed at this agent's listener.
        let ca_dir = dir.join(".agenthold");
        let ca = CaPaths::new(
            ca_dir.join("ca.crt").to_string_lossy(),
            ca_dir.join("bundle.pem").to_string_lossy(),
        );
        let datapath_env = sandbox_env_via(proxy, &ca);
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .current_dir(cwd)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &dir)
            .envs(&datapath_env)
            .envs(&spec_env)
            .envs(&request.env)
            .stdin(if request.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| io(format!("run {program:?}"), e))?;
        if let (Some(data), Some(mut stdin)) = (request.stdin, child.stdin.take()) {
            tokio::spawn(async move {
                let _ = stdin.write_all(&data).await;
            });
        }
        let id = format!(
            "proc-{}",
            self.next_exec.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let (kill_tx, kill_rx) = oneshot::channel();
        if let Some(a) = self.agents().get_mut(agent) {
            a.running.insert(id.clone(), kill_tx);
        }
        // Bounded: a command that writes faster than the caller reads waits for it.
        let (tx, rx) = mpsc::channel(64);
        let (out, errs) = (child.stdout.take(), child.stderr.take());
        let (agents, agent, exec_id) = (Arc::clone(&self.agents), agent.clone(), id.clone());
        tokio::spawn(async move {
            let pumps = async {
                tokio::join!(
                    pump(out, &tx, ExecChunk::Stdout),
                    pump(errs, &tx, ExecChunk::Stderr)
                );
                child.wait().await
            };
            let timeout = request.timeout.unwrap_or(std::time::Duration::MAX);
            let code = tokio::select! {
                status = pumps => status.map_or(-1, |s| {
                    use std::os::unix::process::ExitStatusExt as _;
                    s.code().map(i64::from).or_else(|| s.signal().map(|n| 128 + i64::from(n))).unwrap_or(-1)
                }),
                _ = kill_rx => KILLED,
                () = tokio::time::sleep(timeout) => TIMED_OUT,
            };
            if let Some(a) = lock(&agents).get_mut(&agent) {
                a.running.remove(&exec_id);
            }
            // kill_on_drop ends a command that was cancelled or timed out.
            let _ = tx.send(Ok(ExecChunk::Exit(code))).await;
        });
        let chunks =
            futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
        Ok(ExecStream::new(id, chunks))
    }

    async fn cancel_exec(&self, agent: &AgentId, exec_id: &str) -> agenthold_core::Result<()> {
        let kill = self
            .agents()
            .get_mut(agent)
            .ok_or_else(|| not_found(agent))?
            .running
            .remove(exec_id);
        if let Some(kill) = kill {
            let _ = kill.send(());
        }
        Ok(())
    }

    async fn read_file(&self, agent: &AgentId, path: &str) -> agenthold_core::Result<Vec<u8>> {
        let host = self.host_path(agent, path)?;
        tokio::fs::read(&host).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => agenthold_core::Error::NotFound {
                what: "file",
                id: path.to_owned(),
            },
            _ => io(format!("read {path}"), e),
        })
    }

    async fn write_file(&self, agent: &AgentId, path: &str, data: &[u8]) -> agenthold_core::Result<()> {
        let host = self.host_path(agent, path)?;
        if let Some(parent) = host.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| io(format!("create the parents of {path}"), e))?;
        }
        tokio::fs::write(&host, data)
            .await
            .map_err(|e| io(format!("write {path}"), e))
    }

    async fn inspect(&self, agent: &AgentId) -> agenthold_core::Result<SandboxInfo> {
        let agents = self.agents();
        let a = agents.get(agent).ok_or_else(|| not_found(agent))?;
        Ok(SandboxInfo {
            agent: agent.clone(),
            state: if a.proxy.is_some() {
                SandboxState::Running
            } else {
                SandboxState::Stopped
            },
            image: a.spec.image().to_owned(),
        })
    }
}

/// Forward one output of a command as chunks until it closes.
async fn pump(
    from: Option<impl AsyncRead + Unpin>,
    to: &mpsc::Sender<agenthold_core::Result<ExecChunk>>,
    chunk: fn(Vec<u8>) -> ExecChunk,
) {
    let Some(mut from) = from else { return };
    let mut buf = vec![0; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if to.send(Ok(chunk(buf[..n].to_vec()))).await.is_err() {
            return;
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("warn").init();
    let ca = Arc::new(TestCa::new());
    let upstream = EchoServer::https_with_ca(Arc::clone(&ca), &["api.example.com"]).await;
    let data_dir = std::env::var("AGENTHOLD_DATA_DIR").map_or_else(
        |_| std::env::temp_dir().join("agenthold-custom-runtime"),
        PathBuf::from,
    );
    let sandboxes = data_dir.join("process-sandboxes");
    let runtime = Runtime::builder()
        .data_dir(&data_dir)
        .sandbox_factory(move |ctx| {
            Arc::new(ProcessSandbox {
                root: sandboxes,
                gateway: Arc::clone(&ctx.gateway),
                ca_pem: ctx.ca.cert_pem().to_owned(),
                agents: Arc::default(),
                next_exec: std::sync::atomic::AtomicU64::new(1),
            })
        })
        .dangerous(Dangerous {
            connect_to: vec![("api.example.com".into(), 443, upstream.addr())],
            upstream_ca_pem: Some(ca.pem().into_bytes()),
        })
        .build()
        .await?;
    println!(
        "runtime ready with a process sandbox (data dir {})",
        data_dir.display()
    );

    let api_key = SecretSpec::new(
        "api-key",
        "sk-custom-runtime-real-value".into(),
        Some("API_KEY"),
        vec![SecretRule::header(
            &["api.example.com"],
            "Authorization",
            "Bearer {{.Value}}",
        )?],
    )?;
    let spec = SandboxSpec {
        policy: NetworkPolicy::parse(PolicyMode::Allowlist, &["api.example.com"])?,
        secrets: vec![api_key],
        ..SandboxSpec::default()
    };
    let agent = runtime.create_sandbox(spec).await?;
    println!("sandbox {agent} created");

    let script = "echo \"$API_KEY\" > note.txt; \
                  curl -sS https://api.example.com/v1/hello -H \"Authorization: Bearer $API_KEY\" -o /dev/null \
                    -w 'api.example.com: %{http_code}\\n'; \
                  curl -sS -m 5 https://example.org/ -o /dev/null 2>/dev/null || echo 'example.org: refused (not on the allowlist)'";
    let out = runtime.exec(&agent, &["sh", "-c", script]).await?;
    print!(
        "--- command output (exit {}) ---\n{}",
        out.exit_code,
        String::from_utf8_lossy(&out.stdout)
    );
    let note = runtime.read_file(&agent, "/note.txt").await?;
    println!(
        "--- note.txt holds the placeholder: {}",
        String::from_utf8_lossy(&note).trim()
    );
    if let Some(seen) = upstream.requests().last() {
        println!(
            "--- the upstream received Authorization: {:?}",
            seen.header("authorization")
        );
    }

    runtime
        .set_policy(&agent, NetworkPolicy::allowlist(Vec::new()))
        .await?;
    let again = runtime
        .exec(
            &agent,
            &["sh", "-c", "curl -sS -m 5 https://api.example.com/ -o /dev/null 2>/dev/null || echo 'api.example.com: refused after set_policy'"],
        )
        .await?;
    print!("{}", String::from_utf8_lossy(&again.stdout));

    println!("--- request log ---");
    for entry in runtime.request_log(&agent) {
        println!("{}", entry.to_json_line());
    }
    runtime.remove(&agent).await?;
    runtime.shutdown().await;
    println!("sandbox removed");
    Ok(())
}
