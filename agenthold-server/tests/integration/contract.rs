//! The `agenthold run` contract (issue 3, item 7): every flag is accepted, no `--allow` means the open
//! policy, the command's exit code comes back, bad input fails clearly, and `--log` writes JSON lines with
//! the contract's field names, exactly as written, plus only documented additions (the contract may be
//! added to: `secret`, the name of an injected secret, issue 4 item 6c).

use std::collections::BTreeSet;

use crate::support::{API, CONTRACT_FIELDS, DENIED, Env, UNLISTED, agenthold, entries_for, finish, read_log};

// covers: E7 E8 E16 E17 (every flag of the contract in one command line)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn every_flag_is_accepted() {
    let env = Env::new().await;
    let log = env.path("log.jsonl");
    let out = env
        .run()
        .allow(API)
        .allow("*.example.test:8443")
        .report_only()
        .log(&log)
        .output(&["true"])
        .await;
    out.expect_code(0);
    assert!(log.exists(), "--log FILE was not created");
    assert!(env.path("data").is_dir(), "--data-dir was not used");
}

// covers: E8 (no --allow: the open policy)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn no_allow_means_open_policy() {
    let env = Env::new().await;
    let log = env.path("log.jsonl");
    let script = format!(
        "curl -sS -m 10 --noproxy '*' --cacert {ca} https://{API}/open; echo; \
         getent hosts {UNLISTED}; echo getent=$?",
        ca = env.ca_str()
    );
    let out = env.run().log(&log).sh(&script).await;
    out.expect_code(0);
    assert!(out.stdout.contains("upstream-ok"), "{out:#?}");
    assert_eq!(env.https_paths(API), ["/open"]);
    // Open: the unlisted name is forwarded upstream (which does not know it), not refused by policy.
    assert!(
        env.dns_queries_for(UNLISTED) > 0,
        "the open policy did not forward {UNLISTED}"
    );
    let log = read_log(&log);
    let denied: Vec<_> = log.iter().filter(|e| e["decision"] == "denied").collect();
    assert!(denied.is_empty(), "the open policy denied something: {denied:#?}");
}

// covers: issue 3 item 7 (exit code of the command)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn exit_code_of_the_command_is_returned() {
    let env = Env::new().await;
    for code in [0, 7, 255] {
        env.run().sh(&format!("exit {code}")).await.expect_code(code);
    }
    // Killed by a signal: 128 + N, like a shell.
    env.run().sh("kill -KILL $$").await.expect_code(128 + 9);
    env.run().sh("kill -TERM $$").await.expect_code(128 + 15);
}

// covers: issue 3 item 7 (a missing command fails with a message)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn missing_command_fails_with_a_message() {
    let env = Env::new().await;
    // No command at all: a usage error before anything is set up.
    for args in [&["run", "--"][..], &["run"][..], &["run", "--allow", API][..]] {
        let out = finish(agenthold().args(args).spawn().unwrap()).await;
        assert!(matches!(out.code, Some(c) if c != 0), "{args:?}: {out:#?}");
        assert!(
            out.stderr.contains("COMMAND"),
            "{args:?}: the message does not say what is missing: {out:#?}"
        );
    }
    // A command that does not exist: non-zero (127, like a shell) and its name in the message.
    let out = env
        .run()
        .output(&["/nonexistent/agenthold-no-such-command"])
        .await;
    assert!(matches!(out.code, Some(c) if c != 0), "{out:#?}");
    assert!(
        out.stderr.contains("agenthold-no-such-command"),
        "the message does not name the command: {out:#?}"
    );
}

// covers: E8 (policy grammar errors are the caller's: exit 2, the entry named)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn bad_allow_entry_exits_2_naming_the_entry() {
    let env = Env::new().await;
    for entry in [
        "bad entry",
        "x.example.test:99999",
        "*.",
        "exa_mple..test",
        "10.0.0.0/33:443",
        "",
    ] {
        let out = env.run().allow(API).allow(entry).output(&["true"]).await;
        out.expect_code(2);
        assert!(
            out.stderr.contains(&format!("{entry:?}")),
            "the message does not name {entry:?}: {out:#?}"
        );
        assert!(
            crate::support::namespaces_of(out.pid).is_empty(),
            "bad input still created namespaces"
        );
    }
}

