//! The gateway never dials the host it runs on (its own addresses, also ones added while it runs), the IANA
//! special-purpose rows that look public, known provider endpoints, or the operator's deny list, on any
//! path and under the open policy (E22, E6).
//!
//! These tests run the gateway in the harness's host namespace (`Setup::host_namespace`), which has
//! public-looking addresses of its own and no route anywhere: a dial the guard wrongly let through lands on
//! a canary there or fails as unreachable (`502`); it never leaves the test's namespaces.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthold_egress::log::{Decision, LogKind};
use serde_json::json;

use super::harness::{
    BLOCKED_ORIG, Canary, HOST_IFACE, Harness, OWN_V4, OWN_V6, OWN_V6_NEIGHBOUR, PUBLIC, Setup, strs,
};

/// Added to the host namespace after the gateway started.
const LATER_V4: &str = "45.76.0.11";
const LATER_V6_NET: &str = "2a0e:1234:5678:aaaa::1/64";
const LATER_V6_NEIGHBOUR: &str = "2a0e:1234:5678:aaaa::77";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// `name:port` on every path (transparent `Host` aimed at a public address, absolute form and CONNECT on the
/// explicit proxy): each answer must be 403. Returns the curl transfers' tags and statuses.
async fn refused_by_name(h: &Harness, names: &[&str], port: u16) {
    let proxy = h.proxy_url(0);
    let mut transfers = Vec::new();
    for name in names {
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
}

/// Every log entry about `host` says the guard refused it.
fn all_blocked(h: &Harness, host: &str) {
    let entries: Vec<_> = [LogKind::Http, LogKind::Connect, LogKind::Tls]
        .into_iter()
        .flat_map(|k| h.entries(0, k, host))
        .collect();
    assert!(!entries.is_empty(), "{host}: {:#?}", h.log(0));
    for e in entries {
        assert_eq!(
            (e.decision, e.reason.as_ref().map(ToString::to_string).as_deref()),
            (Decision::Denied, Some("blocked_address")),
            "{e:?}"
        );
    }
}

// covers: E22
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn names_resolving_to_the_hosts_own_addresses_are_refused_and_new_addresses_are_picked_up() {
    let h = Harness::start(
        Setup::new()
            .host_namespace()
            .record("own.test", &[OWN_V4])
            .record("own6.test", &[OWN_V6])
            .record("neighbour6.test", &[OWN_V6_NEIGHBOUR])
            .record("later.test", &[LATER_V4])
            .record("later6.test", &[LATER_V6_NEIGHBOUR]),
    )
    .await;
    // The gateway dials from the host namespace: its guard read that namespace's addresses.
    let guard = Arc::clone(h.gateway.guard());
    let own = guard.own_addresses();
    for range in [format!("{OWN_V4}/32"), "2a0e:1234:5678:9abc::/64".to_owned()] {
        assert!(own.contains(&range.parse().unwrap()), "{range} not in {own:?}");
    }
    // A listener on every address of the host namespace; a dial there from the namespace does reach it.
    let canary = h.on_host(Canary::start_dual()).await;
    let port = canary.port;
    h.on_host(async move {
        for addr in [OWN_V4, OWN_V6] {
            tokio::net::TcpStream::connect((ip(addr), port)).await.unwrap();
        }
    })
    .await;
    crate::support::eventually("the canary saw both control dials", || {
        canary.accepted().len() == 2
    })
    .await;
    canary.clear();

    // The sandbox is told no address of the host.
    let gw = h.gw(0).to_string();
    let answer = h.py(0, &["dns", &gw, "own.test", "A", "udp"]).await;
    assert_eq!(
        (answer["rcode"].as_u64(), answer["answers"].as_u64()),
        (Some(0), Some(0)),
        "{answer}"
    );
    let dns = h.entries(0, LogKind::Dns, "own.test");
    assert_eq!(
        dns[0].reason.as_ref().map(ToString::to_string).as_deref(),
        Some("no_public_address"),
        "{dns:?}"
    );

    // Named anyway, on every path, in both families and for a neighbour in the host's IPv6 prefix.
    let names = ["own.test", "own6.test", "neighbour6.test"];
    refused_by_name(&h, &names, port).await;
    let hellos = h
        .py(
            0,
            &["hellos", PUBLIC, &port.to_string(), &json!(names).to_string()],
        )
        .await;
    for name in names {
        assert!(
            hellos[name]["closed_after"].is_number() && hellos[name]["received"] == 0,
            "{name}: {hellos}"
        );
        all_blocked(&h, name);
    }

    // Addresses added while the gateway runs are refused as soon as the kernel reports them: well within
    // the 30 s periodic re-read, so it is the netlink notification that did it.
    assert!(guard.check(ip(LATER_V4)).is_ok());
    assert!(guard.check(ip(LATER_V6_NEIGHBOUR)).is_ok());
    let added = Instant::now();
    let ns = &h.host_ns().ns;
    ns.ip(&["addr", "add", &format!("{LATER_V4}/32"), "dev", HOST_IFACE])
        .unwrap();
    ns.ip(&["addr", "add", LATER_V6_NET, "dev", HOST_IFACE, "nodad"])
        .unwrap();
    while guard.check(ip(LATER_V4)).is_ok() || guard.check(ip(LATER_V6_NEIGHBOUR)).is_ok() {
        assert!(
            added.elapsed() < Duration::from_secs(3),
            "new addresses not picked up: {:?}",
            guard.own_addresses()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tracing::info!(after = ?added.elapsed(), "new host addresses picked up");
    refused_by_name(&h, &["later.test", "later6.test"], port).await;
    all_blocked(&h, "later.test");

    assert!(
        canary.accepted().is_empty(),
        "the gateway dialled its own host: {:?}",
        canary.accepted()
    );
    h.close().await;
}

/// Public-looking addresses the guard refuses: IANA rows marked globally reachable or inside 2001::/23, a
/// provider endpoint (also in IPv4-embedding forms), and the test's deny list.
const V6_LITERALS: &[&str] = &[
    "2001:4::1",
    "2001:40::1",
    "2001:1::1",
    "2001:1::3",
    "2001:3::1",
    "2001:4:112::1",
    "2001:30::1",
    "2620:4f:8000::1",
    "100:0:0:1::1",
    "::ffff:168.63.129.16",
    "64:ff9b::a83f:8110",
    "2002:a83f:8110::1",
    "2a0e:97c0:1::5",
];
const V4_LITERALS: &[&str] = &[
    "192.0.0.9",
    "192.0.0.10",
    "192.31.196.1",
    "192.52.193.1",
    "192.175.48.1",
    "192.88.99.2",
    "168.63.129.16",
    "45.77.1.2",
];

// covers: E22, E6
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn special_purpose_provider_and_denied_addresses_are_refused_on_every_path() {
    let h = Harness::start(
        Setup::new()
            .host_namespace()
            .egress(|c| {
                c.deny_cidrs = vec![
                    "45.77.0.0/16".parse().unwrap(),
                    "2a0e:97c0:1::/48".parse().unwrap(),
                ];
            })
            .record("as112.test", &["192.31.196.1"])
            .record("ietf.test", &["2001:4::1"])
            .record("azure.test", &["168.63.129.16"])
            .record("denied.test", &["45.77.1.1"])
            .record("denied6.test", &["2a0e:97c0:1::5"])
            .record("public.test", &["45.78.1.1"]),
    )
    .await;
    let proxy = h.proxy_url(0);
    let bracket = |l: &str| {
        if l.contains(':') {
            format!("[{l}]")
        } else {
            l.to_owned()
        }
    };
    let all: Vec<String> = V6_LITERALS
        .iter()
        .chain(V4_LITERALS)
        .map(|l| bracket(l))
        .collect();
    let mut transfers = Vec::new();
    for lit in &all {
        // Transparent: the literal as Host, aimed at a blocked address.
        transfers.push((
            format!("host {lit}"),
            strs(&["-H", &format!("Host: {lit}"), &format!("http://{BLOCKED_ORIG}/")]),
        ));
        transfers.push((
            format!("absolute {lit}"),
            strs(&["-x", &proxy, &format!("http://{lit}/")]),
        ));
        transfers.push((
            format!("connect {lit}"),
            strs(&["-p", "-x", &proxy, &format!("https://{lit}/")]),
        ));
    }
    for lit in V4_LITERALS {
        // Transparent, connecting to the address itself.
        transfers.push((format!("direct {lit}"), strs(&[&format!("http://{lit}/")])));
    }
    for (tag, code, connect, exit) in h.curl_batch(0, &transfers).await {
        let status = if tag.starts_with("connect") { connect } else { code };
        assert_eq!(status, 403, "{tag}: curl exit {exit}");
    }
    // TLS without SNI to the address itself: decided by the original destination, closed unanswered.
    let tls: Vec<_> = V4_LITERALS
        .iter()
        .map(|lit| (format!("tls {lit}"), strs(&["-k", &format!("https://{lit}/")])))
        .collect();
    for (tag, code, _, exit) in h.curl_batch(0, &tls).await {
        assert_eq!(exit, 35, "{tag}: answered {code}");
    }
    for entry in h.log(0) {
        assert_eq!(
            (
                entry.decision,
                entry.reason.as_ref().map(ToString::to_string).as_deref()
            ),
            (Decision::Denied, Some("blocked_address")),
            "{entry:?}"
        );
    }
    // Names resolving there: no address for the sandbox, refused by name.
    let names = [
        "as112.test",
        "ietf.test",
        "azure.test",
        "denied.test",
        "denied6.test",
    ];
    let gw = h.gw(0).to_string();
    for name in ["as112.test", "azure.test", "denied.test"] {
        let answer = h.py(0, &["dns", &gw, name, "A", "udp"]).await;
        assert_eq!(answer["answers"], 0, "{name}: {answer}");
    }
    refused_by_name(&h, &names, 443).await;
    for name in names {
        all_blocked(&h, name);
    }
    // Control: a public address outside every list is dialled (and, the host namespace having no route,
    // fails as an upstream error, not as a refusal).
    let public = h.curl(0, &["-p", "-x", &proxy, "https://public.test/"]).await;
    assert!(public.stderr.contains("502"), "{public:?}");
    let entry = h.entries(0, LogKind::Connect, "public.test").pop().unwrap();
    assert_eq!(entry.decision, Decision::Allowed, "{entry:?}");
    h.close().await;
}
