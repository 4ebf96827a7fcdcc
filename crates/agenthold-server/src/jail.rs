//! The jail `agenthold run` puts a command in. `agenthold` re-executes itself as `agenthold __jail …`; that
//! process enters the sandbox network namespace, makes its own mount namespace, hides host sockets, puts the
//! gateway's resolv.conf in place, drops every capability (bounding set included), sets `no_new_privs`,
//! becomes the invoking user when started through sudo, and finally `exec`s the command.
//!
//! Re-executing keeps all of this in safe Rust (no `pre_exec` closure) and in one small, linear function.
//! What the command can no longer do: `setns` back to the host's network namespace (needs CAP_SYS_ADMIN),
//! change addresses or routes (CAP_NET_ADMIN), open raw sockets (CAP_NET_RAW), unmount or replace the
//! resolv.conf bind (CAP_SYS_ADMIN), regain capabilities through setuid binaries (`no_new_privs`), or talk
//! to host daemons through their Unix sockets under `/run` (hidden by a fresh tmpfs: a capability-less
//! root could otherwise ask dockerd for a privileged container).

use std::ffi::CString;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns, unshare};
use nix::unistd::{Gid, Uid, execvp, setgid, setgroups, setuid};

/// Everything the jail needs, passed on the hidden command line.
#[derive(Debug, clap::Args)]
pub(crate) struct JailArgs {
    /// Network namespace file to enter.
    #[arg(long)]
    netns: PathBuf,
    /// File to bind over /etc/resolv.conf.
    #[arg(long)]
    resolv: PathBuf,
    /// CA bundle (system roots plus the gateway's CA) to put over the system trust store, read-only.
    #[arg(long)]
    ca_bundle: Option<PathBuf>,
    /// Run as this user id (the sudo caller), instead of staying root without capabilities.
    #[arg(long)]
    uid: Option<u32>,
    /// Run with this group id.
    #[arg(long)]
    gid: Option<u32>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Set the jail up and exec the command; returns only on failure.
pub(crate) fn exec(args: &JailArgs) -> Result<std::convert::Infallible> {
    // Die with agenthold: if it is killed, nothing must keep running in the sandbox namespace.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).context("set parent-death signal")?;
    let ns = File::open(&args.netns).with_context(|| format!("open {}", args.netns.display()))?;
    setns(&ns, CloneFlags::CLONE_NEWNET).context("enter the sandbox network namespace")?;
    drop(ns);
    unshare(CloneFlags::CLONE_NEWNS).context("create a mount namespace")?;
    // Keep our mounts from propagating back to the host's mount namespace.
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .context("make mounts private")?;
    let resolv_target = std::fs::canonicalize("/etc/resolv.conf").unwrap_or_else(|_| "/etc/resolv.conf".into());
    hide_run()?;
    bind_read_only(&args.resolv, &resolv_target)?;
    if let Some(bundle) = &args.ca_bundle
        && Path::new(crate::run::SYSTEM_BUNDLE).exists()
    {
        let target = std::fs::canonicalize(crate::run::SYSTEM_BUNDLE)
            .unwrap_or_else(|_| crate::run::SYSTEM_BUNDLE.into());
        bind_read_only(bundle, &target)?;
    }
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
    let argv: Vec<CString> =
        args.command.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<_, _>>().context("argument with NUL")?;
    let Some(program) = argv.first() else { bail!("no command given") };
    match execvp(program, &argv) {
        Err(e) => bail!("cannot run {:?}: {e}", args.command[0]),
        Ok(never) => match never {},
    }
}

/// Mount an empty tmpfs over /run so that host daemons' Unix sockets (docker, containerd, dbus, systemd)
/// are out of reach.
fn hide_run() -> Result<()> {
    mount(
        Some("tmpfs"),
        "/run",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755,size=16m"),
    )
    .context("mount a tmpfs over /run")
}

/// Put `source` at `target` read-only (the gateway's resolv.conf at the real path behind /etc/resolv.conf,
/// which may be a symlink into /run; the CA bundle over the system trust store).
fn bind_read_only(source: &Path, target: &Path) -> Result<()> {
    if !target.exists() {
        // The target lived under the /run we just hid: recreate its path on the new tmpfs.
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
        }
        std::fs::write(target, b"").with_context(|| format!("create {}", target.display()))?;
    }
    mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .with_context(|| format!("bind {} over {}", source.display(), target.display()))?;
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .with_context(|| format!("make {} read-only", target.display()))
}

/// Empty the bounding, ambient and inheritable sets, so no later exec can gain a capability. Done while
/// CAP_SETPCAP (for the bounding set) and CAP_SETUID (for the `setuid` that follows) are still effective.
fn drop_bounding_set() -> Result<()> {
    use caps::CapSet;
    caps::clear(None, CapSet::Ambient).context("clear ambient capabilities")?;
    for cap in caps::runtime::thread_all_supported() {
        caps::drop(None, CapSet::Bounding, cap).with_context(|| format!("drop {cap} from the bounding set"))?;
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
