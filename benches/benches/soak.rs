//! Soak: thousands of connections held through one agent's gateway for minutes (issue 14, item 6).
//!
//! `cargo bench -p agenthold-benches --bench soak` (as root). One gateway (this process) serves two agents,
//! each a sandbox namespace on its own veth network, with the nftables rules and listeners of `agenthold
//! run`. The soak agent holds `BENCH_SOAK_CONNS` connections (default 10,000) for `BENCH_SOAK_MINUTES`
//! (default 10), a mix of spliced TLS (`bench.test`: no secret rule, SNI decides) and intercepted HTTPS
//! (`secret.bench.test`: a secret rule, the gateway terminates TLS and injects a header), each sending a
//! `GET` every `BENCH_SOAK_INTERVAL_SECS` (default 5), spread evenly so the rate is steady. The other agent
//! sends sequential intercepted requests on one connection before the soak and for ten seconds of every
//! minute during it: its p50/p99 show whether the soak agent's load reaches it (the per-agent budgets of
//! E20 protect its connections; the CPU is shared).
//!
//! The connections and the upstream they reach live in a second process (this binary run again with
//! `--soak-load`, see `agenthold_benches::soak`), so this process's RSS is the gateway's (plus its DNS
//! upstream and the other agent's one client thread); the load process's RSS is reported separately.
//!
//! Every minute: this process's RSS and descriptors, the load process's RSS, connections open, requests
//! and errors (any failed connect, handshake, read, timeout or non-200 answer), the gateway's own counts.
//! JSON: `target/bench-soak.json` (or `BENCH_JSON`). `BENCH_SHORT=1`: 1,000 connections for one minute.
//!
//! The descriptor limit bounds the mix: a spliced connection holds six descriptors in the gateway (two
//! sockets, two pipes for `splice(2)`), an intercepted one two (its socket and a pooled upstream one at
//! most). When the hard limit cannot hold half of them spliced, the spliced share is lowered to what fits
//! and the run says so (`BENCH_SOAK_SPLICED_PERCENT`, default 50, asks for another share).
// A benchmark's output is its table on stdout.
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agenthold_benches::report::median;
use agenthold_benches::soak::{self, Hello, INTERCEPTED_NAME, Plan, SPLICED_NAME};
use agenthold_benches::table::{num, render};
use agenthold_benches::{cpu, harness, load, tls_load, upstream};
use agenthold_core::AgentId;
use agenthold_core::config::LeakGuard;
use agenthold_core::policy::{NetworkPolicy, PolicyMode, PolicyTable};
use agenthold_core::secret::{SecretRule, SecretSpec, SecretTable};
use agenthold_egress::dns::DnsLimits;
use agenthold_egress::nft::Ports;
use agenthold_egress::{Attachment, CertificateAuthority, Dangerous, Datapath, Gateway, Limits};
use agenthold_testsupport::TestNet;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// Descriptors a spliced connection holds in the gateway: client and upstream sockets, two pipes.
const FDS_SPLICED: usize = 6;
/// Descriptors an intercepted connection holds in the gateway: its socket (the upstream side is pooled).
const FDS_INTERCEPTED: usize = 1;
/// Descriptors kept for everything else in this process: listeners, DNS, runtimes, the gateway's pool of
/// upstream connections for intercepted requests (≈ 300 seen), and connections being replaced.
const FDS_SPARE: usize = 4096;
/// `egress.max_requests_per_agent` for the soak: the default (256 in flight) refuses requests (503) as soon
/// as the gateway answers slower than 256 / rate, which a busy two-core machine does while thousands of
/// handshakes ramp up; `BENCH_SOAK_REQUESTS_PER_AGENT` sets it (0: the default).
fn requests_per_agent(conns: usize) -> usize {
    match std::env::var("BENCH_SOAK_REQUESTS_PER_AGENT")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(0) => Limits::default().requests_per_agent,
        Some(n) => n,
        None => conns,
    }
}

/// When in a minute the other agent's latency is sampled, and for how long.
const LATENCY_AT: Duration = Duration::from_secs(20);
/// How long the other agent's latency is sampled before the soak (and each minute during it).
const LATENCY_FOR: Duration = Duration::from_secs(10);
/// Longest the connections may take to open.
const RAMP_PATIENCE: Duration = Duration::from_secs(300);

