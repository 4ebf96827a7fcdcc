//! The gateway namespace's rules on a real datapath (E3): a sandbox namespace plays the client, stand-in
//! listeners sit where the gateway binds (`.2:port` inside the gateway namespace).

use agenthold_egress::nft::{self, GatewayRules, Ports};
use agenthold_testsupport::{TestNet, init_tracing, require_root};

use crate::support::{TcpStandIn, UdpStandIn, at, eventually, nft_json, probe};

fn rules(net: &TestNet) -> GatewayRules {
    GatewayRules {
        ports: Ports::default(),
        agents: net.attachments(),
    }
}

// covers: E3
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn tcp_to_anywhere_reaches_the_transparent_proxy_with_its_original_destination() {
    require_root();
    init_tracing();
    let net = TestNet::new();
    let gw = net.gateway_addr();
    let proxy = TcpStandIn::bind(net.gateway(), at(gw, 15001), "proxy");
    nft::harden(net.gateway()).unwrap();
    rules(&net).apply(net.gateway()).await.unwrap();

    for target in ["93.184.216.34:443", "198.51.100.7:22", "1.1.1.1:80"] {
        let answer = probe(net.agent(0), "tcp", target.parse().unwrap(), &["hello"])
            .await
            .reply_json();
        assert_eq!(answer["listener"], "proxy", "{target}");
        assert_eq!(
            answer["original_dst"], target,
            "SO_ORIGINAL_DST reports where the client meant to go"
        );
    }
    // A real client, unaware of any proxy.
    let curl = net
        .run_in_sandbox_async(&["curl", "-sS", "--max-time", "5", "http://93.184.216.34/some/path"])
        .await;
    let body: serde_json::Value = serde_json::from_slice(&curl.stdout).unwrap();
    assert_eq!(body["original_dst"], "93.184.216.34:80");

    let accepted = proxy.accepted();
    assert_eq!(accepted.len(), 4);
    assert!(
        accepted.iter().all(|a| a.peer.ip() == net.sandbox_addr()),
        "the source is kept: {accepted:?}"
    );
    assert_eq!(
        accepted[0].original_dst,
        Some("93.184.216.34:443".parse().unwrap())
    );
    assert!(accepted[3].first_bytes.starts_with(b"GET /some/path HTTP/1.1"));
    drop(proxy);
    net.close();
}

// covers: E3
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn dns_to_any_address_reaches_the_resolver_over_udp_and_tcp() {
    require_root();
    init_tracing();
    let net = TestNet::new();
    let gw = net.gateway_addr();
    let dns_udp = UdpStandIn::bind(net.gateway(), at(gw, 15053), "dns");
    let dns_tcp = TcpStandIn::bind(net.gateway(), at(gw, 15053), "dns-tcp");
    nft::harden(net.gateway()).unwrap();
    rules(&net).apply(net.gateway()).await.unwrap();

    // The probe's UDP socket is connected: the answer must come *from* the address it asked, which
    // proves the reverse translation of the redirected query.
    for target in [
        "1.1.1.1:53".parse().unwrap(),
        at(gw, 53),
        "8.8.8.8:53".parse().unwrap(),
    ] {
        let answer = probe(net.agent(0), "udp", target, &["query"]).await;
        assert_eq!(answer.reply(), "dns:query", "{target}");
        let answer = probe(net.agent(0), "tcp", target, &["query"]).await.reply_json();
        assert_eq!(answer["listener"], "dns-tcp", "{target}");
        assert_eq!(answer["original_dst"], target.to_string());
    }
    assert_eq!(dns_udp.received().len(), 3);
    assert_eq!(dns_tcp.accepted().len(), 3);
    drop((dns_udp, dns_tcp));
    net.close();
}

