//! The gateway ruleset as data (E3): `GatewayRules::ruleset` is pure, so its JSON is checked here without
//! root. The expected expressions are what `nft -j list ruleset` prints for the same rules written in
//! nft's own syntax (nftables 1.0.6), so the JSON we send means what the comments in `nft.rs` say.

use std::net::Ipv4Addr;

use agenthold_egress::nft::{AgentAttachment, GatewayRules, Ports};
use ipnet::Ipv4Net;
use serde_json::{Value, json};

fn agent(n: u8) -> AgentAttachment {
    AgentAttachment {
        iface: format!("ah{n}"),
        gateway_addr: Ipv4Addr::new(10, 213, n, 2),
        subnet: Ipv4Net::new(Ipv4Addr::new(10, 213, n, 0), 24).unwrap(),
    }
}

fn json_of(rules: &GatewayRules) -> Vec<Value> {
    let value = serde_json::to_value(rules.ruleset()).unwrap();
    value["nftables"].as_array().unwrap().clone()
}

/// The `expr` arrays of the rules added to `chain`, in order.
fn rules_in(objects: &[Value], chain: &str) -> Vec<Value> {
    objects
        .iter()
        .filter_map(|o| o.get("add")?.get("rule"))
        .filter(|r| r["chain"] == chain)
        .map(|r| r["expr"].clone())
        .collect()
}

// The expected expressions below are what `nft -j list ruleset` prints for the same rules written in
// nft's own syntax (checked with nftables 1.0.6), so the JSON we send is the JSON nft means.
fn iif(name: &str) -> Value {
    json!({"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": name}})
}
fn daddr(op: &str, addr: &str) -> Value {
    json!({"match": {"op": op, "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": addr}})
}
fn dport(proto: &str, right: &Value) -> Value {
    json!({"match": {"op": "==", "left": {"payload": {"protocol": proto, "field": "dport"}}, "right": right}})
}
fn dnat_to(addr: &str, port: u16) -> Value {
    json!({"dnat": {"addr": addr, "family": "ip", "port": port}})
}
fn ct_dnat() -> Value {
    json!({"match": {"op": "in", "left": {"ct": {"key": "status"}}, "right": "dnat"}})
}
const ACCEPT: &str = r#"{"accept": null}"#;
const DROP: &str = r#"{"drop": null}"#;
fn verdict(v: &str) -> Value {
    serde_json::from_str(v).unwrap()
}

#[test] // covers: E3
fn batch_replaces_the_table_atomically() {
    let objects = json_of(&GatewayRules::default());
    let table = json!({"table": {"family": "inet", "name": "agenthold"}});
    assert_eq!(objects[0], json!({"add": table}));
    assert_eq!(objects[1], json!({"delete": table}));
    assert_eq!(objects[2], json!({"add": table}));
    let chains: Vec<_> = objects
        .iter()
        .filter_map(|o| o.get("add")?.get("chain"))
        .collect();
    let expected = [
        ("prerouting", "nat", -100, "accept"),
        ("input", "filter", 0, "drop"),
        ("forward", "filter", 0, "drop"),
        ("output", "filter", 0, "drop"),
    ];
    assert_eq!(chains.len(), expected.len());
    for (chain, (name, kind, prio, policy)) in chains.iter().zip(expected) {
        assert_eq!(chain["name"], name);
        assert_eq!(chain["type"], kind);
        assert_eq!(chain["hook"], name);
        assert_eq!(chain["prio"], prio);
        assert_eq!(chain["policy"], policy);
    }
}

