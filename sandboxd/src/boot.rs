//! PID 1 duties: `boot` (a sandbox's init: token, CA, tunnel, workload, reaping) and `hold` (the gateway
//! holder). Both sleep in a blocking read of their signalfd, so an idle sandboxd uses no CPU.

use std::ffi::OsString;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::layout::{BOOT_FILE, Layout, RUN_DIR};
use crate::signals::Signals;
use crate::{ca, log, relay, spawn, token, tunnel};

/// Default wait for the boot file (`AGENTHOLD_BOOT_WAIT_MS` overrides it in tests).
const BOOT_WAIT_MS: u64 = 30_000;
/// Exit status of `boot` when it cannot take a boot token.
const EXIT_NO_TOKEN: i32 = 1;

/// Exit code for a wait status: the code itself, or 128+N for a death by signal N.
pub(crate) fn exit_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, signal, _) => Some(128 + signal as i32),
        _ => None,
    }
}

/// Reaps every exited child. Returns the exit code of `watched` if it was among them.
fn reap_all(watched: Option<Pid>) -> Option<i32> {
    let mut result = None;
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return result,
            Ok(status) => {
                if status.pid().is_some() && status.pid() == watched {
                    result = exit_code(status);
                }
            }
            Err(Errno::EINTR) => {}
            Err(err) => {
                log!("waitpid: {err}");
                return result;
            }
        }
    }
}

/// `sandboxd hold`: sleep until SIGTERM or SIGINT (exit 0), reaping any child meanwhile.
pub(crate) fn hold() -> i32 {
    let signals = match Signals::block(&[Signal::SIGTERM, Signal::SIGINT, Signal::SIGCHLD]) {
        Ok(signals) => signals,
        Err(err) => {
            log!("hold: cannot set up signals: {err}");
            return 1;
        }
    };
    loop {
        match signals.next(None) {
            Ok(Some(Signal::SIGTERM | Signal::SIGINT)) => return 0,
            Ok(_) => {
                reap_all(None);
            }
            Err(err) => {
                log!("hold: reading signals: {err}");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// Removes the `run` records of the previous start: every exec died with the old PID 1.
fn clear_run_records(layout: &Layout) {
    let Ok(entries) = std::fs::read_dir(layout.path(RUN_DIR)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".pid") || name.ends_with(".cancel") || name.ends_with(".sandboxd-tmp") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// `sandboxd boot [-- CMD ARG...]`: see the crate docs for the steps.
pub(crate) fn boot(layout: &Layout, argv: &[OsString]) -> i32 {
    // Before any thread exists, so the tunnel thread inherits the mask.
    let signals = match Signals::block(&[Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGCHLD]) {
        Ok(signals) => signals,
        Err(err) => {
            log!("boot: cannot set up signals: {err}");
            return 1;
        }
    };
    // The token will live in this process's memory: keep /proc/1/mem and ptrace closed to the sandbox. The
    // flag is reset by execve, so the workload is unaffected.
    if let Err(err) = nix::sys::prctl::set_dumpable(false) {
        log!("boot: cannot make the process non-dumpable: {err}");
    }
    // As PID 1 orphans come to us anyway; under another init (`docker run --init`, tests) this keeps it so.
    if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
        log!("boot: cannot become a child subreaper: {err}");
    }

    let wait = std::env::var("AGENTHOLD_BOOT_WAIT_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    let wait = Duration::from_millis(wait.unwrap_or(BOOT_WAIT_MS).max(10));
    let boot_file = layout.path(BOOT_FILE);
    let token = match token::take(&boot_file, wait) {
        Ok(token) => token,
        Err(err) => {
            log!("boot: {}: {err}", boot_file.display());
            return EXIT_NO_TOKEN;
        }
    };

    let report = ca::install(layout);
    for problem in &report.problems {
        log!("boot: CA: {problem}");
    }

    let tunnel = match tunnel::TunnelConfig::from_env(token) {
        Ok(Some(cfg)) => {
            if let Err(err) = tunnel::spawn(cfg.clone()) {
                log!("boot: cannot start the tunnel thread: {err}");
            }
            Some(cfg)
        }
        Ok(None) => {
            log!("boot: AGENTHOLD_TUNNEL is not set: no tunnel");
            None
        }
        Err(err) => {
            log!("boot: no tunnel: {err}");
            None
        }
    };
    // Agent messages (P3): `agenthold-send` reaches PID 1 here; never fatal.
    if let Err(err) = relay::spawn(layout, tunnel) {
        log!("boot: agent messages unavailable: {err}");
    }

    clear_run_records(layout);

    let Some(program) = argv.first() else {
        return idle(&signals);
    };
    match spawn::spawn(argv, spawn::Group::Inherit) {
        Ok(pid) => supervise(&signals, pid),
        Err(err) => {
            log!("boot: {}: {err}", program.to_string_lossy());
            spawn::error_code(err)
        }
    }
}

/// No workload: wait for SIGTERM or SIGINT (exit 0), reaping orphans.
fn idle(signals: &Signals) -> i32 {
    loop {
        match signals.next(None) {
            Ok(Some(Signal::SIGTERM | Signal::SIGINT)) => return 0,
            Ok(Some(Signal::SIGCHLD)) => {
                reap_all(None);
            }
            Ok(_) => {}
            Err(err) => {
                log!("boot: reading signals: {err}");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// Forwards SIGTERM/SIGINT/SIGHUP to the workload `pid`, reaps every child, and returns the workload's exit
/// code once it ends.
fn supervise(signals: &Signals, pid: Pid) -> i32 {
    loop {
        match signals.next(None) {
            Ok(Some(Signal::SIGCHLD)) => {
                if let Some(code) = reap_all(Some(pid)) {
                    return code;
                }
            }
            Ok(Some(signal)) => {
                if let Err(err) = kill(pid, signal)
                    && err != Errno::ESRCH
                {
                    log!("boot: forwarding {signal} to the workload: {err}");
                }
            }
            Ok(None) => {}
            Err(err) => {
                log!("boot: reading signals: {err}");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        let pid = Pid::from_raw(42);
        assert_eq!(exit_code(WaitStatus::Exited(pid, 7)), Some(7));
        assert_eq!(
            exit_code(WaitStatus::Signaled(pid, Signal::SIGKILL, false)),
            Some(137)
        );
        assert_eq!(exit_code(WaitStatus::StillAlive), None);
    }
}
