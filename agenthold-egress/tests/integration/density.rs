//! Many agents on one gateway namespace (E3): the ruleset's rules are the same few for 1 agent or 200
//! (each agent is one element in each set and the map), and with many agents attached the per-interface
//! lookups still keep every agent to its own interface: no spoofing another agent's source, no reaching
//! another agent's `.2`, nothing for a detached interface, and a re-attach works again.

use std::net::{IpAddr, Ipv4Addr};

use agenthold_egress::netns::NetNs;
use agenthold_egress::nft::{self, AgentAttachment, GatewayRules, Ports};
use agenthold_testsupport::{TestNet, init_tracing, require_root};
use ipnet::Ipv4Net;

use crate::support::{TcpStandIn, UdpStandIn, at, nft_json, probe};

/// `count` attachments on interfaces that do not exist (nft matches names, not devices), on /28s of
/// 10.250.0.0/16, away from the TestNet subnets.
fn phantoms(count: u32) -> Vec<AgentAttachment> {
    (0..count)
        .map(|i| {
            let base = u32::from(Ipv4Addr::new(10, 250, 0, 0)) + i * 16;
            let subnet = Ipv4Net::new(Ipv4Addr::from(base), 28).unwrap();
            AgentAttachment::on_subnet(format!("ph{i}"), subnet)
        })
        .collect()
}

/// (rules, elements per set or map by name) in table `inet agenthold` of `ns`.
fn counts(ns: &NetNs) -> (usize, Vec<(String, usize)>) {
    let json = nft_json(ns, &["table", "inet", "agenthold"]);
    let objects = json["nftables"].as_array().unwrap();
    let rules = objects.iter().filter(|o| o.get("rule").is_some()).count();
    let mut sets: Vec<(String, usize)> = objects
        .iter()
        .filter_map(|o| o.get("set").or_else(|| o.get("map")))
        .map(|s| {
            let n = s["elem"].as_array().map_or(0, Vec::len);
            (s["name"].as_str().unwrap().to_owned(), n)
        })
        .collect();
    sets.sort();
    (rules, sets)
}

// covers: E3
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn two_hundred_agents_have_the_rules_of_one() {
    require_root();
    init_tracing();
    let net = TestNet::new();
    let gw = net.gateway();
    nft::harden(gw).unwrap();
    let one = GatewayRules {
        ports: Ports::default(),
        agents: phantoms(1),
    };
    one.apply(gw).await.unwrap();
    let (rules_1, sets_1) = counts(gw);
    assert!(sets_1.iter().all(|(_, n)| *n == 1), "{sets_1:?}");

    let many = GatewayRules {
        ports: Ports::default(),
        agents: phantoms(200),
    };
    many.apply(gw).await.unwrap();
    let (rules_200, sets_200) = counts(gw);
    assert_eq!(rules_200, rules_1, "the rule count does not grow with the agents");
    assert_eq!(sets_200.len(), 3);
    assert!(sets_200.iter().all(|(_, n)| *n == 200), "{sets_200:?}");

    // Element changes: one out, one in, one transaction; the rules stay.
    let all = phantoms(201);
    nft::apply_element_changes(gw, &all[..1], &all[200..])
        .await
        .unwrap();
    let (rules_after, sets_after) = counts(gw);
    assert_eq!(rules_after, rules_1);
    assert!(sets_after.iter().all(|(_, n)| *n == 200), "{sets_after:?}");
    // Removing what is not there fails as a whole and changes nothing.
    assert!(nft::apply_element_changes(gw, &all[..1], &[]).await.is_err());
    assert_eq!(counts(gw), (rules_after, sets_after));
    net.close();
}

