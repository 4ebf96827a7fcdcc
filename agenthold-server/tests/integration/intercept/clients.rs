//! Injection with real clients (curl over HTTP/1.1 and h2, Python `requests`, Node `fetch`), on every
//! request of a keep-alive connection, through both ways in (transparent, and CONNECT through
//! `HTTPS_PROXY`); placeholders in other headers and the query string; bodies untouched; presets; the
//! request log.

use super::{
    API_SECRET, B_HOST, World, assert_placeholder, printed, python_with_requests, random_hex, script,
    secret_value,
};
use crate::support::{API, OTHER, entries_for, read_log};

/// Panics unless every echoed request in `requests` carries `Authorization: Bearer value` and none
/// carries a placeholder anywhere.
#[track_caller]
fn assert_all_injected(requests: &[agenthold_testsupport::EchoRequest], value: &str) {
    for r in requests {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {value}").as_str()),
            "{r:#?}"
        );
        let text = format!("{:?}", r.to_json());
        assert!(
            !text.contains("agenthold-placeholder-"),
            "a placeholder reached the upstream: {r:#?}"
        );
    }
}

// covers: E11 E12 E13 E16 (curl HTTP/1.1 and h2, transparent and through HTTPS_PROXY, 3 requests on one
// connection each, and 4 concurrent h2 streams: every request injected)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn curl_h1_and_h2_inject_every_request_on_a_keep_alive_connection() {
    let world = World::new().await;
    let value = secret_value("curl");
    let log = world.path("log.jsonl");
    let mut sh = String::from("echo \"API_KEY=$API_KEY\"; echo \"TOKEN_SEEN=${API_TOKEN:-unset}\"\n");
    for (way, proxy) in [("t", "--noproxy '*'"), ("p", "")] {
        for (proto, flag) in [("h1", "--http1.1"), ("h2", "--http2")] {
            let tag = format!("{proto}{way}");
            sh += &format!(
                "curl -sS -m 10 {proxy} {flag} -H \"Authorization: Bearer $API_KEY\" \
                 -w '{tag} %{{http_version}} %{{num_connects}} %{{response_code}}\\n' \
                 -o /dev/null https://{API}/{tag}-1 -o /dev/null https://{API}/{tag}-2 \
                 -o /dev/null https://{API}/{tag}-3\n"
            );
        }
    }
    // Four concurrent streams on one h2 connection (curl --parallel multiplexes).
    sh += &format!(
        "curl -sS -m 10 --noproxy '*' --http2 -Z -w 'h2z %{{http_version}} %{{num_connects}} %{{response_code}}\\n' \
         -o /dev/null https://{API}/h2z-1 -o /dev/null https://{API}/h2z-2 -o /dev/null https://{API}/h2z-3 \
         -o /dev/null https://{API}/h2z-4\n"
    );
    let out = world
        .run()
        .secrets(API_SECRET)
        .env("API_TOKEN", &value)
        .log(&log)
        .sh(&sh)
        .await;
    out.expect_code(0);
    let vars = printed(&out.stdout);
    assert_placeholder(&vars["API_KEY"]);
    assert_eq!(
        vars["TOKEN_SEEN"], "unset",
        "the value's source variable reached the command"
    );
    let mut parallel: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with("h2z ")).collect();
    parallel.sort_unstable();
    assert_eq!(
        parallel,
        ["h2z 2 0 200", "h2z 2 0 200", "h2z 2 0 200", "h2z 2 1 200"],
        "{out:#?}"
    );
    for tag in ["h1t", "h2t", "h1p", "h2p"] {
        let lines: Vec<Vec<&str>> = out
            .stdout
            .lines()
            .filter(|l| l.starts_with(&format!("{tag} ")))
            .map(|l| l.split(' ').collect())
            .collect();
        let version = if tag.starts_with("h1") { "1.1" } else { "2" };
        assert_eq!(lines.len(), 3, "{tag}: {out:#?}");
        assert!(
            lines.iter().all(|l| l[1] == version && l[3] == "200"),
            "{tag}: {lines:?}"
        );
        // One connection for the three transfers: only the first one connected.
        let connects: Vec<&str> = lines.iter().map(|l| l[2]).collect();
        assert_eq!(
            connects,
            ["1", "0", "0"],
            "{tag}: not one keep-alive connection: {lines:?}"
        );
    }
    let seen = world.echoed(API);
    assert_eq!(seen.len(), 16, "{seen:#?}");
    assert_all_injected(&seen, &value);
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(!log_text.contains(&value), "the log holds the value");
    let log = read_log(&log);
    let http: Vec<_> = entries_for(&log, API)
        .into_iter()
        .filter(|e| e["kind"] == "http")
        .collect();
    assert_eq!(http.len(), 16, "{log:#?}");
    for e in http {
        assert_eq!(e["secret_injected"], true, "{e}");
        assert_eq!(e["secret"], "api", "{e}");
        assert_eq!(e["status"], 200, "{e}");
    }
    // Through HTTPS_PROXY: one CONNECT per curl invocation (h1 and h2), the tunnel terminated by the gateway.
    let connects = entries_for(&log, API)
        .into_iter()
        .filter(|e| e["kind"] == "connect")
        .count();
    assert_eq!(connects, 2, "{log:#?}");
    assert!(
        !out.stdout.contains(&value) && !out.stderr.contains(&value),
        "{out:#?}"
    );
}

