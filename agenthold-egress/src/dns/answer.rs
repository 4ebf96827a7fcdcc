//! What the gateway answers to one query packet: [`Server::answer`], free of sockets so that tests and the
//! fuzz target can drive it with a fake [`Forward`].
//!
//! In order: parse; take the query's tokens from the agent's and the gateway's DNS budgets (over budget:
//! REFUSED, or nothing for an unreadable packet, logged at most once a second per agent: E20); malformed →
//! FORMERR when a header can be read, else dropped (responses are never answered, so two resolvers cannot be
//! made to loop); opcode QUERY and exactly one question, else NOTIMP / FORMERR; normalise the name (invalid →
//! NXDOMAIN); ask the policy (denied → NXDOMAIN, no upstream query: E9); class IN and no zone transfer, else
//! REFUSED; a synthetic override answers without the upstream; local-only names and reverse names of
//! blocked ranges → NXDOMAIN whatever the policy said (see `special.rs`); otherwise forward through
//! [`Forward::forward_for`], which may answer from the agent's own cache entries (failure → SERVFAIL): every
//! step before and after it runs on a cached answer too; strip every AAAA record and every A record (or SVCB/HTTPS address hint) the gateway's
//! [`Guard`] refuses (rebinding: E6, E22); remember the remaining answer addresses under the question name;
//! answer with the client's id and question. Every query is logged, except refusals over budget (see
//! above).
// enforces: E9

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthold_core::policy::{DenyReason, Verdict, normalize_name};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::rdata::svcb::{SVCB, SvcParamValue};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use super::budget::{Admission, Event, Scope};
use super::server::Server;
use super::special::{self, Refusal};
use super::wire::{QueryView, WireEntry};
use super::{CachedAnswer, Forward};
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

/// What [`Server::answer_now`] got to without waiting.
pub(super) enum Progress {
    /// The reply (or nothing to send), logged.
    Done(Option<Vec<u8>>),
    /// The query must be forwarded: finish it with [`Server::finish`].
    Forward(Box<Pending>),
}

/// A query past every check, to be forwarded (budget taken, counted as forwarded, not yet logged).
pub(super) struct Pending {
    query: Message,
    name: String,
    qtype: RecordType,
    entry: LogEntry,
    transport: Transport,
}

