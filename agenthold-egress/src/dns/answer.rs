//! What the gateway answers to one query packet: [`Server::answer`], free of sockets so that tests and the
//! fuzz target can drive it with a fake [`Forward`].
//!
//! In order: parse; take the query's tokens from the agent's and the gateway's DNS budgets (over budget:
//! REFUSED, or nothing for an unreadable packet, logged at most once a second per agent: E20); malformed →
//! FORMERR when a header can be read, else dropped (responses are never answered, so two resolvers cannot be
//! made to loop); opcode QUERY and exactly one question, else NOTIMP / FORMERR; normalise the name (invalid →
//! NXDOMAIN); ask the policy (denied → NXDOMAIN, no upstream query: E9); class IN and no zone transfer, else
//! REFUSED; a synthetic override answers without the upstream; local-only names and reverse names of
//! blocked ranges → NXDOMAIN whatever the policy said (see `special.rs`); otherwise forward (failure →
//! SERVFAIL) and strip every AAAA record and every A record (or SVCB/HTTPS address hint) the gateway's
//! [`Guard`] refuses (rebinding: E6, E22); remember the remaining answer addresses under the question name;
//! answer with the client's id and question. Every query is logged, except refusals over budget (see
//! above).
// enforces: E9

use std::net::IpAddr;
use std::time::{Duration, Instant};

use agenthold_core::policy::{DenyReason, Verdict, normalize_name};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::rdata::svcb::{SVCB, SvcParamValue};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use super::Forward;
use super::budget::{Admission, Event, Scope};
use super::server::Server;
use super::special::{self, Refusal};
use crate::guard::{Blocked, Guard};
use crate::log::{DnsFailure, LogEntry, LogKind, Reason};

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
    blocked: Vec<(IpAddr, Blocked)>,
    aaaa: usize,
}

impl<U: Forward> Server<U> {
    /// The reply to one query packet received on `transport`, or `None` when nothing should be sent back
    /// (unreadable packets, responses). Logs the query. Never panics, whatever the bytes.
    pub async fn answer(&self, packet: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let parsed = Message::from_vec(packet);
        if let Admission::Refused { scope, log } = self.ctx.budget.admit(&self.ctx.agent, Instant::now()) {
            let query = parsed.ok().filter(|q| q.message_type == MessageType::Query);
            return self.over_budget(query, scope, log, transport);
        }
        let query = match parsed {
            Ok(query) if query.message_type == MessageType::Query => query,
            Ok(_) => return self.unreadable(packet, "a response, not a query"),
            Err(e) => return self.unreadable(packet, &e.to_string()),
        };
        let (reply, mut entry) = self.respond(&query).await;
        entry.status = Some(u16::from(reply.response_code));
        self.ctx.log.record(entry);
        self.encode(&reply, &query, transport)
    }

    /// The reply to a packet over budget: REFUSED for a readable query, nothing otherwise; nothing is
    /// forwarded. Logged only when `log` says an entry is due (with the count it carries).
    fn over_budget(
        &self,
        query: Option<Message>,
        scope: Scope,
        log: Option<u64>,
        transport: Transport,
    ) -> Option<Vec<u8>> {
        if let Some(count) = log {
            let mut entry = LogEntry::new(&self.ctx.agent, LogKind::Dns, Verdict::Allowed);
            entry.set_reason(Reason::RateLimited {
                scope,
                refused: count,
            });
            entry.status = Some(u16::from(ResponseCode::Refused));
            entry.port = Some(53);
            if let Some(question) = query.as_ref().and_then(|q| q.queries.first()) {
                let name = question_name(&question.name);
                entry.host = Some(
                    name.unwrap_or_else(|| question.name.to_ascii().chars().take(MAX_LOGGED_NAME).collect()),
                );
                entry.method = Some(question.query_type.to_string());
            }
            self.ctx.log.record(entry);
        }
        let query = query?;
        self.encode(&self.reply(&query, ResponseCode::Refused), &query, transport)
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
            entry.set_reason(Reason::SyntheticAddress {
                reported: verdict.reason(),
            });
            return (reply, entry);
        }
        if let Some(refusal) = special::refusal(&name, &self.ctx.guard) {
            // Whatever the policy allowed: these names only mean something on a local network.
            entry.deny(match refusal {
                Refusal::SingleLabel | Refusal::LocalSuffix(_) => DenyReason::LocalName,
                Refusal::PrivateReverse(_) => DenyReason::PrivateReverse,
            });
            tracing::debug!(agent = %agent, ?refusal, "local-only DNS name refused");
            self.ctx.budget.record(agent, Event::RefusedLocal);
            return (self.reply(query, ResponseCode::NXDomain), entry);
        }
        self.ctx.budget.record(agent, Event::Forwarded);
        match self.ctx.upstream.forward(query).await {
            Ok(upstream) => self.filtered(query, upstream, &name, question.query_type, entry),
            Err(e) => {
                tracing::warn!(agent = %agent, name = %name, error = %e, "DNS upstream failed");
                entry.set_reason(Reason::DnsUpstream(DnsFailure::from(&e)));
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
        let guard = &self.ctx.guard;
        reply.answers = strip(upstream.answers, guard, &mut stripped);
        reply.authorities = strip(upstream.authorities, guard, &mut stripped);
        reply.additionals = strip(upstream.additionals, guard, &mut stripped);
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
                agent = %self.ctx.agent, name = %name,
                blocked = ?stripped.blocked.iter().map(|(a, b)| format!("{a}: {b}")).collect::<Vec<_>>(),
                "blocked addresses stripped from a DNS answer"
            );
            if kept || qtype != RecordType::A {
                let reported = entry.reason.as_ref().and_then(Reason::reported);
                entry.set_reason(Reason::AddressesStripped { reported });
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
fn strip(records: Vec<Record>, guard: &Guard, stripped: &mut Stripped) -> Vec<Record> {
    records
        .into_iter()
        .filter_map(|mut record| {
            match &mut record.data {
                RData::AAAA(_) => {
                    stripped.aaaa += 1;
                    return None;
                }
                RData::A(a) => {
                    let addr = IpAddr::V4(a.0);
                    if let Err(blocked) = guard.check(addr) {
                        stripped.blocked.push((addr, blocked));
                        return None;
                    }
                }
                RData::SVCB(svcb) => strip_hints(svcb, guard, stripped),
                RData::HTTPS(https) => strip_hints(&mut https.0, guard, stripped),
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
fn strip_hints(svcb: &mut SVCB, guard: &Guard, stripped: &mut Stripped) {
    svcb.svc_params.retain_mut(|(_, value)| match value {
        SvcParamValue::Ipv6Hint(_) | SvcParamValue::EchConfigList(_) => false,
        SvcParamValue::Ipv4Hint(hints) => {
            hints.0.retain(|a| {
                let addr = IpAddr::V4(a.0);
                match guard.check(addr) {
                    Ok(()) => true,
                    Err(blocked) => {
                        stripped.blocked.push((addr, blocked));
                        false
                    }
                }
            });
            !hints.0.is_empty()
        }
        _ => true,
    });
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
