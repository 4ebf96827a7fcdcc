//! A running container's limits written straight into its cgroups: the warm-pool hand-out's fast path
//! (see `handout.rs`). The engine's own update (`docker update`, which runs `runc update`) costs about an
//! exec; these are a handful of file writes. The engine update still follows in the background so that
//! Docker's record (`docker inspect`, and the limits a later start recreates) says the same; a start of the
//! agent waits for it.
//!
//! Only where the result is certain: a container of the `runc` runtime whose cgroups, as its init process
//! lists them in `/proc/<pid>/cgroup`, are directories under `/sys/fs/cgroup` that name the container's id
//! (cgroup v1 with the `cpu`, `memory` and `pids` controllers, or the unified v2 hierarchy). Anything else
//! (another runtime, a private cgroup namespace, a missing controller or file) answers
//! [`Written::NotHere`] before writing anything, and the caller uses the engine.
// enforces: S1

use std::path::{Path, PathBuf};

use super::handout::Limits;
use crate::error::{Error, Result};

/// Where the host's cgroup hierarchies are mounted.
pub(crate) const ROOT: &str = "/sys/fs/cgroup";

/// CFS period the engine uses for `NanoCpus` (100 ms, in µs).
const CFS_PERIOD_US: i64 = 100_000;

/// Whether the limits were written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// Every limit is in the container's cgroups.
    Done,
    /// Not a layout this module writes (nothing was written): use the engine.
    NotHere,
}

/// Where a container's cgroup files are.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    /// cgroup v1: one directory per controller.
    V1 {
        cpu: PathBuf,
        memory: PathBuf,
        pids: PathBuf,
    },
    /// cgroup v2: one directory.
    V2(PathBuf),
}

/// Write `limits` into the cgroups of the container `id` whose init process is `pid`.
///
/// # Errors
/// When a write fails after the layout was found (the caller falls back to the engine, which sets them all).
pub(crate) fn write(root: &Path, id: &str, pid: u32, limits: Limits) -> Result<Written> {
    let Ok(listing) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return Ok(Written::NotHere);
    };
    let Some(layout) = layout(root, &listing, id) else {
        return Ok(Written::NotHere);
    };
    apply(&layout, limits)?;
    Ok(Written::Done)
}

/// The container's cgroup directories from its `/proc/<pid>/cgroup` listing, if they are certain: every
/// path names the container id, none climbs (`..`), and each directory exists under `root`.
fn layout(root: &Path, listing: &str, id: &str) -> Option<Layout> {
    if id.len() < 12 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut cpu = None;
    let mut memory = None;
    let mut pids = None;
    let mut unified = None;
    for line in listing.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        let relative = path.strip_prefix('/')?;
        if relative.split('/').any(|c| c == ".." || c == ".") || !path.contains(id) {
            // A cgroup outside the container's own (systemd's name=systemd, or a private namespace's view).
            continue;
        }
        if controllers.is_empty() {
            unified = Some(root.join(relative));
            continue;
        }
        let dir = root.join(controllers).join(relative);
        for controller in controllers.split(',') {
            match controller {
                "cpu" => cpu = Some(dir.clone()),
                "memory" => memory = Some(dir.clone()),
                "pids" => pids = Some(dir.clone()),
                _ => {}
            }
        }
    }
    let layout = match (cpu, memory, pids, unified) {
        (Some(cpu), Some(memory), Some(pids), _) => Layout::V1 { cpu, memory, pids },
        (None, None, None, Some(dir)) => Layout::V2(dir),
        _ => return None,
    };
    let files: Vec<PathBuf> = match &layout {
        Layout::V1 { cpu, memory, pids } => vec![
            cpu.join("cpu.cfs_quota_us"),
            memory.join("memory.limit_in_bytes"),
            pids.join("pids.max"),
        ],
        Layout::V2(dir) => vec![dir.join("cpu.max"), dir.join("memory.max"), dir.join("pids.max")],
    };
    files.iter().all(|f| f.is_file()).then_some(layout)
}

fn apply(layout: &Layout, limits: Limits) -> Result<()> {
    // NanoCpus as the engine turns it into a CFS quota (runc: quota = nano * period / 1e9).
    let quota = limits.nano_cpus.saturating_mul(CFS_PERIOD_US) / 1_000_000_000;
    match layout {
        Layout::V1 { cpu, memory, pids } => {
            put(&cpu.join("cpu.cfs_period_us"), CFS_PERIOD_US)?;
            put(&cpu.join("cpu.cfs_quota_us"), quota)?;
            // memory.memsw (memory + swap) must stay ≥ memory at every step: raise it first when the
            // limit grows, lower it last when it shrinks. Without swap accounting there is no such file.
            let memsw = memory.join("memory.memsw.limit_in_bytes");
            let current = read_number(&memory.join("memory.limit_in_bytes"));
            let growing = current.is_none_or(|c| limits.memory > c);
            if memsw.is_file() && growing {
                put(&memsw, limits.memory)?;
            }
            put(&memory.join("memory.limit_in_bytes"), limits.memory)?;
            if memsw.is_file() && !growing {
                put(&memsw, limits.memory)?;
            }
            put(&pids.join("pids.max"), limits.pids)
        }
        Layout::V2(dir) => {
            put_text(&dir.join("cpu.max"), &format!("{quota} {CFS_PERIOD_US}"))?;
            put(&dir.join("memory.max"), limits.memory)?;
            // Memory and swap together equal the memory limit: no swap.
            let swap = dir.join("memory.swap.max");
            if swap.is_file() {
                put(&swap, 0)?;
            }
            put(&dir.join("pids.max"), limits.pids)
        }
    }
}

