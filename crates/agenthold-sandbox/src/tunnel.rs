//! The tunnel server (S2): `sandboxd` in every sandbox connects to its agent's tunnel port on the gateway
//! and authenticates the current boot with a fresh 256-bit token.
//!
//! The agent is identified by the listener a tunnel arrives on (bound at that agent's `.2`, reachable only
//! from its network), never by what the sandbox says; the token proves it is the current boot. Only the
//! token's SHA-256 is kept (and persisted, so a restarted runtime accepts running sandboxes again: S12), and
//! only while the sandbox runs: stopping it forgets the hash, and the next start issues a new token.
//!
//! Protocol (line based): `AGENTHOLD-TUNNEL 1 <agent> <64 hex>\n` → `OK\n` | `ERR <reason>\n`; then `PING\n` →
//! `PONG\n` every few seconds. The tunnel carries identity and liveness; commands and files go through the
//! engine API.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agenthold_core::AgentId;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Longest hello line accepted.
const MAX_LINE: usize = 256;
/// A tunnel that sends nothing for this long is considered gone.
const LIVENESS: Duration = Duration::from_secs(30);
/// Time allowed for the hello after connecting.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// A fresh boot token (64 lower-case hex characters) and its SHA-256.
#[must_use]
pub fn new_token() -> (String, [u8; 32]) {
    let mut bytes = [0u8; 32];
    // A token from a broken generator would be guessable; stopping is better.
    #[allow(clippy::expect_used)]
    getrandom::fill(&mut bytes).expect("operating system random number generator failed");
    let token = hex::encode(bytes);
    let hash = token_hash(&token);
    (token, hash)
}

/// SHA-256 of a token as sent on the wire.
#[must_use]
pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// State of one agent's tunnel.
#[derive(Debug, Default, Clone)]
struct AgentTunnel {
    /// Hash of the current boot's token; `None` while the sandbox is not running.
    token_hash: Option<[u8; 32]>,
    /// When the current tunnel last spoke.
    last_seen: Option<Instant>,
    /// Incremented per accepted tunnel, so an old connection does not clear a newer one's state.
    generation: u64,
}

/// Whether an agent's sandbox is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelStatus {
    /// A tunnel authenticated with the current token spoke within the liveness window.
    Connected,
    /// No live tunnel.
    Disconnected,
}

/// Tunnel state of every agent.
#[derive(Debug, Default)]
pub struct TunnelServer {
    agents: Mutex<HashMap<AgentId, AgentTunnel>>,
}