/// What [`Server::decide`] concluded.
enum Checked {
    /// The reply, without the upstream.
    Reply(Message, LogEntry),
    /// Ask the upstream (or the cache) for the allowed `name`.
    Forward(String, RecordType, LogEntry),
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
        match self.answer_now(packet, transport) {
            Progress::Done(reply) => reply,
            Progress::Forward(pending) => self.finish(pending).await,
        }
    }

    /// [`Server::answer`] as far as it goes without waiting: every check, and the answer itself when it
    /// needs no upstream exchange (refusals, synthetic names, an answer from the agent's cache through
    /// [`Forward::cached_for`]). The UDP loop answers these inline, without a task per query.
    pub(super) fn answer_now(&self, packet: &[u8], transport: Transport) -> Progress {
        let view = QueryView::parse(packet);
        if let Some(view) = &view
            && let Some((entry, verdict, now)) = self.wire_hit(packet, view, transport)
        {
            return Progress::Done(self.serve_hit(packet, view, &entry, verdict, now, transport));
        }
        let parsed = Message::from_vec(packet);
        if let Admission::Refused { scope, log } = self.ctx.budget.admit(&self.ctx.agent, Instant::now()) {
            let query = parsed.ok().filter(|q| q.message_type == MessageType::Query);
            return Progress::Done(self.over_budget(query, scope, log, transport));
        }
        let query = match parsed {
            Ok(query) if query.message_type == MessageType::Query => query,
            Ok(_) => return Progress::Done(self.unreadable(packet, "a response, not a query")),
            Err(e) => return Progress::Done(self.unreadable(packet, &e.to_string())),
        };
        let (reply, entry) = match self.decide(&query) {
            Checked::Reply(reply, entry) => (reply, entry),
            Checked::Forward(name, qtype, entry) => {
                match self.ctx.upstream.cached_entry_for(&self.ctx.agent, &query) {
                    // The same filter, records and log as an answer fresh from the upstream; the final
                    // bytes are kept for the wire-level hit path when nothing was stripped.
                    Some(cached) => {
                        let CachedAnswer {
                            message,
                            stored,
                            age,
                            expires,
                        } = cached;
                        let (reply, entry, clean) = self.filtered(&query, message, &name, qtype, entry);
                        let bytes = self.finish_reply(&query, &reply, entry, transport);
                        if clean && let (Some(view), Some(bytes)) = (&view, &bytes) {
                            let times = (stored, age, expires);
                            self.keep_wire(view, packet, &reply, name, qtype, bytes.clone(), times);
                        }
                        return Progress::Done(bytes);
                    }
                    None => {
                        return Progress::Forward(Box::new(Pending {
                            query,
                            name,
                            qtype,
                            entry,
                            transport,
                        }));
                    }
                }
            }
        };
        Progress::Done(self.finish_reply(&query, &reply, entry, transport))
    }

    /// Forward a [`Pending`] query and reply to it.
    pub(super) async fn finish(&self, pending: Box<Pending>) -> Option<Vec<u8>> {
        let Pending {
            query,
            name,
            qtype,
            entry,
            transport,
        } = *pending;
        let (reply, entry) = self.forwarded(&query, &name, qtype, entry).await;
        self.finish_reply(&query, &reply, entry, transport)
    }

    /// Log the query with the reply's status and encode the reply.
    fn finish_reply(
        &self,
        query: &Message,
        reply: &Message,
        mut entry: LogEntry,
        transport: Transport,
    ) -> Option<Vec<u8>> {
        entry.status = Some(u16::from(reply.response_code));
        self.ctx.log.record(entry);
        self.encode(reply, query, transport)
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

    /// Every check on a parsed query: its reply when it needs no upstream, else what to forward.
    fn decide(&self, query: &Message) -> Checked {
        let agent = &self.ctx.agent;
        let mut entry = LogEntry::new(agent, LogKind::Dns, Verdict::Allowed);
        entry.port = Some(53);
        if query.op_code != OpCode::Query {
            entry.deny(DenyReason::Malformed);
            return Checked::Reply(self.reply(query, ResponseCode::NotImp), entry);
        }
        let [question] = query.queries.as_slice() else {
            entry.deny(DenyReason::Malformed);
            return Checked::Reply(self.reply(query, ResponseCode::FormErr), entry);
        };
        entry.method = Some(question.query_type.to_string());
        let Some(name) = question_name(&question.name) else {
            entry.host = Some(question.name.to_ascii().chars().take(MAX_LOGGED_NAME).collect());
            entry.deny(DenyReason::InvalidName);
            return Checked::Reply(self.reply(query, ResponseCode::NXDomain), entry);
        };
        let verdict = self.ctx.policy.may_resolve(agent, &name);
        let mut entry = LogEntry::new(agent, LogKind::Dns, verdict).to(name.clone(), 53);
        entry.method = Some(question.query_type.to_string());
        if !verdict.is_allowed() {
            // E9: an unlisted name is answered here; the upstream never sees it.
            return Checked::Reply(self.reply(query, ResponseCode::NXDomain), entry);
        }
        if question.query_class != DNSClass::IN
            || matches!(
                question.query_type,
                RecordType::AXFR | RecordType::IXFR | RecordType::OPT
            )
        {
            entry.deny(DenyReason::Malformed);
            return Checked::Reply(self.reply(query, ResponseCode::Refused), entry);
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
            return Checked::Reply(reply, entry);
        }
        if let Some(refusal) = special::refusal(&name, &self.ctx.guard) {
            // Whatever the policy allowed: these names only mean something on a local network.
            entry.deny(match refusal {
                Refusal::SingleLabel | Refusal::LocalSuffix(_) => DenyReason::LocalName,
                Refusal::PrivateReverse(_) => DenyReason::PrivateReverse,
            });
            tracing::debug!(agent = %agent, ?refusal, "local-only DNS name refused");
            self.ctx.budget.record(agent, Event::RefusedLocal);
            return Checked::Reply(self.reply(query, ResponseCode::NXDomain), entry);
        }
        self.ctx.budget.record(agent, Event::Forwarded);
        Checked::Forward(name, question.query_type, entry)
    }

    /// The reply to an allowed query: the upstream's (or the agent's cached) answer, filtered.
    async fn forwarded(
        &self,
        query: &Message,
        name: &str,
        qtype: RecordType,
        mut entry: LogEntry,
    ) -> (Message, LogEntry) {
        let agent = &self.ctx.agent;
        match self.ctx.upstream.forward_for(agent, query).await {
            Ok(upstream) => {
                let (reply, entry, _) = self.filtered(query, upstream, name, qtype, entry);
                (reply, entry)
            }
            Err(e) => {
                tracing::warn!(agent = %agent, name = %name, error = %e, "DNS upstream failed");
                entry.set_reason(Reason::DnsUpstream(DnsFailure::from(&e)));
                (self.reply(query, ResponseCode::ServFail), entry)
            }
        }
    }

    /// The client's reply built from the upstream's answer, minus AAAA records and blocked addresses; and
    /// whether no address was blocked.
    fn filtered(
        &self,
        query: &Message,
        upstream: Message,
        name: &str,
        qtype: RecordType,
        mut entry: LogEntry,
    ) -> (Message, LogEntry, bool) {
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
        let clean = stripped.blocked.is_empty();
        (reply, entry, clean)
    }

    /// A stored reply for `view`'s query that every check of the full path would still let through
    /// unchanged (see `wire.rs` for the list), with the forward cache's clock now; else `None`, and the
    /// full path answers. Takes nothing (no budget, no log): the full path may still run after it.
    fn wire_hit(
        &self,
        packet: &[u8],
        view: &QueryView,
        transport: Transport,
    ) -> Option<(Arc<WireEntry>, Verdict, Instant)> {
        let entry = self.wire.get(view, packet)?;
        let now = self.ctx.upstream.now();
        if entry.expires <= now {
            self.wire.remove(view, packet);
            return None;
        }
        let limit = match transport {
            Transport::Udp => usize::from(
                view.edns_payload
                    .unwrap_or(512)
                    .min(self.limits.udp_payload)
                    .max(512),
            ),
            Transport::Tcp => usize::from(u16::MAX),
        };
        if entry.len() > limit {
            return None;
        }
        // E9: the policy is asked on every query, so a change applies to the next one.
        let verdict = self.ctx.policy.may_resolve(&self.ctx.agent, &entry.name);
        if !verdict.is_allowed() {
            return None;
        }
        let guard = &self.ctx.guard;
        // enforces: E6, E22
        // The guard's own-address list changes at run time: every stored address is checked again.
        if self.ctx.synthetic.get(&entry.name).is_some()
            || special::refusal(&entry.name, guard).is_some()
            || entry
                .addresses
                .iter()
                .any(|a| guard.check(IpAddr::V4(*a)).is_err())
        {
            self.wire.remove(view, packet);
            return None;
        }
        Some((entry, verdict, now))
    }

    /// Answer a query from a stored reply that passed [`Server::wire_hit`]: the budget, the `forwarded`
    /// count, the name records and the log entry as on the full path, then the stored bytes with the
    /// query's id and the TTLs lowered by the age.
    fn serve_hit(
        &self,
        packet: &[u8],
        view: &QueryView,
        entry: &WireEntry,
        verdict: Verdict,
        now: Instant,
        transport: Transport,
    ) -> Option<Vec<u8>> {
        let agent = &self.ctx.agent;
        if let Admission::Refused { scope, log } = self.ctx.budget.admit(agent, Instant::now()) {
            let query = Message::from_vec(packet)
                .ok()
                .filter(|q| q.message_type == MessageType::Query);
            return self.over_budget(query, scope, log, transport);
        }
        self.ctx.budget.record(agent, Event::Forwarded);
        let extra = entry.extra_age(now);
        for (addr, ttl) in &entry.a_records {
            let ttl = Duration::from_secs(u64::from(ttl.saturating_sub(extra)));
            self.ctx
                .records
                .remember(agent, &entry.name, IpAddr::V4(*addr), ttl);
        }
        let mut log = LogEntry::new(agent, LogKind::Dns, verdict).to(entry.name.clone(), 53);
        log.method = Some(entry.method.clone());
        log.status = Some(entry.status);
        self.ctx.log.record(log);
        Some(entry.reply(view.id, extra))
    }

    /// Keep `bytes`, the reply to `view`'s query built from a cached answer without stripping an address,
    /// for the wire-level hit path until the cache entry expires.
    #[allow(clippy::too_many_arguments)]
    fn keep_wire(
        &self,
        view: &QueryView,
        packet: &[u8],
        reply: &Message,
        name: String,
        qtype: RecordType,
        bytes: Vec<u8>,
        (stored, age, expires): (Instant, u32, Instant),
    ) {
        let now = self.ctx.upstream.now();
        if expires <= now {
            return;
        }
        let a_records = reply
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some((a.0, r.ttl)),
                _ => None,
            })
            .collect();
        let mut addresses = Vec::new();
        for record in reply
            .answers
            .iter()
            .chain(&reply.authorities)
            .chain(&reply.additionals)
        {
            let svcb = match &record.data {
                RData::A(a) => {
                    addresses.push(a.0);
                    continue;
                }
                RData::SVCB(svcb) => svcb,
                RData::HTTPS(https) => &https.0,
                _ => continue,
            };
            for (_, value) in &svcb.svc_params {
                if let SvcParamValue::Ipv4Hint(hints) = value {
                    addresses.extend(hints.0.iter().map(|a| a.0));
                }
            }
        }
        let status = u16::from(reply.response_code);
        let method = qtype.to_string();
        if let Some(entry) = WireEntry::new(
            name, method, status, bytes, a_records, addresses, stored, age, expires,
        ) {
            self.wire.insert(view, packet, entry, now);
        }
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
