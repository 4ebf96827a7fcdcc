//! The gateway's own DNS client towards `egress.dns_upstream`.
//!
//! Every exchange leases a UDP socket from a bounded pool (`pool.rs`: each socket on a random ephemeral port,
//! replaced after a number of queries or seconds) and uses a fresh random 16-bit id, and accepts only a
//! datagram from the upstream's address whose id and question match: an off-path attacker has to guess both
//! the port and the id to inject an answer. A datagram that does not match is ignored (and counted, see
//! [`Upstream::mismatched_answers`]) and the wait goes on until the deadline. An answer with TC set is asked again over TCP.
//! Each attempt has a timeout; a timed-out or failed UDP attempt is retried once.
//!
//! The query sent upstream is built afresh from the question alone (no client EDNS options, no DO bit):
//! nothing a sandbox puts in its packet besides the name and type reaches the upstream.
//!
//! [`Forward::forward_for`] (what the resolver uses) answers from a per-agent cache first and coalesces
//! identical concurrent questions of one agent into one exchange (`forward_cache.rs`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agenthold_core::AgentId;
use agenthold_core::policy::normalize_name;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OnceCell;

use super::cache::ExpiringMap;
use super::forward_cache::{ForwardCache, ForwardLimits, Key};
use super::pool::SocketPool;
use super::{CachedAnswer, Forward, LookupError};

/// Default timeout of one attempt.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// UDP attempts before giving up (the first and one retry).
const UDP_ATTEMPTS: u32 = 2;
/// The UDP payload size advertised upstream (the DNS flag day 2020 value: fits any path MTU).
pub(crate) const EDNS_PAYLOAD: u16 = 1232;
/// Receive buffer for upstream UDP answers: larger than what we advertise, so a slightly oversized answer is
/// read whole rather than cut (and then ignored as malformed).
const UDP_RECV_BUF: usize = 4096;
/// Default number of names in the lookup cache.
const DEFAULT_CACHE_NAMES: usize = 10_000;
/// Cached positive answers live at least this long, whatever their TTL (a TTL of 0 would send every
/// connection's lookup upstream).
const MIN_CACHE_TTL: Duration = Duration::from_secs(5);
/// … and at most this long, so a changed record is seen within minutes.
const MAX_CACHE_TTL: Duration = Duration::from_secs(300);
/// How long NXDOMAIN and "no address" answers are cached.
const NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// At most this many addresses are kept per looked-up name.
const MAX_ADDRS: usize = 64;
/// Callers waiting for one forwarded question besides the one asking; more get SERVFAIL at once. (The
/// key includes the agent, whose server runs at most 256 queries at once.)
const MAX_WAITERS: usize = 256;

/// The addresses a name resolved to, for the proxy's own dialling.
///
/// The addresses are the upstream's, unchecked: the caller runs
/// [`Guard::check`](crate::guard::Guard::check) on each before dialling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The normalised name.
    pub name: String,
    /// IPv4 addresses first, then IPv6, each in the upstream's order (at most 64).
    pub addrs: Vec<IpAddr>,
    /// How long the answer was cached for: the smallest record TTL, clamped to 5 s..300 s.
    pub ttl: Duration,
}

type Shared = Arc<OnceCell<Result<Lookup, LookupError>>>;
type SharedAnswer = Arc<OnceCell<Result<Arc<Message>, LookupError>>>;

/// DNS client towards one upstream server, with a lookup cache (for dialling) and a per-agent answer cache
/// (for the resolver's forward path).
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    timeout: Duration,
    cache: Mutex<ExpiringMap<String, Result<Lookup, LookupError>>>,
    /// Lookups under way, by name: concurrent callers for one name share one upstream exchange.
    inflight: Mutex<HashMap<String, Shared>>,
    /// Answers of the forward path, per agent.
    pub(super) answers: ForwardCache,
    /// Forwarded questions under way, by cache key: identical concurrent questions share one exchange.
    pub(super) forwarding: Mutex<HashMap<Key, SharedAnswer>>,
    pool: SocketPool,
    /// Datagrams dropped because their source, id or question did not match, or they did not parse.
    mismatched: AtomicU64,
    /// A clock tests set by hand (`None`: the real one). Only the answer cache reads it.
    manual_clock: Option<Arc<Mutex<Instant>>>,
}

