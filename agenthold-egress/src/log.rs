//! The request log (E16): per agent, the newest `log_keep` entries within `log_max_bytes`, readable as a
//! snapshot and as a live stream, serialisable as JSON lines.
//!
//! Every DNS query, connection and HTTP request the gateway decides on is one [`LogEntry`]. Spliced TLS or
//! TCP, CONNECT tunnels and WebSockets are recorded when they close, with the bytes that crossed each way
//! (and the reason `revoked` when a policy change closed them); one still open a second after it started
//! is also recorded then, as `phase: open` (stamped with its start), and its entry at the close says
//! `phase: closed`.
//!
//! Memory is bounded (E20): text fields are cut to [`MAX_HOST`], [`MAX_METHOD`], [`MAX_PATH`] and
//! [`MAX_REASON`] bytes (a cut field ends with `…`), and each agent's ring holds at most `keep` entries and
//! `max_bytes` bytes of them; what falls out is counted per agent ([`RequestLog::dropped`]).
// enforces: E16

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use agenthold_core::AgentId;
use agenthold_core::policy::{DenyReason, Verdict};
use tokio::sync::broadcast;

mod pending;
mod reason;

pub(crate) use pending::{Announcement, Counters, PendingEntry};
pub use reason::{BudgetScope, DnsFailure, Reason};

/// What was logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogKind {
    /// A DNS query to the gateway's resolver.
    Dns,
    /// A TCP connection decided by the name the agent resolved (or by address).
    Tcp,
    /// A TLS connection decided by its SNI and spliced.
    Tls,
    /// One HTTP request (plain, absolute-form through the explicit proxy, or on an intercepted stream).
    Http,
    /// A CONNECT tunnel through the explicit proxy.
    Connect,
}

/// Where a long-lived connection's entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Written when the connection opened (its byte counts are zero).
    Open,
    /// Written when it closed, with the bytes each way.
    Closed,
}

/// Longest host kept in an entry, in bytes.
pub const MAX_HOST: usize = 255;
/// Longest method (or DNS query type) kept.
pub const MAX_METHOD: usize = 32;
/// Longest path kept.
pub const MAX_PATH: usize = 1024;
/// Longest reason or secret name list kept.
pub const MAX_REASON: usize = 256;
/// What an entry costs besides its text, for the byte budget.
const ENTRY_OVERHEAD: usize = 192;

/// Whether traffic was let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Let through (also in report-only mode, where `reason` says what an allowlist would have refused).
    Allowed,
    /// Refused.
    Denied,
}

/// One line of the request log. Field names are a contract (`agenthold run --log`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "Line")]
pub struct LogEntry {
    /// Position in the log: assigned by [`RequestLog::record`] from one counter shared by every agent,
    /// starting at 1, so every recorded entry has its own, and a later entry a greater one (0 until
    /// recorded). A reader that saw entries up to `seq` resumes with [`RequestLog::since`].
    #[serde(default)]
    pub seq: u64,
    /// When the decision was made, RFC 3339 in UTC.
    pub time: String,
    /// The agent.
    pub agent: AgentId,
    /// What was logged.
    pub kind: LogKind,
    /// Host name (or address when there was no name).
    pub host: Option<String>,
    /// Destination port.
    pub port: Option<u16>,
    /// HTTP method (HTTP kinds), or the DNS query type.
    pub method: Option<String>,
    /// HTTP path (without the query string, which may carry placeholders).
    pub path: Option<String>,
    /// HTTP status answered, or the DNS response code.
    pub status: Option<u16>,
    /// Allowed or denied.
    pub decision: Decision,
    /// Why it was denied (or, in report-only mode, would have been), what failed upstream, or what else is
    /// worth noting; written as a string (see [`Reason`]).
    pub reason: Option<Reason>,
    /// Whether a secret was injected into this request.
    pub secret_injected: bool,
    /// Name of the injected secret (never its value).
    pub secret: Option<String>,
    /// Bytes from the sandbox towards the upstream.
    pub bytes_up: u64,
    /// Bytes from the upstream towards the sandbox.
    pub bytes_down: u64,
    /// For long-lived connections: whether this entry is the one written when it opened or when it closed;
    /// `null` for one-shot entries (DNS queries, HTTP requests, refusals).
    #[serde(default)]
    pub phase: Option<Phase>,
}

