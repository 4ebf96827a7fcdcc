//! The jail's root (R2, R3): a fresh tmpfs, made read-only once built, that holds only what the command
//! may see: the system directories of [`SYSTEM`] through read-only overlays, `/sys` read-only, a minimal
//! `/dev`, private `/run`, `/tmp`, `/var/tmp` and home, the working directory (writable, bound from the
//! host without what is mounted below it), and covers over every path agenthold keeps to itself that
//! would otherwise show through (data directories, key files, the secrets and log files). Stage 1 builds
//! it; stage 2, PID 1 of the jail, pivots into it ([`enter`]), so the host's root is gone from the
//! command's mount namespace.
// enforces: R2 R3

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::mount::MsFlags;

use super::fs::{
    bind, bind_read_only, cover, make_dir, minimal_dev, overlay_private, overlay_read_only, pin,
    read_only_tree, remount_read_only, tmpfs,
};
use super::view::SYSTEM;
use super::{JAIL_CA_BUNDLE, JAIL_CA_CERT, JailArgs};

/// Parts of `/sys` a capability-less root could still use through a read-only mount (pinned BPF maps
/// open by their file mode) or has no business reading: covered.
const SYS_HIDDEN: &[&str] = &[
    "sys/fs/bpf",
    "sys/kernel/debug",
    "sys/kernel/tracing",
    "sys/kernel/security",
];

/// Where the parts of the jail live inside the staging directory agenthold gives stage 1.
struct Layout {
    /// The new root.
    root: PathBuf,
    /// An empty directory (the second lower layer of read-only overlays) and the shared home's private
    /// layer, on a tmpfs outside the new root.
    empty: PathBuf,
    upper: PathBuf,
    work: PathBuf,
    /// An empty file to cover hidden files with.
    empty_file: PathBuf,
}

/// The new root inside the staging directory `staging` (what stage 2 pivots into).
pub(super) fn new_root(staging: &Path) -> PathBuf {
    staging.join("root")
}

/// `path` (absolute) inside the new root.
fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// (device, inode) of `path`, following symlinks.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Build the jail's root in `args.root` (an empty directory) and leave it read-only.
pub(super) fn build(args: &JailArgs) -> Result<()> {
    let staging = &args.root;
    // Holds the new root's mount point and the layers (the shared home's private writes among them).
    tmpfs(staging, "mode=0700")?;
    let layers = staging.join("layers");
    let layout = Layout {
        root: new_root(staging),
        empty: layers.join("empty"),
        upper: layers.join("upper"),
        work: layers.join("work"),
        empty_file: layers.join("empty-file"),
    };
    make_dir(&layers, 0o700)?;
    for dir in [&layout.empty, &layout.upper, &layout.work] {
        make_dir(dir, 0o755)?;
    }
    std::fs::write(&layout.empty_file, b"").context("create the empty file")?;
    make_dir(&layout.root, 0o755)?;
    tmpfs(&layout.root, "mode=0755,size=1m")?;
    let root = &layout.root;
    for dir in [
        "dev", "proc", "sys", "run", "tmp", "var", "home", "mnt", "media", "srv", "root",
    ] {
        make_dir(&root.join(dir), 0o755)?;
    }
    system(&layout)?;
    read_only_tree(Path::new("/sys"), &root.join("sys"))?;
    for dir in SYS_HIDDEN.iter().map(|d| root.join(d)) {
        if dir.is_dir() {
            cover(&dir, &layout.empty_file)?;
        }
    }
    minimal_dev(&root.join("dev"), tty_gid())?;
    private_places(root, args)?;
    homes(&layout, args)?;
    let cwd = inside(root, &args.cwd);
    std::fs::create_dir_all(&cwd).with_context(|| format!("create {}", cwd.display()))?;
    // Not recursive: what is mounted below the working directory (a /proc, a bind of /) stays out.
    bind(&args.cwd, &cwd, MsFlags::empty())?;
    for file in &args.expose {
        if std::fs::symlink_metadata(inside(root, file)).is_err() {
            bind_read_only(file, &inside(root, file))?;
        }
    }
    network_files(root, args)?;
    hide(&layout, args)?;
    remount_read_only(root)
}

