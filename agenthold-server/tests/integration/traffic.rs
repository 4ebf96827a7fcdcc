//! Allowed and denied traffic from inside the jail, with real clients (curl and Python): transparent
//! HTTPS, the explicit proxy through `HTTPS_PROXY`, plain HTTP; NXDOMAIN without an upstream query for
//! names the allowlist refuses; `--report-only`.

use crate::support::{API, DENIED, Env, OTHER, PYTHON, entries_for, read_log};

/// Prints `rcode=N` for an `A` query for `sys.argv[1]` sent over UDP to the resolver of /etc/resolv.conf.
const DNS_RCODE_PY: &str = r#"
import random, socket, struct, sys
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
qid = random.randrange(65536)
q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p.encode() for p in sys.argv[1].split(".")) + b"\0" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(q, (ns, 53))
r = s.recv(4096)
assert struct.unpack(">H", r[:2])[0] == qid
print("rcode=%d answers=%d" % (r[3] & 0x0F, struct.unpack(">H", r[6:8])[0]))
"#;

/// Python's three ways out: `HTTPS_PROXY` (urllib's default), transparent HTTPS and plain HTTP (no
/// proxy). Prints one JSON object: the proxy it saw and, per way, the path the upstream echoed or the error.
const CLIENTS_PY: &str = r#"
import json, os, ssl, sys, urllib.request
host, ca = sys.argv[1], sys.argv[2]
ctx = ssl.create_default_context(cafile=ca)
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
proxied = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
def get(opener, url):
    try:
        body = json.load(opener.open(url, timeout=10))
        return {"path": body["path"], "upstream": body["upstream"], "sni": body.get("sni")}
    except Exception as e:
        return {"error": "%s: %s" % (type(e).__name__, e)}
print(json.dumps({
    "https_proxy": os.environ.get("HTTPS_PROXY"),
    "explicit": get(proxied, "https://%s/py-explicit" % host),
    "transparent": get(direct, "https://%s/py-transparent" % host),
    "plain": get(direct, "http://%s/py-plain" % host),
}))
"#;

/// Writes `source` to `name` in the test's directory and returns the path, for `python3 PATH …`.
fn script(env: &Env, name: &str, source: &str) -> String {
    let path = env.path(name);
    std::fs::write(&path, source).unwrap();
    path.display().to_string()
}

/// The gateway's address as the sandbox sees it: the `nameserver` of /etc/resolv.conf.
fn nameserver(resolv_conf: &str) -> &str {
    resolv_conf
        .lines()
        .find_map(|l| l.strip_prefix("nameserver "))
        .map(str::trim)
        .expect("a nameserver line")
}

// covers: E4 E7 (curl: transparent HTTPS by SNI, explicit proxy from HTTPS_PROXY, plain HTTP by Host)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn curl_reaches_an_allowed_name_three_ways() {
    let env = Env::new().await;
    let log = env.path("log.jsonl");
    let script = format!(
        "echo \"proxy=$HTTPS_PROXY\"; echo \"http_proxy=$HTTP_PROXY\"; cat /etc/resolv.conf; \
         curl -sS -m 10 --noproxy '*' --cacert {ca} https://{API}/transparent; echo; \
         curl -sS -m 10 --cacert {ca} https://{API}/explicit; echo; \
         curl -sS -m 10 --noproxy '*' http://{API}/plain; echo",
        ca = env.ca_str()
    );
    let out = env.run().allow(API).log(&log).sh(&script).await;
    out.expect_code(0);
    let gateway = nameserver(&out.stdout);
    let proxy = out.stdout.lines().find_map(|l| l.strip_prefix("proxy=")).unwrap();
    assert!(
        proxy.starts_with(&format!("http://{gateway}:")),
        "HTTPS_PROXY {proxy:?} is not the gateway {gateway}"
    );
    assert!(
        out.stdout.contains(&format!("http_proxy={proxy}")),
        "HTTP_PROXY differs: {out:#?}"
    );
    assert_eq!(out.stdout.matches("upstream-ok").count(), 3, "{out:#?}");
    assert_eq!(env.https_paths(API), ["/transparent", "/explicit"]);
    assert_eq!(env.http_paths(API), ["/plain"]);
    let log = read_log(&log);
    let kinds: Vec<_> = entries_for(&log, API)
        .iter()
        .filter(|e| e["kind"] != "dns")
        .map(|e| e["kind"].clone())
        .collect();
    assert_eq!(kinds, ["tls", "connect", "http"], "{log:#?}");
    assert!(
        entries_for(&log, API).iter().all(|e| e["decision"] == "allowed"),
        "{log:#?}"
    );
}

