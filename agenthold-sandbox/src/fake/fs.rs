//! The fake's in-memory filesystem: files by path, symlinks, and directories (explicit, or implied by
//! what lies below them). Symlinks resolve as the kernel would (relative targets against the link's
//! directory, at most 40 of them), so file checks can be tested against planted links without Docker.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use agenthold_core::sandbox::{DirEntry, EntryKind, sandbox_path};
use agenthold_core::{Error, ErrorKind, Result};

/// Symlinks followed while resolving one path (the kernel's limit).
const MAX_LINKS: usize = 40;

/// One sandbox's files.
#[derive(Debug, Clone, Default)]
pub(super) struct Tree {
    files: BTreeMap<String, Vec<u8>>,
    links: BTreeMap<String, String>,
    dirs: BTreeSet<String>,
}

impl Tree {
    /// The file at exactly `path` (no symlink followed, as the engine's archive API).
    pub(super) fn read(&self, path: &str) -> Result<Vec<u8>> {
        self.files.get(path).cloned().ok_or_else(|| missing(path))
    }

    pub(super) fn write(&mut self, path: &str, data: &[u8]) {
        self.files.insert(path.to_owned(), data.to_vec());
    }

    pub(super) fn mkdir(&mut self, path: &str) -> Result<()> {
        self.dirs.insert(sandbox_path(path)?);
        Ok(())
    }

    pub(super) fn symlink(&mut self, link: &str, target: &str) -> Result<()> {
        self.links.insert(sandbox_path(link)?, target.to_owned());
        Ok(())
    }

    /// Whether `path` (resolved) is a directory: the root, one made, or one something lies in.
    fn is_dir(&self, path: &str) -> bool {
        if path == "/" || self.dirs.contains(path) {
            return true;
        }
        let prefix = format!("{path}/");
        let below = |p: &String| p.starts_with(&prefix);
        self.files.keys().any(below) || self.links.keys().any(below) || self.dirs.iter().any(below)
    }

    pub(super) fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        let dir = self.resolve(path)?;
        if self.files.contains_key(&dir) {
            return Err(bad(format!("{dir} is not a directory")));
        }
        if !self.is_dir(&dir) {
            return Err(missing(&dir));
        }
        let prefix = if dir == "/" {
            "/".to_owned()
        } else {
            format!("{dir}/")
        };
        let mut entries: BTreeMap<String, DirEntry> = BTreeMap::new();
        let mut add = |path: &str, kind: EntryKind, size: u64| {
            let Some(rest) = path.strip_prefix(&prefix) else {
                return;
            };
            // Something deeper down implies a directory here.
            let (name, kind, size) = match rest.split_once('/') {
                Some((name, _)) => (name, EntryKind::Dir, 0),
                None => (rest, kind, size),
            };
            let mode = match kind {
                EntryKind::Dir => 0o755,
                EntryKind::Symlink => 0o777,
                EntryKind::File | EntryKind::Other => 0o644,
            };
            entries.entry(name.to_owned()).or_insert(DirEntry {
                name: name.to_owned(),
                kind,
                size,
                mode,
                modified: 0,
            });
        };
        for (p, data) in &self.files {
            add(p, EntryKind::File, data.len() as u64);
        }
        for (p, target) in &self.links {
            add(p, EntryKind::Symlink, target.len() as u64);
        }
        for p in &self.dirs {
            add(p, EntryKind::Dir, 0);
        }
        Ok(entries.into_values().collect())
    }

    pub(super) fn remove(&mut self, path: &str) -> Result<()> {
        let path = sandbox_path(path)?;
        if path == "/" {
            return Err(bad("refusing to remove /".into()));
        }
        let removed = self.links.remove(&path).is_some() || self.files.remove(&path).is_some();
        if !removed {
            if !self.is_dir(&path) {
                return Err(missing(&path));
            }
            let prefix = format!("{path}/");
            let keep = |p: &String| *p != path && !p.starts_with(&prefix);
            self.files.retain(|p, _| keep(p));
            self.links.retain(|p, _| keep(p));
            self.dirs.retain(keep);
        }
        // The directory it was in stays, empty or not.
        if let Some((parent, _)) = path.rsplit_once('/')
            && !parent.is_empty()
        {
            self.dirs.insert(parent.to_owned());
        }
        Ok(())
    }

    /// As `realpath -m`: every symlink along the path followed, missing parts kept.
    pub(super) fn resolve(&self, path: &str) -> Result<String> {
        let normal = sandbox_path(path)?;
        let mut rest: VecDeque<String> = components(&normal).collect();
        let mut resolved: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(part) = rest.pop_front() {
            match part.as_str() {
                "." => continue,
                ".." => {
                    resolved.pop();
                    continue;
                }
                _ => {}
            }
            let candidate: String = resolved
                .iter()
                .chain(std::iter::once(&part))
                .map(|c| format!("/{c}"))
                .collect();
            let Some(target) = self.links.get(&candidate) else {
                resolved.push(part);
                continue;
            };
            links += 1;
            if links > MAX_LINKS {
                return Err(bad(format!("{normal}: more than {MAX_LINKS} symbolic links")));
            }
            if target.starts_with('/') {
                resolved.clear();
            }
            for (i, c) in components(target).enumerate() {
                rest.insert(i, c);
            }
        }
        Ok(format!("/{}", resolved.join("/")))
    }
}

fn components(path: &str) -> impl Iterator<Item = String> + '_ {
    path.split('/').filter(|c| !c.is_empty()).map(str::to_owned)
}

fn missing(path: &str) -> Error {
    Error::NotFound {
        what: "path",
        id: path.to_owned(),
    }
}

fn bad(problem: String) -> Error {
    Error::backend(ErrorKind::BadInput, "fake sandbox", problem)
}
