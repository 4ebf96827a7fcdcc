//! `Datapath`: attaching an agent writes its rules and binds its listeners at its `.2`, detaching (by
//! `close` or by dropping the attachment) takes both away again, and other agents are untouched (E3).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use agenthold_core::AgentId;
use agenthold_core::policy::PolicyTable;
use agenthold_egress::datapath::{CaPaths, Datapath, RESERVED_ENV};
use agenthold_egress::netns::NetNs;
use agenthold_egress::nft::Ports;
use agenthold_egress::{Error, Gateway};
use agenthold_testsupport::{TestNet, init_tracing, require_root};

use crate::support::{at, eventually, nft_json, probe};

/// Always, whatever the number of agents: 3 prerouting, 7 input and 2 output rules.
const BASE_RULES: usize = 3 + 7 + 2;
/// Per attached agent: one element in each of the table's two sets and its map.
const AGENT_RULES: usize = 3;

/// A request for the explicit proxy (refused: no policy names the host, which is answered in HTTP).
const REQUEST: &str = "GET http://nowhere.test/ HTTP/1.1\r\nHost: nowhere.test\r\n\r\n";

/// The comments of the rules in table `inet agenthold` of `ns` (each names the interface it is for).
fn rule_comments(ns: &NetNs) -> Vec<String> {
    let json = nft_json(ns, &["table", "inet", "agenthold"]);
    json["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.get("rule"))
        .map(|r| r["comment"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The set and map elements of table `inet agenthold` in `ns` keyed by `iface`.
fn rules_for(ns: &NetNs, iface: &str) -> usize {
    let json = nft_json(ns, &["table", "inet", "agenthold"]);
    json["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.get("set").or_else(|| o.get("map")))
        .filter_map(|s| s["elem"].as_array().cloned())
        .flatten()
        .filter(|e| e[0] == iface || e["concat"][0] == iface)
        .count()
}

/// A gateway with an empty policy table and the datapath of `ns` serving it on the default ports.
async fn bare_datapath(ns: &NetNs) -> (Arc<Gateway>, Datapath) {
    let gateway = Arc::new(
        Gateway::builder()
            .policy(Arc::new(PolicyTable::new()))
            .dns_upstream("127.0.0.1:53".parse().unwrap())
            .build()
            .unwrap(),
    );
    let datapath = Datapath::new(ns.clone(), Ports::default(), Arc::clone(&gateway))
        .await
        .unwrap();
    (gateway, datapath)
}

// covers: E3
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn attach_writes_rules_and_listeners_and_detach_takes_them_away() {
    require_root();
    init_tracing();
    let net = TestNet::with_agents(2);
    let (a, b) = (net.agent(0), net.agent(1));
    let ns = net.gateway();
    let (gateway, datapath) = bare_datapath(ns).await;
    assert_eq!(rule_comments(ns).len(), BASE_RULES, "no agent yet: loopback only");
    assert_eq!(ns.read_sysctl("net.ipv4.ip_forward").unwrap(), "0", "hardened");

    let (id_a, id_b) = (AgentId::new("a").unwrap(), AgentId::new("b").unwrap());
    let mut attached_a = datapath.attach(&id_a, a.attachment()).await.unwrap();
    assert_eq!(attached_a.gateway_addr(), a.gateway_addr());
    assert_eq!(attached_a.explicit_proxy(), at(a.gateway_addr(), 15002));
    assert_eq!(attached_a.tunnel_addr(), Some(at(a.gateway_addr(), 15003)));
    assert_eq!(rules_for(ns, a.iface()), AGENT_RULES);
    // The explicit proxy answers at A's .2.
    let answer = probe(a, "tcp", at(a.gateway_addr(), 15002), &[REQUEST]).await;
    assert!(answer.reply().starts_with("HTTP/1.1 "), "{:?}", answer.0);
    // The tunnel port is bound for the caller to serve, and ends with the attachment.
    let tunnel = attached_a.take_tunnel().expect("a tunnel listener");
    assert_eq!(tunnel.local_addr().unwrap(), at(a.gateway_addr(), 15003));
    assert!(attached_a.take_tunnel().is_none(), "handed out once");
    let ended = attached_a.cancelled();
    assert!(!ended.is_cancelled());

    // One agent, one attachment per datapath.
    let twice = datapath.attach(&id_a, a.attachment()).await.unwrap_err();
    assert!(matches!(twice, Error::Config { .. }), "{twice}");
    let attached_b = datapath.attach(&id_b, b.attachment()).await.unwrap();
    assert_eq!(rules_for(ns, b.iface()), AGENT_RULES);
    assert_eq!(datapath.agents(), vec![id_a.clone(), id_b.clone()]);
    assert_eq!(rule_comments(ns).len(), BASE_RULES, "nothing doubled");

    // Close A: its rules and listeners go, B's stay.
    attached_a.close().await.unwrap();
    assert!(ended.is_cancelled());
    drop(tunnel);
    assert_eq!(rules_for(ns, a.iface()), 0);
    assert_eq!(rules_for(ns, b.iface()), AGENT_RULES);
    assert!(gateway.agent_stats(&id_a).is_none(), "detached from the gateway");
    probe(a, "tcp", at(a.gateway_addr(), 15002), &[])
        .await
        .assert_silence("A's explicit proxy after detach");
    let answer = probe(b, "tcp", at(b.gateway_addr(), 15002), &[REQUEST]).await;
    assert!(answer.reply().starts_with("HTTP/1.1 "), "{:?}", answer.0);

    // Attached again at once: the same addresses bind again.
    let again = datapath.attach(&id_a, a.attachment()).await.unwrap();
    assert_eq!(rules_for(ns, a.iface()), AGENT_RULES);

    // Dropping an attachment detaches too (its rules follow on the runtime).
    drop(attached_b);
    assert!(gateway.agent_stats(&id_b).is_none());
    eventually("B's rules removed after the drop", || {
        rules_for(ns, b.iface()) == 0
    })
    .await;
    assert_eq!(rules_for(ns, a.iface()), AGENT_RULES);
    assert_eq!(datapath.agents(), vec![id_a.clone()]);

    // A forgotten attachment leaves the gateway serving the agent and the rules as they are.
    again.forget();
    assert!(gateway.agent_stats(&id_a).is_some());
    assert!(datapath.agents().is_empty());
    assert_eq!(rules_for(ns, a.iface()), AGENT_RULES);
    gateway.detach(&id_a);
    gateway.shutdown(Duration::from_secs(2)).await;
    net.close();
}

// covers: E3
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn a_failed_attach_leaves_nothing_behind() {
    require_root();
    init_tracing();
    let net = TestNet::new();
    let ns = net.gateway();
    let (gateway, datapath) = bare_datapath(ns).await;
    let id = AgentId::new("a").unwrap();
    // The .2 of another subnet is not an address of the namespace: the listeners cannot bind.
    let mut wrong = net.agent(0).attachment();
    wrong.gateway_addr = Ipv4Addr::new(10, 213, 0, 2);
    wrong.subnet = "10.213.0.0/24".parse().unwrap();
    let err = datapath.attach(&id, wrong).await.unwrap_err();
    assert!(matches!(err, Error::Netns { .. }), "{err}");
    assert!(datapath.agents().is_empty());
    assert_eq!(rule_comments(ns).len(), BASE_RULES, "its rules are gone again");
    assert!(gateway.agent_stats(&id).is_none());
    // An interface name nft would read as a wildcard is refused before anything changes.
    let mut bad = net.agent(0).attachment();
    bad.iface = "ah*".into();
    let err = datapath.attach(&id, bad).await.unwrap_err();
    assert!(matches!(err, Error::Config { .. }), "{err}");
    // Named by an address no interface holds: refused.
    let nobody = "10.213.0.2/24".parse().unwrap();
    let err = datapath.attach_at(&id, nobody).await.unwrap_err();
    assert!(matches!(err, Error::Config { .. }), "{err}");
    // By its .2 and prefix alone: the interface is found.
    let at_addr = ipnet::Ipv4Net::new(net.gateway_addr(), 24).unwrap();
    let attached = datapath.attach_at(&id, at_addr).await.unwrap();
    assert_eq!(attached.link(), &net.agent(0).attachment());
    let env = attached.env(&CaPaths::new("/ca.crt", "/bundle.pem"));
    assert_eq!(env["HTTPS_PROXY"], format!("http://{}:15002", net.gateway_addr()));
    assert!(RESERVED_ENV.iter().all(|k| env.contains_key(*k)));
    attached.close().await.unwrap();
    gateway.shutdown(Duration::from_secs(2)).await;
    net.close();
}