/// A JSON line as read back: the same fields, with the reason read in the light of the decision (see
/// [`Reason::parse`]).
#[derive(serde::Deserialize)]
struct Line {
    #[serde(default)]
    seq: u64,
    time: String,
    agent: AgentId,
    kind: LogKind,
    host: Option<String>,
    port: Option<u16>,
    method: Option<String>,
    path: Option<String>,
    status: Option<u16>,
    decision: Decision,
    reason: Option<String>,
    secret_injected: bool,
    secret: Option<String>,
    bytes_up: u64,
    bytes_down: u64,
    #[serde(default)]
    phase: Option<Phase>,
}

impl From<Line> for LogEntry {
    fn from(line: Line) -> Self {
        Self {
            reason: line.reason.map(|r| Reason::parse(&r, line.decision)),
            seq: line.seq,
            time: line.time,
            agent: line.agent,
            kind: line.kind,
            host: line.host,
            port: line.port,
            method: line.method,
            path: line.path,
            status: line.status,
            decision: line.decision,
            secret_injected: line.secret_injected,
            secret: line.secret,
            bytes_up: line.bytes_up,
            bytes_down: line.bytes_down,
            phase: line.phase,
        }
    }
}

impl LogEntry {
    /// A new entry stamped now, with the decision and reason taken from `verdict`.
    #[must_use]
    pub fn new(agent: &AgentId, kind: LogKind, verdict: Verdict) -> Self {
        let decision = if verdict.is_allowed() {
            Decision::Allowed
        } else {
            Decision::Denied
        };
        let reason = Reason::from_verdict(verdict);
        Self {
            seq: 0,
            time: now_rfc3339(),
            agent: agent.clone(),
            kind,
            host: None,
            port: None,
            method: None,
            path: None,
            status: None,
            decision,
            reason,
            secret_injected: false,
            secret: None,
            bytes_up: 0,
            bytes_down: 0,
            phase: None,
        }
    }

    /// An entry with `like`'s agent and kind and nothing else, not stamped (a stand-in left behind when an
    /// entry is moved out; never recorded).
    fn blank(like: &Self) -> Self {
        Self {
            seq: 0,
            time: String::new(),
            agent: like.agent.clone(),
            kind: like.kind,
            host: None,
            port: None,
            method: None,
            path: None,
            status: None,
            decision: like.decision,
            reason: None,
            secret_injected: false,
            secret: None,
            bytes_up: 0,
            bytes_down: 0,
            phase: None,
        }
    }

    /// Set host and port.
    #[must_use]
    pub fn to(mut self, host: impl Into<String>, port: u16) -> Self {
        self.host = Some(host.into());
        self.port = Some(port);
        self
    }

    /// Mark the entry denied for `reason`.
    pub fn deny(&mut self, reason: DenyReason) {
        self.decision = Decision::Denied;
        self.reason = Some(Reason::Denied(reason));
    }

    /// Record an upstream failure: the traffic was allowed but could not be delivered.
    pub fn fail(&mut self, reason: impl Into<String>) {
        self.reason = Some(Reason::Failed(reason.into()));
    }

    /// Set the reason, and the decision to the one it implies ([`Reason::decision`]).
    pub fn set_reason(&mut self, reason: Reason) {
        self.decision = reason.decision();
        self.reason = Some(reason);
    }

    /// Cut every text field to its limit.
    fn truncate(&mut self) {
        cut(&mut self.host, MAX_HOST);
        cut(&mut self.method, MAX_METHOD);
        cut(&mut self.path, MAX_PATH);
        if let Some(reason) = &mut self.reason {
            reason.truncate(MAX_REASON);
        }
        cut(&mut self.secret, MAX_REASON);
    }