impl Upstream {
    /// A client of the DNS server at `addr`, with a 2 s timeout per attempt, a 10 000-name lookup cache and
    /// the default [`ForwardLimits`].
    #[must_use]
    pub fn new(addr: SocketAddr) -> Self {
        let limits = ForwardLimits::default();
        Self {
            addr,
            timeout: DEFAULT_TIMEOUT,
            cache: Mutex::new(ExpiringMap::new(DEFAULT_CACHE_NAMES)),
            inflight: Mutex::new(HashMap::new()),
            answers: ForwardCache::new(limits),
            forwarding: Mutex::new(HashMap::new()),
            pool: SocketPool::new(&limits),
            mismatched: AtomicU64::new(0),
            manual_clock: None,
        }
    }

    /// Replace the forward path's bounds: answer cache and upstream sockets (call before first use).
    #[must_use]
    pub fn with_forward_limits(mut self, limits: ForwardLimits) -> Self {
        self.answers = ForwardCache::new(limits);
        self.pool = SocketPool::new(&limits);
        self
    }

    /// The forward path's bounds.
    #[must_use]
    pub fn forward_limits(&self) -> &ForwardLimits {
        self.answers.limits()
    }

    /// Datagrams from the upstream's direction dropped so far because their source address, id or question
    /// did not match the query they arrived for (spoofed or late answers), or because they did not parse.
    #[must_use]
    pub fn mismatched_answers(&self) -> u64 {
        self.mismatched.load(Ordering::Relaxed)
    }

    /// UDP sockets open towards the upstream now (at most [`ForwardLimits::upstream_sockets`]).
    #[must_use]
    pub fn open_sockets(&self) -> usize {
        self.pool.open()
    }

    /// Drive the answer cache's clock by hand from `start` (tests).
    #[cfg(test)]
    pub(crate) fn with_manual_clock(mut self, start: Instant) -> (Self, Arc<Mutex<Instant>>) {
        let clock = Arc::new(Mutex::new(start));
        self.manual_clock = Some(Arc::clone(&clock));
        (self, clock)
    }

    fn now(&self) -> Instant {
        match &self.manual_clock {
            Some(clock) => *lock(clock),
            None => Instant::now(),
        }
    }

    /// Set the timeout of each attempt (tests shorten it).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Set how many names the lookup cache holds (at least one).
    #[must_use]
    pub fn with_cache_capacity(mut self, names: usize) -> Self {
        self.cache = Mutex::new(ExpiringMap::new(names));
        self
    }

    /// The upstream server's address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The timeout of one attempt.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Resolve `name`'s A and AAAA records (IPv4 first), from the cache when a fresh answer is there.
    ///
    /// Concurrent lookups of one name share one pair of upstream queries. Positive answers are cached for their
    /// smallest TTL clamped to 5 s..300 s; NXDOMAIN and "no address" for 5 s; failures are not cached.
    ///
    /// # Errors
    /// [`LookupError`]: the name is invalid, does not exist, has no address, or the upstream failed.
    pub async fn lookup(&self, name: &str) -> Result<Lookup, LookupError> {
        let name = normalize_name(name).map_err(|e| LookupError::InvalidName {
            name: name.to_owned(),
            problem: e.to_string(),
        })?;
        if let Some(hit) = lock(&self.cache).get(&name, Instant::now()) {
            return hit;
        }
        let cell = Arc::clone(lock(&self.inflight).entry(name.clone()).or_default());
        let _cleanup = InflightGuard {
            upstream: self,
            name: &name,
            cell: &cell,
        };
        // If the caller running the exchange is cancelled, the next waiter runs its own (tokio's OnceCell).
        cell.get_or_init(|| self.resolve_and_cache(&name)).await.clone()
    }

    async fn resolve_and_cache(&self, name: &str) -> Result<Lookup, LookupError> {
        let result = self.resolve(name).await;
        let ttl = match &result {
            Ok(lookup) => Some(lookup.ttl),
            Err(e) if e.is_negative() => Some(NEGATIVE_TTL),
            Err(_) => None,
        };
        if let Some(ttl) = ttl {
            lock(&self.cache).insert(name.to_owned(), result.clone(), Instant::now() + ttl);
        }
        result
    }