/// Python `requests`: a Session (one keep-alive connection) through HTTPS_PROXY (requests' default) and
/// one that ignores the proxy variables (transparent path). Prints the placeholder and what the echo saw.
const REQUESTS_PY: &str = r#"
import json, os, sys, requests
host = sys.argv[1]
key = os.environ["API_KEY"]
print("API_KEY=" + key)
print("BUNDLE=" + os.environ.get("REQUESTS_CA_BUNDLE", ""))
for way, trust_env in (("proxy", True), ("direct", False)):
    s = requests.Session()
    s.trust_env = trust_env
    if not trust_env:
        s.verify = os.environ["REQUESTS_CA_BUNDLE"]
    for i in range(3):
        r = s.get("https://%s/py-%s-%d" % (host, way, i), headers={"Authorization": "Bearer " + key}, timeout=10)
        print("%s-%d=%d" % (way, i, r.status_code))
"#;

// covers: E11 E12 E13 (Python requests: Session keep-alive, through HTTPS_PROXY and transparent)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn python_requests_session_is_injected_on_every_request() {
    let world = World::new().await;
    let value = secret_value("py");
    let log = world.path("log.jsonl");
    let client = script(&world, "requests_client.py", REQUESTS_PY);
    let out = world
        .run()
        .secrets(API_SECRET)
        .env("API_TOKEN", &value)
        .log(&log)
        .share_home()
        .output(&[python_with_requests(), &client, API])
        .await;
    out.expect_code(0);
    let vars = printed(&out.stdout);
    assert_placeholder(&vars["API_KEY"]);
    assert_eq!(vars["BUNDLE"], "/run/agenthold/ca-bundle.pem");
    for way in ["proxy", "direct"] {
        for i in 0..3 {
            assert_eq!(vars[&format!("{way}-{i}")], "200", "{out:#?}");
        }
    }
    let seen = world.echoed(API);
    let paths: Vec<&str> = seen.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/py-proxy-0",
            "/py-proxy-1",
            "/py-proxy-2",
            "/py-direct-0",
            "/py-direct-1",
            "/py-direct-2"
        ]
    );
    assert_all_injected(&seen, &value);
    let log = read_log(&log);
    // The proxied session used one tunnel for its three requests.
    let connects = entries_for(&log, API)
        .into_iter()
        .filter(|e| e["kind"] == "connect")
        .count();
    assert_eq!(connects, 1, "{log:#?}");
    let injected = entries_for(&log, API)
        .into_iter()
        .filter(|e| e["secret_injected"] == true)
        .count();
    assert_eq!(injected, 6, "{log:#?}");
}

/// Node's `fetch` (undici: ignores HTTPS_PROXY, so it takes the transparent path; trusts
/// NODE_EXTRA_CA_CERTS): three requests on its keep-alive pool.
const FETCH_MJS: &str = r#"
const host = process.argv[2];
const key = process.env.API_KEY;
console.log("API_KEY=" + key);
for (let i = 0; i < 3; i++) {
  const r = await fetch(`https://${host}/node-${i}`, { headers: { authorization: `Bearer ${key}` } });
  const body = await r.json();
  console.log(`node-${i}=${r.status} ${body.version}`);
}
"#;

