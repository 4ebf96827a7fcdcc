//! Blocked destinations written as literal addresses in every notation (E6): decimal, octal, hex, one
//! integer, short forms and IPv6 forms that embed the IPv4 address, on every path (Host header, direct
//! connection, absolute-form, CONNECT, TLS with and without SNI), under the open policy and under an
//! allowlist whose CIDR entries try to re-open every range.
//!
//! curl normalises IPv4 numerals in URLs itself (`http://0x7f.0.0.1/` connects to, and sends `Host:`,
//! `127.0.0.1`), so the verbatim notations reach the gateway through `-H Host:`, `--request-target` and a raw
//! client; the normalised ones through plain URLs. IPv6 literals need no IPv6 in the sandbox on the proxy
//! paths (the sandbox only sends text); a direct connection to `[::ffff:a.b.c.d]` is made by the kernel as
//! IPv4 to `a.b.c.d`, so it is redirected like any other IPv4 connection.

use std::collections::BTreeSet;
use std::net::IpAddr;

use agenthold_egress::log::{Decision, LogKind};
use serde_json::json;

use super::harness::{BLOCKED_ORIG, Canary, Harness, Setup, allow, strs};

/// A blocked address and ways of writing it. `routable`: a sandbox connection to it leaves the sandbox (and
/// is redirected to the gateway); loopback, `0.0.0.0`, multicast and broadcast never leave it.
struct Literal {
    forms: &'static [&'static str],
    routable: bool,
}

#[rustfmt::skip]
const LITERALS: &[Literal] = &[
    // Loopback: the gateway process's own host.
    Literal { forms: &["127.0.0.1", "0177.0.0.01", "0x7f.0.0.1", "2130706433", "0x7f000001", "127.1", "127.0.0.1.",
        "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[::127.0.0.1]", "[64:ff9b::7f00:1]", "[2002:7f00:1::]", "[::1]"],
        routable: false },
    // "This host": connecting to 0.0.0.0 reaches the local host on Linux.
    Literal { forms: &["0.0.0.0", "0", "0x0", "00.0.0.0", "[::]", "[::ffff:0.0.0.0]"], routable: false },
    Literal { forms: &["10.0.0.5", "012.0.0.05", "0xa.0.0.5", "167772165", "10.5", "[::ffff:10.0.0.5]",
        "[2002:a00:5::]"], routable: true },
    Literal { forms: &["172.16.0.1", "0254.020.0.1", "0xac.0x10.0.1", "2886729729", "[::ffff:172.16.0.1]"],
        routable: true },
    // Docker's bridge on this host.
    Literal { forms: &["172.17.0.1", "2886795265", "[::ffff:172.17.0.1]"], routable: true },
    Literal { forms: &["192.168.1.1", "0300.0250.01.01", "0xc0.0xa8.1.1", "3232235777", "[::ffff:192.168.1.1]"],
        routable: true },
    // Cloud metadata.
    Literal { forms: &["169.254.169.254", "0251.0376.0251.0376", "0xa9.0xfe.0xa9.0xfe", "0xa9fea9fe",
        "2852039166", "169.254.43518", "[::ffff:169.254.169.254]", "[::ffff:a9fe:a9fe]", "[64:ff9b::a9fe:a9fe]",
        "[fe80::a9fe:a9fe]"], routable: true },
    Literal { forms: &["100.64.0.1", "0144.0100.0.1", "0x64.0x40.0.1", "1681915905", "[::ffff:100.64.0.1]"],
        routable: true },
    // The host's own address on this machine's network (a documentation range).
    Literal { forms: &["192.0.2.2", "0300.0.02.02", "3221225986", "[::ffff:192.0.2.2]"], routable: true },
    // The range the gateway's DNS hands out for test overrides.
    Literal { forms: &["198.18.0.1", "3323068417"], routable: true },
    Literal { forms: &["224.0.0.1", "0340.0.0.1", "0xe0.0.0.1", "3758096385", "[::ffff:224.0.0.1]", "[ff02::1]"],
        routable: false },
    Literal { forms: &["240.0.0.1", "4026531841"], routable: false },
    Literal { forms: &["255.255.255.255", "4294967295", "0xffffffff"], routable: false },
];

