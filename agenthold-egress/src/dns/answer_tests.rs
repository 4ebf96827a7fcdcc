//! `Server::answer` on its own, with a fake upstream.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agenthold_core::AgentId;
use agenthold_core::policy::{NetworkPolicy, PolicyMode, PolicyTable};
use hickory_proto::op::Query;
use hickory_proto::rr::rdata::svcb::{EchConfigList, IpHint, SvcParamKey};
use hickory_proto::rr::rdata::{AAAA, HTTPS};

use super::*;
use crate::dns::{DnsBudget, DnsLimits, LookupError, Records, ServerContext, SyntheticNames};
use crate::log::{Decision, RequestLog};

type Reply = fn(&Message) -> Result<Message, LookupError>;

/// Answers with `reply`, counting calls.
struct Fake {
    calls: AtomicUsize,
    reply: Reply,
}

impl Forward for Fake {
    async fn forward(&self, query: &Message) -> Result<Message, LookupError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        (self.reply)(query)
    }
}

fn server(policy: NetworkPolicy, reply: Reply) -> Server<Fake> {
    server_with(policy, reply, Guard::new([]), DnsBudget::default())
}

fn server_with(policy: NetworkPolicy, reply: Reply, guard: Guard, budget: DnsBudget) -> Server<Fake> {
    let agent = AgentId::new("a").unwrap();
    let table = PolicyTable::new();
    table.set(agent.clone(), policy);
    Server::new(ServerContext {
        agent,
        policy: Arc::new(table),
        upstream: Arc::new(Fake {
            calls: AtomicUsize::new(0),
            reply,
        }),
        records: Arc::new(Records::new()),
        log: Arc::new(RequestLog::new(10)),
        synthetic: Arc::new(SyntheticNames::new()),
        guard: Arc::new(guard),
        budget: Arc::new(budget),
    })
}

fn query(name: Name, rtype: RecordType) -> Vec<u8> {
    let mut q = Message::query();
    q.add_query(Query::query(name, rtype));
    q.to_vec().unwrap()
}

fn upstream_answer(q: &Message) -> Message {
    let name = q.queries[0].name.clone();
    let mut m = Message::response(1, OpCode::Query);
    m.queries.clone_from(&q.queries);
    let hints = vec![
        (
            SvcParamKey::Ipv4Hint,
            SvcParamValue::Ipv4Hint(IpHint(vec![A::new(127, 0, 0, 1), A::new(93, 184, 216, 34)])),
        ),
        (
            SvcParamKey::Ipv6Hint,
            SvcParamValue::Ipv6Hint(IpHint(vec![AAAA::new(0x2606, 0x2800, 0, 0, 0, 0, 0, 1)])),
        ),
        (
            SvcParamKey::EchConfigList,
            SvcParamValue::EchConfigList(EchConfigList(vec![0, 4, 1, 2, 3, 4])),
        ),
    ];
    m.add_answer(Record::from_rdata(
        name.clone(),
        60,
        RData::HTTPS(HTTPS(SVCB::new(1, Name::root(), hints))),
    ));
    m.add_additional(Record::from_rdata(
        name.clone(),
        60,
        RData::A(A::new(10, 0, 0, 1)),
    ));
    m.add_additional(Record::from_rdata(
        name,
        60,
        RData::AAAA(AAAA::new(0x2606, 0x2800, 0, 0, 0, 0, 0, 1)),
    ));
    m
}

fn run<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn service_binding_hints_ech_aaaa_and_blocked_additionals_are_stripped() {
    let s = server(NetworkPolicy::open(), |q| Ok(upstream_answer(q)));
    let name = Name::from_ascii("svc.example.").unwrap();
    let reply = run(s.answer(&query(name, RecordType::HTTPS), Transport::Udp)).unwrap();
    let reply = Message::from_vec(&reply).unwrap();
    assert!(reply.additionals.is_empty());
    let [record] = reply.answers.as_slice() else {
        panic!("{reply}")
    };
    let RData::HTTPS(https) = &record.data else {
        panic!("{record}")
    };
    assert_eq!(https.0.svc_params.len(), 1);
    let SvcParamValue::Ipv4Hint(hints) = &https.0.svc_params[0].1 else {
        panic!("{https}")
    };
    assert_eq!(hints.0, [A::new(93, 184, 216, 34)]);
    let entry = s.ctx.log.snapshot(&s.ctx.agent).pop().unwrap();
    assert_eq!(
        entry.decision,
        Decision::Allowed,
        "an HTTPS answer without A records is not a denial"
    );
    assert_eq!(
        entry.reason.as_ref().map(ToString::to_string).as_deref(),
        Some("blocked_address")
    );
}

#[test]
fn denied_names_never_reach_the_upstream() {
    let policy = NetworkPolicy::parse(PolicyMode::Allowlist, &["ok.example"]).unwrap();
    let s = server(policy, |q| Ok(upstream_answer(q)));
    let reply = run(s.answer(
        &query(Name::from_ascii("no.example.").unwrap(), RecordType::A),
        Transport::Udp,
    ));
    let reply = Message::from_vec(&reply.unwrap()).unwrap();
    assert_eq!(reply.response_code, ResponseCode::NXDomain);
    assert_eq!(s.ctx.upstream.calls.load(Ordering::SeqCst), 0);
}

