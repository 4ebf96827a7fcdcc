//! What the command sees (R2, R3), decided before anything is set up: an allowlist of host paths, the
//! homes the jail replaces, the paths it hides inside what it shows, and the checks that refuse a
//! working directory or a path agenthold writes as root when they would open a way around the jail.
//!
//! The jail shows the system directories of [`SYSTEM`] read-only, the working directory writable, and
//! nothing else of the host: `/tmp`, `/var/tmp`, `/dev/shm`, `/run` and the home are its own. So the only
//! place the command can write on the host is the working directory, which is why it may not be (or
//! contain) a place the jail replaces, and why agenthold never follows a symlink in it that leads outside
//! (the command may have planted it on an earlier run) to write its log or data.

use std::path::{Component, Path, PathBuf};

/// System directories the command sees read-only (symlinks, as in merged-/usr systems, are recreated).
/// Everything else of the host's root is absent or an empty directory of a read-only root.
pub(crate) const SYSTEM: &[&str] = &[
    "/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// Places the jail replaces or hides as a whole: shared writable, a working directory that is one of
/// them or contains one would give the command what the jail hides (host sockets in /tmp and /run, other
/// users' homes, system files to plant in).
const NOT_A_WORKING_DIRECTORY: &[&str] = &[
    "/", "/boot", "/dev", "/home", "/proc", "/root", "/run", "/sys", "/tmp", "/var", "/var/lib", "/var/run",
    "/var/tmp",
];

/// Kernel interfaces and runtime state: a working directory below them is refused as well.
const NEVER_BELOW: &[&str] = &["/dev", "/proc", "/run", "/sys", "/var/run"];

/// Kernel interfaces and runtime state the jail provides itself: no home is put inside them.
const JAIL_MOUNTS: &[&str] = &["/dev", "/proc", "/run", "/sys"];

/// The jail's private temporary directories: a home may lie inside them, but not above them.
const JAIL_TMP: &[&str] = &["/tmp", "/var/tmp"];

/// `path` made absolute against `base` with `.` and `..` resolved by name, without asking the file system.
pub(crate) fn normalize(base: &Path, path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in base.join(path).components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => out.push(name),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// `path` (absolute) as the kernel resolves it: symlinks followed as far as the path exists, the rest
/// appended by name.
pub(crate) fn resolve(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(&existing) {
            return rest.iter().rev().fold(real, |p, name| p.join(name));
        }
        match (existing.file_name().map(ToOwned::to_owned), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// A refusal: bad input, reported as such (exit 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused(pub(crate) String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// Checks the working directory `cwd` (resolved) against the places the jail replaces, the `homes`
/// and the `hidden` paths (all resolved). Pure, so that it is tested without a file system.
pub(crate) fn check_working_directory(
    cwd: &Path,
    replaced: &[PathBuf],
    never_below: &[PathBuf],
    homes: &[PathBuf],
    hidden: &[PathBuf],
) -> Result<(), Refused> {
    let refuse = |why: String| {
        Err(Refused(format!(
            "the working directory {} {why}; the jail shares it writable: run from a project directory",
            cwd.display()
        )))
    };
    if let Some(place) = replaced.iter().find(|p| p.starts_with(cwd)) {
        return refuse(if place == cwd {
            format!("is {}, which the jail replaces", place.display())
        } else {
            format!("contains {}, which the jail replaces", place.display())
        });
    }
    if let Some(home) = homes.iter().find(|h| h.starts_with(cwd)) {
        return refuse(format!(
            "is or contains the home directory {} (run from a directory below it)",
            home.display()
        ));
    }
    if let Some(place) = never_below.iter().chain(hidden).find(|p| cwd.starts_with(p)) {
        return refuse(format!("lies in {}, which the jail hides", place.display()));
    }
    Ok(())
}

/// [`check_working_directory`] with the jail's own lists, resolved on this host.
pub(crate) fn check_cwd(cwd: &Path, homes: &[PathBuf], hidden: &[PathBuf]) -> Result<(), Refused> {
    let resolved = |list: &[&str]| -> Vec<PathBuf> { list.iter().map(|p| resolve(Path::new(p))).collect() };
    let mut replaced = resolved(NOT_A_WORKING_DIRECTORY);
    replaced.extend(resolved(SYSTEM));
    check_working_directory(cwd, &replaced, &resolved(NEVER_BELOW), homes, hidden)
}

/// A path that agenthold, as root, creates or writes (`--log`, `--data-dir`) or reads (`--secrets`),
/// given as `given` relative to `cwd` (resolved): refused when, named inside the working directory, it
/// resolves outside it (through a symlink the command may have planted there on an earlier run). Returns
/// the resolved path.
pub(crate) fn check_own_path(flag: &str, cwd: &Path, given: &Path) -> Result<PathBuf, Refused> {
    let named = normalize(cwd, given);
    let real = resolve(&named);
    if named.starts_with(cwd) && !real.starts_with(cwd) {
        return Err(Refused(format!(
            "{flag} {}: leads out of the working directory through a symlink ({}); refusing to follow it",
            given.display(),
            real.display()
        )));
    }
    Ok(real)
}

/// [`check_own_path`] for the `--log` file, which agenthold opens for appending: its last component must
/// not be a symlink, and an existing one must be a regular file.
pub(crate) fn check_log_path(cwd: &Path, given: &Path) -> Result<PathBuf, Refused> {
    let named = normalize(cwd, given);
    match std::fs::symlink_metadata(&named) {
        Ok(meta) if meta.file_type().is_symlink() => Err(Refused(format!(
            "--log {}: is a symlink; refusing to follow it",
            given.display()
        ))),
        Ok(meta) if !meta.is_file() => Err(Refused(format!(
            "--log {}: is not a regular file",
            given.display()
        ))),
        _ => check_own_path("--log", cwd, given),
    }
}

/// A key file or data directory that does not exist yet and would be created inside the working
/// directory: the command could create it first and choose its content (the installation's master key).
pub(crate) fn check_not_creatable(cwd: &Path, sensitive: &Path) -> Result<(), Refused> {
    let real = resolve(sensitive);
    if real.starts_with(cwd) && std::fs::symlink_metadata(&real).is_err() {
        return Err(Refused(format!(
            "{} does not exist yet and lies in the working directory, where the command could create it; \
             create it first or run from another directory",
            real.display()
        )));
    }
    Ok(())
}

/// Whether the jail may put a private directory (or the shared home) at `home`: not `/`, neither inside
/// nor above a system directory or a kernel interface, and not above the private temporary directories.
pub(crate) fn replaceable_home(home: &Path) -> bool {
    home.is_absolute()
        && SYSTEM
            .iter()
            .chain(JAIL_MOUNTS)
            .map(Path::new)
            .all(|p| !home.starts_with(p) && !p.starts_with(home))
        && JAIL_TMP.iter().all(|p| !Path::new(p).starts_with(home))
}

/// `paths` without duplicates and without those that lie inside another of them.
pub(crate) fn outermost(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
    paths.sort();
    paths.dedup();
    let mut out: Vec<PathBuf> = Vec::new();
    for path in paths {
        if !out.iter().any(|kept| path.starts_with(kept)) {
            out.push(path);
        }
    }
    out
}

/// The jail's view of one run, planned by `agenthold run` before anything is set up.
#[derive(Debug, Clone)]
pub(crate) struct View {
    /// The working directory, resolved.
    pub(crate) cwd: PathBuf,
    /// The command's home (its own empty directory, or the caller's with `share_home`), when the jail
    /// may put one there.
    pub(crate) home: Option<PathBuf>,
    /// Show the caller's home at `home`, read through a private layer.
    pub(crate) share_home: bool,
    /// Another home of the user (root's in the user database when `$HOME` differs): an empty private
    /// directory.
    pub(crate) private_dirs: Vec<PathBuf>,
    /// What the command must not reach, resolved (existing or not yet).
    pub(crate) hidden: Vec<PathBuf>,
    /// Files shown read-only although outside the allowlist.
    pub(crate) expose: Vec<PathBuf>,
    /// The sudo caller the command runs as, if any.
    pub(crate) user: Option<(u32, u32)>,
}

/// What [`View::plan`] needs to know of the run.
pub(crate) struct Inputs {
    pub(crate) cwd: PathBuf,
    pub(crate) user: Option<(u32, u32)>,
    pub(crate) share_home: bool,
    /// Paths agenthold writes or reads as root, by flag: checked against planted symlinks, hidden.
    pub(crate) own: Vec<(&'static str, PathBuf)>,
    /// The `--log` file.
    pub(crate) log: Option<PathBuf>,
    /// Data directories and key files of the installation (hidden; refused when the command could
    /// create them).
    pub(crate) installation: Vec<PathBuf>,
    pub(crate) expose: Vec<PathBuf>,
}

impl View {
    /// Decide the view: the homes, what to hide, and whether the working directory and the paths
    /// agenthold writes are acceptable.
    pub(crate) fn plan(inputs: Inputs) -> Result<(Self, Option<PathBuf>), Refused> {
        let Inputs {
            cwd,
            user,
            share_home,
            own,
            log,
            installation,
            expose,
        } = inputs;
        let (home, private_dirs) = homes(user);
        let mut hidden = Vec::new();
        for (flag, path) in own {
            hidden.push(check_own_path(flag, &cwd, &path)?);
        }
        // agenthold creates its own paths before the jail starts: only the installation's are checked
        // for being creatable by the command.
        let own_paths = hidden.clone();
        let log = log.map(|l| check_log_path(&cwd, &l)).transpose()?;
        hidden.extend(log.clone());
        let mut installation = installation;
        if let Some(home) = &home {
            installation.extend(user_data_dirs(home));
        }
        for path in &installation {
            let path = resolve(&normalize(&cwd, path));
            if !own_paths.iter().any(|own| path.starts_with(own)) {
                check_not_creatable(&cwd, &path)?;
            }
            hidden.push(path);
        }
        let homes: Vec<PathBuf> = home.iter().chain(&private_dirs).map(|h| resolve(h)).collect();
        check_cwd(&cwd, &homes, &hidden)?;
        let view = Self {
            cwd,
            home,
            share_home,
            private_dirs,
            hidden: outermost(hidden),
            expose: expose.iter().map(|p| resolve(p)).collect(),
            user,
        };
        Ok((view, log))
    }

    /// The hidden paths that exist now (the jail covers those; agenthold creates its own before).
    pub(crate) fn existing_hidden(&self) -> Vec<PathBuf> {
        self.hidden
            .iter()
            .filter(|p| std::fs::symlink_metadata(p).is_ok())
            .cloned()
            .collect()
    }
}

/// Where a non-root installation of the user keeps its data: `$XDG_DATA_HOME/agenthold` and
/// `<home>/.local/share/agenthold` (agenthold-core's default data directory).
fn user_data_dirs(home: &Path) -> Vec<PathBuf> {
    let xdg = std::env::var_os("XDG_DATA_HOME");
    let mut dirs: Vec<PathBuf> =
        agenthold_core::config::default_data_dir(false, None, Some(home.as_os_str()))
            .into_iter()
            .collect();
    dirs.extend(agenthold_core::config::default_data_dir(
        false,
        xdg.as_deref(),
        std::env::var_os("HOME").as_deref(),
    ));
    dirs
}

/// The command's home and the other homes to replace: the sudo caller's home from the user database
/// (its `$HOME` is set to it); for root, `$HOME` (else root's home), plus root's home when different.
fn homes(user: Option<(u32, u32)>) -> (Option<PathBuf>, Vec<PathBuf>) {
    let database_home = |uid: u32| {
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.dir)
    };
    let usable = |p: Option<PathBuf>| p.filter(|p| replaceable_home(p));
    match user {
        Some((uid, _)) => (usable(database_home(uid)), Vec::new()),
        None => {
            let env_home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute());
            let root_home = usable(database_home(0));
            let home = usable(env_home.or_else(|| root_home.clone()));
            let others = root_home
                .filter(|r| Some(r) != home.as_ref())
                .into_iter()
                .collect();
            (home, others)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(list: &[&str]) -> Vec<PathBuf> {
        list.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn normalizes_by_name() {
        let base = Path::new("/work/proj");
        assert_eq!(
            normalize(base, Path::new("log.jsonl")),
            Path::new("/work/proj/log.jsonl")
        );
        assert_eq!(
            normalize(base, Path::new("a/../b/./c")),
            Path::new("/work/proj/b/c")
        );
        assert_eq!(normalize(base, Path::new("../../../x")), Path::new("/x"));
        assert_eq!(normalize(base, Path::new("/abs/./y")), Path::new("/abs/y"));
    }

    #[test]
    fn refuses_working_directories_that_share_what_the_jail_hides() {
        let replaced = paths(&["/", "/tmp", "/home", "/var", "/var/lib", "/usr"]);
        let never = paths(&["/run", "/proc"]);
        let homes = paths(&["/home/u"]);
        let hidden = paths(&["/home/u/proj/.data", "/var/lib/agenthold"]);
        let check = |cwd: &str| check_working_directory(Path::new(cwd), &replaced, &never, &homes, &hidden);
        for bad in [
            "/",
            "/tmp",
            "/var",
            "/home",
            "/home/u",
            "/run/user/1000",
            "/proc/1",
            "/usr",
            "/var/lib/agenthold",
            "/var/lib/agenthold/egress",
            "/home/u/proj/.data/x",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
        for good in [
            "/tmp/x",
            "/home/u/proj",
            "/var/lib/x",
            "/usr/local/src/p",
            "/work/p",
        ] {
            assert_eq!(check(good), Ok(()), "{good}");
        }
    }

    #[test]
    fn homes_are_replaced_only_outside_the_jails_own_mounts() {
        for good in [
            "/root",
            "/home/u",
            "/nonexistent",
            "/var/lib/postgresql",
            "/tmp/x",
        ] {
            assert!(replaceable_home(Path::new(good)), "{good}");
        }
        for bad in [
            "/",
            "/usr/sbin",
            "/bin",
            "/run/user/1",
            "/dev",
            "/var",
            "/tmp",
            "relative",
        ] {
            assert!(!replaceable_home(Path::new(bad)), "{bad}");
        }
    }

    #[test]
    fn keeps_the_outermost_paths() {
        assert_eq!(
            outermost(paths(&["/a/b", "/a", "/c/d", "/c/d", "/ab"])),
            paths(&["/a", "/ab", "/c/d"])
        );
    }
}
