//! Files in a Docker sandbox (P1, S10): read and write through the engine's archive API, paths resolved
//! through the engine's stat API, directories listed and paths removed by short commands run in the
//! sandbox.
//!
//! Resolving symlinks ([`resolve`]) is what a file check (S10) relies on, so it never runs a program inside
//! the sandbox: the agent owns that filesystem and could replace `realpath` with one that lies. The
//! engine's stat API (`HEAD /containers/ID/archive`) reports a symlink's target fully resolved by the
//! engine itself, in the container's root filesystem with its mounts (volumes, bind mounts), and that is
//! the very view [`read`] and [`write`] (the archive API) act in. One consequence: `/proc` is an empty
//! directory in that view, so `/proc/self/root/...` resolves to itself and reads nothing.
//!
//! Listing and removing run `find` and `rm` in the sandbox (through `sandboxd run`, with a timeout): the
//! engine has no API for either, and an agent that lies to its own listing gains nothing it did not have.
//! Listing needs GNU `find` (its `-printf`), as in Debian- and Ubuntu-based images.
// enforces: S10

use std::time::Duration;

use agenthold_core::sandbox::{DirEntry, EntryKind, ExecOutput, ExecRequest, sandbox_path};
use agenthold_core::{AgentId, ErrorKind};
use bollard::query_parameters::{
    ContainerArchiveInfoOptions, DownloadFromContainerOptions, UploadToContainerOptions,
};
use futures_util::TryStreamExt;

use super::archive::{self, Entry};
use super::container::container_name;
use super::engine::{Engine, is_not_found};
use super::{MAX_FILE, exec};
use crate::error::{Error, Result};

/// How long a listing or a removal may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Exit code of the scripts below for a path that does not exist.
const EXIT_MISSING: i64 = 3;
/// Exit code of the listing script for a path that is not a directory.
const EXIT_NOT_DIR: i64 = 4;
/// Symlinks followed while resolving one path before giving up (the kernel's own limit is 40).
const MAX_LINKS: usize = 40;

/// Go's `os.FileMode` bits, as the engine's stat API reports modes.
mod go_mode {
    pub(super) const DIR: u32 = 1 << 31;
    pub(super) const SYMLINK: u32 = 1 << 27;
}

/// Read a regular file (at most [`MAX_FILE`] bytes).
pub(super) async fn read(engine: &Engine, agent: &AgentId, path: &str) -> Result<Vec<u8>> {
    let options = DownloadFromContainerOptions {
        path: path.to_owned(),
    };
    let mut stream = engine
        .docker
        .download_from_container(&container_name(agent), Some(options));
    let mut tar = Vec::new();
    while let Some(chunk) = stream
        .try_next()
        .await
        .map_err(|e| Error::engine(format!("read {path}"), e))?
    {
        if tar.len() + chunk.len() > MAX_FILE + 64 * 1024 {
            return Err(Error::BadInput {
                problem: format!("{path} is larger than {MAX_FILE} bytes"),
            });
        }
        tar.extend_from_slice(&chunk);
    }
    archive::first_file(&tar, MAX_FILE)
}

/// Write (create or replace) a file, creating its parent directories.
pub(super) async fn write(engine: &Engine, agent: &AgentId, path: &str, data: &[u8]) -> Result<()> {
    let relative = path.strip_prefix('/').ok_or_else(|| Error::BadInput {
        problem: format!("{path:?}: give an absolute path"),
    })?;
    let tar = archive::pack(
        &[Entry {
            path: relative,
            mode: 0o644,
            data,
        }],
        0o755,
    )?;
    let options = UploadToContainerOptions {
        path: "/".to_owned(),
        ..Default::default()
    };
    engine
        .docker
        .upload_to_container(
            &container_name(agent),
            Some(options),
            bollard::body_full(tar.into()),
        )
        .await
        .map_err(|e| Error::engine(format!("write {path}"), e))?;
    Ok(())
}

