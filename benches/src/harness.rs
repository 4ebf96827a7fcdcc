//! What every bench target's `main` does the same way: refuse to run without `--bench`, apply the short mode
//! (`BENCH_SHORT=1`), wait for a quiet machine before each measured run (and count the runs that could not),
//! and find `target/`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::cpu;

/// A run starts once fewer than this many CPUs were busy for a quarter second (see [`cpu::settle`]).
pub const QUIET_BELOW: f64 = 0.3;
/// How long to wait for a quiet machine before starting a run anyway.
pub const QUIET_PATIENCE: Duration = Duration::from_secs(20);

/// Runs that started although the machine was busy (other work than the benchmark).
static NOISY_STARTS: AtomicUsize = AtomicUsize::new(0);

/// Run the bench target `name`. `cargo bench` passes `--bench`; `cargo test --all-targets` builds the
/// target too and must not start a benchmark that needs root and minutes, so without it this succeeds
/// at once. With `BENCH_SHORT=1` the target runs with its fewest meaningful rounds and seconds (see
/// [`short_defaults`]).
pub fn main(name: &str, run: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("bench {name}: not run without --bench (use `cargo bench`)");
        return ExitCode::SUCCESS;
    }
    if let Some(code) = apply_short_mode(name) {
        return code;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench {name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether the short mode is on (`BENCH_SHORT` set to anything but empty or `0`): every target runs its
/// fewest meaningful rounds and seconds, a check that it works rather than a measurement.
#[must_use]
pub fn short() -> bool {
    std::env::var("BENCH_SHORT").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The knobs the short mode sets for bench target `name`, unless the environment sets them already. Every
/// target reads its knobs from the environment, so the short mode is only other defaults.
#[must_use]
pub fn short_defaults(name: &str) -> &'static [(&'static str, &'static str)] {
    match name {
        // Interleaved rounds of timed runs (egress, intercept, splice), bulk downloads (egress, splice).
        "egress" | "splice" | "intercept" => &[
            ("BENCH_SECONDS", "1"),
            ("BENCH_REPEATS", "1"),
            ("BENCH_BULK_MIB", "64"),
        ],
        "sandbox_start" => &[("BENCH_ROUNDS", "1")],
        "server" => &[
            ("BENCH_SECONDS", "1"),
            ("BENCH_ROUNDS", "10"),
            ("BENCH_RUN_ROUNDS", "3"),
        ],
        // density.rs reads BENCH_SHORT itself (50 agents); fewer latency requests on top.
        "density" => &[("BENCH_DENSITY_REQUESTS", "100")],
        _ => &[],
    }
}

/// Marks a process the short mode already re-ran with its defaults.
const SHORT_APPLIED: &str = "AGENTHOLD_BENCH_SHORT_APPLIED";

/// In the short mode, runs this binary again with [`short_defaults`] added to its environment (the
/// environment of a running process is not safely writable) and returns the child's exit code; `None`
/// when there is nothing to add, so that the caller runs the benchmark itself.
fn apply_short_mode(name: &str) -> Option<ExitCode> {
    if !short() || std::env::var_os(SHORT_APPLIED).is_some() {
        return None;
    }
    let missing: Vec<_> = short_defaults(name)
        .iter()
        .filter(|(key, _)| std::env::var_os(key).is_none_or(|v| v.is_empty()))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("bench {name}: short mode: cannot find this binary ({e}); running with the defaults");
            return None;
        }
    };
    let shown: Vec<String> = missing.iter().map(|(k, v)| format!("{k}={v}")).collect();
    eprintln!("bench {name}: short mode: {}", shown.join(" "));
    let status = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .envs(missing.iter().map(|(k, v)| (k, v)))
        .env(SHORT_APPLIED, "1")
        .status();
    Some(match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("bench {name}: {status}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("bench {name}: short mode: cannot run this binary again: {e}");
            ExitCode::FAILURE
        }
    })
}

/// Wait for a quiet machine before a measured run of bench `name`; a run that starts busy is counted.
pub fn settle(name: &str) {
    let busy = cpu::settle(QUIET_BELOW, QUIET_PATIENCE);
    if busy >= QUIET_BELOW {
        NOISY_STARTS.fetch_add(1, Ordering::Relaxed);
        eprintln!("bench {name}: starting a run on a busy machine ({busy:.1} CPUs busy)");
    }
}

/// Runs that started on a busy machine so far.
#[must_use]
pub fn noisy_starts() -> usize {
    NOISY_STARTS.load(Ordering::Relaxed)
}

/// The directory this binary was built into (`target/release/deps/NAME-HASH` → `target`).
#[must_use]
pub fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(PathBuf::from))
        .filter(|dir| dir.join("CACHEDIR.TAG").exists() || dir.ends_with("target"))
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")))
}

/// A multi-threaded tokio runtime with `workers` worker threads named `name` (what every bench gives each
/// side it measures: the proxy, the upstream, the load).
///
/// # Errors
/// When the runtime cannot start.
pub fn runtime(name: &str, workers: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context as _;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
        .with_context(|| format!("start the {name} runtime"))
}

/// Logs to stderr, `warn` unless `RUST_LOG` says otherwise (a bench's stdout is its report).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bench_with_knobs_has_short_defaults() {
        for name in [
            "egress",
            "splice",
            "intercept",
            "sandbox_start",
            "server",
            "density",
        ] {
            assert!(!short_defaults(name).is_empty(), "{name}");
        }
        // The soak and the report read the short mode themselves (or have nothing to shorten).
        assert!(short_defaults("soak").is_empty());
        let egress: Vec<&str> = short_defaults("egress").iter().map(|(k, _)| *k).collect();
        assert!(egress.contains(&"BENCH_SECONDS") && egress.contains(&"BENCH_REPEATS"));
    }
}
