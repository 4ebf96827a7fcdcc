//! Integration tests of the built `sandboxd` binary, run as a child process (not as PID 1) with `--root` pointing
//! at a temporary directory. Everything stays on loopback. The Docker test is `#[ignore]`d and run by
//! `make test` (`--include-ignored`).
// Test code: a failed setup step should stop the test right there, with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod boot;
mod docker;
mod run;
mod send;
mod tunnel;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use sandboxd::contract;

/// A token as the runtime writes it.
pub(crate) const TOKEN: &str = "5f2b8c0e9a7d4163b1e0c2d4f6a8b0c1d3e5f7a9b1c3d5e7f9a1b3c5d7e9f0a2";

/// A fake sandbox file system: a temporary directory used as `--root`.
pub(crate) struct Root {
    /// Keeps the directory alive.
    dir: tempfile::TempDir,
}

impl Root {
    /// An empty root with `/.agenthold` in it.
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(&contract::DIR[1..])).unwrap();
        Self { dir }
    }

    /// The real location of the absolute path `abs` inside this root.
    pub(crate) fn path(&self, abs: &str) -> PathBuf {
        self.dir.path().join(abs.trim_start_matches('/'))
    }

    /// Writes `contents` at the absolute path `abs` inside this root, creating parents.
    pub(crate) fn write(&self, abs: &str, contents: impl AsRef<[u8]>) {
        let path = self.path(abs);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }

    /// Reads the absolute path `abs` inside this root as text.
    pub(crate) fn read(&self, abs: &str) -> String {
        std::fs::read_to_string(self.path(abs)).unwrap()
    }

    /// `sandboxd --root <root> ARGS...`.
    pub(crate) fn sandboxd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxd"));
        cmd.arg("--root").arg(self.dir.path()).args(args);
        // Never inherit a tunnel address from the environment running the tests; keep expected messages out of
        // the test output (tests that look at stderr capture it).
        cmd.env_remove(contract::ENV_TUNNEL)
            .env_remove(contract::ENV_AGENT)
            .stderr(std::process::Stdio::null());
        cmd
    }
}

/// A child process that is killed and reaped if the test ends early.
pub(crate) struct Guard(pub(crate) Child);

impl Guard {
    /// Spawns `cmd`.
    pub(crate) fn spawn(cmd: &mut Command) -> Self {
        Self(cmd.spawn().unwrap())
    }

    /// The child's pid.
    pub(crate) fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.0.id()).unwrap())
    }

    /// Sends `signal` to the child.
    pub(crate) fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(self.pid(), signal).unwrap();
    }

    /// Waits at most `limit` for the child to exit.
    pub(crate) fn wait_for(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < limit, "child still running after {limit:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `check` every 10 ms until it returns true, failing after `limit`.
pub(crate) fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` exists and is not a zombie.
pub(crate) fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Children of `pid` as (pid, state, command name), from /proc.
pub(crate) fn children_of(pid: Pid) -> Vec<(i32, char, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head
            .split_once('(')
            .map(|(_, n)| n.to_owned())
            .unwrap_or_default();
        let mut fields = rest.split_whitespace();
        let state = fields.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid: i32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == pid.as_raw() {
            out.push((child, state, name));
        }
    }
    out
}

/// Reads a pid written by a test script into `path`, once the file is complete.
pub(crate) fn read_pid(path: &Path) -> i32 {
    let mut pid = 0;
    eventually(Duration::from_secs(5), "a pid file", || {
        pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        pid > 0
    });
    pid
}

/// Runs `check` on every file under `fuzz/regressions/<target>` and `fuzz/seeds/<target>` (at least one).
pub(crate) fn replay_fuzz_inputs(target: &str, check: fn(&[u8])) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut replayed = 0;
    for kind in ["regressions", "seeds"] {
        let Ok(entries) = std::fs::read_dir(root.join(kind).join(target)) else {
            continue;
        };
        for entry in entries.flatten() {
            let data = std::fs::read(entry.path()).unwrap();
            eprintln!("replaying {}", entry.path().display());
            check(&data);
            replayed += 1;
        }
    }
    assert!(replayed > 0, "no seeds found under fuzz/{target}");
}
