//! The splice experiment: how fast could the gateway's byte loop be? (issue 3, item 10 findings)
//!
//! `cargo bench -p agenthold-benches --bench splice` (as root). One namespace pair joined by a veth (a
//! `TestNet` without rules): the client runs in the sandbox namespace; reference forwarders
//! ([`agenthold_benches::proxy`]) listen in the other namespace and dial the upstream on loopback from
//! this process's namespace, the gateway's topology without its nftables, sniffing, policy and log. Each
//! forwarder moves bytes one way: userspace copy at 16, 64 (today's gateway) and 256 KiB, or splice(2).
//! The baseline is the client reaching the upstream across the same veth directly. Raw TCP (Rust client)
//! and TLS (curl) bulk downloads, `BENCH_REPEATS` interleaved rounds (default 3), medians, plus the CPU
//! time the forwarder's threads spent per GB. JSON: `target/bench-splice.json` (or `BENCH_SPLICE_JSON`).
// A benchmark's output is its table on stdout.
#![allow(clippy::print_stdout)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agenthold_benches::harness;
use agenthold_benches::proxy::{self, Forward};
use agenthold_benches::report::median;
use agenthold_benches::setup::NAME;
use agenthold_benches::{cpu, load, tools, upstream};
use agenthold_testsupport::{TestCa, TestNet};
use anyhow::{Context, Result};
use serde_json::json;

/// The forwarders compared with the direct path.
const VARIANTS: [Forward; 6] = [
    Forward::Copy(16 << 10),
    Forward::Copy(64 << 10),
    Forward::Copy(256 << 10),
    Forward::Splice(64 << 10),
    Forward::Splice(256 << 10),
    Forward::Splice(1 << 20),
];

/// One column of results: the direct path (`None`) or a forwarder.
struct Column {
    how: Option<Forward>,
    raw: SocketAddr,
    tls: SocketAddr,
    raw_mbps: Vec<f64>,
    tls_mbps: Vec<f64>,
    raw_cpu: Vec<f64>,
    tls_cpu: Vec<f64>,
}

impl Column {
    fn label(&self) -> String {
        self.how
            .map_or_else(|| "direct (veth), no forwarder".to_owned(), Forward::label)
    }
}

/// The allocator the shipped binary uses (`agenthold-server/src/main.rs`), so that the gateway measured
/// here allocates as the one that ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    harness::main("splice", run)
}

