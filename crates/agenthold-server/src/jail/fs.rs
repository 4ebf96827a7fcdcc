//! The jail's view of the file system, set up in its private mount namespace before privileges are dropped:
//! what is hidden, what is read-only, and a `/dev` with only the devices a command needs.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::mount::{MsFlags, mount};

/// System directories the command gets read-only (with everything mounted below them): a
/// capability-less root still owns them, and files planted there (a cron job, `/etc/ld.so.preload`, a
/// shell profile, a container layer, a cgroup's `cgroup.procs`) would take effect with full privileges.
/// `/tmp`, `/var/tmp`, `/home` and the working directory stay writable.
pub(super) const READ_ONLY: &[&str] = &[
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/boot",
    "/root",
    "/opt",
    "/srv",
    "/var/lib",
    "/var/spool",
    "/var/cache",
    "/var/log",
    "/var/mail",
    "/var/opt",
    "/var/backups",
    "/var/local",
    "/sys",
];

/// Kernel interfaces under the jail's own /proc made read-only: a capability-less root may still write
/// many of them (`kernel.core_pattern` would run a program as full root on the next crash).
pub(super) const PROC_READ_ONLY: &[&str] = &[
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
];

/// Device nodes the jail's `/dev` keeps (bound from the host's).
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

fn bind(source: &Path, target: &Path, flags: MsFlags) -> Result<()> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND | flags,
        None::<&str>,
    )
    .with_context(|| format!("bind {} over {}", source.display(), target.display()))
}

fn remount_read_only(target: &Path) -> Result<()> {
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .with_context(|| format!("make {} read-only", target.display()))
}

fn tmpfs(target: &Path, options: &str) -> Result<()> {
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options),
    )
    .with_context(|| format!("mount a tmpfs on {}", target.display()))
}

/// Mount an empty tmpfs over /run so that host daemons' Unix sockets (docker, containerd, dbus, systemd)
/// are out of reach.
pub(super) fn hide_run() -> Result<()> {
    tmpfs(Path::new("/run"), "mode=0755,size=16m")
}

/// Put `source` at `target` read-only (the gateway's resolv.conf at the real path behind /etc/resolv.conf,
/// which may be a symlink into /run; the CA bundle over the system trust store).
pub(super) fn bind_read_only(source: &Path, target: &Path) -> Result<()> {
    if !target.exists() {
        // The target lived under the /run we just hid: recreate its path on the new tmpfs.
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
        }
        std::fs::write(target, b"").with_context(|| format!("create {}", target.display()))?;
    }
    bind(source, target, MsFlags::empty())?;
    remount_read_only(target)
}

/// Make `path` unreadable for the command: an empty tmpfs over a directory, an empty file over a file.
pub(super) fn hide(path: &Path) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    if meta.is_dir() {
        tmpfs(path, "mode=0755,size=64k")
    } else {
        let empty = Path::new("/run/agenthold/empty");
        std::fs::create_dir_all("/run/agenthold").context("create /run/agenthold")?;
        std::fs::write(empty, b"").context("create an empty file")?;
        bind_read_only(empty, path)
    }
}

/// Mount points at or below `dir`, from this namespace's mountinfo, deepest last.
fn mounts_below(dir: &Path) -> Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("read /proc/self/mountinfo")?;
    Ok(info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape)
        .filter(|p| p.starts_with(dir))
        .collect())
}

/// Mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| std::str::from_utf8(d).ok());
        match (bytes[i], octal.and_then(|d| u8::from_str_radix(d, 8).ok())) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Bind `dir` over itself with everything mounted below it, and make every one of those mounts read-only
/// (a read-only remount affects one mount, not the ones below it). A working directory below `dir` keeps
/// its own writable bind, made before the remount so it does not inherit the read-only flag. Symlinks
/// (merged /usr) and missing directories are skipped: their targets are handled on their own.
pub(super) fn read_only_dir(dir: &Path, cwd: Option<&Path>) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return Ok(());
    };
    if !meta.is_dir() {
        return Ok(());
    }
    bind(dir, dir, MsFlags::MS_REC)?;
    let keep = cwd.filter(|c| c.starts_with(dir) && *c != dir);
    if let Some(cwd) = keep {
        bind(cwd, cwd, MsFlags::MS_REC)?;
    }
    for mount_point in mounts_below(dir)? {
        if keep.is_some_and(|cwd| mount_point.starts_with(cwd)) {
            continue;
        }
        // A mount that vanished since mountinfo was read is no longer a way in.
        if let Err(e) = remount_read_only(&mount_point)
            && mount_point.exists()
        {
            return Err(e);
        }
    }
    Ok(())
}

/// Replace `/dev` with a tmpfs holding only the usual devices (bound from the host's), a `pts` of its own
/// (a new devpts instance: the host's terminals are not there, the jail's pty is), `shm` and the standard
/// links. The host's `/dev` holds root-owned block devices a capability-less root could still open by
/// their permissions, which would bypass every read-only mount and hidden path.
pub(super) fn minimal_dev() -> Result<()> {
    let staging = Path::new("/run/agenthold/dev");
    std::fs::create_dir_all(staging).context("create the jail's /dev")?;
    tmpfs(staging, "mode=0755,size=64k")?;
    for name in DEVICES {
        let host = Path::new("/dev").join(name);
        if host.exists() {
            let target = staging.join(name);
            std::fs::write(&target, b"").with_context(|| format!("create {}", target.display()))?;
            bind(&host, &target, MsFlags::empty())?;
        }
    }
    let pts = staging.join("pts");
    std::fs::create_dir_all(&pts).with_context(|| format!("create {}", pts.display()))?;
    let mut options = String::from("newinstance,ptmxmode=0666,mode=0620");
    if let Some(group) = nix::unistd::Group::from_name("tty").ok().flatten() {
        options += &format!(",gid={}", group.gid);
    }
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(options.as_str()),
    )
    .context("mount the jail's devpts")?;
    for dir in ["shm", "mqueue"] {
        let target = staging.join(dir);
        std::fs::create_dir_all(&target).with_context(|| format!("create {}", target.display()))?;
        tmpfs(&target, "mode=1777,size=64m")?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        std::os::unix::fs::symlink(to, staging.join(link)).with_context(|| format!("link /dev/{link}"))?;
    }
    mount(
        Some(staging),
        "/dev",
        None::<&str>,
        MsFlags::MS_MOVE,
        None::<&str>,
    )
    .context("move the jail's /dev")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(unescape("/a\\040b/c\\011d"), PathBuf::from("/a b/c\td"));
        assert_eq!(unescape("/plain"), PathBuf::from("/plain"));
        assert_eq!(unescape("/trailing\\"), PathBuf::from("/trailing\\"));
    }
}
