//! TLS interception vs direct HTTPS vs mitmdump, side by side in one run (issue 4, item 9).
//!
//! `cargo bench -p agenthold-benches --bench intercept` (as root). The gateway is the egress bench's (same
//! namespaces, rules, upstreams, `setup::Env`), plus a secret rule for the upstream's host: it terminates
//! the sandbox's TLS with its own CA, sets the secret's header on every request and forwards it over a
//! verified TLS connection. The upstream counts the requests that arrive with the secret, and the run fails
//! unless every request through the gateway (and through mitmdump) carried it, so the numbers cannot
//! silently measure a splice.
//!
//! Four routes to the same HTTPS upstream: direct on loopback, direct across a veth pair, the gateway
//! (sandbox → veth → gateway → loopback), and `mitmdump --mode reverse:https://…` on loopback (client on
//! loopback, the header set with `--modify-headers`). Two measurements, each a warm-up on every route and
//! then `BENCH_REPEATS` interleaved rounds of `BENCH_SECONDS`:
//!
//! - `rate`: keep-alive requests per second with 16 connections, one request at a time each (loaded).
//! - `latency`: one connection, one request at a time, every request timed (unloaded): p50, p90, p99.
//!
//! When nginx is installed, a second `rate` row puts it behind the gateway instead of the lean upstream
//! (direct on loopback vs through the gateway; nginx answers 403 to a gateway request without the secret):
//! how the ratio depends on what the direct path costs. `BENCH_NGINX=0` skips it.
//!
//! `BENCH_ONLY=rate,latency`, `BENCH_JSON` (default `target/bench-intercept.json`), `BENCH_MITM=0` skips
//! mitmdump, `BENCH_MITM_QUIET=0` lets it print its default line per flow (to a file), `BENCH_VENV`
//! (default `target/bench-venv`) is where mitmproxy is pip-installed.
// A benchmark's output is its table on stdout.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use agenthold_benches::harness;
use agenthold_benches::load::{self, Outcome};
use agenthold_benches::mitm::{self, Mitmdump};
use agenthold_benches::nginx::{self, Nginx};
use agenthold_benches::report::{Route, median};
use agenthold_benches::setup::{Env, Intercept, NAME, Options};
use agenthold_benches::table::{num, render};
use agenthold_benches::{cpu, tls_load, upstream};
use agenthold_core::config::LeakGuard;
use agenthold_core::secret::{SecretRule, SecretSpec, SecretTable};
use agenthold_egress::CertificateAuthority;
use agenthold_egress::log::{Decision, LogKind, Reason};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// Connections of the loaded rate measurement (as `wrk -c16` and the egress bench).
const CONCURRENCY: usize = 16;
/// Length of the warm-up run on every route.
const WARM_UP: Duration = Duration::from_millis(500);
/// Targets from the issue.
const TARGET_RATE_VS_DIRECT: f64 = 0.5;
const TARGET_RATE_VS_MITM: f64 = 50.0;
const TARGET_ADDED_P50_US: f64 = 50.0;

/// The four ways to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Lo,
    Veth,
    Gateway,
    Mitm,
}

impl Way {
    const ALL: [Way; 4] = [Way::Lo, Way::Veth, Way::Gateway, Way::Mitm];

    fn key(self) -> &'static str {
        match self {
            Way::Lo => "direct_loopback",
            Way::Veth => "direct_veth",
            Way::Gateway => "gateway",
            Way::Mitm => "mitmdump",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// Whether the upstream must see the secret on requests that came this way.
    fn injects(self) -> bool {
        matches!(self, Way::Gateway | Way::Mitm)
    }
}

/// Knobs read from the environment.
struct Settings {
    seconds: Duration,
    repeats: usize,
    only: Option<Vec<String>>,
    mitm: bool,
    mitm_quiet: bool,
    nginx: bool,
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
        Ok(Self {
            seconds: Duration::from_secs(seconds.max(1)),
            repeats: repeats.max(1),
            only: var("BENCH_ONLY").map(|v| v.split(',').map(|s| s.trim().to_owned()).collect()),
            mitm: var("BENCH_MITM").is_none_or(|v| v != "0"),
            mitm_quiet: var("BENCH_MITM_QUIET").is_none_or(|v| v != "0"),
            nginx: var("BENCH_NGINX").is_none_or(|v| v != "0"),
        })
    }

