//! The reference tools (Debian's `curl` and `wrk`), run inside a namespace through `nsenter`.
//!
//! They are what agents and operators actually run, they are independent of our code (OpenSSL, not
//! rustls), and their numbers are comparable with the ones in the project notes. `wrk` has no proxy
//! support and resolves names itself, so it is only used for plain HTTP, where an IP literal plus a
//! `Host` header says everything.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agenthold_egress::netns::NetNs;
use anyhow::{Context, Result, bail};

use crate::load::Outcome;

/// `program` with its arguments to come, run inside `ns` (or in this process's namespace for `None`).
pub fn command(ns: Option<&NetNs>, program: &str) -> Command {
    match ns {
        Some(ns) => ns.command(program),
        None => Command::new(program),
    }
}

/// Whether `program` is on the `PATH`.
pub fn available(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Downloads `url` once with curl, `--resolve` mapping its host to `resolve_to`, trusting `ca_pem`, the
/// body discarded; returns curl's average download speed in bytes per second.
///
/// # Errors
/// When curl fails, the status is not 200 or fewer than `expect_bytes` bytes arrived.
pub fn curl_bulk(
    ns: Option<&NetNs>,
    url: &str,
    resolve: &str,
    ca_pem: &Path,
    expect_bytes: u64,
) -> Result<f64> {
    let output = command(ns, "curl")
        .args(["-sS", "--max-time", "300", "--resolve", resolve, "--cacert"])
        .arg(ca_pem)
        .args([
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{size_download} %{speed_download}",
            url,
        ])
        .output()
        .context("run curl")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "curl {url} failed ({}): {} {}",
            output.status,
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    let [code, size, speed] = fields.as_slice() else {
        bail!("unexpected curl output {stdout:?}");
    };
    let size: u64 = size.parse().context("curl size_download")?;
    if *code != "200" || size < expect_bytes {
        bail!("curl {url}: status {code}, {size} of {expect_bytes} bytes");
    }
    speed.parse().context("curl speed_download")
}

/// Runs `wrk -t1 -c<connections> -d<duration>` against `url` with `Host: host` and returns its
/// requests per second; socket errors and non-2xx answers count as errors.
///
/// # Errors
/// When wrk fails or prints no rate.
pub fn wrk(
    ns: Option<&NetNs>,
    url: &str,
    host: &str,
    connections: usize,
    duration: Duration,
) -> Result<Outcome> {
    let seconds = duration.as_secs().max(1);
    let output = command(ns, "wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "--timeout",
            "5s",
        ])
        .args(["-H", &format!("Host: {host}"), url])
        .output()
        .context("run wrk")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "wrk {url} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let mut per_second = None;
    let mut errors = 0u64;
    for line in stdout.lines().map(str::trim) {
        if let Some(rate) = line.strip_prefix("Requests/sec:") {
            per_second = rate.trim().parse::<f64>().ok();
        } else if let Some(bad) = line.strip_prefix("Non-2xx or 3xx responses:") {
            errors += bad.trim().parse::<u64>().unwrap_or(0);
        } else if let Some(socket) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            errors += socket
                .split(',')
                .filter_map(|part| part.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    let per_second = per_second.with_context(|| format!("no Requests/sec in wrk's output: {stdout}"))?;
    Ok(Outcome { per_second, errors })
}