    /// Ask for A and AAAA concurrently and combine: an address of either family is an answer; a failure of one
    /// family matters only when the other has no address.
    async fn resolve(&self, name: &str) -> Result<Lookup, LookupError> {
        let fqdn = Name::from_ascii(format!("{name}.")).map_err(|e| LookupError::InvalidName {
            name: name.to_owned(),
            problem: e.to_string(),
        })?;
        let (v4, v6) = tokio::join!(
            self.addresses(name, &fqdn, RecordType::A),
            self.addresses(name, &fqdn, RecordType::AAAA)
        );
        // An address of either family wins over the other family's failure (even an inconsistent NXDOMAIN).
        let (addrs, ttl) = match (v4, v6) {
            (Ok((mut a, ta)), Ok((b, tb))) => {
                a.extend(b);
                (a, ta.min(tb))
            }
            (Ok((a, ta)), Err(e)) | (Err(e), Ok((a, ta))) => {
                if a.is_empty() {
                    return Err(e);
                }
                (a, ta)
            }
            (Err(e), Err(_)) => return Err(e),
        };
        if addrs.is_empty() {
            return Err(LookupError::NoAddress {
                name: name.to_owned(),
            });
        }
        let mut addrs = addrs;
        addrs.truncate(MAX_ADDRS);
        Ok(Lookup {
            name: name.to_owned(),
            addrs,
            ttl: Duration::from_secs(u64::from(ttl)).clamp(MIN_CACHE_TTL, MAX_CACHE_TTL),
        })
    }

    /// The addresses of one type in the answer, with the smallest TTL among them (`u32::MAX` when none).
    async fn addresses(
        &self,
        name: &str,
        fqdn: &Name,
        rtype: RecordType,
    ) -> Result<(Vec<IpAddr>, u32), LookupError> {
        let (answer, _) = self.exchange(&Query::query(fqdn.clone(), rtype), false).await?;
        match answer.response_code {
            ResponseCode::NoError => {}
            ResponseCode::NXDomain => {
                return Err(LookupError::NxDomain {
                    name: name.to_owned(),
                });
            }
            other => {
                return Err(LookupError::ServFail {
                    upstream: self.addr,
                    name: name.to_owned(),
                    rcode: u16::from(other),
                });
            }
        }
        let mut ttl = u32::MAX;
        let mut addrs = Vec::new();
        for record in &answer.answers {
            let addr = match (&record.data, rtype) {
                (RData::A(a), RecordType::A) => IpAddr::V4(a.0),
                (RData::AAAA(a), RecordType::AAAA) => IpAddr::V6(a.0),
                _ => continue,
            };
            ttl = ttl.min(record.ttl);
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
        Ok((addrs, ttl))
    }

    /// One question to the upstream: UDP (retried once), then TCP if the UDP answer was truncated.
    pub(crate) async fn exchange(
        &self,
        question: &Query,
        checking_disabled: bool,
    ) -> Result<(Message, usize), LookupError> {
        let mut last = None;
        for _ in 0..UDP_ATTEMPTS {
            match self.exchange_udp(question, checking_disabled).await {
                Ok((answer, _)) if answer.truncation => {
                    return self.exchange_tcp(question, checking_disabled).await;
                }
                Ok(answer) => return Ok(answer),
                Err(e @ (LookupError::Timeout { .. } | LookupError::Io { .. })) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| self.timed_out(question)))
    }

    async fn exchange_udp(
        &self,
        question: &Query,
        checking_disabled: bool,
    ) -> Result<(Message, usize), LookupError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let (id, packet) = self.encode(question, checking_disabled)?;
        let io = |context| self.io_error(question, context);
        // One socket of the bounded pool, ours alone until the exchange ends (returned on drop, even when
        // this future is cancelled).
        let lease = match tokio::time::timeout_at(deadline, self.pool.lease(self.addr)).await {
            Ok(lease) => lease.map_err(io("bind"))?,
            Err(_) => return Err(self.timed_out(question)),
        };
        let socket = lease.socket();
        match tokio::time::timeout_at(deadline, socket.send(&packet)).await {
            Ok(sent) => sent.map_err(|e| {
                lease.discard();
                io("send")(e)
            })?,
            Err(_) => return Err(self.timed_out(question)),
        };
        let mut buf = [0u8; UDP_RECV_BUF];
        loop {
            let (len, from) = match tokio::time::timeout_at(deadline, socket.recv_from(&mut buf)).await {
                Ok(Ok(received)) => received,
                Ok(Err(e)) => {
                    lease.discard();
                    return Err(io("receive")(e));
                }
                Err(_) => return Err(self.timed_out(question)),
            };
            if from != self.addr {
                self.mismatched.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(upstream = %self.addr, %from, "DNS answer from an unexpected address ignored");
                continue;
            }
            let Some(bytes) = buf.get(..len) else { continue };
            match Message::from_vec(bytes) {
                Ok(answer) if answers(&answer, id, question) => return Ok((answer, len)),
                // A spoofed or stale datagram (a late answer to an earlier query on this pooled socket): keep
                // waiting for the real answer until the deadline.
                Ok(_) => {
                    self.mismatched.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(upstream = %self.addr, "DNS answer with a wrong id or question ignored");
                }
                Err(e) => {
                    self.mismatched.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(upstream = %self.addr, error = %e, "malformed DNS answer ignored");
                }
            }
        }
    }

