//! Two `agenthold run` at the same time: both work, each with its own namespaces, policy and log, and
//! neither sees the other's traffic.

use crate::support::{
    API, Env, OTHER, entries_for, finish, namespaces_of, read_log, sandbox_tag, wait_for_file_from,
};

// covers: E1 (separate networks) E8 (a policy per run) E16 (a log per run)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn two_runs_at_once_work_and_keep_to_themselves() {
    let env = Env::new().await;
    // The data dir exists already (first runs at once on a fresh one: see the test below).
    env.run().output(&["true"]).await.expect_code(0);
    let go = env.path("go");
    // Each run allows only its own name, waits until both are up, then talks to its name and tries the
    // other's.
    let script = |me: &str, mine: &str, theirs: &str| {
        format!(
            "ip -o link > {links}.tmp && mv {links}.tmp {links}; while [ ! -e {go} ]; do sleep 0.02; done; \
             curl -sS -m 10 --noproxy '*' --cacert {ca} https://{mine}/{me}-tls; echo; \
             curl -sS -m 10 --noproxy '*' http://{mine}/{me}-http; echo; \
             curl -sS -m 10 --noproxy '*' http://{theirs}/{me}-theirs; echo theirs=$?",
            links = env.path(&format!("links-{me}")).display(),
            go = go.display(),
            ca = env.ca_str(),
        )
    };
    let (log_a, log_b) = (env.path("a.jsonl"), env.path("b.jsonl"));
    let mut a = env
        .run()
        .allow(API)
        .log(&log_a)
        .spawn(&["sh", "-c", &script("a", API, OTHER)]);
    let mut b = env
        .run()
        .allow(OTHER)
        .log(&log_b)
        .spawn(&["sh", "-c", &script("b", OTHER, API)]);
    let (pid_a, pid_b) = (a.id().unwrap(), b.id().unwrap());
    let tag_a = sandbox_tag(&wait_for_file_from(&env.path("links-a"), &mut a).await).unwrap();
    let tag_b = sandbox_tag(&wait_for_file_from(&env.path("links-b"), &mut b).await).unwrap();
    // Both are up at once, each in its own pair of namespaces.
    assert_ne!(tag_a, tag_b);
    assert_eq!(namespaces_of(pid_a).len(), 2);
    assert_eq!(namespaces_of(pid_b).len(), 2);
    std::fs::write(&go, "").unwrap();
    let (a, b) = tokio::join!(finish(a), finish(b));
    for (out, who) in [(&a, "a"), (&b, "b")] {
        out.expect_code(0);
        assert_eq!(out.stdout.matches("upstream-ok").count(), 2, "{who}: {out:#?}");
        assert!(
            out.stdout.contains("theirs=6"),
            "{who} resolved the other run's name: {out:#?}"
        );
    }
    assert_eq!(env.https_paths(API), ["/a-tls"]);
    assert_eq!(env.https_paths(OTHER), ["/b-tls"]);
    assert_eq!(env.http_paths(API), ["/a-http"]);
    assert_eq!(env.http_paths(OTHER), ["/b-http"]);
    for (log, mine, theirs, other_run) in [(&log_a, API, OTHER, "/b-"), (&log_b, OTHER, API, "/a-")] {
        let text = std::fs::read_to_string(log).unwrap();
        assert!(
            !text.contains(other_run),
            "{} logged the other run's traffic:\n{text}",
            log.display()
        );
        let log = read_log(log);
        assert!(
            entries_for(&log, mine).iter().all(|e| e["decision"] == "allowed"),
            "{log:#?}"
        );
        let refused = entries_for(&log, theirs);
        assert!(
            !refused.is_empty() && refused.iter().all(|e| e["decision"] == "denied"),
            "{log:#?}"
        );
        assert!(
            log.iter().all(|e| e["host"] == mine || e["host"] == theirs),
            "{log:#?}"
        );
    }
}

/// The public key of a PEM certificate or private key, as `openssl` prints it.
async fn public_key(args: &[&str], path: &std::path::Path) -> String {
    let out = tokio::process::Command::new("openssl")
        .args(args)
        .arg(path)
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// covers: E14 (the CA is generated on first start) E1 (runs are independent)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn first_runs_at_once_on_a_fresh_data_dir_all_start() {
    let env = Env::new().await;
    let mut failures = Vec::new();
    for round in 0..4 {
        let dir = env.path(&format!("fresh-{round}"));
        let children: Vec<_> = (0..3)
            .map(|_| env.run().data_dir(&dir).spawn(&["true"]))
            .collect();
        for child in children {
            let out = finish(child).await;
            if out.code != Some(0) {
                failures.push(format!(
                    "round {round}: exit {:?}: {}",
                    out.code,
                    out.stderr.trim()
                ));
            }
        }
        // Whoever won, the files on disk must be one pair (else every later run signs with the wrong key).
        let (crt, key) = (dir.join("egress/ca.crt"), dir.join("egress/ca.key"));
        let from_cert = public_key(&["x509", "-noout", "-pubkey", "-in"], &crt).await;
        let from_key = public_key(&["pkey", "-pubout", "-in"], &key).await;
        if from_cert.is_empty() || from_cert != from_key {
            failures.push(format!("round {round}: ca.crt and ca.key are not one pair"));
        }
        // And the data dir still works afterwards.
        let later = env.run().data_dir(&dir).output(&["true"]).await;
        if later.code != Some(0) {
            failures.push(format!(
                "round {round}: a later run fails too: {}",
                later.stderr.trim()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