// covers: E11 E12 E13 E14 (Node fetch through the transparent path, NODE_EXTRA_CA_CERTS)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn node_fetch_is_injected_through_the_transparent_path() {
    let world = World::new().await;
    let value = secret_value("node");
    let log = world.path("log.jsonl");
    let client = script(&world, "fetch_client.mjs", FETCH_MJS);
    let out = world
        .run()
        .secrets(API_SECRET)
        .env("API_TOKEN", &value)
        .log(&log)
        .output(&["node", &client, API])
        .await;
    out.expect_code(0);
    let vars = printed(&out.stdout);
    assert_placeholder(&vars["API_KEY"]);
    for i in 0..3 {
        assert!(vars[&format!("node-{i}")].starts_with("200 "), "{out:#?}");
    }
    let seen = world.echoed(API);
    assert_eq!(seen.len(), 3, "{seen:#?}");
    assert_all_injected(&seen, &value);
    let log = read_log(&log);
    assert!(
        entries_for(&log, API).iter().all(|e| e["kind"] != "connect"),
        "fetch used the explicit proxy: {log:#?}"
    );
    let injected = entries_for(&log, API)
        .into_iter()
        .filter(|e| e["secret_injected"] == true)
        .count();
    assert_eq!(injected, 3, "{log:#?}");
}

// covers: E13 (as amended: the placeholder is replaced in the further headers and, percent-encoded, the
// query parameters a rule's `also_in` names; bodies are never rewritten)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn placeholders_are_replaced_where_also_in_names_them_bodies_never() {
    let world = World::new().await;
    // Characters that must be percent-encoded in a query, and that are fine in a header.
    let value = format!("v+1/2=3&x?y#z%-{}", random_hex(8));
    let encoded = value
        .replace('%', "%25")
        .replace('+', "%2B")
        .replace('/', "%2F")
        .replace('=', "%3D");
    let encoded = encoded
        .replace('&', "%26")
        .replace('?', "%3F")
        .replace('#', "%23");
    let mut sh = String::new();
    for flag in ["--http1.1", "--http2"] {
        sh += &format!(
            "curl -sS -m 10 --noproxy '*' {flag} -o /dev/null -H \"X-Extra: k=$API_KEY;again=$API_KEY\" \
             -H 'Content-Type: text/plain' --data-binary \"body=$API_KEY\" \
             \"https://{API}/q{flag}?key=$API_KEY&x=1\"\n"
        );
    }
    let out = world
        .run()
        .secrets(concat!(
            "- name: api\n  value_env: API_TOKEN\n  env: API_KEY\n  hosts: [api.example.test]\n  ",
            "header: Authorization\n  template: \"Bearer {{.Value}}\"\n  ",
            "also_in: {headers: [x-extra], query: [key]}\n",
        ))
        .env("API_TOKEN", &value)
        .sh(&sh)
        .await;
    out.expect_code(0);
    let seen = world.echoed(API);
    assert_eq!(seen.len(), 2, "{seen:#?}");
    for r in &seen {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {value}").as_str())
        );
        assert_eq!(
            r.header("x-extra"),
            Some(format!("k={value};again={value}").as_str())
        );
        let (path, query) = r.path.split_once('?').unwrap();
        assert!(path.starts_with("/q--http"), "{r:#?}");
        assert_eq!(query, format!("key={encoded}&x=1"), "{r:#?}");
        let body = String::from_utf8(r.body.clone()).unwrap();
        assert!(
            body.starts_with("body=agenthold-placeholder-"),
            "the body was rewritten: {body:?}"
        );
        assert!(!body.contains(&value), "the body was rewritten: {body:?}");
    }
}

