//! Egress gateway vs direct, side by side in one run (issue 3, item 10; ARCHITECTURE §5).
//!
//! `cargo bench -p agenthold-benches --bench egress` (as root). Every metric is measured on three routes
//! to the same upstream — direct on loopback, direct across a veth pair, through the gateway — each run
//! `BENCH_SECONDS` long (default 3), the routes interleaved, `BENCH_REPEATS` times (default 3); the table
//! shows medians and the gateway's ratio to each direct route. The same numbers, with every run, go to
//! `target/bench-egress.json` (or `BENCH_JSON`). `BENCH_ONLY=bulk,raw,tls,wrk,http,dns` picks metrics
//! (`dns_uncached`, `dns_cached`: one of the two DNS rows);
//! `BENCH_BULK_MIB` sets the bulk download size (default 1024).
// A benchmark's output is its table on stdout.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agenthold_benches::cpu;
use agenthold_benches::dns_cache::{self, Dnsmasq};
use agenthold_benches::harness;
use agenthold_benches::load::{self, Outcome};
use agenthold_benches::report::{self, Metric, Route};
use agenthold_benches::setup::{Env, NAME, RAW_PORT};
use agenthold_benches::tools;
use agenthold_egress::log::{Decision, Reason};
use anyhow::{Context, Result};
use serde_json::json;

/// Connections kept busy by the TLS and HTTP load generators (as `wrk -c16`).
const CONCURRENCY: usize = 16;
/// DNS queries kept outstanding.
const DNS_WINDOW: usize = 64;
/// Distinct names the cached DNS load cycles through (all allowed by the policy).
const DNS_NAMES: usize = 256;
/// Length of the warm-up run before each metric's measured runs.
const WARM_UP: Duration = Duration::from_millis(500);

/// Knobs read from the environment.
struct Settings {
    seconds: Duration,
    repeats: usize,
    bulk_bytes: u64,
    only: Option<Vec<String>>,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let var = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
        let seconds: u64 = var("BENCH_SECONDS")
            .map_or(Ok(3), |v| v.parse())
            .context("BENCH_SECONDS")?;
        let repeats: usize = var("BENCH_REPEATS")
            .map_or(Ok(3), |v| v.parse())
            .context("BENCH_REPEATS")?;
        let mib: u64 = var("BENCH_BULK_MIB")
            .map_or(Ok(1024), |v| v.parse())
            .context("BENCH_BULK_MIB")?;
        Ok(Self {
            seconds: Duration::from_secs(seconds.max(1)),
            repeats: repeats.max(1),
            bulk_bytes: mib.max(1) << 20,
            only: var("BENCH_ONLY").map(|v| v.split(',').map(|s| s.trim().to_owned()).collect()),
        })
    }

    fn wants(&self, key: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|k| k == key))
    }
}

/// The allocator the shipped binary uses (`agenthold-server/src/main.rs`), so that the gateway measured
/// here allocates as the one that ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    harness::main("egress", run)
}

fn run() -> Result<()> {
    let settings = Settings::from_env()?;
    harness::init_tracing();

    let env = Env::start()?;
    eprintln!("bench egress: routes ready: {env:?}");
    let result = measure(&env, &settings);
    let log = env.gateway_log();
    env.close();
    let metrics = result?;

    // Allowed entries may carry an informational reason (a synthetic DNS answer); failures are `Reason::is_failure`.
    let refused: Vec<_> = log
        .iter()
        .filter(|e| e.decision == Decision::Denied || e.reason.as_ref().is_some_and(Reason::is_failure))
        .collect();
    for entry in refused.iter().take(5) {
        eprintln!("bench egress: gateway log: {}", entry.to_json_line());
    }
    let refused = refused.len();
    println!();
    println!("{}", report::table(&metrics));
    println!(
        "gateway request log: {} entries kept for the agent, {refused} denied or failed",
        log.len()
    );
    let settings_json = json!({
        "cpus": std::thread::available_parallelism().map(usize::from).ok(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_owned()),
        "seconds_per_run": settings.seconds.as_secs(),
        "repeats": settings.repeats,
        "bulk_bytes": settings.bulk_bytes,
        "concurrency": CONCURRENCY,
        "dns_window": DNS_WINDOW,
        "gateway_log_entries": log.len(),
        "gateway_log_refused": refused,
        "runs_started_on_busy_machine": harness::noisy_starts(),
    });
    let path = json_path();
    let json = report::to_json(&metrics, &settings_json);
    std::fs::write(&path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("write {}", path.display()))?;
    let noisy = harness::noisy_starts();
    if noisy > 0 {
        println!(
            "{noisy} runs started while other work kept >= {} CPUs busy: expect noise",
            harness::QUIET_BELOW
        );
    }
    println!("written: {}", path.display());
    Ok(())
}

