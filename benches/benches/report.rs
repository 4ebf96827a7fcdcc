//! Not a benchmark: the plots of `docs/benchmarks/` from the JSON files the bench targets wrote.
//!
//! `cargo bench -p agenthold-benches --bench report` (no root needed) reads `bench-density.json`,
//! `bench-intercept.json` and `bench-soak.json` from the target directory (`BENCH_REPORT_INPUT` for
//! another) and writes SVG plots into `docs/benchmarks/` (`BENCH_PLOTS_DIR` for another). Missing inputs
//! are skipped with a message. See `agenthold_benches::plot`.
// A report's output is what it wrote, on stdout.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;

use agenthold_benches::{harness, plot};

fn main() -> ExitCode {
    harness::main("report", || {
        let input = std::env::var_os("BENCH_REPORT_INPUT").map_or_else(harness::target_dir, PathBuf::from);
        let output = std::env::var_os("BENCH_PLOTS_DIR").map_or_else(
            || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/benchmarks")),
            PathBuf::from,
        );
        let outcome = plot::report(&input, &output)?;
        println!("{outcome}");
        if outcome.written.is_empty() {
            println!("report: no plot written (run the benches first: make bench)");
        }
        Ok(())
    })
}
