//! Probes played from inside a sandbox and the host-side canaries that must never see them.
//!
//! [`run`] sends a batch of TCP connects, UDP datagrams and ICMP echoes from one Python process (non-blocking
//! sockets, one `select` loop, so a hundred probes take one timeout), and reports per probe whether it
//! connected, what came back and which error it met. [`Canary`] listens on the host on every address
//! (`[::]`, dual stack) and records every connection and datagram; it greets with [`CANARY_BANNER`], so a
//! probe that reached it also says so from the inside.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agenthold_core::AgentId;
use agenthold_sandbox::Runtime;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinHandle;

use crate::support::{host, python};

/// What a canary says first on every connection.
pub const CANARY_BANNER: &str = "CANARY-HIT";

/// One probe.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Probe {
    /// `tcp`, `udp` or `icmp`.
    pub kind: &'static str,
    /// An address (IPv6 link-local with `%eth0`).
    pub host: String,
    /// Port (0 for ICMP).
    pub port: u16,
    /// Bytes to send (after connecting, for TCP).
    pub payload: String,
}

impl Probe {
    pub fn tcp(host: impl std::fmt::Display, port: u16, payload: &str) -> Self {
        Self {
            kind: "tcp",
            host: host.to_string(),
            port,
            payload: payload.into(),
        }
    }

    pub fn udp(host: impl std::fmt::Display, port: u16) -> Self {
        Self {
            kind: "udp",
            host: host.to_string(),
            port,
            payload: "PROBE\n".into(),
        }
    }

    pub fn icmp(host: impl std::fmt::Display) -> Self {
        Self {
            kind: "icmp",
            host: host.to_string(),
            port: 0,
            payload: String::new(),
        }
    }
}

/// What a probe met.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Outcome {
    pub kind: String,
    pub host: String,
    pub port: u16,
    /// TCP: the handshake completed (with whoever answered); UDP/ICMP: the datagram was sent.
    pub connected: bool,
    /// Bytes received (latin-1).
    pub data: String,
    /// UDP/ICMP: a reply came back.
    pub reply: bool,
    /// The first error (errno name), if any.
    pub error: Option<String>,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}:{} connected={} reply={} error={:?} data={:?}",
            self.kind,
            self.host,
            self.port,
            self.connected,
            self.reply,
            self.error,
            self.data.chars().take(80).collect::<String>()
        )
    }
}

const PROGRAM: &str = r#"
import errno, json, select, socket, struct, sys, time
DEADLINE = time.monotonic() + TIMEOUT
def ename(e):
    return errno.errorcode.get(e, str(e))
out, live = [], {}
for i, p in enumerate(PROBES):
    r = {"i": i, "kind": p["kind"], "host": p["host"], "port": p["port"], "connected": False, "data": "",
         "reply": False, "error": None}
    out.append(r)
    try:
        fam = socket.AF_INET6 if ":" in p["host"] else socket.AF_INET
        addr = socket.getaddrinfo(p["host"], p["port"], fam, 0, 0, socket.AI_NUMERICHOST)[0][4]
        if p["kind"] == "tcp":
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.setblocking(False)
            e = s.connect_ex(addr)
            if e not in (0, errno.EINPROGRESS):
                r["error"] = ename(e); s.close(); continue
        elif p["kind"] == "udp":
            s = socket.socket(fam, socket.SOCK_DGRAM)
            s.setblocking(False)
            s.sendto(p["payload"].encode(), addr)
            r["connected"] = True
        else:
            proto = socket.IPPROTO_ICMP if fam == socket.AF_INET else socket.IPPROTO_ICMPV6
            s = socket.socket(fam, socket.SOCK_DGRAM, proto)
            s.setblocking(False)
            kind = 8 if fam == socket.AF_INET else 128
            s.sendto(struct.pack("!BBHHH", kind, 0, 0, 0, 1) + b"agenthold-probe", addr)
            r["connected"] = True
        live[s] = r
    except OSError as e:
        r["error"] = ename(e.errno) if e.errno else str(e)
sent = set()
while live and time.monotonic() < DEADLINE:
    wait_w = [s for s, r in live.items() if r["kind"] == "tcp" and not r["connected"]]
    rd, wr, _ = select.select(list(live), wait_w, [], max(0.0, min(0.2, DEADLINE - time.monotonic())))
    for s in wr:
        r = live[s]
        e = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if e:
            r["error"] = ename(e); s.close(); del live[s]; continue
        r["connected"] = True
        p = PROBES[r["i"]]
        if p["payload"]:
            try:
                s.send(p["payload"].encode())
            except OSError as e:
                r["error"] = ename(e.errno)
    for s in rd:
        if s not in live:
            continue
        r = live[s]
        if r["kind"] == "tcp" and not r["connected"]:
            continue
        try:
            data = s.recv(400)
        except OSError as e:
            r["error"] = r["error"] or ename(e.errno); s.close(); del live[s]; continue
        if r["kind"] != "tcp":
            r["reply"] = True
        if not data:
            s.close(); del live[s]; continue
        r["data"] += data.decode("latin-1")
