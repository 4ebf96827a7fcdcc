//! Signal delivery without handlers: the signals sandboxd cares about are blocked and read from a `signalfd`,
//! which keeps the code free of `unsafe` and of async-signal-safety rules. Blocked signals are also what makes
//! PID 1 receive them: the kernel drops signals to a namespace's init only when they would take the default
//! action. `std::process::Command` resets the signal mask in children, so spawned commands start clean.

use std::os::fd::AsFd as _;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

/// A set of blocked signals and the descriptor they are read from.
#[derive(Debug)]
pub(crate) struct Signals {
    /// Non-blocking, close-on-exec signalfd for the set.
    fd: SignalFd,
}

impl Signals {
    /// Blocks `signals` in the calling thread and opens a signalfd for them. Call it on the main thread before
    /// any other thread exists, so that every thread inherits the mask and no signal runs a default action.
    pub(crate) fn block(signals: &[Signal]) -> nix::Result<Self> {
        let mut set = SigSet::empty();
        for &signal in signals {
            set.add(signal);
        }
        set.thread_block()?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        Ok(Self { fd })
    }

    /// Waits for the next signal, at most `timeout` (forever when `None`). Returns `None` on timeout.
    pub(crate) fn next(&self, timeout: Option<Duration>) -> nix::Result<Option<Signal>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(info) = self.fd.read_signal()? {
                // A signal number the kernel handed us is always valid; skip it rather than fail if not.
                if let Ok(signal) = Signal::try_from(i32::try_from(info.ssi_signo).unwrap_or(0)) {
                    return Ok(Some(signal));
                }
                continue;
            }
            let wait = match deadline {
                None => PollTimeout::NONE,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    // Round up so that a sub-millisecond remainder does not spin.
                    PollTimeout::try_from(left + Duration::from_micros(999)).unwrap_or(PollTimeout::MAX)
                }
            };
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, wait) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(err) => return Err(err),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_out_without_signals() {
        // SIGWINCH is ignored by default; blocking it in this test thread affects nothing else.
        let signals = Signals::block(&[Signal::SIGWINCH]).expect("signalfd");
        let start = Instant::now();
        assert_eq!(signals.next(Some(Duration::from_millis(30))).expect("wait"), None);
        assert!(start.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn reads_a_thread_directed_signal() {
        let signals = Signals::block(&[Signal::SIGURG]).expect("signalfd");
        nix::sys::pthread::pthread_kill(nix::sys::pthread::pthread_self(), Signal::SIGURG).expect("raise");
        assert_eq!(
            signals.next(Some(Duration::from_secs(5))).expect("wait"),
            Some(Signal::SIGURG)
        );
    }
}
