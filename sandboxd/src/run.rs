//! `run` (the wrapper of every `docker exec`: process group, timeout, exit status, cancel record; its command
//! given as arguments or, for a `run` started ahead, as a request on stdin) and `kill`
//! (cancel by exec id). The record `/.agenthold/run/<ID>.pid` holds the command's process group id; a
//! `<ID>.cancel` marker covers a `kill` that arrives before `run` has written it.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::fd::AsFd as _;
use std::os::unix::ffi::OsStringExt as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;
use sandboxd::contract::request::{self, Request};

use crate::boot::exit_code;
use crate::cli::RunOptions;
use crate::layout::{Layout, RUN_DIR, write_atomic};
use crate::log;
use crate::signals::Signals;
use crate::spawn;

/// Exit status when sandboxd itself fails in `run` (as coreutils `timeout`).
pub(crate) const EXIT_SANDBOXD: i32 = 125;
/// Exit status on timeout (as coreutils `timeout`).
const EXIT_TIMEOUT: i32 = 124;
/// Exit status of a command cancelled before it started (as if SIGKILLed).
const EXIT_CANCELLED: i32 = 128 + Signal::SIGKILL as i32;

/// Creates `/.agenthold/run` (0700) if needed and checks that it is a real directory owned by us and not
/// writable by others, so a record cannot be redirected by whoever else can write there.
fn prepare_run_dir(layout: &Layout) -> std::io::Result<()> {
    let dir = layout.path(RUN_DIR);
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
    {
        Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => return Err(err),
        _ => {}
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    let ours = meta.uid() == nix::unistd::geteuid().as_raw();
    if !meta.file_type().is_dir() || !ours || meta.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a directory owned by uid {} and writable only by it",
            dir.display(),
            nix::unistd::geteuid()
        )));
    }
    Ok(())
}

/// Creates `path` afresh (never through an existing file or symlink) with `contents`, mode 0600.
fn create_record(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents)
}

/// Removes `path`, ignoring a missing file.
fn remove_quietly(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// Sends `signal` to process group `pgid`; a group that is already gone is not an error.
fn signal_group(pgid: Pid, signal: Signal) -> nix::Result<()> {
    match killpg(pgid, signal) {
        Err(Errno::ESRCH) => Ok(()),
        other => other,
    }
}

/// When stdin is our controlling terminal and we are its foreground group, hands the terminal to `pgid`, so an
/// interactive command can read it (`docker exec -t`). SIGTTOU is blocked, so we may do this from any group.
/// A command that touched the terminal before the hand-over was stopped by SIGTTIN/SIGTTOU: continue it.
fn give_terminal(pgid: Pid) {
    let stdin = std::io::stdin();
    let fd = stdin.as_fd();
    if !nix::unistd::isatty(fd).unwrap_or(false) {
        return;
    }
    if nix::unistd::tcgetpgrp(fd).ok() != Some(nix::unistd::getpgrp()) {
        return;
    }
    if nix::unistd::tcsetpgrp(fd, pgid).is_ok() {
        let _ = signal_group(pgid, Signal::SIGCONT);
    }
}

/// The command `run` starts: from its arguments, or from a request on stdin.
struct Command {
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: Option<OsString>,
    timeout: Option<Duration>,
}

/// Reads the request of `run --request-stdin` and acknowledges it ([`request::READY`] on stdout) before
/// anything else is written there. Reads from a duplicate of fd 0, unbuffered, so the command's own input
/// stays unread.
fn take_request() -> Result<Command, String> {
    let stdin = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("stdin: {e}"))?;
    let request = Request::read_from(&mut std::fs::File::from(stdin))?;
    let os = |bytes: Vec<u8>| OsString::from_vec(bytes);
    let command = Command {
        argv: request.argv.into_iter().map(os).collect(),
        env: request
            .env
            .into_iter()
            .map(|(name, value)| (os(name), os(value)))
            .collect(),
        cwd: request.cwd.map(os),
        timeout: request.timeout_ms.map(Duration::from_millis),
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&[request::READY])
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("acknowledging the request: {e}"))?;
    Ok(command)
}

