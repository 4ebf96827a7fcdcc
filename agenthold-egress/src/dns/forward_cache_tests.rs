//! The forward path's cache, coalescing and socket pool, end to end: the real `Server::answer` and the real
//! `Upstream` against a scripted DNS responder on loopback (real wire format) that counts what it receives.
//! The cache's clock is driven by hand, so no test depends on wall-clock timing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agenthold_core::AgentId;
use agenthold_core::policy::{NetworkPolicy, PolicyMode, PolicyTable};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

use super::ForwardLimits;
use crate::dns::wire::{QueryView, WireEntry};
use crate::dns::{
    DnsBudget, DnsLimits, Forward, Records, Server, ServerContext, SyntheticNames, Transport, Upstream,
};
use crate::guard::Guard;
use crate::log::RequestLog;

const PUBLIC: Ipv4Addr = Ipv4Addr::new(93, 184, 216, 34);
const PRIVATE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);
const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

/// What the responder answers for one name.
#[derive(Clone)]
enum Script {
    /// These addresses, each with this TTL.
    A(Vec<Ipv4Addr>, u32),
    /// NXDOMAIN, with an SOA (its TTL, its MINIMUM) in the authority section or none.
    NxDomain(Option<(u32, u32)>),
    /// NOERROR without answers, with an SOA (TTL, MINIMUM).
    NoData(u32, u32),
    /// SERVFAIL.
    ServFail,
    /// Many A records (a large answer).
    Big(usize),
    /// First a datagram with the wrong id and one for another question, then the real answer.
    Spoofed,
}

/// One received query.
#[derive(Debug, Clone)]
struct Seen {
    name: String,
    id: u16,
    port: u16,
}

/// A scripted DNS responder on loopback.
struct Responder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    scripts: Arc<Mutex<HashMap<String, Script>>>,
    /// Answers wait for a permit when `hold` is set (closed gate).
    gate: Arc<Semaphore>,
    hold: Arc<AtomicBool>,
}

impl Responder {
    async fn start() -> Self {
        let socket = Arc::new(UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap());
        let addr = socket.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let scripts: Arc<Mutex<HashMap<String, Script>>> = Arc::default();
        let gate = Arc::new(Semaphore::new(0));
        let hold = Arc::new(AtomicBool::new(false));
        let r = Self {
            addr,
            seen: Arc::clone(&seen),
            scripts: Arc::clone(&scripts),
            gate: Arc::clone(&gate),
            hold: Arc::clone(&hold),
        };
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            loop {
                let Ok((len, from)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                let Ok(query) = Message::from_vec(&buf[..len]) else {
                    continue;
                };
                let Some(q) = query.queries.first().cloned() else {
                    continue;
                };
                let name = q.name.to_ascii().trim_end_matches('.').to_ascii_lowercase();
                seen.lock().unwrap().push(Seen {
                    name: name.clone(),
                    id: query.id,
                    port: from.port(),
                });
                let script = scripts
                    .lock()
                    .unwrap()
                    .get(&name)
                    .cloned()
                    .unwrap_or(Script::A(vec![PUBLIC], 60));
                let (socket, gate, held) = (
                    Arc::clone(&socket),
                    Arc::clone(&gate),
                    hold.load(Ordering::SeqCst),
                );
                tokio::spawn(async move {
                    if held {
                        gate.acquire().await.unwrap().forget();
                    }
                    for packet in respond(&query, &q, &script) {
                        socket.send_to(&packet, from).await.unwrap();
                    }
                });
            }
        });
        r
    }

    fn script(&self, name: &str, script: Script) {
        self.scripts.lock().unwrap().insert(name.to_owned(), script);
    }

    /// Queries received for `name`.
    fn count(&self, name: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == name)
            .count()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn soa(name: &Name, ttl: u32, minimum: u32) -> Record {
    Record::from_rdata(
        name.clone(),
        ttl,
        RData::SOA(SOA::new(
            Name::from_ascii("ns.test.").unwrap(),
            Name::from_ascii("admin.test.").unwrap(),
            1,
            3600,
            600,
            86400,
            minimum,
        )),
    )
}

fn respond(query: &Message, q: &Query, script: &Script) -> Vec<Vec<u8>> {
    let mut m = Message::response(query.id, OpCode::Query);
    m.metadata.recursion_available = true;
    m.add_query(q.clone());
    let a = |addr: Ipv4Addr, ttl| Record::from_rdata(q.name.clone(), ttl, RData::A(A(addr)));
    let mut extra = Vec::new();
    match script {
        Script::A(addrs, ttl) => {
            if q.query_type == RecordType::A {
                for addr in addrs {
                    m.add_answer(a(*addr, *ttl));
                }
            }
        }
        Script::NxDomain(soa_ttl) => {
            m.metadata.response_code = ResponseCode::NXDomain;
            if let Some((ttl, minimum)) = soa_ttl {
                m.add_authority(soa(&q.name, *ttl, *minimum));
            }
        }
        Script::NoData(ttl, minimum) => {
            m.add_authority(soa(&q.name, *ttl, *minimum));
        }
        Script::ServFail => m.metadata.response_code = ResponseCode::ServFail,
        Script::Big(n) => {
            for i in 0..*n {
                m.add_answer(a(
                    Ipv4Addr::new(93, 184, (i / 250) as u8, (i % 250) as u8 + 1),
                    60,
                ));
            }
        }
        Script::Spoofed => {
            let mut wrong_id = m.clone();
            wrong_id.metadata.id = query.id.wrapping_add(1);
            wrong_id.add_answer(a(Ipv4Addr::new(198, 51, 100, 66), 60));
            let mut wrong_q = Message::response(query.id, OpCode::Query);
            wrong_q.add_query(Query::query(
                Name::from_ascii("other.test.").unwrap(),
                RecordType::A,
            ));
            wrong_q.add_answer(a(Ipv4Addr::new(198, 51, 100, 67), 60));
            extra.push(wrong_id.to_vec().unwrap());
            extra.push(wrong_q.to_vec().unwrap());
            m.add_answer(a(PUBLIC, 60));
        }
    }
    extra.push(m.to_vec().unwrap());
    extra
}

