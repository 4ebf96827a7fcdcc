//! The reference server's API cost, side by side in one run (issue 11, "Performance"):
//!
//! 1. **exec through the API vs `Runtime::exec`**: `POST …/execs` (token auth, authz, audit, JSON) against
//!    the same server's runtime called directly, rounds interleaved; the added latency is the difference of
//!    the medians (target: ≤ 2 ms). Real Docker sandbox.
//! 2. **list 1,000 agents**: `GET …/agents?limit=1000` as a member holding a viewer grant on each (authz per
//!    agent), p50 (target: ≤ 10 ms). The agents live in the in-memory `FakeSandbox` runtime: this measures
//!    the API, not the engine.
//! 3. **1,000 SSE subscribers** on one agent's request-log tail while entries are recorded: every
//!    subscriber must see every entry; the server's RSS before and after is reported.
//! 4. **cheap authenticated GET**: `GET /api/v1/me` with a token vs a bare axum handler answering the same
//!    JSON, keep-alive requests per second over 16 connections (target: ≥ 0.5×).
//!
//! 5. **run overhead vs bare exec**: a `custom`-harness run of `true` from `POST …/runs` to its `end` event
//!    on `…/runs/{run}/events` against `POST …/execs` of `true` waiting for its JSON answer, rounds
//!    interleaved, p50 of each and the difference (what a run adds: its record, the output follower, the
//!    parser, the second request for the stream). Real Docker sandbox.
//!
//! 6. **exec through the API on each store**: the server of part 1 with its state in the redb file and
//!    one with its state in PostgreSQL (a throwaway server from Debian's package on loopback), rounds
//!    interleaved, p50 and p99 of each (issue 15).
//!
//! `cargo bench -p agenthold-benches --bench server` (root, Docker running for parts 1, 5 and 6).
//! `BENCH_ONLY=exec,list,sse,me,run,stores`, `BENCH_SECONDS` (part 4, default 5), `BENCH_ROUNDS` (part 1, default
//! 200), `BENCH_RUN_ROUNDS` (part 5, default 50).
// A benchmark's output is its table on stdout.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agenthold_benches::harness;
use agenthold_benches::load::http_keepalive;
use agenthold_benches::report::median;
use agenthold_benches::table::{num, render};
use agenthold_core::store::RedbStore;
use agenthold_core::{AgentId, Config, Store};
use agenthold_egress::log::{LogEntry, LogKind};
use agenthold_sandbox::Runtime;
use agenthold_sandbox::fake::FakeSandbox;
use agenthold_server::{AdminRequest, Server, admin_call};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

fn main() -> ExitCode {
    harness::main("server", || agenthold_benches::load::block_on(run()))
}

fn wants(part: &str) -> bool {
    std::env::var("BENCH_ONLY").map_or(true, |only| only.split(',').any(|p| p.trim() == part))
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A server in this process on a loopback port, with its admin socket.
struct Running {
    base: SocketAddr,
    data_dir: std::path::PathBuf,
    runtime: Arc<Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<()>>,
    _dir: tempfile::TempDir,
}

impl Running {
    /// `fake`: the in-memory sandbox runtime instead of Docker.
    async fn start(fake: bool) -> Result<Self> {
        Self::start_on(fake, None).await
    }

    /// [`Running::start`] with the state in the PostgreSQL database `store` (its URL and a file holding
    /// the password) instead of the redb file.
    async fn start_on(fake: bool, store: Option<(String, std::path::PathBuf)>) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let data_dir = dir.path().join("data");
        let mut config = Config::from_yaml("", Vec::new())?;
        config.data_dir.clone_from(&data_dir);
        if let Some((url, password_file)) = store {
            config.store = url;
            config.store_password_file = password_file;
        }
        // The benchmark is the only client: no rate limit in its way.
        config.auth.rate_per_user = 0;
        config.auth.rate_per_token = 0;
        let server = if fake {
            let store: Arc<dyn Store> = Arc::new(RedbStore::open_in_data_dir(&data_dir)?);
            let runtime = Runtime::builder()
                .config(config.clone())
                .sandbox(Arc::new(FakeSandbox::new()))
                .store(Arc::clone(&store))
                .build()
                .await?;
            Server::with_runtime(config, runtime, store).await?
        } else {
            Server::start(config).await?
        };
        let runtime = Arc::clone(server.runtime());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = listener.local_addr()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(server.serve(listener, async move {
            let _ = rx.await;
        }));
        // `serve` binds the admin socket first thing; wait for it.
        let socket = data_dir.join("admin.sock");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() > deadline {
                bail!("the server did not bind {}", socket.display());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(Self {
            base,
            data_dir,
            runtime,
            stop: Some(tx),
            task,
            _dir: dir,
        })
    }

    async fn admin(&self, request: AdminRequest) -> Result<String> {
        admin_call(&self.data_dir, &request).await
    }

    /// A user with a token.
    async fn user(&self, name: &str) -> Result<(String, String)> {
        let id = self
            .admin(AdminRequest::UserCreate {
                name: name.into(),
                email: None,
            })
            .await?;
        let token = self
            .admin(AdminRequest::TokenCreate {
                user: id.clone(),
                expires_in: None,
                name: None,
            })
            .await?;
        Ok((id, token))
    }

    /// A workspace of the token's user with one agent: the agents path and the agent's id.
    async fn workspace_with_agent(&self, token: &str) -> Result<(String, String)> {
        let name = json!({"name": "bench"});
        let ws = expect(self.base, "POST", "/api/v1/workspaces", token, Some(&name), 201).await?;
        let ws = ws["id"].as_str().context("workspace id")?;
        let agents = format!("/api/v1/workspaces/{ws}/agents");
        let agent = expect(self.base, "POST", &agents, token, Some(&name), 201).await?;
        let agent_id = agent["id"].as_str().context("agent id")?.to_owned();
        Ok((agents, agent_id))
    }

    async fn stop(mut self) -> Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task.await?
    }
}