struct Settings {
    conns: usize,
    minutes: u64,
    interval: Duration,
    spliced_percent: usize,
    short: bool,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let short = harness::short();
        let var = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
        let parse = |key: &str, default: u64| -> Result<u64> {
            var(key).map_or(Ok(default), |v| v.parse().with_context(|| key.to_owned()))
        };
        let conns = parse("BENCH_SOAK_CONNS", if short { 1000 } else { 10_000 })?;
        let minutes = parse("BENCH_SOAK_MINUTES", if short { 1 } else { 10 })?;
        Ok(Self {
            conns: usize::try_from(conns.max(2))?,
            minutes: minutes.max(1),
            interval: Duration::from_secs(parse("BENCH_SOAK_INTERVAL_SECS", 5)?.max(1)),
            spliced_percent: usize::try_from(parse("BENCH_SOAK_SPLICED_PERCENT", 50)?.min(100))?,
            short,
        })
    }
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == soak::LOAD_ARG) {
        return soak::load_main();
    }
    harness::main("soak", run)
}

/// The gateway with two agents: the soak agent and the other one.
struct World {
    gateway_rt: tokio::runtime::Runtime,
    dns_rt: tokio::runtime::Runtime,
    gateway: Option<Arc<Gateway>>,
    attachments: Vec<Attachment>,
    net: Option<TestNet>,
    soak_agent: AgentId,
    other_agent: AgentId,
    ca: Arc<CertificateAuthority>,
    _ca_dir: tempfile::TempDir,
}

impl World {
    fn start(hello: &Hello, conns: usize) -> Result<Self> {
        let runtime = harness::runtime;
        // What `agenthold run` gives its gateway (GATEWAY_WORKERS in setup.rs).
        let gateway_rt = runtime("gateway", 2)?;
        let dns_rt = runtime("dns-upstream", 1)?;
        let net = TestNet::with_agents(2);
        let dns = {
            let _rt = dns_rt.enter();
            upstream::serve_dns(std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?)?
        };
        let soak_agent = AgentId::new("soak")?;
        let other_agent = AgentId::new("other")?;
        let policies = Arc::new(PolicyTable::new());
        let entries = [format!("{SPLICED_NAME}:*"), format!("*.{SPLICED_NAME}")];
        for agent in [&soak_agent, &other_agent] {
            policies.set(
                agent.clone(),
                NetworkPolicy::parse(PolicyMode::Allowlist, &entries)?,
            );
        }
        let ca_dir = tempfile::tempdir().context("CA directory")?;
        let ca = Arc::new(CertificateAuthority::load_or_create(ca_dir.path())?);
        let secrets = Arc::new(SecretTable::new(LeakGuard::Block));
        let gateway = {
            let _rt = gateway_rt.enter();
            Arc::new(
                Gateway::builder()
                    .policy(policies)
                    .dns_upstream(dns)
                    .dns_limits(DnsLimits {
                        agent_qps: 1_000_000,
                        agent_burst: 1_000_000,
                        gateway_qps: 1_000_000,
                        gateway_burst: 1_000_000,
                        gateway_reserve: 0,
                    })
                    // The soak agent's own budget must hold its connections (`egress.max_connections_per_agent`,
                    // default 1024), and the gateway's all of them plus the other agent's. Set explicitly:
                    // the default total is derived from the descriptor limit (six per connection).
                    // The gateway keeps a reserve (an eighth of the total, at most 2048) that an agent
                    // holding 32 or more cannot use: the total must hold the soak agent's connections
                    // beside it.
                    .limits(Limits {
                        connections: conns + 2048 + 1024,
                        connections_per_agent: conns + 64,
                        requests_per_agent: requests_per_agent(conns),
                    })
                    .injector(Arc::clone(&secrets) as _)
                    .certificate_authority(Arc::clone(&ca))
                    .dangerous(Dangerous {
                        connect_to: vec![
                            (SPLICED_NAME.into(), 443, hello.upstream),
                            (INTERCEPTED_NAME.into(), 443, hello.upstream),
                        ],
                        upstream_ca_pem: Some(hello.ca_pem.clone().into_bytes()),
                    })
                    .build()?,
            )
        };
        let rule = SecretRule::header(&[INTERCEPTED_NAME], upstream::SECRET_HEADER, "{{.Value}}")?;
        for agent in [&soak_agent, &other_agent] {
            let secret = SecretSpec::new(
                "soak-secret",
                upstream::SECRET_VALUE.into(),
                None,
                vec![rule.clone()],
            )?;
            secrets.set(agent, vec![secret]);
        }
        let attachments = gateway_rt.block_on(async {
            let ports = Ports::default().without_tunnel();
            let datapath = Datapath::new(net.gateway().clone(), ports, Arc::clone(&gateway)).await?;
            let soak = datapath.attach(&soak_agent, net.agent(0).attachment()).await?;
            let other = datapath.attach(&other_agent, net.agent(1).attachment()).await?;
            anyhow::Ok(vec![soak, other])
        })?;
        Ok(Self {
            gateway_rt,
            dns_rt,
            gateway: Some(gateway),
            attachments,
            net: Some(net),
            soak_agent,
            other_agent,
            ca,
            _ca_dir: ca_dir,
        })
    }

