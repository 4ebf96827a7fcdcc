//! What the gateway answers to one query packet: [`Server::answer`], free of sockets so that tests and the
//! fuzz target can drive it with a fake [`Forward`].
//!
//! In order: parse (malformed → FORMERR when a header can be read, else dropped; responses are never
//! answered, so two resolvers cannot be made to loop); opcode QUERY and exactly one question, else NOTIMP /
//! FORMERR; normalise the name (invalid → NXDOMAIN); ask the policy (denied → NXDOMAIN, no upstream query:
//! E9); class IN and no zone transfer, else REFUSED; a synthetic override answers without the upstream;
//! otherwise forward (failure → SERVFAIL) and strip every AAAA record and every A record (or SVCB/HTTPS
//! address hint) the address guard refuses; remember the remaining answer addresses under the question
//! name; answer with the client's id and question. Every query is logged.

use std::net::IpAddr;
use std::time::Duration;

use agenthold_core::policy::{DenyReason, Verdict, normalize_name};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::rdata::svcb::{SVCB, SvcParamValue};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use super::Forward;
use super::server::Server;
use crate::guard;
use crate::log::{LogEntry, LogKind};

/// TTL of a synthetic answer.
const SYNTHETIC_TTL: u32 = 60;
/// Length of a DNS header.
const HEADER_LEN: usize = 12;
/// Longest invalid name logged as is (the rest is cut).
const MAX_LOGGED_NAME: usize = 300;

/// The transport a query arrived on; it bounds the answer's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// UDP: at most the client's EDNS payload size (512 without EDNS), else a truncated answer with TC set.
    Udp,
    /// TCP: at most 65535 bytes.
    Tcp,
}

/// Addresses removed from an upstream answer.
#[derive(Debug, Default)]
struct Stripped {
    blocked: Vec<(IpAddr, &'static str)>,
    aaaa: usize,
}

impl<U: Forward> Server<U> {
    /// The reply to one query packet received on `transport`, or `None` when nothing should be sent back
    /// (unreadable packets, responses). Logs the query. Never panics, whatever the bytes.
    pub async fn answer(&self, packet: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let query = match Message::from_vec(packet) {
            Ok(query) if query.message_type == MessageType::Query => query,
            Ok(_) => return self.unreadable(packet, "a response, not a query"),
            Err(e) => return self.unreadable(packet, &e.to_string()),
        };
        let (reply, mut entry) = self.respond(&query).await;
        entry.status = Some(u16::from(reply.response_code));
        self.ctx.log.record(entry);
        self.encode(&reply, &query, transport)
    }

    /// The reply and log entry for a parsed query.
    async fn respond(&self, query: &Message) -> (Message, LogEntry) {
        let agent = &self.ctx.agent;
        let mut entry = LogEntry::new(agent, LogKind::Dns, Verdict::Allowed);
        entry.port = Some(53);
        if query.op_code != OpCode::Query {
            entry.deny(DenyReason::Malformed);
            return (self.reply(query, ResponseCode::NotImp), entry);
        }
        let [question] = query.queries.as_slice() else {
            entry.deny(DenyReason::Malformed);
            return (self.reply(query, ResponseCode::FormErr), entry);
        };
        entry.method = Some(question.query_type.to_string());
        let Some(name) = question_name(&question.name) else {
            entry.host = Some(question.name.to_ascii().chars().take(MAX_LOGGED_NAME).collect());
            entry.deny(DenyReason::InvalidName);
            return (self.reply(query, ResponseCode::NXDomain), entry);
        };
        let verdict = self.ctx.policy.may_resolve(agent, &name);
        let mut entry = LogEntry::new(agent, LogKind::Dns, verdict).to(name.clone(), 53);
        entry.method = Some(question.query_type.to_string());
        if !verdict.is_allowed() {
            // E9: an unlisted name is answered here; the upstream never sees it.
            return (self.reply(query, ResponseCode::NXDomain), entry);
        }
        if question.query_class != DNSClass::IN
            || matches!(
                question.query_type,
                RecordType::AXFR | RecordType::IXFR | RecordType::OPT
            )
        {
            entry.deny(DenyReason::Malformed);
            return (self.reply(query, ResponseCode::Refused), entry);
        }
        if let Some(addr) = self.ctx.synthetic.get(&name) {
            let mut reply = self.reply(query, ResponseCode::NoError);
            if question.query_type == RecordType::A {
                reply.add_answer(Record::from_rdata(
                    question.name.clone(),
                    SYNTHETIC_TTL,
                    RData::A(A(addr)),
                ));
                let ttl = Duration::from_secs(u64::from(SYNTHETIC_TTL));
                self.ctx.records.remember(agent, &name, IpAddr::V4(addr), ttl);
            }
            // Keep a report-only reason: the synthetic answer is how the name resolves, not why it passed.
            let note = "dangerous_synthetic_address";
            entry.reason = Some(
                entry
                    .reason
                    .take()
                    .map_or_else(|| note.to_owned(), |r| format!("{r};{note}")),
            );
            return (reply, entry);
        }
        match self.ctx.upstream.forward(query).await {
            Ok(upstream) => self.filtered(query, upstream, &name, question.query_type, entry),
            Err(e) => {
                tracing::warn!(agent = %agent, name = %name, error = %e, "DNS upstream failed");
                entry.fail(e.label());
                (self.reply(query, ResponseCode::ServFail), entry)
            }
        }
    }

