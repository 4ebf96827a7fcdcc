//! The soak benchmark's load process: thousands of long-lived HTTPS connections from one sandbox, and the
//! upstream they reach, in a process of their own so that the benchmark process's memory is the gateway's.
//!
//! The bench binary runs itself again with [`LOAD_ARG`] (see `benches/soak.rs`). This process then
//!
//! 1. starts a lean HTTPS upstream ([`upstream::serve_http`]) on loopback in its own (the host's)
//!    namespace, with a certificate for [`SPLICED_NAME`] and [`INTERCEPTED_NAME`] from a fresh test CA, and
//!    prints a [`Hello`] line (address and CA) on stdout;
//! 2. reads a [`Plan`] line on stdin (the sandbox namespace, the addresses the sandbox resolved through the
//!    gateway, how many connections of each kind, the gateway's CA for the intercepted ones);
//! 3. from a thread inside the sandbox namespace, opens the connections (at most [`RAMP_PARALLEL`]
//!    handshakes at once) and sends one `GET /small` on each every `interval`, spread evenly, so the total
//!    rate is steady; a failed connect, handshake, read, timeout or non-200 status counts as an error and
//!    the connection is opened again;
//! 4. prints its counters ([`Counters`]) as a JSON line every second, until stdin closes or says `stop`,
//!    then closes every connection, prints a last line and exits.
//!
//! It also dies with its parent (`PR_SET_PDEATHSIG`), so an interrupted benchmark leaves nothing running.

use std::io::{BufRead, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use agenthold_egress::netns::NetNs;
use agenthold_testsupport::TestCa;
use anyhow::{Context, Result, bail};
use rustls_pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::{load, tls_load, upstream};

/// The argument that makes the bench binary the load process.
pub const LOAD_ARG: &str = "--soak-load";
/// The name the spliced connections ask for: no secret rule, SNI decides, the gateway splices.
pub const SPLICED_NAME: &str = "bench.test";
/// The name the intercepted connections ask for: a secret rule covers it, the gateway terminates TLS.
pub const INTERCEPTED_NAME: &str = "secret.bench.test";
/// Handshakes in progress at once while the connections are opened.
pub const RAMP_PARALLEL: usize = 64;
/// How long one connect + handshake, or one request, may take before it counts as an error.
pub const OP_TIMEOUT: Duration = Duration::from_secs(30);

/// What the load process says first: where its upstream listens and the CA its certificate chains to.
#[derive(Debug, Clone)]
pub struct Hello {
    /// The upstream, on loopback in the host namespace.
    pub upstream: SocketAddr,
    /// The upstream's CA certificate (PEM): the gateway trusts it for intercepted hosts.
    pub ca_pem: String,
    /// The load process's id (for its memory).
    pub pid: u32,
}

impl Hello {
    /// As one JSON line.
    pub fn to_json(&self) -> Value {
        json!({"upstream": self.upstream.to_string(), "ca_pem": self.ca_pem, "pid": self.pid})
    }

    /// From the JSON line [`Hello::to_json`] wrote.
    ///
    /// # Errors
    /// When a field is missing or malformed.
    pub fn from_json(v: &Value) -> Result<Self> {
        Ok(Self {
            upstream: str_field(v, "upstream")?.parse().context("upstream address")?,
            ca_pem: str_field(v, "ca_pem")?.to_owned(),
            pid: u32::try_from(v["pid"].as_u64().context("pid")?)?,
        })
    }
}

/// What the benchmark asks the load process to do.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The sandbox namespace (a path under `/run/netns`).
    pub netns: String,
    /// Where [`SPLICED_NAME`] resolved inside the sandbox (port 443).
    pub spliced_addr: SocketAddr,
    /// Where [`INTERCEPTED_NAME`] resolved inside the sandbox (port 443).
    pub intercepted_addr: SocketAddr,
    /// Spliced connections to hold.
    pub spliced: usize,
    /// Intercepted connections to hold.
    pub intercepted: usize,
    /// Time between two requests on one connection.
    pub interval: Duration,
    /// The gateway's CA certificate (PEM), which signs what the sandbox sees for intercepted hosts.
    pub gateway_ca_pem: String,
}

impl Plan {
    /// As one JSON line.
    pub fn to_json(&self) -> Value {
        json!({
            "netns": self.netns,
            "spliced_addr": self.spliced_addr.to_string(),
            "intercepted_addr": self.intercepted_addr.to_string(),
            "spliced": self.spliced,
            "intercepted": self.intercepted,
            "interval_ms": u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX),
            "gateway_ca_pem": self.gateway_ca_pem,
        })
    }

    /// From the JSON line [`Plan::to_json`] wrote.
    ///
    /// # Errors
    /// When a field is missing or malformed.
    pub fn from_json(v: &Value) -> Result<Self> {
        let count = |key: &str| -> Result<usize> {
            Ok(usize::try_from(v[key].as_u64().with_context(|| key.to_owned())?)?)
        };
        Ok(Self {
            netns: str_field(v, "netns")?.to_owned(),
            spliced_addr: str_field(v, "spliced_addr")?.parse()?,
            intercepted_addr: str_field(v, "intercepted_addr")?.parse()?,
            spliced: count("spliced")?,
            intercepted: count("intercepted")?,
            interval: Duration::from_millis(v["interval_ms"].as_u64().context("interval_ms")?),
            gateway_ca_pem: str_field(v, "gateway_ca_pem")?.to_owned(),
        })
    }
}