    fn net(&self) -> Result<&TestNet> {
        self.net.as_ref().context("the network is gone")
    }

    /// Where `name` resolves (port 443) inside agent `i`'s sandbox, through the gateway's DNS.
    fn resolve(&self, i: usize, name: &str) -> Result<SocketAddr> {
        let agent = self.net()?.agent(i);
        let resolver = SocketAddr::from((agent.gateway_addr(), 53));
        let addr = load::in_namespace(Some(agent.sandbox()), || load::resolve_a(resolver, name))
            .with_context(|| format!("resolve {name} through the gateway"))?;
        Ok(SocketAddr::from((addr, 443)))
    }

    fn gateway(&self) -> Result<&Arc<Gateway>> {
        self.gateway.as_ref().context("the gateway is gone")
    }

    fn close(mut self) {
        if let Some(gateway) = self.gateway.take() {
            self.gateway_rt.block_on(gateway.shutdown(Duration::from_secs(2)));
        }
        for attachment in std::mem::take(&mut self.attachments) {
            if let Err(e) = self.gateway_rt.block_on(attachment.close()) {
                eprintln!("bench soak: could not remove an agent's rules (its namespaces go anyway): {e}");
            }
        }
        let Self {
            gateway_rt,
            dns_rt,
            net,
            ..
        } = self;
        gateway_rt.shutdown_timeout(Duration::from_secs(2));
        dns_rt.shutdown_timeout(Duration::from_secs(1));
        if let Some(net) = net {
            net.close();
        }
    }
}

/// The load process and the latest counters it printed.
struct LoadProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    latest: Arc<Mutex<Value>>,
    reader: Option<std::thread::JoinHandle<()>>,
    hello: Hello,
}

impl LoadProcess {
    fn spawn() -> Result<Self> {
        let exe = std::env::current_exe().context("this binary")?;
        let mut child = Command::new(exe)
            .arg(soak::LOAD_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start the load process")?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().context("load process stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if line.trim().is_empty() {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the load process exited before saying hello");
        }
        let hello = Hello::from_json(&serde_json::from_str(&line)?)?;
        let latest = Arc::new(Mutex::new(json!({})));
        let sink = Arc::clone(&latest);
        let reader = std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && let Ok(mut latest) = sink.lock()
                {
                    *latest = v;
                }
            }
        });
        Ok(Self {
            child,
            stdin,
            latest,
            reader: Some(reader),
            hello,
        })
    }

    fn send(&mut self, plan: &Plan) -> Result<()> {
        let stdin = self.stdin.as_mut().context("load process stdin")?;
        writeln!(stdin, "{}", plan.to_json())?;
        stdin.flush()?;
        Ok(())
    }

    fn counters(&self) -> Value {
        self.latest.lock().map(|v| v.clone()).unwrap_or_default()
    }

    fn counter(&self, key: &str) -> u64 {
        self.counters()[key].as_u64().unwrap_or(0)
    }

    /// Stops the connections and returns the last counters.
    fn stop(mut self) -> Result<Value> {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "stop");
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.child.try_wait()?.is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        Ok(self.counters())
    }
}

