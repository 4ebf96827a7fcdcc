//! Files inside a sandbox as the file operations of [`super::Sandbox`] see them: the one rule every path
//! they take follows ([`sandbox_path`]), and a directory's entries ([`DirEntry`]).
//!
//! Paths are checked before anything is asked of a runtime, so every implementation refuses the same
//! ones: a path that climbs (`..`) or is relative could mean different files to the caller's check and to
//! the runtime (S10: a file API checks the path it is given, and the runtime must act on that same path).

use crate::error::{Error, Result};

/// What a directory entry is (itself, not what a symlink points to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else: a device, a FIFO, a socket.
    Other,
}

/// One entry of a directory listing ([`super::Sandbox::list_dir`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirEntry {
    /// The entry's name (not its path), without `/`; bytes that are not UTF-8 are replaced by U+FFFD.
    pub name: String,
    /// What it is.
    pub kind: EntryKind,
    /// Size in bytes (of the link itself for a symlink: the length of its target).
    pub size: u64,
    /// Permission bits, with set-user-id, set-group-id and sticky (`0o7777` at most; `0o755`, `0o4755`).
    pub mode: u32,
    /// Last modification, in seconds since the Unix epoch.
    pub modified: i64,
}

/// The normal form of a path given to a sandbox file operation: absolute; empty components, `.` components
/// and a trailing `/` dropped (`/workspace//a/./b/` is `/workspace/a/b`).
///
/// # Errors
/// [`Error::SandboxPath`] (a [`crate::ErrorKind::BadInput`]) for a relative path, a `..` component or a NUL
/// byte: a path that names a file only after the runtime resolved it differently from the caller.
pub fn sandbox_path(path: &str) -> Result<String> {
    let bad = |problem| {
        Err(Error::SandboxPath {
            path: path.to_owned(),
            problem,
        })
    };
    if path.contains('\0') {
        return bad("contains a NUL byte");
    }
    if !path.starts_with('/') {
        return bad("give an absolute path (starting with /)");
    }
    let mut normal = String::with_capacity(path.len());
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return bad("a .. component is not accepted: give the path it leads to"),
            part => {
                normal.push('/');
                normal.push_str(part);
            }
        }
    }
    if normal.is_empty() {
        normal.push('/');
    }
    Ok(normal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_absolute_and_normal() {
        for (given, normal) in [
            ("/", "/"),
            ("//", "/"),
            ("/etc", "/etc"),
            ("/etc/", "/etc"),
            ("/workspace//a/./b/", "/workspace/a/b"),
            ("/a/.../b", "/a/.../b"),
            ("/a/..b", "/a/..b"),
        ] {
            assert_eq!(sandbox_path(given).unwrap(), normal, "{given}");
        }
        for bad in [
            "",
            "etc",
            "./etc",
            "/etc/../root",
            "/..",
            "/a/..",
            "/a\0b",
            "a/../b",
        ] {
            let err = sandbox_path(bad).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::BadInput, "{bad:?}");
            assert!(matches!(err, Error::SandboxPath { .. }), "{bad:?}");
        }
    }

    #[test]
    fn entries_serialise_with_snake_case_kinds() {
        let entry = DirEntry {
            name: "bin".into(),
            kind: EntryKind::Symlink,
            size: 7,
            mode: 0o777,
            modified: 1_700_000_000,
        };
        let json = serde_json::to_value(&entry).unwrap();
        assert_eq!(json["kind"], "symlink");
        assert_eq!(json["modified"], 1_700_000_000);
        assert_eq!(serde_json::from_value::<DirEntry>(json).unwrap(), entry);
    }
}