    fn wants(&self, key: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|k| k == key))
    }
}

/// Every run of one measurement on every way, plus what each cost.
#[derive(Debug, Default)]
struct Series {
    /// Per way, per run: the value (req/s, or µs for a latency quantile).
    runs: [Vec<f64>; 4],
    errors: [u64; 4],
    busy: [Vec<f64>; 4],
    /// Per way, per run: CPU µs per request of the proxy (gateway threads, mitmdump process).
    proxy_cpu_us: [Vec<f64>; 4],
    /// Per way, per run: CPU µs per request of the upstream's threads.
    upstream_cpu_us: [Vec<f64>; 4],
    /// Per way, per run: CPU µs per request of the whole machine (busy CPUs × duration / requests).
    machine_cpu_us: [Vec<f64>; 4],
    /// Per way: requests completed and requests the upstream saw with the secret, summed over the runs.
    requests: [u64; 4],
    injected: [u64; 4],
}

impl Series {
    fn median(&self, way: Way) -> Option<f64> {
        median(&self.runs[way.index()])
    }

    /// Median over rounds of (a / b) of the same round; ratio of medians when the run counts differ.
    fn ratio(&self, a: Way, b: Way) -> Option<f64> {
        let (x, y) = (&self.runs[a.index()], &self.runs[b.index()]);
        if x.len() == y.len() && !x.is_empty() {
            return median(&x.iter().zip(y).map(|(x, y)| x / y).collect::<Vec<_>>());
        }
        Some(self.median(a)? / self.median(b)?)
    }

    /// Median over rounds of (a − b) of the same round.
    fn difference(&self, a: Way, b: Way) -> Option<f64> {
        let (x, y) = (&self.runs[a.index()], &self.runs[b.index()]);
        if x.len() == y.len() && !x.is_empty() {
            return median(&x.iter().zip(y).map(|(x, y)| x - y).collect::<Vec<_>>());
        }
        Some(self.median(a)? - self.median(b)?)
    }

    fn to_json(&self) -> Value {
        let mut ways = serde_json::Map::new();
        for way in Way::ALL {
            let i = way.index();
            ways.insert(
                way.key().to_owned(),
                json!({
                    "median": self.median(way),
                    "runs": self.runs[i],
                    "errors": self.errors[i],
                    "cpus_busy": self.busy[i],
                    "proxy_cpu_us_per_request": self.proxy_cpu_us[i],
                    "upstream_cpu_us_per_request": self.upstream_cpu_us[i],
                    "machine_cpu_us_per_request": self.machine_cpu_us[i],
                    "requests": self.requests[i],
                    "requests_with_secret_at_upstream": self.injected[i],
                }),
            );
        }
        Value::Object(ways)
    }
}

/// The upstream a measurement asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upstream {
    /// The lean hand-written server of `upstream.rs` (every way).
    Lean,
    /// nginx on loopback: direct (lo) and through the gateway only.
    Nginx,
}

/// The name nginx is reached by (SNI, `Host`, the gateway's mapping and the secret's rule).
const NGINX_NAME: &str = "nginx.bench.test";

/// Where each way's client runs and connects, and what it trusts.
struct Clients<'a> {
    env: &'a Env,
    gateway_tls: Arc<rustls::ClientConfig>,
    mitm: Option<(SocketAddr, Arc<rustls::ClientConfig>)>,
    /// nginx: its address, a client configuration trusting it, and the synthetic address the sandbox
    /// resolved its name to through the gateway.
    nginx: Option<(SocketAddr, Arc<rustls::ClientConfig>, std::net::Ipv4Addr)>,
}