impl Drop for LoadProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `VmRSS` of process `pid` (`None`: this one) in MiB.
fn rss_mib(pid: Option<u32>) -> Option<f64> {
    let path = pid.map_or_else(|| "/proc/self/status".to_owned(), |p| format!("/proc/{p}/status"));
    let status = std::fs::read_to_string(path).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// Descriptors this process holds.
fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// The other agent's sequential request latencies (µs, sorted) over `duration`, and whether it failed.
fn other_latency(world: &World, target: SocketAddr, duration: Duration) -> Result<Vec<f64>> {
    let config = tls_load::client_config(world.ca.cert_pem())?;
    let request = tls_load::small_request(INTERCEPTED_NAME);
    let ns = world.net()?.agent(1).sandbox();
    let samples = load::in_namespace(Some(ns), move || {
        load::block_on(tls_load::sequential(
            target,
            INTERCEPTED_NAME,
            config,
            &request,
            duration,
        ))
    })?;
    let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    Ok(us)
}

/// p50 and p99 (nearest rank) of sorted samples.
fn p50_p99(sorted: &[f64]) -> Value {
    let q = |q: f64| -> Option<f64> {
        if sorted.is_empty() {
            return None;
        }
        let rank = (q * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.clamp(1, sorted.len()) - 1])
    };
    json!({"p50_us": q(0.5), "p99_us": q(0.99), "samples": sorted.len()})
}

fn run() -> Result<()> {
    let settings = Settings::from_env()?;
    harness::init_tracing();

    // The mix: as many spliced as asked for, as the descriptor limit allows.
    let fd_limit = usize::try_from(soak::raise_nofile()).unwrap_or(usize::MAX);
    let wanted_spliced = settings.conns * settings.spliced_percent / 100;
    let fit = fd_limit.saturating_sub(FDS_SPARE + settings.conns * FDS_INTERCEPTED)
        / (FDS_SPLICED - FDS_INTERCEPTED);
    let spliced = wanted_spliced.min(fit);
    let intercepted = settings.conns - spliced;
    if spliced < wanted_spliced {
        eprintln!(
            "bench soak: the descriptor limit ({fd_limit}) holds {spliced} spliced connections ({FDS_SPLICED} \
             descriptors each) beside {intercepted} intercepted ones, not {wanted_spliced}: the mix is \
             {spliced} spliced + {intercepted} intercepted"
        );
    }
    if intercepted * FDS_INTERCEPTED + FDS_SPARE > fd_limit {
        bail!(
            "the descriptor limit ({fd_limit}) cannot hold {} connections",
            settings.conns
        );
    }

    let mut load_process = LoadProcess::spawn()?;
    let hello = load_process.hello.clone();
    eprintln!(
        "bench soak: load process {} with its upstream on {}",
        hello.pid, hello.upstream
    );
    let world = World::start(&hello, settings.conns)?;
    let result = soak(
        &settings,
        &world,
        &mut load_process,
        spliced,
        intercepted,
        fd_limit,
    );
    let last = load_process.stop();
    world.close();
    let (minutes, latency, summary) = result?;
    let last = last?;

    // The table.
    let rows: Vec<Vec<String>> = minutes
        .iter()
        .map(|m: &Value| {
            let f = |k: &str| num(m[k].as_f64());
            vec![
                m["minute"].to_string(),
                f("rss_mib"),
                f("load_rss_mib"),
                m["fds"].to_string(),
                m["open_connections"].to_string(),
                m["gateway_connections"].to_string(),
                m["requests"].to_string(),
                m["errors"].to_string(),
                f("gateway_cpu_cores"),
                f("cpus_busy"),
                m["other_agent_latency"]["p50_us"]
                    .as_f64()
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.0}")),
                m["other_agent_latency"]["p99_us"]
                    .as_f64()
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.0}")),
            ]
        })
        .collect();
    println!();
    println!(
        "{}",
        render(
            &[
                "minute",
                "RSS MiB (gateway)",
                "RSS MiB (load)",
                "fds",
                "open (client)",
                "open (gateway)",
                "requests",
                "errors",
                "gateway CPUs",
                "CPUs busy",
                "other p50 µs",
                "other p99 µs",
            ],
            &rows,
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        )
    );
    println!(
        "other agent, sequential intercepted requests: before p50 {} µs p99 {} µs; during p50 {} µs p99 {} µs",
        num(latency["before"]["p50_us"].as_f64()),
        num(latency["before"]["p99_us"].as_f64()),
        num(latency["during"]["p50_us"].as_f64()),
        num(latency["during"]["p99_us"].as_f64()),
    );
    println!("{summary}");
    println!("load process at the end: {last}");

    let settings_json = json!({
        "cpus": std::thread::available_parallelism().map(usize::from).ok(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_owned()),
        "connections": settings.conns,
        "spliced": spliced,
        "intercepted": intercepted,
        "spliced_percent_asked": settings.spliced_percent,
        "spliced_share_limited_by_descriptors": spliced < wanted_spliced,
        "descriptor_limit": fd_limit,
        "minutes": settings.minutes,
        "request_interval_secs": settings.interval.as_secs(),
        "short": settings.short,
        "gateway_workers": 2,
        "max_connections_per_agent": settings.conns + 64,
        "max_requests_per_agent": requests_per_agent(settings.conns),
        "rss": "rss_mib is the benchmark process: the gateway, its DNS upstream and the other agent's client \
                thread; the connections and the HTTPS upstream run in the load process (load_rss_mib)",
        "latency": format!("other agent: one keep-alive connection to {INTERCEPTED_NAME} (intercepted), \
                            sequential requests, {}s before the soak and {}s of every minute",
                           LATENCY_FOR.as_secs(), LATENCY_FOR.as_secs()),
        "runs_started_on_busy_machine": harness::noisy_starts(),
    });
    let json = json!({
        "settings": settings_json,
        "minutes": minutes,
        "other_agent_latency": latency,
        "load_process_final": last,
    });
    let path = std::env::var_os("BENCH_JSON")
        .map_or_else(|| harness::target_dir().join("bench-soak.json"), PathBuf::from);
    std::fs::write(&path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("write {}", path.display()))?;
    println!("written: {}", path.display());
    let errors: u64 = minutes.iter().filter_map(|m| m["errors"].as_u64()).sum();
    if errors > 0 {
        println!("soak: {errors} errors (goal: zero)");
    }
    Ok(())
}

