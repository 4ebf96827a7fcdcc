//! The check of the `dns_message` fuzz target, in one file that only uses `agenthold_egress`,
//! `agenthold_core` and `std`: `fuzz/fuzz_targets/dns_message.rs` includes it by path, and `tests/dns`
//! replays `fuzz/regressions/dns_message/` and `fuzz/seeds/dns_message/` through it under plain `cargo test`.
//!
//! Input: `flags`, a two-byte big-endian length `n`, then `n` bytes of the query a sandbox sends, then the
//! bytes the (fake) upstream answers with. Flags: bit 0 an allowlist (`allowed.test`, `*.example`) instead
//! of the open policy, bit 1 report-only instead of enforcing, bit 2 a synthetic override for
//! `synthetic.example`, bit 3 TCP instead of UDP.
//!
//! Checked, whatever the bytes: no panic; a reply only to a packet with the query bit clear, carrying its id,
//! parseable, within the transport's size; no AAAA record and no A record (or SVCB/HTTPS hint) the address
//! guard refuses, synthetic addresses aside; and under an enforced allowlist, the upstream is asked only
//! about names the allowlist covers (E9).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use agenthold_core::AgentId;
use agenthold_core::policy::{EgressPolicy, NetworkPolicy, PolicyMode, PolicyTable};
use agenthold_egress::dns::proto::op::{Message, MessageType};
use agenthold_egress::dns::proto::rr::RData;
use agenthold_egress::dns::proto::rr::rdata::svcb::{SVCB, SvcParamValue};
use agenthold_egress::dns::{
    DnsBudget, Forward, LookupError, Records, Server, ServerContext, ServerLimits, SyntheticNames, Transport,
};
use agenthold_egress::guard::Guard;
use agenthold_egress::log::RequestLog;

/// Answers every forwarded query with the same message (or fails when the bytes did not parse).
struct FakeUpstream {
    answer: Option<Message>,
    calls: AtomicUsize,
}

impl Forward for FakeUpstream {
    async fn forward(&self, _query: &Message) -> Result<Message, LookupError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.answer.clone().ok_or_else(|| LookupError::Malformed {
            upstream: SocketAddr::from((Ipv4Addr::LOCALHOST, 53)),
            name: String::new(),
            problem: "fuzzed upstream bytes do not parse".to_owned(),
        })
    }
}

/// Run `data` through `Server::answer` and check the invariants above.
pub(crate) fn check(data: &[u8]) {
    let [flags, len_high, len_low, rest @ ..] = data else {
        return;
    };
    let split = usize::from(u16::from_be_bytes([*len_high, *len_low])).min(rest.len());
    let (packet, upstream_bytes) = rest.split_at(split);

    let agent = AgentId::new("fuzz").unwrap();
    let mode = match (flags & 1 != 0, flags & 2 != 0) {
        (false, _) => PolicyMode::Open,
        (true, false) => PolicyMode::Allowlist,
        (true, true) => PolicyMode::ReportOnly,
    };
    let policy = NetworkPolicy::parse(mode, &["allowed.test", "*.example"]).unwrap();
    let table = Arc::new(PolicyTable::new());
    table.set(agent.clone(), policy.clone());
    let synthetic = SyntheticNames::new();
    let fake = (flags & 4 != 0).then(|| synthetic.insert("synthetic.example").unwrap());
    let upstream = Arc::new(FakeUpstream {
        answer: Message::from_vec(upstream_bytes).ok(),
        calls: AtomicUsize::new(0),
    });
    let log = Arc::new(RequestLog::new(4));
    let guard = Arc::new(Guard::new([]));
    let server = Server::new(ServerContext {
        agent: agent.clone(),
        policy: Arc::clone(&table) as Arc<dyn EgressPolicy>,
        upstream: Arc::clone(&upstream),
        records: Arc::new(Records::new()),
        log: Arc::clone(&log),
        synthetic: Arc::new(synthetic),
        guard: Arc::clone(&guard),
        budget: Arc::new(DnsBudget::default()),
    });
    let transport = if flags & 8 != 0 {
        Transport::Tcp
    } else {
        Transport::Udp
    };

    let reply = now_or_never(server.answer(packet, transport));

    assert!(log.snapshot(&agent).len() <= 1, "one log entry per packet");
    if upstream.calls.load(Ordering::SeqCst) > 0 && mode == PolicyMode::Allowlist {
        let entry = log.snapshot(&agent).pop().expect("a forwarded query is logged");
        let host = entry.host.expect("a forwarded query has a name");
        assert!(
            policy.may_resolve(&host).is_allowed(),
            "E9: {host} was forwarded under an allowlist"
        );
    }
    let Some(reply) = reply else { return };
    assert!(packet.len() >= 12, "a reply to a packet shorter than a header");
    assert_eq!(packet[2] & 0x80, 0, "a reply to a response");
    let query = Message::from_vec(packet).ok();
    let limit = match (transport, &query) {
        (Transport::Tcp, _) => 65535,
        (Transport::Udp, Some(q)) => {
            usize::from(q.max_payload().min(ServerLimits::default().udp_payload).max(512))
        }
        (Transport::Udp, None) => 512,
    };
    assert!(
        reply.len() <= limit,
        "{} bytes over {transport:?}, limit {limit}",
        reply.len()
    );
    let reply = Message::from_vec(&reply).expect("the gateway's reply parses");
    assert_eq!(reply.message_type, MessageType::Response);
    assert_eq!(reply.id, u16::from_be_bytes([packet[0], packet[1]]));
    for record in reply
        .answers
        .iter()
        .chain(&reply.authorities)
        .chain(&reply.additionals)
    {
        match &record.data {
            RData::AAAA(a) => panic!("AAAA record {} reached the sandbox", a.0),
            RData::A(a) if Some(a.0) != fake => assert_allowed(&guard, a.0),
            RData::SVCB(svcb) => assert_hints_allowed(&guard, svcb),
            RData::HTTPS(https) => assert_hints_allowed(&guard, &https.0),
            _ => {}
        }
    }
}

fn assert_allowed(guard: &Guard, addr: Ipv4Addr) {
    assert!(
        guard.check(IpAddr::V4(addr)).is_ok(),
        "blocked address {addr} reached the sandbox"
    );
}

fn assert_hints_allowed(guard: &Guard, svcb: &SVCB) {
    for (_, value) in &svcb.svc_params {
        match value {
            SvcParamValue::Ipv6Hint(_) => panic!("an IPv6 hint reached the sandbox"),
            SvcParamValue::Ipv4Hint(hints) => hints.0.iter().for_each(|a| assert_allowed(guard, a.0)),
            _ => {}
        }
    }
}

/// Poll once: with the fake upstream nothing in `Server::answer` waits, so it must be ready.
fn now_or_never<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("Server::answer waited on something other than the upstream"),
    }
}