#[test] // covers: E3
fn prerouting_sends_dns_to_the_resolver_and_other_tcp_to_the_proxy() {
    let rules = GatewayRules {
        ports: Ports::default(),
        agents: vec![agent(7)],
    };
    let pre = rules_in(&json_of(&rules), "prerouting");
    assert_eq!(pre.len(), 3);
    assert_eq!(
        pre[0],
        json!([iif("ah7"), dport("udp", &json!(53)), dnat_to("10.213.7.2", 15053)])
    );
    assert_eq!(
        pre[1],
        json!([iif("ah7"), dport("tcp", &json!(53)), dnat_to("10.213.7.2", 15053)])
    );
    let l4 = json!({"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}});
    assert_eq!(
        pre[2],
        json!([
            iif("ah7"),
            daddr("!=", "10.213.7.2"),
            l4,
            dnat_to("10.213.7.2", 15001)
        ])
    );
}

#[test] // covers: E3
fn input_accepts_only_redirected_traffic_and_the_direct_ports() {
    let rules = GatewayRules {
        ports: Ports::default(),
        agents: vec![agent(7)],
    };
    let input = rules_in(&json_of(&rules), "input");
    let lo = json!({"match": {"op": "==", "left": {"meta": {"key": "iif"}}, "right": "lo"}});
    assert_eq!(input[0], json!([lo, verdict(ACCEPT)]));
    let fib_saddr = json!({"match": {"op": "==", "right": false,
        "left": {"fib": {"result": "oif", "flags": ["saddr", "iif"]}}}});
    assert_eq!(input[1][0]["match"]["left"]["fib"]["result"], "oif");
    let mut flags = input[1][0]["match"]["left"]["fib"]["flags"]
        .as_array()
        .unwrap()
        .clone();
    flags.sort_by_key(|f| f.to_string());
    assert_eq!(flags, [json!("iif"), json!("saddr")]);
    assert_eq!(input[1][0]["match"]["right"], fib_saddr["match"]["right"]);
    assert_eq!(input[1][1], verdict(DROP));
    assert_eq!(input[2][0]["match"]["op"], "!=");
    assert_eq!(input[2][0]["match"]["left"]["fib"]["result"], "type");
    assert_eq!(input[2][0]["match"]["right"], "local");
    assert_eq!(input[2][1], verdict(DROP));
    let saddr = json!({"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
        "right": {"prefix": {"addr": "10.213.7.0", "len": 24}}}});
    assert_eq!(input[3], json!([iif("ah7"), saddr, verdict(DROP)]));
    let redirected = |proto: &str, port: u16| {
        json!([
            iif("ah7"),
            daddr("==", "10.213.7.2"),
            dport(proto, &json!(port)),
            ct_dnat(),
            verdict(ACCEPT)
        ])
    };
    assert_eq!(input[4], redirected("tcp", 15001));
    assert_eq!(input[5], redirected("udp", 15053));
    assert_eq!(input[6], redirected("tcp", 15053));
    let direct = dport("tcp", &json!({"set": [15002, 15003]}));
    assert_eq!(
        input[7],
        json!([iif("ah7"), daddr("==", "10.213.7.2"), direct, verdict(ACCEPT)])
    );
    assert_eq!(
        input.len(),
        8,
        "nothing else is accepted: the policy drops the rest"
    );
}

#[test] // covers: E3
fn without_a_tunnel_only_the_explicit_port_is_direct() {
    let ports = Ports {
        tunnel: None,
        ..Ports::default()
    };
    let rules = GatewayRules {
        ports,
        agents: vec![agent(1)],
    };
    let input = rules_in(&json_of(&rules), "input");
    let last = input.last().unwrap();
    assert_eq!(last[2], dport("tcp", &json!(15002)));
}

#[test] // covers: E3
fn output_only_answers_and_no_agents_means_no_agent_rules() {
    let objects = json_of(&GatewayRules::default());
    assert!(rules_in(&objects, "prerouting").is_empty());
    assert!(rules_in(&objects, "forward").is_empty());
    assert_eq!(rules_in(&objects, "input").len(), 3);
    let output = rules_in(&objects, "output");
    let oif = json!({"match": {"op": "==", "left": {"meta": {"key": "oif"}}, "right": "lo"}});
    assert_eq!(output[0], json!([oif, verdict(ACCEPT)]));
    let state = json!({"match": {"op": "in", "left": {"ct": {"key": "state"}},
        "right": ["established", "related"]}});
    assert_eq!(output[1], json!([state, verdict(ACCEPT)]));
    assert_eq!(output.len(), 2);
}

#[test]
fn every_agent_gets_its_own_rules_keyed_by_interface() {
    let rules = GatewayRules {
        ports: Ports::default(),
        agents: vec![agent(1), agent(2)],
    };
    let objects = json_of(&rules);
    assert_eq!(rules_in(&objects, "prerouting").len(), 6);
    assert_eq!(rules_in(&objects, "input").len(), 3 + 2 * 5);
    for rule in rules_in(&objects, "input").iter().skip(3) {
        let iface = &rule[0]["match"]["right"];
        let gw = rule.as_array().unwrap().iter().find_map(|s| {
            (s["match"]["left"]["payload"]["field"] == "daddr").then(|| s["match"]["right"].clone())
        });
        if let Some(gw) = gw {
            let expected = if iface == "ah1" {
                "10.213.1.2"
            } else {
                "10.213.2.2"
            };
            assert_eq!(gw, expected, "a rule for {iface} names another agent's address");
        }
    }
}

#[test]
fn invalid_attachments_are_refused() {
    let mut bad = GatewayRules {
        ports: Ports::default(),
        agents: vec![agent(1)],
    };
    assert!(bad.validate().is_ok());
    bad.agents[0].iface = "eth*".into();
    assert!(
        bad.validate()
            .unwrap_err()
            .to_string()
            .contains("invalid interface name")
    );
    bad.agents[0].iface = "a-very-long-interface".into();
    assert!(bad.validate().is_err());
    bad.agents[0] = agent(1);
    bad.agents[0].gateway_addr = Ipv4Addr::new(10, 213, 2, 2);
    assert!(bad.validate().unwrap_err().to_string().contains("outside"));
    let twice = GatewayRules {
        ports: Ports::default(),
        agents: vec![agent(1), agent(1)],
    };
    assert!(twice.validate().unwrap_err().to_string().contains("twice"));
    let same_port = Ports {
        dns: 15001,
        ..Ports::default()
    };
    assert!(
        GatewayRules {
            ports: same_port,
            agents: vec![]
        }
        .validate()
        .is_err()
    );
    let zero = Ports {
        proxy: 0,
        ..Ports::default()
    };
    assert!(
        GatewayRules {
            ports: zero,
            agents: vec![]
        }
        .validate()
        .is_err()
    );
}
