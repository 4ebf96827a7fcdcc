//! Density (issue 14, item 5): how many agents one runtime holds, and what each one costs.
//!
//! `cargo bench -p agenthold-benches --bench density` (as root, Docker running). One `Runtime` on a
//! temporary data directory creates agents one after another, each with its own network and an allowlist
//! policy (`bench.test`), until `BENCH_DENSITY_MAX` run (default 500; `BENCH_SHORT=1`: 50), or until the
//! machine stops it: `MemAvailable` under `BENCH_DENSITY_MEM_FLOOR_MIB` (default 2048), one create slower
//! than `BENCH_DENSITY_CREATE_LIMIT_SECS` (default 60), or an engine error. It says how far it got and why.
//!
//! Per step (every agent up to 10, then every `BENCH_DENSITY_STEP`, default 10, and the last):
//! - the create's time (`create_sandbox` until it returns);
//! - the RSS of this process (it runs the runtime and the gateway);
//! - the holder container's memory: its processes' RSS, and its memory cgroup's usage (cgroup v1
//!   `memory.usage_in_bytes`, which counts the kernel memory charged to it);
//! - the sandboxes' memory cgroups, summed (what the agents' containers cost in themselves);
//! - kernel memory: `/proc/meminfo` `Slab + KernelStack + PageTables` (machine-wide, so other work on the
//!   machine shows too), and how far `MemAvailable` fell since the start;
//! - the nftables rules in the gateway namespace (and the elements of its sets), on the host in total
//!   (Docker's own iptables-nft rules included) and in agenthold's host table.
//!
//! Gateway latency for agent #1: `BENCH_DENSITY_REQUESTS` (default 300) HTTP requests, each on a new
//! connection made inside agent #1's sandbox namespace to an outside address (198.51.100.80:80, TEST-NET-2:
//! the gateway's rules redirect it to the transparent proxy, which dials `bench.test` → a loopback upstream),
//! with 1 agent and with all of them.
//!
//! Per-packet cost of the rules alone (`BENCH_ONLY=nft` runs only this part): in a namespace pair
//! (`TestNet`), UDP round trips from the sandbox to `1.1.1.1:53`, redirected by the rules to an echo socket
//! at the gateway's `.2`, each from a new socket (a new flow: prerouting and input chains), with the
//! current rules (sets, 1 and 500 agents) and with the rules as they were before (a chain of per-agent
//! rules, 1 and 500 agents, the measured agent last).
//!
//! `BENCH_ONLY=grow` skips the per-packet part. Creating a file at `BENCH_DENSITY_STOP_FILE` (default
//! `target/bench-density.stop`) stops the growth early (then agent #1's latency is measured and everything
//! removed as usual). Every agent is removed at the end. `BENCH_JSON` (default `target/bench-density.json`).
// A benchmark's output is its table on stdout.
#![allow(clippy::print_stdout)]

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agenthold_benches::harness;
use agenthold_benches::table::render;
use agenthold_core::{AgentId, NetworkPolicy, PolicyMode, SandboxSpec};
use agenthold_egress::Dangerous;
use agenthold_egress::netns::NetNs;
use agenthold_egress::nft::{self, AgentAttachment, GatewayRules, Ports};
use agenthold_sandbox::Runtime;
use agenthold_sandbox::docker::image::{DevImageOptions, ensure_dev_image};
use anyhow::{Context, Result, bail};
use bollard::Docker;
use bollard::query_parameters::InspectContainerOptions;
use ipnet::Ipv4Net;
use serde_json::{Value, json};

/// The name the allowlist allows and the gateway dials (to the loopback upstream).
const HOST: &str = "bench.test";
/// Where the sandbox thinks it connects (TEST-NET-2; redirected by the gateway, never routed anywhere).
const OUTSIDE: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(198, 51, 100, 80)), 80);

