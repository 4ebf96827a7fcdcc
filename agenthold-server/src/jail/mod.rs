//! The jail `agenthold run` puts a command in (R1–R3). Two re-executions of `agenthold`, so that all of
//! it stays in safe Rust (no `pre_exec` closure) and in short, linear functions:
//!
//! 1. `agenthold __jail …` enters the sandbox network namespace, makes its own mount and IPC namespaces,
//!    builds the jail's root ([`root`]: an allowlist of the host's file system), opens a pty of the
//!    jail's own when the caller's stdin is a terminal and relays it ([`tty`]), then makes a PID
//!    namespace, starts stage 2 in it and forwards signals to it. It stays outside the jail's PID
//!    namespace, where the command cannot see it.
//! 2. `agenthold __jail-init …` is PID 1 of the new PID namespace: it pivots into the jail's root (the
//!    host's root is detached), mounts a `/proc` that shows only the jail (kernel settings read-only),
//!    drops every capability (bounding set included), becomes the sudo caller when there is one
//!    (otherwise it stays uid 0 without any capability), sets `no_new_privs`, starts the command in a
//!    session of its own (its controlling terminal, if any, is the jail's pty) with no descriptor but
//!    stdin, stdout and stderr, forwards signals to it, reaps orphans, and exits with the command's
//!    status. When PID 1 exits the kernel kills everything left in the namespace, so nothing the command
//!    started in the background outlives the run.
//!
//! What the command sees (R2, [`view`] and [`root`]): the system directories (`/usr`, `/etc`, `/opt`,
//! `/bin`, `/lib*`) read-only through overlays, `/sys` read-only, a minimal `/dev` with its own pty
//! instance, `/proc` of its PID namespace, the working directory writable (without what is mounted below
//! it), and its own empty `/run`, `/tmp`, `/var/tmp`, `/dev/shm` and home (with `--share-home`, the
//! caller's home read through a private layer). Nothing else of the host: no other user's files, no
//! mount, device or Unix socket of the host (an overlay shows sockets as files of its own, so `connect()`
//! through it is refused; abstract sockets belong to the network namespace), no SysV IPC (own IPC
//! namespace). Agenthold's data directories, the master key file, the secrets file and the `--log` file
//! (R3) are covered wherever they would show through, and pinned against renames in the working
//! directory.
//!
//! What the command can no longer do: `setns` back to the host's network namespace (needs CAP_SYS_ADMIN),
//! change addresses or routes (CAP_NET_ADMIN), open raw sockets (CAP_NET_RAW), unmount or replace any of
//! the jail's mounts (CAP_SYS_ADMIN; in a user namespace of its own they are locked), regain capabilities
//! through setuid binaries (`no_new_privs`), change kernel settings (`/proc/sys` read-only), write
//! anywhere on the host but in the working directory, see or signal host processes (own PID namespace),
//! push keystrokes into the caller's terminal (own session), or reach host daemons.
//!
//! Started by root without sudo the command is uid 0 without capabilities: it may still read root-owned
//! files of the read-only system directories (`/etc/shadow`). Start agenthold through sudo to run the
//! command as yourself.
// enforces: R1 R2 R3

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};

mod fs;
mod root;
mod tty;
pub(crate) mod view;

pub(crate) use tty::RawTerminal;

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Gid, Pid, Uid, setgid, setgroups, setuid};

/// Where the CA bundle is inside the jail (on its private `/run`, readable by any user).
pub(crate) const JAIL_CA_BUNDLE: &str = "/run/agenthold/ca-bundle.pem";
/// Where the gateway's CA alone is inside the jail (beside the bundle; for `NODE_EXTRA_CA_CERTS`).
pub(crate) const JAIL_CA_CERT: &str = "/run/agenthold/ca.crt";

