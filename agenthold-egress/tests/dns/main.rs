//! The gateway's DNS on loopback, without root: a table-driven upstream (`TestDns`) or a scripted one, the
//! real `dns::Server` on loopback sockets, and real clients (hickory-proto messages over UDP and TCP, and
//! python3's `socket` with a hand-built query).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthold_core::AgentId;
use agenthold_core::policy::{NetworkPolicy, PolicyMode, PolicyTable};
use agenthold_egress::dns::proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use agenthold_egress::dns::proto::rr::rdata::A;
use agenthold_egress::dns::proto::rr::{Name, RData, Record, RecordType};
use agenthold_egress::dns::{
    DnsBudget, LookupError, Records, Server, ServerContext, ServerHandle, SyntheticNames, Transport, Upstream,
};
use agenthold_egress::guard::Guard;
use agenthold_egress::log::{Decision, LogKind, RequestLog};
use agenthold_testsupport::{TestDns, init_tracing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

const PUBLIC: Ipv4Addr = Ipv4Addr::new(93, 184, 216, 34);
const PUBLIC_V6: &str = "2606:2800:220:1:248:1893:25c8:1946";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn agent() -> AgentId {
    AgentId::new("agent-a").unwrap()
}

/// A server for `agent()` in front of `upstream`, with its shared parts.
struct Harness {
    handle: ServerHandle,
    policy: Arc<PolicyTable>,
    records: Arc<Records>,
    log: Arc<RequestLog>,
}

async fn serve(
    upstream: Upstream,
    policy: NetworkPolicy,
    records: Records,
    synthetic: SyntheticNames,
) -> Harness {
    init_tracing();
    let table = Arc::new(PolicyTable::new());
    table.set(agent(), policy);
    let records = Arc::new(records);
    let log = Arc::new(RequestLog::new(100));
    let server = Server::new(ServerContext {
        agent: agent(),
        policy: Arc::clone(&table) as _,
        upstream: Arc::new(upstream),
        records: Arc::clone(&records),
        log: Arc::clone(&log),
        synthetic: Arc::new(synthetic),
        guard: Arc::new(Guard::new([])),
        budget: Arc::new(DnsBudget::default()),
    });
    let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let handle = server.spawn(udp, tcp).unwrap();
    Harness {
        handle,
        policy: table,
        records,
        log,
    }
}

async fn serve_open(dns: &TestDns) -> Harness {
    serve(
        Upstream::new(dns.addr()),
        NetworkPolicy::open(),
        Records::new(),
        SyntheticNames::new(),
    )
    .await
}

fn allowlist(entries: &[&str]) -> NetworkPolicy {
    NetworkPolicy::parse(PolicyMode::Allowlist, entries).unwrap()
}

fn query(name: &str, rtype: RecordType, edns: bool) -> Message {
    let mut q = Message::query();
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        q.set_edns(e);
    }
    q
}

async fn exchange_udp(server: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let client = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    client.send_to(bytes, server).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let len = tokio::time::timeout(Duration::from_secs(3), client.recv(&mut buf))
        .await
        .ok()?
        .unwrap();
    Some(buf[..len].to_vec())
}

async fn ask_udp(server: SocketAddr, q: &Message) -> Message {
    let reply = exchange_udp(server, &q.to_vec().unwrap())
        .await
        .expect("an answer over UDP");
    let reply = Message::from_vec(&reply).unwrap();
    assert_eq!(reply.id, q.id, "the answer carries the client's id");
    assert_eq!(reply.message_type, MessageType::Response);
    assert_eq!(
        reply.queries, q.queries,
        "the answer carries the client's question"
    );
    reply
}

async fn send_tcp(stream: &mut TcpStream, bytes: &[u8]) -> Message {
    stream
        .write_u16(u16::try_from(bytes.len()).unwrap())
        .await
        .unwrap();
    stream.write_all(bytes).await.unwrap();
    let len = stream.read_u16().await.unwrap();
    let mut buf = vec![0u8; usize::from(len)];
    stream.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

fn a_records(m: &Message) -> Vec<IpAddr> {
    m.answers
        .iter()
        .chain(&m.additionals)
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

mod fuzz_check;
mod query_view_check;
mod regressions;
mod server;
mod upstream;
