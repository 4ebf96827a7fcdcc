//! The `--log` file of `agenthold run` (R3): opened by agenthold before the command starts, appended to,
//! one write per JSON line. The jail covers the path, so the command can neither read nor change it.
// enforces: R3

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use tokio::io::AsyncWriteExt;

/// Open the `--log` file for appending (created if missing, never truncated, never through a symlink:
/// agenthold is root and the path may lie where the command wrote before; nor does a FIFO planted there
/// block it: non-blocking open, then it must be a regular file).
fn open(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;

    use nix::fcntl::OFlag;
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path)
        .with_context(|| format!("open --log {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("stat {}", path.display()))?;
    if !meta.is_file() {
        bail!("--log {}: not a regular file", path.display());
    }
    Ok(file)
}

/// Append every log entry as one JSON line (one write each) until the log closes.
pub(crate) fn spawn_writer(
    path: &Path,
    mut rx: tokio::sync::broadcast::Receiver<Arc<agenthold_egress::log::LogEntry>>,
) -> Result<tokio::task::JoinHandle<Result<()>>> {
    let mut out = tokio::fs::File::from_std(open(path)?);
    let path = path.to_owned();
    Ok(tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(entry) => {
                    let line = entry.to_json_line() + "\n";
                    out.write_all(line.as_bytes())
                        .await
                        .with_context(|| format!("write {}", path.display()))?;
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "request log writer fell behind; entries lost");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
        out.flush()
            .await
            .with_context(|| format!("write {}", path.display()))
    }))
}