fn read_number(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn put(path: &Path, value: i64) -> Result<()> {
    put_text(path, &value.to_string())
}

fn put_text(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).map_err(|e| Error::io(format!("write {value} to {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const ID: &str = "4c5e0f7d2a1b9e8c7d6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d";

    fn files(root: &Path, dirs: &[&str], names: &[&str]) {
        for dir in dirs {
            std::fs::create_dir_all(root.join(dir)).unwrap();
            for name in names {
                std::fs::write(root.join(dir).join(name), "max").unwrap();
            }
        }
    }

    fn limits() -> Limits {
        Limits {
            nano_cpus: 500_000_000,
            memory: 256 << 20,
            pids: 128,
        }
    }

    #[test]
    fn v1_limits_land_in_each_controllers_directory() {
        let root = tempfile::tempdir().unwrap();
        let cpu = format!("cpu,cpuacct/docker/{ID}");
        let memory = format!("memory/docker/{ID}");
        let pids = format!("pids/docker/{ID}");
        files(root.path(), &[&cpu], &["cpu.cfs_quota_us", "cpu.cfs_period_us"]);
        files(
            root.path(),
            &[&memory],
            &["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"],
        );
        std::fs::write(
            root.path().join(&memory).join("memory.limit_in_bytes"),
            "1073741824",
        )
        .unwrap();
        files(root.path(), &[&pids], &["pids.max"]);
        let listing = format!(
            "12:pids:/docker/{ID}\n5:cpu,cpuacct:/docker/{ID}\n4:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/system.slice/containerd.service\n"
        );
        let layout = layout(root.path(), &listing, ID).expect("a v1 layout");
        apply(&layout, limits()).unwrap();
        let read = |p: String| std::fs::read_to_string(root.path().join(p)).unwrap();
        assert_eq!(read(format!("{cpu}/cpu.cfs_quota_us")), "50000");
        assert_eq!(read(format!("{cpu}/cpu.cfs_period_us")), "100000");
        assert_eq!(read(format!("{memory}/memory.limit_in_bytes")), "268435456");
        assert_eq!(read(format!("{memory}/memory.memsw.limit_in_bytes")), "268435456");
        assert_eq!(read(format!("{pids}/pids.max")), "128");
    }

    #[test]
    fn v2_limits_land_in_the_unified_directory() {
        let root = tempfile::tempdir().unwrap();
        let dir = format!("system.slice/docker-{ID}.scope");
        files(
            root.path(),
            &[&dir],
            &["cpu.max", "memory.max", "memory.swap.max", "pids.max"],
        );
        let layout = layout(root.path(), &format!("0::/{dir}\n"), ID).expect("a v2 layout");
        apply(&layout, limits()).unwrap();
        let read = |n: &str| std::fs::read_to_string(root.path().join(&dir).join(n)).unwrap();
        assert_eq!(read("cpu.max"), "50000 100000");
        assert_eq!(read("memory.max"), "268435456");
        assert_eq!(read("memory.swap.max"), "0");
        assert_eq!(read("pids.max"), "128");
    }

    /// Anything uncertain is left to the engine: paths that climb, that do not name the container, missing
    /// controllers or files, a malformed listing, an id that is not one.
    #[test]
    fn an_uncertain_layout_is_left_to_the_engine() {
        let root = tempfile::tempdir().unwrap();
        files(root.path(), &[&format!("pids/docker/{ID}")], &["pids.max"]);
        files(
            root.path(),
            &[&format!("memory/docker/{ID}")],
            &["memory.limit_in_bytes"],
        );
        let cases = [
            // No cpu controller for the container.
            format!("12:pids:/docker/{ID}\n4:memory:/docker/{ID}\n"),
            // Climbing out.
            format!("12:pids:/../docker/{ID}\n5:cpu,cpuacct:/../docker/{ID}\n4:memory:/../docker/{ID}\n"),
            // Another container's cgroups.
            "12:pids:/docker/abcdef0123456789\n5:cpu,cpuacct:/docker/abcdef0123456789\n4:memory:/docker/abcdef0123456789\n".to_owned(),
            // The files do not exist (cpu directory missing).
            format!("12:pids:/docker/{ID}\n5:cpu,cpuacct:/docker/{ID}\n4:memory:/docker/{ID}\n"),
            "garbage".to_owned(),
            String::new(),
        ];
        for listing in &cases {
            assert_eq!(layout(root.path(), listing, ID), None, "{listing}");
        }
        assert_eq!(
            layout(root.path(), &format!("12:pids:/docker/{ID}\n"), "not-an-id"),
            None
        );
        assert_eq!(
            write(root.path(), ID, u32::MAX, limits()).unwrap(),
            Written::NotHere
        );
    }
}