// covers: E4 E7 (Python's urllib: HTTPS_PROXY by default, transparent HTTPS and plain HTTP without it)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn python_reaches_an_allowed_name_three_ways() {
    let env = Env::new().await;
    let clients = script(&env, "clients.py", CLIENTS_PY);
    let out = env
        .run()
        .allow(API)
        .output(&[PYTHON, &clients, API, &env.ca_str()])
        .await;
    out.expect_code(0);
    let result: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON line");
    assert!(
        result["https_proxy"]
            .as_str()
            .is_some_and(|p| p.starts_with("http://")),
        "{result}"
    );
    for (way, path) in [
        ("explicit", "/py-explicit"),
        ("transparent", "/py-transparent"),
        ("plain", "/py-plain"),
    ] {
        assert_eq!(result[way]["upstream"], "upstream-ok", "{way}: {result}");
        assert_eq!(result[way]["path"], path, "{way}: {result}");
    }
    assert_eq!(env.https_paths(API), ["/py-explicit", "/py-transparent"]);
    assert_eq!(env.http_paths(API), ["/py-plain"]);
}

// covers: E9 (NXDOMAIN, and no upstream query, for names the allowlist refuses) E7 (CONNECT refused)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn denied_names_get_nxdomain_and_never_reach_upstream() {
    let env = Env::new().await;
    let log = env.path("log.jsonl");
    let ca = env.ca_str();
    // DENIED is known to the upstream DNS; OTHER has an upstream (a --dangerous-connect-to mapping):
    // neither may be resolved nor reached.
    let rcode = script(&env, "dns_rcode.py", DNS_RCODE_PY);
    let clients = script(&env, "clients.py", CLIENTS_PY);
    let mut sh = String::new();
    for name in [DENIED, OTHER] {
        sh += &format!(
            "{PYTHON} {rcode} {name}; \
             getent hosts {name}; echo getent=$?; \
             curl -sS -m 10 --noproxy '*' --cacert {ca} https://{name}/t; echo transparent=$?; \
             curl -sS -m 10 --cacert {ca} https://{name}/e; echo explicit=$?; \
             curl -sS -m 10 -o /dev/null -w 'absolute_status=%{{http_code}}\\n' -x \"$HTTP_PROXY\" http://{name}/p; "
        );
    }
    sh += &format!("{PYTHON} {clients} {DENIED} {ca}");
    let out = env.run().allow(API).log(&log).sh(&sh).await;
    out.expect_code(0);
    let stdout = &out.stdout;
    assert_eq!(
        stdout.matches("rcode=3 answers=0").count(),
        2,
        "not NXDOMAIN: {out:#?}"
    );
    assert_eq!(
        stdout.matches("getent=2").count(),
        2,
        "getent resolved a denied name: {out:#?}"
    );
    assert_eq!(
        stdout.matches("transparent=6").count(),
        2,
        "curl resolved a denied name: {out:#?}"
    );
    // The explicit proxy refuses CONNECT and absolute-form requests with 403.
    assert_eq!(
        stdout.matches("explicit=56").count(),
        2,
        "CONNECT was not refused: {out:#?}"
    );
    assert!(
        out.stderr.contains("403"),
        "CONNECT was not refused with 403: {out:#?}"
    );
    assert_eq!(
        stdout.matches("absolute_status=403").count(),
        2,
        "absolute-form not refused: {out:#?}"
    );
    assert!(
        !stdout.contains("upstream-ok"),
        "a denied name reached an upstream: {out:#?}"
    );
    let python: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for way in ["explicit", "transparent", "plain"] {
        assert!(
            python[way]["error"].is_string(),
            "python {way} got through: {python}"
        );
    }
    assert!(
        python["explicit"]["error"].as_str().unwrap().contains("403"),
        "{python}"
    );
    // Zero upstream queries for the denied names, zero requests at the upstreams.
    assert_eq!(
        env.dns_queries_for(DENIED),
        0,
        "the upstream DNS was asked: {:?}",
        env.dns.queries()
    );
    assert_eq!(
        env.dns_queries_for(OTHER),
        0,
        "the upstream DNS was asked: {:?}",
        env.dns.queries()
    );
    assert!(
        env.https.requests().is_empty() && env.http.requests().is_empty(),
        "an upstream was reached"
    );
    let log = read_log(&log);
    for name in [DENIED, OTHER] {
        let entries = entries_for(&log, name);
        assert!(
            entries.iter().any(|e| e["kind"] == "dns"),
            "{name}: no DNS entry: {log:#?}"
        );
        assert!(
            entries.iter().any(|e| e["kind"] == "connect"),
            "{name}: no CONNECT entry: {log:#?}"
        );
        for entry in entries {
            assert_eq!(entry["decision"], "denied", "{entry}");
            assert!(
                entry["reason"].as_str().is_some_and(|r| !r.is_empty()),
                "no reason: {entry}"
            );
        }
    }
}