/// The system directories, read-only. Symlinks (merged /usr) are recreated as they are.
fn system(layout: &Layout) -> Result<()> {
    for dir in SYSTEM.iter().map(Path::new) {
        let Ok(meta) = std::fs::symlink_metadata(dir) else {
            continue;
        };
        let target = inside(&layout.root, dir);
        if meta.file_type().is_symlink() {
            let to = std::fs::read_link(dir).with_context(|| format!("read {}", dir.display()))?;
            std::os::unix::fs::symlink(&to, &target).with_context(|| format!("link {}", target.display()))?;
        } else if meta.is_dir() {
            make_dir(&target, 0o755)?;
            if let Err(e) = overlay_read_only(dir, &target, &layout.empty) {
                // Without overlayfs, a read-only bind: still read-only, but host sockets in it would
                // answer `connect()`.
                tracing::warn!(dir = %dir.display(), error = %format!("{e:#}"), "no overlay, binding read-only");
                read_only_tree(dir, &target)?;
            }
        }
    }
    Ok(())
}

/// The group of terminals, for the jail's devpts.
fn tty_gid() -> Option<u32> {
    nix::unistd::Group::from_name("tty")
        .ok()
        .flatten()
        .map(|g| g.gid.as_raw())
}

/// `/run` (with the CA bundle), `/tmp` and `/var/tmp`, all the jail's own; `/var/run` and `/var/lock`
/// as the usual links.
fn private_places(root: &Path, args: &JailArgs) -> Result<()> {
    let run = root.join("run");
    tmpfs(&run, "mode=0755,size=16m")?;
    make_dir(&run.join("lock"), 0o1777)?;
    for (file, at) in [(&args.ca_bundle, JAIL_CA_BUNDLE), (&args.ca_cert, JAIL_CA_CERT)] {
        let Some(file) = file else { continue };
        let target = inside(root, Path::new(at));
        make_dir(target.parent().context("CA directory")?, 0o755)?;
        std::fs::copy(file, &target).with_context(|| format!("copy {}", file.display()))?;
    }
    for (dir, mode) in [("tmp", 0o1777), ("var/tmp", 0o1777)] {
        let target = root.join(dir);
        make_dir(&target, mode)?;
        tmpfs(&target, "mode=1777")?;
    }
    for (link, to) in [("var/run", "../run"), ("var/lock", "../run/lock")] {
        std::os::unix::fs::symlink(to, root.join(link)).with_context(|| format!("link /{link}"))?;
    }
    Ok(())
}

/// The command's home: an empty private directory, or with `--share-home` the host's seen through a
/// private layer (reads see the host's files, writes stay in the jail). Other homes of the user
/// (`args.private_dir`) get an empty private directory.
fn homes(layout: &Layout, args: &JailArgs) -> Result<()> {
    let owner = args.uid.zip(args.gid).unwrap_or((0, 0));
    let mut dirs: Vec<&PathBuf> = args.private_dir.iter().chain(&args.home).collect();
    dirs.sort_by_key(|d| d.components().count());
    for dir in dirs {
        let target = inside(&layout.root, dir);
        std::fs::create_dir_all(&target).with_context(|| format!("create {}", target.display()))?;
        let shared = args.share_home && args.home.as_ref() == Some(dir);
        match std::fs::metadata(dir) {
            Ok(host) if shared && host.is_dir() => {
                // The merged root takes owner and mode from the upper layer.
                nix::unistd::chown(
                    &layout.upper,
                    Some(nix::unistd::Uid::from_raw(host.uid())),
                    Some(nix::unistd::Gid::from_raw(host.gid())),
                )
                .context("chown the home's private layer")?;
                std::fs::set_permissions(&layout.upper, host.permissions())
                    .context("chmod the home's private layer")?;
                overlay_private(dir, &target, (&layout.empty, &layout.upper, &layout.work))
                    .context("--share-home")?;
            }
            _ => tmpfs(&target, &format!("mode=0700,uid={},gid={}", owner.0, owner.1))?,
        }
    }
    Ok(())
}