// covers: E3
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn redirect_ports_take_no_direct_connections_and_only_explicit_and_tunnel_answer() {
    require_root();
    init_tracing();
    let net = TestNet::new();
    let gw = net.gateway_addr();
    let proxy = TcpStandIn::bind(net.gateway(), at(gw, 15001), "proxy");
    let dns_udp = UdpStandIn::bind(net.gateway(), at(gw, 15053), "dns");
    let dns_tcp = TcpStandIn::bind(net.gateway(), at(gw, 15053), "dns-tcp");
    let explicit = TcpStandIn::bind(net.gateway(), at(gw, 15002), "explicit");
    let tunnel = TcpStandIn::bind(net.gateway(), at(gw, 15003), "tunnel");
    // Listeners on ports the rules never open: only the rules keep them unreachable.
    let other_tcp = TcpStandIn::bind(net.gateway(), at(gw, 8080), "other");
    let other_udp = UdpStandIn::bind(net.gateway(), at(gw, 9999), "other-udp");
    let agent = net.agent(0);

    // Control: without rules, every listener answers a direct connection (so silence below is the rules).
    assert_eq!(
        probe(agent, "tcp", at(gw, 15001), &[]).await.reply_json()["listener"],
        "proxy"
    );
    assert_eq!(probe(agent, "udp", at(gw, 15053), &["x"]).await.reply(), "dns:x");
    assert_eq!(
        probe(agent, "tcp", at(gw, 8080), &[]).await.reply_json()["listener"],
        "other"
    );
    assert_eq!(
        probe(agent, "udp", at(gw, 9999), &["x"]).await.reply(),
        "other-udp:x"
    );
    assert_eq!(probe(agent, "icmp", at(gw, 0), &[]).await.reply(), "echo reply");
    let before = (
        proxy.accepted().len(),
        dns_udp.received().len(),
        other_tcp.accepted().len(),
    );

    nft::harden(net.gateway()).unwrap();
    rules(&net).apply(net.gateway()).await.unwrap();
    let (
        direct_proxy,
        direct_dns_udp,
        direct_dns_tcp,
        other_port,
        other_udp_port,
        icmp_gw,
        icmp_out,
        udp_out,
    ) = tokio::join!(
        probe(agent, "tcp", at(gw, 15001), &[]),
        probe(agent, "udp", at(gw, 15053), &["x"]),
        probe(agent, "tcp", at(gw, 15053), &[]),
        probe(agent, "tcp", at(gw, 8080), &[]),
        probe(agent, "udp", at(gw, 9999), &["x"]),
        probe(agent, "icmp", at(gw, 0), &[]),
        probe(agent, "icmp", "1.1.1.1:0".parse().unwrap(), &[]),
        probe(agent, "udp", "9.9.9.9:9999".parse().unwrap(), &["x"]),
    );
    direct_proxy.assert_silence("direct TCP to the transparent proxy port");
    direct_dns_udp.assert_silence("direct UDP to the DNS port");
    direct_dns_tcp.assert_silence("direct TCP to the DNS port");
    other_port.assert_silence("TCP to another port of the gateway");
    other_udp_port.assert_silence("UDP to another port of the gateway");
    icmp_gw.assert_silence("ping to the gateway");
    icmp_out.assert_silence("ping to the outside");
    udp_out.assert_silence("UDP to an outside address, not port 53");
    assert_eq!(
        (
            proxy.accepted().len(),
            dns_udp.received().len(),
            other_tcp.accepted().len()
        ),
        before
    );
    assert!(
        dns_tcp.accepted().is_empty() && other_udp.received().len() == 1,
        "only the control reached them"
    );

    // The explicit proxy and the tunnel are the only ports a sandbox may address directly (TCP only).
    let (explicit_ok, tunnel_ok, explicit_udp) = tokio::join!(
        probe(agent, "tcp", at(gw, 15002), &[]),
        probe(agent, "tcp", at(gw, 15003), &[]),
        probe(agent, "udp", at(gw, 15002), &["x"]),
    );
    assert_eq!(explicit_ok.reply_json()["listener"], "explicit");
    assert_eq!(tunnel_ok.reply_json()["listener"], "tunnel");
    explicit_udp.assert_silence("UDP to the explicit proxy port");

    // Without a tunnel port, the tunnel listener is unreachable again.
    let no_tunnel = GatewayRules {
        ports: Ports {
            tunnel: None,
            ..Ports::default()
        },
        agents: net.attachments(),
    };
    no_tunnel.apply(net.gateway()).await.unwrap();
    let (tunnel_gone, explicit_still) = tokio::join!(
        probe(agent, "tcp", at(gw, 15003), &[]),
        probe(agent, "tcp", at(gw, 15002), &[]),
    );
    tunnel_gone.assert_silence("tunnel port without a tunnel");
    assert_eq!(explicit_still.reply_json()["listener"], "explicit");
    assert_eq!((explicit.accepted().len(), tunnel.accepted().len()), (2, 1));
    drop((proxy, dns_udp, dns_tcp, explicit, tunnel, other_tcp, other_udp));
    net.close();
}

