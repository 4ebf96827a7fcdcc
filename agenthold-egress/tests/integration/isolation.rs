//! Agents against each other and against the gateway's notion of identity (E3, E6): another agent's
//! gateway address, another agent's sandbox, and spoofed source addresses.

use std::net::{IpAddr, Ipv4Addr};

use agenthold_egress::guard::Guard;
use agenthold_egress::nft::{self, GatewayRules, Ports};
use agenthold_testsupport::{TestNet, init_tracing, require_root};

use crate::support::{TcpStandIn, UdpStandIn, at, probe};

// covers: E3, E6
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn an_agent_cannot_reach_another_agents_gateway_address() {
    require_root();
    init_tracing();
    let net = TestNet::with_agents(2);
    let (a, b) = (net.agent(0), net.agent(1));
    let gw = net.gateway();
    let proxy_a = TcpStandIn::bind(gw, at(a.gateway_addr(), 15001), "proxy-a");
    let explicit_a = TcpStandIn::bind(gw, at(a.gateway_addr(), 15002), "explicit-a");
    let explicit_b = TcpStandIn::bind(gw, at(b.gateway_addr(), 15002), "explicit-b");
    let dns_b = UdpStandIn::bind(gw, at(b.gateway_addr(), 15053), "dns-b");

    // Control: the kernel itself accepts, on A's interface, packets for B's .2 (weak host model).
    let answer = probe(a, "tcp", at(b.gateway_addr(), 15002), &[])
        .await
        .reply_json();
    assert_eq!(answer["listener"], "explicit-b");
    assert_eq!(
        probe(a, "udp", at(b.gateway_addr(), 15053), &["x"]).await.reply(),
        "dns-b:x"
    );

    nft::harden(gw).unwrap();
    GatewayRules {
        ports: Ports::default(),
        agents: net.attachments(),
    }
    .apply(gw)
    .await
    .unwrap();
    // TCP to B's .2 is "TCP not addressed to the gateway" on A's interface: A's own transparent proxy
    // gets it, with B's address as the original destination, which the address guard refuses (E6).
    let answer = probe(a, "tcp", at(b.gateway_addr(), 15002), &[])
        .await
        .reply_json();
    assert_eq!(answer["listener"], "proxy-a");
    assert_eq!(answer["original_dst"], at(b.gateway_addr(), 15002).to_string());
    assert!(
        Guard::new([]).check(IpAddr::V4(b.gateway_addr())).is_err(),
        "the proxy never dials another agent"
    );
    // Everything else to B's .2 from A is dropped.
    let (udp, icmp) = tokio::join!(
        probe(a, "udp", at(b.gateway_addr(), 15053), &["x"]),
        probe(a, "icmp", at(b.gateway_addr(), 0), &[]),
    );
    udp.assert_silence("UDP to B's .2");
    icmp.assert_silence("ping to B's .2");
    assert_eq!(
        explicit_b.accepted().len(),
        1,
        "only the control reached B's explicit proxy"
    );
    assert_eq!(dns_b.received().len(), 1, "only the control reached B's resolver");
    // Each agent still reaches its own explicit proxy.
    assert_eq!(
        probe(a, "tcp", at(a.gateway_addr(), 15002), &[])
            .await
            .reply_json()["listener"],
        "explicit-a"
    );
    assert_eq!(
        probe(b, "tcp", at(b.gateway_addr(), 15002), &[])
            .await
            .reply_json()["listener"],
        "explicit-b"
    );
    assert_eq!((proxy_a.accepted().len(), explicit_a.accepted().len()), (1, 1));
    drop((proxy_a, explicit_a, explicit_b, dns_b));
    net.close();
}

