//! The wire-level hit path: a per-server cache of the *final* reply bytes to a query, served without
//! hickory's parser or encoder.
//!
//! **What is stored.** The encoded reply the full path (`answer.rs`) sent for a query answered from the
//! forward cache ([`Forward::cached_entry_for`](super::Forward::cached_entry_for)): after the policy check,
//! the rebinding filter (E6, E22) and the name records. Only replies from which the filter removed no
//! address (a reply that lost one carries a different log reason), that were not truncated, and whose query
//! the minimal parser below accepts.
//!
//! **Key.** The exact question bytes (name *with its case*, type, class) and the client flags the reply
//! depends on: RD, CD, whether an OPT record was sent. A query with other letter case is another entry, so
//! the question comes back as the client wrote it and compression pointers in the stored bytes stay valid.
//! One cache per [`Server`](super::Server), i.e. per agent: agent B's server never holds agent A's bytes.
//!
//! **What still runs on every hit** (in `answer.rs`, `Server::wire_hit` and `Server::serve_hit`), so a hit
//! differs from the full path only in cost:
//! - before anything is taken: the entry's freshness (the forward cache entry's expiry, in the forward
//!   cache's clock), the reply fitting this query's size limit (EDNS payload, transport), the policy
//!   ([`EgressPolicy::may_resolve`](agenthold_core::policy::EgressPolicy), asked on every query: a policy
//!   change applies to the next one), the synthetic names, the local-name refusals, and the address guard
//!   on every address the reply carries (the guard's own-address list changes at run time). Any of these
//!   failing → the full path, which then answers (NXDOMAIN, a stripped answer, …) and logs as always;
//! - the DNS budgets (admission, and the `forwarded` count), with the full path's REFUSED when over budget;
//! - the name records of every A record in the answer section, with its TTL as served (E4: the transparent
//!   proxy decides plain TCP by the resolved name);
//! - the log entry (decision and reason from the policy's verdict, name, type, status);
//! - the reply: the stored bytes with the client's id and every TTL lowered by the age, exactly as the
//!   forward cache lowers them.
//!
//! **Bounds.** [`WIRE_ENTRIES`] entries and [`WIRE_BYTES`] bytes per server; when full, expired entries go,
//! then everything.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::upstream::lock;

/// Entries per server (per agent) at most.
pub(crate) const WIRE_ENTRIES: usize = 1024;
/// Bytes of stored replies per server at most.
pub(crate) const WIRE_BYTES: usize = 256 * 1024;
/// Length of a DNS header.
const HEADER_LEN: usize = 12;
/// Longest key: flags, type, class and a name of at most 255 bytes.
const MAX_KEY: usize = 5 + 255;
/// RR type of an OPT pseudo-record.
const OPT: u16 = 41;

/// The few facts of a query packet the hit path needs, read by a minimal parser that accepts only the plain
/// shape of a query: QR clear, opcode QUERY, exactly one question whose name has no compression pointer, no
/// answer or authority records, at most one additional record which must be an OPT record on the root name
/// with EDNS version 0, no extended rcode and no options, and nothing after it. Anything else is `None`
/// (the full path, with hickory's parser, answers it: FORMERR, NOTIMP, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryView {
    /// The query's id.
    pub id: u16,
    /// RD.
    pub recursion_desired: bool,
    /// CD.
    pub checking_disabled: bool,
    /// The OPT record's payload size, if it has one.
    pub edns_payload: Option<u16>,
    /// The question's type.
    pub qtype: u16,
    /// The question's class.
    pub qclass: u16,
    /// End of the question (type and class included): the question is `packet[12..question_end]`.
    pub question_end: usize,
    /// End of the question's name.
    name_end: usize,
}

