//! The check of the `dns_query_view` fuzz target, in one file that only uses `agenthold_egress` and `std`:
//! `fuzz/fuzz_targets/dns_query_view.rs` includes it by path, and `tests/dns` runs it over every one-byte
//! change of a few queries under plain `cargo test`.
//!
//! The minimal parser of the resolver's wire-level hit path ([`QueryView::parse`]) must accept only what
//! hickory's parser (the full path) reads the same way: whatever the bytes, no panic, and when it accepts a
//! packet, hickory reads it as a query (opcode QUERY) with one question, no other records than an OPT, and
//! the same id, RD, CD, name (label by label, case included), type, class, EDNS presence and size limit.

use agenthold_egress::dns::QueryView;
use agenthold_egress::dns::proto::op::{Message, MessageType, OpCode};

/// The labels of an uncompressed wire name.
fn labels(mut name: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some((&len, rest)) = name.split_first() {
        if len == 0 {
            break;
        }
        let len = usize::from(len);
        out.push(rest.get(..len).expect("label within the name").to_vec());
        name = &rest[len..];
    }
    out
}

/// Run the check on one input.
pub(crate) fn check(data: &[u8]) {
    let Some(view) = QueryView::parse(data) else {
        return;
    };
    let m = Message::from_vec(data).expect("hickory reads what the minimal parser accepts");
    assert_eq!(m.message_type, MessageType::Query);
    assert_eq!(m.op_code, OpCode::Query);
    assert_eq!(m.id, view.id);
    assert_eq!(m.recursion_desired, view.recursion_desired);
    assert_eq!(m.checking_disabled, view.checking_disabled);
    assert!(m.answers.is_empty() && m.authorities.is_empty() && m.additionals.is_empty());
    let [question] = m.queries.as_slice() else {
        panic!("one question expected, hickory read {}", m.queries.len());
    };
    assert_eq!(u16::from(question.query_type), view.qtype);
    assert_eq!(u16::from(question.query_class), view.qclass);
    let read: Vec<Vec<u8>> = question.name.iter().map(<[u8]>::to_vec).collect();
    assert_eq!(read, labels(view.name(data)));
    assert_eq!(view.question_end, 12 + view.name(data).len() + 4);
    assert_eq!(m.edns.is_some(), view.edns_payload.is_some());
    assert_eq!(
        m.max_payload().max(512),
        view.edns_payload.unwrap_or(512).max(512)
    );
}