// covers: E11 (presets: anthropic x-api-key, openai Bearer, github Bearer on api.github.com; each only on
// its own host)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn presets_set_their_headers_on_their_hosts_only() {
    let world = World::new().await;
    let (anthropic, openai, github) = (
        secret_value("sk-ant"),
        secret_value("sk-oai"),
        secret_value("ghp"),
    );
    let secrets = "- name: anthropic\n  preset: anthropic\n  value_env: ANT\n  env: ANTHROPIC_API_KEY\n\
                   - name: openai\n  preset: openai\n  value_env: OAI\n  env: OPENAI_API_KEY\n\
                   - name: github\n  preset: github\n  value_env: GHT\n  env: GH_TOKEN\n";
    let mut sh = String::from(
        "echo \"ANT=$ANTHROPIC_API_KEY\"; echo \"OAI=$OPENAI_API_KEY\"; echo \"GH=$GH_TOKEN\"\n",
    );
    for host in ["api.anthropic.com", "api.openai.com", "api.github.com"] {
        sh += &format!("curl -sS -m 10 -o /dev/null -w '{host}=%{{response_code}}\\n' https://{host}/v1/x\n");
    }
    let out = world
        .run()
        .secrets(secrets)
        .env("ANT", &anthropic)
        .env("OAI", &openai)
        .env("GHT", &github)
        .sh(&sh)
        .await;
    out.expect_code(0);
    let vars = printed(&out.stdout);
    for var in ["ANT", "OAI", "GH"] {
        assert_placeholder(&vars[var]);
    }
    for host in ["api.anthropic.com", "api.openai.com", "api.github.com"] {
        assert_eq!(vars[host], "200", "{out:#?}");
    }
    let one = |host: &str| {
        let mut seen = world.echoed(host);
        assert_eq!(seen.len(), 1, "{host}: {seen:#?}");
        seen.remove(0)
    };
    let ant = one("api.anthropic.com");
    assert_eq!(ant.header("x-api-key"), Some(anthropic.as_str()));
    assert_eq!(ant.header("authorization"), None);
    let oai = one("api.openai.com");
    assert_eq!(
        oai.header("authorization"),
        Some(format!("Bearer {openai}").as_str())
    );
    assert_eq!(oai.header("x-api-key"), None);
    let gh = one("api.github.com");
    assert_eq!(
        gh.header("authorization"),
        Some(format!("Bearer {github}").as_str())
    );
    for r in [&ant, &oai, &gh] {
        let text = format!("{:?}", r.to_json());
        for v in [&anthropic, &openai, &github] {
            let own = r.header("x-api-key") == Some(v.as_str())
                || r.header("authorization") == Some(format!("Bearer {v}").as_str());
            assert!(
                own || !text.contains(v.as_str()),
                "a value reached another provider: {r:#?}"
            );
        }
    }
}

// covers: E16 (the request log: secret_injected and the secret's name on injected requests, never the
// value; nothing injected, nothing named, elsewhere)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn request_log_names_injected_secrets_never_their_values() {
    let world = World::new().await;
    let (a, b) = (secret_value("log-a"), secret_value("log-b"));
    let secrets = format!(
        "{}- name: bee\n  value: {b}\n  env: B_KEY\n  hosts: [{B_HOST}]\n  header: X-Api-Key\n",
        API_SECRET
    );
    let log = world.path("log.jsonl");
    let sh = format!(
        "curl -sS -m 10 --noproxy '*' -o /dev/null https://{API}/injected-a\n\
         curl -sS -m 10 --noproxy '*' -o /dev/null https://{B_HOST}/injected-b\n\
         curl -sS -m 10 --noproxy '*' -o /dev/null --cacert {ca} https://{OTHER}/spliced\n\
         curl -sS -m 10 --noproxy '*' -o /dev/null http://{API}/plain\n",
        ca = world.upstream_ca()
    );
    let out = world
        .run()
        .secrets(&secrets)
        .env("API_TOKEN", &a)
        .log(&log)
        .sh(&sh)
        .await;
    out.expect_code(0);
    let text = std::fs::read_to_string(&log).unwrap();
    for v in [&a, &b] {
        assert!(!text.contains(v.as_str()), "the log holds a value: {text}");
    }
    let log = read_log(&log);
    let find = |kind: &str, host: &str| -> Vec<&serde_json::Value> {
        entries_for(&log, host)
            .into_iter()
            .filter(|e| e["kind"] == kind)
            .collect()
    };
    let a_entries = find("http", API);
    assert_eq!(a_entries.len(), 2, "{log:#?}");
    let injected_a = a_entries.iter().find(|e| e["path"] == "/injected-a").unwrap();
    assert_eq!(
        (&injected_a["secret_injected"], &injected_a["secret"]),
        (&true.into(), &"api".into())
    );
    let plain = a_entries.iter().find(|e| e["path"] == "/plain").unwrap();
    assert_eq!(plain["port"], 80);
    assert_eq!(
        (&plain["secret_injected"], &plain["secret"]),
        (&false.into(), &serde_json::Value::Null)
    );
    let b_entries = find("http", B_HOST);
    assert_eq!(b_entries.len(), 1, "{log:#?}");
    assert_eq!(
        (&b_entries[0]["secret_injected"], &b_entries[0]["secret"]),
        (&true.into(), &"bee".into())
    );
    // The spliced connection is one tls entry: no request seen, nothing injected.
    let spliced = find("tls", OTHER);
    assert_eq!(spliced.len(), 1, "{log:#?}");
    assert_eq!(spliced[0]["secret_injected"], false);
    assert!(find("http", OTHER).is_empty(), "{log:#?}");
    assert_eq!(world.echoed(B_HOST)[0].header("x-api-key"), Some(b.as_str()));
    assert_eq!(world.echoed(OTHER)[0].header("authorization"), None);
}