    async fn exchange_tcp(
        &self,
        question: &Query,
        checking_disabled: bool,
    ) -> Result<(Message, usize), LookupError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        match tokio::time::timeout_at(deadline, self.exchange_tcp_inner(question, checking_disabled)).await {
            Ok(result) => result,
            Err(_) => Err(self.timed_out(question)),
        }
    }

    async fn exchange_tcp_inner(
        &self,
        question: &Query,
        checking_disabled: bool,
    ) -> Result<(Message, usize), LookupError> {
        let (id, packet) = self.encode(question, checking_disabled)?;
        let io = |context| self.io_error(question, context);
        let mut stream = TcpStream::connect(self.addr).await.map_err(io("connect (TCP)"))?;
        let len =
            u16::try_from(packet.len()).map_err(|_| self.malformed(question, "query too long for TCP"))?;
        let mut framed = Vec::with_capacity(packet.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&packet);
        stream.write_all(&framed).await.map_err(io("send (TCP)"))?;
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await.map_err(io("receive (TCP)"))?;
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut buf).await.map_err(io("receive (TCP)"))?;
        let answer = Message::from_vec(&buf).map_err(|e| self.malformed(question, &e.to_string()))?;
        if !answers(&answer, id, question) {
            return Err(self.malformed(question, "TCP answer with a wrong id or question"));
        }
        Ok((answer, buf.len()))
    }

    /// A fresh query for `question` with a random id: only the question, RD, CD as the client asked, and our
    /// own EDNS payload size.
    fn encode(&self, question: &Query, checking_disabled: bool) -> Result<(u16, Vec<u8>), LookupError> {
        // `Message::query()` draws its id from `rand`'s thread-local CSPRNG (seeded from the OS).
        let mut query = Message::query();
        query.metadata.recursion_desired = true;
        query.metadata.checking_disabled = checking_disabled;
        let mut q = Query::query(question.name.clone(), question.query_type);
        q.set_query_class(DNSClass::IN);
        query.add_query(q);
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        query.set_edns(edns);
        let bytes = query
            .to_vec()
            .map_err(|e| self.malformed(question, &e.to_string()))?;
        Ok((query.id, bytes))
    }

    fn timed_out(&self, question: &Query) -> LookupError {
        LookupError::Timeout {
            upstream: self.addr,
            name: question.name.to_ascii(),
            attempts: UDP_ATTEMPTS,
            timeout: self.timeout,
        }
    }

    fn malformed(&self, question: &Query, problem: &str) -> LookupError {
        LookupError::Malformed {
            upstream: self.addr,
            name: question.name.to_ascii(),
            problem: problem.to_owned(),
        }
    }

    fn io_error(&self, question: &Query, context: &'static str) -> impl Fn(std::io::Error) -> LookupError {
        let (upstream, name) = (self.addr, question.name.to_ascii());
        move |e| LookupError::Io {
            upstream,
            name: name.clone(),
            context,
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

impl Forward for Upstream {
    /// Forward the query's one question (see the module docs for what is sent).
    async fn forward(&self, query: &Message) -> Result<Message, LookupError> {
        let [question] = query.queries.as_slice() else {
            return Err(LookupError::Malformed {
                upstream: self.addr,
                name: String::new(),
                problem: format!("{} questions, expected one", query.queries.len()),
            });
        };
        Ok(self.exchange(question, query.checking_disabled).await?.0)
    }

    fn cached_for(&self, agent: &AgentId, query: &Message) -> Option<Message> {
        let [question] = query.queries.as_slice() else {
            return None;
        };
        let now = self.now();
        let hit = self.answers.get(agent, question, query.checking_disabled, now)?;
        Some(hit.aged(now))
    }

    fn cached_entry_for(&self, agent: &AgentId, query: &Message) -> Option<CachedAnswer> {
        let [question] = query.queries.as_slice() else {
            return None;
        };
        let now = self.now();
        let hit = self.answers.get(agent, question, query.checking_disabled, now)?;
        Some(CachedAnswer {
            message: hit.aged(now),
            stored: hit.stored(),
            age: hit.age(now),
            expires: hit.expires(),
        })
    }

    fn now(&self) -> Instant {
        Upstream::now(self)
    }

    /// Answer from `agent`'s part of the cache when a fresh answer is there (TTLs lowered by its age), else
    /// forward: concurrent identical questions of one agent share one upstream exchange, and a cacheable
    /// answer is stored (see `forward_cache.rs`).
    async fn forward_for(&self, agent: &AgentId, query: &Message) -> Result<Message, LookupError> {
        let [question] = query.queries.as_slice() else {
            return self.forward(query).await;
        };
        let cd = query.checking_disabled;
        let now = self.now();
        if let Some(hit) = self.answers.get(agent, question, cd, now) {
            return Ok(hit.aged(now));
        }
        let key = Key::new(agent, question, cd);
        let cell = {
            let mut inflight = lock(&self.forwarding);
            let cell = inflight.entry(key.clone()).or_default();
            // The table's reference, the leader's, and one per waiter.
            if Arc::strong_count(cell) > MAX_WAITERS + 1 {
                return Err(LookupError::ServFail {
                    upstream: self.addr,
                    name: question.name.to_ascii(),
                    rcode: u16::from(ResponseCode::ServFail),
                });
            }
            Arc::clone(cell)
        };
        let _cleanup = ForwardingGuard {
            upstream: self,
            key: &key,
            cell: &cell,
        };
        // If the caller running the exchange is cancelled, the next waiter runs its own (tokio's OnceCell).
        let shared = cell
            .get_or_init(|| async {
                let (answer, len) = self.exchange(question, query.checking_disabled).await?;
                self.answers.insert(agent, question, cd, &answer, len, self.now());
                Ok(Arc::new(answer))
            })
            .await;
        match shared {
            Ok(answer) => Ok(Message::clone(answer)),
            Err(e) => Err(e.clone()),
        }
    }
}

/// Whether `answer` is the upstream's answer to our query `id` for `question`.
fn answers(answer: &Message, id: u16, question: &Query) -> bool {
    answer.message_type == MessageType::Response
        && answer.id == id
        && answer.op_code == OpCode::Query
        && matches!(answer.queries.as_slice(), [q] if q.name == question.name
            && q.query_type == question.query_type
            && q.query_class == DNSClass::IN)
}

/// Removes a finished (or abandoned) forwarded query from the in-flight table when its last user is gone.
struct ForwardingGuard<'a> {
    upstream: &'a Upstream,
    key: &'a Key,
    cell: &'a SharedAnswer,
}

impl Drop for ForwardingGuard<'_> {
    fn drop(&mut self) {
        let mut inflight = lock(&self.upstream.forwarding);
        if inflight.get(self.key).is_some_and(|c| Arc::ptr_eq(c, self.cell))
            && Arc::strong_count(self.cell) <= 2
        {
            inflight.remove(self.key);
        }
    }
}

/// Removes a finished (or abandoned) lookup from the in-flight table when its last user is gone.
struct InflightGuard<'a> {
    upstream: &'a Upstream,
    name: &'a str,
    cell: &'a Shared,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        let mut inflight = lock(&self.upstream.inflight);
        // Two references: the table's and ours. More means other callers still wait on this cell.
        if inflight.get(self.name).is_some_and(|c| Arc::ptr_eq(c, self.cell))
            && Arc::strong_count(self.cell) <= 2
        {
            inflight.remove(self.name);
        }
    }
}

/// Lock a mutex whose data stays consistent even if a holder panicked (every update is a single insert or
/// remove).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