fn agent(name: &str) -> AgentId {
    AgentId::new(name).unwrap()
}

fn allowlist(entries: &[&str]) -> NetworkPolicy {
    NetworkPolicy::parse(PolicyMode::Allowlist, entries).unwrap()
}

/// One agent's server in front of a shared upstream.
struct Agent {
    id: AgentId,
    server: Server<Upstream>,
    policy: Arc<PolicyTable>,
    records: Arc<Records>,
    log: Arc<RequestLog>,
    budget: Arc<DnsBudget>,
}

const GENEROUS: DnsLimits = DnsLimits {
    agent_qps: 100_000,
    agent_burst: 100_000,
    gateway_qps: 100_000,
    gateway_burst: 100_000,
    gateway_reserve: 0,
};

fn agent_server(id: &str, upstream: &Arc<Upstream>, policy: NetworkPolicy) -> Agent {
    agent_server_with(id, upstream, policy, Records::new(), GENEROUS)
}

fn agent_server_with(
    id: &str,
    upstream: &Arc<Upstream>,
    policy: NetworkPolicy,
    records: Records,
    limits: DnsLimits,
) -> Agent {
    let id = agent(id);
    let table = Arc::new(PolicyTable::new());
    table.set(id.clone(), policy);
    let records = Arc::new(records);
    let log = Arc::new(RequestLog::new(1000));
    let budget = Arc::new(DnsBudget::new(limits));
    let server = Server::new(ServerContext {
        agent: id.clone(),
        policy: Arc::clone(&table) as _,
        upstream: Arc::clone(upstream),
        records: Arc::clone(&records),
        log: Arc::clone(&log),
        synthetic: Arc::new(SyntheticNames::new()),
        guard: Arc::new(Guard::new([])),
        budget: Arc::clone(&budget),
    });
    Agent {
        id,
        server,
        policy: table,
        records,
        log,
        budget,
    }
}

fn query(name: &str, rtype: RecordType) -> Vec<u8> {
    let mut q = Message::query();
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    q.to_vec().unwrap()
}

async fn ask(a: &Agent, name: &str) -> Message {
    ask_type(a, name, RecordType::A).await
}

async fn ask_type(a: &Agent, name: &str, rtype: RecordType) -> Message {
    let packet = query(name, rtype);
    let reply = a.server.answer(&packet, Transport::Udp).await.unwrap();
    let reply = Message::from_vec(&reply).unwrap();
    assert_eq!(reply.message_type, MessageType::Response);
    reply
}

fn addrs(m: &Message) -> Vec<Ipv4Addr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

fn ttls(m: &Message) -> Vec<u32> {
    m.answers.iter().chain(&m.authorities).map(|r| r.ttl).collect()
}

/// An upstream towards `dns` with `limits` and a hand-driven cache clock.
fn upstream(dns: &Responder, limits: ForwardLimits) -> (Arc<Upstream>, Clock) {
    let (u, clock) = Upstream::new(dns.addr)
        .with_timeout(Duration::from_secs(5))
        .with_forward_limits(limits)
        .with_manual_clock(Instant::now());
    (Arc::new(u), Clock(clock))
}

struct Clock(Arc<Mutex<Instant>>);

impl Clock {
    fn advance(&self, secs: u64) {
        *self.0.lock().unwrap() += Duration::from_secs(secs);
    }
}

// covers: E9
#[tokio::test]
async fn a_cached_answer_is_served_with_its_ttl_lowered_and_no_second_query() {
    let dns = Responder::start().await;
    dns.script("web.test", Script::A(vec![PUBLIC], 100));
    let (up, clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, NetworkPolicy::open());
    let first = ask(&a, "web.test").await;
    assert_eq!((addrs(&first), ttls(&first)), (vec![PUBLIC], vec![100]));
    clock.advance(30);
    let second = ask(&a, "WEB.Test").await;
    assert_eq!((addrs(&second), ttls(&second)), (vec![PUBLIC], vec![70]));
    // The client's own id and question, whatever the cached answer carried.
    assert_eq!(second.queries[0].name.to_ascii(), "WEB.Test.");
    assert_eq!(dns.count("web.test"), 1);
    // Expiry asks again.
    clock.advance(71);
    let third = ask(&a, "web.test").await;
    assert_eq!(ttls(&third), vec![100]);
    assert_eq!(dns.count("web.test"), 2);
    // Another type is another entry.
    ask_type(&a, "web.test", RecordType::TXT).await;
    assert_eq!(dns.count("web.test"), 3);
}

