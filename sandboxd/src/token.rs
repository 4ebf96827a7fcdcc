//! The boot token: read once from `/.agenthold/boot.d/token`, deleted at once, kept only in this process's memory
//! (S2, S10). Never printed: [`BootToken`]'s `Debug` is redacted and there is no `Display`.
// enforces: S2

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;

use sandboxd::contract::token::{self, HEX_LEN as TOKEN_HEX_LEN};

/// How often the boot file is looked for while waiting.
const POLL_EVERY: Duration = Duration::from_millis(100);

/// A 256-bit boot token as 64 lowercase hex characters.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct BootToken(String);

impl std::fmt::Debug for BootToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BootToken(<redacted>)")
    }
}

impl BootToken {
    /// The token text, for the tunnel hello line only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// Parses the boot file's contents: exactly 64 lowercase hex characters, one trailing `\n` tolerated.
    pub(crate) fn parse(contents: &[u8]) -> Option<Self> {
        let body = contents.strip_suffix(b"\n").unwrap_or(contents);
        token::is_valid(body).then(|| Self(String::from_utf8_lossy(body).into_owned()))
    }
}

/// Why no token could be taken. Messages never contain token bytes.
#[derive(Debug)]
pub(crate) enum TokenError {
    /// The file did not appear within the wait.
    Missing {
        /// How long we waited.
        waited: Duration,
    },
    /// The file was there but could not be read.
    Read(std::io::Error),
    /// The file's contents are not a token (the file was deleted anyway).
    Malformed {
        /// Length of what was read, in bytes.
        len: usize,
    },
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing { waited } => write!(f, "no boot token after {} ms", waited.as_millis()),
            Self::Read(err) => write!(f, "cannot read the boot token: {err}"),
            Self::Malformed { len } => {
                write!(
                    f,
                    "boot token is malformed ({len} bytes; expected {TOKEN_HEX_LEN} lowercase hex characters)"
                )
            }
        }
    }
}

/// Reads at most a few KiB of `path` without following a symlink at `path` itself.
fn read_small(path: &Path) -> std::io::Result<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    let mut contents = Vec::new();
    file.take(4096).read_to_end(&mut contents)?;
    Ok(contents)
}

/// Whether `contents` could still become a token once the writer finishes (a strict prefix of one).
fn is_partial(contents: &[u8]) -> bool {
    contents.len() < TOKEN_HEX_LEN && contents.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Waits up to `wait` for the boot file at `path`, reads it and deletes it. A file that looks like a token
/// being written (a hex prefix) is left alone until it is complete or the wait ends.
pub(crate) fn take(path: &Path, wait: Duration) -> Result<BootToken, TokenError> {
    let start = Instant::now();
    loop {
        let expired = start.elapsed() >= wait;
        match read_small(path) {
            Ok(contents) if is_partial(&contents) && !expired => {}
            Ok(contents) => {
                // Delete before anything else: the token must not outlive this read on disk.
                if let Err(err) = std::fs::remove_file(path) {
                    crate::log!("boot: cannot delete {}: {err}", path.display());
                }
                return BootToken::parse(&contents).ok_or(TokenError::Malformed { len: contents.len() });
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                if expired {
                    return Err(TokenError::Missing {
                        waited: start.elapsed(),
                    });
                }
            }
            Err(err) => {
                // A symlink planted at the path (ELOOP) is removed so it cannot be used twice.
                let _ = std::fs::remove_file(path);
                return Err(TokenError::Read(err));
            }
        }
        std::thread::sleep(
            POLL_EVERY
                .min(wait.saturating_sub(start.elapsed()))
                .max(Duration::from_millis(1)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_exact_tokens_only() {
        assert_eq!(BootToken::parse(GOOD.as_bytes()).expect("token").expose(), GOOD);
        assert!(BootToken::parse(format!("{GOOD}\n").as_bytes()).is_some());
        for bad in [
            GOOD.to_uppercase(),
            GOOD[1..].to_owned(),
            format!("{GOOD}0"),
            format!("{GOOD}\n\n"),
            format!(" {GOOD}"),
            String::new(),
        ] {
            assert!(BootToken::parse(bad.as_bytes()).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn debug_is_redacted() {
        let token = BootToken::parse(GOOD.as_bytes()).expect("token");
        assert!(!format!("{token:?}").contains("0123"));
    }

    #[test]
    fn take_reads_and_deletes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("boot");
        std::fs::write(&path, GOOD).expect("write");
        assert_eq!(take(&path, Duration::from_secs(1)).expect("token").expose(), GOOD);
        assert!(!path.exists());
    }

    #[test]
    fn take_waits_for_the_file_then_gives_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("boot");
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(150));
                std::fs::write(path, GOOD).expect("write");
            })
        };
        assert!(take(&path, Duration::from_secs(5)).is_ok());
        writer.join().expect("join");
        assert!(matches!(
            take(&path, Duration::from_millis(50)),
            Err(TokenError::Missing { .. })
        ));
    }

    #[test]
    fn malformed_file_is_deleted_and_never_echoed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("boot");
        std::fs::write(&path, "not-a-token-at-all").expect("write");
        let err = take(&path, Duration::from_secs(1)).expect_err("malformed");
        assert!(matches!(err, TokenError::Malformed { len: 18 }));
        assert!(!err.to_string().contains("not-a-token"));
        assert!(!path.exists());
    }

    #[test]
    fn symlink_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("target");
        std::fs::write(&target, GOOD).expect("write");
        let path = dir.path().join("boot");
        std::os::unix::fs::symlink(&target, &path).expect("symlink");
        assert!(matches!(
            take(&path, Duration::from_secs(1)),
            Err(TokenError::Read(_))
        ));
        assert!(target.exists());
    }
}
