//! R1, the terminal: the command runs in a session of its own and never shares the caller's controlling
//! terminal, so TIOCSTI (which `dev.tty.legacy_tiocsti=1` still allows on one's controlling terminal)
//! cannot push keystrokes into the caller's shell. When agenthold's stdin is a terminal it relays a pty of
//! the jail's own (raw mode on the caller's side, restored on every way out, window size followed).
//!
//! These tests play the caller's terminal emulator: they open a pty, make its slave the controlling
//! terminal of a new session (`setsid -w -c`) in which agenthold runs, and read what reaches the slave's
//! input queue, which is what the caller's shell would read once agenthold returns.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::termios::{Termios, Winsize, tcgetattr, tcsetwinsize};

use super::{as_caller, writable_dir};
use crate::support::{Env, Run, wait_exit};

/// A pty pair the test holds: the master (the terminal emulator's side) and the slave (the caller's
/// terminal), with everything written to the master's side collected by a thread.
struct Terminal {
    master: Arc<File>,
    slave: OwnedFd,
    output: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Terminal {
    fn open(rows: u16, cols: u16) -> Self {
        use rustix::pty::OpenptFlags;
        let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
        let master = rustix::pty::openpt(flags).unwrap();
        rustix::pty::grantpt(&master).unwrap();
        rustix::pty::unlockpt(&master).unwrap();
        let slave = rustix::pty::ioctl_tiocgptpeer(&master, flags).unwrap();
        let master = Arc::new(File::from(master));
        let terminal = Self {
            master: Arc::clone(&master),
            slave,
            output: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(AtomicBool::new(false)),
            reader: None,
        };
        terminal.resize(rows, cols);
        terminal
    }

    /// Start collecting what is written to the terminal (a full pty would block the writer).
    fn start_reading(&mut self) {
        let (master, output, stop) = (
            Arc::clone(&self.master),
            Arc::clone(&self.output),
            Arc::clone(&self.stop),
        );
        self.reader = Some(std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !stop.load(Ordering::SeqCst) {
                let mut fds = [nix::poll::PollFd::new(
                    master.as_fd(),
                    nix::poll::PollFlags::POLLIN,
                )];
                if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(50u8)).unwrap_or(0) == 0 {
                    continue;
                }
                match (&*master).read(&mut buf) {
                    Ok(0) | Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    Ok(n) => output.lock().unwrap().extend_from_slice(&buf[..n]),
                }
            }
        }));
    }

    fn stop_reading(&mut self) -> String {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Sets the window size, as a terminal emulator does when its window changes (the kernel then sends
    /// SIGWINCH to the foreground process group).
    fn resize(&self, rows: u16, cols: u16) {
        let size = Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        tcsetwinsize(&*self.master, size).unwrap();
    }

    /// Types `bytes` into the terminal.
    fn type_in(&self, bytes: &[u8]) {
        (&*self.master).write_all(bytes).unwrap();
    }

    /// The terminal's input, output, control and local modes (raw mode clears several of them).
    fn modes(&self) -> (u32, u32, u32, u32) {
        let t: Termios = tcgetattr(&self.slave).unwrap();
        (
            t.input_modes.bits(),
            t.output_modes.bits(),
            t.control_modes.bits(),
            t.local_modes.bits(),
        )
    }

    fn stdio(&self) -> Stdio {
        Stdio::from(self.slave.try_clone().unwrap())
    }

    /// What waits in the slave's input queue: what the caller's shell would read next. Canonical mode:
    /// the probes inject whole lines.
    fn pending_input(&self) -> String {
        let fd = self.slave.try_clone().unwrap();
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags)).unwrap();
        let mut file = File::from(fd);
        let mut pending = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = file.read(&mut buf) {
            if n == 0 {
                break;
            }
            pending.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&pending).into_owned()
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.stop_reading();
    }
}

/// Whether stdin of agenthold is the terminal (then agenthold relays a pty) or `/dev/null` (then stdout
/// and stderr still are the terminal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stdin {
    Terminal,
    Null,
}