fn str_field<'a>(v: &'a Value, key: &str) -> Result<&'a str> {
    v[key].as_str().with_context(|| format!("field {key}"))
}

/// The load process's counters, cumulative since the connections started opening.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections established (TLS handshake done) and not yet failed or closed.
    pub open: AtomicU64,
    /// Connections ever established.
    pub opened: AtomicU64,
    /// Requests answered with `200` and a complete body.
    pub requests: AtomicU64,
    /// Of [`Counters::requests`], those on intercepted connections.
    pub intercepted_requests: AtomicU64,
    /// Failed TCP connects or TLS handshakes (or timeouts of either).
    pub connect_errors: AtomicU64,
    /// Requests that failed to write, read, or timed out, or whose connection closed.
    pub request_errors: AtomicU64,
    /// Answers whose status was not `200`.
    pub status_errors: AtomicU64,
}

impl Counters {
    /// Every counter as JSON, plus what the upstream saw and this process's memory.
    pub fn to_json(&self) -> Value {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        json!({
            "open": get(&self.open),
            "opened": get(&self.opened),
            "requests": get(&self.requests),
            "intercepted_requests": get(&self.intercepted_requests),
            "connect_errors": get(&self.connect_errors),
            "request_errors": get(&self.request_errors),
            "status_errors": get(&self.status_errors),
            "upstream_requests_with_secret": upstream::injected_requests(),
        })
    }
}

/// The load process's `main` (the bench binary called with [`LOAD_ARG`]).
pub fn load_main() -> std::process::ExitCode {
    match load_process() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak load process: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn load_process() -> Result<()> {
    // Die with the benchmark: nothing of a run may outlive it.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).context("PR_SET_PDEATHSIG")?;
    let fds = raise_nofile();
    let upstream_rt = crate::harness::runtime("upstream", 1)?;
    let ca = TestCa::new();
    let acceptor = upstream::tls_acceptor(&ca, &[SPLICED_NAME, INTERCEPTED_NAME])?;
    let addr = {
        let _rt = upstream_rt.enter();
        upstream::serve_http(
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?,
            Some(acceptor),
        )?
    };
    let hello = Hello {
        upstream: addr,
        ca_pem: ca.pem(),
        pid: std::process::id(),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", hello.to_json())?;
    out.flush()?;
    drop(out);

    let stdin = std::io::stdin();
    let mut line = String::new();
    stdin.lock().read_line(&mut line)?;
    if line.trim().is_empty() {
        return Ok(());
    }
    let plan = Plan::from_json(&serde_json::from_str(&line).context("the plan line")?)?;
    eprintln!(
        "soak load process: {} spliced + {} intercepted connections, a request every {:?} on each, \
         descriptor limit {fds}",
        plan.spliced, plan.intercepted, plan.interval
    );

    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Stdin: `stop` or its end stops the run.
    let stop_flag = Arc::clone(&stop);
    std::thread::spawn(move || {
        let mut line = String::new();
        loop {
            line.clear();
            match std::io::stdin().lock().read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) if line.trim() == "stop" => break,
                Ok(_) => {}
            }
        }
        stop_flag.store(true, Ordering::SeqCst);
        let _ = stop_tx.send(true);
    });
    // Counters every second.
    let reporter = {
        let (counters, stop) = (Arc::clone(&counters), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_secs(1));
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{}", counters.to_json());
                let _ = out.flush();
            }
        })
    };
    let ns = NetNs::from_path(&plan.netns);
    let client_counters = Arc::clone(&counters);
    let upstream_ca_pem = hello.ca_pem;
    let result = load::in_namespace(Some(&ns), move || {
        load::block_on(clients(plan, upstream_ca_pem, client_counters, stop_rx))
    });
    stop.store(true, Ordering::SeqCst);
    let _ = reporter.join();
    let mut last = counters.to_json();
    last["final"] = json!(true);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{last}")?;
    out.flush()?;
    upstream_rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Raises the soft descriptor limit to the hard one and returns the limit in force.
pub fn raise_nofile() -> u64 {
    agenthold_egress::budget::raise_descriptor_limit()
}

/// One kind of connection: where it goes, as what name, trusting what.
#[derive(Clone)]
struct Kind {
    target: SocketAddr,
    name: ServerName<'static>,
    connector: TlsConnector,
    request: Arc<[u8]>,
    intercepted: bool,
}

