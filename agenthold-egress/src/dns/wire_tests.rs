//! The minimal query parser and the record walk of the wire-level hit path, on real wire format (hickory
//! builds the packets). Whatever the parser refuses goes to the full path; the server-level tests (that a
//! refused packet gets exactly the full path's answer) are in `forward_cache_tests.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::{A, CNAME};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use super::{QueryView, WireCache, WireEntry, ttl_offsets};

fn query(name: &str, rtype: RecordType, edns: bool) -> Message {
    let mut q = Message::query();
    q.metadata.id = 0x1234;
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        q.edns = Some(e);
    }
    q
}

/// The labels of an uncompressed wire name.
fn labels(mut name: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some((&len, rest)) = name.split_first() {
        if len == 0 {
            break;
        }
        out.push(rest[..usize::from(len)].to_vec());
        name = &rest[usize::from(len)..];
    }
    out
}

fn bytes(name: &str, edns: bool) -> Vec<u8> {
    query(name, RecordType::A, edns).to_vec().unwrap()
}

#[test]
fn a_plain_query_is_read_as_hickory_reads_it() {
    for edns in [false, true] {
        for name in ["web.test.", "WeB.TeSt.", "a.b.c.d.e.example.org.", "."] {
            let packet = bytes(name, edns);
            let view = QueryView::parse(&packet).unwrap();
            let parsed = Message::from_vec(&packet).unwrap();
            assert_eq!(view.id, parsed.id);
            assert_eq!(view.recursion_desired, parsed.recursion_desired);
            assert_eq!(view.checking_disabled, parsed.checking_disabled);
            assert_eq!(view.qtype, u16::from(parsed.queries[0].query_type));
            assert_eq!(view.qclass, u16::from(parsed.queries[0].query_class));
            assert_eq!(view.edns_payload, parsed.edns.as_ref().map(Edns::max_payload));
            // The name's bytes as sent, case included.
            let sent: Vec<Vec<u8>> = Name::from_ascii(name)
                .unwrap()
                .iter()
                .map(<[u8]>::to_vec)
                .collect();
            assert_eq!(labels(view.name(&packet)), sent);
        }
    }
    let mut cd = query("web.test.", RecordType::TXT, false);
    cd.metadata.checking_disabled = true;
    cd.metadata.recursion_desired = false;
    let view = QueryView::parse(&cd.to_vec().unwrap()).unwrap();
    assert!(view.checking_disabled && !view.recursion_desired);
    assert_eq!(view.qtype, u16::from(RecordType::TXT));
}

#[test]
fn every_truncation_of_a_query_is_refused() {
    for edns in [false, true] {
        let packet = bytes("web.test.", edns);
        for len in 0..packet.len() {
            assert_eq!(
                QueryView::parse(&packet[..len]),
                None,
                "{len} of {}",
                packet.len()
            );
        }
        // And a byte too many.
        let mut longer = packet.clone();
        longer.push(0);
        assert_eq!(QueryView::parse(&longer), None);
    }
}

#[test]
fn unusual_headers_are_refused() {
    let packet = bytes("web.test.", false);
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut p = packet.clone();
        f(&mut p);
        QueryView::parse(&p)
    };
    // A response, another opcode.
    assert_eq!(with(&|p| p[2] |= 0x80), None);
    assert_eq!(with(&|p| p[2] |= 2 << 3), None);
    // QDCOUNT 0, 2; an answer or authority record announced; two additional records.
    assert_eq!(with(&|p| p[5] = 0), None);
    assert_eq!(with(&|p| p[5] = 2), None);
    assert_eq!(with(&|p| p[7] = 1), None);
    assert_eq!(with(&|p| p[9] = 1), None);
    assert_eq!(with(&|p| p[11] = 2), None);
    // An additional record announced but absent.
    assert_eq!(with(&|p| p[11] = 1), None);
}

#[test]
fn two_questions_are_refused() {
    let mut q = query("web.test.", RecordType::A, false);
    q.add_query(Query::query(
        Name::from_ascii("other.test.").unwrap(),
        RecordType::A,
    ));
    assert_eq!(QueryView::parse(&q.to_vec().unwrap()), None);
    let mut none = query("web.test.", RecordType::A, false);
    none.queries.clear();
    assert_eq!(QueryView::parse(&none.to_vec().unwrap()), None);
}

