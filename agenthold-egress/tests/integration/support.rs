//! Stand-in gateway listeners and a client probe for the datapath tests.
//!
//! The real gateway is not needed to test the rules: a listener bound where the gateway would bind
//! (`.2:port` inside the gateway namespace) records who reached it and with which original destination,
//! and a small Python probe in the sandbox reports whether it got an answer, was refused, or was met
//! with silence (a drop).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agenthold_egress::netns::NetNs;
use agenthold_testsupport::TestAgent;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

/// How long a probe waits for an answer before calling it a drop. Packets on a veth arrive within
/// microseconds; the margin is for a loaded machine running tests in parallel.
pub(crate) const SILENCE: &str = "1.0";

/// One TCP connection a stand-in accepted.
#[derive(Debug, Clone)]
pub(crate) struct Accepted {
    pub(crate) peer: SocketAddr,
    /// `SO_ORIGINAL_DST`: where the client meant to go before the `dnat`.
    pub(crate) original_dst: Option<SocketAddrV4>,
    pub(crate) first_bytes: Vec<u8>,
}

/// A TCP listener bound inside a namespace that records every connection and answers with a JSON line
/// (wrapped in an HTTP response when the client spoke HTTP, so curl is happy).
pub(crate) struct TcpStandIn {
    pub(crate) accepted: Arc<Mutex<Vec<Accepted>>>,
    task: JoinHandle<()>,
}

impl TcpStandIn {
    pub(crate) fn bind(ns: &NetNs, addr: SocketAddr, name: &'static str) -> Self {
        let listener = ns.bind_tcp(addr).expect("bind the stand-in TCP listener");
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            while let Ok((mut stream, peer)) = listener.accept().await {
                let original_dst = socket2::SockRef::from(&stream)
                    .original_dst_v4()
                    .ok()
                    .and_then(|a| a.as_socket_ipv4());
                // Logged at once: a client that sends nothing still counts as having got through.
                let index = {
                    let mut log = log.lock().unwrap();
                    log.push(Accepted {
                        peer,
                        original_dst,
                        first_bytes: Vec::new(),
                    });
                    log.len() - 1
                };
                let mut buf = vec![0u8; 4096];
                let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await;
                let first_bytes = buf[..read.ok().and_then(Result::ok).unwrap_or(0)].to_vec();
                let body = serde_json::json!({
                    "listener": name,
                    "original_dst": original_dst.map(|a| a.to_string()),
                    "peer": peer.to_string(),
                })
                .to_string();
                let reply = if first_bytes.starts_with(b"GET ") || first_bytes.starts_with(b"POST ") {
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                         connection: close\r\n\r\n{body}",
                        body.len()
                    )
                } else {
                    body
                };
                log.lock().unwrap()[index].first_bytes = first_bytes;
                let _ = stream.write_all(reply.as_bytes()).await;
                let _ = stream.shutdown().await;
            }
        });
        Self { accepted, task }
    }

    pub(crate) fn accepted(&self) -> Vec<Accepted> {
        self.accepted.lock().unwrap().clone()
    }
}

impl Drop for TcpStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The datagrams a [`UdpStandIn`] received: sender and payload.
pub(crate) type Datagrams = Arc<Mutex<Vec<(SocketAddr, Vec<u8>)>>>;

/// A UDP socket bound inside a namespace that records every datagram and answers `NAME:PAYLOAD`.
pub(crate) struct UdpStandIn {
    pub(crate) received: Datagrams,
    task: JoinHandle<()>,
}

impl UdpStandIn {
    pub(crate) fn bind(ns: &NetNs, addr: SocketAddr, name: &'static str) -> Self {
        let socket = ns.bind_udp(addr).expect("bind the stand-in UDP socket");
        let socket = tokio::net::UdpSocket::from_std(socket).unwrap();
        let received: Datagrams = Arc::default();
        let log = Arc::clone(&received);
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok((len, peer)) = socket.recv_from(&mut buf).await {
                log.lock().unwrap().push((peer, buf[..len].to_vec()));
                let mut reply = format!("{name}:").into_bytes();
                reply.extend_from_slice(&buf[..len]);
                let _ = socket.send_to(&reply, peer).await;
            }
        });
        Self { received, task }
    }

    pub(crate) fn received(&self) -> Vec<(SocketAddr, Vec<u8>)> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for UdpStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits (up to 2 s) until `done` holds: a listener logs a connection on its own task, a moment after the