impl Clients<'_> {
    fn has(&self, upstream: Upstream, way: Way) -> bool {
        match upstream {
            Upstream::Lean => way != Way::Mitm || self.mitm.is_some(),
            Upstream::Nginx => self.nginx.is_some() && matches!(way, Way::Lo | Way::Gateway),
        }
    }

    /// The name, and the request, a client on `way` to `upstream` sends. Through the gateway nginx is asked
    /// for `/injected`, which it answers with 403 unless the secret is there.
    fn request(upstream: Upstream, way: Way) -> (&'static str, Vec<u8>) {
        match (upstream, way) {
            (Upstream::Lean, _) => (NAME, tls_load::small_request(NAME)),
            (Upstream::Nginx, Way::Gateway) => (
                NGINX_NAME,
                format!("GET /injected HTTP/1.1\r\nhost: {NGINX_NAME}\r\n\r\n").into_bytes(),
            ),
            (Upstream::Nginx, _) => (NGINX_NAME, tls_load::small_request(NGINX_NAME)),
        }
    }

    /// Runs `f(target, tls config)` on a thread in `way`'s client namespace.
    fn run<T: Send>(
        &self,
        upstream: Upstream,
        way: Way,
        f: impl FnOnce(SocketAddr, Arc<rustls::ClientConfig>) -> Result<T> + Send,
    ) -> Result<T> {
        if upstream == Upstream::Nginx {
            let (addr, config, synthetic) = self.nginx.as_ref().context("nginx is not running")?;
            let (ns, target, config) = match way {
                Way::Lo => (None, *addr, Arc::clone(config)),
                Way::Gateway => (
                    self.env.client_ns(Route::Gateway),
                    SocketAddr::from((*synthetic, 443)),
                    Arc::clone(&self.gateway_tls),
                ),
                Way::Veth | Way::Mitm => bail!("nginx is only measured direct (lo) and through the gateway"),
            };
            return load::in_namespace(ns, move || f(target, config));
        }
        let (ns, target, config) = match way {
            Way::Lo => (
                None,
                self.env.endpoints(Route::DirectLoopback).tls,
                self.env.client_tls(),
            ),
            Way::Veth => (
                self.env.client_ns(Route::DirectVeth),
                self.env.endpoints(Route::DirectVeth).tls,
                self.env.client_tls(),
            ),
            Way::Gateway => (
                self.env.client_ns(Route::Gateway),
                self.env.endpoints(Route::Gateway).tls,
                Arc::clone(&self.gateway_tls),
            ),
            Way::Mitm => {
                let (addr, config) = self.mitm.as_ref().context("mitmdump is not running")?;
                (None, *addr, Arc::clone(config))
            }
        };
        load::in_namespace(ns, move || f(target, config))
    }
}

/// The allocator the shipped binary uses (`agenthold-server/src/main.rs`), so that the gateway measured
/// here allocates as the one that ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    harness::main("intercept", run)
}

