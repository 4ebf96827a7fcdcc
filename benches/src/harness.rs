//! What every bench target's `main` does the same way: refuse to run without `--bench`, wait for a quiet
//! machine before each measured run (and count the runs that could not), and find `target/`.

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
/// at once.
pub fn main(name: &str, run: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("bench {name}: not run without --bench (use `cargo bench`)");
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench {name}: {e:#}");
            ExitCode::FAILURE
        }
    }
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