/// Opens every connection and keeps it busy until `stop`.
/// The spliced connections trust `upstream_ca_pem` (the upstream's certificate reaches them end to end
/// through the splice), the intercepted ones the gateway's CA.
async fn clients(
    plan: Plan,
    upstream_ca_pem: String,
    counters: Arc<Counters>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let kinds = [
        (
            plan.spliced,
            Kind {
                target: plan.spliced_addr,
                name: ServerName::try_from(SPLICED_NAME.to_owned())?,
                connector: TlsConnector::from(tls_load::client_config(&upstream_ca_pem)?),
                request: tls_load::small_request(SPLICED_NAME).into(),
                intercepted: false,
            },
        ),
        (
            plan.intercepted,
            Kind {
                target: plan.intercepted_addr,
                name: ServerName::try_from(INTERCEPTED_NAME.to_owned())?,
                connector: TlsConnector::from(tls_load::client_config(&plan.gateway_ca_pem)?),
                request: tls_load::small_request(INTERCEPTED_NAME).into(),
                intercepted: true,
            },
        ),
    ];
    let total = plan.spliced + plan.intercepted;
    if total == 0 {
        bail!("no connections to open");
    }
    let ramp = Arc::new(tokio::sync::Semaphore::new(RAMP_PARALLEL));
    let mut tasks = tokio::task::JoinSet::new();
    // Interleave the kinds so both ramp up together; spread the first requests over one interval.
    let mut order: Vec<Kind> = Vec::with_capacity(total);
    let (mut s, mut i) = (0, 0);
    while s < plan.spliced || i < plan.intercepted {
        // Whichever kind is behind its share goes next.
        if i >= plan.intercepted
            || (s < plan.spliced && s * plan.intercepted.max(1) <= i * plan.spliced.max(1))
        {
            order.push(kinds[0].1.clone());
            s += 1;
        } else {
            order.push(kinds[1].1.clone());
            i += 1;
        }
    }
    let start = tokio::time::Instant::now();
    for (n, kind) in order.into_iter().enumerate() {
        let offset = plan.interval.mul_f64(n as f64 / total as f64);
        let (counters, ramp, stop) = (Arc::clone(&counters), Arc::clone(&ramp), stop.clone());
        tasks.spawn(connection(
            kind,
            start,
            offset,
            plan.interval,
            counters,
            ramp,
            stop,
        ));
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// One connection, opened again whenever it fails, sending a request every `interval` (the first at
/// `start + offset`), until `stop`.
async fn connection(
    kind: Kind,
    start: tokio::time::Instant,
    offset: Duration,
    interval: Duration,
    counters: Arc<Counters>,
    ramp: Arc<tokio::sync::Semaphore>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut next = start + offset;
    let mut buf = Vec::with_capacity(512);
    loop {
        if *stop.borrow() {
            return;
        }
        let connected = {
            let Ok(_permit) = ramp.acquire().await else {
                return;
            };
            tokio::time::timeout(OP_TIMEOUT, connect(&kind)).await
        };
        let mut tls = match connected {
            Ok(Ok(tls)) => tls,
            other => {
                counters.connect_errors.fetch_add(1, Ordering::Relaxed);
                if let Ok(Err(e)) = other {
                    tracing::debug!(error = %e, "soak connection failed to open");
                }
                // Do not hammer a gateway that refuses: wait a second before trying again.
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        };
        counters.open.fetch_add(1, Ordering::Relaxed);
        counters.opened.fetch_add(1, Ordering::Relaxed);
        buf.clear();
        loop {
            let now = tokio::time::Instant::now();
            if next < now {
                // Behind (a slow handshake, a busy machine): skip the missed slots rather than burst.
                let behind = now - next;
                let skip = (behind.as_nanos() / interval.as_nanos().max(1)) as u32 + 1;
                next += interval * skip;
            }
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                _ = stop.wait_for(|s| *s) => {
                    counters.open.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
            }
            next += interval;
            let exchange = async {
                tls.write_all(&kind.request).await?;
                load::read_response(&mut tls, &mut buf, false).await
            };
            match tokio::time::timeout(OP_TIMEOUT, exchange).await {
                Ok(Ok(())) => {
                    counters.requests.fetch_add(1, Ordering::Relaxed);
                    if kind.intercepted {
                        counters.intercepted_requests.fetch_add(1, Ordering::Relaxed);
                    }
                }
                failed => {
                    let status = matches!(&failed, Ok(Err(e)) if e.to_string().starts_with("status"));
                    if status {
                        counters.status_errors.fetch_add(1, Ordering::Relaxed);
                    } else {
                        counters.request_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Ok(Err(e)) = failed {
                        tracing::debug!(error = %e, "soak request failed");
                    }
                    counters.open.fetch_sub(1, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
}

async fn connect(kind: &Kind) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(kind.target).await?;
    tcp.set_nodelay(true)?;
    kind.connector.connect(kind.name.clone(), tcp).await
}