/// `BENCH_JSON`, else `bench-egress.json` in the target directory this binary was built into.
fn json_path() -> PathBuf {
    if let Some(path) = std::env::var_os("BENCH_JSON") {
        return path.into();
    }
    // target/release/deps/egress-HASH → target
    let target = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(PathBuf::from))
        .filter(|dir| dir.join("CACHEDIR.TAG").exists() || dir.ends_with("target"));
    target
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")))
        .join("bench-egress.json")
}

/// A warm-up run on every route (which also checks that each route works), then `repeats` rounds of one
/// run per route, interleaved so that drift on the machine hits every route alike.
fn rounds(
    settings: &Settings,
    metric: &mut Metric,
    mut once: impl FnMut(Route, Duration) -> Result<Outcome>,
) -> Result<()> {
    eprintln!("bench egress: {} …", metric.name);
    for route in Route::ALL {
        once(route, WARM_UP).with_context(|| format!("{}: warm-up on {}", metric.name, route.key()))?;
    }
    for _ in 0..settings.repeats {
        for route in Route::ALL {
            harness::settle("egress");
            let before = CpuMark::now();
            let outcome = once(route, settings.seconds)
                .with_context(|| format!("{} on {}", metric.name, route.key()))?;
            before.record(metric, route, &outcome, settings.seconds);
            metric.push(route, outcome.per_second, outcome.errors);
        }
    }
    Ok(())
}

fn measure(env: &Env, settings: &Settings) -> Result<Vec<Metric>> {
    let mut metrics = Vec::new();
    if settings.wants("bulk") {
        metrics.push(bulk(env, settings)?);
    }
    if settings.wants("raw") {
        metrics.push(raw_bulk(env, settings)?);
    }
    if settings.wants("tls") {
        let mut metric = Metric::new(
            "new TLS connections (handshake + 1 request)",
            "conn/s",
            &format!("Rust rustls client, {CONCURRENCY} concurrent, no resumption, Connection: close"),
            Some(0.85),
        );
        rounds(settings, &mut metric, |route, duration| {
            let target = env.endpoints(route).tls;
            let config = env.client_tls();
            load::in_namespace(env.client_ns(route), || {
                load::block_on(load::tls_connections(target, NAME, config, CONCURRENCY, duration))
            })
        })?;
        metrics.push(metric);
    }
    if settings.wants("wrk") {
        metrics.push(wrk(env, settings)?);
    }
    if settings.wants("http") {
        metrics.extend(http(env, settings)?);
    }
    if ["dns", "dns_uncached", "dns_cached"]
        .iter()
        .any(|k| settings.wants(k))
    {
        metrics.extend(dns(env, settings)?);
    }
    Ok(metrics)
}