    /// The client's reply built from the upstream's answer, minus AAAA records and blocked addresses.
    fn filtered(
        &self,
        query: &Message,
        upstream: Message,
        name: &str,
        qtype: RecordType,
        mut entry: LogEntry,
    ) -> (Message, LogEntry) {
        let mut stripped = Stripped::default();
        let mut rcode = upstream.response_code;
        if query.edns.is_none() && rcode.high() > 0 {
            // An extended code cannot be expressed without EDNS.
            rcode = ResponseCode::ServFail;
        }
        let mut reply = self.reply(query, rcode);
        reply.answers = strip(upstream.answers, &mut stripped);
        reply.authorities = strip(upstream.authorities, &mut stripped);
        reply.additionals = strip(upstream.additionals, &mut stripped);
        let mut kept = false;
        for record in &reply.answers {
            if let RData::A(a) = &record.data {
                kept = true;
                let ttl = Duration::from_secs(u64::from(record.ttl));
                self.ctx
                    .records
                    .remember(&self.ctx.agent, name, IpAddr::V4(a.0), ttl);
            }
        }
        if !stripped.blocked.is_empty() {
            // Rebinding defence (E6): a public name must not hand the sandbox a private address.
            tracing::warn!(
                agent = %self.ctx.agent, name = %name, blocked = ?stripped.blocked,
                "blocked addresses stripped from a DNS answer"
            );
            if kept || qtype != RecordType::A {
                entry.reason = Some(match entry.reason.take() {
                    Some(r) => format!("{r}; {}", DenyReason::BlockedAddress),
                    None => DenyReason::BlockedAddress.to_string(),
                });
            } else {
                entry.deny(DenyReason::NoPublicAddress);
            }
        }
        if stripped.aaaa > 0 {
            tracing::trace!(agent = %self.ctx.agent, name = %name, count = stripped.aaaa, "AAAA records stripped");
        }
        (reply, entry)
    }

    /// An empty reply to `query` with `rcode`: the client's id, opcode, question, RD and CD; RA set; an OPT
    /// record with our payload size if the client sent one.
    fn reply(&self, query: &Message, rcode: ResponseCode) -> Message {
        let mut reply = Message::response(query.id, query.op_code);
        reply.metadata.recursion_desired = query.recursion_desired;
        reply.metadata.checking_disabled = query.checking_disabled;
        reply.metadata.recursion_available = true;
        reply.metadata.response_code = rcode;
        reply.queries.clone_from(&query.queries);
        if query.edns.is_some() {
            let mut edns = Edns::new();
            edns.set_max_payload(self.limits.udp_payload.max(512));
            reply.edns = Some(edns);
        }
        reply
    }

    /// The wire form of `reply`, truncated (question only, TC set) when it exceeds what `transport` allows.
    fn encode(&self, reply: &Message, query: &Message, transport: Transport) -> Option<Vec<u8>> {
        let limit = match transport {
            Transport::Udp => usize::from(query.max_payload().min(self.limits.udp_payload).max(512)),
            Transport::Tcp => usize::from(u16::MAX),
        };
        let bytes = match reply.to_vec() {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(agent = %self.ctx.agent, error = %e, "DNS reply could not be encoded");
                return self.reply(query, ResponseCode::ServFail).to_vec().ok();
            }
        };
        if bytes.len() <= limit {
            return Some(bytes);
        }
        let truncated = reply.truncate().to_vec().ok()?;
        (truncated.len() <= limit).then_some(truncated)
    }