#[tokio::test]
async fn lifetimes_are_clamped_to_the_configured_minimum_and_maximum() {
    let dns = Responder::start().await;
    dns.script("short.test", Script::A(vec![PUBLIC], 5));
    dns.script("long.test", Script::A(vec![PUBLIC], 100_000));
    dns.script("zero.test", Script::A(vec![PUBLIC], 0));
    let limits = ForwardLimits {
        min_ttl: Duration::from_secs(30),
        max_ttl: Duration::from_secs(50),
        ..ForwardLimits::default()
    };
    let (up, clock) = upstream(&dns, limits);
    let a = agent_server("a", &up, NetworkPolicy::open());
    for name in ["short.test", "long.test", "zero.test"] {
        ask(&a, name).await;
    }
    clock.advance(10);
    // Beyond its own TTL but within the minimum: still cached, served with TTL 0.
    assert_eq!(ttls(&ask(&a, "short.test").await), vec![0]);
    assert_eq!(ttls(&ask(&a, "zero.test").await), vec![0]);
    assert_eq!(ttls(&ask(&a, "long.test").await), vec![100_000 - 10]);
    assert_eq!(
        (
            dns.count("short.test"),
            dns.count("zero.test"),
            dns.count("long.test")
        ),
        (1, 1, 1)
    );
    clock.advance(29); // 39 s: beyond the minimum, within the maximum.
    ask(&a, "short.test").await;
    ask(&a, "long.test").await;
    assert_eq!((dns.count("short.test"), dns.count("long.test")), (2, 1));
    clock.advance(12); // 51 s: beyond the maximum.
    ask(&a, "long.test").await;
    assert_eq!(dns.count("long.test"), 2);
}

#[tokio::test]
async fn a_zero_ttl_is_not_cached_without_a_minimum() {
    let dns = Responder::start().await;
    dns.script("zero.test", Script::A(vec![PUBLIC], 0));
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, NetworkPolicy::open());
    ask(&a, "zero.test").await;
    ask(&a, "zero.test").await;
    assert_eq!(dns.count("zero.test"), 2);
}

#[tokio::test]
async fn negative_answers_are_cached_for_the_soa_minimum_and_clamped() {
    let dns = Responder::start().await;
    // min(SOA TTL 600, MINIMUM 60) = 60 s.
    dns.script("gone.test", Script::NxDomain(Some((600, 60))));
    // min(SOA TTL 30, MINIMUM 100) = 30 s.
    dns.script("nodata.test", Script::NoData(30, 100));
    // 3600 s, clamped to the negative maximum below (120 s).
    dns.script("long-gone.test", Script::NxDomain(Some((3600, 3600))));
    // RFC 2308 §5: without an SOA, not cached.
    dns.script("bare.test", Script::NxDomain(None));
    dns.script("broken.test", Script::ServFail);
    let limits = ForwardLimits {
        max_negative_ttl: Duration::from_secs(120),
        ..ForwardLimits::default()
    };
    let (up, clock) = upstream(&dns, limits);
    let a = agent_server("a", &up, NetworkPolicy::open());
    for name in [
        "gone.test",
        "nodata.test",
        "long-gone.test",
        "bare.test",
        "broken.test",
    ] {
        ask(&a, name).await;
    }
    clock.advance(20);
    let gone = ask(&a, "gone.test").await;
    assert_eq!(gone.response_code, ResponseCode::NXDomain);
    assert_eq!(ttls(&gone), vec![580], "the SOA's TTL is lowered by the age too");
    let nodata = ask_type(&a, "nodata.test", RecordType::A).await;
    assert_eq!(
        (nodata.response_code, nodata.answers.len()),
        (ResponseCode::NoError, 0)
    );
    assert_eq!(ask(&a, "bare.test").await.response_code, ResponseCode::NXDomain);
    assert_eq!(ask(&a, "broken.test").await.response_code, ResponseCode::ServFail);
    assert_eq!(
        [
            dns.count("gone.test"),
            dns.count("nodata.test"),
            dns.count("bare.test"),
            dns.count("broken.test")
        ],
        [1, 1, 2, 2]
    );
    clock.advance(11); // 31 s: NODATA expired (30 s), NXDOMAIN not yet (60 s).
    ask(&a, "gone.test").await;
    ask(&a, "nodata.test").await;
    assert_eq!((dns.count("gone.test"), dns.count("nodata.test")), (1, 2));
    clock.advance(30); // 61 s.
    ask(&a, "gone.test").await;
    assert_eq!(dns.count("gone.test"), 2);
    clock.advance(58); // 119 s: within the negative maximum.
    ask(&a, "long-gone.test").await;
    assert_eq!(dns.count("long-gone.test"), 1);
    clock.advance(2); // 121 s: beyond it.
    ask(&a, "long-gone.test").await;
    assert_eq!(dns.count("long-gone.test"), 2);
}