/// One HTTP/1.1 request on a fresh connection; the status and JSON body.
async fn call(
    base: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> Result<(u16, Value)> {
    let mut stream = TcpStream::connect(base).await?;
    stream.write_all(&request(method, path, token, body)).await?;
    let mut raw = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut raw).await?;
    parse(&raw)
}

fn request(method: &str, path: &str, token: &str, body: Option<&Value>) -> Vec<u8> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\nAccept: application/json\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn parse(raw: &[u8]) -> Result<(u16, Value)> {
    let text = String::from_utf8_lossy(raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status line")?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let body = if text.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

async fn expect(
    base: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&Value>,
    want: u16,
) -> Result<Value> {
    let (status, value) = call(base, method, path, token, body).await?;
    if status != want {
        bail!("{method} {path}: {status} {value}");
    }
    Ok(value)
}

async fn run() -> Result<()> {
    let mut rows = Vec::new();
    if wants("exec") {
        rows.extend(exec_latency().await.context("exec latency")?);
    }
    if wants("list") {
        rows.extend(list_agents().await.context("list 1,000 agents")?);
    }
    if wants("sse") {
        rows.extend(sse_subscribers().await.context("1,000 SSE subscribers")?);
    }
    if wants("me") {
        rows.extend(me_rate().await.context("GET /me rate")?);
    }
    if wants("run") {
        rows.extend(run_overhead().await.context("run overhead")?);
    }
    if wants("stores") {
        rows.extend(exec_on_stores().await.context("exec on each store")?);
    }
    println!(
        "{}",
        render(
            &["measurement", "ours", "reference", "ratio / added", "target"],
            &rows,
            &[1, 2, 3]
        )
    );
    Ok(())
}

fn ms(d: f64) -> String {
    format!("{:.2} ms", d * 1e3)
}

/// Part 6: exec through the API, the server's state on redb vs PostgreSQL, rounds interleaved.
async fn exec_on_stores() -> Result<Vec<Vec<String>>> {
    let pg = agenthold_testsupport::TestPostgres::start();
    pg.create_database("server");
    let secrets = tempfile::tempdir()?;
    let password_file = secrets.path().join("pg-password");
    std::fs::write(&password_file, agenthold_testsupport::PG_PASSWORD)?;
    let on_redb = Running::start(false).await?;
    let on_pg = Running::start_on(false, Some((pg.url("server"), password_file))).await?;
    let body = json!({"argv": ["true"]});
    let mut targets = Vec::new();
    for server in [&on_redb, &on_pg] {
        let (_, token) = server.user("bench").await?;
        let (agents, agent_id) = server.workspace_with_agent(&token).await?;
        targets.push((
            format!("{agents}/{agent_id}/execs"),
            token,
            format!("{agents}/{agent_id}"),
        ));
    }
    for _ in 0..5 {
        for (server, (execs, token, _)) in [&on_redb, &on_pg].into_iter().zip(&targets) {
            expect(server.base, "POST", execs, token, Some(&body), 200).await?;
        }
    }
    harness::settle("server");
    let rounds = env_u64("BENCH_ROUNDS", 200);
    let mut samples = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (i, (server, (execs, token, _))) in [&on_redb, &on_pg].into_iter().zip(&targets).enumerate() {
            let t = Instant::now();
            let out = expect(server.base, "POST", execs, token, Some(&body), 200).await?;
            samples[i].push(t.elapsed().as_secs_f64());
            if out["exit_code"] != 0 {
                bail!("exec through the API: {out}");
            }
        }
    }
    for (server, (_, token, agent)) in [&on_redb, &on_pg].into_iter().zip(&targets) {
        expect(server.base, "DELETE", agent, token, None, 204).await?;
    }
    on_redb.stop().await?;
    on_pg.stop().await?;
    let p99 = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get((v.len().saturating_sub(1) as f64 * 0.99).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let (redb, postgres) = (
        median(&samples[0]).unwrap_or(f64::NAN),
        median(&samples[1]).unwrap_or(f64::NAN),
    );
    Ok(vec![
        vec![
            format!("exec through the API, p50 ({rounds} rounds), postgres vs redb store"),
            ms(postgres),
            ms(redb),
            format!("+{}", ms(postgres - redb)),
            "-".into(),
        ],
        vec![
            "exec through the API, p99, postgres vs redb store".into(),
            ms(p99(&samples[1])),
            ms(p99(&samples[0])),
            format!("+{}", ms(p99(&samples[1]) - p99(&samples[0]))),
            "-".into(),
        ],
    ])
}

async fn exec_latency() -> Result<Vec<Vec<String>>> {
    let server = Running::start(false).await?;
    let (_, token) = server.user("bench").await?;
    let (agents, agent_id) = server.workspace_with_agent(&token).await?;
    let execs = format!("{agents}/{agent_id}/execs");
    let body = json!({"argv": ["true"]});
    let id = AgentId::new(agent_id.clone())?;
    let rounds = env_u64("BENCH_ROUNDS", 200);
    let (mut api, mut direct) = (Vec::new(), Vec::new());
    // Warm-up of both, then interleaved rounds.
    for _ in 0..5 {
        expect(server.base, "POST", &execs, &token, Some(&body), 200).await?;
        server.runtime.exec(&id, &["true"]).await?;
    }
    harness::settle("server");
    for _ in 0..rounds {
        let t = Instant::now();
        let out = expect(server.base, "POST", &execs, &token, Some(&body), 200).await?;
        api.push(t.elapsed().as_secs_f64());
        if out["exit_code"] != 0 {
            bail!("exec through the API: {out}");
        }
        let t = Instant::now();
        server.runtime.exec(&id, &["true"]).await?;
        direct.push(t.elapsed().as_secs_f64());
    }
    expect(
        server.base,
        "DELETE",
        &format!("{agents}/{agent_id}"),
        &token,
        None,
        204,
    )
    .await?;
    server.stop().await?;
    let (a, d) = (
        median(&api).unwrap_or(f64::NAN),
        median(&direct).unwrap_or(f64::NAN),
    );
    Ok(vec![vec![
        format!("exec [\"true\"], p50 of {rounds} (API vs Runtime::exec)"),
        ms(a),
        ms(d),
        format!("+{}", ms(a - d)),
        "≤ +2 ms".into(),
    ]])
}

async fn list_agents() -> Result<Vec<Vec<String>>> {
    let server = Running::start(true).await?;
    let (_, owner) = server.user("owner").await?;
    let (member, member_token) = server.user("member").await?;
    let ws = expect(
        server.base,
        "POST",
        "/api/v1/workspaces",
        &owner,
        Some(&json!({"name": "bench"})),
        201,
    )
    .await?;
    let ws = ws["id"].as_str().context("workspace id")?.to_owned();
    expect(
        server.base,
        "PUT",
        &format!("/api/v1/workspaces/{ws}/members/{member}"),
        &owner,
        Some(&json!({"role": "member"})),
        201,
    )
    .await?;
    let agents = format!("/api/v1/workspaces/{ws}/agents");
    for i in 0..1000 {
        let a = expect(
            server.base,
            "POST",
            &agents,
            &owner,
            Some(&json!({"name": format!("a{i}")})),
            201,
        )
        .await?;
        let id = a["id"].as_str().context("agent id")?;
        expect(
            server.base,
            "PUT",
            &format!("{agents}/{id}/grants/{member}"),
            &owner,
            Some(&json!({"role": "viewer"})),
            201,
        )
        .await?;
    }
    let path = format!("{agents}?limit=1000");
    let mut times = Vec::new();
    for round in 0..60 {
        let t = Instant::now();
        let page = expect(server.base, "GET", &path, &member_token, None, 200).await?;
        let took = t.elapsed().as_secs_f64();
        let n = page["items"].as_array().map_or(0, Vec::len);
        if n != 1000 {
            bail!("the member sees {n} agents, not 1000");
        }
        if round >= 10 {
            times.push(took);
        }
    }
    server.stop().await?;
    let p50 = median(&times).unwrap_or(f64::NAN);
    Ok(vec![vec![
        "GET …/agents, 1,000 agents, authz per agent (member with viewer grants), p50".into(),
        ms(p50),
        "-".into(),
        "-".into(),
        "≤ 10 ms".into(),
    ]])
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

async fn sse_subscribers() -> Result<Vec<Vec<String>>> {
    const SUBSCRIBERS: usize = 1000;
    const ENTRIES: usize = 200;
    let server = Running::start(true).await?;
    let (_, token) = server.user("bench").await?;
    let (agents, agent_id) = server.workspace_with_agent(&token).await?;
    let id = AgentId::new(agent_id.clone())?;
    let rss_before = rss_kib();
    let connected = Arc::new(AtomicUsize::new(0));
    let mut subscribers = tokio::task::JoinSet::new();
    for _ in 0..SUBSCRIBERS {
        let (base, token, path, connected) = (
            server.base,
            token.clone(),
            format!("{agents}/{agent_id}/requests/stream"),
            Arc::clone(&connected),
        );
        subscribers.spawn(async move {
            let mut stream = TcpStream::connect(base).await?;
            let head = format!("GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n");
            stream.write_all(head.as_bytes()).await?;
            let mut lines = BufReader::new(stream).lines();
            let mut seen = 0usize;
            let mut counted = false;
            while let Some(line) = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await?? {
                if !counted && line.is_empty() {
                    connected.fetch_add(1, Ordering::SeqCst);
                    counted = true;
                }
                if line.starts_with("event: end") {
                    break;
                }
                if line.starts_with("id: ") {
                    seen += 1;
                    if seen == ENTRIES {
                        break;
                    }
                }
            }
            anyhow::Ok(seen)
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while connected.load(Ordering::SeqCst) < SUBSCRIBERS {
        if Instant::now() > deadline {
            bail!(
                "only {} of {SUBSCRIBERS} subscribers connected",
                connected.load(Ordering::SeqCst)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_connected = rss_kib();
    let log = server.runtime.gateway().log();
    let started = Instant::now();
    for i in 0..ENTRIES {
        let entry = LogEntry::new(&id, LogKind::Http, agenthold_core::Verdict::Allowed)
            .to(format!("host{i}.example"), 443);
        log.record(entry);
        if i % 20 == 19 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut complete = 0;
    while let Some(joined) = subscribers.join_next().await {
        if joined?? == ENTRIES {
            complete += 1;
        }
    }
    let delivered = started.elapsed().as_secs_f64();
    let rss_after = rss_kib();
    expect(
        server.base,
        "DELETE",
        &format!("{agents}/{agent_id}"),
        &token,
        None,
        204,
    )
    .await?;
    server.stop().await?;
    if complete != SUBSCRIBERS {
        bail!("{complete} of {SUBSCRIBERS} subscribers saw all {ENTRIES} entries");
    }
    Ok(vec![
        vec![
            format!("{SUBSCRIBERS} SSE subscribers × {ENTRIES} entries: all delivered in"),
            ms(delivered),
            "-".into(),
            format!("{complete}/{SUBSCRIBERS} complete"),
            "every entry".into(),
        ],
        vec![
            "process RSS: before / with subscribers / after delivery".into(),
            format!("{} MiB", rss_before / 1024),
            format!("{} MiB", rss_connected / 1024),
            format!("{} MiB after", rss_after / 1024),
            "flat".into(),
        ],
    ])
}

async fn me_rate() -> Result<Vec<Vec<String>>> {
    let server = Running::start(true).await?;
    let (_, token) = server.user("bench").await?;
    let me = expect(server.base, "GET", "/api/v1/me", &token, None, 200).await?;
    // The reference: a bare axum handler answering the same bytes.
    let body = me.to_string();
    let bare = axum::Router::new().route(
        "/api/v1/me",
        axum::routing::get(move || {
            let body = body.clone();
            async move { ([("content-type", "application/json")], body) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let bare_addr = listener.local_addr()?;
    let bare_task = tokio::spawn(async move { axum::serve(listener, bare).await });
    let head = format!("GET /api/v1/me HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n\r\n")
        .into_bytes();
    let seconds = Duration::from_secs(env_u64("BENCH_SECONDS", 5));
    // Warm-up, then interleaved.
    http_keepalive(server.base, head.clone(), 16, Duration::from_secs(1)).await?;
    http_keepalive(bare_addr, head.clone(), 16, Duration::from_secs(1)).await?;
    let (mut ours, mut bare_rates) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        harness::settle("server");
        ours.push(
            http_keepalive(server.base, head.clone(), 16, seconds)
                .await?
                .per_second,
        );
        harness::settle("server");
        bare_rates.push(
            http_keepalive(bare_addr, head.clone(), 16, seconds)
                .await?
                .per_second,
        );
    }
    bare_task.abort();
    server.stop().await?;
    let (o, b) = (
        median(&ours).unwrap_or(f64::NAN),
        median(&bare_rates).unwrap_or(f64::NAN),
    );
    Ok(vec![vec![
        "GET /api/v1/me with a token vs a bare axum handler (16 keep-alive connections), req/s".into(),
        num(Some(o)),
        num(Some(b)),
        format!("{:.2}×", o / b),
        "≥ 0.5×".into(),
    ]])
}

/// Follow an SSE stream until its `end` event (the whole answer read on one connection).
async fn follow_to_end(base: SocketAddr, path: &str, token: &str) -> Result<()> {
    let mut stream = TcpStream::connect(base).await?;
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let mut lines = BufReader::new(stream).lines();
    while let Some(line) = lines.next_line().await? {
        if line.starts_with("HTTP/1.1 ") && !line.starts_with("HTTP/1.1 200") {
            bail!("GET {path}: {line}");
        }
        if line.trim() == "event: end" || line.trim() == "event:end" {
            return Ok(());
        }
    }
    bail!("GET {path}: the stream ended without an end event")
}

async fn run_overhead() -> Result<Vec<Vec<String>>> {
    let server = Running::start(false).await?;
    let (_, token) = server.user("bench").await?;
    let (agents, agent_id) = server.workspace_with_agent(&token).await?;
    let execs = format!("{agents}/{agent_id}/execs");
    let runs = format!("{agents}/{agent_id}/runs");
    let exec_body = json!({"argv": ["true"]});
    let run_body = json!({"harness": "custom", "prompt": "", "argv": ["true"]});
    let rounds = env_u64("BENCH_RUN_ROUNDS", 50);
    let one_run = || async {
        let started = expect(server.base, "POST", &runs, &token, Some(&run_body), 202).await?;
        let id = started["id"].as_str().context("run id")?.to_owned();
        follow_to_end(server.base, &format!("{runs}/{id}/events"), &token).await?;
        Ok::<_, anyhow::Error>(id)
    };
    for _ in 0..3 {
        one_run().await?;
        expect(server.base, "POST", &execs, &token, Some(&exec_body), 200).await?;
    }
    harness::settle("server");
    let (mut run, mut exec) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let id = one_run().await?;
        run.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        expect(server.base, "POST", &execs, &token, Some(&exec_body), 200).await?;
        exec.push(t.elapsed().as_secs_f64());
        let done = expect(server.base, "GET", &format!("{runs}/{id}"), &token, None, 200).await?;
        if done["state"] != "succeeded" {
            bail!("run of true: {done}");
        }
    }
    expect(
        server.base,
        "DELETE",
        &format!("{agents}/{agent_id}"),
        &token,
        None,
        204,
    )
    .await?;
    server.stop().await?;
    let (r, e) = (
        median(&run).unwrap_or(f64::NAN),
        median(&exec).unwrap_or(f64::NAN),
    );
    Ok(vec![vec![
        format!("run of [\"true\"] POST to end, p50 of {rounds} (run vs exec, both through the API)"),
        ms(r),
        ms(e),
        format!("+{}", ms(r - e)),
        "report".into(),
    ]])
}