// covers: E8 (report-only: an allowlist's denials are let through and logged with the reason)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn report_only_lets_denied_names_through_and_logs_why() {
    let env = Env::new().await;
    let log = env.path("log.jsonl");
    let script = format!(
        "curl -sS -m 10 --noproxy '*' --cacert {ca} https://{OTHER}/ro-transparent; echo; \
         curl -sS -m 10 --cacert {ca} https://{OTHER}/ro-explicit; echo; \
         curl -sS -m 10 --noproxy '*' http://{OTHER}/ro-plain; echo; \
         getent hosts {DENIED}; echo getent=$?",
        ca = env.ca_str()
    );
    let out = env.run().allow(API).report_only().log(&log).sh(&script).await;
    out.expect_code(0);
    assert_eq!(out.stdout.matches("upstream-ok").count(), 3, "{out:#?}");
    assert_eq!(env.https_paths(OTHER), ["/ro-transparent", "/ro-explicit"]);
    assert_eq!(env.http_paths(OTHER), ["/ro-plain"]);
    // The would-be-denied query is forwarded upstream too.
    assert!(
        env.dns_queries_for(DENIED) > 0,
        "report-only still refused {DENIED}: {out:#?}"
    );
    let log = read_log(&log);
    // OTHER's own DNS answer is the test mapping's (logged as such); DENIED's query is a real one.
    let entries: Vec<_> = entries_for(&log, OTHER)
        .into_iter()
        .chain(entries_for(&log, DENIED))
        .collect();
    let reported = |e: &&&serde_json::Value| {
        let reason = e["reason"].as_str().unwrap_or_default();
        e["decision"] == "allowed" && reason.contains("report_only") && reason.contains("allowlist")
    };
    for (kind, host) in [
        ("dns", DENIED),
        ("tls", OTHER),
        ("connect", OTHER),
        ("http", OTHER),
    ] {
        let ours: Vec<_> = entries
            .iter()
            .filter(|e| e["kind"] == kind && e["host"] == host)
            .collect();
        assert!(
            ours.iter().any(reported),
            "no {kind} entry for {host} allowed with the report-only reason: {log:#?}"
        );
    }
    // The policy denies nothing; the address guard still does (DENIED's upstream answer is a reserved
    // address, stripped whatever the policy).
    for entry in log.iter().filter(|e| e["decision"] == "denied") {
        assert_eq!(
            entry["reason"], "no_public_address",
            "report-only denied by policy: {entry}"
        );
    }
}
