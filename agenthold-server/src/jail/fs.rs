//! Mount primitives of the jail's file system, used in its private mount namespace before privileges are
//! dropped: binds, tmpfs, read-only overlays (through which no host Unix socket is reachable), covers
//! over what must stay hidden, pins against renames, and a `/dev` with only the devices a command needs.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use nix::mount::{MsFlags, mount};

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

/// Flags every mount of the jail's own gets.
fn hardened() -> MsFlags {
    MsFlags::MS_NOSUID | MsFlags::MS_NODEV
}

pub(super) fn bind(source: &Path, target: &Path, flags: MsFlags) -> Result<()> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND | flags,
        None::<&str>,
    )
    .with_context(|| format!("bind {} over {}", source.display(), target.display()))
}

/// Make the mount at `target` read-only, keeping its nosuid, nodev and noexec flags (a bind remount sets
/// all of them at once).
pub(super) fn remount_read_only(target: &Path) -> Result<()> {
    use nix::sys::statvfs::FsFlags;
    let current = nix::sys::statvfs::statvfs(target)
        .with_context(|| format!("statvfs {}", target.display()))?
        .flags();
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    for (has, keep) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
    ] {
        if current.contains(has) {
            flags |= keep;
        }
    }
    mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
        .with_context(|| format!("make {} read-only", target.display()))
}

pub(super) fn tmpfs(target: &Path, options: &str) -> Result<()> {
    mount(Some("tmpfs"), target, Some("tmpfs"), hardened(), Some(options))
        .with_context(|| format!("mount a tmpfs on {}", target.display()))
}

/// Create directory `dir` (and missing parents) with `mode`.
pub(super) fn make_dir(dir: &Path, mode: u32) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", dir.display()))
}

/// Overlayfs takes `,` and `:` as separators in its options: refuse paths that hold them.
fn overlay_path(path: &Path) -> Result<String> {
    let text = path
        .to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))?;
    if text.contains([',', ':', '\\', '\n']) {
        bail!("cannot show {text} through an overlay: the path holds `,`, `:` or `\\`");
    }
    Ok(text.to_owned())
}

fn overlay(target: &Path, options: &str) -> Result<()> {
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        hardened(),
        Some(options),
    )
    .with_context(|| format!("mount an overlay on {} ({options})", target.display()))
}

/// Show `lower` at `target` read-only through an overlay (with the empty directory `empty` as a second
/// layer: overlayfs wants two without an upper one). Unlike a read-only bind, an overlay shows the host's
/// Unix sockets as files of its own, so `connect()` to them is refused; mounts below `lower` are not shown.
pub(super) fn overlay_read_only(lower: &Path, target: &Path, empty: &Path) -> Result<()> {
    let options = format!("lowerdir={}:{}", overlay_path(lower)?, overlay_path(empty)?);
    overlay(target, &options)
}

/// Show `lower` at `target` through an overlay whose writes land in `upper` (on the jail's own tmpfs,
/// with its `work` directory): the command reads the host's files, and what it changes stays private.
pub(super) fn overlay_private(lower: &Path, target: &Path, layers: (&Path, &Path, &Path)) -> Result<()> {
    let (empty, upper, work) = layers;
    let options = format!(
        "lowerdir={}:{},upperdir={},workdir={}",
        overlay_path(lower)?,
        overlay_path(empty)?,
        overlay_path(upper)?,
        overlay_path(work)?
    );
    overlay(target, &options)
}

/// Put `source` at `target` read-only, creating an empty `target` file (and its parents) if needed.
pub(super) fn bind_read_only(source: &Path, target: &Path) -> Result<()> {
    if std::fs::symlink_metadata(target).is_err() {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
        }
        std::fs::write(target, b"").with_context(|| format!("create {}", target.display()))?;
    }
    bind(source, target, MsFlags::empty())?;
    remount_read_only(target)
}