    /// What this entry costs in the byte budget.
    fn cost(&self) -> usize {
        let text = |f: &Option<String>| f.as_ref().map_or(0, String::len);
        ENTRY_OVERHEAD
            + self.time.len()
            + self.agent.as_str().len()
            + text(&self.host)
            + text(&self.method)
            + text(&self.path)
            + self.reason.as_ref().map_or(0, Reason::text_len)
            + text(&self.secret)
    }

    /// The entry as one line of JSON (no trailing newline).
    #[must_use]
    pub fn to_json_line(&self) -> String {
        // Serialising a struct of strings and numbers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Cut `field` to at most `max` bytes at a character boundary, ending it with `…` when cut.
fn cut(field: &mut Option<String>, max: usize) {
    if let Some(text) = field {
        cut_text(text, max);
    }
}

/// Cut `text` to at most `max` bytes at a character boundary, ending it with `…` when cut.
fn cut_text(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
}

/// The current time in RFC 3339, UTC, millisecond precision.
fn now_rfc3339() -> String {
    rfc3339_at(std::time::SystemTime::now())
}

/// `at` in RFC 3339, UTC, millisecond precision (`2026-12-02T01:02:03.456Z`). Every request is stamped, so
/// the date and time of day are formatted once per second per thread and reused; only the milliseconds are
/// written per call.
fn rfc3339_at(at: std::time::SystemTime) -> String {
    use std::cell::RefCell;

    thread_local! {
        /// The second last formatted on this thread, and its text up to the seconds.
        static SECOND: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
    }
    let (secs, millis) = match at.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => (i64::try_from(d.as_secs()).unwrap_or(i64::MAX), d.subsec_millis()),
        // Before 1970: not worth a fast path.
        Err(_) => return format_slow(at),
    };
    SECOND.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            let Ok(second) = time::OffsetDateTime::from_unix_timestamp(secs) else {
                return format_slow(at);
            };
            let format = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]");
            *cached = (secs, second.format(&format).unwrap_or_default());
        }
        let mut out = String::with_capacity(cached.1.len() + 5);
        out.push_str(&cached.1);
        out.push('.');
        for digit in [millis / 100, millis / 10 % 10, millis % 10] {
            out.push(char::from_digit(digit, 10).unwrap_or('0'));
        }
        out.push('Z');
        out
    })
}

/// [`rfc3339_at`] through the `time` crate's formatter alone.
fn format_slow(at: std::time::SystemTime) -> String {
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    time::OffsetDateTime::from(at).format(&format).unwrap_or_default()
}

/// One agent's ring.
#[derive(Debug, Default)]
struct Ring {
    entries: VecDeque<(Arc<LogEntry>, usize)>,
    bytes: usize,
    dropped: u64,
}

/// Per-agent ring buffers of log entries plus a live stream of every new entry.
///
/// Every recorded entry gets the next [`LogEntry::seq`] (one counter for all agents), so a stream can be
/// resumed: a reader that saw up to `seq` subscribes ([`RequestLog::subscribe`]) first, then reads
/// [`RequestLog::since`] `seq`, and skips live entries whose `seq` it already has.
#[derive(Debug)]
pub struct RequestLog {
    keep: usize,
    max_bytes: usize,
    agents: Mutex<Agents>,
    live: broadcast::Sender<Arc<LogEntry>>,
}

/// The rings and the counter that numbers their entries, under one lock: entries are numbered in the order
/// they enter the rings and the live stream.
#[derive(Debug, Default)]
struct Agents {
    rings: HashMap<AgentId, Ring>,
    /// The last `seq` handed out.
    seq: u64,
}

/// Default byte budget of one agent's ring.
pub const DEFAULT_MAX_BYTES: usize = 2 * 1024 * 1024;

impl RequestLog {
    /// A log keeping the newest `keep` entries per agent (at least one) within [`DEFAULT_MAX_BYTES`].
    #[must_use]
    pub fn new(keep: usize) -> Self {
        Self::with_limits(keep, DEFAULT_MAX_BYTES)
    }

