//! mitmproxy's `mitmdump` as the reference interceptor (issue 4, item 9): installed from PyPI into a venv
//! under `target/`, run as a reverse proxy in front of the loopback HTTPS upstream, listening on loopback,
//! setting the same header the gateway injects (`--modify-headers`), so both do the same work per request:
//! terminate the client's TLS, parse the request, add a header, forward it over a second TLS connection.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long mitmdump may take to start (Python imports, CA generation on first start).
const START_PATIENCE: Duration = Duration::from_secs(60);

/// `venv/bin/mitmdump`, creating the venv (`python3 -m venv`) and installing mitmproxy with its pip when
/// it is not there yet.
///
/// # Errors
/// When python3, venv or pip fail (no network to PyPI, say).
pub fn ensure_installed(venv: &Path) -> Result<PathBuf> {
    let mitmdump = venv.join("bin/mitmdump");
    if mitmdump.exists() {
        return Ok(mitmdump);
    }
    eprintln!("bench: installing mitmproxy into {} (pip, once)", venv.display());
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(venv)
        .status()
        .context("run python3 -m venv")?;
    if !status.success() {
        bail!("python3 -m venv {} failed ({status})", venv.display());
    }
    let status = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "mitmproxy"])
        .status()
        .context("run pip install mitmproxy")?;
    if !status.success() || !mitmdump.exists() {
        bail!("pip install mitmproxy into {} failed ({status})", venv.display());
    }
    Ok(mitmdump)
}

/// `mitmdump --version`'s first line (`Mitmproxy: 11.0.2`).
pub fn version(mitmdump: &Path) -> Option<String> {
    let out = Command::new(mitmdump).arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|l| l.trim().to_owned())
}

/// A running `mitmdump`; killed and reaped on drop.
pub struct Mitmdump {
    child: Child,
    addr: SocketAddr,
    ca_pem: String,
    confdir: tempfile::TempDir,
}

impl std::fmt::Debug for Mitmdump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mitmdump")
            .field("pid", &self.child.id())
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Mitmdump {
    /// Starts `mitmdump` as a reverse proxy to `https://{upstream}` (upstream certificate not verified:
    /// `--ssl-insecure`), listening on a free loopback port, with a fresh CA in a temporary confdir, and
    /// setting `header: value` on every request. `quiet` turns off its line per flow (`flow_detail=0`,
    /// `termlog_verbosity=warn`); without it mitmdump prints one (to a log file here), as it does by
    /// default. Waits until it accepts connections.
    ///
    /// # Errors
    /// When it does not start or does not listen within a minute.
    pub fn start(
        mitmdump: &Path,
        upstream: SocketAddr,
        header: &str,
        value: &str,
        quiet: bool,
    ) -> Result<Self> {
        let confdir = tempfile::tempdir().context("mitmproxy confdir")?;
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let log = std::fs::File::create(confdir.path().join("mitmdump.log"))?;
        let mut command = Command::new(mitmdump);
        if quiet {
            command.args(["--set", "flow_detail=0", "--set", "termlog_verbosity=warn"]);
        }
        let child = command
            .arg("--mode")
            .arg(format!("reverse:https://{upstream}"))
            .args(["--listen-host", "127.0.0.1", "--listen-port", &port.to_string()])
            .arg("--ssl-insecure")
            .arg("--set")
            .arg(format!("confdir={}", confdir.path().display()))
            .arg("--modify-headers")
            .arg(format!("/~q/{header}/{value}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", mitmdump.display()))?;
        let mut me = Self {
            child,
            addr,
            ca_pem: String::new(),
            confdir,
        };
        let ca_path = me.confdir.path().join("mitmproxy-ca-cert.pem");
        let deadline = Instant::now() + START_PATIENCE;
        loop {
            if let Some(status) = me.child.try_wait()? {
                bail!("mitmdump exited ({status}): {}", me.log_tail());
            }
            if ca_path.exists() && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                break;
            }
            if Instant::now() >= deadline {
                bail!(
                    "mitmdump did not listen on {addr} within {START_PATIENCE:?}: {}",
                    me.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        me.ca_pem =
            std::fs::read_to_string(&ca_path).with_context(|| format!("read {}", ca_path.display()))?;
        Ok(me)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its CA certificate (what clients must trust).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time (user + system) the process has used so far, from `/proc/PID/stat` (10 ms resolution).
    pub fn cpu(&self) -> Duration {
        process_cpu(self.child.id()).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let Ok(file) = std::fs::File::open(self.confdir.path().join("mitmdump.log")) else {
            return String::new();
        };
        let lines: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

impl Drop for Mitmdump {
    fn drop(&mut self) {
        // Our own child, by its id.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// User + system CPU time of process `pid` (all its threads), from `/proc/PID/stat`.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis are plain.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux for every architecture userspace sees.
    Some(Duration::from_millis(ticks * 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu() {
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let cpu = process_cpu(std::process::id()).unwrap();
        assert!(cpu >= Duration::from_millis(20), "{cpu:?}");
    }
}