fn run() -> Result<()> {
    let settings = Settings::from_env()?;
    harness::init_tracing();

    // mitmproxy first: installing it (once) takes a while and must not overlap a measurement.
    let mitmdump = if settings.mitm {
        let venv = std::env::var_os("BENCH_VENV")
            .map_or_else(|| harness::target_dir().join("bench-venv"), PathBuf::from);
        Some(mitm::ensure_installed(&venv)?)
    } else {
        None
    };

    // The gateway's CA (as `<data_dir>/egress`) and one secret whose rule covers the upstream's name.
    let ca_dir = tempfile::tempdir().context("CA directory")?;
    let ca = Arc::new(CertificateAuthority::load_or_create(ca_dir.path())?);
    let secrets = Arc::new(SecretTable::new(LeakGuard::Block));
    // nginx, when installed, as a second upstream the gateway maps by name.
    let nginx = if settings.nginx && nginx::available() {
        Some(Nginx::start(NGINX_NAME)?)
    } else {
        if settings.nginx {
            eprintln!(
                "bench intercept: nginx not installed (apt-get install -y nginx-light): its row is skipped"
            );
        }
        None
    };
    let env = Env::start_with(Options {
        intercept: Some(Intercept {
            injector: Arc::clone(&secrets) as _,
            ca: Arc::clone(&ca),
        }),
        connect_to: nginx
            .iter()
            .map(|n| (NGINX_NAME.to_owned(), 443, n.addr()))
            .collect(),
        upstream_ca_pem: nginx.as_ref().map(Nginx::ca_pem),
    })?;
    let rule = SecretRule::header(&[NAME, NGINX_NAME], upstream::SECRET_HEADER, "{{.Value}}")?;
    let secret = SecretSpec::new("bench-secret", upstream::SECRET_VALUE.into(), None, vec![rule])?;
    secrets.set(env.agent(), vec![secret]);
    eprintln!("bench intercept: routes ready: {env:?}");

    let result = (|| {
        let mitm = match &mitmdump {
            Some(bin) => {
                let upstream = env.endpoints(Route::DirectLoopback).tls;
                let m = Mitmdump::start(
                    bin,
                    upstream,
                    upstream::SECRET_HEADER,
                    upstream::SECRET_VALUE,
                    settings.mitm_quiet,
                )?;
                eprintln!("bench intercept: {m:?} in front of https://{upstream}");
                Some(m)
            }
            None => None,
        };
        let nginx_clients = match &nginx {
            Some(n) => {
                let dns = env.endpoints(Route::Gateway).dns;
                let synthetic =
                    load::in_namespace(env.client_ns(Route::Gateway), || load::resolve_a(dns, NGINX_NAME))
                        .context("resolve nginx's name through the gateway")?;
                eprintln!("bench intercept: {n:?}, {NGINX_NAME} is {synthetic} in the sandbox");
                Some((n.addr(), n.client_tls(), synthetic))
            }
            None => None,
        };
        let clients = Clients {
            env: &env,
            gateway_tls: tls_load::client_config(ca.cert_pem())?,
            mitm: match &mitm {
                Some(m) => Some((m.addr(), tls_load::client_config(m.ca_pem())?)),
                None => None,
            },
            nginx: nginx_clients,
        };
        let marks = Marks {
            mitm: mitm.as_ref(),
            nginx: nginx.as_ref(),
        };
        let rate = if settings.wants("rate") {
            Some(measure_rate(&clients, &settings, &marks, Upstream::Lean)?)
        } else {
            None
        };
        let rate_nginx = if settings.wants("rate") && clients.nginx.is_some() {
            Some(measure_rate(&clients, &settings, &marks, Upstream::Nginx)?)
        } else {
            None
        };
        let latency = if settings.wants("latency") {
            Some(latency(&clients, &settings)?)
        } else {
            None
        };
        Ok::<_, anyhow::Error>((rate, rate_nginx, latency))
    })();
    let log = env.gateway_log();
    env.close();
    drop(nginx);
    let (rate, rate_nginx, latency) = result?;

    let kept = log.iter().filter(|e| e.kind != LogKind::Dns).count();
    let injected_log = log.iter().filter(|e| e.secret_injected).count();
    let refused = log
        .iter()
        .filter(|e| e.decision == Decision::Denied || e.reason.as_ref().is_some_and(Reason::is_failure))
        .count();
    println!();
    if rate.is_some() || rate_nginx.is_some() {
        println!("{}", rate_table(rate.as_ref(), rate_nginx.as_ref(), &settings));
    }
    if let Some(latency) = &latency {
        println!("{}", latency_table(latency));
    }
    println!(
        "gateway request log: {kept} request entries kept for the agent (newest 5000), {injected_log} marked \
         secret_injected, {refused} denied or failed"
    );
    let noisy = harness::noisy_starts();
    if noisy > 0 {
        println!(
            "{noisy} runs started while other work kept >= {} CPUs busy: expect noise",
            harness::QUIET_BELOW
        );
    }

    let settings_json = json!({
        "cpus": std::thread::available_parallelism().map(usize::from).ok(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_owned()),
        "seconds_per_run": settings.seconds.as_secs(),
        "repeats": settings.repeats,
        "concurrency": CONCURRENCY,
        "mitmdump": mitmdump.as_deref().and_then(mitm::version),
        "mitmdump_quiet": settings.mitm_quiet,
        "nginx": rate_nginx.as_ref().and_then(|_| nginx::version()),
        "gateway_log_request_entries": kept,
        "gateway_log_secret_injected": injected_log,
        "gateway_log_refused": refused,
        "runs_started_on_busy_machine": noisy,
    });
    let json = json!({
        "settings": settings_json,
        "rate": rate.as_ref().map(|r| json!({
            "unit": "req/s",
            "client": format!("Rust rustls client, {CONCURRENCY} keep-alive connections, HTTP/1.1, GET /small"),
            "ways": r.to_json(),
            "ratio_gateway_vs_direct_veth": r.ratio(Way::Gateway, Way::Veth),
            "ratio_gateway_vs_direct_loopback": r.ratio(Way::Gateway, Way::Lo),
            "ratio_gateway_vs_mitmdump": r.ratio(Way::Gateway, Way::Mitm),
            "target_ratio_vs_direct": TARGET_RATE_VS_DIRECT,
            "target_ratio_vs_mitmdump": TARGET_RATE_VS_MITM,
        })),
        "rate_nginx_upstream": rate_nginx.as_ref().map(|r| json!({
            "unit": "req/s",
            "client": format!("Rust rustls client, {CONCURRENCY} keep-alive connections, HTTP/1.1; nginx on loopback, \
                               direct from the host namespace, through the gateway from the sandbox"),
            "ways": r.to_json(),
            "ratio_gateway_vs_direct_loopback": r.ratio(Way::Gateway, Way::Lo),
            "note": "upstream_cpu_us_per_request is nginx's processes (master and workers)",
        })),
        "latency": latency.as_ref().map(|l| {
            let quantiles: serde_json::Map<String, Value> = l.quantiles.iter().map(|(name, s)| {
                (name.clone(), json!({
                    "unit": "us",
                    "ways": s.to_json(),
                    "added_by_gateway_vs_direct_veth": s.difference(Way::Gateway, Way::Veth),
                    "added_by_gateway_vs_direct_loopback": s.difference(Way::Gateway, Way::Lo),
                    "added_by_mitmdump_vs_direct_loopback": s.difference(Way::Mitm, Way::Lo),
                }))
            }).collect();
            json!({
                "client": "Rust rustls client, 1 keep-alive connection, one request at a time, HTTP/1.1",
                "quantiles": quantiles,
                "target_added_p50_us": TARGET_ADDED_P50_US,
            })
        }),
    });
    let path = std::env::var_os("BENCH_JSON").map_or_else(
        || harness::target_dir().join("bench-intercept.json"),
        PathBuf::from,
    );
    std::fs::write(&path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("write {}", path.display()))?;
    println!("written: {}", path.display());
    Ok(())
}