/// Starts `run` as the leader of a new session whose controlling terminal is `terminal`'s slave, with
/// stdout and stderr on it, and stdin on it or on /dev/null.
fn spawn_on(terminal: &Terminal, run: &Run<'_>, stdin: Stdin, command: &[&str]) -> tokio::process::Child {
    // `setsid -c` takes the controlling terminal from its stdin; a shell then moves stdin to /dev/null.
    let wrapper: &[&str] = match stdin {
        Stdin::Terminal => &["setsid", "-w", "-c"],
        Stdin::Null => &["setsid", "-w", "-c", "sh", "-c", "exec \"$0\" \"$@\" </dev/null"],
    };
    let mut cmd = run.wrapped(wrapper, command);
    cmd.stdin(terminal.stdio())
        .stdout(terminal.stdio())
        .stderr(terminal.stdio());
    cmd.spawn().expect("start setsid agenthold")
}

/// Every way a command may push keystrokes: TIOCSTI on fds 0, 1, 2 and on /dev/tty. Writes `NAME=injected`
/// or `NAME=<error>` for each to the file `argv[2]` (stdout and stderr stay on the terminal).
const TIOCSTI_PY: &str = r#"
import fcntl, os, sys, termios
line = ("echo " + sys.argv[1] + "\n").encode()
def inject(fd, name):
    try:
        for b in line:
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([b]))
        return name + "=injected"
    except OSError as e:
        return "%s=%s" % (name, e.strerror.replace(" ", "_"))
out = [inject(fd, "fd%d" % fd) for fd in (0, 1, 2)]
try:
    out.append(inject(os.open("/dev/tty", os.O_RDWR), "devtty"))
except OSError as e:
    out.append("devtty=" + e.strerror.replace(" ", "_"))
with open(sys.argv[2], "w") as f:
    f.write(" ".join(out) + "\n")
"#;

/// The command's report: `KEY=VALUE` words of the results file.
fn report(text: &str) -> std::collections::BTreeMap<String, String> {
    text.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A script that tries every TIOCSTI and reports its own session and terminal into `out/results`.
fn tiocsti_script(env: &Env, marker: &str) -> String {
    let py = env.path("tiocsti.py");
    std::fs::write(&py, TIOCSTI_PY).unwrap();
    format!(
        "/usr/bin/python3 {py} {marker} out/results; \
         echo pid=$$ sid=$(ps -o sid= -p $$ | tr -d ' ') tty=$(ps -o tty= -p $$ | tr -d ' ') >> out/results",
        py = py.display()
    )
}

/// Waits (at most 30 s) for `child`; panics with what the terminal showed if it takes longer.
async fn finish_on(terminal: &mut Terminal, mut child: tokio::process::Child) -> Option<i32> {
    match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
        Ok(status) => status.unwrap().code(),
        Err(_) => {
            let _ = child.kill().await;
            panic!("agenthold did not finish; terminal:\n{}", terminal.stop_reading());
        }
    }
}

// covers: R1 (own session: TIOCSTI from the jail never reaches the caller's terminal, whether agenthold's
// stdin is the terminal or only its stdout and stderr are)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn tiocsti_never_reaches_the_callers_terminal() {
    let env = Env::new().await;
    for caller in [false, true] {
        for stdin in [Stdin::Terminal, Stdin::Null] {
            let who = format!(
                "{} with stdin {stdin:?}",
                if caller { "sudo caller" } else { "root" }
            );
            let marker = format!("INJECTED-{}-{}", env.https.port(), u8::from(caller));
            let results = writable_dir(&env).join("results");
            let _ = std::fs::remove_file(&results);
            let mut terminal = Terminal::open(24, 80);
            let before = terminal.modes();
            terminal.start_reading();
            let run = if caller { as_caller(env.run()) } else { env.run() };
            let script = tiocsti_script(&env, &marker);
            let child = spawn_on(&terminal, &run, stdin, &["sh", "-c", &script]);
            let code = finish_on(&mut terminal, child).await;
            let shown = terminal.stop_reading();
            let pending = terminal.pending_input();
            let text = std::fs::read_to_string(&results).unwrap_or_default();
            assert_eq!(code, Some(0), "{who}: terminal:\n{shown}\nresults: {text}");
            assert!(
                !pending.contains(&marker),
                "{who}: keystrokes from the jail reached the caller's terminal: {pending:?} ({text})"
            );
            let r = report(&text);
            assert_eq!(
                r.get("sid"),
                r.get("pid"),
                "{who}: the command is not the leader of its own session: {text}"
            );
            match stdin {
                // The jail's own pty: its controlling terminal, but not the caller's.
                Stdin::Terminal => assert!(
                    r.get("tty").is_some_and(|t| t.starts_with("pts/")),
                    "{who}: {text}"
                ),
                // No controlling terminal at all: TIOCSTI on the caller's terminal (fds 1 and 2) is refused.
                Stdin::Null => {
                    assert_eq!(r.get("tty").map(String::as_str), Some("?"), "{who}: {text}");
                    for name in ["fd1", "fd2", "devtty"] {
                        assert_ne!(r.get(name).map(String::as_str), Some("injected"), "{who}: {text}");
                    }
                }
            }
            assert_eq!(
                terminal.modes(),
                before,
                "{who}: the caller's terminal modes were not restored"
            );
        }
    }
}

