//! DNS rebinding (E6): names whose upstream answer is a blocked address. The sandbox gets no such address,
//! and naming the host anyway (SNI, Host, CONNECT, absolute form) towards some public address is refused,
//! because the gateway resolves the name itself and its guard refuses what it gets.

use agenthold_core::policy::NetworkPolicy;
use agenthold_egress::log::{Decision, LogKind};
use serde_json::json;

use super::harness::{Canary, Harness, PUBLIC, Setup, strs};

/// Name → the blocked addresses its upstream record holds.
const REBOUND: &[(&str, &[&str])] = &[
    ("localhost.test", &["127.0.0.1"]),
    ("metadata.test", &["169.254.169.254"]),
    ("internal.test", &["10.0.0.5"]),
    ("host.test", &["192.0.2.2"]),
    ("docker.test", &["172.17.0.1"]),
    ("zero.test", &["0.0.0.0"]),
    ("cgnat.test", &["100.64.0.1"]),
    // An upstream cannot forge a mapping into the range of the gateway's own synthetic addresses.
    ("synthetic.test", &["198.18.0.1"]),
    ("mixed.test", &["127.0.0.1", "10.0.0.5", "169.254.169.254"]),
    // Only an IPv6 record, IPv4-mapped loopback (the gateway dials both families).
    ("mapped.test", &["::ffff:127.0.0.1"]),
];

// covers: E6
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn names_resolving_to_blocked_addresses_get_no_address_and_are_never_dialled() {
    let mut setup = Setup::new()
        .policy(NetworkPolicy::open())
        .record("flip.test", &[PUBLIC]);
    for (name, addrs) in REBOUND {
        setup = setup.record(name, addrs);
    }
    let h = Harness::start(setup).await;
    let canary = Canary::start().await;
    let port = canary.port;
    // Control: a dial to loopback on that port would be seen.
    tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    crate::support::eventually("the canary saw the control dial", || canary.accepted().len() == 1).await;
    canary.clear();
    let gw = h.gw(0).to_string();
    let names: Vec<&str> = REBOUND.iter().map(|(n, _)| *n).collect();

    // The sandbox asks: NOERROR, and not one address.
    for name in &names {
        for qtype in ["A", "AAAA"] {
            let answer = h.py(0, &["dns", &gw, name, qtype, "udp"]).await;
            assert_eq!(
                (answer["rcode"].as_u64(), answer["answers"].as_u64()),
                (Some(0), Some(0)),
                "{name} {qtype}: {answer}"
            );
        }
    }
    for name in names.iter().filter(|n| **n != "mapped.test") {
        let dns = h.entries(0, LogKind::Dns, name);
        let a = dns.iter().find(|e| e.method.as_deref() == Some("A")).unwrap();
        assert_eq!(
            (a.decision, a.reason.as_ref().map(ToString::to_string).as_deref()),
            (Decision::Denied, Some("no_public_address")),
            "{a:?}"
        );
    }

    // It names the hosts anyway, aimed at a public address, on every path.
    let proxy = h.proxy_url(0);
    let mut transfers = Vec::new();
    for name in &names {
        transfers.push((
            format!("host {name}"),
            strs(&[
                "-H",
                &format!("Host: {name}:{port}"),
                &format!("http://{PUBLIC}:{port}/"),
            ]),
        ));
        transfers.push((
            format!("absolute {name}"),
            strs(&["-x", &proxy, &format!("http://{name}:{port}/")]),
        ));
        transfers.push((
            format!("connect {name}"),
            strs(&["-p", "-x", &proxy, &format!("https://{name}:{port}/")]),
        ));
    }
    for (tag, code, connect, exit) in h.curl_batch(0, &transfers).await {
        let status = if tag.starts_with("connect") { connect } else { code };
        assert_eq!(status, 403, "{tag}: curl exit {exit}");
    }
    let hellos = h
        .py(
            0,
            &["hellos", PUBLIC, &port.to_string(), &json!(names).to_string()],
        )
        .await;
    for name in &names {
        assert!(
            hellos[name]["closed_after"].is_number() && hellos[name]["received"] == 0,
            "{name}: {hellos}"
        );
    }
    // A body says why.
    let body = h
        .curl(
            0,
            &[
                "-x",
                &proxy,
                &format!("http://metadata.test:{port}/latest/meta-data/"),
            ],
        )
        .await;
    assert_eq!(body.status, 403);
    assert!(body.body.contains("blocked_address"), "{body:?}");

    // Time-of-check rebinding: the sandbox is told a public address, then the record turns private before
    // it connects. The gateway resolves again and refuses; it never dials the address the sandbox holds.
    let first = h.py(0, &["dns", &gw, "flip.test", "A", "udp"]).await;
    assert_eq!(first["addrs"], json!([PUBLIC]), "{first}");
    h.dns.set("flip.test", vec!["127.0.0.1".parse().unwrap()]);
    let flipped = h
        .py(
            0,
            &[
                "hellos",
                PUBLIC,
                &port.to_string(),
                &json!(["flip.test"]).to_string(),
            ],
        )
        .await;
    assert!(
        flipped["flip.test"]["closed_after"].is_number() && flipped["flip.test"]["received"] == 0,
        "{flipped}"
    );
    let flip = h
        .curl(
            0,
            &[
                "-H",
                &format!("Host: flip.test:{port}"),
                &format!("http://{PUBLIC}:{port}/"),
            ],
        )
        .await;
    assert_eq!(flip.status, 403, "{flip:?}");

    assert!(
        canary.accepted().is_empty(),
        "the gateway dialled a local address: {:?}",
        canary.accepted()
    );
    for name in names.iter().copied().chain(["flip.test"]) {
        for kind in [LogKind::Tls, LogKind::Http, LogKind::Connect] {
            let entries = h.entries(0, kind, name);
            assert!(!entries.is_empty(), "{name} {kind:?}: {:#?}", h.log(0));
            for e in entries {
                assert_eq!(
                    (e.decision, e.reason.as_ref().map(ToString::to_string).as_deref()),
                    (Decision::Denied, Some("blocked_address")),
                    "{e:?}"
                );
            }
            if name == "flip.test" && kind == LogKind::Http {
                break;
            }
        }
    }
    // The refusals are the guard's: the gateway did ask the upstream for each name.
    let asked: Vec<String> = h.dns.queries().into_iter().map(|q| q.name).collect();
    for name in &names {
        assert!(
            asked.iter().any(|a| a == name),
            "{name} never resolved upstream: {asked:?}"
        );
    }
    h.close().await;
}