#[test]
fn labels_with_dots_or_odd_bytes_are_invalid_names() {
    let dotted = Name::from_labels([&b"evil.com"[..], b"ok", b"example"]).unwrap();
    assert_eq!(question_name(&dotted), None);
    let binary = Name::from_labels([&b"a\x00b"[..], b"example"]).unwrap();
    assert_eq!(question_name(&binary), None);
    assert_eq!(question_name(&Name::root()), None);
    let fine = Name::from_ascii("Mixed-Case_x.Example.").unwrap();
    assert_eq!(question_name(&fine).as_deref(), Some("mixed-case_x.example"));

    let s = server(NetworkPolicy::open(), |q| Ok(upstream_answer(q)));
    let reply = run(s.answer(&query(dotted, RecordType::A), Transport::Udp)).unwrap();
    assert_eq!(
        Message::from_vec(&reply).unwrap().response_code,
        ResponseCode::NXDomain
    );
    assert_eq!(s.ctx.upstream.calls.load(Ordering::SeqCst), 0);
    let entry = s.ctx.log.snapshot(&s.ctx.agent).pop().unwrap();
    assert_eq!(
        entry.reason.as_ref().map(ToString::to_string).as_deref(),
        Some("invalid_name")
    );
}

#[test]
fn extended_response_codes_without_edns_become_servfail() {
    let s = server(NetworkPolicy::open(), |q| {
        let mut m = Message::response(1, OpCode::Query);
        m.queries.clone_from(&q.queries);
        m.metadata.response_code = ResponseCode::BADCOOKIE;
        Ok(m)
    });
    let reply = run(s.answer(
        &query(Name::from_ascii("x.example.").unwrap(), RecordType::A),
        Transport::Udp,
    ));
    assert_eq!(
        Message::from_vec(&reply.unwrap()).unwrap().response_code,
        ResponseCode::ServFail
    );
}

#[test]
fn zone_transfers_and_other_classes_are_refused() {
    let s = server(NetworkPolicy::open(), |q| Ok(upstream_answer(q)));
    let axfr = query(Name::from_ascii("x.example.").unwrap(), RecordType::AXFR);
    let reply = run(s.answer(&axfr, Transport::Tcp)).unwrap();
    assert_eq!(
        Message::from_vec(&reply).unwrap().response_code,
        ResponseCode::Refused
    );
    let mut chaos = Message::query();
    let mut q = Query::query(Name::from_ascii("version.bind.").unwrap(), RecordType::TXT);
    q.set_query_class(DNSClass::CH);
    chaos.add_query(q);
    let reply = run(s.answer(&chaos.to_vec().unwrap(), Transport::Udp)).unwrap();
    assert_eq!(
        Message::from_vec(&reply).unwrap().response_code,
        ResponseCode::Refused
    );
    assert_eq!(s.ctx.upstream.calls.load(Ordering::SeqCst), 0);
}

/// An upstream answer with one A record per address.
fn a_answer(q: &Message, addrs: &[[u8; 4]]) -> Message {
    let mut m = Message::response(1, OpCode::Query);
    m.queries.clone_from(&q.queries);
    for [a, b, c, d] in addrs {
        m.add_answer(Record::from_rdata(
            q.queries[0].name.clone(),
            60,
            RData::A(A::new(*a, *b, *c, *d)),
        ));
    }
    m
}

fn rcode(reply: Option<Vec<u8>>) -> ResponseCode {
    Message::from_vec(&reply.unwrap()).unwrap().response_code
}

// covers: E22
#[test]
fn answers_lose_the_hosts_own_denied_and_provider_addresses() {
    let guard = Guard::with_own_addresses(
        ["45.77.0.0/16".parse().unwrap()],
        vec!["45.76.0.10/32".parse().unwrap()],
    );
    let s = server_with(
        NetworkPolicy::open(),
        |q| {
            Ok(a_answer(
                q,
                &[
                    [45, 76, 0, 10],
                    [45, 77, 1, 1],
                    [168, 63, 129, 16],
                    [93, 184, 216, 34],
                ],
            ))
        },
        guard,
        DnsBudget::default(),
    );
    let reply = run(s.answer(
        &query(Name::from_ascii("own.example.").unwrap(), RecordType::A),
        Transport::Udp,
    ));
    let reply = Message::from_vec(&reply.unwrap()).unwrap();
    let kept: Vec<_> = reply.answers.iter().map(|r| r.data.clone()).collect();
    assert_eq!(kept, [RData::A(A::new(93, 184, 216, 34))]);
}