// covers: E3, E6
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn with_many_agents_each_stays_on_its_own_interface() {
    require_root();
    init_tracing();
    let net = TestNet::with_agents(3);
    let (a, b, c) = (net.agent(0), net.agent(1), net.agent(2));
    let gw = net.gateway();
    nft::harden(gw).unwrap();
    // Reverse-path filtering off: what is tested is the ruleset alone.
    for iface in ["all", "default", a.iface(), b.iface(), c.iface()] {
        gw.sysctl(&format!("net/ipv4/conf/{iface}/rp_filter"), "0")
            .unwrap();
    }
    // The real agents among 300 phantom ones.
    let mut agents = phantoms(300);
    agents.extend(net.attachments());
    GatewayRules {
        ports: Ports::default(),
        agents,
    }
    .apply(gw)
    .await
    .unwrap();
    let proxy_a = TcpStandIn::bind(gw, at(a.gateway_addr(), 15001), "proxy-a");
    let dns_a = UdpStandIn::bind(gw, at(a.gateway_addr(), 15053), "dns-a");
    let explicit_b = TcpStandIn::bind(gw, at(b.gateway_addr(), 15002), "explicit-b");
    let dns_b = UdpStandIn::bind(gw, at(b.gateway_addr(), 15053), "dns-b");
    let explicit_c = TcpStandIn::bind(gw, at(c.gateway_addr(), 15002), "explicit-c");
    let dns_c = UdpStandIn::bind(gw, at(c.gateway_addr(), 15053), "dns-c");

    // A cannot spoof B's source (nor a phantom's): its DNS query is dropped; its real one is answered.
    for spoofed in [b.sandbox_addr(), Ipv4Addr::new(10, 250, 0, 3)] {
        a.sandbox()
            .ip(&["addr", "add", &format!("{spoofed}/32"), "dev", "eth0"])
            .unwrap();
    }
    let dns = "1.1.1.1:53".parse().unwrap();
    let (b_src, ph_src, real_src) = (
        b.sandbox_addr().to_string(),
        "10.250.0.3".to_owned(),
        a.sandbox_addr().to_string(),
    );
    let (from_b, from_phantom, real) = tokio::join!(
        probe(a, "udp", dns, &["spoof", &b_src]),
        probe(a, "udp", dns, &["spoof", &ph_src]),
        probe(a, "udp", dns, &["real", &real_src]),
    );
    from_b.assert_silence("DNS from A with B's source");
    from_phantom.assert_silence("DNS from A with a phantom agent's source");
    assert_eq!(real.reply(), "dns-a:real");
    let sources: Vec<IpAddr> = dns_a.received().iter().map(|(p, _)| p.ip()).collect();
    assert_eq!(sources, [IpAddr::V4(a.sandbox_addr())]);
    assert!(dns_b.received().is_empty());

    // A cannot reach B's .2: UDP and ICMP are dropped, TCP lands in A's own transparent proxy.
    let (udp, icmp, tcp) = tokio::join!(
        probe(a, "udp", at(b.gateway_addr(), 15053), &["x"]),
        probe(a, "icmp", at(b.gateway_addr(), 0), &[]),
        probe(a, "tcp", at(b.gateway_addr(), 15002), &[]),
    );
    udp.assert_silence("UDP from A to B's .2");
    icmp.assert_silence("ping from A to B's .2");
    assert_eq!(tcp.reply_json()["listener"], "proxy-a");
    assert!(explicit_b.accepted().is_empty() && dns_b.received().is_empty());
    // B still reaches its own.
    assert_eq!(
        probe(b, "tcp", at(b.gateway_addr(), 15002), &[])
            .await
            .reply_json()["listener"],
        "explicit-b"
    );

    // C detached: its interface gets nothing at all, while A and B keep working.
    nft::apply_element_changes(gw, &[c.attachment()], &[])
        .await
        .unwrap();
    let c_dns = at(c.gateway_addr(), 53);
    let (explicit, dns_any, dns_own, tcp_out) = tokio::join!(
        probe(c, "tcp", at(c.gateway_addr(), 15002), &[]),
        probe(c, "udp", dns, &["x"]),
        probe(c, "udp", c_dns, &["x"]),
        probe(c, "tcp", at(Ipv4Addr::new(93, 184, 216, 34), 443), &[]),
    );
    explicit.assert_silence("detached C to its explicit proxy");
    dns_any.assert_silence("detached C's DNS");
    dns_own.assert_silence("detached C's DNS to its .2");
    tcp_out.assert_silence("detached C's TCP out");
    assert!(explicit_c.accepted().is_empty() && dns_c.received().is_empty());
    assert!(proxy_a.accepted().len() == 1, "A's proxy saw only A's probe");
    assert_eq!(
        probe(b, "tcp", at(b.gateway_addr(), 15002), &[])
            .await
            .reply_json()["listener"],
        "explicit-b"
    );

    // Re-attached: C works again.
    nft::apply_element_changes(gw, &[], &[c.attachment()])
        .await
        .unwrap();
    let (explicit, dns_again) = tokio::join!(
        probe(c, "tcp", at(c.gateway_addr(), 15002), &[]),
        probe(c, "udp", dns, &["y"]),
    );
    assert_eq!(explicit.reply_json()["listener"], "explicit-c");
    assert_eq!(dns_again.reply(), "dns-c:y");
    assert_eq!(
        counts(gw).1.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
        [303, 303, 303]
    );
    drop((proxy_a, dns_a, explicit_b, dns_b, explicit_c, dns_c));
    net.close();
}