/// The DNS metrics (issue 14 item 2): the forward path without a cache (every name new) on the three
/// routes, then answers from a cache: dnsmasq across the veth pair vs the gateway, same client, same names.
fn dns(env: &Env, settings: &Settings) -> Result<Vec<Metric>> {
    let mut uncached = Metric::new(
        "DNS queries (UDP, A), not cached",
        "qps",
        &format!("Rust UDP client, {DNS_WINDOW} outstanding, every name new, answer checked"),
        None,
    );
    let mut metrics = Vec::new();
    if settings.wants("dns") || settings.wants("dns_uncached") {
        rounds(settings, &mut uncached, |route, duration| {
            let server = env.endpoints(route).dns;
            load::in_namespace(env.client_ns(route), || {
                dns_cache::unique_queries(server, NAME, DNS_WINDOW, duration)
            })
        })?;
        uncached.note = Some(
            "direct = the upstream responder itself; through the gateway every query is policy-checked, \
             forwarded upstream (a cache miss: the name was never asked), filtered and logged"
                .into(),
        );
        metrics.push(uncached);
    }
    if !(settings.wants("dns") || settings.wants("dns_cached")) {
        return Ok(metrics);
    }
    if !Dnsmasq::available() {
        eprintln!(
            "bench egress: dnsmasq not installed (apt-get install -y dnsmasq-base): cached DNS row skipped"
        );
        return Ok(metrics);
    }
    let Some(direct_ns) = env.direct_upstream_ns() else {
        return Ok(metrics);
    };
    // dnsmasq beside the direct route's lean responder, on port 53 of the same address, forwarding to it.
    let upstream = env.endpoints(Route::DirectVeth).dns;
    let listen = std::net::SocketAddr::new(upstream.ip(), 53);
    let dnsmasq = Dnsmasq::start(direct_ns, listen, upstream, NAME)?;
    let mut cached = Metric::new(
        "DNS queries (UDP, A), answered from a cache",
        "qps",
        &format!("Rust UDP client, {DNS_WINDOW} outstanding, {DNS_NAMES} names (cached after the warm-up)"),
        Some(1.0),
    );
    let names: Vec<String> = (0..DNS_NAMES).map(|i| format!("q{i}.{NAME}")).collect();
    let routes = [Route::DirectVeth, Route::Gateway];
    let server = |route| match route {
        Route::Gateway => env.endpoints(route).dns,
        _ => dnsmasq.addr(),
    };
    eprintln!("bench egress: {} …", cached.name);
    for route in routes {
        load::in_namespace(env.client_ns(route), || {
            load::dns_queries(server(route), &names, DNS_WINDOW, WARM_UP)
        })
        .with_context(|| format!("{}: warm-up on {}", cached.name, route.key()))?;
    }
    for _ in 0..settings.repeats {
        for route in routes {
            harness::settle("egress");
            let before = cpu::MachineCpu::now();
            let outcome = load::in_namespace(env.client_ns(route), || {
                load::dns_queries(server(route), &names, DNS_WINDOW, settings.seconds)
            })
            .with_context(|| format!("{} on {}", cached.name, route.key()))?;
            cached.push_busy(route, cpu::MachineCpu::now().cores_busy_since(before));
            cached.push(route, outcome.per_second, outcome.errors);
        }
    }
    cached.note = Some(format!(
        "direct (veth) column = dnsmasq {} answering from its cache ({listen} in the direct upstream \
         namespace, forwarding misses to the lean responder); gateway = its per-agent cache, every hit \
         still policy-checked, filtered, recorded and logged; direct (lo) not measured",
        dnsmasq_version()
    ));
    metrics.push(cached);
    drop(dnsmasq);
    Ok(metrics)
}