/// `find` lists the directory, NUL-separated: type letter, size, permission bits (octal), modification time
/// (seconds with a fraction), name. `$1` is the path (an argument, never part of the script).
const LIST: &str = r#"[ -e "$1" ] || [ -L "$1" ] || exit 3
[ -d "$1" ] || exit 4
exec find "$1/" -mindepth 1 -maxdepth 1 -printf '%y %s %m %T@ %f\0'"#;

/// The entries of a directory, sorted by name.
pub(super) async fn list(engine: &Engine, agent: &AgentId, path: &str) -> Result<Vec<DirEntry>> {
    let path = sandbox_path(path)?;
    let out = script(engine, agent, LIST, &path).await?;
    match out.exit_code {
        0 => {}
        EXIT_MISSING => return Err(missing(&path)),
        EXIT_NOT_DIR => {
            return Err(Error::BadInput {
                problem: format!("{path} is not a directory"),
            });
        }
        126 | 127 => {
            return Err(Error::Unavailable {
                problem: format!(
                    "listing {path} needs /bin/sh and GNU find in the sandbox's image: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        _ => return Err(failed(format!("list {path}"), &out)),
    }
    let mut entries: Vec<DirEntry> = out
        .stdout
        .split(|&b| b == 0)
        .filter(|record| !record.is_empty())
        .map(|record| {
            parse_entry(record).ok_or_else(|| Error::Unavailable {
                problem: format!(
                    "listing {path}: `find -printf` printed {:?}; the image's find is not GNU find",
                    String::from_utf8_lossy(record)
                ),
            })
        })
        .collect::<Result<_>>()?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// One `find -printf '%y %s %m %T@ %f'` record.
fn parse_entry(record: &[u8]) -> Option<DirEntry> {
    let mut fields = record.splitn(5, |&b| b == b' ');
    let kind = match fields.next()? {
        b"f" => EntryKind::File,
        b"d" => EntryKind::Dir,
        b"l" => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    let text = |field: &[u8]| std::str::from_utf8(field).ok().map(str::to_owned);
    let size = text(fields.next()?)?.parse().ok()?;
    let mode = u32::from_str_radix(&text(fields.next()?)?, 8).ok()?;
    let modified = text(fields.next()?)?;
    let modified = modified.split('.').next()?.parse().ok()?;
    let name = String::from_utf8_lossy(fields.next()?).into_owned();
    (!name.is_empty() && !name.contains('/')).then_some(DirEntry {
        name,
        kind,
        size,
        mode,
        modified,
    })
}

/// `rm -rf` the path itself (a symlink, not what it points to).
const REMOVE: &str = r#"[ -e "$1" ] || [ -L "$1" ] || exit 3
exec rm -rf -- "$1""#;

/// Remove a file, symlink or directory tree.
pub(super) async fn remove(engine: &Engine, agent: &AgentId, path: &str) -> Result<()> {
    let path = sandbox_path(path)?;
    if path == "/" {
        return Err(Error::BadInput {
            problem: "refusing to remove / (remove the sandbox instead)".into(),
        });
    }
    let out = script(engine, agent, REMOVE, &path).await?;
    match out.exit_code {
        0 => Ok(()),
        EXIT_MISSING => Err(missing(&path)),
        _ => Err(failed(format!("remove {path}"), &out)),
    }
}

/// The canonical path `path` names, resolved by the engine (see the module documentation).
pub(super) async fn resolve(engine: &Engine, agent: &AgentId, path: &str) -> Result<String> {
    let normal = sandbox_path(path)?;
    let container = container_name(agent);
    // Resolved so far (empty for `/`), and what is left to walk.
    let mut resolved = String::new();
    let mut rest: std::collections::VecDeque<String> = normal
        .split('/')
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect();
    let mut links = 0;
    while let Some(component) = rest.pop_front() {
        let candidate = format!("{resolved}/{component}");
        let options = ContainerArchiveInfoOptions {
            path: candidate.clone(),
        };
        match engine
            .docker
            .get_container_archive_info(&container, Some(options))
            .await
        {
            Ok(stat) if stat.file_mode & go_mode::SYMLINK != 0 => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(Error::BadInput {
                        problem: format!("{normal}: more than {MAX_LINKS} symbolic links"),
                    });
                }
                // The engine resolved the link in full (a part that does not exist stays as written).
                resolved = clean(&stat.link_target);
            }
            Ok(stat) if stat.file_mode & go_mode::DIR != 0 => resolved = candidate,
            // A file (or a missing component): nothing below it can be a symlink.
            Ok(_) => {
                resolved = candidate;
                break;
            }
            Err(e) if is_not_found(&e) => {
                // The sandbox itself may be what is missing.
                if let Err(e) = engine.docker.inspect_container(&container, None).await {
                    return Err(if is_not_found(&e) {
                        Error::NotFound {
                            agent: agent.to_string(),
                        }
                    } else {
                        Error::engine(format!("resolve {normal}"), e)
                    });
                }
                resolved = candidate;
                break;
            }
            Err(e) => return Err(Error::engine(format!("resolve {normal}"), e)),
        }
    }
    for component in rest {
        resolved.push('/');
        resolved.push_str(&component);
    }
    if resolved.is_empty() {
        resolved.push('/');
    }
    Ok(resolved)
}

/// An absolute path from the engine in normal form, without a trailing `/` (empty for `/`); `..` cannot
/// climb above the root.
fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.iter().map(|p| format!("/{p}")).collect()
}

/// Run `/bin/sh -c SCRIPT sh PATH` in the sandbox, to completion.
async fn script(engine: &Engine, agent: &AgentId, script: &str, path: &str) -> Result<ExecOutput> {
    let request = ExecRequest {
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            script.into(),
            "sh".into(),
            path.into(),
        ],
        timeout: Some(COMMAND_TIMEOUT),
        ..ExecRequest::default()
    };
    let stream = exec::start(engine, agent, request).await?;
    Ok(stream.collect().await?)
}

fn missing(path: &str) -> Error {
    Error::Core(agenthold_core::Error::NotFound {
        what: "path",
        id: path.to_owned(),
    })
}

/// A command in the sandbox failed: the sandbox's side, with what it said.
fn failed(context: String, out: &ExecOutput) -> Error {
    let said = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    Error::Engine {
        context,
        kind: ErrorKind::Upstream,
        source: format!("exit {}: {said}", out.exit_code).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_records_parse_and_odd_ones_are_refused() {
        let entry = parse_entry(b"l 7 777 1700000000.5000000000 lib").unwrap();
        assert_eq!(
            entry,
            DirEntry {
                name: "lib".into(),
                kind: EntryKind::Symlink,
                size: 7,
                mode: 0o777,
                modified: 1_700_000_000,
            }
        );
        let odd = parse_entry(b"f 3 4755 1.0 a name with spaces\nand a newline").unwrap();
        assert_eq!((odd.kind, odd.mode), (EntryKind::File, 0o4755));
        assert_eq!(odd.name, "a name with spaces\nand a newline");
        assert_eq!(parse_entry(b"p 0 644 1 fifo").unwrap().kind, EntryKind::Other);
        for bad in [
            &b"f 3 644 1"[..],
            b"f x 644 1 a",
            b"f 3 9z 1 a",
            b"f 3 644 t a",
            b"f 3 644 1 a/b",
        ] {
            assert!(parse_entry(bad).is_none(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn engine_paths_are_cleaned_within_the_root() {
        for (given, clean_path) in [
            ("/w/d", "/w/d"),
            ("/", ""),
            ("/a/../../b/", "/b"),
            ("//a/./b", "/a/b"),
        ] {
            assert_eq!(clean(given), clean_path, "{given}");
        }
    }
}
