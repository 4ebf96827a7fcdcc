//! What the gateway's resolver refuses to forward whatever the policy (local-only names, reverse names of
//! blocked ranges: E9, E22), and its budgets (E20): one agent flooding DNS past its budget is refused
//! while another agent is still answered, and the flood is counted without flooding the request log.

use agenthold_egress::log::{Decision, LogKind};

use super::harness::{Harness, OWN_V4, Setup};

/// The reverse name of an IPv4 address.
fn ptr4(addr: &str) -> String {
    let mut octets: Vec<&str> = addr.split('.').collect();
    octets.reverse();
    format!("{}.in-addr.arpa", octets.join("."))
}

/// The reverse name of an IPv6 address.
fn ptr6(addr: &str) -> String {
    let bits = addr.parse::<std::net::Ipv6Addr>().unwrap().to_bits();
    let nibbles: Vec<String> = format!("{bits:032x}").chars().rev().map(String::from).collect();
    format!("{}.ip6.arpa", nibbles.join("."))
}

// covers: E9, E22
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn local_names_and_private_reverse_lookups_are_refused_under_the_open_policy() {
    // In the host namespace, so that the host's own (public-looking) address is one of the ranges.
    let h = Harness::start(
        Setup::new()
            .host_namespace()
            .record("public.test", &["93.184.216.34"]),
    )
    .await;
    let gw = h.gw(0).to_string();
    let local = [
        ("printer.local", "A"),
        ("metadata.google.internal", "A"),
        ("ip-10-0-0-5.ec2.internal", "A"),
        ("intranet", "A"),
        ("wpad", "A"),
        ("nas.home.arpa", "A"),
        ("router.lan", "AAAA"),
        ("db.localhost", "A"),
        ("x.corp", "TXT"),
    ];
    let reverse = [
        (ptr4("10.0.0.1"), "PTR"),
        (ptr4("169.254.169.254"), "PTR"),
        (ptr4("127.0.0.1"), "PTR"),
        (ptr4("192.168.1.1"), "PTR"),
        (ptr4("100.64.0.1"), "PTR"),
        (ptr4("168.63.129.16"), "PTR"),
        (ptr4(OWN_V4), "PTR"),
        ("10.in-addr.arpa".to_owned(), "SOA"),
        (ptr6("fd00::1"), "PTR"),
        (ptr6("fe80::1"), "PTR"),
        (ptr6("2001:4::1"), "PTR"),
        (ptr6("2a0e:1234:5678:9abc::99"), "PTR"),
    ];
    for (name, qtype) in local
        .iter()
        .map(|(n, t)| ((*n).to_owned(), *t))
        .chain(reverse.clone())
    {
        let answer = h.py(0, &["dns", &gw, &name, qtype, "udp"]).await;
        assert_eq!(
            answer["rcode"], 3,
            "{name} {qtype}: NXDOMAIN expected, got {answer}"
        );
        let entry = h
            .entries(0, LogKind::Dns, &name)
            .pop()
            .unwrap_or_else(|| panic!("{name} not logged"));
        let expected = if name.ends_with(".arpa") && !name.ends_with("home.arpa") {
            "private_reverse"
        } else {
            "local_name"
        };
        assert_eq!(
            (
                entry.decision,
                entry.reason.as_ref().map(ToString::to_string).as_deref()
            ),
            (Decision::Denied, Some(expected)),
            "{entry:?}"
        );
    }
    // Controls: a public reverse name and a public name are forwarded.
    let public_ptr = ptr4("8.8.8.8");
    h.py(0, &["dns", &gw, &public_ptr, "PTR", "udp"]).await;
    let answer = h.py(0, &["dns", &gw, "public.test", "A", "udp"]).await;
    assert_eq!(answer["addrs"][0], "93.184.216.34", "{answer}");
    let asked: Vec<String> = h.dns.queries().into_iter().map(|q| q.name).collect();
    assert_eq!(
        asked,
        [public_ptr, "public.test".to_owned()],
        "only the public names went upstream"
    );
    let counters = h.gateway.dns_counters();
    let count = counters.agents[h.id(0)];
    assert_eq!(count.refused_local, (local.len() + reverse.len()) as u64);
    assert_eq!(count.forwarded, 2);
    h.close().await;
}