/// `dnsmasq --version`'s version number, for the table's note.
fn dnsmasq_version() -> String {
    std::process::Command::new("/usr/sbin/dnsmasq")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// Spliced TLS bulk throughput: curl downloads `bulk_bytes` over HTTPS; the gateway splices it (the
/// ClientHello names an allowed host and nothing is intercepted).
fn bulk(env: &Env, settings: &Settings) -> Result<Metric> {
    let bytes = settings.bulk_bytes;
    let mut metric = Metric::new(
        "TLS bulk download, spliced",
        "MB/s",
        &format!(
            "curl (OpenSSL) -o /dev/null, {} MiB generated by the upstream",
            bytes >> 20
        ),
        Some(0.8),
    );
    bulk_rounds(settings, &mut metric, |route| {
        let tls = env.endpoints(route).tls;
        let (url, resolve) = match route {
            // The sandbox's connection goes to port 443 of the synthetic address: the URL names no port.
            Route::Gateway => (
                format!("https://{NAME}/bulk/{bytes}"),
                format!("{NAME}:443:{}", tls.ip()),
            ),
            _ => (
                format!("https://{NAME}:{}/bulk/{bytes}", tls.port()),
                format!("{NAME}:{}:{}", tls.port(), tls.ip()),
            ),
        };
        tools::curl_bulk(env.client_ns(route), &url, &resolve, env.ca_pem_path(), bytes)
    })?;
    Ok(metric)
}

/// Spliced TCP bulk throughput without TLS: the same splice, no cryptography on either end, so the
/// gateway's copy cost is not hidden behind (or competing with) AES-GCM.
fn raw_bulk(env: &Env, settings: &Settings) -> Result<Metric> {
    let bytes = settings.bulk_bytes;
    let mut metric = Metric::new(
        "TCP bulk download, spliced (no TLS)",
        "MB/s",
        &format!(
            "Rust client, 256 KiB reads, {} MiB, other-TCP port {RAW_PORT}",
            bytes >> 20
        ),
        Some(0.8),
    );
    bulk_rounds(settings, &mut metric, |route| {
        let endpoints = env.endpoints(route);
        load::in_namespace(env.client_ns(route), || {
            if route == Route::Gateway {
                // Other TCP is decided by the name the sandbox resolved for the address: keep it fresh.
                load::resolve_a(endpoints.dns, NAME)?;
            }
            load::tcp_bulk(endpoints.raw, bytes)
        })
    })?;
    Ok(metric)
}

/// A warm-up download on every route, then `repeats` interleaved rounds; `download` returns bytes per
/// second. Also records the CPU time the gateway's and the upstream's threads spent per GB moved.
fn bulk_rounds(
    settings: &Settings,
    metric: &mut Metric,
    mut download: impl FnMut(Route) -> Result<f64>,
) -> Result<()> {
    eprintln!("bench egress: {} …", metric.name);
    for route in Route::ALL {
        download(route).with_context(|| format!("{}: warm-up on {}", metric.name, route.key()))?;
    }
    let gb = settings.bulk_bytes as f64 / 1e9;
    let mut gateway_cpu = Vec::new();
    let mut upstream_cpu: [Vec<f64>; 3] = Default::default();
    for _ in 0..settings.repeats {
        for (i, route) in Route::ALL.into_iter().enumerate() {
            let (gw0, up0) = (cpu::threads_cpu("gateway"), cpu::threads_cpu("upstream"));
            harness::settle("egress");
            let before = cpu::MachineCpu::now();
            let speed = download(route).with_context(|| format!("{} on {}", metric.name, route.key()))?;
            metric.push_busy(route, cpu::MachineCpu::now().cores_busy_since(before));
            let (gw1, up1) = (cpu::threads_cpu("gateway"), cpu::threads_cpu("upstream"));
            metric.push(route, speed / 1e6, 0);
            upstream_cpu[i].push((up1 - up0).as_secs_f64() / gb);
            if route == Route::Gateway {
                gateway_cpu.push((gw1 - gw0).as_secs_f64() / gb);
            }
        }
    }
    let ms = |v: &[f64]| report::median(v).map_or_else(|| "-".to_owned(), |s| format!("{:.0} ms", s * 1e3));
    metric.note = Some(format!(
        "CPU per GB: gateway threads {}; upstream threads {} (lo) / {} (veth) / {} (gateway)",
        ms(&gateway_cpu),
        ms(&upstream_cpu[0]),
        ms(&upstream_cpu[1]),
        ms(&upstream_cpu[2]),
    ));
    Ok(())
}

/// Plain HTTP keep-alive with wrk: to the upstream directly, and to the name's address from the sandbox
/// (transparent proxy, decided by `Host`). wrk cannot use a proxy; the explicit proxy is measured by
/// [`http`].
fn wrk(env: &Env, settings: &Settings) -> Result<Metric> {
    let mut metric = Metric::new(
        "HTTP keep-alive requests, transparent (wrk)",
        "req/s",
        &format!("wrk -t1 -c{CONCURRENCY}, GET /small (13-byte body)"),
        Some(0.5),
    );
    if !tools::available("wrk") {
        metric.note = Some("skipped: wrk is not installed (apt-get install -y wrk)".into());
        return Ok(metric);
    }
    rounds(settings, &mut metric, |route, duration| {
        let http = env.endpoints(route).http;
        let url = format!("http://{http}/small");
        tools::wrk(env.client_ns(route), &url, NAME, CONCURRENCY, duration)
    })?;
    Ok(metric)
}

/// Plain HTTP keep-alive with the Rust client: direct, through the transparent proxy, and through the
/// explicit proxy (absolute-form requests, what `HTTP_PROXY` makes clients send). The explicit row
/// shares the direct runs of the transparent row: the direct request is the same one, in origin form.
fn http(env: &Env, settings: &Settings) -> Result<[Metric; 2]> {
    let client = format!("Rust client, {CONCURRENCY} keep-alive connections, GET /small");
    let mut transparent = Metric::new(
        "HTTP keep-alive requests, transparent (Rust)",
        "req/s",
        &client,
        Some(0.5),
    );
    let mut explicit = Metric::new(
        "HTTP keep-alive requests, explicit proxy",
        "req/s",
        &client,
        Some(0.5),
    );
    explicit.note = Some("direct columns are the transparent row's runs (same client, origin-form)".into());
    let origin = format!("GET /small HTTP/1.1\r\nhost: {NAME}\r\n\r\n").into_bytes();
    let absolute = format!("GET http://{NAME}/small HTTP/1.1\r\nhost: {NAME}\r\n\r\n").into_bytes();
    let keepalive = |route: Route, target, request: &[u8], duration| {
        let request = request.to_vec();
        load::in_namespace(env.client_ns(route), || {
            load::block_on(load::http_keepalive(target, request, CONCURRENCY, duration))
        })
    };
    eprintln!("bench egress: {} …", transparent.name);
    let proxy = env.explicit_proxy();
    for route in Route::ALL {
        keepalive(route, env.endpoints(route).http, &origin, WARM_UP)
            .with_context(|| format!("HTTP warm-up on {}", route.key()))?;
    }
    keepalive(Route::Gateway, proxy, &absolute, WARM_UP).context("explicit proxy warm-up")?;
    for _ in 0..settings.repeats {
        for route in Route::ALL {
            harness::settle("egress");
            let before = CpuMark::now();
            let outcome = keepalive(route, env.endpoints(route).http, &origin, settings.seconds)
                .with_context(|| format!("HTTP on {}", route.key()))?;
            let after = CpuMark::now();
            before.record_until(&after, &mut transparent, route, &outcome, settings.seconds);
            transparent.push(route, outcome.per_second, outcome.errors);
            if route != Route::Gateway {
                before.record_until(&after, &mut explicit, route, &outcome, settings.seconds);
                explicit.push(route, outcome.per_second, outcome.errors);
            }
        }
        harness::settle("egress");
        let before = CpuMark::now();
        let outcome =
            keepalive(Route::Gateway, proxy, &absolute, settings.seconds).context("explicit proxy")?;
        before.record(&mut explicit, Route::Gateway, &outcome, settings.seconds);
        explicit.push(Route::Gateway, outcome.per_second, outcome.errors);
    }
    Ok([transparent, explicit])
}

/// CPU counters at the start of a rate run: the machine's, the gateway's threads' and the upstream's.
struct CpuMark {
    machine: cpu::MachineCpu,
    gateway: Duration,
    upstream: Duration,
}

impl CpuMark {
    fn now() -> Self {
        Self {
            machine: cpu::MachineCpu::now(),
            gateway: cpu::threads_cpu("gateway"),
            upstream: cpu::threads_cpu("upstream"),
        }
    }

    /// Record the CPUs busy and the CPU µs per operation of the run `outcome` that started at `self`.
    fn record(&self, metric: &mut Metric, route: Route, outcome: &Outcome, duration: Duration) {
        self.record_until(&Self::now(), metric, route, outcome, duration);
    }

    fn record_until(
        &self,
        after: &Self,
        metric: &mut Metric,
        route: Route,
        outcome: &Outcome,
        duration: Duration,
    ) {
        let busy = after.machine.cores_busy_since(self.machine);
        metric.push_busy(route, busy);
        let ops = (outcome.per_second * duration.as_secs_f64()).max(1.0);
        let per_op = |d: Duration| d.as_secs_f64() * 1e6 / ops;
        metric.push_cpu(
            route,
            per_op(after.gateway.saturating_sub(self.gateway)),
            per_op(after.upstream.saturating_sub(self.upstream)),
            busy * duration.as_secs_f64() * 1e6 / ops,
        );
    }
}