#[tokio::test]
async fn timeouts_are_not_cached() {
    // A socket that never answers.
    let silent = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let (up, _clock) = Upstream::new(silent.local_addr().unwrap())
        .with_timeout(Duration::from_millis(50))
        .with_manual_clock(Instant::now());
    let up = Arc::new(up);
    let a = agent_server("a", &up, NetworkPolicy::open());
    assert_eq!(ask(&a, "slow.test").await.response_code, ResponseCode::ServFail);
    let dns_len = up.answers.len();
    assert_eq!(dns_len, 0);
}

#[tokio::test]
async fn a_zero_entry_cache_is_disabled() {
    let dns = Responder::start().await;
    let limits = ForwardLimits {
        cache_entries: 0,
        ..ForwardLimits::default()
    };
    let (up, _clock) = upstream(&dns, limits);
    let a = agent_server("a", &up, NetworkPolicy::open());
    for _ in 0..3 {
        assert_eq!(addrs(&ask(&a, "web.test").await), vec![PUBLIC]);
    }
    assert_eq!(dns.count("web.test"), 3);
}

// covers: E20
#[tokio::test]
async fn the_cache_is_bounded_in_entries_and_answer_size() {
    let dns = Responder::start().await;
    dns.script("big.test", Script::Big(200)); // 200 A records: over 3 KB.
    let limits = ForwardLimits {
        cache_entries: 2,
        max_answer_bytes: 1024,
        ..ForwardLimits::default()
    };
    let (up, _clock) = upstream(&dns, limits);
    let a = agent_server("a", &up, NetworkPolicy::open());
    ask_type(&a, "big.test", RecordType::A).await;
    ask_type(&a, "big.test", RecordType::A).await;
    assert_eq!(
        dns.count("big.test"),
        2,
        "an answer over the size limit is not cached"
    );
    for name in ["one.test", "two.test", "three.test"] {
        ask(&a, name).await;
    }
    assert_eq!(up.answers.len(), 2);
    // The least recently used ("one") went; "three" is still there.
    ask(&a, "three.test").await;
    ask(&a, "one.test").await;
    assert_eq!((dns.count("three.test"), dns.count("one.test")), (1, 2));
    // A hit refreshes: "three" (used) survives the next insertion, "two" does not.
    ask(&a, "three.test").await;
    ask(&a, "four.test").await;
    ask(&a, "three.test").await;
    assert_eq!(dns.count("three.test"), 1);
}

// covers: E9
#[tokio::test]
async fn a_denied_name_is_refused_even_when_cached() {
    let dns = Responder::start().await;
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, NetworkPolicy::open());
    let b = agent_server("b", &up, allowlist(&["allowed.test"]));
    assert_eq!(addrs(&ask(&a, "secret.test").await), vec![PUBLIC]);
    // Cached for agent A; agent B's policy still refuses it, without an upstream query.
    let refused = ask(&b, "secret.test").await;
    assert_eq!(
        (refused.response_code, refused.answers.len()),
        (ResponseCode::NXDomain, 0)
    );
    assert_eq!(dns.count("secret.test"), 1);
    // The same agent, after its policy changed: refused although its own answer is cached.
    a.policy.set(a.id.clone(), allowlist(&["allowed.test"]));
    let refused = ask(&a, "secret.test").await;
    assert_eq!(
        (refused.response_code, refused.answers.len()),
        (ResponseCode::NXDomain, 0)
    );
    assert_eq!(dns.count("secret.test"), 1);
}

// covers: E6, E22
#[tokio::test]
async fn the_rebinding_filter_applies_to_cached_answers() {
    let dns = Responder::start().await;
    dns.script("rebind.test", Script::A(vec![PRIVATE, PUBLIC, METADATA], 300));
    dns.script("private.test", Script::A(vec![PRIVATE], 300));
    let (up, clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, NetworkPolicy::open());
    for _ in 0..2 {
        assert_eq!(addrs(&ask(&a, "rebind.test").await), vec![PUBLIC]);
        let private = ask(&a, "private.test").await;
        assert!(addrs(&private).is_empty());
        clock.advance(10);
    }
    assert_eq!((dns.count("rebind.test"), dns.count("private.test")), (1, 1));
    for blocked in [PRIVATE, METADATA] {
        assert!(a.records.names_for(&a.id, IpAddr::V4(blocked)).is_empty());
    }
}

// covers: E4
#[tokio::test]
async fn a_hit_records_the_name_for_the_agent_as_a_miss_does() {
    let dns = Responder::start().await;
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    // Two servers of one agent with separate records: the second only ever sees cache hits.
    let first = agent_server("a", &up, NetworkPolicy::open());
    let second = agent_server("a", &up, NetworkPolicy::open());
    ask(&first, "named.test").await;
    ask(&second, "named.test").await;
    assert_eq!(dns.count("named.test"), 1);
    for a in [&first, &second] {
        assert_eq!(
            a.records.names_for(&a.id, IpAddr::V4(PUBLIC)),
            vec!["named.test".to_owned()]
        );
    }
}