struct Settings {
    max: usize,
    step: usize,
    mem_floor_mib: f64,
    create_limit: Duration,
    requests: usize,
    nft_only: bool,
    grow_only: bool,
    stop_file: std::path::PathBuf,
    json: std::path::PathBuf,
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Settings {
    fn from_env() -> Self {
        let short = std::env::var("BENCH_SHORT").is_ok_and(|v| v == "1");
        let max = env_num("BENCH_DENSITY_MAX", if short { 50 } else { 500 }) as usize;
        Self {
            max: max.max(1),
            step: (env_num("BENCH_DENSITY_STEP", 10) as usize).max(1),
            mem_floor_mib: env_num("BENCH_DENSITY_MEM_FLOOR_MIB", 2048) as f64,
            create_limit: Duration::from_secs(env_num("BENCH_DENSITY_CREATE_LIMIT_SECS", 60)),
            requests: (env_num("BENCH_DENSITY_REQUESTS", if short { 100 } else { 300 }) as usize).max(10),
            nft_only: std::env::var("BENCH_ONLY").is_ok_and(|v| v == "nft"),
            grow_only: std::env::var("BENCH_ONLY").is_ok_and(|v| v == "grow"),
            stop_file: std::env::var_os("BENCH_DENSITY_STOP_FILE")
                .map_or_else(|| harness::target_dir().join("bench-density.stop"), Into::into),
            json: std::env::var_os("BENCH_JSON")
                .map_or_else(|| harness::target_dir().join("bench-density.json"), Into::into),
        }
    }

    fn json(&self) -> Value {
        json!({
            "max_agents": self.max,
            "step": self.step,
            "mem_floor_mib": self.mem_floor_mib,
            "create_limit_secs": self.create_limit.as_secs(),
            "requests": self.requests,
            "cpus": std::thread::available_parallelism().map_or(1, usize::from),
        })
    }
}

fn main() -> ExitCode {
    harness::main("density", || {
        let settings = Settings::from_env();
        harness::runtime("bench", 2)?.block_on(bench(&settings))
    })
}

/// `/proc/meminfo` fields in MiB.
fn meminfo(keys: &[&str]) -> f64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (key, rest) = l.split_once(':')?;
            keys.contains(&key)
                .then(|| rest.split_whitespace().next()?.parse::<f64>().ok())?
        })
        .sum::<f64>()
        / 1024.0
}

/// `VmRSS` of a process in MiB.
fn rss_mib(pid: &str) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}

/// A container's memory cgroup usage in MiB (cgroup v1, then v2).
fn cgroup_mib(id: &str) -> Option<f64> {
    let paths = [
        format!("/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes"),
        format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/memory.current"),
    ];
    paths
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<f64>().ok())
        .map(|b| b / (1024.0 * 1024.0))
}

/// Container id and main pid.
async fn container(docker: &Docker, name: &str) -> Option<(String, u32)> {
    let c = docker
        .inspect_container(name, None::<InspectContainerOptions>)
        .await
        .ok()?;
    let pid = u32::try_from(c.state?.pid?).ok()?;
    Some((c.id?, pid))
}