/// Every path, every form, for agent `i`; asserts each attempt was refused. Returns how many TLS
/// connections without SNI reached the gateway.
async fn attack(h: &Harness, i: usize, port: u16) -> usize {
    let proxy = h.proxy_url(i);
    let all: Vec<&str> = LITERALS.iter().flat_map(|l| l.forms.iter().copied()).collect();
    let routable: Vec<&str> = LITERALS
        .iter()
        .filter(|l| l.routable)
        .flat_map(|l| l.forms.iter().copied())
        .collect();

    // Transparent plain HTTP, the literal in Host (verbatim), aimed at some other address.
    let host = all
        .iter()
        .map(|f| {
            (
                format!("host {f}"),
                strs(&[
                    "-H",
                    &format!("Host: {f}:{port}"),
                    &format!("http://{BLOCKED_ORIG}:{port}/"),
                ]),
            )
        })
        .collect::<Vec<_>>();
    // Transparent, connecting to the address itself (curl normalises the notation).
    let direct = routable
        .iter()
        .map(|f| (format!("direct {f}"), strs(&[&format!("http://{f}:{port}/")])))
        .collect::<Vec<_>>();
    // Transparent TLS to the address itself: no SNI for an address, so the gateway can only go by address.
    let tls = routable
        .iter()
        .map(|f| (format!("tls {f}"), strs(&["-k", &format!("https://{f}:{port}/")])))
        .collect::<Vec<_>>();
    // Explicit proxy, absolute form, normalised by curl and verbatim.
    let absolute = all
        .iter()
        .map(|f| {
            (
                format!("absolute {f}"),
                strs(&["-x", &proxy, &format!("http://{f}:{port}/")]),
            )
        })
        .collect::<Vec<_>>();
    let verbatim = all
        .iter()
        .map(|f| {
            let target = format!("http://{f}:{port}/");
            (
                format!("verbatim {f}"),
                strs(&[
                    "-x",
                    &proxy,
                    "--request-target",
                    &target,
                    "http://placeholder.test/",
                ]),
            )
        })
        .collect::<Vec<_>>();
    // Explicit proxy, CONNECT (curl normalises the authority).
    let connect = all
        .iter()
        .map(|f| {
            (
                format!("connect {f}"),
                strs(&["-k", "-p", "-x", &proxy, &format!("https://{f}:{port}/")]),
            )
        })
        .collect::<Vec<_>>();

    let (host, direct, tls, absolute, verbatim, connect) = tokio::join!(
        h.curl_batch(i, &host),
        h.curl_batch(i, &direct),
        h.curl_batch(i, &tls),
        h.curl_batch(i, &absolute),
        h.curl_batch(i, &verbatim),
        h.curl_batch(i, &connect),
    );
    for (tag, code, _, exit) in host.iter().chain(&absolute).chain(&verbatim) {
        assert!(
            matches!(code, 403 | 400),
            "agent {i} {tag}: answered {code} (curl exit {exit})"
        );
    }
    for (tag, code, _, exit) in &direct {
        // 403 from the transparent proxy; IPv6 forms that the kernel cannot turn into IPv4 fail in the
        // sandbox already (exit 7), which is a refusal too.
        let local_failure = *exit == 7 && tag.contains('[');
        assert!(
            *code == 403 || local_failure,
            "agent {i} {tag}: answered {code} (curl exit {exit})"
        );
    }
    for (tag, code, connect_code, exit) in &connect {
        assert!(
            matches!(connect_code, 403 | 400),
            "agent {i} {tag}: CONNECT answered {connect_code} ({code}, exit {exit})"
        );
        assert_eq!(*exit, 56, "agent {i} {tag}");
    }
    for (tag, code, _, exit) in &tls {
        // The connection is closed before a ServerHello (35), or, for IPv6 forms, fails in the sandbox (7).
        assert!(
            *exit == 35 || (*exit == 7 && tag.contains('[')),
            "agent {i} {tag}: answered {code} (exit {exit})"
        );
    }

    // CONNECT with the authority verbatim, and TLS carrying the literal as its SNI, from a raw client.
    let requests: Vec<String> = all
        .iter()
        .map(|f| format!("CONNECT {f}:{port} HTTP/1.1\r\nHost: {f}:{port}\r\n\r\n"))
        .collect();
    let explicit_port = h.config.explicit_port.to_string();
    let gw = h.gw(i).to_string();
    let answers = h
        .py(i, &["each", &gw, &explicit_port, &json!(requests).to_string()])
        .await;
    for (form, answer) in all.iter().zip(answers.as_array().unwrap()) {
        let status = answer["status"].as_u64();
        assert!(
            matches!(status, Some(403 | 400)),
            "agent {i} raw CONNECT {form}: {answer}"
        );
    }
    let hellos = h
        .py(
            i,
            &["hellos", BLOCKED_ORIG, &port.to_string(), &json!(all).to_string()],
        )
        .await;
    for form in &all {
        let r = &hellos[form];
        assert!(
            r["closed_after"].is_number() && r["received"] == 0,
            "agent {i} SNI {form}: {r}"
        );
    }
    tls.iter().filter(|(_, _, _, exit)| *exit == 35).count()
}