impl QueryView {
    /// Read `packet`, or `None` unless it has exactly the plain shape above.
    #[must_use]
    pub fn parse(packet: &[u8]) -> Option<Self> {
        let header = packet.get(..HEADER_LEN)?;
        let flags = u16::from_be_bytes([header[2], header[3]]);
        let count = |i: usize| u16::from_be_bytes([header[i], header[i + 1]]);
        // QR clear, opcode 0.
        if flags & 0xf800 != 0 || count(4) != 1 || count(6) != 0 || count(8) != 0 || count(10) > 1 {
            return None;
        }
        let mut pos = HEADER_LEN;
        loop {
            let len = usize::from(*packet.get(pos)?);
            if len == 0 {
                pos += 1;
                break;
            }
            // A pointer (0xc0) or a reserved label type (0x40, 0x80): not the plain shape.
            if len > 63 {
                return None;
            }
            pos += 1 + len;
            if pos - HEADER_LEN > 255 {
                return None;
            }
        }
        if pos - HEADER_LEN > 255 {
            return None;
        }
        let name_end = pos;
        let fixed = packet.get(pos..pos + 4)?;
        let qtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let qclass = u16::from_be_bytes([fixed[2], fixed[3]]);
        pos += 4;
        let question_end = pos;
        let mut edns_payload = None;
        if count(10) == 1 {
            // Root name, type OPT, payload, extended rcode 0, version 0, flags (DO) any, no options.
            let opt = packet.get(pos..pos + 11)?;
            if opt[0] != 0 || u16::from_be_bytes([opt[1], opt[2]]) != OPT || opt[5] != 0 || opt[6] != 0 {
                return None;
            }
            if u16::from_be_bytes([opt[9], opt[10]]) != 0 {
                return None;
            }
            edns_payload = Some(u16::from_be_bytes([opt[3], opt[4]]));
            pos += 11;
        }
        if pos != packet.len() {
            return None;
        }
        Some(Self {
            id: u16::from_be_bytes([header[0], header[1]]),
            recursion_desired: flags & 0x0100 != 0,
            checking_disabled: flags & 0x0010 != 0,
            edns_payload,
            qtype,
            qclass,
            question_end,
            name_end,
        })
    }

    /// The question's name on the wire (uncompressed labels, root label included).
    #[must_use]
    pub fn name<'a>(&self, packet: &'a [u8]) -> &'a [u8] {
        packet.get(HEADER_LEN..self.name_end).unwrap_or_default()
    }

    /// The cache key of this query (see the module docs) written into `buf`; its length.
    fn key(&self, packet: &[u8], buf: &mut [u8; MAX_KEY]) -> usize {
        let flags = u8::from(self.recursion_desired)
            | (u8::from(self.checking_disabled) << 1)
            | (u8::from(self.edns_payload.is_some()) << 2);
        let name = self.name(packet);
        let len = 5 + name.len();
        if let Some(out) = buf.get_mut(..len) {
            out[0] = flags;
            out[1..3].copy_from_slice(&self.qtype.to_be_bytes());
            out[3..5].copy_from_slice(&self.qclass.to_be_bytes());
            out[5..].copy_from_slice(name);
            len
        } else {
            0
        }
    }
}

/// A stored reply.
#[derive(Debug)]
pub(crate) struct WireEntry {
    /// The normalised question name (for the policy, the records and the log).
    pub(crate) name: String,
    /// The question type as logged.
    pub(crate) method: String,
    /// The reply's response code as logged.
    pub(crate) status: u16,
    /// The reply as sent when stored.
    bytes: Vec<u8>,
    /// Offset of every record's TTL (OPT excluded) and its value in `bytes`.
    ttls: Vec<(usize, u32)>,
    /// The answer section's A records and their TTLs as stored (remembered in the name records on a hit).
    pub(crate) a_records: Vec<(Ipv4Addr, u32)>,
    /// Every address in the reply (A records of all sections, SVCB/HTTPS IPv4 hints): re-checked against
    /// the guard on every hit.
    pub(crate) addresses: Vec<Ipv4Addr>,
    /// The forward cache entry's store time, the age (whole seconds) its TTLs were lowered by in `bytes`,
    /// and its expiry, in the forward cache's clock.
    stored: Instant,
    age: u32,
    pub(crate) expires: Instant,
}

impl WireEntry {
    /// An entry for `bytes`, the untruncated reply, or `None` if its records cannot be walked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: String,
        method: String,
        status: u16,
        bytes: Vec<u8>,
        a_records: Vec<(Ipv4Addr, u32)>,
        addresses: Vec<Ipv4Addr>,
        stored: Instant,
        age: u32,
        expires: Instant,
    ) -> Option<Self> {
        let header = bytes.get(..HEADER_LEN)?;
        // Never store a truncated reply.
        if header[2] & 0x02 != 0 {
            return None;
        }
        let ttls = ttl_offsets(&bytes)?;
        Some(Self {
            name,
            method,
            status,
            bytes,
            ttls,
            a_records,
            addresses,
            stored,
            age,
            expires,
        })
    }

    /// Seconds to take off the stored TTLs at `now`: the forward cache's age now minus the age already
    /// taken off (a TTL already at zero stays zero, as in the forward cache).
    pub(crate) fn extra_age(&self, now: Instant) -> u32 {
        let age = u32::try_from(now.saturating_duration_since(self.stored).as_secs()).unwrap_or(u32::MAX);
        age.saturating_sub(self.age)
    }

    /// The reply's length on the wire.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// The reply to a query with `id` at `extra` seconds past the stored age.
    pub(crate) fn reply(&self, id: u16, extra: u32) -> Vec<u8> {
        let mut out = self.bytes.clone();
        if let Some(head) = out.get_mut(..2) {
            head.copy_from_slice(&id.to_be_bytes());
        }
        if extra > 0 {
            for (offset, ttl) in &self.ttls {
                if let Some(field) = out.get_mut(*offset..*offset + 4) {
                    field.copy_from_slice(&ttl.saturating_sub(extra).to_be_bytes());
                }
            }
        }
        out
    }
}