/// (rules, set elements) of `nft -j list ARGS` inside `ns` (the host when `None`).
fn nft_counts(ns: Option<&NetNs>, args: &[&str]) -> Option<(u64, u64)> {
    let mut cmd = match ns {
        Some(ns) => ns.command("nft"),
        None => std::process::Command::new("nft"),
    };
    let out = cmd.arg("-j").arg("list").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let json: Value = serde_json::from_slice(&out.stdout).ok()?;
    let objects = json["nftables"].as_array()?;
    let rules = objects.iter().filter(|o| o.get("rule").is_some()).count() as u64;
    let elements = objects
        .iter()
        .filter_map(|o| o.get("set").or_else(|| o.get("map")))
        .filter_map(|s| s["elem"].as_array().map(Vec::len))
        .sum::<usize>() as u64;
    Some((rules, elements))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn summary(mut samples: Vec<f64>) -> Value {
    samples.sort_by(f64::total_cmp);
    json!({
        "n": samples.len(),
        "p50_us": percentile(&samples, 50.0),
        "p90_us": percentile(&samples, 90.0),
        "p99_us": percentile(&samples, 99.0),
    })
}

/// `requests` HTTP requests through the transparent proxy from inside `sandbox`'s namespace, each on a
/// new connection; microseconds each (failures are counted, not timed).
fn http_latency(sandbox: &NetNs, requests: usize) -> Result<(Vec<f64>, usize)> {
    use std::io::{Read, Write};
    let request = format!("GET / HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
    // Sockets belong to the namespace they are made in: make them all inside, use them outside.
    let sockets = sandbox.run(|| {
        (0..requests + 10)
            .map(|_| socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None))
            .collect::<std::io::Result<Vec<_>>>()
    })?;
    let mut times = Vec::with_capacity(requests);
    let mut failures = 0;
    let mut buf = vec![0u8; 16 * 1024];
    for (i, socket) in sockets.into_iter().enumerate() {
        let clock = Instant::now();
        let ok = (|| -> std::io::Result<bool> {
            socket.set_tcp_nodelay(true)?;
            socket.connect_timeout(&OUTSIDE.into(), Duration::from_secs(5))?;
            socket.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut stream: std::net::TcpStream = socket.into();
            stream.write_all(request.as_bytes())?;
            // Until the whole response is in (headers and `content-length` bytes) or the proxy closes.
            let mut got = Vec::new();
            loop {
                let n = stream.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if got.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            Ok(got.starts_with(b"HTTP/1.1 200"))
        })();
        let took = clock.elapsed().as_secs_f64() * 1e6;
        // The first ten warm up (connections, caches).
        if i < 10 {
            continue;
        }
        match ok {
            Ok(true) => times.push(took),
            _ => failures += 1,
        }
    }
    Ok((times, failures))
}

/// One measured step.
#[derive(Default)]
struct Point {
    agents: usize,
    create_ms: f64,
    agenthold_rss_mib: f64,
    holder_rss_mib: Option<f64>,
    holder_cgroup_mib: Option<f64>,
    sandboxes_cgroup_mib: f64,
    kernel_mib: f64,
    mem_available_drop_mib: f64,
    nft_rules_gateway: Option<u64>,
    nft_elements_gateway: Option<u64>,
    nft_rules_host_total: Option<u64>,
    nft_rules_host_table: Option<u64>,
}

impl Point {
    fn json(&self) -> Value {
        json!({
            "agents": self.agents,
            "create_ms": self.create_ms,
            "agenthold_rss_mib": self.agenthold_rss_mib,
            "holder_rss_mib": self.holder_rss_mib,
            "holder_cgroup_mib": self.holder_cgroup_mib,
            "sandboxes_cgroup_mib": self.sandboxes_cgroup_mib,
            "kernel_mib": self.kernel_mib,
            "mem_available_drop_mib": self.mem_available_drop_mib,
            "nft_rules_gateway": self.nft_rules_gateway,
            "nft_elements_gateway": self.nft_elements_gateway,
            "nft_rules_host_total": self.nft_rules_host_total,
            "nft_rules_host_table": self.nft_rules_host_table,
        })
    }

    fn row(&self) -> Vec<String> {
        let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        let optn = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
        vec![
            self.agents.to_string(),
            format!("{:.0}", self.create_ms),
            format!("{:.1}", self.agenthold_rss_mib),
            opt(self.holder_rss_mib),
            opt(self.holder_cgroup_mib),
            format!("{:.0}", self.sandboxes_cgroup_mib),
            format!("{:.0}", self.kernel_mib),
            format!("{:.0}", self.mem_available_drop_mib),
            format!(
                "{}/{}",
                optn(self.nft_rules_gateway),
                optn(self.nft_elements_gateway)
            ),
            format!(
                "{}/{}",
                optn(self.nft_rules_host_table),
                optn(self.nft_rules_host_total)
            ),
        ]
    }
}

async fn bench(settings: &Settings) -> Result<()> {
    let packet = if settings.grow_only {
        Value::Null
    } else {
        per_packet(settings).await?
    };
    if settings.nft_only {
        let out = json!({"settings": settings.json(), "points": [], "per_packet": packet});
        std::fs::write(&settings.json, serde_json::to_vec_pretty(&out)?)?;
        return Ok(());
    }
    let docker = Docker::connect_with_local_defaults()
        .context("docker socket")?
        .negotiate_version()
        .await
        .context("docker engine (is dockerd running?)")?;
    let work = std::env::temp_dir().join("agenthold-image-tests");
    ensure_dev_image(&docker, &work, &DevImageOptions::default()).await?;

    let upstream = std::net::TcpListener::bind("127.0.0.1:0")?;
    let upstream = agenthold_benches::upstream::serve_http(upstream, None)?;
    let dns = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let dns = agenthold_benches::upstream::serve_dns(dns)?;
    let data_dir = tempfile::tempdir().context("data directory")?;
    let runtime = Runtime::builder()
        .data_dir(data_dir.path())
        .dns_upstream(dns)
        .dangerous(Dangerous {
            connect_to: vec![(HOST.into(), 80, upstream)],
            upstream_ca_pem: None,
        })
        .build()
        .await?;
    let instance = agenthold_sandbox::docker::engine::instance_label(data_dir.path());
    let mut made: Vec<AgentId> = Vec::new();
    let outcome = grow(settings, &runtime, &docker, &instance, &mut made).await;
    eprintln!("bench density: removing {} agents …", made.len());
    let clock = Instant::now();
    for agent in runtime.sandboxes().await.unwrap_or_default() {
        if let Err(e) = runtime.remove(&agent).await {
            eprintln!("bench density: removing {agent} failed: {e}");
        }
    }
    let removed_in = clock.elapsed();
    runtime.shutdown().await;
    let (points, latency, stop) = outcome?;
    println!(
        "\ndensity: {} agents created ({stop}); all removed in {:.1?}",
        points.last().map_or(0, |p| p.agents),
        removed_in
    );
    let header = [
        "agents",
        "create ms",
        "agenthold RSS MiB",
        "holder RSS MiB",
        "holder cgroup MiB",
        "sandboxes cgroups MiB",
        "kernel MiB",
        "MemAvailable drop MiB",
        "gateway rules/elements",
        "host rules: ours/all",
    ];
    let rows: Vec<Vec<String>> = points.iter().map(Point::row).collect();
    println!("{}", render(&header, &rows, &[1, 2, 3, 4, 5, 6, 7]));
    println!("gateway latency, agent #1: {latency}");
    println!("per-packet (rules only): {packet}");
    println!("runs started on a busy machine: {}", harness::noisy_starts());
    let out = json!({
        "settings": settings.json(),
        "stop": stop,
        "removed_secs": removed_in.as_secs_f64(),
        "points": points.iter().map(Point::json).collect::<Vec<_>>(),
        "latency_agent1": latency,
        "per_packet": packet,
    });
    std::fs::write(&settings.json, serde_json::to_vec_pretty(&out)?)
        .with_context(|| format!("write {}", settings.json.display()))?;
    eprintln!("bench density: wrote {}", settings.json.display());
    Ok(())
}

/// Creates agents until `settings.max` or the machine stops it: the points, the latency of agent #1 at
/// 1 and at the end, and why it stopped.
async fn grow(
    settings: &Settings,
    runtime: &Runtime,
    docker: &Docker,
    instance: &str,
    made: &mut Vec<AgentId>,
) -> Result<(Vec<Point>, Value, String)> {
    let policy = NetworkPolicy::parse(PolicyMode::Allowlist, &[HOST])?;
    let spec = || SandboxSpec {
        policy: policy.clone(),
        memory_bytes: Some(256 * 1024 * 1024),
        pids: Some(128),
        ..SandboxSpec::default()
    };
    let available_at_start = meminfo(&["MemAvailable"]);
    let holder_name = format!("agenthold-gw-{instance}");
    let mut sandbox_ids: Vec<String> = Vec::new();
    let mut points = Vec::new();
    let mut first_ns: Option<NetNs> = None;
    let mut latency_1 = Value::Null;
    let mut stop = format!("reached {}", settings.max);
    for n in 1..=settings.max {
        if settings.stop_file.exists() {
            stop = format!(
                "stopped by {} after {} agents",
                settings.stop_file.display(),
                n - 1
            );
            break;
        }
        let available = meminfo(&["MemAvailable"]);
        if available < settings.mem_floor_mib {
            stop = format!(
                "MemAvailable {available:.0} MiB under the floor {}",
                settings.mem_floor_mib
            );
            break;
        }
        let clock = Instant::now();
        let created = tokio::time::timeout(settings.create_limit * 2, runtime.create_sandbox(spec())).await;
        let took = clock.elapsed();
        let agent = match created {
            Ok(Ok(agent)) => agent,
            Ok(Err(e)) => {
                stop = format!("create #{n} failed: {e}");
                break;
            }
            Err(_) => {
                stop = format!(
                    "create #{n} did not return within {:?}",
                    settings.create_limit * 2
                );
                break;
            }
        };
        made.push(agent.clone());
        if let Some((id, pid)) = container(docker, &format!("agenthold-{agent}")).await {
            sandbox_ids.push(id);
            if n == 1 {
                first_ns = Some(NetNs::of_pid(pid));
            }
        }
        if n == 1 {
            let ns = first_ns.as_ref().context("agent #1's container")?;
            let (times, failures) = http_latency(ns, settings.requests)?;
            if times.is_empty() {
                bail!("no request through agent #1's gateway succeeded ({failures} failed)");
            }
            latency_1 = summary(times);
            latency_1["failures"] = json!(failures);
            eprintln!("bench density: agent #1 latency with 1 agent: {latency_1}");
        }
        let last = n == settings.max || took > settings.create_limit;
        if n <= 10 || n % settings.step == 0 || last {
            let holder = container(docker, &holder_name).await;
            let holder_ns = holder.as_ref().map(|(_, pid)| NetNs::of_pid(*pid));
            let gateway = holder_ns
                .as_ref()
                .and_then(|ns| nft_counts(Some(ns), &["table", "inet", nft::TABLE]));
            let host_table = agenthold_sandbox::docker::hostfw::host_table(instance);
            let point = Point {
                agents: n,
                create_ms: took.as_secs_f64() * 1e3,
                agenthold_rss_mib: rss_mib("self").unwrap_or(f64::NAN),
                holder_rss_mib: holder.as_ref().and_then(|(_, pid)| rss_mib(&pid.to_string())),
                holder_cgroup_mib: holder.as_ref().and_then(|(id, _)| cgroup_mib(id)),
                sandboxes_cgroup_mib: sandbox_ids.iter().filter_map(|id| cgroup_mib(id)).sum(),
                kernel_mib: meminfo(&["Slab", "KernelStack", "PageTables"]),
                mem_available_drop_mib: available_at_start - meminfo(&["MemAvailable"]),
                nft_rules_gateway: gateway.map(|g| g.0),
                nft_elements_gateway: gateway.map(|g| g.1),
                nft_rules_host_total: nft_counts(None, &["ruleset"]).map(|c| c.0),
                nft_rules_host_table: nft_counts(None, &["table", "inet", &host_table]).map(|c| c.0),
            };
            eprintln!("bench density: {}", point.row().join(" | "));
            points.push(point);
        }
        if took > settings.create_limit {
            stop = format!(
                "create #{n} took {took:.1?}, over the limit {:?}",
                settings.create_limit
            );
            break;
        }
    }
    let mut latency = json!({"agents_1": latency_1});
    if let (Some(ns), Some(last)) = (first_ns.as_ref(), points.last()) {
        let (times, failures) = http_latency(ns, settings.requests)?;
        let mut at_max = summary(times);
        at_max["agents"] = json!(last.agents);
        at_max["failures"] = json!(failures);
        eprintln!(
            "bench density: agent #1 latency with {} agents: {at_max}",
            last.agents
        );
        latency["agents_max"] = at_max;
    }
    Ok((points, latency, stop))
}

/// The gateway ruleset as it was before the sets (one chain of rules per agent, in nft's syntax): the
/// reference for the per-packet cost.
fn old_ruleset(ports: Ports, agents: &[AgentAttachment]) -> String {
    let mut pre = String::new();
    let mut input = String::new();
    for a in agents {
        let (i, gw, net) = (&a.iface, a.gateway_addr, a.subnet);
        pre.push_str(&format!(
            "iifname \"{i}\" udp dport 53 dnat ip to {gw}:{dns}\n\
             iifname \"{i}\" tcp dport 53 dnat ip to {gw}:{dns}\n\
             iifname \"{i}\" ip daddr != {gw} meta l4proto tcp dnat ip to {gw}:{proxy}\n",
            dns = ports.dns,
            proxy = ports.proxy
        ));
        input.push_str(&format!(
            "iifname \"{i}\" ip saddr != {net} drop\n\
             iifname \"{i}\" ip daddr {gw} tcp dport {proxy} ct status dnat accept\n\
             iifname \"{i}\" ip daddr {gw} udp dport {dns} ct status dnat accept\n\
             iifname \"{i}\" ip daddr {gw} tcp dport {dns} ct status dnat accept\n\
             iifname \"{i}\" ip daddr {gw} tcp dport {{ {explicit}, {tunnel} }} accept\n",
            proxy = ports.proxy,
            dns = ports.dns,
            explicit = ports.explicit,
            tunnel = ports.tunnel.unwrap_or(ports.explicit),
        ));
    }
    format!(
        "add table inet {t}\ndelete table inet {t}\ntable inet {t} {{\n\
         chain prerouting {{ type nat hook prerouting priority -100; policy accept;\n{pre}}}\n\
         chain input {{ type filter hook input priority 0; policy drop;\n\
         iif lo accept\nfib saddr . iif oif missing drop\nfib daddr . iif type != local drop\n{input}}}\n\
         chain forward {{ type filter hook forward priority 0; policy drop; }}\n\
         chain output {{ type filter hook output priority 0; policy drop;\n\
         oif lo accept\nct state established,related accept\n}}\n}}\n",
        t = nft::TABLE
    )
}

/// `count` attachments on interfaces that do not exist (nft matches names), on /28s of 10.250.0.0/16.
fn phantoms(count: usize) -> Vec<AgentAttachment> {
    (0..count as u32)
        .map(|i| {
            let base = u32::from(Ipv4Addr::new(10, 250, 0, 0)) + i * 16;
            AgentAttachment::on_subnet(format!("ph{i}"), Ipv4Net::new_assert(Ipv4Addr::from(base), 28))
        })
        .collect()
}

/// UDP round trips from the sandbox to 1.1.1.1:53 (redirected to an echo socket at the `.2`): each on a
/// new socket (a new flow through prerouting and input); microseconds.
fn udp_round_trips(sandbox: &NetNs, count: usize) -> Result<Vec<f64>> {
    let sockets = sandbox.run(|| {
        (0..count)
            .map(|_| {
                let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
                s.set_read_timeout(Some(Duration::from_secs(1)))?;
                Ok(s)
            })
            .collect::<std::io::Result<Vec<_>>>()
    })?;
    let mut times = Vec::with_capacity(count);
    let mut buf = [0u8; 64];
    for s in sockets {
        let clock = Instant::now();
        s.send_to(b"ping", "1.1.1.1:53")?;
        let (n, _) = s.recv_from(&mut buf).context("no echo: the rules dropped it")?;
        times.push(clock.elapsed().as_secs_f64() * 1e6);
        debug_assert_eq!(&buf[..n], b"ping");
    }
    Ok(times)
}

/// The rules' per-packet cost: sets vs a chain per agent, with 1 and 500 agents.
async fn per_packet(settings: &Settings) -> Result<Value> {
    let net = agenthold_testsupport::TestNet::new();
    let (gw, agent) = (net.gateway(), net.agent(0));
    nft::harden(gw)?;
    let echo = gw.bind_udp(SocketAddr::from((agent.gateway_addr(), 15053)))?;
    echo.set_nonblocking(false)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = std::sync::Arc::clone(&stop);
    echo.set_read_timeout(Some(Duration::from_millis(200)))?;
    let echo_thread = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((n, peer)) = echo.recv_from(&mut buf) {
                let _ = echo.send_to(&buf[..n], peer);
            }
        }
    });
    let many = if settings.max >= 500 {
        500
    } else {
        settings.max.max(2) * 10
    };
    let rounds = 3;
    let count = 2000;
    let mut results = serde_json::Map::new();
    let configs: [(&str, usize, bool); 4] = [
        ("sets_1", 1, false),
        ("sets_many", many, false),
        ("chain_1", 1, true),
        ("chain_many", many, true),
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..rounds {
        for (k, &(_, agents, old)) in configs.iter().enumerate() {
            let mut all = phantoms(agents - 1);
            // The measured agent last: the old chain walks every other agent's rules first.
            all.push(agent.attachment());
            if old {
                let script = old_ruleset(Ports::default(), &all);
                let mut child = gw
                    .command("nft")
                    .args(["-f", "-"])
                    .stdin(std::process::Stdio::piped())
                    .spawn()?;
                std::io::Write::write_all(&mut child.stdin.take().context("stdin")?, script.as_bytes())?;
                if !child.wait()?.success() {
                    bail!("nft refused the old-style ruleset");
                }
            } else {
                GatewayRules {
                    ports: Ports::default(),
                    agents: all,
                }
                .apply(gw)
                .await?;
            }
            harness::settle("density");
            let times = udp_round_trips(agent.sandbox(), count)?;
            eprintln!(
                "bench density: per-packet round {round}, {}: p50 {:.1} µs",
                configs[k].0,
                {
                    let mut t = times.clone();
                    t.sort_by(f64::total_cmp);
                    percentile(&t, 50.0)
                }
            );
            samples[k].extend(times);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo_thread.join();
    for ((name, agents, _), times) in configs.iter().zip(samples) {
        let mut s = summary(times);
        s["agents"] = json!(agents);
        results.insert((*name).to_owned(), s);
    }
    net.close();
    let p50 = |k: &str| results[k]["p50_us"].as_f64().unwrap_or(f64::NAN);
    let value = json!({
        "what": "UDP round trip sandbox → 1.1.1.1:53 → dnat → echo at .2, new socket (flow) each, µs",
        "rounds": rounds,
        "per_round": count,
        "results": results,
        "ratio_sets_many_vs_1": p50("sets_many") / p50("sets_1"),
        "ratio_chain_many_vs_1": p50("chain_many") / p50("chain_1"),
        "ratio_chain_many_vs_sets_many": p50("chain_many") / p50("sets_many"),
    });
    let rows: Vec<Vec<String>> = configs
        .iter()
        .map(|(name, agents, _)| {
            let r = &value["results"][*name];
            vec![
                (*name).to_owned(),
                agents.to_string(),
                format!("{:.1}", r["p50_us"].as_f64().unwrap_or(f64::NAN)),
                format!("{:.1}", r["p90_us"].as_f64().unwrap_or(f64::NAN)),
                format!("{:.1}", r["p99_us"].as_f64().unwrap_or(f64::NAN)),
            ]
        })
        .collect();
    println!(
        "per-packet cost of the gateway rules (UDP round trip, new flow each, µs):\n{}",
        render(&["rules", "agents", "p50", "p90", "p99"], &rows, &[1, 2, 3, 4])
    );
    Ok(value)
}