// covers: E9, E22
#[test]
fn local_names_and_private_reverse_names_are_refused_under_the_open_policy() {
    let s = server(NetworkPolicy::open(), |q| Ok(upstream_answer(q)));
    for (name, rtype, reason) in [
        ("printer.local.", RecordType::A, "local_name"),
        ("metadata.google.internal.", RecordType::A, "local_name"),
        ("intranet.", RecordType::A, "local_name"),
        ("router.lan.", RecordType::AAAA, "local_name"),
        ("1.0.0.10.in-addr.arpa.", RecordType::PTR, "private_reverse"),
        (
            "254.169.254.169.in-addr.arpa.",
            RecordType::PTR,
            "private_reverse",
        ),
        ("10.in-addr.arpa.", RecordType::SOA, "private_reverse"),
        (
            "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.",
            RecordType::PTR,
            "private_reverse",
        ),
    ] {
        let reply = run(s.answer(&query(Name::from_ascii(name).unwrap(), rtype), Transport::Udp));
        assert_eq!(rcode(reply), ResponseCode::NXDomain, "{name}");
        let entry = s.ctx.log.snapshot(&s.ctx.agent).pop().unwrap();
        assert_eq!(
            (
                entry.decision,
                entry.reason.as_ref().map(ToString::to_string).as_deref()
            ),
            (Decision::Denied, Some(reason)),
            "{name}"
        );
    }
    assert_eq!(
        s.ctx.upstream.calls.load(Ordering::SeqCst),
        0,
        "nothing was forwarded"
    );
    // A public reverse name is forwarded.
    let reply = run(s.answer(
        &query(
            Name::from_ascii("8.8.8.8.in-addr.arpa.").unwrap(),
            RecordType::PTR,
        ),
        Transport::Udp,
    ));
    assert_eq!(rcode(reply), ResponseCode::NoError);
    assert_eq!(s.ctx.upstream.calls.load(Ordering::SeqCst), 1);
    let c = s.ctx.budget.counters();
    assert_eq!(
        (c.total.refused_local, c.total.forwarded, c.total.queries),
        (8, 1, 9)
    );
}

// covers: E20
#[test]
fn over_budget_queries_are_refused_unforwarded_and_logged_once() {
    let limits = DnsLimits {
        agent_qps: 1,
        agent_burst: 3,
        gateway_qps: 100,
        gateway_burst: 100,
        gateway_reserve: 10,
    };
    let s = server_with(
        NetworkPolicy::open(),
        |q| Ok(a_answer(q, &[[93, 184, 216, 34]])),
        Guard::new([]),
        DnsBudget::new(limits),
    );
    let q = query(Name::from_ascii("x.example.").unwrap(), RecordType::A);
    let codes: Vec<ResponseCode> = (0..20)
        .map(|_| rcode(run(s.answer(&q, Transport::Udp))))
        .collect();
    assert_eq!(&codes[..3], [ResponseCode::NoError; 3]);
    assert!(
        codes[3..].iter().all(|c| *c == ResponseCode::Refused),
        "{codes:?}"
    );
    assert_eq!(s.ctx.upstream.calls.load(Ordering::SeqCst), 3);
    // Unreadable packets over budget get nothing back.
    assert_eq!(run(s.answer(b"\x12\x34junk", Transport::Udp)), None);
    let log = s.ctx.log.snapshot(&s.ctx.agent);
    let limited: Vec<_> = log
        .iter()
        .filter(|e| {
            e.reason
                .as_ref()
                .map(ToString::to_string)
                .as_deref()
                .is_some_and(|r| r.starts_with("rate_limited"))
        })
        .collect();
    assert_eq!(limited.len(), 1, "one entry for the whole second: {log:#?}");
    assert_eq!(
        limited[0].reason.as_ref().map(ToString::to_string).as_deref(),
        Some("rate_limited;agent;refused=1")
    );
    assert_eq!(limited[0].decision, Decision::Denied);
    assert_eq!(limited[0].host.as_deref(), Some("x.example"));
    let c = s.ctx.budget.counters();
    assert_eq!(
        (c.total.queries, c.total.forwarded, c.total.refused_agent_budget),
        (21, 3, 18)
    );
}

// covers: E9
#[test]
fn a_synthetic_override_wins_over_the_local_name_refusal() {
    // The operator's explicit (dangerous) override of a single-label name is answered: it is never
    // forwarded either.
    let s = server(NetworkPolicy::open(), |q| Ok(upstream_answer(q)));
    let addr = s.ctx.synthetic.insert("myapi").unwrap();
    let reply = run(s.answer(
        &query(Name::from_ascii("myapi.").unwrap(), RecordType::A),
        Transport::Udp,
    ));
    let reply = Message::from_vec(&reply.unwrap()).unwrap();
    assert_eq!(reply.answers[0].data, RData::A(A(addr)));
    let reply = run(s.answer(
        &query(Name::from_ascii("other.").unwrap(), RecordType::A),
        Transport::Udp,
    ));
    assert_eq!(rcode(reply), ResponseCode::NXDomain);
    assert_eq!(s.ctx.upstream.calls.load(Ordering::SeqCst), 0);
}