for s in live:
    s.close()
print(json.dumps(out))
"#;

/// Run `probes` from inside `agent`, all at once, each given at most `timeout`.
pub async fn run(runtime: &Runtime, agent: &AgentId, probes: &[Probe], timeout: Duration) -> Vec<Outcome> {
    let program = format!(
        "import json\nPROBES = json.loads({:?})\nTIMEOUT = {}\n{PROGRAM}",
        serde_json::to_string(probes).unwrap(),
        timeout.as_secs_f64()
    );
    let out = python(runtime, agent, &program).await;
    assert_eq!(out.code, 0, "the probe program failed:\n{out}");
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("probe output {e}:\n{out}"))
}

/// Host listeners on every address: a few TCP ports and one UDP port; records every peer.
pub struct Canary {
    pub tcp_ports: Vec<u16>,
    pub udp_port: u16,
    hits: Arc<Mutex<Vec<String>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Canary {
    /// `tcp` TCP listeners and one UDP socket, each on `[::]` (dual stack), port 0.
    pub async fn start(tcp: usize) -> Self {
        let hits = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let mut tcp_ports = Vec::new();
        for _ in 0..tcp {
            let listener = TcpListener::bind("[::]:0").await.expect("bind a TCP canary");
            tcp_ports.push(listener.local_addr().unwrap().port());
            let hits = Arc::clone(&hits);
            tasks.push(tokio::spawn(async move {
                while let Ok((mut stream, peer)) = listener.accept().await {
                    let port = stream.local_addr().map_or(0, |a| a.port());
                    hits.lock().unwrap().push(format!("tcp {peer} -> :{port}"));
                    let _ = stream.write_all(format!("{CANARY_BANNER}\n").as_bytes()).await;
                }
            }));
        }
        let udp = UdpSocket::bind("[::]:0").await.expect("bind a UDP canary");
        let udp_port = udp.local_addr().unwrap().port();
        let udp_hits = Arc::clone(&hits);
        tasks.push(tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, peer)) = udp.recv_from(&mut buf).await {
                udp_hits.lock().unwrap().push(format!("udp {peer} ({n} bytes)"));
                let _ = udp.send_to(CANARY_BANNER.as_bytes(), peer).await;
            }
        }));
        Self {
            tcp_ports,
            udp_port,
            hits,
            tasks,
        }
    }

    /// Everything that reached a canary so far.
    pub fn hits(&self) -> Vec<String> {
        self.hits.lock().unwrap().clone()
    }

    /// Forget the hits so far (after a positive control).
    pub fn clear(&self) {
        self.hits.lock().unwrap().clear();
    }

    /// Positive control: the host itself reaches every canary on `addr`, so a silent canary later means
    /// something. Clears the hits afterwards.
    pub async fn self_test(&self, addr: IpAddr) {
        for port in &self.tcp_ports {
            let mut s = tokio::net::TcpStream::connect(SocketAddr::new(addr, *port))
                .await
                .expect("reach the canary");
            let _ = s.shutdown().await;
        }
        let bind = if addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        let udp = UdpSocket::bind(bind).await.unwrap();
        udp.send_to(b"self-test", SocketAddr::new(addr, self.udp_port))
            .await
            .unwrap();
        let want = self.tcp_ports.len() + 1;
        for _ in 0..50 {
            if self.hits().len() >= want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            self.hits().len(),
            want,
            "the canary does not record: {:?}",
            self.hits()
        );
        self.clear();
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// One address of the host.
#[derive(Debug, Clone)]
pub struct HostAddr {
    pub iface: String,
    pub addr: IpAddr,
}

impl HostAddr {
    /// How a sandbox writes it (link-local IPv6 scoped to the sandbox's `eth0`).
    pub fn as_seen_from_sandbox(&self) -> String {
        match self.addr {
            IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => format!("{v6}%eth0"),
            a => a.to_string(),
        }
    }
}

/// Every address the host has, read now (`ip -j addr`): all interfaces but loopback and veth ends.
pub fn host_addresses() -> Vec<HostAddr> {
    let out = host("ip", &["-j", "addr", "show"]);
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j addr");
    let mut addrs = Vec::new();
    for link in links.as_array().expect("a list of links") {
        let iface = link["ifname"].as_str().unwrap_or_default();
        if iface == "lo" || iface.starts_with("veth") {
            continue;
        }
        for info in link["addr_info"].as_array().into_iter().flatten() {
            if let Some(addr) = info["local"].as_str().and_then(|a| a.parse().ok()) {
                addrs.push(HostAddr {
                    iface: iface.to_owned(),
                    addr,
                });
            }
        }
    }
    addrs
}

/// The host's primary IPv4 address (of the default route's interface).
pub fn primary_v4(addrs: &[HostAddr]) -> IpAddr {
    let out = host("ip", &["-j", "route", "show", "default"]);
    let routes: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j route");
    let dev = routes[0]["dev"].as_str().expect("a default route").to_owned();
    addrs
        .iter()
        .find(|a| a.iface == dev && a.addr.is_ipv4())
        .expect("a primary IPv4 address")
        .addr
}