/// Checks that the upstream saw the secret on exactly the requests that went through an interceptor.
fn check_injection(way: Way, done: u64, injected: u64) -> Result<()> {
    if way.injects() && injected < done {
        bail!(
            "{}: {done} requests completed but the upstream saw the secret on only {injected}: not intercepted",
            way.key()
        );
    }
    if !way.injects() && injected > 0 {
        bail!(
            "{}: the upstream saw the secret on {injected} direct requests",
            way.key()
        );
    }
    Ok(())
}

/// The external processes whose CPU time a run counts.
struct Marks<'a> {
    mitm: Option<&'a Mitmdump>,
    nginx: Option<&'a Nginx>,
}

/// CPU counters around one run.
struct CpuMark {
    gateway: Duration,
    upstream: Duration,
    mitm: Duration,
    nginx: Duration,
    machine: cpu::MachineCpu,
    injected: u64,
}

impl CpuMark {
    fn now(marks: &Marks<'_>) -> Self {
        Self {
            gateway: cpu::threads_cpu("gateway"),
            upstream: cpu::threads_cpu("upstream"),
            mitm: marks.mitm.map(Mitmdump::cpu).unwrap_or_default(),
            nginx: marks.nginx.map(Nginx::cpu).unwrap_or_default(),
            machine: cpu::MachineCpu::now(),
            injected: upstream::injected_requests(),
        }
    }
}