// covers: E6
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn blocked_addresses_in_every_notation_are_refused_on_every_path_whatever_the_policy() {
    // Agent 0: the open policy. Agent 1: an allowlist whose address entries cover every range, all ports.
    let reopen = allow(&[
        "0.0.0.0/0:*",
        "[::/0]:*",
        "127.0.0.0/8:*",
        "10.0.0.0/8:*",
        "169.254.169.254/32:*",
        "[::ffff:0:0/96]:*",
        "api.test",
    ]);
    let h = Harness::start(
        Setup::new()
            .agents(2)
            .policy(agenthold_core::policy::NetworkPolicy::open())
            .policy(reopen),
    )
    .await;
    // A listener on every address of the host (the gateway's own namespace) on one port: a dial to
    // loopback, 0.0.0.0 or any of the host's addresses on that port would land here.
    let canary = Canary::start().await;
    let port = canary.port;
    let mut local: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "0.0.0.0".parse().unwrap()];
    let addrs = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&addrs.stdout).lines() {
        let mut words = line.split_whitespace().skip_while(|w| *w != "inet").skip(1);
        if let Some(ip) = words
            .next()
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse().ok())
        {
            local.push(ip);
        }
    }
    // Control: the canary does catch those dials.
    for ip in &local {
        tokio::net::TcpStream::connect((*ip, port)).await.unwrap();
    }
    crate::support::eventually("the canary saw every control dial", || {
        canary.accepted().len() == local.len()
    })
    .await;
    canary.clear();

    // Control: each agent's paths work for a name its policy allows.
    for i in 0..2 {
        let ok = h
            .curl(i, &["-H", "Host: api.test", &format!("http://{BLOCKED_ORIG}/")])
            .await;
        ok.echo();
        assert_eq!(
            h.curl(i, &["-x", &h.proxy_url(i), "http://api.test/"])
                .await
                .status,
            200
        );
    }

    let no_sni = tokio::join!(attack(&h, 0, port), attack(&h, 1, port));
    let no_sni = [no_sni.0, no_sni.1];

    assert!(
        canary.accepted().is_empty(),
        "the gateway dialled a local address: {:?}",
        canary.accepted()
    );
    for (i, no_sni) in no_sni.into_iter().enumerate() {
        let log = h.log(i);
        let refused: Vec<_> = log
            .iter()
            .filter(|e| e.host.as_deref() != Some("api.test"))
            .collect();
        assert!(refused.len() > 300, "agent {i}: {} entries", refused.len());
        let mut reasons = BTreeSet::new();
        for e in &refused {
            assert_eq!(e.decision, Decision::Denied, "agent {i}: {e:?}");
            let reason = e.reason.as_ref().map(ToString::to_string).unwrap_or_default();
            reasons.insert(reason.clone());
            let reason = reason.as_str();
            // An address is refused by the guard, never by the policy (agent 1's policy allows them all);
            // anything else never got as far as being an address.
            let is_addr = e.host.as_deref().and_then(|h| h.parse::<IpAddr>().ok()).is_some();
            if is_addr && e.kind == LogKind::Tls {
                // An address as SNI is not a name; without SNI the address is guarded.
                assert!(
                    matches!(reason, "blocked_address" | "invalid_name"),
                    "agent {i}: {e:?}"
                );
            } else if is_addr {
                assert_eq!(reason, "blocked_address", "agent {i}: {e:?}");
            } else {
                assert!(matches!(reason, "invalid_name" | "malformed"), "agent {i}: {e:?}");
            }
            if e.kind == LogKind::Http || e.kind == LogKind::Connect {
                assert!(matches!(e.status, Some(403 | 400)), "agent {i}: {e:?}");
            }
        }
        assert!(
            reasons.contains("blocked_address") && reasons.contains("invalid_name"),
            "agent {i}: {reasons:?}"
        );
        // Every TLS connection without SNI that reached the gateway was refused by the guard.
        let guarded_tls = refused.iter().filter(|e| {
            e.kind == LogKind::Tls
                && e.reason.as_ref().map(ToString::to_string).as_deref() == Some("blocked_address")
        });
        assert_eq!(guarded_tls.count(), no_sni, "agent {i}");
        let ok = log
            .iter()
            .filter(|e| e.host.as_deref() == Some("api.test") && e.kind == LogKind::Http);
        assert!(ok.clone().count() >= 2 && ok.into_iter().all(|e| e.decision == Decision::Allowed));
    }
    h.close().await;
}