/// Offsets and values of the TTL of every record of `bytes` (a whole DNS message) except OPT, or `None`
/// if the records do not end exactly at the end of the message.
fn ttl_offsets(bytes: &[u8]) -> Option<Vec<(usize, u32)>> {
    let header = bytes.get(..HEADER_LEN)?;
    let count = |i: usize| usize::from(u16::from_be_bytes([header[i], header[i + 1]]));
    let skip_name = |mut pos: usize| -> Option<usize> {
        loop {
            let len = *bytes.get(pos)?;
            match len {
                0 => return Some(pos + 1),
                l if l & 0xc0 == 0xc0 => return Some(pos + 2),
                l if l > 63 => return None,
                l => pos += 1 + usize::from(l),
            }
        }
    };
    let mut pos = HEADER_LEN;
    for _ in 0..count(4) {
        pos = skip_name(pos)? + 4;
    }
    let records = count(6) + count(8) + count(10);
    let mut ttls = Vec::with_capacity(records);
    for _ in 0..records {
        pos = skip_name(pos)?;
        let fixed = bytes.get(pos..pos + 10)?;
        let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let ttl = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
        let rdlen = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        if rtype != OPT {
            ttls.push((pos + 4, ttl));
        }
        pos += 10 + rdlen;
    }
    (pos == bytes.len()).then_some(ttls)
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<Box<[u8]>, Arc<WireEntry>>,
    bytes: usize,
}

/// One server's stored replies (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct WireCache {
    inner: Mutex<Inner>,
}

impl WireCache {
    /// The entry for `view`'s query, if any (fresh or not: the caller checks).
    pub(crate) fn get(&self, view: &QueryView, packet: &[u8]) -> Option<Arc<WireEntry>> {
        let mut buf = [0u8; MAX_KEY];
        let len = view.key(packet, &mut buf);
        let key = buf.get(..len).filter(|k| !k.is_empty())?;
        lock(&self.inner).map.get(key).cloned()
    }

    /// Store `entry` for `view`'s query; entries expired at `now` make room first, then everything goes.
    pub(crate) fn insert(&self, view: &QueryView, packet: &[u8], entry: WireEntry, now: Instant) {
        let mut buf = [0u8; MAX_KEY];
        let len = view.key(packet, &mut buf);
        let Some(key) = buf.get(..len).filter(|k| !k.is_empty()) else {
            return;
        };
        let size = entry.len() + key.len();
        if size > WIRE_BYTES {
            return;
        }
        let mut inner = lock(&self.inner);
        if let Some(old) = inner.map.remove(key) {
            inner.bytes -= old.len() + key.len();
        }
        if inner.map.len() >= WIRE_ENTRIES || inner.bytes + size > WIRE_BYTES {
            let Inner { map, bytes } = &mut *inner;
            map.retain(|k, e| {
                let keep = e.expires > now;
                if !keep {
                    *bytes -= e.len() + k.len();
                }
                keep
            });
        }
        if inner.map.len() >= WIRE_ENTRIES || inner.bytes + size > WIRE_BYTES {
            inner.map.clear();
            inner.bytes = 0;
        }
        inner.bytes += size;
        inner.map.insert(key.into(), Arc::new(entry));
    }

    /// Forget `view`'s entry (it failed a check that only the full path handles).
    pub(crate) fn remove(&self, view: &QueryView, packet: &[u8]) {
        let mut buf = [0u8; MAX_KEY];
        let len = view.key(packet, &mut buf);
        let Some(key) = buf.get(..len) else {
            return;
        };
        let mut inner = lock(&self.inner);
        if let Some(old) = inner.map.remove(key) {
            inner.bytes -= old.len() + key.len();
        }
    }

    /// Entries held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).map.len()
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