/// Loaded rate: 16 keep-alive connections per way, interleaved rounds, to `upstream`.
fn measure_rate(
    clients: &Clients<'_>,
    settings: &Settings,
    marks: &Marks<'_>,
    upstream: Upstream,
) -> Result<Series> {
    eprintln!("bench intercept: keep-alive rate ({upstream:?} upstream) …");
    let once = |way: Way, duration: Duration| -> Result<Outcome> {
        let (name, request) = Clients::request(upstream, way);
        clients.run(upstream, way, move |target, config| {
            load::block_on(tls_load::keepalive(
                target,
                name,
                config,
                request,
                CONCURRENCY,
                duration,
            ))
        })
    };
    let requests = |o: &Outcome, d: Duration| (o.per_second * d.as_secs_f64()).round() as u64;
    // The lean upstream counts the secret; nginx answers 403 without it (an error for the client).
    let check = |way: Way, outcome: &Outcome, done: u64, injected: u64| match upstream {
        Upstream::Lean => check_injection(way, done, injected),
        Upstream::Nginx if way == Way::Gateway && outcome.errors > 0 => {
            bail!(
                "nginx refused {} requests through the gateway: the secret was missing",
                outcome.errors
            )
        }
        Upstream::Nginx => Ok(()),
    };
    let ways: Vec<Way> = Way::ALL
        .into_iter()
        .filter(|w| clients.has(upstream, *w))
        .collect();
    for &way in &ways {
        let before = upstream::injected_requests();
        let outcome = once(way, WARM_UP).with_context(|| format!("warm-up on {}", way.key()))?;
        let injected = upstream::injected_requests() - before;
        check(way, &outcome, requests(&outcome, WARM_UP), injected)?;
    }
    let mut series = Series::default();
    for _ in 0..settings.repeats {
        for &way in &ways {
            harness::settle("intercept");
            let before = CpuMark::now(marks);
            let outcome = once(way, settings.seconds).with_context(|| format!("rate on {}", way.key()))?;
            let after = CpuMark::now(marks);
            let done = requests(&outcome, settings.seconds);
            let injected = after.injected - before.injected;
            check(way, &outcome, done, injected)?;
            let i = way.index();
            let busy = after.machine.cores_busy_since(before.machine);
            let per_request = |d: Duration| d.as_secs_f64() * 1e6 / done.max(1) as f64;
            series.runs[i].push(outcome.per_second);
            series.errors[i] += outcome.errors;
            series.busy[i].push(busy);
            series.requests[i] += done;
            series.injected[i] += match (upstream, way) {
                // nginx answered every one of them only because the secret was there.
                (Upstream::Nginx, Way::Gateway) => done,
                _ => injected,
            };
            series.upstream_cpu_us[i].push(match upstream {
                Upstream::Lean => per_request(after.upstream - before.upstream),
                Upstream::Nginx => per_request(after.nginx - before.nginx),
            });
            series.machine_cpu_us[i].push(busy * settings.seconds.as_secs_f64() * 1e6 / done.max(1) as f64);
            match way {
                Way::Gateway => series.proxy_cpu_us[i].push(per_request(after.gateway - before.gateway)),
                Way::Mitm => series.proxy_cpu_us[i].push(per_request(after.mitm - before.mitm)),
                Way::Lo | Way::Veth => {}
            }
        }
    }
    Ok(series)
}

/// Unloaded latency: the quantiles of every run, per way.
struct Latency {
    /// `("p50", series in µs)`, `("p90", …)`, `("p99", …)`, `("mean", …)`, and the rate one sequential
    /// connection achieved (`"req/s"`).
    quantiles: Vec<(String, Series)>,
}

const QUANTILES: [(&str, f64); 3] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)];

fn latency(clients: &Clients<'_>, settings: &Settings) -> Result<Latency> {
    eprintln!("bench intercept: sequential latency …");
    let request = tls_load::small_request(NAME);
    let once = |way: Way, duration: Duration| -> Result<Vec<Duration>> {
        let request = request.clone();
        clients.run(Upstream::Lean, way, move |target, config| {
            load::block_on(tls_load::sequential(target, NAME, config, &request, duration))
        })
    };
    for way in Way::ALL.into_iter().filter(|w| clients.has(Upstream::Lean, *w)) {
        let before = upstream::injected_requests();
        let samples = once(way, WARM_UP).with_context(|| format!("latency warm-up on {}", way.key()))?;
        // One untimed request precedes the samples.
        check_injection(
            way,
            samples.len() as u64 + 1,
            upstream::injected_requests() - before,
        )?;
    }
    let mut quantiles: Vec<(String, Series)> = QUANTILES
        .iter()
        .map(|(n, _)| ((*n).to_owned(), Series::default()))
        .chain([
            ("mean".to_owned(), Series::default()),
            ("req/s".to_owned(), Series::default()),
        ])
        .collect();
    for _ in 0..settings.repeats {
        for way in Way::ALL.into_iter().filter(|w| clients.has(Upstream::Lean, *w)) {
            harness::settle("intercept");
            let before = cpu::MachineCpu::now();
            let injected_before = upstream::injected_requests();
            let mut samples =
                once(way, settings.seconds).with_context(|| format!("latency on {}", way.key()))?;
            let busy = cpu::MachineCpu::now().cores_busy_since(before);
            check_injection(
                way,
                samples.len() as u64 + 1,
                upstream::injected_requests() - injected_before,
            )?;
            samples.sort_unstable();
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            let mean = samples.iter().map(|d| us(*d)).sum::<f64>() / samples.len().max(1) as f64;
            let values = QUANTILES
                .iter()
                .map(|(_, q)| tls_load::quantile(&samples, *q).map_or(f64::NAN, us))
                .chain([mean, samples.len() as f64 / settings.seconds.as_secs_f64()]);
            for ((_, series), value) in quantiles.iter_mut().zip(values) {
                series.runs[way.index()].push(value);
                series.busy[way.index()].push(busy);
                series.requests[way.index()] += samples.len() as u64;
            }
        }
    }
    Ok(Latency { quantiles })
}

