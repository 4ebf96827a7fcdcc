//! The few tar operations the engine's archive API needs: pack files (with their parent directories) to
//! upload into a container, and read one regular file out of a downloaded archive. POSIX ustar only; long
//! names use the ustar prefix field (paths up to 255 bytes).

use crate::error::{Error, Result};

const BLOCK: usize = 512;

/// One file to pack.
#[derive(Debug, Clone)]
pub(crate) struct Entry<'a> {
    /// Path relative to the archive root (`.agenthold/boot`), no leading `/`.
    pub path: &'a str,
    /// Permission bits.
    pub mode: u32,
    /// Content.
    pub data: &'a [u8],
}

fn bad(problem: impl Into<String>) -> Error {
    Error::BadInput {
        problem: problem.into(),
    }
}

/// Write a header block for `path`.
fn header(path: &str, mode: u32, size: usize, kind: u8) -> Result<[u8; BLOCK]> {
    let mut h = [0u8; BLOCK];
    let bytes = path.as_bytes();
    let (prefix, name) = if bytes.len() <= 100 {
        (&[][..], bytes)
    } else {
        // Split at a '/' so that the name part fits 100 bytes and the prefix 155.
        let cut = path
            .char_indices()
            .filter(|(i, c)| *c == '/' && bytes.len() - i - 1 <= 100 && *i <= 155)
            .map(|(i, _)| i)
            .next()
            .ok_or_else(|| bad(format!("path too long for an archive: {path}")))?;
        (&bytes[..cut], &bytes[cut + 1..])
    };
    h[..name.len()].copy_from_slice(name);
    let octal = |field: &mut [u8], value: u64| {
        let text = format!("{value:0width$o}", width = field.len() - 1);
        field[..text.len()].copy_from_slice(text.as_bytes());
    };
    octal(&mut h[100..108], u64::from(mode & 0o7777));
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size as u64);
    octal(&mut h[136..148], 0);
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[345..345 + prefix.len()].copy_from_slice(prefix);
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    octal(&mut h[148..155], u64::from(sum));
    h[155] = b' ';
    Ok(h)
}

/// Pack `entries` with a directory entry for every parent (mode 0755, or `dir_mode` for the top ones).
///
/// # Errors
/// [`Error::BadInput`] for absolute, empty or `..` paths and paths too long for ustar.
pub(crate) fn pack(entries: &[Entry<'_>], dir_mode: u32) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut dirs: Vec<String> = Vec::new();
    for e in entries {
        if e.path.is_empty()
            || e.path.starts_with('/')
            || e.path.split('/').any(|p| p.is_empty() || p == "..")
        {
            return Err(bad(format!("invalid archive path {:?}", e.path)));
        }
        let parts: Vec<&str> = e.path.split('/').collect();
        for depth in 1..parts.len() {
            let dir = parts[..depth].join("/");
            if !dirs.contains(&dir) {
                out.extend_from_slice(&header(&format!("{dir}/"), dir_mode, 0, b'5')?);
                dirs.push(dir);
            }
        }
        out.extend_from_slice(&header(e.path, e.mode, e.data.len(), b'0')?);
        out.extend_from_slice(e.data);
        out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
    }
    out.resize(out.len() + 2 * BLOCK, 0);
    Ok(out)
}

fn parse_octal(field: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if text.is_empty() {
        Some(0)
    } else {
        u64::from_str_radix(text, 8).ok()
    }
}

/// The content of the first regular file in `archive` (what the engine returns for a file path).
///
/// # Errors
/// [`Error::BadInput`] when the archive holds no regular file (a directory was asked for) or is malformed,
/// or the file is larger than `max`.
pub(crate) fn first_file(archive: &[u8], max: usize) -> Result<Vec<u8>> {
    let mut at = 0;
    while at + BLOCK <= archive.len() {
        let h = &archive[at..at + BLOCK];
        if h.iter().all(|&b| b == 0) {
            break;
        }
        let size = parse_octal(&h[124..136]).ok_or_else(|| bad("malformed archive header"))?;
        let size = usize::try_from(size).map_err(|_| bad("archive entry too large"))?;
        let kind = h[156];
        let data_start = at + BLOCK;
        let data_end = data_start
            .checked_add(size)
            .ok_or_else(|| bad("archive entry too large"))?;
        match kind {
            b'0' | 0 => {
                if size > max {
                    return Err(bad(format!("file is larger than {max} bytes")));
                }
                let data = archive
                    .get(data_start..data_end)
                    .ok_or_else(|| bad("truncated archive"))?;
                return Ok(data.to_vec());
            }
            b'5' => return Err(bad("the path is a directory")),
            b'2' => {
                return Err(bad(
                    "the path is a symbolic link to something the archive does not hold",
                ));
            }
            _ => {}
        }
        at = data_start + size.div_ceil(BLOCK) * BLOCK;
    }
    Err(bad("the archive holds no regular file"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_real_tar_agrees() {
        // What the runtime writes before every start.
        let boot = sandboxd::contract::relative(sandboxd::contract::BOOT_FILE);
        let long = format!("{}/{}", "d".repeat(120), "f".repeat(90));
        let tar = pack(
            &[
                Entry {
                    path: boot,
                    mode: 0o400,
                    data: b"token",
                },
                Entry {
                    path: &long,
                    mode: 0o644,
                    data: &[7u8; 1000],
                },
            ],
            0o700,
        )
        .unwrap();
        // The first entry is the `.agenthold/` directory: what a directory download looks like.
        assert!(first_file(&tar, 100).is_err());
        let single = pack(
            &[Entry {
                path: "boot",
                mode: 0o400,
                data: b"token",
            }],
            0o700,
        )
        .unwrap();
        assert_eq!(first_file(&single, 100).unwrap(), b"token");
        // GNU tar reads what we write.
        let dir = std::env::temp_dir().join(format!("ah-tar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.tar");
        std::fs::write(&file, &tar).unwrap();
        let out = std::process::Command::new("tar")
            .arg("-tvf")
            .arg(&file)
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{listing}");
        assert!(
            listing.contains(boot) && listing.contains(&"f".repeat(90)),
            "{listing}"
        );
        assert!(listing.contains("-r--------"), "{listing}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn refuses_bad_paths_and_reports_directories() {
        for p in ["", "/abs", "a/../b", "a//b"] {
            assert!(
                pack(
                    &[Entry {
                        path: p,
                        mode: 0o644,
                        data: b""
                    }],
                    0o755
                )
                .is_err(),
                "{p:?}"
            );
        }
        let tar = pack(
            &[Entry {
                path: "d/f",
                mode: 0o644,
                data: b"x",
            }],
            0o755,
        )
        .unwrap();
        // The first entry is the directory `d/`.
        assert!(first_file(&tar[..1024], 10).is_err());
        assert!(first_file(&[], 10).is_err());
        assert!(first_file(&tar, 0).is_err());
    }
}