// covers: E3
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn rules_replace_atomically_apply_twice_and_apply_empty() {
    require_root();
    init_tracing();
    let net = TestNet::new();
    let gw = net.gateway_addr();
    let explicit = TcpStandIn::bind(net.gateway(), at(gw, 15002), "explicit");
    let list = || {
        let json = nft_json(net.gateway(), &["ruleset"]);
        let objects = json["nftables"].as_array().unwrap().clone();
        let count = |kind: &str| objects.iter().filter(|o| o.get(kind).is_some()).count();
        let elements: usize = objects
            .iter()
            .filter_map(|o| o.get("set").or_else(|| o.get("map")))
            .filter_map(|s| s["elem"].as_array().map(Vec::len))
            .sum();
        (count("table"), count("chain"), count("rule"), elements)
    };

    let rules = rules(&net);
    rules.apply(net.gateway()).await.unwrap();
    rules.apply(net.gateway()).await.unwrap();
    assert_eq!(list(), (1, 4, 3 + 7 + 2, 3), "one table, nothing doubled");
    assert_eq!(
        probe(net.agent(0), "tcp", at(gw, 15002), &[]).await.reply_json()["listener"],
        "explicit"
    );

    GatewayRules {
        ports: Ports::default(),
        agents: vec![],
    }
    .apply(net.gateway())
    .await
    .unwrap();
    assert_eq!(
        list(),
        (1, 4, 3 + 7 + 2, 0),
        "no agent, the same rules (no elements); the drop policies stay"
    );
    probe(net.agent(0), "tcp", at(gw, 15002), &[])
        .await
        .assert_silence("explicit port with no agents");

    rules.apply(net.gateway()).await.unwrap();
    assert_eq!(
        probe(net.agent(0), "tcp", at(gw, 15002), &[]).await.reply_json()["listener"],
        "explicit"
    );

    // The batch is one transaction: if any part fails, the delete of the old table is rolled back too.
    // (Proved with nft directly, since `validate` stops every bad input this API can express.)
    let mut batch = serde_json::to_value(GatewayRules::default().ruleset()).unwrap();
    let bad = serde_json::json!({"add": {"rule": {"family": "inet", "table": "agenthold",
        "chain": "no-such-chain", "expr": [{"accept": null}]}}});
    batch["nftables"].as_array_mut().unwrap().push(bad);
    let mut nft = net.gateway().command("nft");
    nft.args(["-j", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = nft.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), batch.to_string().as_bytes()).unwrap();
    assert!(
        !child.wait_with_output().unwrap().status.success(),
        "nft must refuse the batch"
    );
    assert_eq!(list(), (1, 4, 3 + 7 + 2, 3), "the previous ruleset is intact");
    assert_eq!(
        probe(net.agent(0), "tcp", at(gw, 15002), &[]).await.reply_json()["listener"],
        "explicit"
    );

    // Errors name the namespace and carry nft's (here nsenter's) message.
    let missing = agenthold_egress::netns::NetNs::named("aht-no-such-ns");
    let err = rules.apply(&missing).await.unwrap_err().to_string();
    assert!(err.contains("aht-no-such-ns") && err.contains("nsenter"), "{err}");
    drop(explicit);
    net.close();
}

// covers: E3
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn the_gateway_is_hardened_and_starts_no_connection_itself() {
    require_root();
    init_tracing();
    let net = TestNet::new();
    let gateway = net.gateway();
    gateway.sysctl("net.ipv4.ip_forward", "1").unwrap();
    nft::harden(gateway).unwrap();
    for (key, value) in [
        ("net.ipv4.ip_forward", "0"),
        ("net.ipv4.conf.all.rp_filter", "1"),
        ("net.ipv4.conf.default.rp_filter", "1"),
        ("net.ipv6.conf.all.disable_ipv6", "1"),
        ("net.ipv6.conf.default.disable_ipv6", "1"),
    ] {
        assert_eq!(gateway.read_sysctl(key).unwrap(), value, "{key}");
    }

    // A listener in the sandbox; the gateway namespace tries to connect to it.
    let target = at(net.sandbox_addr(), 7000);
    let sandbox_listener = TcpStandIn::bind(net.sandbox(), target, "sandbox");
    let connect = || {
        gateway.run(move || {
            std::net::TcpStream::connect_timeout(&target, std::time::Duration::from_secs(1)).map(drop)
        })
    };
    tokio::task::block_in_place(connect).unwrap();
    eventually("control: reachable without rules", || {
        sandbox_listener.accepted().len() == 1
    })
    .await;
    rules(&net).apply(gateway).await.unwrap();
    let err = tokio::task::block_in_place(connect).unwrap_err().to_string();
    // A drop in the output hook fails the connect at once with EPERM.
    assert!(
        err.contains("Operation not permitted") || err.contains("timed out"),
        "{err}"
    );
    assert_eq!(
        sandbox_listener.accepted().len(),
        1,
        "nothing new reached the sandbox"
    );
    drop(sandbox_listener);
    net.close();
}