// covers: E4, E9
#[tokio::test]
async fn agents_do_not_share_cache_entries() {
    let dns = Responder::start().await;
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, NetworkPolicy::open());
    let b = agent_server("b", &up, NetworkPolicy::open());
    ask(&a, "shared.test").await;
    ask(&a, "shared.test").await;
    assert_eq!(dns.count("shared.test"), 1);
    // Agent B asks upstream itself: no timing difference tells it what agent A resolved.
    ask(&b, "shared.test").await;
    assert_eq!(dns.count("shared.test"), 2);
    ask(&b, "shared.test").await;
    assert_eq!(dns.count("shared.test"), 2);
    assert!(b.records.names_for(&a.id, IpAddr::V4(PUBLIC)).is_empty());
}

#[tokio::test]
async fn concurrent_identical_queries_share_one_upstream_query() {
    let dns = Responder::start().await;
    dns.hold.store(true, Ordering::SeqCst);
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let a = Arc::new(agent_server("a", &up, NetworkPolicy::open()));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let a = Arc::clone(&a);
        tasks.push(tokio::spawn(async move { ask(&a, "busy.test").await }));
    }
    // Wait until all 50 wait on the one exchange (the table's reference plus one per caller).
    loop {
        let waiting = super::super::upstream::lock(&up.forwarding)
            .values()
            .map(Arc::strong_count)
            .sum::<usize>();
        if waiting == 51 {
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    dns.gate.add_permits(1000);
    for t in tasks {
        assert_eq!(addrs(&t.await.unwrap()), vec![PUBLIC]);
    }
    assert_eq!(dns.count("busy.test"), 1);
}

#[tokio::test]
async fn waiters_share_an_error_and_the_next_query_asks_again() {
    let dns = Responder::start().await;
    dns.script("flaky.test", Script::ServFail);
    dns.hold.store(true, Ordering::SeqCst);
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let a = Arc::new(agent_server("a", &up, NetworkPolicy::open()));
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let a = Arc::clone(&a);
            tokio::spawn(async move { ask(&a, "flaky.test").await })
        })
        .collect();
    while dns.count("flaky.test") == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    loop {
        let waiting = super::super::upstream::lock(&up.forwarding)
            .values()
            .map(Arc::strong_count)
            .sum::<usize>();
        if waiting == 11 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    dns.gate.add_permits(1000);
    for t in tasks {
        assert_eq!(t.await.unwrap().response_code, ResponseCode::ServFail);
    }
    assert_eq!(dns.count("flaky.test"), 1);
    assert!(super::super::upstream::lock(&up.forwarding).is_empty());
    ask(&a, "flaky.test").await;
    assert_eq!(dns.count("flaky.test"), 2);
}

#[tokio::test]
async fn upstream_sockets_are_bounded_and_ids_random() {
    let dns = Responder::start().await;
    dns.hold.store(true, Ordering::SeqCst);
    let limits = ForwardLimits {
        upstream_sockets: 4,
        socket_queries: 1_000_000,
        ..ForwardLimits::default()
    };
    let (up, _clock) = upstream(&dns, limits);
    let a = Arc::new(agent_server("a", &up, NetworkPolicy::open()));
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let a = Arc::clone(&a);
            tokio::spawn(async move { ask(&a, &format!("n{i}.test")).await })
        })
        .collect();
    // Four queries reach the responder (one per socket); the others wait for a socket.
    while dns.seen().len() < 4 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(dns.seen().len(), 4);
    assert_eq!(up.open_sockets(), 4);
    dns.hold.store(false, Ordering::SeqCst);
    dns.gate.add_permits(1000);
    for t in tasks {
        assert_eq!(addrs(&t.await.unwrap()), vec![PUBLIC]);
    }
    let seen = dns.seen();
    assert_eq!(seen.len(), 40);
    let ports: HashSet<u16> = seen.iter().map(|s| s.port).collect();
    assert!(ports.len() <= 4, "{ports:?}");
    assert!(up.open_sockets() <= 4);
    // Ids: 40 draws from 65536 values; sequential or repeating ids would show here.
    let ids: Vec<u16> = seen.iter().map(|s| s.id).collect();
    let distinct: HashSet<u16> = ids.iter().copied().collect();
    assert!(distinct.len() >= 38, "{ids:?}");
    assert!(
        ids.windows(2).filter(|w| w[1] == w[0].wrapping_add(1)).count() <= 1,
        "{ids:?}"
    );
}

#[tokio::test]
async fn sockets_are_renewed_after_their_query_count() {
    let dns = Responder::start().await;
    let limits = ForwardLimits {
        upstream_sockets: 1,
        socket_queries: 3,
        cache_entries: 0,
        ..ForwardLimits::default()
    };
    let (up, _clock) = upstream(&dns, limits);
    let a = agent_server("a", &up, NetworkPolicy::open());
    for _ in 0..9 {
        ask(&a, "rotate.test").await;
    }
    let ports: Vec<u16> = dns.seen().iter().map(|s| s.port).collect();
    assert_eq!(ports.len(), 9);
    for chunk in ports.chunks(3) {
        assert!(chunk.iter().all(|p| *p == chunk[0]), "{ports:?}");
    }
    let distinct: HashSet<u16> = ports.iter().copied().collect();
    assert!(distinct.len() >= 2, "{ports:?}");
    assert!(up.open_sockets() <= 1);
}