// covers: E17 (the other flags' values are checked before anything is set up)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn bad_values_of_other_flags_exit_2() {
    let env = Env::new().await;
    let cases: [(&str, &str, &str); 4] = [
        (
            "--dangerous-connect-to",
            "api.example.test=127.0.0.1:1",
            "api.example.test",
        ),
        (
            "--dangerous-connect-to",
            "api.example.test:443=localhost",
            "localhost",
        ),
        ("--dns-upstream", "dns.example.test:53", "dns.example.test"),
        (
            "--dangerous-upstream-ca",
            "/nonexistent/ca.pem",
            "/nonexistent/ca.pem",
        ),
    ];
    for (flag, value, named) in cases {
        let out = finish(
            agenthold()
                .args(["run", "--data-dir"])
                .arg(env.path("data"))
                .args([flag, value, "--", "true"])
                .spawn()
                .unwrap(),
        )
        .await;
        assert_eq!(out.code, Some(2), "{flag} {value}: {out:#?}");
        assert!(
            out.stderr.contains(named),
            "{flag} {value}: the message does not name {named}: {out:#?}"
        );
    }
}

// covers: issue 3 item 7 (everything after `--` belongs to the command)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn arguments_after_the_separator_reach_the_command_untouched() {
    let env = Env::new().await;
    let out = env
        .run()
        .output(&["printf", "%s|", "--allow", "x", "--log", "/y", "--", "-z", ""])
        .await;
    out.expect_code(0);
    assert_eq!(out.stdout, "--allow|x|--log|/y|--|-z||");
}

/// A run that produces allowed and denied entries of several kinds.
async fn mixed_traffic_log(env: &Env) -> Vec<serde_json::Value> {
    let log = env.path("log.jsonl");
    let script = format!(
        "curl -sS -m 10 --noproxy '*' --cacert {ca} https://{API}/tls; \
         curl -sS -m 10 --noproxy '*' http://{API}/plain; \
         curl -sS -m 10 --cacert {ca} https://{API}/connect; \
         curl -sS -m 10 --noproxy '*' https://{DENIED}/; echo resolve=$?; \
         curl -sS -m 10 --cacert {ca} https://{DENIED}/; echo connect=$?",
        ca = env.ca_str()
    );
    let out = env.run().allow(API).log(&log).sh(&script).await;
    out.expect_code(0);
    assert_eq!(env.https_paths(API), ["/tls", "/connect"], "{out:#?}");
    read_log(&log)
}

// covers: E16 (the request log as JSON lines, field names of the contract, denied entries with a reason)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn log_is_json_lines_with_the_contract_fields() {
    let env = Env::new().await;
    let log = mixed_traffic_log(&env).await;
    assert!(!log.is_empty());
    for entry in &log {
        let object = entry.as_object().expect("every line is a JSON object");
        for field in CONTRACT_FIELDS {
            assert!(object.contains_key(field), "missing {field:?} in {entry}");
        }
        assert!(
            matches!(entry["decision"].as_str(), Some("allowed" | "denied")),
            "decision in {entry}"
        );
        assert!(
            entry["time"]
                .as_str()
                .is_some_and(|t| t.contains('T') && t.ends_with('Z')),
            "time: {entry}"
        );
        assert_eq!(
            entry["agent"].as_str().map(str::is_empty),
            Some(false),
            "agent: {entry}"
        );
        assert!(entry["kind"].is_string(), "kind: {entry}");
        assert!(entry["secret_injected"].is_boolean(), "secret_injected: {entry}");
        assert!(
            entry["bytes_up"].is_u64() && entry["bytes_down"].is_u64(),
            "bytes: {entry}"
        );
    }
    let kinds: BTreeSet<_> = entries_for(&log, API)
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    for kind in ["dns", "tls", "http", "connect"] {
        assert!(kinds.contains(kind), "no {kind} entry for {API}: {log:#?}");
    }
    let tls = entries_for(&log, API)
        .into_iter()
        .find(|e| e["kind"] == "tls")
        .unwrap();
    assert_eq!(tls["decision"], "allowed");
    assert!(
        tls["bytes_down"].as_u64() > Some(0),
        "a spliced connection is logged with its bytes: {tls}"
    );
    let plain = entries_for(&log, API)
        .into_iter()
        .find(|e| e["kind"] == "http")
        .unwrap();
    assert_eq!(
        (&plain["method"], &plain["path"], &plain["status"], &plain["port"]),
        (&"GET".into(), &"/plain".into(), &200.into(), &80.into())
    );
    let denied = entries_for(&log, DENIED);
    assert!(!denied.is_empty(), "no entry for the disallowed host: {log:#?}");
    for entry in &denied {
        assert_eq!(entry["decision"], "denied", "{entry}");
        assert!(
            entry["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "a denial without a reason: {entry}"
        );
    }
    assert!(
        denied.iter().any(|e| e["kind"] == "dns"),
        "the refused DNS query is not logged: {denied:#?}"
    );
}

/// The type a log field must have.
#[derive(Debug, Clone, Copy)]
enum Type {
    /// A non-empty string.
    Text,
    /// A string or null.
    OptText,
    /// A port or status number (u16) or null.
    OptU16,
    /// A count of bytes.
    Count,
    /// `true` or `false`.
    Bool,
    /// One of these strings.
    OneOf(&'static [&'static str]),
    /// An RFC 3339 time in UTC (`…T…Z`).
    Time,
}