/// Make `path` unreadable and unchangeable for the command: an empty read-only tmpfs over a directory, an
/// empty read-only file (`empty`) over anything else. Being a mount point, it cannot be unlinked, renamed
/// or replaced either.
pub(super) fn cover(path: &Path, empty: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(path).with_context(|| format!("stat {}", path.display()))?;
    if meta.is_dir() {
        tmpfs(path, "mode=0755,size=16k")?;
        remount_read_only(path)
    } else {
        bind(empty, path, MsFlags::empty())?;
        remount_read_only(path)
    }
}

/// Make every directory strictly between `top` and `path` a mount point of its own (bound over itself),
/// so that none can be renamed or removed: a covered path inside a writable tree then stays where
/// agenthold expects it, and nothing can be moved into its place.
pub(super) fn pin(top: &Path, path: &Path) -> Result<()> {
    let Ok(rest) = path.strip_prefix(top) else {
        return Ok(());
    };
    let mut dir = top.to_path_buf();
    let components: Vec<_> = rest.components().collect();
    for component in components.iter().take(components.len().saturating_sub(1)) {
        dir.push(component);
        bind(&dir, &dir, MsFlags::MS_REC)?;
    }
    Ok(())
}

/// Mount points at or below `dir`, from this namespace's mountinfo, in mount order.
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

/// Bind `source` with everything mounted below it at `target`, and make every one of those mounts
/// read-only (a read-only remount affects one mount, not the ones below it). For `/sys` (cgroups below
/// it) and the kernel interfaces of the jail's `/proc`.
pub(super) fn read_only_tree(source: &Path, target: &Path) -> Result<()> {
    bind(source, target, MsFlags::MS_REC)?;
    for mount_point in mounts_below(target)? {
        // A mount that vanished since mountinfo was read is no longer a way in.
        if let Err(e) = remount_read_only(&mount_point)
            && mount_point.exists()
        {
            return Err(e);
        }
    }
    Ok(())
}

/// Build the jail's `/dev` at `dev`: a tmpfs holding only the usual devices (bound from the host's), a
/// `pts` of its own (a new devpts instance: the host's terminals are not there), `shm` and `mqueue` of
/// its own, and the standard links. The host's `/dev` holds root-owned block devices a capability-less
/// root could still open by their permissions, which would bypass every read-only mount and hidden path.
pub(super) fn minimal_dev(dev: &Path, tty_gid: Option<u32>) -> Result<()> {
    tmpfs(dev, "mode=0755,size=64k")?;
    for name in DEVICES {
        let host = Path::new("/dev").join(name);
        if host.exists() {
            let target = dev.join(name);
            std::fs::write(&target, b"").with_context(|| format!("create {}", target.display()))?;
            bind(&host, &target, MsFlags::empty())?;
        }
    }
    let pts = dev.join("pts");
    make_dir(&pts, 0o755)?;
    let mut options = String::from("newinstance,ptmxmode=0666,mode=0620");
    if let Some(gid) = tty_gid {
        options += &format!(",gid={gid}");
    }
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(options.as_str()),
    )
    .context("mount the jail's devpts")?;
    let shm = dev.join("shm");
    make_dir(&shm, 0o1777)?;
    tmpfs(&shm, "mode=1777,size=64m")?;
    let mqueue = dev.join("mqueue");
    make_dir(&mqueue, 0o1777)?;
    // The IPC namespace's own message queues; a tmpfs where the kernel has none.
    if mount(
        Some("mqueue"),
        &mqueue,
        Some("mqueue"),
        hardened() | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .is_err()
    {
        tmpfs(&mqueue, "mode=1777,size=64k")?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link)).with_context(|| format!("link /dev/{link}"))?;
    }
    Ok(())
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

    #[test]
    fn overlay_paths_without_separators_only() {
        assert_eq!(overlay_path(Path::new("/home/u")).unwrap(), "/home/u");
        for bad in ["/a,b", "/a:b", "/a\\b"] {
            assert!(overlay_path(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
