//! The gateway ruleset as data (E3): `GatewayRules::ruleset` is pure, so its JSON is checked here without
//! root. The expected expressions are what `nft -j list ruleset` prints for the same rules written in
//! nft's own syntax (nftables 1.0.6), so the JSON we send means what the comments in `nft.rs` say.

use std::net::Ipv4Addr;

use agenthold_egress::nft::{AgentAttachment, GatewayRules, Ports, element_changes};
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
fn dport(proto: &str, right: &Value) -> Value {
    json!({"match": {"op": "==", "left": {"payload": {"protocol": proto, "field": "dport"}}, "right": right}})
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

fn iface_and(field: &str) -> Value {
    json!({"concat": [{"meta": {"key": "iifname"}}, {"payload": {"protocol": "ip", "field": field}}]})
}
fn in_set(op: &str, field: &str, set: &str) -> Value {
    json!({"match": {"op": op, "left": iface_and(field), "right": format!("@{set}")}})
}
fn dnat_by_iface(port: u16) -> Value {
    json!({"dnat": {"addr": {"map": {"key": {"meta": {"key": "iifname"}}, "data": "@agent_gateway"}},
        "family": "ip", "port": port}})
}

#[test] // covers: E3
fn prerouting_sends_dns_to_the_resolver_and_other_tcp_to_the_proxy() {
    let rules = GatewayRules {
        ports: Ports::default(),
        agents: vec![agent(7)],
    };
    let pre = rules_in(&json_of(&rules), "prerouting");
    assert_eq!(pre.len(), 3);
    assert_eq!(pre[0], json!([dport("udp", &json!(53)), dnat_by_iface(15053)]));
    assert_eq!(pre[1], json!([dport("tcp", &json!(53)), dnat_by_iface(15053)]));
    let l4 = json!({"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}});
    assert_eq!(
        pre[2],
        json!([
            in_set("!=", "daddr", "agent_own_gateway"),
            l4,
            dnat_by_iface(15001)
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
    assert_eq!(
        input[3],
        json!([in_set("!=", "saddr", "agent_source"), verdict(DROP)])
    );
    let own = in_set("==", "daddr", "agent_own_gateway");
    assert_eq!(
        input[4],
        json!([
            own,
            dport("tcp", &json!({"set": [15001, 15053]})),
            ct_dnat(),
            verdict(ACCEPT)
        ])
    );
    assert_eq!(
        input[5],
        json!([own, dport("udp", &json!(15053)), ct_dnat(), verdict(ACCEPT)])
    );
    let direct = dport("tcp", &json!({"set": [15002, 15003]}));
    assert_eq!(input[6], json!([own, direct, verdict(ACCEPT)]));
    assert_eq!(
        input.len(),
        7,
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
    assert_eq!(last[1], dport("tcp", &json!(15002)));
}

#[test] // covers: E3
fn output_only_answers_and_no_agents_means_no_elements() {
    let objects = json_of(&GatewayRules::default());
    assert_eq!(rules_in(&objects, "prerouting").len(), 3);
    assert!(rules_in(&objects, "forward").is_empty());
    assert_eq!(rules_in(&objects, "input").len(), 7);
    assert!(
        objects
            .iter()
            .all(|o| o.get("add").and_then(|a| a.get("element")).is_none())
    );
    let output = rules_in(&objects, "output");
    let oif = json!({"match": {"op": "==", "left": {"meta": {"key": "oif"}}, "right": "lo"}});
    assert_eq!(output[0], json!([oif, verdict(ACCEPT)]));
    let state = json!({"match": {"op": "in", "left": {"ct": {"key": "state"}},
        "right": ["established", "related"]}});
    assert_eq!(output[1], json!([state, verdict(ACCEPT)]));
    assert_eq!(output.len(), 2);
}

/// `value` with every `flags` array sorted (fib flags come from a hash set: their order varies).
fn sorted_flags(mut value: Vec<Value>) -> Vec<Value> {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for (key, inner) in map.iter_mut() {
                    if key == "flags"
                        && let Value::Array(flags) = inner
                    {
                        flags.sort_by_key(ToString::to_string);
                    }
                    walk(inner);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    value.iter_mut().for_each(walk);
    value
}

/// The `elem` lists added to each set, by set name.
fn elements_of(objects: &[Value], cmd: &str) -> std::collections::BTreeMap<String, Vec<Value>> {
    let mut sets = std::collections::BTreeMap::<String, Vec<Value>>::new();
    for e in objects.iter().filter_map(|o| o.get(cmd)?.get("element")) {
        let name = e["name"].as_str().unwrap().to_owned();
        sets.entry(name)
            .or_default()
            .extend(e["elem"].as_array().unwrap().iter().cloned());
    }
    sets
}

#[test] // covers: E3
fn every_agent_is_an_element_keyed_by_interface_and_the_rules_stay_the_same() {
    let one = json_of(&GatewayRules {
        ports: Ports::default(),
        agents: vec![agent(1)],
    });
    let many = json_of(&GatewayRules {
        ports: Ports::default(),
        agents: (1..=200).map(agent).collect(),
    });
    for chain in ["prerouting", "input", "output", "forward"] {
        assert_eq!(
            sorted_flags(rules_in(&one, chain)),
            sorted_flags(rules_in(&many, chain)),
            "{chain}"
        );
    }
    let sets = elements_of(&many, "add");
    assert_eq!(sets.len(), 3);
    for elements in sets.values() {
        assert_eq!(elements.len(), 200);
    }
    assert!(sets["agent_gateway"].contains(&json!(["ah7", "10.213.7.2"])));
    assert!(sets["agent_own_gateway"].contains(&json!({"concat": ["ah7", "10.213.7.2"]})));
    assert!(
        sets["agent_source"]
            .contains(&json!({"concat": ["ah7", {"prefix": {"addr": "10.213.7.0", "len": 24}}]}))
    );
    let sets = json!(
        many.iter()
            .filter_map(|o| o.get("add")?.get("set").or_else(|| o.get("add")?.get("map")))
            .map(|s| (
                s["name"].clone(),
                s["type"].clone(),
                s.get("map").cloned(),
                s.get("flags").cloned()
            ))
            .map(|(n, t, m, f)| json!([n, t, m, f]))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        sets,
        json!([
            ["agent_gateway", "ifname", "ipv4_addr", null],
            ["agent_own_gateway", ["ifname", "ipv4_addr"], null, null],
            ["agent_source", ["ifname", "ipv4_addr"], null, ["interval"]],
        ])
    );
}

#[test] // covers: E3
fn element_changes_remove_first_then_add() {
    let batch = serde_json::to_value(element_changes(&[agent(1)], &[agent(2)])).unwrap();
    let objects = batch["nftables"].as_array().unwrap();
    assert_eq!(objects.len(), 6);
    assert!(objects[..3].iter().all(|o| o.get("delete").is_some()));
    assert!(objects[3..].iter().all(|o| o.get("add").is_some()));
    assert_eq!(
        elements_of(objects, "delete")["agent_gateway"],
        [json!(["ah1", "10.213.1.2"])]
    );
    assert_eq!(
        elements_of(objects, "add")["agent_gateway"],
        [json!(["ah2", "10.213.2.2"])]
    );
    assert!(
        serde_json::to_value(element_changes(&[], &[])).unwrap()["nftables"]
            .as_array()
            .unwrap()
            .is_empty()
    );
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