/// The gateway's resolv.conf and the CA bundle, read-only over the host's (at their real paths: the
/// host's /etc/resolv.conf may be a symlink into /run).
fn network_files(root: &Path, args: &JailArgs) -> Result<()> {
    let resolv = std::fs::canonicalize("/etc/resolv.conf").unwrap_or_else(|_| "/etc/resolv.conf".into());
    bind_read_only(&args.resolv, &inside(root, &resolv))?;
    if args.ca_bundle.is_some()
        && let Ok(system_bundle) = std::fs::canonicalize(crate::run::SYSTEM_BUNDLE)
    {
        let bundle = inside(root, Path::new(JAIL_CA_BUNDLE));
        bind_read_only(&bundle, &inside(root, &system_bundle))?;
    }
    Ok(())
}

/// Cover every hidden path wherever it shows through: in the system directories, the shared home or
/// the working directory, also when one of them reaches it under another name (a bind mount of one of
/// its parents). In the writable working directory its parents are pinned too.
fn hide(layout: &Layout, args: &JailArgs) -> Result<()> {
    let root = &layout.root;
    // What the jail shows of the host: (host path, whether the command may write there).
    let mut shown: Vec<(PathBuf, bool)> = SYSTEM
        .iter()
        .map(Path::new)
        .filter(|d| std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir()))
        .map(|d| (d.to_path_buf(), false))
        .collect();
    if args.share_home
        && let Some(home) = &args.home
    {
        shown.push((home.clone(), false));
    }
    shown.push((args.cwd.clone(), true));
    for hidden in &args.hide {
        for (top, writable) in &shown {
            let Some(rel) = reached_from(hidden, top) else {
                continue;
            };
            let top_inside = inside(root, top);
            let target = top_inside.join(rel);
            if std::fs::symlink_metadata(&target).is_err() {
                continue;
            }
            if *writable {
                pin(&top_inside, &target)?;
            }
            cover(&target, &layout.empty_file)?;
        }
    }
    Ok(())
}

/// `path` relative to `top` when `top` is `path` or one of its parents, by identity (device and inode),
/// so that a bind mount of a parent under another name counts too.
fn reached_from<'a>(path: &'a Path, top: &Path) -> Option<&'a Path> {
    let top = identity(top)?;
    path.ancestors()
        .find(|a| identity(a) == Some(top))
        .and_then(|a| path.strip_prefix(a).ok())
}

/// Stage 2: make the new root in `staging` this mount namespace's root, with a `/proc` of the jail's PID
/// namespace (kernel settings read-only), and move to the working directory. The host's root is
/// detached: nothing of it stays reachable.
pub(super) fn enter(staging: &Path, cwd: &Path) -> Result<()> {
    let root = new_root(staging);
    nix::unistd::chdir(&root).with_context(|| format!("enter {}", root.display()))?;
    nix::unistd::pivot_root(".", ".").context("pivot_root")?;
    nix::mount::umount2(".", nix::mount::MntFlags::MNT_DETACH).context("detach the host's root")?;
    nix::unistd::chdir("/").context("chdir /")?;
    nix::mount::mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .context("mount /proc for the jail")?;
    for path in super::fs::PROC_READ_ONLY.iter().map(Path::new) {
        if path.is_dir() {
            read_only_tree(path, path)?;
        } else if path.exists() {
            bind_read_only(path, path)?;
        }
    }
    std::env::set_current_dir(cwd).with_context(|| format!("enter {}", cwd.display()))
}
