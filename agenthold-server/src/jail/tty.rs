//! The terminal (R1). The command never gets the caller's terminal as its controlling terminal: it runs
//! in a session of its own, so TIOCSTI (pushing keystrokes into a terminal's input, still allowed on
//! one's controlling terminal where `dev.tty.legacy_tiocsti` is 1) cannot reach the caller's shell.
//!
//! When agenthold's stdin is a terminal (and agenthold runs in its foreground), the command gets a pty
//! of the jail's own devpts instead, and stage 1, outside the jail's PID namespace, relays bytes between
//! the caller's terminal and that pty's master: agenthold puts the caller's terminal in raw mode
//! ([`RawTerminal`], restored on every way out agenthold survives), the jail's pty does the line
//! discipline (echo, Ctrl-C as SIGINT to the command), and SIGWINCH copies the caller's window size.
// enforces: R1

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};

use anyhow::{Context, Result};
use rustix::termios::{OptionalActions, Termios, isatty, tcgetattr, tcgetwinsize, tcsetattr, tcsetwinsize};

/// The caller's terminal in raw mode while the command runs; its modes come back when dropped.
pub(crate) struct RawTerminal {
    saved: Termios,
}

impl RawTerminal {
    /// Raw mode on agenthold's stdin, if it is a terminal whose foreground agenthold is in (a background
    /// job would be stopped for touching it): then the jail relays a pty. `None` otherwise.
    pub(crate) fn enter() -> Option<Self> {
        let stdin = std::io::stdin();
        if !isatty(&stdin) {
            return None;
        }
        let foreground = rustix::termios::tcgetpgrp(&stdin).ok()?;
        if foreground != rustix::process::getpgrp() {
            return None;
        }
        let saved = tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        tcsetattr(&stdin, OptionalActions::Now, &raw).ok()?;
        Some(Self { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Err(e) = tcsetattr(std::io::stdin(), OptionalActions::Now, &self.saved) {
            tracing::warn!(error = %e, "could not restore the terminal's modes");
        }
    }
}

/// A pty of the jail's devpts: the master stays with stage 1, the slave goes to the command.
pub(super) struct Pty {
    master: Arc<File>,
    /// The slave, for the jail's stdio.
    pub(super) slave: OwnedFd,
    /// The slave's path inside the jail (`/dev/pts/N`).
    pub(super) path: PathBuf,
}

impl Pty {
    /// Open a pty through `ptmx` (the jail's `/dev/pts/ptmx`), give its slave to `owner`, and copy the
    /// caller's window size.
    pub(super) fn open(ptmx: &Path, owner: Option<(u32, u32)>) -> Result<Self> {
        let master = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NOCTTY.bits())
            .open(ptmx)
            .with_context(|| format!("open {}", ptmx.display()))?;
        rustix::pty::unlockpt(&master).context("unlock the jail's pty")?;
        let name = rustix::pty::ptsname(&master, Vec::new()).context("name the jail's pty")?;
        use rustix::pty::OpenptFlags;
        let slave = rustix::pty::ioctl_tiocgptpeer(
            &master,
            OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC,
        )
        .context("open the jail's pty")?;
        if let Some((uid, gid)) = owner {
            nix::unistd::fchown(
                &slave,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .context("give the pty to the caller")?;
        }
        use std::os::unix::ffi::OsStrExt;
        let pty = Self {
            master: Arc::new(master),
            slave,
            path: PathBuf::from(std::ffi::OsStr::from_bytes(name.as_bytes())),
        };
        pty.resizer().follow_window_size();
        Ok(pty)
    }

    /// A handle for the signal thread's SIGWINCH.
    pub(super) fn resizer(&self) -> Resizer {
        Resizer(Arc::clone(&self.master))
    }

    /// Start the relay: the caller's input to the pty, the pty's output to the caller's terminal. The
    /// receiver gets a message once all output is through (every slave closed, when the jail ends).
    /// Threads, because stage 1 may not create any after it unshares its PID namespace.
    pub(super) fn relay(&self) -> Result<Receiver<()>> {
        let input = Arc::clone(&self.master);
        std::thread::Builder::new()
            .name("pty-in".into())
            .spawn(move || copy_input(&input))
            .context("start the terminal relay")?;
        let output = Arc::clone(&self.master);
        let (done, finished) = channel();
        std::thread::Builder::new()
            .name("pty-out".into())
            .spawn(move || {
                copy_output(&output);
                let _ = done.send(());
            })
            .context("start the terminal relay")?;
        Ok(finished)
    }
}

/// The master of the jail's pty, for SIGWINCH.
pub(super) struct Resizer(Arc<File>);

impl Resizer {
    /// Copy the caller's window size to the jail's pty (the kernel then sends the command SIGWINCH).
    pub(super) fn follow_window_size(&self) {
        if let Ok(size) = tcgetwinsize(std::io::stdin()) {
            let _ = tcsetwinsize(&*self.0, size);
        }
    }
}

/// The caller's keystrokes (stdin, raw) into the jail's pty, until either side closes.
fn copy_input(master: &File) {
    let stdin = std::io::stdin();
    let mut buf = [0u8; 4096];
    loop {
        match nix::unistd::read(stdin.as_fd(), &mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if (&*master).write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// The jail's pty output to the caller's terminal (stdout, or stderr when only that is a terminal),
/// until every slave is closed (EIO).
fn copy_output(mut master: &File) {
    let to_stdout = isatty(std::io::stdout()) || !isatty(std::io::stderr());
    let mut buf = [0u8; 16384];
    loop {
        match master.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let written = if to_stdout {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&buf[..n]).and_then(|()| out.flush())
                } else {
                    std::io::stderr().lock().write_all(&buf[..n])
                };
                if written.is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}