#[tokio::test]
async fn spoofed_or_mismatched_answers_are_dropped_and_counted() {
    let dns = Responder::start().await;
    dns.script("spoofed.test", Script::Spoofed);
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, NetworkPolicy::open());
    assert_eq!(addrs(&ask(&a, "spoofed.test").await), vec![PUBLIC]);
    assert_eq!(up.mismatched_answers(), 2);
    // And the cached answer is the real one.
    assert_eq!(addrs(&ask(&a, "spoofed.test").await), vec![PUBLIC]);
    assert_eq!(dns.count("spoofed.test"), 1);
}

// covers: E9, E6
#[tokio::test]
async fn hits_over_the_server_sockets_are_answered_inline_with_every_check() {
    let dns = Responder::start().await;
    dns.script("web.test", Script::A(vec![PRIVATE, PUBLIC], 100));
    let (up, clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, allowlist(&["web.test", "other.test"]));
    let (policy, records, id) = (Arc::clone(&a.policy), Arc::clone(&a.records), a.id.clone());
    let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let tcp = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let handle = a.server.spawn(udp, tcp).unwrap();
    let client = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    client.connect(handle.udp_addr()).await.unwrap();
    let mut buf = [0u8; 4096];
    let mut ask_udp = async |name: &str| {
        client.send(&query(name, RecordType::A)).await.unwrap();
        let len = client.recv(&mut buf).await.unwrap();
        Message::from_vec(&buf[..len]).unwrap()
    };
    let first = ask_udp("web.test").await;
    clock.advance(40);
    let second = ask_udp("web.test").await;
    assert_eq!((addrs(&first), ttls(&first)), (vec![PUBLIC], vec![100]));
    assert_eq!((addrs(&second), ttls(&second)), (vec![PUBLIC], vec![60]));
    assert_eq!(dns.count("web.test"), 1);
    assert_eq!(
        records.names_for(&id, IpAddr::V4(PUBLIC)),
        vec!["web.test".to_owned()]
    );
    assert!(records.names_for(&id, IpAddr::V4(PRIVATE)).is_empty());
    policy.set(id.clone(), allowlist(&["other.test"]));
    assert_eq!(ask_udp("web.test").await.response_code, ResponseCode::NXDomain);
    assert_eq!(dns.count("web.test"), 1);
    handle.shutdown().await;
}

// ---- The wire-level hit path (`wire.rs`): from the third query of a name on, the stored reply bytes. ----

fn query_id(name: &str, rtype: RecordType, id: u16) -> Vec<u8> {
    let mut q = Message::query();
    q.metadata.id = id;
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    q.to_vec().unwrap()
}

async fn raw(a: &Agent, packet: &[u8]) -> Option<Vec<u8>> {
    a.server.answer(packet, Transport::Udp).await
}

/// (host, port, method, status, decision, reason) of the agent's last log entry.
fn last_log(a: &Agent) -> String {
    let entries = a.log.snapshot(&a.id);
    let e = entries.last().unwrap();
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?}",
        e.host, e.port, e.method, e.status, e.decision, e.reason
    )
}

fn counts(a: &Agent) -> crate::dns::DnsCount {
    a.budget.counters().agents.get(&a.id).copied().unwrap_or_default()
}

// covers: E4, E9
#[tokio::test]
async fn wire_hits_answer_as_the_full_path_with_every_side_effect() {
    let dns = Responder::start().await;
    dns.script("web.test", Script::A(vec![PUBLIC], 100));
    let (up, clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, NetworkPolicy::open());
    let packet = query_id("web.test", RecordType::A, 7);
    raw(&a, &packet).await.unwrap();
    assert_eq!(a.server.wire.len(), 0, "a miss stores nothing");
    clock.advance(10);
    // Answered from the forward cache on the full path: its bytes are kept.
    let full = raw(&a, &packet).await.unwrap();
    let full_log = last_log(&a);
    assert_eq!(a.server.wire.len(), 1);
    // The same query again: the stored bytes, byte for byte the full path's reply.
    let hit = raw(&a, &packet).await.unwrap();
    assert_eq!(hit, full);
    assert_eq!(last_log(&a), full_log);
    assert_eq!(a.log.snapshot(&a.id).len(), 3, "every query is logged");
    let c = counts(&a);
    assert_eq!((c.queries, c.forwarded), (3, 3));
    assert_eq!(dns.count("web.test"), 1);
    // TTLs go down with the age, as the forward cache lowers them.
    clock.advance(30);
    let older = Message::from_vec(&raw(&a, &packet).await.unwrap()).unwrap();
    assert_eq!((addrs(&older), ttls(&older)), (vec![PUBLIC], vec![60]));
    // Expiry (with the forward cache entry): asked upstream again, full TTL.
    clock.advance(61);
    let fresh = Message::from_vec(&raw(&a, &packet).await.unwrap()).unwrap();
    assert_eq!(ttls(&fresh), vec![100]);
    assert_eq!(dns.count("web.test"), 2);
    // The id is always the query's.
    for id in [0u16, 1, 0xbeef, 0xffff] {
        clock.advance(1);
        let reply = raw(&a, &query_id("web.test", RecordType::A, id)).await.unwrap();
        assert_eq!(Message::from_vec(&reply).unwrap().id, id);
    }
    assert_eq!(a.server.wire.len(), 1);
}

