//! The tunnel server (S2): `sandboxd` in every sandbox connects to its agent's tunnel port on the gateway
//! and authenticates the current boot with a fresh 256-bit token.
//!
//! The agent is identified by the listener a tunnel arrives on (bound at that agent's `.2`, reachable only
//! from its network), never by what the sandbox says; the token proves it is the current boot. Only the
//! token's SHA-256 is kept (and persisted, so a restarted runtime accepts running sandboxes again: S12), and
//! only while the sandbox runs: stopping it forgets the hash, and the next start issues a new token.
//!
//! Protocol (line based, defined once in [`sandboxd::contract::tunnel`]): `AGENTHOLD-TUNNEL 1 <agent> <64 hex>\n`
//! → `OK\n` | `ERR <reason>\n`; then `PING\n` → `PONG\n` every few seconds. The tunnel carries identity and
//! liveness; commands and files go through the engine API. A fresh connection may instead carry one agent
//! message (`SEND …`, P3) right after its `OK`, handed to the embedder's [`AgentMessages`] with the
//! listener's agent as the sender ([`messages`]); such a connection never becomes the keep-alive tunnel.
//!
//! The listener is reachable by untrusted code (E20): connections are budgeted per agent and in all, with a
//! reserve per agent ([`TunnelLimits`]), a hello must arrive within a few seconds, every write has a
//! deadline, and refusals are counted ([`TunnelCounters`]) and logged as one summary line per interval,
//! never a line each.
// enforces: S2

mod budget;
mod messages;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agenthold_core::AgentId;
use sandboxd::contract::{token as boot_token, tunnel as wire};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use budget::{Budget, Refusal, Slot};
pub use budget::{TunnelCounters, TunnelLimits};
pub use messages::{AgentMessages, MessageHarness, NoAgentMessages};

/// Longest hello line accepted.
const MAX_LINE: usize = wire::MAX_LINE;
/// A tunnel that sends nothing for this long is considered gone.
const LIVENESS: Duration = Duration::from_secs(30);
// A live client pings at least once per interval and waits up to the reply timeout: one missed beat is not
// a lost tunnel.
const _: () = assert!(LIVENESS.as_secs() > wire::PING_EVERY.as_secs() + wire::REPLY_TIMEOUT.as_secs());
/// Time a write (`OK`, `ERR`, `PONG`) may take: a peer that does not read is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept (out of descriptors, …) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A fresh boot token (64 lower-case hex characters) and its SHA-256.
#[must_use]
pub fn new_token() -> (String, [u8; 32]) {
    let mut bytes = [0u8; boot_token::BYTES];
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
    /// Incremented per new boot, revocation and keep-alive tunnel (at its first `PING`), so an old
    /// connection does not clear a newer one's state.
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

/// The embedder's agent message hook.
#[derive(Clone)]
struct Hook(Arc<dyn AgentMessages>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentMessages")
    }
}

/// Tunnel state of every agent.
#[derive(Debug)]
pub struct TunnelServer {
    agents: Mutex<HashMap<AgentId, AgentTunnel>>,
    budget: Arc<Budget>,
    messages: Hook,
}

impl Default for TunnelServer {
    fn default() -> Self {
        Self {
            agents: Mutex::new(HashMap::new()),
            budget: Budget::new(TunnelLimits::default()),
            messages: Hook(Arc::new(NoAgentMessages)),
        }
    }
}

impl TunnelServer {
    /// An empty server with the default [`TunnelLimits`].
    #[must_use]
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// An empty server with these limits.
    #[must_use]
    pub fn with_limits(limits: TunnelLimits) -> Arc<Self> {
        Self::with_messages(limits, Arc::new(NoAgentMessages))
    }

    /// An empty server with these limits that hands agent messages to `messages`.
    #[must_use]
    pub fn with_messages(limits: TunnelLimits, messages: Arc<dyn AgentMessages>) -> Arc<Self> {
        Arc::new(Self {
            agents: Mutex::new(HashMap::new()),
            budget: Budget::new(limits),
            messages: Hook(messages),
        })
    }

    /// The limits in force.
    #[must_use]
    pub fn limits(&self) -> TunnelLimits {
        self.budget.limits
    }

    /// What the listeners did, all agents together.
    #[must_use]
    pub fn counters(&self) -> TunnelCounters {
        self.budget.counters()
    }