// covers: E3
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn an_agent_cannot_reach_another_sandbox_even_with_forwarding_on() {
    require_root();
    init_tracing();
    let net = TestNet::with_agents(2);
    let (a, b) = (net.agent(0), net.agent(1));
    let gw = net.gateway();
    let proxy_a = TcpStandIn::bind(gw, at(a.gateway_addr(), 15001), "proxy-a");
    let udp_b = UdpStandIn::bind(b.sandbox(), at(b.sandbox_addr(), 7777), "sandbox-b");
    let tcp_b = TcpStandIn::bind(b.sandbox(), at(b.sandbox_addr(), 7777), "sandbox-b");
    // A restarted Docker gateway comes back with forwarding on (NOTES.md): the rules alone must hold.
    gw.sysctl("net.ipv4.ip_forward", "1").unwrap();

    assert_eq!(
        probe(a, "udp", at(b.sandbox_addr(), 7777), &["x"]).await.reply(),
        "sandbox-b:x",
        "control"
    );
    GatewayRules {
        ports: Ports::default(),
        agents: net.attachments(),
    }
    .apply(gw)
    .await
    .unwrap();
    probe(a, "udp", at(b.sandbox_addr(), 7777), &["x"])
        .await
        .assert_silence("UDP from A to B's sandbox");
    let answer = probe(a, "tcp", at(b.sandbox_addr(), 7777), &[])
        .await
        .reply_json();
    assert_eq!(
        answer["listener"], "proxy-a",
        "TCP to B's sandbox goes to A's proxy, never to B"
    );
    assert_eq!(udp_b.received().len(), 1, "only the control reached B");
    assert!(tcp_b.accepted().is_empty());
    drop((proxy_a, udp_b, tcp_b));
    net.close();
}

// covers: E3
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn spoofed_source_addresses_are_dropped() {
    require_root();
    init_tracing();
    let net = TestNet::with_agents(2);
    let (a, b) = (net.agent(0), net.agent(1));
    let gw = net.gateway();
    let dns_a = UdpStandIn::bind(gw, at(a.gateway_addr(), 15053), "dns-a");
    let foreign = Ipv4Addr::new(10, 99, 0, 9);
    // A sandbox with NET_ADMIN (which real ones never get) gives itself addresses that are not its own:
    // an address from nowhere, and B's sandbox address.
    for spoofed in [foreign, b.sandbox_addr()] {
        a.sandbox()
            .ip(&["addr", "add", &format!("{spoofed}/32"), "dev", "eth0"])
            .unwrap();
    }
    // Reverse-path filtering off, so that what is tested below is the ruleset alone.
    for iface in ["all", "default", a.iface(), b.iface()] {
        gw.sysctl(&format!("net/ipv4/conf/{iface}/rp_filter"), "0")
            .unwrap();
    }

    // Control: without rules, spoofed datagrams do arrive (the replies go astray, but the gateway saw them).
    let direct = at(a.gateway_addr(), 15053);
    let (foreign_src, b_src) = (foreign.to_string(), b.sandbox_addr().to_string());
    tokio::join!(
        probe(a, "udp", direct, &["spoof", &foreign_src]),
        probe(a, "udp", direct, &["spoof", &b_src]),
    );
    let sources = |log: &UdpStandIn| {
        let mut sources: Vec<IpAddr> = log.received().iter().map(|(peer, _)| peer.ip()).collect();
        sources.sort_unstable();
        sources
    };
    let mut spoofed = vec![IpAddr::V4(b.sandbox_addr()), IpAddr::V4(foreign)];
    spoofed.sort_unstable();
    assert_eq!(sources(&dns_a), spoofed, "control");
    dns_a.received.lock().unwrap().clear();

    let rules = GatewayRules {
        ports: Ports::default(),
        agents: net.attachments(),
    };
    rules.apply(gw).await.unwrap();
    let dns = "1.1.1.1:53".parse().unwrap();
    let real_src = a.sandbox_addr().to_string();
    for rp_filter in ["0", "1"] {
        gw.sysctl("net.ipv4.conf.all.rp_filter", rp_filter).unwrap();
        let (from_foreign, from_b, real) = tokio::join!(
            probe(a, "udp", dns, &["spoof", &foreign_src]),
            probe(a, "udp", dns, &["spoof", &b_src]),
            probe(a, "udp", dns, &["real", &real_src]),
        );
        from_foreign.assert_silence(&format!("DNS from a foreign source (rp_filter={rp_filter})"));
        from_b.assert_silence(&format!("DNS from B's sandbox address (rp_filter={rp_filter})"));
        // The sandbox's real address still works, and it is the only source that got through.
        assert_eq!(real.reply(), "dns-a:real");
        assert_eq!(
            sources(&dns_a),
            [IpAddr::V4(a.sandbox_addr())],
            "rp_filter={rp_filter}"
        );
        dns_a.received.lock().unwrap().clear();
    }
    drop(dns_a);
    net.close();
}