// covers: E4
#[tokio::test]
async fn wire_hits_refresh_the_agents_name_records() {
    let dns = Responder::start().await;
    let other = Ipv4Addr::new(93, 184, 216, 99);
    dns.script("web.test", Script::A(vec![PUBLIC], 100));
    dns.script("other.test", Script::A(vec![other], 100));
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    // One (address, name) pair per agent: resolving other.test forgets web.test.
    let records = Records::with_limits(1, Duration::from_secs(60));
    let a = agent_server_with("a", &up, NetworkPolicy::open(), records, GENEROUS);
    ask(&a, "web.test").await;
    ask(&a, "web.test").await;
    assert_eq!(a.server.wire.len(), 1);
    ask(&a, "other.test").await;
    assert!(a.records.names_for(&a.id, IpAddr::V4(PUBLIC)).is_empty());
    // A wire hit remembers the name again, so the transparent proxy decides by it.
    ask(&a, "web.test").await;
    assert_eq!(a.server.wire.len(), 1);
    assert_eq!(
        a.records.names_for(&a.id, IpAddr::V4(PUBLIC)),
        vec!["web.test".to_owned()]
    );
    assert_eq!(dns.count("web.test"), 1);
}

// covers: E4, E9
#[tokio::test]
async fn another_agent_never_gets_an_agents_stored_reply() {
    let dns = Responder::start().await;
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, NetworkPolicy::open());
    let b = agent_server("b", &up, NetworkPolicy::open());
    let denied = agent_server("c", &up, allowlist(&["allowed.test"]));
    for _ in 0..3 {
        ask(&a, "shared.test").await;
    }
    assert_eq!((a.server.wire.len(), dns.count("shared.test")), (1, 1));
    // Agent B: its own upstream query, then its own entries.
    ask(&b, "shared.test").await;
    assert_eq!((b.server.wire.len(), dns.count("shared.test")), (0, 2));
    let refused = ask(&denied, "shared.test").await;
    assert_eq!(
        (refused.response_code, refused.answers.len()),
        (ResponseCode::NXDomain, 0)
    );
    assert_eq!(denied.server.wire.len(), 0);
    assert!(b.records.names_for(&a.id, IpAddr::V4(PUBLIC)).is_empty());
    assert!(
        denied
            .records
            .names_for(&denied.id, IpAddr::V4(PUBLIC))
            .is_empty()
    );
}

// covers: E9
#[tokio::test]
async fn a_policy_change_refuses_a_stored_name_at_the_next_query() {
    let dns = Responder::start().await;
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, NetworkPolicy::open());
    for _ in 0..3 {
        assert_eq!(addrs(&ask(&a, "secret.test").await), vec![PUBLIC]);
    }
    assert_eq!(a.server.wire.len(), 1);
    let forwarded = counts(&a).forwarded;
    a.policy.set(a.id.clone(), allowlist(&["allowed.test"]));
    let refused = ask(&a, "secret.test").await;
    assert_eq!(
        (refused.response_code, refused.answers.len()),
        (ResponseCode::NXDomain, 0)
    );
    assert!(last_log(&a).contains("Denied"), "{}", last_log(&a));
    assert_eq!(counts(&a).forwarded, forwarded);
    // Allowed again: served again, still without the upstream.
    a.policy.set(a.id.clone(), NetworkPolicy::open());
    assert_eq!(addrs(&ask(&a, "secret.test").await), vec![PUBLIC]);
    assert_eq!(dns.count("secret.test"), 1);
}

// covers: E6, E22
#[tokio::test]
async fn replies_the_guard_refuses_are_never_served_from_stored_bytes() {
    let dns = Responder::start().await;
    dns.script("rebind.test", Script::A(vec![PRIVATE, PUBLIC, METADATA], 300));
    dns.script("web.test", Script::A(vec![PUBLIC], 300));
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, NetworkPolicy::open());
    // An answer that lost addresses to the filter is never stored: every query takes the full path.
    for _ in 0..3 {
        assert_eq!(addrs(&ask(&a, "rebind.test").await), vec![PUBLIC]);
    }
    assert_eq!(a.server.wire.len(), 0);
    // A stored reply whose address the guard refuses by now (its own-address list follows the host) is
    // checked again on every hit: forge one and see the full path answer instead.
    let packet = query("web.test", RecordType::A);
    ask(&a, "web.test").await;
    ask(&a, "web.test").await;
    assert_eq!(a.server.wire.len(), 1);
    let view = QueryView::parse(&packet).unwrap();
    let mut forged = Message::from_vec(&packet).unwrap();
    forged.metadata.message_type = MessageType::Response;
    forged.add_answer(Record::from_rdata(
        Name::from_ascii("web.test.").unwrap(),
        300,
        RData::A(A(METADATA)),
    ));
    let now = Forward::now(&*up);
    let entry = WireEntry::new(
        "web.test".into(),
        "A".into(),
        0,
        forged.to_vec().unwrap(),
        vec![(METADATA, 300)],
        vec![METADATA],
        now,
        0,
        now + Duration::from_secs(300),
    )
    .unwrap();
    a.server.wire.insert(&view, &packet, entry, now);
    let reply = ask(&a, "web.test").await;
    assert_eq!(addrs(&reply), vec![PUBLIC]);
    assert!(a.records.names_for(&a.id, IpAddr::V4(METADATA)).is_empty());
    // The forged entry is gone; the full path stored its own (clean) reply.
    assert_eq!(a.server.wire.get(&view, &packet).unwrap().addresses, vec![PUBLIC]);
}

