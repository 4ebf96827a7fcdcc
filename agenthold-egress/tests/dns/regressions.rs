//! Replays the `dns_message` fuzz target's seeds and committed regression inputs through its check, and
//! runs the `dns_query_view` check over every one-byte change of a few queries.

use std::path::Path;

use agenthold_egress::dns::proto::op::{Edns, Message, Query};
use agenthold_egress::dns::proto::rr::{Name, RecordType};

use super::{fuzz_check, query_view_check};

/// Run every file of `fuzz/<folder>/dns_message` through the check; the number of files.
fn replay(folder: &str) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(folder)
        .join("dns_message");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut count = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_file() {
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| fuzz_check::check(&data));
            assert!(outcome.is_ok(), "fuzz input {} fails the check", path.display());
            count += 1;
        }
    }
    count
}

#[test]
fn fuzz_seeds_pass_the_check() {
    assert!(replay("seeds") >= 5, "the dns_message seeds are missing");
}

#[test]
fn fuzz_regressions_pass_the_check() {
    replay("regressions");
}

#[test]
fn every_one_byte_change_of_a_query_passes_the_query_view_check() {
    let mut accepted = 0;
    for (name, edns) in [("web.test.", false), ("WeB.example.", true), (".", true)] {
        let mut q = Message::query();
        q.metadata.id = 0x2a2a;
        q.metadata.recursion_desired = true;
        q.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        if edns {
            q.edns = Some(Edns::new());
        }
        let packet = q.to_vec().unwrap();
        for at in 0..packet.len() {
            for value in 0..=255u8 {
                let mut p = packet.clone();
                p[at] = value;
                query_view_check::check(&p);
                accepted += usize::from(agenthold_egress::dns::QueryView::parse(&p).is_some());
            }
            query_view_check::check(&packet[..at]);
        }
    }
    // Most changes (the id, letters, sizes) leave a plain query.
    assert!(accepted > 1000, "{accepted}");
}