    /// A log keeping the newest `keep` entries per agent, and no more than `max_bytes` of them (at least
    /// one entry is always kept).
    #[must_use]
    pub fn with_limits(keep: usize, max_bytes: usize) -> Self {
        let (live, _) = broadcast::channel(1024);
        Self {
            keep: keep.max(1),
            max_bytes,
            agents: Mutex::new(Agents::default()),
            live,
        }
    }

    /// How many of `agent`'s entries fell out of its ring (count or byte limit) so far.
    #[must_use]
    pub fn dropped(&self, agent: &AgentId) -> u64 {
        self.agents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rings
            .get(agent)
            .map_or(0, |r| r.dropped)
    }

    /// Bytes `agent`'s ring holds now (as the byte budget counts them).
    #[must_use]
    pub fn bytes(&self, agent: &AgentId) -> usize {
        self.agents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rings
            .get(agent)
            .map_or(0, |r| r.bytes)
    }

    /// Append an entry (its fields cut to their limits, its [`LogEntry::seq`] the next of the log; the
    /// agent's oldest dropped beyond `keep` entries or the byte budget) and publish it on the live stream.
    pub fn record(&self, mut entry: LogEntry) {
        entry.truncate();
        tracing::debug!(
            agent = %entry.agent, kind = ?entry.kind, host = entry.host.as_deref().unwrap_or(""),
            port = entry.port.unwrap_or(0), decision = ?entry.decision,
            reason = %entry.reason.as_ref().map_or_else(String::new, ToString::to_string), "egress"
        );
        let cost = entry.cost();
        let mut agents = self.agents.lock().unwrap_or_else(PoisonError::into_inner);
        agents.seq += 1;
        entry.seq = agents.seq;
        let entry = Arc::new(entry);
        // The agent's ring exists after its first entry: look it up without copying the id.
        if !agents.rings.contains_key(&entry.agent) {
            agents.rings.insert(entry.agent.clone(), Ring::default());
        }
        let Some(ring) = agents.rings.get_mut(&entry.agent) else {
            return;
        };
        while !ring.entries.is_empty()
            && (ring.entries.len() >= self.keep || ring.bytes + cost > self.max_bytes)
        {
            if let Some((_, old)) = ring.entries.pop_front() {
                ring.bytes -= old;
                ring.dropped += 1;
            }
        }
        ring.entries.push_back((Arc::clone(&entry), cost));
        ring.bytes += cost;
        // Published under the lock, so the live stream has the snapshot's order. No subscribers is fine:
        // the snapshot still has it.
        let _ = self.live.send(entry);
    }

    /// The agent's entries, oldest first.
    #[must_use]
    pub fn snapshot(&self, agent: &AgentId) -> Vec<LogEntry> {
        self.since(agent, 0)
    }

    /// The agent's entries still held whose [`LogEntry::seq`] is greater than `after_seq`, oldest first:
    /// what a reader that saw up to `after_seq` missed (less what fell out of the ring meanwhile, which
    /// [`RequestLog::dropped`] counts).
    #[must_use]
    pub fn since(&self, agent: &AgentId, after_seq: u64) -> Vec<LogEntry> {
        let agents = self.agents.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(ring) = agents.rings.get(agent) else {
            return Vec::new();
        };
        // Sequence numbers increase along the ring: skip the older part by binary search.
        let start = ring.entries.partition_point(|(e, _)| e.seq <= after_seq);
        ring.entries
            .range(start..)
            .map(|(e, _)| LogEntry::clone(e))
            .collect()
    }

    /// A live stream of every entry recorded from now on (all agents). A receiver that falls more than 1024
    /// entries behind skips ahead (`RecvError::Lagged`).
    #[must_use]
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<LogEntry>> {
        self.live.subscribe()
    }

    /// Drop an agent's entries.
    pub fn forget(&self, agent: &AgentId) {
        self.agents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rings
            .remove(agent);
    }
}

#[cfg(test)]
mod tests;