impl Type {
    fn accepts(self, value: &serde_json::Value) -> bool {
        let u16_or_null =
            |v: &serde_json::Value| v.is_null() || v.as_u64().is_some_and(|n| n <= u64::from(u16::MAX));
        match self {
            Self::Text => value.as_str().is_some_and(|s| !s.is_empty()),
            Self::OptText => value.is_null() || value.is_string(),
            Self::OptU16 => u16_or_null(value),
            Self::Count => value.is_u64(),
            Self::Bool => value.is_boolean(),
            Self::OneOf(allowed) => value.as_str().is_some_and(|s| allowed.contains(&s)),
            Self::Time => value.as_str().is_some_and(|t| {
                t.len() >= 20 && t.as_bytes()[4] == b'-' && t.as_bytes()[10] == b'T' && t.ends_with('Z')
            }),
        }
    }
}

/// The contract's 13 fields (issue 3, items 6 and 7) with their types.
const CONTRACT_TYPES: [(&str, Type); 13] = [
    ("time", Type::Time),
    ("agent", Type::Text),
    ("kind", Type::OneOf(&["dns", "tcp", "tls", "http", "connect"])),
    ("host", Type::OptText),
    ("port", Type::OptU16),
    ("method", Type::OptText),
    ("path", Type::OptText),
    ("status", Type::OptU16),
    ("decision", Type::OneOf(&["allowed", "denied"])),
    ("reason", Type::OptText),
    ("secret_injected", Type::Bool),
    ("bytes_up", Type::Count),
    ("bytes_down", Type::Count),
];

/// Fields beyond the contract, each documented: `secret` is the name of the injected secret, never its
/// value (docs/secrets.md, issue 4 item 6c).
const DOCUMENTED_EXTRAS: [(&str, Type); 3] = [
    ("secret", Type::OptText),
    ("phase", Type::OptText),
    ("seq", Type::Count),
];

/// Panics unless `entry` has every contract field with its type and nothing undocumented beyond them.
#[track_caller]
fn assert_contract_entry(entry: &serde_json::Value) {
    let object = entry.as_object().expect("every line is a JSON object");
    for (field, ty) in CONTRACT_TYPES.iter().chain(&DOCUMENTED_EXTRAS) {
        let is_extra = DOCUMENTED_EXTRAS.iter().any(|(f, _)| f == field);
        match object.get(*field) {
            Some(value) => assert!(ty.accepts(value), "{field:?} should be {ty:?}: {entry}"),
            None => assert!(is_extra, "missing contract field {field:?} in {entry}"),
        }
    }
    let undocumented: Vec<&String> = object
        .keys()
        .filter(|k| {
            !CONTRACT_TYPES
                .iter()
                .chain(&DOCUMENTED_EXTRAS)
                .any(|(f, _)| f == k)
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "undocumented fields {undocumented:?} in {entry}"
    );
    // A secret's name only where one was injected.
    if !entry["secret"].is_null() {
        assert_eq!(
            entry["secret_injected"], true,
            "a secret named without an injection: {entry}"
        );
    }
}

// covers: E16 (the contract's 13 fields, exactly as written, with their types; extras only documented ones)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn log_has_the_contract_fields_and_only_documented_extras() {
    let env = Env::new().await;
    // Contract fields are exact names: a near miss must not pass for one.
    assert_eq!(
        CONTRACT_TYPES.map(|(f, _)| f),
        CONTRACT_FIELDS,
        "the typed list is the contract's"
    );
    let log = mixed_traffic_log(&env).await;
    assert!(!log.is_empty());
    for entry in &log {
        assert_contract_entry(entry);
    }
    // A run that injects a secret: `secret` then carries its name (never the value).
    let value = "contract-secret-value-4bd1e7";
    let secrets = env.path("secrets.yaml");
    std::fs::write(
        &secrets,
        format!(
            "- name: api-token\n  value: {value}\n  hosts: [{API}]\n  header: Authorization\n  \
             template: \"Bearer {{{{.Value}}}}\"\n"
        ),
    )
    .unwrap();
    let file = env.path("secret-log.jsonl");
    let out = env
        .run()
        .allow(API)
        .log(&file)
        .extra_flag("--secrets", &secrets)
        .sh(&format!("curl -sS -m 10 --noproxy '*' https://{API}/with-secret"))
        .await;
    out.expect_code(0);
    assert!(out.stdout.contains("upstream-ok"), "{out:#?}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(value), "the secret's value is in the log:\n{text}");
    let log = read_log(&file);
    for entry in &log {
        assert_contract_entry(entry);
    }
    assert!(
        log.iter()
            .any(|e| e["secret_injected"] == true && e["secret"] == "api-token"),
        "no entry names the injected secret: {log:#?}"
    );
}