/// Everything the jail needs, passed on the hidden command line.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct JailArgs {
    /// Network namespace file to enter.
    #[arg(long)]
    netns: Option<PathBuf>,
    /// File to bind over /etc/resolv.conf.
    #[arg(long)]
    resolv: PathBuf,
    /// CA bundle (system roots plus the gateway's CA): copied to the jail's /run and put over the system
    /// trust store, read-only.
    #[arg(long)]
    ca_bundle: Option<PathBuf>,
    /// The gateway's CA alone: copied beside the bundle, for clients that add it to their own roots.
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// An empty directory where stage 1 builds the jail's root (stage 2 pivots into it).
    #[arg(long)]
    root: PathBuf,
    /// The working directory (resolved): shown writable, the command starts there.
    #[arg(long)]
    cwd: PathBuf,
    /// The command's home: an empty private directory, or the caller's through a private layer.
    #[arg(long)]
    home: Option<PathBuf>,
    /// Show the host's home at `--home` (reads through, writes stay in the jail).
    #[arg(long)]
    share_home: bool,
    /// More places that get an empty private directory (another home of the user).
    #[arg(long)]
    private_dir: Vec<PathBuf>,
    /// Files and directories (resolved, existing) the command must not reach (data directories, key
    /// files, the secrets file, the log): covered wherever they would show through.
    #[arg(long)]
    hide: Vec<PathBuf>,
    /// Files shown read-only at their own path although outside the allowlist (the tests' upstream CA).
    #[arg(long)]
    expose: Vec<PathBuf>,
    /// Run as this user id (the sudo caller); default: root without any capability.
    #[arg(long)]
    uid: Option<u32>,
    /// Run with this group id.
    #[arg(long)]
    gid: Option<u32>,
    /// Stage 1: give the command a pty of the jail's own and relay it to this process's terminal.
    #[arg(long)]
    tty: bool,
    /// Stage 2: the jail's pty to make the command's controlling terminal.
    #[arg(long)]
    tty_path: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<OsString>,
}

/// The signals agenthold forwards down the chain.
fn forwarded() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT] {
        set.add(s);
    }
    set
}

/// Forward every signal of `set` but SIGWINCH to the process whose pid is later stored in the returned
/// cell, from a thread (the signals are blocked in this process, so they queue for `sigwait` instead of
/// killing it); SIGWINCH copies the caller's window size to the jail's pty. The thread is started before
/// any `unshare(CLONE_NEWPID)`: afterwards a process may not create threads. Signals that arrive before
/// the target is known are dropped (agenthold is still setting up).
fn forward_signals(set: SigSet, resizer: Option<tty::Resizer>) -> Result<Arc<AtomicI32>> {
    let target = Arc::new(AtomicI32::new(0));
    let cell = Arc::clone(&target);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            while let Ok(signal) = set.wait() {
                if signal == Signal::SIGWINCH {
                    if let Some(resizer) = &resizer {
                        resizer.follow_window_size();
                    }
                    continue;
                }
                let pid = cell.load(Ordering::SeqCst);
                if pid > 0 {
                    let _ = kill(Pid::from_raw(pid), signal);
                }
            }
        })
        .context("start the signal forwarder")?;
    Ok(target)
}

/// The exit code a shell would report for `status`.
fn exit_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, signal, _) => Some(128 + signal as i32),
        _ => None,
    }
}

