//! An upstream DNS server on loopback that answers from a table and records every query it receives.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, Metadata, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

/// How a query reached the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A UDP datagram.
    Udp,
    /// A length-prefixed message on a TCP connection.
    Tcp,
}

/// One question a [`TestDns`] received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsQuery {
    /// The queried name, lower case, without the trailing dot (`example.com`).
    pub name: String,
    /// The queried type (`A`, `AAAA`, `TXT`, …).
    pub record_type: RecordType,
    /// UDP or TCP.
    pub transport: Transport,
    /// Who asked.
    pub peer: SocketAddr,
}

#[derive(Debug)]
struct State {
    records: Mutex<HashMap<String, Vec<IpAddr>>>,
    ttl: u32,
    queries: Mutex<Vec<DnsQuery>>,
}

/// A DNS server on `127.0.0.1`, UDP and TCP on the same port (bound to port 0), built on hickory-proto's
/// wire format. Answers `A` and `AAAA` questions from a table `name -> addresses` with a fixed TTL,
/// `NOERROR` with no answer for other types of a known name, `NXDOMAIN` for unknown names; records every
/// question (so a test can assert that *no* query reached it). Stops when dropped.
#[derive(Debug)]
pub struct TestDns {
    addr: SocketAddr,
    state: Arc<State>,
    tasks: Vec<JoinHandle<()>>,
}

impl TestDns {
    /// Starts a server answering from `records` (names are case-insensitive, a trailing dot is optional)
    /// with `ttl` seconds.
    pub async fn start<I, S>(records: I, ttl: u32) -> Self
    where
        I: IntoIterator<Item = (S, Vec<IpAddr>)>,
        S: AsRef<str>,
    {
        let records = records
            .into_iter()
            .map(|(name, addrs)| (normalise(name.as_ref()), addrs))
            .collect();
        let state = Arc::new(State {
            records: Mutex::new(records),
            ttl,
            queries: Mutex::new(Vec::new()),
        });
        let (udp, tcp) = bind_pair().await;
        let addr = udp.local_addr().expect("DNS server address");
        let tasks = vec![
            tokio::spawn(serve_udp(udp, Arc::clone(&state))),
            tokio::spawn(serve_tcp(tcp, Arc::clone(&state))),
        ];
        tracing::debug!(%addr, "test DNS server listening");
        Self { addr, state, tasks }
    }

    /// Where it listens (the same address for UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets (or replaces) the addresses of `name`, e.g. to rebind it between two queries.
    pub fn set(&self, name: &str, addrs: Vec<IpAddr>) {
        self.state
            .records
            .lock()
            .expect("records lock")
            .insert(normalise(name), addrs);
    }

    /// Removes `name`: it answers `NXDOMAIN` from now on.
    pub fn remove(&self, name: &str) {
        self.state
            .records
            .lock()
            .expect("records lock")
            .remove(&normalise(name));
    }

    /// Every question received so far, in arrival order.
    pub fn queries(&self) -> Vec<DnsQuery> {
        self.state.queries.lock().expect("query log lock").clone()
    }

    /// Forgets the questions received so far.
    pub fn clear_queries(&self) {
        self.state.queries.lock().expect("query log lock").clear();
    }
}

