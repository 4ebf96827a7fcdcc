//! The stores side by side in one run (issue 15): `PgStore` (a throwaway PostgreSQL from Debian's package
//! on loopback, `synchronous_commit = on`, `fsync = on`) against `RedbStore` (a file in a temp directory,
//! fsync per write), the same operations interleaved round by round:
//!
//! - `put`: one 256-byte value under a new key; `get`: a random existing key; `batch`: ten puts in one
//!   atomic batch; `scan`: `scan_prefix` over 100 keys of a larger table.
//!
//! Each row gives both stores' throughput (one caller at a time, so 1 / mean latency) and p50 / p99 latency,
//! and the ratio PgStore / RedbStore. The server's exec-through-the-API latency on each store is part
//! `stores` of the `server` bench (`BENCH_ONLY=stores cargo bench -p agenthold-benches --bench server`).
//!
//! `cargo bench -p agenthold-benches --bench store`. `BENCH_OPS` (operations per kind and store, default
//! 2000; the short mode 200).
// A benchmark's output is its table on stdout.
#![allow(clippy::print_stdout)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use agenthold_benches::harness;
use agenthold_benches::table::render;
use agenthold_core::store::{BatchOp, PgOptions, PgStore, RedbStore, Store};
use agenthold_testsupport::{PG_PASSWORD, TestPostgres};
use anyhow::{Context, Result};

fn main() -> ExitCode {
    harness::main("store", run)
}

/// Latencies of one operation kind on one store, in seconds.
#[derive(Default)]
struct Samples(Vec<f64>);

impl Samples {
    fn quantile(&self, q: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        let i = ((v.len() - 1) as f64 * q).round() as usize;
        v[i]
    }

    fn per_second(&self) -> f64 {
        let total: f64 = self.0.iter().sum();
        self.0.len() as f64 / total
    }
}

const KINDS: [&str; 4] = ["put", "get", "batch (10 puts)", "scan (100 keys)"];

/// One operation of kind `kind` (index into [`KINDS`]), round `i`.
async fn op(store: &dyn Store, kind: usize, i: u64, value: &[u8]) -> Result<()> {
    match kind {
        0 => store.put("bench", format!("k{i:08}").as_bytes(), value).await?,
        1 => {
            // Keys written by the put rounds: 0..=i.
            let key = format!("k{:08}", i.wrapping_mul(2_654_435_761) % (i + 1));
            store
                .get("bench", key.as_bytes())
                .await?
                .context("a written key is missing")?;
        }
        2 => {
            let ops = (0..10)
                .map(|j| BatchOp::Put {
                    table: "bench_batch".into(),
                    key: format!("b{i:08}-{j}").into_bytes(),
                    value: value.to_vec(),
                })
                .collect();
            store.batch(ops).await?;
        }
        _ => {
            let prefix = format!("p{:02}-", i % 10);
            let found = store.scan_prefix("bench_scan", prefix.as_bytes()).await?;
            anyhow::ensure!(found.len() == 100, "scan found {} keys", found.len());
        }
    }
    Ok(())
}

fn run() -> Result<()> {
    let ops: u64 = std::env::var("BENCH_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if harness::short() { 200 } else { 2000 });
    let pg = TestPostgres::start();
    pg.create_database("bench");
    let dir = tempfile::tempdir()?;
    let rt = harness::runtime("store", 2)?;
    rt.block_on(async {
        let redb: Arc<dyn Store> = Arc::new(RedbStore::open_in_data_dir(dir.path().join("data"))?);
        let mut options = PgOptions::new(pg.url("bench"));
        options.password = Some(PG_PASSWORD.to_owned());
        let postgres: Arc<dyn Store> = Arc::new(PgStore::connect(options).await?);
        let stores = [("redb", &redb), ("postgres", &postgres)];
        let value = vec![0x5a_u8; 256];
        // The scanned table: 10 prefixes of 100 keys, among 1,000 keys of other prefixes.
        for (_, store) in stores {
            for p in 0..20 {
                let batch = (0..100)
                    .map(|k| BatchOp::Put {
                        table: "bench_scan".into(),
                        key: format!("{}{p:02}-{k:03}", if p < 10 { "p" } else { "q" }).into_bytes(),
                        value: value.clone(),
                    })
                    .collect();
                store.batch(batch).await?;
            }
        }
        harness::settle("store");
        let mut samples: Vec<[Samples; 2]> = (0..KINDS.len()).map(|_| Default::default()).collect();
        for (kind, per_store) in samples.iter_mut().enumerate() {
            for i in 0..ops {
                // Interleaved: each round runs the operation on both stores.
                for (s, (_, store)) in stores.iter().enumerate() {
                    let t = Instant::now();
                    op(store.as_ref(), kind, i, &value).await?;
                    per_store[s].0.push(t.elapsed().as_secs_f64());
                }
            }
        }
        let us = |s: f64| format!("{:.0} µs", s * 1e6);
        let rows: Vec<Vec<String>> = KINDS
            .iter()
            .zip(&samples)
            .map(|(kind, [redb, pg])| {
                vec![
                    (*kind).to_owned(),
                    format!("{:.0}", redb.per_second()),
                    format!("{:.0}", pg.per_second()),
                    format!("{:.2}", pg.per_second() / redb.per_second()),
                    format!("{} / {}", us(redb.quantile(0.5)), us(redb.quantile(0.99))),
                    format!("{} / {}", us(pg.quantile(0.5)), us(pg.quantile(0.99))),
                ]
            })
            .collect();
        println!("store: {ops} operations of each kind on each store, interleaved, one caller");
        println!(
            "{}",
            render(
                &[
                    "operation",
                    "redb ops/s",
                    "postgres ops/s",
                    "postgres / redb",
                    "redb p50 / p99",
                    "postgres p50 / p99",
                ],
                &rows,
                &[1, 2, 3]
            )
        );
        Ok(())
    })
}