#[tokio::test]
async fn a_query_in_other_letter_case_gets_its_own_case_back() {
    let dns = Responder::start().await;
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let a = agent_server("a", &up, NetworkPolicy::open());
    for _ in 0..3 {
        ask(&a, "web.test").await;
    }
    for _ in 0..3 {
        let reply = ask(&a, "WeB.TEST").await;
        assert_eq!(reply.queries[0].name.to_ascii(), "WeB.TEST.");
        assert_eq!(addrs(&reply), vec![PUBLIC]);
    }
    assert_eq!(a.server.wire.len(), 2);
    assert_eq!(ask(&a, "web.test").await.queries[0].name.to_ascii(), "web.test.");
    assert_eq!(dns.count("web.test"), 1);
}

// covers: E20
#[tokio::test]
async fn stored_replies_over_budget_are_refused_as_on_the_full_path() {
    let dns = Responder::start().await;
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let limits = DnsLimits {
        agent_qps: 1,
        agent_burst: 4,
        ..GENEROUS
    };
    let a = agent_server_with("a", &up, NetworkPolicy::open(), Records::new(), limits);
    let start = Instant::now();
    let (mut answered, mut refused) = (0u64, 0u64);
    for id in 0..24u16 {
        let reply =
            Message::from_vec(&raw(&a, &query_id("web.test", RecordType::A, id)).await.unwrap()).unwrap();
        assert_eq!(reply.id, id);
        match reply.response_code {
            ResponseCode::NoError => answered += 1,
            ResponseCode::Refused => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    // At most the burst plus what refilled meanwhile (one a second) was answered; the rest refused.
    let refill = start.elapsed().as_secs() + 1;
    assert!(
        answered <= 4 + refill,
        "{answered} answered in {:?}",
        start.elapsed()
    );
    let c = counts(&a);
    assert_eq!((c.forwarded, c.refused_agent_budget), (answered, refused));
    assert_eq!(answered + refused, 24);
}

// Packets the minimal parser refuses get exactly the full path's answer.
#[tokio::test]
async fn packets_the_minimal_parser_refuses_get_the_full_paths_answer() {
    let dns = Responder::start().await;
    let (up, _clock) = upstream(&dns, ForwardLimits::default());
    let warm = agent_server("a", &up, NetworkPolicy::open());
    let cold = agent_server("b", &up, NetworkPolicy::open());
    let packet = query_id("web.test", RecordType::A, 9);
    for _ in 0..3 {
        raw(&warm, &packet).await.unwrap();
    }
    assert_eq!(warm.server.wire.len(), 1);
    let mut variants: Vec<Vec<u8>> = (0..packet.len()).map(|n| packet[..n].to_vec()).collect();
    let mut longer = packet.clone();
    longer.push(0);
    variants.push(longer);
    // QDCOUNT 0 and 2, opcode 2 (STATUS), a response, a huge label length.
    for (at, value) in [
        (5usize, 0u8),
        (5, 2),
        (2, 0x11),
        (2, 0x81),
        (12, 0xff),
        (12, 0x3f),
    ] {
        let mut p = packet.clone();
        p[at] = value;
        variants.push(p);
    }
    // A compression pointer in the question (to the first question name).
    let mut pointer = packet[..12].to_vec();
    pointer.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
    variants.push(pointer);
    // Two questions.
    let mut two = Message::from_vec(&packet).unwrap();
    two.add_query(Query::query(
        Name::from_ascii("other.test.").unwrap(),
        RecordType::A,
    ));
    variants.push(two.to_vec().unwrap());
    // EDNS with an option (a cookie), EDNS version 1: well-formed, answered by the full path.
    let mut edns = Message::from_vec(&packet).unwrap();
    edns.edns = Some(hickory_proto::op::Edns::new());
    let edns = edns.to_vec().unwrap();
    let opt = edns.len() - 11;
    let mut cookie = edns.clone();
    cookie[opt + 10] = 12;
    cookie.extend_from_slice(&[0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]);
    variants.push(cookie);
    let mut version = edns.clone();
    version[opt + 6] = 1;
    variants.push(version);
    for (i, v) in variants.iter().enumerate() {
        assert_eq!(QueryView::parse(v), None, "variant {i}");
        assert_eq!(raw(&warm, v).await, raw(&cold, v).await, "variant {i}: {v:?}");
    }
    assert_eq!(warm.server.wire.len(), 1);
}