impl Drop for TestDns {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn normalise(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// A UDP socket and a TCP listener on the same loopback port: UDP takes any free port, TCP may find it
/// taken (by someone else's TCP socket), then try again.
async fn bind_pair() -> (UdpSocket, TcpListener) {
    for _ in 0..64 {
        let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind the DNS UDP socket");
        let port = udp.local_addr().expect("DNS UDP address").port();
        if let Ok(tcp) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await {
            return (udp, tcp);
        }
    }
    panic!("no loopback port free for both UDP and TCP after 64 tries");
}

async fn serve_udp(socket: UdpSocket, state: Arc<State>) {
    let mut buf = vec![0u8; 4096];
    while let Ok((len, peer)) = socket.recv_from(&mut buf).await {
        if let Some(answer) = answer(&buf[..len], Transport::Udp, peer, &state) {
            let _ = socket.send_to(&answer, peer).await;
        }
    }
}

async fn serve_tcp(listener: TcpListener, state: Arc<State>) {
    while let Ok((stream, peer)) = listener.accept().await {
        tokio::spawn(serve_tcp_connection(stream, peer, Arc::clone(&state)));
    }
}

/// One TCP connection: messages framed by a two-byte length (RFC 1035 4.2.2), several per connection.
async fn serve_tcp_connection(mut stream: TcpStream, peer: SocketAddr, state: Arc<State>) {
    loop {
        let Ok(len) = stream.read_u16().await else { return };
        let mut message = vec![0u8; len.into()];
        if stream.read_exact(&mut message).await.is_err() {
            return;
        }
        let Some(answer) = answer(&message, Transport::Tcp, peer, &state) else {
            return;
        };
        let Ok(len) = u16::try_from(answer.len()) else {
            return;
        };
        if stream.write_u16(len).await.is_err() || stream.write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// The wire-format answer to one wire-format query; `None` for bytes that are not a query.
fn answer(query: &[u8], transport: Transport, peer: SocketAddr, state: &State) -> Option<Vec<u8>> {
    let request = Message::from_vec(query).ok()?;
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata = Metadata::response_from_request(&request.metadata);
    response.metadata.authoritative = true;
    response.metadata.recursion_available = true;
    let records = state.records.lock().expect("records lock");
    for question in &request.queries {
        let name = normalise(&question.name().to_ascii());
        state.queries.lock().expect("query log lock").push(DnsQuery {
            name: name.clone(),
            record_type: question.query_type(),
            transport,
            peer,
        });
        response.add_query(question.clone());
        let Some(addrs) = records.get(&name) else {
            response.metadata.response_code = ResponseCode::NXDomain;
            continue;
        };
        for addr in addrs {
            let rdata = match (question.query_type(), addr) {
                (RecordType::A, IpAddr::V4(v4)) => RData::A(A(*v4)),
                (RecordType::AAAA, IpAddr::V6(v6)) => RData::AAAA(AAAA(*v6)),
                _ => continue,
            };
            response.add_answer(Record::from_rdata(question.name().clone(), state.ttl, rdata));
        }
    }
    response.to_vec().ok()
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::Name;

    use super::*;

    fn query(name: &str, record_type: RecordType) -> Vec<u8> {
        let mut message = Message::query();
        message.add_query(Query::query(Name::from_ascii(name).unwrap(), record_type));
        message.to_vec().unwrap()
    }

    fn addresses(answer: &Message) -> Vec<IpAddr> {
        answer
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn answers_from_the_table_over_udp_and_tcp_and_records_queries() {
        let v4: IpAddr = Ipv4Addr::new(203, 0, 113, 7).into();
        let v6: IpAddr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7).into();
        let dns = TestDns::start([("Upstream.Test.", vec![v4, v6])], 42).await;

        let client = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let mut buf = vec![0u8; 4096];
        for (name, record_type, expected, code) in [
            ("upstream.test.", RecordType::A, vec![v4], ResponseCode::NoError),
            (
                "UPSTREAM.test.",
                RecordType::AAAA,
                vec![v6],
                ResponseCode::NoError,
            ),
            ("upstream.test.", RecordType::TXT, vec![], ResponseCode::NoError),
            ("missing.test.", RecordType::A, vec![], ResponseCode::NXDomain),
        ] {
            client
                .send_to(&query(name, record_type), dns.addr())
                .await
                .unwrap();
            let len = client.recv(&mut buf).await.unwrap();
            let answer = Message::from_vec(&buf[..len]).unwrap();
            assert_eq!(answer.metadata.response_code, code, "{name} {record_type}");
            assert_eq!(addresses(&answer), expected, "{name} {record_type}");
            assert!(answer.answers.iter().all(|r| r.ttl == 42));
        }

        let mut tcp = TcpStream::connect(dns.addr()).await.unwrap();
        let message = query("upstream.test.", RecordType::A);
        tcp.write_u16(message.len().try_into().unwrap()).await.unwrap();
        tcp.write_all(&message).await.unwrap();
        let len = tcp.read_u16().await.unwrap();
        let mut reply = vec![0u8; len.into()];
        tcp.read_exact(&mut reply).await.unwrap();
        assert_eq!(addresses(&Message::from_vec(&reply).unwrap()), vec![v4]);

        let queries = dns.queries();
        assert_eq!(queries.len(), 5);
        assert_eq!(queries[1].name, "upstream.test");
        assert_eq!(queries[1].record_type, RecordType::AAAA);
        assert_eq!(queries[4].transport, Transport::Tcp);

        dns.set("missing.test", vec![v4]);
        dns.remove("upstream.test");
        client
            .send_to(&query("missing.test.", RecordType::A), dns.addr())
            .await
            .unwrap();
        let len = client.recv(&mut buf).await.unwrap();
        assert_eq!(addresses(&Message::from_vec(&buf[..len]).unwrap()), vec![v4]);
        dns.clear_queries();
        assert!(dns.queries().is_empty());
    }
}