fn run() -> Result<()> {
    let repeats: usize = std::env::var("BENCH_REPEATS").ok().map_or(Ok(3), |v| v.parse())?;
    let mib: u64 = std::env::var("BENCH_BULK_MIB")
        .ok()
        .map_or(Ok(1024), |v| v.parse())?;
    let bytes = mib.max(1) << 20;
    let (upstream_rt, proxy_rt) = (harness::runtime("upstream", 2)?, harness::runtime("proxy", 2)?);
    let net = TestNet::new();
    let ns = net.gateway();
    let here = SocketAddr::from((net.gateway_addr(), 0));
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let ca = TestCa::new();
    let acceptor = upstream::tls_acceptor(&ca, &[NAME])?;
    let mut ca_file = tempfile::NamedTempFile::new()?;
    std::io::Write::write_all(&mut ca_file, ca.pem().as_bytes())?;

    let column = |how, raw, tls| Column {
        how,
        raw,
        tls,
        raw_mbps: Vec::new(),
        tls_mbps: Vec::new(),
        raw_cpu: Vec::new(),
        tls_cpu: Vec::new(),
    };
    let mut columns = Vec::new();
    let (lo_raw, lo_tls) = {
        let _rt = upstream_rt.enter();
        let lo_raw = upstream::serve_raw(std::net::TcpListener::bind(loopback)?)?;
        let lo_tls = upstream::serve_http(std::net::TcpListener::bind(loopback)?, Some(acceptor.clone()))?;
        let raw = upstream::serve_raw(ns.bind_tcp(here)?)?;
        let tls = upstream::serve_http(ns.bind_tcp(here)?, Some(acceptor))?;
        columns.push(column(None, raw, tls));
        (lo_raw, lo_tls)
    };
    {
        let _rt = proxy_rt.enter();
        for how in VARIANTS {
            let raw = proxy::serve(ns.bind_tcp(here)?, lo_raw, how)?;
            let tls = proxy::serve(ns.bind_tcp(here)?, lo_tls, how)?;
            columns.push(column(Some(how), raw, tls));
        }
    }

    let client_ns = net.sandbox();
    let raw_download = |target| load::in_namespace(Some(client_ns), || load::tcp_bulk(target, bytes));
    let tls_download = |target: SocketAddr| {
        let url = format!("https://{NAME}:{}/bulk/{bytes}", target.port());
        let resolve = format!("{NAME}:{}:{}", target.port(), target.ip());
        tools::curl_bulk(Some(client_ns), &url, &resolve, ca_file.path(), bytes)
    };
    let gb = bytes as f64 / 1e9;
    let cpu_ms_per_gb = |before: Duration| (cpu::threads_cpu("proxy") - before).as_secs_f64() * 1e3 / gb;
    for round in 0..=repeats {
        eprintln!("bench splice: round {round} of {repeats} (0 = warm-up)");
        for c in &mut columns {
            let label = c.label();
            cpu::settle(0.3, Duration::from_secs(20));
            let before = cpu::threads_cpu("proxy");
            let raw = raw_download(c.raw).with_context(|| format!("raw through {label}"))?;
            let raw_cpu = cpu_ms_per_gb(before);
            cpu::settle(0.3, Duration::from_secs(20));
            let before = cpu::threads_cpu("proxy");
            let tls = tls_download(c.tls).with_context(|| format!("TLS through {label}"))?;
            let tls_cpu = cpu_ms_per_gb(before);
            if round > 0 {
                c.raw_mbps.push(raw / 1e6);
                c.tls_mbps.push(tls / 1e6);
                c.raw_cpu.push(raw_cpu);
                c.tls_cpu.push(tls_cpu);
            }
        }
    }
    drop(proxy_rt);
    drop(upstream_rt);
    net.close();

    let direct_raw = median(&columns[0].raw_mbps).unwrap_or(f64::NAN);
    let direct_tls = median(&columns[0].tls_mbps).unwrap_or(f64::NAN);
    println!();
    println!(
        "| {:<32} | {:>9} | {:>6} | {:>13} | {:>9} | {:>6} | {:>13} |",
        "forwarder", "raw MB/s", "ratio", "CPU ms/GB raw", "TLS MB/s", "ratio", "CPU ms/GB TLS"
    );
    println!(
        "| {:-<32} | {:->9} | {:->6} | {:->13} | {:->9} | {:->6} | {:->13} |",
        "", "", "", "", "", "", ""
    );
    let mut rows = Vec::new();
    for c in &columns {
        let (raw, tls) = (
            median(&c.raw_mbps).unwrap_or(f64::NAN),
            median(&c.tls_mbps).unwrap_or(f64::NAN),
        );
        let (raw_cpu, tls_cpu) = (
            median(&c.raw_cpu).unwrap_or(0.0),
            median(&c.tls_cpu).unwrap_or(0.0),
        );
        println!(
            "| {:<32} | {raw:>9.0} | {:>6.2} | {raw_cpu:>13.0} | {tls:>9.0} | {:>6.2} | {tls_cpu:>13.0} |",
            c.label(),
            raw / direct_raw,
            tls / direct_tls,
        );
        rows.push(json!({
            "forwarder": c.label(),
            "raw_mb_per_s": c.raw_mbps, "raw_median": raw, "raw_ratio": raw / direct_raw,
            "raw_forwarder_cpu_ms_per_gb": c.raw_cpu,
            "tls_mb_per_s": c.tls_mbps, "tls_median": tls, "tls_ratio": tls / direct_tls,
            "tls_forwarder_cpu_ms_per_gb": c.tls_cpu,
        }));
    }
    let path = std::env::var_os("BENCH_SPLICE_JSON").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../target/bench-splice.json"
            ))
        },
        PathBuf::from,
    );
    let out = json!({ "bulk_bytes": bytes, "repeats": repeats, "columns": rows });
    std::fs::write(&path, serde_json::to_string_pretty(&out)?)?;
    println!("written: {}", path.display());
    Ok(())
}