impl TunnelServer {
    /// An empty server.
    #[must_use]
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<AgentId, AgentTunnel>> {
        self.agents.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Accept tunnels of `agent` authenticated by the token with this hash (a new boot).
    pub fn expect(&self, agent: &AgentId, hash: [u8; 32]) {
        let mut agents = self.lock();
        let t = agents.entry(agent.clone()).or_default();
        t.token_hash = Some(hash);
        t.last_seen = None;
        t.generation += 1;
    }

    /// Stop accepting `agent`'s token (its sandbox stopped); a live tunnel is dropped at its next message.
    pub fn revoke(&self, agent: &AgentId) {
        let mut agents = self.lock();
        if let Some(t) = agents.get_mut(agent) {
            t.token_hash = None;
            t.last_seen = None;
            t.generation += 1;
        }
    }

    /// Forget `agent`.
    pub fn forget(&self, agent: &AgentId) {
        self.lock().remove(agent);
    }

    /// Whether `agent`'s sandbox has a live tunnel.
    #[must_use]
    pub fn status(&self, agent: &AgentId) -> TunnelStatus {
        let agents = self.lock();
        match agents.get(agent).and_then(|t| t.last_seen) {
            Some(seen) if seen.elapsed() < LIVENESS => TunnelStatus::Connected,
            _ => TunnelStatus::Disconnected,
        }
    }

    /// Serve `agent`'s tunnel listener until `cancel`.
    pub async fn serve(self: Arc<Self>, agent: AgentId, listener: TcpListener, cancel: CancellationToken) {
        loop {
            let accepted = tokio::select! {
                () = cancel.cancelled() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((stream, _)) => {
                    let this = Arc::clone(&self);
                    let agent = agent.clone();
                    let cancel = cancel.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            () = this.connection(&agent, stream) => {}
                            () = cancel.cancelled() => {}
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(agent = %agent, error = %e, "tunnel accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Check a hello line; the generation of the accepted tunnel, or why it is refused.
    fn authenticate(&self, agent: &AgentId, line: &str) -> Result<u64, &'static str> {
        let mut words = line.split_ascii_whitespace();
        if words.next() != Some("AGENTHOLD-TUNNEL") || words.next() != Some("1") {
            return Err("bad hello");
        }
        if words.next() != Some(agent.as_str()) {
            return Err("wrong agent");
        }
        let token = words.next().ok_or("no token")?;
        let presented = token_hash(token);
        let mut agents = self.lock();
        let t = agents.get_mut(agent).ok_or("unknown agent")?;
        let expected = t.token_hash.ok_or("sandbox not running")?;
        // Compare hashes in constant time: no early exit on the first differing byte.
        if presented
            .iter()
            .zip(expected.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            != 0
        {
            return Err("bad token");
        }
        t.generation += 1;
        t.last_seen = Some(Instant::now());
        Ok(t.generation)
    }

    async fn connection(&self, agent: &AgentId, stream: TcpStream) {
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::new(read);
        let mut line = String::new();
        // Each line is read through its own `take`: a sandbox that never sends a newline gets cut off at
        // MAX_LINE bytes instead of growing the buffer.
        let limit = MAX_LINE as u64 + 1;
        let hello = tokio::time::timeout(HELLO_TIMEOUT, (&mut reader).take(limit).read_line(&mut line)).await;
        if !matches!(hello, Ok(Ok(n)) if n > 0 && n <= MAX_LINE) {
            return;
        }
        let generation = match self.authenticate(agent, line.trim_end()) {
            Ok(g) => g,
            Err(why) => {
                tracing::warn!(agent = %agent, reason = why, "tunnel refused");
                let _ = write.write_all(format!("ERR {why}\n").as_bytes()).await;
                return;
            }
        };
        tracing::debug!(agent = %agent, "tunnel up");
        if write.write_all(b"OK\n").await.is_err() {
            return;
        }
        loop {
            line.clear();
            match tokio::time::timeout(LIVENESS, (&mut reader).take(limit).read_line(&mut line)).await {
                Ok(Ok(n)) if n > 0 && n <= MAX_LINE && line.trim_end() == "PING" => {}
                _ => break,
            }
            {
                let mut agents = self.lock();
                match agents.get_mut(agent) {
                    Some(t) if t.generation == generation && t.token_hash.is_some() => {
                        t.last_seen = Some(Instant::now());
                    }
                    // Revoked, or superseded by a newer tunnel.
                    _ => break,
                }
            }
            if write.write_all(b"PONG\n").await.is_err() {
                break;
            }
        }
        let mut agents = self.lock();
        if let Some(t) = agents.get_mut(agent)
            && t.generation == generation
        {
            t.last_seen = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn hello(addr: std::net::SocketAddr, line: &str) -> (String, TcpStream) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(line.as_bytes()).await.unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).await.unwrap();
        (String::from_utf8_lossy(&buf[..n]).into_owned(), s)
    }

    // covers: S2
    #[tokio::test]
    async fn accepts_only_the_current_token_of_the_listener_agent() {
        let server = TunnelServer::new();
        let agent = AgentId::new("a").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        tokio::spawn(Arc::clone(&server).serve(agent.clone(), listener, cancel.clone()));
        let (token, hash) = new_token();
        assert_eq!(token.len(), 64);
        let (answer, _) = hello(addr, &format!("AGENTHOLD-TUNNEL 1 a {token}\n")).await;
        assert_eq!(answer, "ERR unknown agent\n");
        server.expect(&agent, hash);
        let (answer, _) = hello(addr, &format!("AGENTHOLD-TUNNEL 1 b {token}\n")).await;
        assert_eq!(answer, "ERR wrong agent\n");
        let (answer, _) = hello(addr, &format!("AGENTHOLD-TUNNEL 1 a {}\n", new_token().0)).await;
        assert_eq!(answer, "ERR bad token\n");
        let (answer, mut live) = hello(addr, &format!("AGENTHOLD-TUNNEL 1 a {token}\n")).await;
        assert_eq!(answer, "OK\n");
        assert_eq!(server.status(&agent), TunnelStatus::Connected);
        live.write_all(b"PING\n").await.unwrap();
        let mut buf = [0u8; 8];
        let n = live.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"PONG\n");
        server.revoke(&agent);
        assert_eq!(server.status(&agent), TunnelStatus::Disconnected);
        let (answer, _) = hello(addr, &format!("AGENTHOLD-TUNNEL 1 a {token}\n")).await;
        assert_eq!(answer, "ERR sandbox not running\n");
        cancel.cancel();
    }
}