    /// Log a packet that is not a readable query; answer FORMERR if it has a query's header.
    fn unreadable(&self, packet: &[u8], problem: &str) -> Option<Vec<u8>> {
        let mut entry = LogEntry::new(
            &self.ctx.agent,
            LogKind::Dns,
            Verdict::Denied(DenyReason::Malformed),
        );
        entry.port = Some(53);
        tracing::debug!(agent = %self.ctx.agent, problem, len = packet.len(), "unreadable DNS packet");
        let reply = match packet {
            // QR clear: a query. A packet with QR set gets no answer, so resolvers cannot be made to loop.
            [id_high, id_low, flags, ..] if packet.len() >= HEADER_LEN && flags & 0x80 == 0 => {
                let op_code = OpCode::from_u8((flags >> 3) & 0x0f);
                let mut reply = Message::error_msg(
                    u16::from_be_bytes([*id_high, *id_low]),
                    op_code,
                    ResponseCode::FormErr,
                );
                reply.metadata.recursion_available = true;
                entry.status = Some(u16::from(ResponseCode::FormErr));
                reply.to_vec().ok()
            }
            _ => None,
        };
        self.ctx.log.record(entry);
        reply
    }
}

/// The normalised question name, or `None` if it is not a valid host name. Labels are checked byte by byte
/// before joining, so a label containing a dot or any byte outside letters, digits, `-` and `_` cannot
/// pass as a different name.
fn question_name(name: &Name) -> Option<String> {
    let mut text = String::with_capacity(name.len());
    for (i, label) in name.iter().enumerate() {
        if !label
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        {
            return None;
        }
        if i > 0 {
            text.push('.');
        }
        text.extend(label.iter().map(|b| char::from(*b)));
    }
    normalize_name(&text).ok()
}

/// `records` without AAAA records and without A records or SVCB/HTTPS hints the guard refuses.
fn strip(records: Vec<Record>, stripped: &mut Stripped) -> Vec<Record> {
    records
        .into_iter()
        .filter_map(|mut record| {
            match &mut record.data {
                RData::AAAA(_) => {
                    stripped.aaaa += 1;
                    return None;
                }
                RData::A(a) => {
                    if let Err(blocked) = guard::check_v4(a.0) {
                        stripped.blocked.push((IpAddr::V4(a.0), blocked.range));
                        return None;
                    }
                }
                RData::SVCB(svcb) => strip_hints(svcb, stripped),
                RData::HTTPS(https) => strip_hints(&mut https.0, stripped),
                _ => {}
            }
            Some(record)
        })
        .collect()
}

/// Drop IPv6 hints, blocked IPv4 hints and ECH configurations from a service binding record. Without an
/// ECH configuration clients send their real server name in the clear, which is what the gateway decides
/// on: with ECH the SNI it sees is only the provider's public name, and an allowlisted provider would let
/// every site behind it through.
fn strip_hints(svcb: &mut SVCB, stripped: &mut Stripped) {
    svcb.svc_params.retain_mut(|(_, value)| match value {
        SvcParamValue::Ipv6Hint(_) | SvcParamValue::EchConfigList(_) => false,
        SvcParamValue::Ipv4Hint(hints) => {
            hints.0.retain(|a| match guard::check_v4(a.0) {
                Ok(()) => true,
                Err(blocked) => {
                    stripped.blocked.push((IpAddr::V4(a.0), blocked.range));
                    false
                }
            });
            !hints.0.is_empty()
        }
        _ => true,
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use agenthold_core::AgentId;
    use agenthold_core::policy::{NetworkPolicy, PolicyMode, PolicyTable};
    use hickory_proto::op::Query;
    use hickory_proto::rr::rdata::svcb::{EchConfigList, IpHint, SvcParamKey};
    use hickory_proto::rr::rdata::{AAAA, HTTPS};

    use super::*;
    use crate::dns::{LookupError, Records, ServerContext, SyntheticNames};
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
        assert_eq!(entry.reason.as_deref(), Some("blocked_address"));
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
        assert_eq!(entry.reason.as_deref(), Some("invalid_name"));
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
}