// covers: E20
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn one_agent_flooding_dns_is_refused_while_another_is_still_answered() {
    // Small budgets so that a test can exhaust them: the gateway's burst beyond its reserve (40) is smaller
    // than one agent's burst (100), so without the reserve agent 0 alone would leave nothing to agent 1.
    let h = Harness::start(
        Setup::new()
            .agents(2)
            .record("ok.test", &["93.184.216.34"])
            .egress(|c| {
                c.dns_agent_qps = 50;
                c.dns_agent_burst = 100;
                c.dns_gateway_qps = 10;
                c.dns_gateway_burst = 80;
                c.dns_gateway_reserve = 40;
            }),
    )
    .await;
    let started = std::time::Instant::now();
    let flood = h
        .py(0, &["flood", &h.gw(0).to_string(), "qN.flood.test", "600"])
        .await;
    let seconds = started.elapsed().as_secs();
    assert_eq!(flood["answered"], 600, "every query gets an answer: {flood}");
    // 40 tokens of the gateway's burst beyond the reserve, plus 10 per second: most of the flood is refused
    // (with a margin of 100 for a slow machine).
    let refused = flood["rcodes"]["5"].as_u64().unwrap_or(0);
    assert!(
        refused >= 460u64.saturating_sub(10 * (seconds + 1)),
        "{seconds} s: {flood}"
    );
    // Agent 1 is still answered, every time.
    let gw1 = h.gw(1).to_string();
    for i in 0..10 {
        let answer = h.py(1, &["dns", &gw1, "ok.test", "A", "udp"]).await;
        assert_eq!(
            (answer["rcode"].as_u64(), answer["addrs"][0].as_str()),
            (Some(0), Some("93.184.216.34")),
            "agent 1, query {i}: {answer}"
        );
    }
    // Counted: what agent 0 was refused never went upstream; agent 1 was refused nothing.
    let counters = h.gateway.dns_counters();
    let (flooder, other) = (counters.agents[h.id(0)], counters.agents[h.id(1)]);
    assert_eq!(flooder.queries, 600);
    assert_eq!(
        flooder.refused_agent_budget + flooder.refused_gateway_budget,
        refused
    );
    assert_eq!(flooder.forwarded, 600 - refused);
    assert_eq!(
        (
            other.queries,
            other.forwarded,
            other.refused_agent_budget + other.refused_gateway_budget
        ),
        (10, 10, 0)
    );
    let upstream_flood = h
        .dns
        .queries()
        .iter()
        .filter(|q| q.name.ends_with("flood.test"))
        .count() as u64;
    assert_eq!(
        upstream_flood, flooder.forwarded,
        "refused queries are not forwarded"
    );
    // Logged without flooding the log: one entry per second at most, carrying the count.
    let log = h.log(0);
    let limited: Vec<_> = log
        .iter()
        .filter(|e| {
            e.reason
                .as_ref()
                .map(ToString::to_string)
                .as_deref()
                .is_some_and(|r| r.starts_with("rate_limited;"))
        })
        .collect();
    assert!(
        !limited.is_empty() && limited.len() as u64 <= seconds + 2,
        "{seconds} s: {limited:#?}"
    );
    let logged: u64 = limited
        .iter()
        .map(|e| {
            let reason = e.reason.as_ref().map(ToString::to_string).unwrap();
            reason.rsplit_once("refused=").unwrap().1.parse::<u64>().unwrap()
        })
        .sum();
    assert!(logged <= refused && logged >= 1, "{logged} of {refused}");
    assert!(
        limited
            .iter()
            .all(|e| e.decision == Decision::Denied && e.status == Some(5))
    );
    assert_eq!(
        log.len() as u64,
        flooder.forwarded + limited.len() as u64,
        "one entry per forwarded query"
    );
    h.close().await;
}
