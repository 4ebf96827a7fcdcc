//! Where sandboxd's files live. Every absolute path goes through [`Layout::path`] so that tests can move the
//! whole file system view under a temporary directory with `--root DIR`. The paths the runtime shares with
//! sandboxd (`/.agenthold/…`) come from [`sandboxd::contract`]; the image's own trust-store paths are here.

use std::path::{Path, PathBuf};

pub(crate) use sandboxd::contract::{BOOT_FILE, CA_BUNDLE, CA_FILE, RUN_DIR};

/// System CA bundles, in order of preference (Debian/Ubuntu/Alpine, Fedora/RHEL, others).
pub(crate) const SYSTEM_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];
/// Directory `update-ca-certificates` reads local CAs from (Debian, Ubuntu, Alpine).
pub(crate) const LOCAL_CA_DIR: &str = "/usr/local/share/ca-certificates";

/// The file system view: `/` in production, a temporary directory in tests.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// Prefix of every absolute path.
    root: PathBuf,
}

impl Layout {
    /// A layout rooted at `root` (absolute).
    pub(crate) fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// The real location of the absolute path `abs` under this layout's root.
    pub(crate) fn path(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }

    /// `/.agenthold/run/<id>.pid`: the process group of `run --id <id>`.
    pub(crate) fn pid_file(&self, id: &str) -> PathBuf {
        self.path(RUN_DIR).join(format!("{id}.pid"))
    }

    /// `/.agenthold/run/<id>.cancel`: left by `kill --id <id>` when `run` has not recorded its group yet.
    pub(crate) fn cancel_file(&self, id: &str) -> PathBuf {
        self.path(RUN_DIR).join(format!("{id}.cancel"))
    }
}

/// Writes `contents` to `path` through a temporary file in the same directory and a rename, so readers never
/// see a partial file and a symlink planted at `path` is replaced, not followed.
pub(crate) fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".sandboxd-tmp");
    let tmp = PathBuf::from(tmp);
    match std::fs::remove_file(&tmp) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
        _ => {}
    }
    let result = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut file| file.write_all(contents).and_then(|()| file.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_rooted() {
        let layout = Layout::new(PathBuf::from("/tmp/r"));
        assert_eq!(
            layout.path(BOOT_FILE),
            PathBuf::from("/tmp/r").join(&BOOT_FILE[1..])
        );
        assert_eq!(
            layout.pid_file("a1"),
            PathBuf::from("/tmp/r").join(&RUN_DIR[1..]).join("a1.pid")
        );
        assert_eq!(
            Layout::new(PathBuf::from("/")).path(CA_BUNDLE),
            PathBuf::from(CA_BUNDLE)
        );
    }

    #[test]
    fn atomic_write_replaces_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("victim");
        std::fs::write(&target, b"keep").expect("write");
        let link = dir.path().join("bundle");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        write_atomic(&link, b"new", 0o644).expect("atomic write");
        assert_eq!(std::fs::read(&target).expect("read"), b"keep");
        assert_eq!(std::fs::read(&link).expect("read"), b"new");
        assert!(
            !std::fs::symlink_metadata(&link)
                .expect("meta")
                .file_type()
                .is_symlink()
        );
    }
}