// covers: R1 (own session also without any terminal: plain pipes, as in scripts and CI)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn own_session_without_a_terminal() {
    let env = Env::new().await;
    for caller in [false, true] {
        let run = if caller { as_caller(env.run()) } else { env.run() };
        let out = run
            .sh("echo pid=$$ sid=$(ps -o sid= -p $$ | tr -d ' ') tty=$(ps -o tty= -p $$ | tr -d ' ')")
            .await;
        out.expect_code(0);
        let r = report(&out.stdout);
        assert_eq!(r.get("sid"), r.get("pid"), "{out:#?}");
        assert_eq!(r.get("tty").map(String::as_str), Some("?"), "{out:#?}");
    }
}

/// Waits (at most 10 s) for `path` to hold a line; returns it trimmed.
async fn wait_line(path: &Path, terminal: &mut Terminal) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text.trim().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear; terminal:\n{}",
            path.display(),
            terminal.stop_reading()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// covers: R1 (the relayed pty: the caller's window size at the start and after a resize, Ctrl-C reaching
// the command through the jail's terminal, output and exit code)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn relayed_terminal_follows_size_and_passes_ctrl_c() {
    let env = Env::new().await;
    let mut terminal = Terminal::open(33, 101);
    let before = terminal.modes();
    terminal.start_reading();
    let script = "stty size > size1; trap 'stty size > size2' WINCH; trap 'echo interrupted; exit 9' INT; \
                  echo ready > ready; while :; do sleep 0.05; done";
    let run = env.run();
    let child = spawn_on(&terminal, &run, Stdin::Terminal, &["sh", "-c", script]);
    wait_line(&env.path("ready"), &mut terminal).await;
    assert_eq!(wait_line(&env.path("size1"), &mut terminal).await, "33 101");
    terminal.resize(40, 120);
    assert_eq!(wait_line(&env.path("size2"), &mut terminal).await, "40 120");
    terminal.type_in(b"\x03");
    let code = finish_on(&mut terminal, child).await;
    let shown = terminal.stop_reading();
    assert_eq!(code, Some(9), "terminal:\n{shown}");
    assert!(shown.contains("interrupted"), "terminal:\n{shown}");
    assert_eq!(terminal.modes(), before, "terminal modes not restored");
}

// covers: R1 (raw mode on the caller's terminal is undone when agenthold is stopped by a signal)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn terminal_modes_are_restored_after_sigterm() {
    let env = Env::new().await;
    let mut terminal = Terminal::open(24, 80);
    let before = terminal.modes();
    terminal.start_reading();
    let run = env.run();
    let mut child = spawn_on(
        &terminal,
        &run,
        Stdin::Terminal,
        &["sh", "-c", "echo ready > ready; sleep 30"],
    );
    wait_line(&env.path("ready"), &mut terminal).await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let code = wait_exit(&mut child).await;
    terminal.stop_reading();
    assert_eq!(code, Some(128 + 15));
    assert_eq!(terminal.modes(), before, "terminal modes not restored");
}
