//! CPU time of this process's threads by name, to say where the cycles of a run went.
//!
//! Every runtime names its threads (`gateway`, `upstream`), so the time the kernel has charged to each
//! group (`/proc/self/task/*/schedstat`: nanoseconds on a CPU, user and system together) can be read
//! before and after a run. Softirq work (TCP receive processing) is charged to whichever thread happened
//! to be running, so the split is approximate; the totals are not.

use std::time::Duration;

/// CPU time used so far by this process's threads whose name starts with `prefix`.
pub fn threads_cpu(prefix: &str) -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let nanos: u64 = tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.starts_with(prefix))
        })
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    Duration::from_nanos(nanos)
}

/// Machine-wide CPU counters (`/proc/stat`, all CPUs), in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MachineCpu {
    busy: u64,
    total: u64,
}

impl MachineCpu {
    /// The counters now (zero when `/proc/stat` cannot be read).
    pub fn now() -> Self {
        let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
            return Self::default();
        };
        let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
            return Self::default();
        };
        // user nice system idle iowait irq softirq steal (guest time is already inside user).
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .filter_map(|t| t.parse().ok())
            .collect();
        let total: u64 = ticks.iter().sum();
        let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        Self {
            busy: total - idle,
            total,
        }
    }

    /// How many CPUs were busy on average between `earlier` and `self` (everything on the machine,
    /// including whatever else runs on it).
    pub fn cores_busy_since(self, earlier: Self) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return 0.0;
        }
        let cpus = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        self.busy.saturating_sub(earlier.busy) as f64 / total as f64 * cpus
    }
}

/// Waits (up to `patience`) until the machine is quiet: a quarter second in which fewer than `max_busy`
/// CPUs were busy. Other work on a shared two-core machine (a build, another test suite) otherwise lands
/// in some runs and not others. Returns the busy level of the last window: above `max_busy` means the
/// run starts on a busy machine anyway.
pub fn settle(max_busy: f64, patience: Duration) -> f64 {
    let deadline = std::time::Instant::now() + patience;
    loop {
        let before = MachineCpu::now();
        std::thread::sleep(Duration::from_millis(250));
        let busy = MachineCpu::now().cores_busy_since(before);
        if busy < max_busy || std::time::Instant::now() >= deadline {
            return busy;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_named_threads_only() {
        let busy = std::thread::Builder::new()
            .name("cpu-test-busy".into())
            .spawn(|| {
                let start = std::time::Instant::now();
                let mut x = 0u64;
                while start.elapsed() < Duration::from_millis(50) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                threads_cpu("cpu-test-busy")
            })
            .unwrap();
        let used = busy.join().unwrap();
        assert!(used >= Duration::from_millis(20), "{used:?}");
        assert_eq!(threads_cpu("no-such-thread-name"), Duration::ZERO);
    }
}