/// `sandboxd run [--timeout-ms N] [--id ID] -- ARGV...` or `run --id ID --request-stdin`: see the crate docs.
pub(crate) fn run(layout: &Layout, opts: &RunOptions) -> i32 {
    let command = if opts.request_stdin {
        match take_request() {
            Ok(command) => command,
            Err(err) => {
                log!("run: {err}");
                return EXIT_SANDBOXD;
            }
        }
    } else {
        Command {
            argv: opts.argv.clone(),
            env: Vec::new(),
            cwd: None,
            timeout: opts.timeout,
        }
    };
    let deadline = command.timeout.map(|t| Instant::now() + t);
    let handled = [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGTTOU,
    ];
    let signals = match Signals::block(&handled) {
        Ok(signals) => signals,
        Err(err) => {
            log!("run: cannot set up signals: {err}");
            return EXIT_SANDBOXD;
        }
    };
    let record = opts
        .id
        .as_deref()
        .map(|id| (layout.pid_file(id), layout.cancel_file(id)));
    let mut recording = false;
    if let Some((_, cancel)) = &record {
        match prepare_run_dir(layout) {
            Ok(()) => recording = true,
            Err(err) => log!("run: cannot record the process group (cancel by id will not work): {err}"),
        }
        if recording && cancel.exists() {
            remove_quietly(cancel);
            return EXIT_CANCELLED;
        }
    }

    let Some(program) = command.argv.first() else {
        log!("run: missing command");
        return EXIT_SANDBOXD;
    };
    if let Some(cwd) = &command.cwd
        && let Err(err) = std::env::set_current_dir(cwd)
    {
        // As the engine's exec when its working directory is missing.
        log!("run: working directory {}: {err}", cwd.to_string_lossy());
        return spawn::EXIT_CANNOT_EXECUTE;
    }
    let pid = match spawn::spawn_with_env(&command.argv, spawn::Group::New, &command.env) {
        Ok(pid) => pid,
        Err(err) => {
            log!("run: {}: {err}", program.to_string_lossy());
            return spawn::error_code(err);
        }
    };
    give_terminal(pid);

    if let Some((pid_file, cancel)) = record.as_ref().filter(|_| recording) {
        // Atomically, so that `kill` never reads a half-written record.
        if let Err(err) = write_atomic(pid_file, format!("{pid}\n").as_bytes(), 0o600) {
            log!(
                "run: cannot record the process group in {}: {err}",
                pid_file.display()
            );
        }
        if cancel.exists() {
            let _ = signal_group(pid, Signal::SIGKILL);
        }
    }

    let mut timed_out = false;
    let status = loop {
        // Look without reaping: while the leader is a zombie its id cannot be reused, so the record is removed
        // before the id is released.
        match waitid(
            Id::Pid(pid),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        ) {
            Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => {}
            Ok(_) | Err(_) => {
                if let Some((pid_file, cancel)) = record.as_ref().filter(|_| recording) {
                    remove_quietly(pid_file);
                    remove_quietly(cancel);
                }
                break loop {
                    match waitpid(pid, None) {
                        Err(Errno::EINTR) => {}
                        other => break other,
                    }
                };
            }
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left.is_some_and(|l| l.is_zero()) && !timed_out {
            timed_out = true;
            if let Err(err) = signal_group(pid, Signal::SIGKILL) {
                log!("run: timeout: killing process group {pid}: {err}");
            }
        }
        let wait = if timed_out { None } else { left };
        match signals.next(wait) {
            Ok(Some(signal @ (Signal::SIGTERM | Signal::SIGINT | Signal::SIGHUP))) => {
                let _ = signal_group(pid, signal);
            }
            Ok(_) => {}
            Err(err) => {
                log!("run: reading signals: {err}");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    };
    if timed_out {
        return EXIT_TIMEOUT;
    }
    match status {
        Ok(status) => exit_code(status).unwrap_or(EXIT_SANDBOXD),
        Err(err) => {
            log!("run: waiting for {pid}: {err}");
            EXIT_SANDBOXD
        }
    }
}

/// `sandboxd kill --id ID`: SIGKILL the recorded process group; exit 0 when killed or already gone.
pub(crate) fn kill(layout: &Layout, id: &str) -> i32 {
    let pid_file = layout.pid_file(id);
    let read_record = || match std::fs::read_to_string(&pid_file) {
        Ok(text) => Some(text),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) => {
            log!("kill: {}: {err}", pid_file.display());
            Some(String::new())
        }
    };
    let text = match read_record() {
        Some(text) => text,
        None => {
            // Not recorded (yet, or any more): leave a marker for a `run` that is about to record, then look
            // again in case it recorded meanwhile. A marker for a finished run is cleared at the next boot.
            if let Err(err) =
                prepare_run_dir(layout).and_then(|()| create_record(&layout.cancel_file(id), b""))
            {
                log!("kill: cannot leave a cancel marker for {id}: {err}");
            }
            match read_record() {
                Some(text) => text,
                None => return 0,
            }
        }
    };
    let pgid = match text.trim().parse::<i32>() {
        Ok(pgid) if pgid > 1 => Pid::from_raw(pgid),
        _ => {
            log!("kill: {}: not a process group id", pid_file.display());
            return 1;
        }
    };
    match signal_group(pgid, Signal::SIGKILL) {
        Ok(()) => 0,
        Err(err) => {
            log!("kill: process group {pgid}: {err}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_dir_must_be_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::new(dir.path().to_owned());
        prepare_run_dir(&layout).expect("created");
        let run_dir = layout.path(RUN_DIR);
        assert_eq!(
            std::fs::metadata(&run_dir).expect("meta").permissions().mode() & 0o777,
            0o700
        );
        std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(prepare_run_dir(&layout).is_err());
    }

    #[test]
    fn records_are_never_written_through_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").expect("write");
        let link = dir.path().join("x.pid");
        std::os::unix::fs::symlink(&victim, &link).expect("symlink");
        create_record(&link, b"123\n").expect("record");
        assert_eq!(std::fs::read(&victim).expect("read"), b"keep");
        assert_eq!(std::fs::read(&link).expect("read"), b"123\n");
    }
}
