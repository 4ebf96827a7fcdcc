//! TCP that is neither TLS nor HTTP (E4): decided by the name the agent resolved, through the gateway's
//! DNS, to the address it connects to; per agent; client-first and server-first protocols alike.
//!
//! `ssh.test` is a `Dangerous::connect_to` name, so the gateway's DNS answers it with a synthetic address
//! (198.18.0.0/15) without asking the upstream (the brief's "public address from TestDns" is never
//! consulted for such a name); the transparent proxy maps that address back to the name through the same
//! per-agent records it uses for real answers.

use agenthold_egress::log::{Decision, LogKind};

use super::harness::{BANNER, Harness, PUBLIC, Setup, allow};

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

// covers: E4
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn other_tcp_is_decided_by_the_name_the_agent_resolved() {
    let h = Harness::start(
        Setup::new()
            .agents(2)
            .policy(allow(&["ssh.test:22"]))
            .tcp("ssh.test", 22),
    )
    .await;
    let ssh = h.tcp("ssh.test");
    let hello = "SSH-2.0-OpenSSH_9.2 client\r\n";
    let expect = (BANNER.len() + hello.len()).to_string();

    // Agent 0 resolves the name, then speaks SSH-like bytes (they start with a capital letter, like an
    // HTTP method) to the address it got.
    let addr = h.resolve(0, "ssh.test").await.to_string();
    assert!(
        addr.starts_with("198.18.") || addr.starts_with("198.19."),
        "{addr}"
    );
    let client_first = h.py(0, &["raw", &addr, "22", &hex(hello), "no", &expect]).await;
    assert_eq!(
        client_first["received"],
        format!("{BANNER}{hello}"),
        "{client_first}"
    );
    // A server-first protocol: the client waits for the banner before sending anything.
    let server_first = h
        .py(
            0,
            &[
                "raw",
                &addr,
                "22",
                &hex("QUIT\r\n"),
                "wait",
                &(BANNER.len() + 6).to_string(),
            ],
        )
        .await;
    assert_eq!(
        server_first["received"],
        format!("{BANNER}QUIT\r\n"),
        "{server_first}"
    );
    assert_eq!(ssh.accepted(), 2);

    // The same name on a port the policy does not list; an address the agent never resolved.
    let other_port = h.py(0, &["raw", &addr, "2222", &hex(hello), "no", &expect]).await;
    let unresolved = h.py(0, &["raw", PUBLIC, "22", &hex(hello), "no", &expect]).await;
    for (what, r) in [("port 2222", &other_port), ("unresolved address", &unresolved)] {
        assert!(r["received"] == "" || r["error"].is_string(), "{what}: {r}");
    }
    // Agent 1 never resolved the name: agent 0's answer does not count for it.
    let other_agent = h.py(1, &["raw", &addr, "22", &hex(hello), "no", &expect]).await;
    assert!(
        other_agent["received"] == "" || other_agent["error"].is_string(),
        "{other_agent}"
    );
    assert_eq!(
        ssh.accepted(),
        2,
        "none of the refused connections reached the upstream"
    );
    // Control: once agent 1 resolves it too, the same connection works.
    assert_eq!(h.resolve(1, "ssh.test").await.to_string(), addr);
    let now_named = h.py(1, &["raw", &addr, "22", &hex(hello), "no", &expect]).await;
    assert_eq!(now_named["received"], format!("{BANNER}{hello}"), "{now_named}");
    assert_eq!(ssh.accepted(), 3);

    let allowed = h.wait_entries(0, LogKind::Tcp, "ssh.test", 2).await;
    assert!(
        allowed
            .iter()
            .all(|e| e.decision == Decision::Allowed && e.port == Some(22)),
        "{allowed:#?}"
    );
    // No name the agent resolved for the address is allowed on 2222: decided (and logged) by address.
    let refused = h.entries(0, LogKind::Tcp, &addr);
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(
        (refused[0].port, refused[0].decision),
        (Some(2222), Decision::Denied)
    );
    assert_eq!(
        refused[0].reason.as_ref().map(ToString::to_string).as_deref(),
        Some("not_in_allowlist")
    );
    let by_addr = h.entries(0, LogKind::Tcp, PUBLIC);
    assert_eq!(
        (by_addr[0].decision, by_addr[0].port),
        (Decision::Denied, Some(22)),
        "{by_addr:?}"
    );
    let agent1 = h.entries(1, LogKind::Tcp, &addr);
    assert_eq!(agent1[0].decision, Decision::Denied, "{agent1:?}");
    assert!(
        h.dns.queries().iter().all(|q| q.name != "ssh.test"),
        "the override name never went upstream"
    );
    h.close().await;
}
