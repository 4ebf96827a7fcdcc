//! The request log's rings, limits, numbering and JSON lines.

use super::*;

#[test]
fn keeps_the_newest_entries_per_agent() {
    let log = RequestLog::new(3);
    let a = AgentId::new("a").unwrap();
    let b = AgentId::new("b").unwrap();
    for port in 1..=5 {
        log.record(LogEntry::new(&a, LogKind::Tcp, Verdict::Allowed).to("x", port));
    }
    log.record(LogEntry::new(&b, LogKind::Dns, Verdict::Allowed));
    let ports: Vec<_> = log.snapshot(&a).iter().map(|e| e.port.unwrap()).collect();
    assert_eq!(ports, [3, 4, 5]);
    assert_eq!(log.snapshot(&b).len(), 1);
}

#[test]
fn json_line_has_the_contract_fields() {
    let a = AgentId::new("a").unwrap();
    let e = LogEntry::new(&a, LogKind::Tls, Verdict::Denied(DenyReason::NotInAllowlist)).to("x.com", 443);
    let v: serde_json::Value = serde_json::from_str(&e.to_json_line()).unwrap();
    for k in [
        "time",
        "agent",
        "kind",
        "host",
        "port",
        "method",
        "path",
        "status",
        "decision",
        "reason",
        "secret_injected",
        "bytes_up",
        "bytes_down",
        "seq",
    ] {
        assert!(v.get(k).is_some(), "{k}");
    }
    assert_eq!(v["decision"], "denied");
    assert_eq!(v["reason"], "not_in_allowlist");
    assert_eq!(v["kind"], "tls");
    assert!(v["time"].as_str().unwrap().ends_with('Z'));
}

// covers: E16, E20 (fields cut, ring bounded in bytes, evictions counted)
#[test]
fn entries_are_cut_and_the_ring_is_bounded_in_bytes() {
    let log = RequestLog::with_limits(5000, 64 * 1024);
    let a = AgentId::new("a").unwrap();
    for i in 0..2000 {
        let mut e = LogEntry::new(&a, LogKind::Http, Verdict::Denied(DenyReason::NotInAllowlist));
        e.method = Some("M".repeat(70_000));
        e.path = Some(format!("/{i}/{}", "é".repeat(40_000)));
        e.host = Some("h".repeat(70_000));
        log.record(e);
    }
    let kept = log.snapshot(&a);
    let last = kept.last().unwrap();
    assert!(last.path.as_ref().unwrap().len() <= MAX_PATH);
    assert!(last.path.as_ref().unwrap().ends_with('…'));
    assert!(last.path.as_ref().unwrap().starts_with("/1999/"));
    assert_eq!(
        last.method.as_ref().unwrap().len(),
        MAX_METHOD - 3 + '…'.len_utf8()
    );
    assert!(last.host.as_ref().unwrap().len() <= MAX_HOST);
    assert!(log.bytes(&a) <= 64 * 1024, "{}", log.bytes(&a));
    assert_eq!(kept.len() as u64 + log.dropped(&a), 2000);
    assert!(log.dropped(&a) > 1900);
}

#[tokio::test]
async fn live_stream_sees_new_entries() {
    let log = RequestLog::new(10);
    let mut rx = log.subscribe();
    let a = AgentId::new("a").unwrap();
    log.record(LogEntry::new(&a, LogKind::Http, Verdict::Allowed));
    assert_eq!(rx.recv().await.unwrap().kind, LogKind::Http);
}

// covers: E16 (one counter numbers every agent's entries: distinct, increasing, from 1)
#[test]
fn seq_is_monotonic_across_agents() {
    let log = RequestLog::new(100);
    let a = AgentId::new("a").unwrap();
    let b = AgentId::new("b").unwrap();
    let unrecorded = LogEntry::new(&a, LogKind::Dns, Verdict::Allowed);
    assert_eq!(unrecorded.seq, 0);
    for i in 0..10 {
        let agent = if i % 3 == 0 { &b } else { &a };
        log.record(LogEntry::new(agent, LogKind::Dns, Verdict::Allowed));
    }
    let seqs = |agent: &AgentId| log.snapshot(agent).iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(&b), [1, 4, 7, 10]);
    assert_eq!(seqs(&a), [2, 3, 5, 6, 8, 9]);
    // Threads recording at once still get distinct numbers, increasing along each ring.
    std::thread::scope(|s| {
        for agent in [&a, &b, &a, &b] {
            s.spawn(|| {
                for _ in 0..20 {
                    log.record(LogEntry::new(agent, LogKind::Tcp, Verdict::Allowed));
                }
            });
        }
    });
    let mut all: Vec<u64> = seqs(&a).into_iter().chain(seqs(&b)).collect();
    for agent in [&a, &b] {
        assert!(seqs(agent).windows(2).all(|w| w[0] < w[1]), "{:?}", seqs(agent));
    }
    all.sort_unstable();
    assert_eq!(all, (1..=90).collect::<Vec<_>>());
    let line: serde_json::Value = serde_json::from_str(&log.snapshot(&a)[0].to_json_line()).unwrap();
    assert_eq!(line["seq"], 2);
}