    /// What `agent`'s listener did (zero for an agent never served or forgotten).
    #[must_use]
    pub fn agent_counters(&self, agent: &AgentId) -> TunnelCounters {
        self.budget.agent_counters(agent)
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

    /// Forget `agent` (its counters too, once its last connection closed).
    pub fn forget(&self, agent: &AgentId) {
        self.lock().remove(agent);
        self.budget.forget(agent);
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

    /// Serve `agent`'s tunnel listener until `cancel`. Each connection takes a slot of the agent's budget
    /// ([`TunnelLimits`]); one that gets none is closed at once.
    pub async fn serve(self: Arc<Self>, agent: AgentId, listener: TcpListener, cancel: CancellationToken) {
        let mut summary = tokio::time::interval(self.budget.limits.log_interval);
        summary.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let accepted = tokio::select! {
                () = cancel.cancelled() => return,
                _ = summary.tick() => {
                    self.budget.flush();
                    continue;
                }
                a = listener.accept() => a,
            };
            match accepted {
                Ok((stream, _)) => {
                    // Over budget: dropping the stream closes it before anything is read.
                    let Some(slot) = self.budget.admit(&agent) else {
                        continue;
                    };
                    let this = Arc::clone(&self);
                    let agent = agent.clone();
                    let cancel = cancel.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            () = this.connection(&agent, stream, slot) => {}
                            () = cancel.cancelled() => {}
                        }
                    });
                }
                Err(_) => {
                    self.budget.refused(&agent, Refusal::AcceptError);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }

    /// Check a hello line; the agent's generation when it was accepted, or why it is refused.
    fn authenticate(&self, agent: &AgentId, line: &str) -> Result<u64, Refusal> {
        let hello = wire::parse_hello(line).map_err(|_| Refusal::BadHello)?;
        if hello.agent != agent.as_str() {
            return Err(Refusal::WrongAgent);
        }
        let presented = token_hash(hello.token);
        let mut agents = self.lock();
        let t = agents.get_mut(agent).ok_or(Refusal::UnknownAgent)?;
        let expected = t.token_hash.ok_or(Refusal::NotRunning)?;
        // Compare hashes in constant time: no early exit on the first differing byte.
        if presented
            .iter()
            .zip(expected.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            != 0
        {
            return Err(Refusal::BadToken);
        }
        // The boot is alive; whether this connection becomes its keep-alive tunnel (and replaces an older
        // one) is decided by its first line: a `PING` claims, a `SEND` does not.
        t.last_seen = Some(Instant::now());
        Ok(t.generation)
    }

    /// Make the connection authenticated at `generation` the agent's keep-alive tunnel; the new generation,
    /// or `None` when the token changed since the hello.
    fn claim(&self, agent: &AgentId, generation: u64) -> Option<u64> {
        let mut agents = self.lock();
        let t = agents.get_mut(agent)?;
        if t.generation != generation || t.token_hash.is_none() {
            return None;
        }
        t.generation += 1;
        t.last_seen = Some(Instant::now());
        Some(t.generation)
    }

    /// One connection, holding `_slot` of the agent's budget until it ends.
    async fn connection(&self, agent: &AgentId, stream: TcpStream, _slot: Slot) {
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::with_capacity(2 * MAX_LINE, read);
        let mut line = String::new();
        // Each line is read through its own `take`: a sandbox that never sends a newline gets cut off at
        // MAX_LINE bytes instead of growing the buffer; the whole hello has one deadline.
        let limit = MAX_LINE as u64 + 1;
        let hello = tokio::time::timeout(
            self.budget.limits.hello_timeout,
            (&mut reader).take(limit).read_line(&mut line),
        )
        .await;
        let generation = match hello {
            Err(_) => Err(Refusal::HelloTimeout),
            Ok(Ok(n)) if n > 0 && n <= MAX_LINE => self.authenticate(agent, line.trim_end()),
            Ok(_) => Err(Refusal::BadHello),
        };
        let generation = match generation {
            Ok(g) => g,
            Err(why) => {
                self.budget.refused(agent, why);
                if !matches!(why, Refusal::HelloTimeout) {
                    let _ = send(&mut write, wire::err(why.as_str()).as_bytes()).await;
                }
                return;
            }
        };
        self.budget.authenticated(agent);
        tracing::debug!(agent = %agent, "tunnel up");
        if !send(&mut write, wire::line(wire::OK).as_bytes()).await {
            return;
        }
        // The first line decides: one agent message, or the keep-alive tunnel.
        line.clear();
        match tokio::time::timeout(LIVENESS, (&mut reader).take(limit).read_line(&mut line)).await {
            Ok(Ok(n)) if n > 0 && n <= MAX_LINE && messages::is_request(&line) => {
                let request = line.strip_suffix('\n').unwrap_or(&line);
                let answer =
                    messages::serve(&*self.messages.0, &self.budget, agent, request, &mut reader).await;
                let _ = send(&mut write, answer.as_bytes()).await;
                return;
            }
            Ok(Ok(n)) if n > 0 && n <= MAX_LINE && line.trim_end() == wire::PING => {}
            _ => return,
        }
        let Some(generation) = self.claim(agent, generation) else {
            return;
        };
        let mut first = true;
        loop {
            if !std::mem::take(&mut first) {
                line.clear();
                match tokio::time::timeout(LIVENESS, (&mut reader).take(limit).read_line(&mut line)).await {
                    Ok(Ok(n)) if n > 0 && n <= MAX_LINE && line.trim_end() == wire::PING => {}
                    _ => break,
                }
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
            if !send(&mut write, wire::line(wire::PONG).as_bytes()).await {
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

/// Write `bytes` within [`WRITE_TIMEOUT`]; whether it was written.
async fn send(write: &mut tokio::net::tcp::OwnedWriteHalf, bytes: &[u8]) -> bool {
    matches!(
        tokio::time::timeout(WRITE_TIMEOUT, write.write_all(bytes)).await,
        Ok(Ok(()))
    )
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod messages_tests;