/// client's `connect` has returned.
pub(crate) async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The client side, run with `python3 -c PROBE MODE HOST PORT TIMEOUT [PAYLOAD [SOURCE]]` inside a
/// sandbox. Prints one JSON object: `{"result": "reply", "reply": …}`, `{"result": "timeout"}` (silence:
/// the packet was dropped), `{"result": "refused"}` (an RST or ICMP unreachable came back) or
/// `{"result": "error", …}`. UDP sockets are connected, so only an answer *from HOST:PORT* counts (it
/// proves the reverse NAT of a redirected query). `icmp` sends one echo request on a raw socket.
const PROBE: &str = r#"
import json, os, socket, struct, sys, time
mode, host, port, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
payload = (sys.argv[5] if len(sys.argv) > 5 else "probe").encode()
source = sys.argv[6] if len(sys.argv) > 6 else None
def checksum(data):
    data += b"\0" * (len(data) % 2)
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF
try:
    if mode == "icmp":
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        ident = os.getpid() & 0xFFFF
        header = struct.pack("!BBHHH", 8, 0, 0, ident, 1)
        s.sendto(struct.pack("!BBHHH", 8, 0, checksum(header + payload), ident, 1) + payload, (host, 0))
        deadline = time.time() + timeout
        out = {"result": "timeout"}
        while time.time() < deadline:
            s.settimeout(max(deadline - time.time(), 0.01))
            packet, addr = s.recvfrom(4096)
            kind, _, _, rid, _ = struct.unpack("!BBHHH", packet[20:28])
            if addr[0] == host and kind == 0 and rid == ident:
                out = {"result": "reply", "reply": "echo reply"}
                break
    else:
        kind = socket.SOCK_STREAM if mode == "tcp" else socket.SOCK_DGRAM
        s = socket.socket(socket.AF_INET, kind)
        if source:
            s.bind((source, 0))
        s.settimeout(timeout)
        s.connect((host, port))
        s.send(payload)
        out = {"result": "reply", "reply": s.recv(4096).decode(errors="replace")}
except socket.timeout:
    out = {"result": "timeout"}
except ConnectionRefusedError:
    out = {"result": "refused"}
except OSError as e:
    out = {"result": "error", "error": str(e)}
print(json.dumps(out))
"#;

/// Runs the probe in `agent`'s sandbox and returns its verdict. The arguments are copied before the
/// future starts, so probes built from temporaries can run side by side in `tokio::join!`.
pub(crate) fn probe<'a>(
    agent: &'a TestAgent,
    mode: &str,
    target: SocketAddr,
    extra: &[&str],
) -> impl Future<Output = Probe> + 'a {
    let fixed = ["python3", "-c", PROBE, mode];
    let target = [
        target.ip().to_string(),
        target.port().to_string(),
        SILENCE.to_owned(),
    ];
    let args: Vec<String> = fixed
        .iter()
        .map(|a| (*a).to_owned())
        .chain(target)
        .chain(extra.iter().map(|a| (*a).to_owned()))
        .collect();
    async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = agent.run_async(&args).await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let json: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            let stderr = String::from_utf8_lossy(&output.stderr);
            panic!("probe printed {stdout:?} ({e}); stderr: {stderr}")
        });
        Probe(json)
    }
}

/// A probe's verdict.
#[derive(Debug)]
pub(crate) struct Probe(pub(crate) Value);

impl Probe {
    pub(crate) fn result(&self) -> &str {
        self.0["result"].as_str().unwrap_or_default()
    }

    /// The answer's text; panics (with the verdict) when there was none.
    pub(crate) fn reply(&self) -> &str {
        assert_eq!(self.result(), "reply", "expected an answer, got {:?}", self.0);
        self.0["reply"].as_str().unwrap_or_default()
    }

    /// The answer parsed as JSON (what a TCP stand-in sends).
    pub(crate) fn reply_json(&self) -> Value {
        serde_json::from_str(self.reply()).unwrap()
    }

    /// Asserts that nothing came back at all: no answer, no RST, no ICMP error.
    pub(crate) fn assert_silence(&self, what: &str) {
        assert_eq!(
            self.result(),
            "timeout",
            "{what}: expected silence (a drop), got {:?}",
            self.0
        );
    }
}

/// `ip:port` as a socket address.
pub(crate) fn at(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::from((ip, port))
}

/// `nft -j list ARGS…` inside `ns`, as JSON; panics with nft's message when it fails.
pub(crate) fn nft_json(ns: &NetNs, args: &[&str]) -> Value {
    let output = ns
        .command("nft")
        .arg("-j")
        .arg("list")
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}