// covers: E16 (a reader resumes after the last seq it saw; what the ring evicted is gone, the rest comes)
#[test]
fn since_returns_what_is_still_held_after_a_seq() {
    let log = RequestLog::new(3);
    let a = AgentId::new("a").unwrap();
    let b = AgentId::new("b").unwrap();
    for port in 1..=4 {
        log.record(LogEntry::new(&a, LogKind::Tcp, Verdict::Allowed).to("x", port));
        log.record(LogEntry::new(&b, LogKind::Tcp, Verdict::Allowed).to("y", port));
    }
    // a holds its last three (seq 3, 5, 7); seq 1 fell out of the ring.
    let seqs = |after: u64| log.since(&a, after).iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(0), [3, 5, 7]);
    assert_eq!(
        seqs(1),
        [3, 5, 7],
        "after an evicted entry: everything still held"
    );
    assert_eq!(seqs(3), [5, 7]);
    assert_eq!(seqs(4), [5, 7], "after another agent's seq");
    assert_eq!(seqs(7), Vec::<u64>::new());
    assert_eq!(seqs(u64::MAX), Vec::<u64>::new());
    assert_eq!(log.dropped(&a), 1);
    assert_eq!(log.since(&a, 4)[0].port, Some(3));
    assert!(log.since(&AgentId::new("c").unwrap(), 0).is_empty());
    // Oldest first, and the same entries the snapshot has.
    assert_eq!(log.since(&b, 0), log.snapshot(&b));
}

#[tokio::test]
async fn the_live_stream_carries_the_seq() {
    let log = RequestLog::new(10);
    let a = AgentId::new("a").unwrap();
    log.record(LogEntry::new(&a, LogKind::Dns, Verdict::Allowed));
    let mut rx = log.subscribe();
    log.record(LogEntry::new(&a, LogKind::Http, Verdict::Allowed));
    let live = rx.recv().await.unwrap();
    assert_eq!(live.seq, 2);
    assert_eq!(log.since(&a, 1), [LogEntry::clone(&live)]);
}

#[test]
fn timestamps_match_the_full_formatter_across_seconds() {
    use std::time::{Duration, UNIX_EPOCH};
    // The per-second cache must never hand out the text of another second, nor lose the milliseconds.
    for ms in [
        0u64,
        1,
        999,
        1000,
        1_764_633_600_000,
        1_764_633_600_001,
        1_764_633_599_999,
        1_764_633_600_999,
        1_764_633_601_000,
        4_102_444_800_123,
    ] {
        let at = UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(rfc3339_at(at), format_slow(at), "{ms}");
    }
    assert_eq!(
        rfc3339_at(UNIX_EPOCH + Duration::from_millis(1_764_633_600_042)),
        "2025-12-02T00:00:00.042Z"
    );
    assert!(now_rfc3339().ends_with('Z'));
}

#[test]
fn a_pending_entry_is_recorded_whole_when_dropped() {
    let log = std::sync::Arc::new(RequestLog::new(10));
    let a = AgentId::new("a").unwrap();
    let mut entry = LogEntry::new(&a, LogKind::Http, Verdict::Allowed).to("x.test", 80);
    entry.method = Some("GET".into());
    entry.path = Some("/p".into());
    entry.status = Some(204);
    let time = entry.time.clone();
    let pending = PendingEntry::new(&log, entry);
    pending
        .counters
        .up
        .fetch_add(3, std::sync::atomic::Ordering::Relaxed);
    drop(pending);
    let kept = log.snapshot(&a);
    assert_eq!(kept.len(), 1);
    let e = &kept[0];
    assert_eq!(
        (
            e.host.as_deref(),
            e.method.as_deref(),
            e.path.as_deref(),
            e.status
        ),
        (Some("x.test"), Some("GET"), Some("/p"), Some(204))
    );
    assert_eq!((e.bytes_up, e.bytes_down, e.time.as_str()), (3, 0, time.as_str()));
}