/// Stage 1: namespaces, the jail's root and terminal, then stage 2 as PID 1 of the new PID namespace.
/// Returns its exit code.
pub(crate) fn stage_one(args: &JailArgs) -> Result<i32> {
    // Die with agenthold: if it is killed, nothing must keep running in the sandbox namespace.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).context("set parent-death signal")?;
    let mut signals = forwarded();
    if args.tty {
        signals.add(Signal::SIGWINCH);
    }
    signals.thread_block().context("block signals")?;
    let netns = args.netns.as_ref().context("--netns is required")?;
    let ns = File::open(netns).with_context(|| format!("open {}", netns.display()))?;
    setns(&ns, CloneFlags::CLONE_NEWNET).context("enter the sandbox network namespace")?;
    drop(ns);
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWIPC).context("create mount and IPC namespaces")?;
    // Keep our mounts from propagating back to the host's mount namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("make mounts private")?;
    root::build(args)?;
    let pty = if args.tty {
        let ptmx = root::new_root(&args.root).join("dev/pts/ptmx");
        Some(tty::Pty::open(&ptmx, args.uid.zip(args.gid))?)
    } else {
        None
    };
    let relay = pty.as_ref().map(tty::Pty::relay).transpose()?;
    let target = forward_signals(signals, pty.as_ref().map(tty::Pty::resizer))?;
    unshare(CloneFlags::CLONE_NEWPID).context("create a PID namespace")?;
    let mut child = init_command(args, pty)?
        .spawn()
        .context("start the jail's init")?;
    target.store(
        i32::try_from(child.id()).context("pid out of range")?,
        Ordering::SeqCst,
    );
    let status = child.wait().context("wait for the jail's init")?;
    if let Some(relay) = relay {
        // The jail is gone with its init, and every slave with it: the rest of the output follows.
        let _ = relay.recv_timeout(Duration::from_secs(2));
    }
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1))
}

/// The command line of stage 2. With a pty, its stdin (and stdout and stderr where those are terminals)
/// is the pty's slave: the caller's terminal never enters the jail.
fn init_command(args: &JailArgs, pty: Option<tty::Pty>) -> Result<Command> {
    let exe = std::env::current_exe().context("find the agenthold executable")?;
    let mut init = Command::new(exe);
    init.arg("__jail-init")
        .arg("--resolv")
        .arg(&args.resolv)
        .arg("--root")
        .arg(&args.root)
        .arg("--cwd")
        .arg(&args.cwd);
    if let Some(uid) = args.uid {
        init.arg("--uid").arg(uid.to_string());
    }
    if let Some(gid) = args.gid {
        init.arg("--gid").arg(gid.to_string());
    }
    if let Some(pty) = pty {
        init.arg("--tty-path").arg(&pty.path);
        let terminal = |is_tty: bool| -> Result<Stdio> {
            Ok(if is_tty {
                Stdio::from(pty.slave.try_clone().context("duplicate the pty")?)
            } else {
                Stdio::inherit()
            })
        };
        init.stdout(terminal(rustix::termios::isatty(std::io::stdout()))?)
            .stderr(terminal(rustix::termios::isatty(std::io::stderr()))?)
            .stdin(Stdio::from(pty.slave));
    }
    init.arg("--").args(&args.command);
    Ok(init)
}

/// Stage 2: PID 1 of the jail. Enters the jail's root, drops privileges, runs the command, reaps,
/// returns the command's code.
pub(crate) fn stage_two(args: &JailArgs) -> Result<i32> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).context("set parent-death signal")?;
    // Once its capabilities are gone, PID 1 has no more than the command, which could otherwise read its
    // descriptors (whatever agenthold inherited, the caller's terminal) through /proc/1/fd or ptrace it.
    nix::sys::prctl::set_dumpable(false).context("make the jail's init undumpable")?;
    // Queue the forwarded signals for the forwarding thread (std started us with an empty mask).
    forwarded().thread_block().context("block signals")?;
    let target = forward_signals(forwarded(), None)?;
    root::enter(&args.root, &args.cwd)?;
    if let Some(gid) = args.gid {
        setgroups(&[Gid::from_raw(gid)]).context("setgroups")?;
        setgid(Gid::from_raw(gid)).context("setgid")?;
    }
    drop_bounding_set()?;
    if let Some(uid) = args.uid {
        // Leaving uid 0 also clears the permitted and effective sets.
        setuid(Uid::from_raw(uid)).context("setuid")?;
    }
    clear_capabilities()?;
    nix::sys::prctl::set_no_new_privs().context("set no_new_privs")?;
    let pid = match spawn_command(&args.command, args.tty_path.as_deref()) {
        Ok(pid) => pid,
        Err(e) => {
            eprintln!(
                "agenthold: cannot run {:?}: {e}",
                args.command.first().map(|p| p.to_string_lossy())
            );
            return Ok(if e == nix::errno::Errno::ENOENT { 127 } else { 126 });
        }
    };
    target.store(pid.as_raw(), Ordering::SeqCst);
    loop {
        // Reap everything (orphans are ours as PID 1) until the command itself ends.
        match waitpid(None, None) {
            Ok(status) if status.pid() == Some(pid) => {
                if let Some(code) = exit_code(status) {
                    return Ok(code);
                }
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => bail!("wait: {e}"),
        }
    }
}

