//! nginx as a realistic HTTPS upstream (Debian's `nginx-light`), next to the lean hand-written one of
//! [`upstream`](crate::upstream): how a ratio "through the gateway / direct" comes out depends on how much
//! the direct path itself costs, and a real server costs more per request than 13 bytes written by hand.
//!
//! One nginx (master + `worker_processes auto`) on a loopback port, TLS with a certificate from its own
//! test CA, keep-alive without a request limit, no access log. `GET /small` answers the same 13 bytes as
//! the lean upstream; `GET /injected` answers them only when the request carries the interception
//! benchmark's secret ([`upstream::SECRET_HEADER`]: [`upstream::SECRET_VALUE`]) and 403 otherwise, so a
//! client that asks for `/injected` through the gateway fails unless the gateway injected it.
//!
//! [`upstream::SECRET_HEADER`]: crate::upstream::SECRET_HEADER
//! [`upstream::SECRET_VALUE`]: crate::upstream::SECRET_VALUE

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthold_testsupport::TestCa;
use anyhow::{Context, Result, bail};
use base64::Engine as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::upstream::{SECRET_HEADER, SECRET_VALUE};

/// A running nginx; stopped (SIGTERM to its master, by pid) and reaped on drop.
pub struct Nginx {
    child: Child,
    addr: SocketAddr,
    ca: TestCa,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Nginx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nginx")
            .field("pid", &self.child.id())
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// `-----BEGIN {label}-----` … for DER bytes.
fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Whether an `nginx` binary is on the `PATH` (or in `/usr/sbin`).
pub fn available() -> bool {
    Command::new("nginx")
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `nginx -v`'s version (`nginx/1.22.1`).
pub fn version() -> Option<String> {
    let out = Command::new("nginx").arg("-v").output().ok()?;
    let text = String::from_utf8_lossy(&out.stderr);
    text.split_whitespace()
        .find(|w| w.starts_with("nginx/"))
        .map(str::to_owned)
}

impl Nginx {
    /// Starts nginx serving HTTPS as `name` on a free loopback port; waits until it accepts connections.
    ///
    /// # Errors
    /// When nginx is missing, refuses its configuration or does not listen within ten seconds.
    pub fn start(name: &str) -> Result<Self> {
        let ca = TestCa::new();
        let (chain, key) = ca.issue(&[name]);
        let dir = tempfile::tempdir().context("nginx directory")?;
        let path = |file: &str| dir.path().join(file);
        std::fs::write(path("cert.pem"), pem("CERTIFICATE", &chain[0]))?;
        std::fs::write(path("key.pem"), pem("PRIVATE KEY", key.secret_der()))?;
        std::fs::create_dir_all(path("tmp"))?;
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let d = dir.path().display();
        let config = format!(
            r#"daemon off;
worker_processes auto;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port} ssl;
        server_name {name};
        ssl_certificate {d}/cert.pem;
        ssl_certificate_key {d}/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        location = /small {{ default_type text/plain; return 200 "hello, agent\n"; }}
        location = /injected {{
            if ($http_{header} != "{SECRET_VALUE}") {{ return 403; }}
            default_type text/plain;
            return 200 "hello, agent\n";
        }}
    }}
}}
"#,
            header = SECRET_HEADER.replace('-', "_"),
        );
        std::fs::write(path("nginx.conf"), config)?;
        let log = std::fs::File::create(path("stderr.log"))?;
        let child = Command::new("nginx")
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(path("nginx.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start nginx")?;
        let mut me = Self { child, addr, ca, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = me.child.try_wait()? {
                bail!("nginx exited ({status}): {}", me.logs());
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(me);
            }
            if Instant::now() >= deadline {
                bail!("nginx did not listen on {addr}: {}", me.logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its CA certificate, PEM (for the gateway's upstream trust).
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A client configuration trusting only its CA, HTTP/1.1 by ALPN, no resumption needed (keep-alive).
    pub fn client_tls(&self) -> Arc<rustls::ClientConfig> {
        self.ca.client_config(&[b"http/1.1"])
    }

    /// CPU time (user + system) of the master and its workers so far.
    pub fn cpu(&self) -> Duration {
        let master = self.child.id();
        let mut total = crate::mitm::process_cpu(master).unwrap_or_default();
        // Workers are the master's children.
        if let Ok(children) = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children")) {
            for pid in children.split_whitespace().filter_map(|p| p.parse().ok()) {
                total += crate::mitm::process_cpu(pid).unwrap_or_default();
            }
        }
        total
    }

    fn logs(&self) -> String {
        let read = |file: &str| std::fs::read_to_string(self.dir.path().join(file)).unwrap_or_default();
        format!("{} {}", read("stderr.log").trim(), read("error.log").trim())
    }

    /// The directory holding its configuration and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // Our own child, by its pid: SIGTERM makes the master stop its workers and exit.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