/// Errors the load process counted so far.
fn errors_of(v: &Value) -> u64 {
    ["connect_errors", "request_errors", "status_errors"]
        .iter()
        .filter_map(|k| v[k].as_u64())
        .sum()
}

/// The soak itself: the other agent's latency before, the ramp, then one sample per minute.
fn soak(
    settings: &Settings,
    world: &World,
    load_process: &mut LoadProcess,
    spliced: usize,
    intercepted: usize,
    fd_limit: usize,
) -> Result<(Vec<Value>, Value, String)> {
    let spliced_addr = world.resolve(0, SPLICED_NAME)?;
    let intercepted_addr = world.resolve(0, INTERCEPTED_NAME)?;
    let other_addr = world.resolve(1, INTERCEPTED_NAME)?;
    let gateway = world.gateway()?;

    harness::settle("soak");
    let before = other_latency(world, other_addr, LATENCY_FOR).context("the other agent's latency before")?;
    eprintln!(
        "bench soak: other agent before: {} (RSS {:.0} MiB)",
        p50_p99(&before),
        rss_mib(None).unwrap_or(0.0)
    );

    let netns = world
        .net()?
        .agent(0)
        .sandbox()
        .path()
        .to_string_lossy()
        .into_owned();
    load_process.send(&Plan {
        netns,
        spliced_addr,
        intercepted_addr,
        spliced,
        intercepted,
        interval: settings.interval,
        gateway_ca_pem: world.ca.cert_pem().to_owned(),
    })?;
    let ramp_start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let open = load_process.counter("open");
        let opened = load_process.counter("opened");
        if open as usize >= settings.conns {
            break;
        }
        if load_process.child.try_wait()?.is_some() {
            bail!("the load process exited during the ramp");
        }
        if ramp_start.elapsed() > RAMP_PATIENCE {
            bail!(
                "only {open} of {} connections open after {RAMP_PATIENCE:?} ({} errors)",
                settings.conns,
                errors_of(&load_process.counters())
            );
        }
        if ramp_start.elapsed().as_secs().is_multiple_of(5) {
            let c = load_process.counters();
            eprintln!(
                "bench soak: {opened} connections opened, {open} open, errors: {} connect, {} request, {} \
                 status; {} descriptors here; gateway refused {} requests …",
                c["connect_errors"],
                c["request_errors"],
                c["status_errors"],
                open_fds(),
                gateway
                    .agent_stats(&world.soak_agent)
                    .unwrap_or_default()
                    .refused_requests,
            );
        }
    }
    let ramp = ramp_start.elapsed();
    eprintln!("bench soak: {} connections open after {ramp:.1?}", settings.conns);

    let mut minutes = Vec::new();
    let mut during: Vec<f64> = Vec::new();
    let mut other_errors = 0u64;
    let load_pid = load_process.hello.pid;
    let sample = |m: u64, prev: &Value, now: &Value, gw_cpu: f64, busy: f64, other: Value| -> Value {
        let delta = |k: &str| {
            now[k]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(prev[k].as_u64().unwrap_or(0))
        };
        let stats = gateway.agent_stats(&world.soak_agent).unwrap_or_default();
        let other_stats = gateway.agent_stats(&world.other_agent).unwrap_or_default();
        json!({
            "minute": m,
            "rss_mib": rss_mib(None),
            "load_rss_mib": rss_mib(Some(load_pid)),
            "fds": open_fds(),
            "open_connections": now["open"],
            "gateway_connections": stats.connections,
            "requests": delta("requests"),
            "intercepted_requests": delta("intercepted_requests"),
            "errors": errors_of(now).saturating_sub(errors_of(prev)),
            "connect_errors": delta("connect_errors"),
            "request_errors": delta("request_errors"),
            "status_errors": delta("status_errors"),
            "upstream_requests_with_secret": delta("upstream_requests_with_secret"),
            "gateway_refused_connections": stats.refused_connections,
            "gateway_refused_requests": stats.refused_requests,
            "other_agent_refused_connections": other_stats.refused_connections,
            "other_agent_refused_requests": other_stats.refused_requests,
            "gateway_cpu_cores": gw_cpu,
            "cpus_busy": busy,
            "other_agent_latency": other,
        })
    };
    let zero = json!({});
    let mut prev = load_process.counters();
    // Minute 0: the moment every connection is open (requests and errors of the ramp).
    minutes.push(sample(0, &zero, &prev, 0.0, 0.0, Value::Null));
    let rss0 = rss_mib(None).unwrap_or(0.0);
    for m in 1..=settings.minutes {
        let start = Instant::now();
        let (cpu0, machine0) = (cpu::threads_cpu("gateway"), cpu::MachineCpu::now());
        std::thread::sleep(LATENCY_AT);
        let other = match other_latency(world, other_addr, LATENCY_FOR) {
            Ok(samples) => {
                let v = p50_p99(&samples);
                during.extend(samples);
                v
            }
            Err(e) => {
                other_errors += 1;
                eprintln!("bench soak: the other agent's requests failed: {e:#}");
                json!({"error": format!("{e:#}")})
            }
        };
        std::thread::sleep(Duration::from_secs(60).saturating_sub(start.elapsed()));
        let now = load_process.counters();
        let elapsed = start.elapsed().as_secs_f64();
        // Threads that ended take their CPU time with them: never below zero.
        let gw_cpu = cpu::threads_cpu("gateway").saturating_sub(cpu0).as_secs_f64() / elapsed;
        let busy = cpu::MachineCpu::now().cores_busy_since(machine0);
        let row = sample(m, &prev, &now, gw_cpu, busy, other);
        eprintln!("bench soak: {row}");
        minutes.push(row);
        prev = now;
        if load_process.child.try_wait()?.is_some() {
            bail!("the load process exited during the soak");
        }
    }
    during.sort_by(f64::total_cmp);
    let latency = json!({
        "before": p50_p99(&before),
        "during": p50_p99(&during),
        "during_errors": other_errors,
    });
    let rss: Vec<f64> = minutes.iter().filter_map(|m| m["rss_mib"].as_f64()).collect();
    let last_rss = rss.last().copied().unwrap_or(0.0);
    let per_minute: Vec<f64> = minutes
        .iter()
        .skip(1)
        .filter_map(|m| m["requests"].as_u64().map(|r| r as f64))
        .collect();
    let summary = format!(
        "{} connections ({spliced} spliced, {intercepted} intercepted; descriptor limit {fd_limit}) opened in \
         {ramp:.1?}; gateway RSS {rss0:.0} MiB after the ramp, {last_rss:.0} MiB at the end ({:+.1} MiB); \
         median {} requests per minute",
        settings.conns,
        last_rss - rss0,
        num(median(&per_minute)),
    );
    Ok((minutes, latency, summary))
}