#[test]
fn names_with_pointers_huge_labels_or_too_long_are_refused() {
    let header = |qd: u8| vec![0x12, 0x34, 0x01, 0x00, 0, qd, 0, 0, 0, 0, 0, 0];
    let tail = [0, 1, 0, 1];
    // A compression pointer in the question (to the header: nonsense, but well-formed as a pointer).
    let mut p = header(1);
    p.extend_from_slice(&[3, b'w', b'e', b'b', 0xc0, 0x00]);
    p.extend_from_slice(&tail);
    assert_eq!(QueryView::parse(&p), None);
    // Reserved label types 0x40 and 0x80.
    for kind in [0x40u8, 0x80] {
        let mut p = header(1);
        p.extend_from_slice(&[kind | 3, b'w', b'e', b'b', 0]);
        p.extend_from_slice(&tail);
        assert_eq!(QueryView::parse(&p), None);
    }
    // A label length beyond the packet.
    let mut p = header(1);
    p.extend_from_slice(&[63, b'a', b'b']);
    assert_eq!(QueryView::parse(&p), None);
    // A name over 255 bytes (five labels of 63).
    let mut p = header(1);
    for _ in 0..5 {
        p.push(63);
        p.extend_from_slice(&[b'a'; 63]);
    }
    p.push(0);
    p.extend_from_slice(&tail);
    assert_eq!(QueryView::parse(&p), None);
    // 3 × 63 + one of 61 (255 bytes with lengths and root) passes, as hickory reads it.
    let mut p = header(1);
    for len in [63usize, 63, 63, 61] {
        p.push(u8::try_from(len).unwrap());
        p.extend(std::iter::repeat_n(b'a', len));
    }
    p.push(0);
    p.extend_from_slice(&tail);
    assert!(QueryView::parse(&p).is_some());
    assert!(Message::from_vec(&p).is_ok());
    // No name at all.
    assert_eq!(QueryView::parse(&header(1)), None);
}

#[test]
fn opt_records_other_than_the_plain_one_are_refused() {
    let packet = bytes("web.test.", true);
    let opt = packet.len() - 11;
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut p = packet.clone();
        f(&mut p);
        QueryView::parse(&p)
    };
    assert!(with(&|_| {}).is_some());
    // Not on the root name; not type OPT; an extended rcode; version 1; options present.
    assert_eq!(with(&|p| p[opt] = 1), None);
    assert_eq!(with(&|p| p[opt + 2] = 1), None);
    assert_eq!(with(&|p| p[opt + 5] = 1), None);
    assert_eq!(with(&|p| p[opt + 6] = 1), None);
    let mut cookie = packet.clone();
    cookie[opt + 10] = 12;
    cookie.extend_from_slice(&[0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(Message::from_vec(&cookie).is_ok());
    assert_eq!(QueryView::parse(&cookie), None);
    // The DO bit is fine (the reply does not depend on it).
    assert!(with(&|p| p[opt + 7] = 0x80).is_some());
}

#[test]
fn ttl_offsets_skip_opt_and_follow_compressed_names() {
    let mut m = Message::new(0x4242, MessageType::Response, OpCode::Query);
    let name = Name::from_ascii("web.test.").unwrap();
    m.add_query(Query::query(name.clone(), RecordType::A));
    let target = Name::from_ascii("cdn.web.test.").unwrap();
    m.add_answer(Record::from_rdata(name, 300, RData::CNAME(CNAME(target.clone()))));
    m.add_answer(Record::from_rdata(
        target.clone(),
        60,
        RData::A(A::new(1, 2, 3, 4)),
    ));
    m.add_additional(Record::from_rdata(target, 7, RData::A(A::new(1, 2, 3, 5))));
    m.edns = Some(Edns::new());
    let wire = m.to_vec().unwrap();
    let ttls = ttl_offsets(&wire).unwrap();
    assert_eq!(ttls.iter().map(|(_, t)| *t).collect::<Vec<_>>(), vec![300, 60, 7]);
    for (offset, ttl) in &ttls {
        assert_eq!(&wire[*offset..offset + 4], ttl.to_be_bytes());
    }
    // A message cut short or with extra bytes is not walked.
    assert_eq!(ttl_offsets(&wire[..wire.len() - 1]), None);
    let mut longer = wire.clone();
    longer.push(0);
    assert_eq!(ttl_offsets(&longer), None);

    // The served reply: the id patched, TTLs lowered by the extra age, the OPT record untouched.
    let now = Instant::now();
    let entry = WireEntry::new(
        "web.test".into(),
        "A".into(),
        0,
        wire.clone(),
        vec![],
        vec![],
        now,
        0,
        now,
    )
    .unwrap();
    let served = Message::from_vec(&entry.reply(0xbeef, 10)).unwrap();
    assert_eq!(served.id, 0xbeef);
    let ttls: Vec<u32> = served
        .answers
        .iter()
        .chain(&served.additionals)
        .map(|r| r.ttl)
        .collect();
    assert_eq!(ttls, vec![290, 50, 0]);
    assert!(served.edns.is_some());
    assert_eq!(&entry.reply(m.id, 0)[..], &wire[..]);
}

#[test]
fn truncated_replies_are_not_stored_and_the_cache_is_bounded() {
    let mut m = Message::new(1, MessageType::Response, OpCode::Query);
    m.metadata.truncation = true;
    let now = Instant::now();
    let entry = |bytes: Vec<u8>| {
        WireEntry::new(
            "x.test".into(),
            "A".into(),
            0,
            bytes,
            vec![],
            vec![],
            now,
            0,
            now + std::time::Duration::from_secs(60),
        )
    };
    assert!(entry(m.to_vec().unwrap()).is_none());
    let cache = WireCache::default();
    for i in 0..(super::WIRE_ENTRIES + 10) {
        let packet = bytes(&format!("n{i}.test."), false);
        let view = QueryView::parse(&packet).unwrap();
        let reply = Message::new(1, MessageType::Response, OpCode::Query);
        cache.insert(&view, &packet, entry(reply.to_vec().unwrap()).unwrap(), now);
        assert!(cache.len() <= super::WIRE_ENTRIES);
        assert!(cache.get(&view, &packet).is_some());
    }
}