fn busy_cell(series: &Series) -> String {
    Way::ALL
        .map(|w| median(&series.busy[w.index()]).map_or_else(|| "-".to_owned(), |b| format!("{b:.1}")))
        .join("/")
}

fn rate_table(lean: Option<&Series>, nginx: Option<&Series>, settings: &Settings) -> String {
    let verdict = |label: &str, value: Option<f64>, target: f64| match value {
        Some(v) if v >= target => format!("{label} >= {target} ok"),
        Some(_) => format!("{label} >= {target} MISSED"),
        None => String::new(),
    };
    let row = |name: String, rate: &Series, target: String| {
        vec![
            name,
            "req/s".to_owned(),
            num(rate.median(Way::Lo)),
            num(rate.median(Way::Veth)),
            num(rate.median(Way::Gateway)),
            num(rate.median(Way::Mitm)),
            num(rate.ratio(Way::Gateway, Way::Veth)),
            num(rate.ratio(Way::Gateway, Way::Lo)),
            num(rate.ratio(Way::Gateway, Way::Mitm)),
            target,
            Way::ALL.map(|w| rate.errors[w.index()].to_string()).join("/"),
            busy_cell(rate),
        ]
    };
    let mut rows = Vec::new();
    if let Some(rate) = lean {
        let target = format!(
            "{}; {}",
            verdict(
                "gw/veth",
                rate.ratio(Way::Gateway, Way::Veth),
                TARGET_RATE_VS_DIRECT
            ),
            verdict(
                "gw/mitm",
                rate.ratio(Way::Gateway, Way::Mitm),
                TARGET_RATE_VS_MITM
            )
        );
        rows.push(row(
            format!("HTTPS keep-alive, intercepted, lean upstream ({CONCURRENCY} conns)"),
            rate,
            target,
        ));
    }
    if let Some(rate) = nginx {
        let target = format!(
            "({})",
            verdict("gw/lo", rate.ratio(Way::Gateway, Way::Lo), TARGET_RATE_VS_DIRECT)
        );
        rows.push(row(
            format!("HTTPS keep-alive, intercepted, nginx upstream ({CONCURRENCY} conns)"),
            rate,
            target,
        ));
    }
    let mut out = render(
        &[
            "metric",
            "unit",
            "direct (lo)",
            "direct (veth)",
            "gateway",
            "mitmdump",
            "gw/veth",
            "gw/lo",
            "gw/mitm",
            "target",
            "errors lo/veth/gw/mitm",
            "CPUs busy lo/veth/gw/mitm",
        ],
        &rows,
        &[2, 3, 4, 5, 6, 7, 8],
    );
    let us = |v: &[f64]| median(v).map_or_else(|| "-".to_owned(), |m| format!("{m:.0} µs"));
    out.push_str(&format!(
        "  client: Rust rustls, {CONCURRENCY} keep-alive connections, HTTP/1.1, GET /small (13-byte body), \
         {} s per run, {} rounds, medians; ratios are medians of per-round ratios\n",
        settings.seconds.as_secs(),
        settings.repeats
    ));
    if let Some(rate) = lean {
        out.push_str(&format!(
            "  lean upstream, CPU per request: gateway threads {}, mitmdump process {}; upstream threads {} (lo) / \
             {} (veth) / {} (gw) / {} (mitm); whole machine {} / {} / {} / {}\n",
            us(&rate.proxy_cpu_us[Way::Gateway.index()]),
            us(&rate.proxy_cpu_us[Way::Mitm.index()]),
            us(&rate.upstream_cpu_us[0]),
            us(&rate.upstream_cpu_us[1]),
            us(&rate.upstream_cpu_us[2]),
            us(&rate.upstream_cpu_us[3]),
            us(&rate.machine_cpu_us[0]),
            us(&rate.machine_cpu_us[1]),
            us(&rate.machine_cpu_us[2]),
            us(&rate.machine_cpu_us[3]),
        ));
        out.push_str(&format!(
            "  mitmdump: `--mode reverse:https://<lean upstream> --ssl-insecure --modify-headers` on loopback, \
             client on loopback, {}\n",
            if settings.mitm_quiet {
                "quiet (flow_detail=0): no line per flow"
            } else {
                "default logging: a line per flow (to a file)"
            }
        ));
        out.push_str(&format!(
            "  secret at the upstream: {} of {} gateway requests, {} of {} mitmdump requests, {} direct\n",
            rate.injected[Way::Gateway.index()],
            rate.requests[Way::Gateway.index()],
            rate.injected[Way::Mitm.index()],
            rate.requests[Way::Mitm.index()],
            rate.injected[Way::Lo.index()] + rate.injected[Way::Veth.index()],
        ));
    }
    if let Some(rate) = nginx {
        out.push_str(&format!(
            "  nginx upstream ({}, worker_processes auto, on loopback; direct from the host namespace, through \
             the gateway from the sandbox asking /injected, which nginx answers 403 without the secret): CPU per \
             request: gateway threads {}; nginx {} (lo) / {} (gw); whole machine {} (lo) / {} (gw); {} of {} \
             gateway requests answered 200\n",
            nginx::version().unwrap_or_default(),
            us(&rate.proxy_cpu_us[Way::Gateway.index()]),
            us(&rate.upstream_cpu_us[Way::Lo.index()]),
            us(&rate.upstream_cpu_us[Way::Gateway.index()]),
            us(&rate.machine_cpu_us[Way::Lo.index()]),
            us(&rate.machine_cpu_us[Way::Gateway.index()]),
            rate.injected[Way::Gateway.index()],
            rate.requests[Way::Gateway.index()],
        ));
    }
    out
}