/// The descriptors this process has open beyond stdin, stdout and stderr (from the jail's /proc).
fn extra_descriptors() -> Vec<i32> {
    std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .filter(|fd| *fd > 2)
                .collect()
        })
        .unwrap_or_default()
}

/// Start `argv` (looked up in `PATH`) with this process's environment, an empty signal mask, default
/// SIGPIPE, in a new session (`POSIX_SPAWN_SETSID`), and no descriptor beyond 0, 1 and 2 (whatever
/// agenthold inherited stays out). With `tty`, stdin is opened from it after `setsid`, which makes it
/// the new session's controlling terminal. `std::process::Command` would pass on the mask this process
/// blocks for its forwarding thread, and the command would then ignore SIGTERM.
fn spawn_command(argv: &[OsString], tty: Option<&Path>) -> std::result::Result<Pid, nix::errno::Errno> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    use nix::fcntl::OFlag;
    use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags, posix_spawnp};
    use nix::sys::stat::Mode;

    let c = |bytes: &[u8]| CString::new(bytes).map_err(|_| nix::errno::Errno::EINVAL);
    let args = argv
        .iter()
        .map(|a| c(a.as_bytes()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let program = args.first().ok_or(nix::errno::Errno::ENOENT)?;
    let env = std::env::vars_os()
        .map(|(k, v)| c(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut attr = PosixSpawnAttr::init()?;
    attr.set_sigmask(&SigSet::empty())?;
    let mut defaults = SigSet::empty();
    defaults.add(Signal::SIGPIPE);
    attr.set_sigdefault(&defaults)?;
    // glibc runs setsid() before the file actions (nix has no name for the flag yet).
    let setsid = PosixSpawnFlags::from_bits_retain(i32::from(libc::POSIX_SPAWN_SETSID));
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF | setsid,
    )?;
    let mut actions = PosixSpawnFileActions::init()?;
    if let Some(tty) = tty {
        // Opened without O_NOCTTY by a session leader that has none: its controlling terminal.
        actions.add_open(0, tty, OFlag::O_RDWR, Mode::empty())?;
    }
    for fd in extra_descriptors() {
        actions.add_close(fd)?;
    }
    posix_spawnp(program, &actions, &attr, &args, &env)
}

/// Empty the bounding, ambient and inheritable sets, so no later exec can gain a capability. Done while
/// CAP_SETPCAP (for the bounding set) and CAP_SETUID (for the `setuid` that follows) are still effective.
fn drop_bounding_set() -> Result<()> {
    use caps::CapSet;
    caps::clear(None, CapSet::Ambient).context("clear ambient capabilities")?;
    for cap in caps::runtime::thread_all_supported() {
        caps::drop(None, CapSet::Bounding, cap)
            .with_context(|| format!("drop {cap} from the bounding set"))?;
    }
    caps::clear(None, CapSet::Inheritable).context("clear inheritable capabilities")
}

/// Empty the effective and permitted sets.
fn clear_capabilities() -> Result<()> {
    use caps::CapSet;
    // Effective before permitted: the kernel refuses an effective set larger than the permitted one.
    caps::clear(None, CapSet::Effective).context("clear effective capabilities")?;
    caps::clear(None, CapSet::Permitted).context("clear permitted capabilities")?;
    Ok(())
}
