//! The DNS cache comparison (issue 14, item 2): dnsmasq as the reference cache, and a DNS load whose names
//! never repeat, so the gateway's forward path without its cache stays visible.
//!
//! dnsmasq runs in the direct route's upstream namespace (across the veth pair from the direct client, where
//! the lean responder answers too), forwards to that lean responder (`--no-resolv --server=…`) with a large
//! cache, and is warmed before it is measured: what is measured is dnsmasq answering from its cache, the
//! same thing the gateway does on a hit.

use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use agenthold_egress::netns::NetNs;
use anyhow::{Context, Result, bail};

use crate::load::Outcome;

/// The dnsmasq binary (Debian package `dnsmasq-base`, or `dnsmasq`).
const DNSMASQ: &str = "/usr/sbin/dnsmasq";
/// dnsmasq's cache size (its maximum is 10 000 names).
const CACHE_SIZE: u32 = 10_000;

/// A running dnsmasq; killed on drop.
#[derive(Debug)]
pub struct Dnsmasq {
    child: Child,
    addr: SocketAddr,
}

impl Dnsmasq {
    /// Whether dnsmasq is installed.
    pub fn available() -> bool {
        std::path::Path::new(DNSMASQ).exists()
    }

    /// Starts dnsmasq inside `ns`, listening on `listen` (UDP and TCP), forwarding to `upstream` only, and
    /// waits until it answers.
    ///
    /// # Errors
    /// When dnsmasq is missing, fails to start, or does not answer within five seconds.
    pub fn start(ns: &NetNs, listen: SocketAddr, upstream: SocketAddr, probe: &str) -> Result<Self> {
        if !Self::available() {
            bail!("{DNSMASQ} not found: apt-get install -y dnsmasq-base");
        }
        let child = ns
            .command(DNSMASQ)
            .args([
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--no-poll",
                "--bind-interfaces",
                "--user=root",
                "--pid-file=",
                "--log-facility=/dev/null",
                "--dns-forward-max=1000",
            ])
            .arg(format!("--listen-address={}", listen.ip()))
            .arg(format!("--port={}", listen.port()))
            .arg(format!("--server={}#{}", upstream.ip(), upstream.port()))
            .arg(format!("--cache-size={CACHE_SIZE}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start dnsmasq")?;
        let mut dnsmasq = Self { child, addr: listen };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = dnsmasq.child.try_wait()? {
                bail!("dnsmasq exited at start: {status}");
            }
            let answered = crate::load::in_namespace(Some(ns), || crate::load::resolve_a(listen, probe));
            if answered.is_ok() {
                return Ok(dnsmasq);
            }
            if Instant::now() > deadline {
                dnsmasq.stop();
                bail!("dnsmasq at {listen} did not answer within 5 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Where dnsmasq listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
    }
}

/// DNS queries per second over UDP like [`crate::load::dns_queries`], but every query asks a name never
/// asked before (`u<N>-<run>.<suffix>`), so no cache on the way can answer it. Blocking sockets: call it on a
/// thread inside the client's namespace.
///
/// # Errors
/// When no query at all was answered, or the socket fails.
pub fn unique_queries(
    server: SocketAddr,
    suffix: &str,
    window: usize,
    duration: Duration,
) -> Result<Outcome> {
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mut serial = 0u64;
    crate::load::dns_query_loop(server, window, duration, |packet, id| {
        encode_a_query(packet, id, &format!("u{serial}-{run:x}.{suffix}"))?;
        serial += 1;
        Ok(())
    })
}

/// One `A` question for `name` (RD set, no EDNS) into `out`, by hand: cheaper than a full encoder per query.
fn encode_a_query(out: &mut Vec<u8>, id: u16, name: &str) -> Result<()> {
    out.clear();
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        let len = u8::try_from(label.len()).ok().filter(|l| (1..64).contains(l));
        let Some(len) = len else {
            bail!("bad label in {name:?}");
        };
        out.push(len);
        out.extend_from_slice(label.as_bytes());
    }
    out.extend_from_slice(&[0, 0, 1, 0, 1]);
    Ok(())
}