fn latency_table(latency: &Latency) -> String {
    let rows: Vec<Vec<String>> = latency
        .quantiles
        .iter()
        .map(|(name, s)| {
            let unit = if name == "req/s" { "req/s" } else { "µs" };
            let target = match name.as_str() {
                "p50" => match s.difference(Way::Gateway, Way::Veth) {
                    Some(v) if v <= TARGET_ADDED_P50_US => format!("added <= {TARGET_ADDED_P50_US} µs ok"),
                    Some(_) => format!("added <= {TARGET_ADDED_P50_US} µs MISSED"),
                    None => "-".to_owned(),
                },
                _ => String::new(),
            };
            let (added_gw_veth, added_gw_lo, added_mitm) = if name == "req/s" {
                (None, None, None)
            } else {
                (
                    s.difference(Way::Gateway, Way::Veth),
                    s.difference(Way::Gateway, Way::Lo),
                    s.difference(Way::Mitm, Way::Lo),
                )
            };
            vec![
                format!("sequential, 1 conn: {name}"),
                unit.to_owned(),
                num(s.median(Way::Lo)),
                num(s.median(Way::Veth)),
                num(s.median(Way::Gateway)),
                num(s.median(Way::Mitm)),
                num(added_gw_veth),
                num(added_gw_lo),
                num(added_mitm),
                target,
            ]
        })
        .collect();
    let mut out = render(
        &[
            "latency (unloaded)",
            "unit",
            "direct (lo)",
            "direct (veth)",
            "gateway",
            "mitmdump",
            "added gw-veth",
            "added gw-lo",
            "added mitm-lo",
            "target",
        ],
        &rows,
        &[2, 3, 4, 5, 6, 7, 8],
    );
    if let Some((_, p50)) = latency.quantiles.first() {
        out.push_str(&format!(
            "  client: Rust rustls, 1 keep-alive connection, one request at a time, every request timed (write to \
             last byte read); quantiles per run, medians over rounds; added = median of per-round differences; \
             CPUs busy lo/veth/gw/mitm {}\n",
            busy_cell(p50)
        ));
    }
    out
}
