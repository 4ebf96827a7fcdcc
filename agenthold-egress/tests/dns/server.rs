//! The server on loopback: what a sandbox gets for allowed, unlisted, rebinding, big and malformed queries.

use super::*;

#[tokio::test]
async fn allowed_name_is_answered_remembered_and_logged() {
    let dns = TestDns::start(
        [("www.public.test", vec![IpAddr::V4(PUBLIC), ip(PUBLIC_V6)])],
        300,
    )
    .await;
    let h = serve_open(&dns).await;
    let q = query("WWW.Public.Test.", RecordType::A, false);
    let reply = ask_udp(h.handle.udp_addr(), &q).await;
    assert_eq!(reply.response_code, ResponseCode::NoError);
    assert!(reply.recursion_available);
    assert_eq!(a_records(&reply), [IpAddr::V4(PUBLIC)]);
    // Records maps the address back to the normalised question name, for this agent only.
    assert_eq!(
        h.records.names_for(&agent(), IpAddr::V4(PUBLIC)),
        ["www.public.test"]
    );
    assert!(
        h.records
            .names_for(&AgentId::new("other").unwrap(), IpAddr::V4(PUBLIC))
            .is_empty()
    );
    let log = h.log.snapshot(&agent());
    let entry = log.last().unwrap();
    assert_eq!(entry.kind, LogKind::Dns);
    assert_eq!(entry.host.as_deref(), Some("www.public.test"));
    assert_eq!(entry.port, Some(53));
    assert_eq!(entry.method.as_deref(), Some("A"));
    assert_eq!(entry.status, Some(0));
    assert_eq!(entry.decision, Decision::Allowed);
    assert_eq!(entry.reason, None);
}

#[tokio::test]
async fn unlisted_name_gets_nxdomain_without_any_upstream_query() {
    // covers: E9
    let dns = TestDns::start(
        [
            ("allowed.test", vec![IpAddr::V4(PUBLIC)]),
            ("secret.test", vec![IpAddr::V4(PUBLIC)]),
        ],
        300,
    )
    .await;
    let h = serve(
        Upstream::new(dns.addr()),
        allowlist(&["allowed.test"]),
        Records::new(),
        SyntheticNames::new(),
    )
    .await;
    for (name, rtype) in [
        ("secret.test.", RecordType::A),
        ("c2VjcmV0.exfil.test.", RecordType::TXT),
        ("sub.allowed.test.", RecordType::A),
    ] {
        let reply = ask_udp(h.handle.udp_addr(), &query(name, rtype, true)).await;
        assert_eq!(reply.response_code, ResponseCode::NXDomain, "{name}");
        assert!(reply.answers.is_empty());
    }
    assert!(dns.queries().is_empty(), "the upstream saw {:?}", dns.queries());
    let log = h.log.snapshot(&agent());
    assert_eq!(log.len(), 3);
    assert!(log.iter().all(|e| e.decision == Decision::Denied
        && e.reason.as_ref().map(ToString::to_string).as_deref() == Some("not_in_allowlist")));
    assert_eq!(log[1].method.as_deref(), Some("TXT"));
    assert_eq!(log[1].status, Some(3));

    // The listed name is forwarded.
    let reply = ask_udp(h.handle.udp_addr(), &query("allowed.test.", RecordType::A, true)).await;
    assert_eq!(a_records(&reply), [IpAddr::V4(PUBLIC)]);
    assert_eq!(dns.queries().len(), 1);
}

#[tokio::test]
async fn private_and_metadata_addresses_are_stripped_from_answers() {
    // covers: E6
    let dns = TestDns::start(
        [
            (
                "rebind.test",
                vec![
                    ip("127.0.0.1"),
                    ip("169.254.169.254"),
                    ip("10.1.2.3"),
                    IpAddr::V4(PUBLIC),
                    ip("198.18.0.1"),
                ],
            ),
            ("metadata.test", vec![ip("169.254.169.254")]),
            ("loopback.test", vec![ip("127.0.0.1"), ip("10.0.0.1")]),
        ],
        300,
    )
    .await;
    let h = serve_open(&dns).await;
    let reply = ask_udp(h.handle.udp_addr(), &query("rebind.test.", RecordType::A, true)).await;
    assert_eq!(a_records(&reply), [IpAddr::V4(PUBLIC)]);
    assert!(h.records.names_for(&agent(), ip("127.0.0.1")).is_empty());
    assert!(
        h.records.names_for(&agent(), ip("198.18.0.1")).is_empty(),
        "an upstream cannot forge a synthetic mapping"
    );
    for name in ["metadata.test.", "loopback.test."] {
        let reply = ask_udp(h.handle.udp_addr(), &query(name, RecordType::A, false)).await;
        assert_eq!(reply.response_code, ResponseCode::NoError);
        assert!(a_records(&reply).is_empty(), "{name}: {reply}");
    }
    let log = h.log.snapshot(&agent());
    assert_eq!(log[0].decision, Decision::Allowed);
    assert_eq!(
        log[0].reason.as_ref().map(ToString::to_string).as_deref(),
        Some("blocked_address")
    );
    assert_eq!(log[1].decision, Decision::Denied);
    assert_eq!(
        log[1].reason.as_ref().map(ToString::to_string).as_deref(),
        Some("no_public_address")
    );
}

#[tokio::test]
async fn aaaa_records_are_stripped() {
    let dns = TestDns::start([("dual.test", vec![IpAddr::V4(PUBLIC), ip(PUBLIC_V6)])], 300).await;
    let h = serve_open(&dns).await;
    let reply = ask_udp(h.handle.udp_addr(), &query("dual.test.", RecordType::AAAA, true)).await;
    assert_eq!(reply.response_code, ResponseCode::NoError);
    assert!(reply.answers.is_empty());
    assert_eq!(
        dns.queries().len(),
        1,
        "AAAA questions are still forwarded (NODATA keeps the name's existence)"
    );
    let reply = ask_udp(h.handle.udp_addr(), &query("dual.test.", RecordType::A, true)).await;
    assert_eq!(a_records(&reply), [IpAddr::V4(PUBLIC)]);
}

#[tokio::test]
async fn records_expire_and_the_cap_holds() {
    let dns = TestDns::start(
        [
            ("one.test", vec![ip("93.184.216.1")]),
            ("two.test", vec![ip("93.184.216.2")]),
            ("three.test", vec![ip("93.184.216.3")]),
        ],
        0,
    )
    .await;
    let records = Records::with_limits(2, Duration::from_millis(800));
    let h = serve(
        Upstream::new(dns.addr()),
        NetworkPolicy::open(),
        records,
        SyntheticNames::new(),
    )
    .await;
    for name in ["one.test.", "two.test.", "three.test."] {
        ask_udp(h.handle.udp_addr(), &query(name, RecordType::A, false)).await;
    }
    assert_eq!(h.records.len(&agent()), 2);
    assert!(
        h.records.names_for(&agent(), ip("93.184.216.1")).is_empty(),
        "the oldest went first"
    );
    assert_eq!(h.records.names_for(&agent(), ip("93.184.216.3")), ["three.test"]);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        h.records.names_for(&agent(), ip("93.184.216.3")).is_empty(),
        "expired"
    );
}

#[tokio::test]
async fn policy_change_applies_to_the_next_query() {
    // covers: E8
    let dns = TestDns::start([("later.test", vec![IpAddr::V4(PUBLIC)])], 300).await;
    let h = serve(
        Upstream::new(dns.addr()),
        allowlist(&["other.test"]),
        Records::new(),
        SyntheticNames::new(),
    )
    .await;
    let q = query("later.test.", RecordType::A, false);
    assert_eq!(
        ask_udp(h.handle.udp_addr(), &q).await.response_code,
        ResponseCode::NXDomain
    );
    h.policy.set(agent(), allowlist(&["*.test"]));
    let reply = ask_udp(h.handle.udp_addr(), &query("later.test.", RecordType::A, false)).await;
    assert_eq!(a_records(&reply), [IpAddr::V4(PUBLIC)]);
    h.policy.set(agent(), allowlist(&["other.test"]));
    let reply = ask_udp(h.handle.udp_addr(), &query("later.test.", RecordType::A, false)).await;
    assert_eq!(reply.response_code, ResponseCode::NXDomain);
    // Report-only: forwarded, logged with what an allowlist would have said.
    h.policy.set(
        agent(),
        NetworkPolicy::parse(PolicyMode::ReportOnly, &["other.test"]).unwrap(),
    );
    let reply = ask_udp(h.handle.udp_addr(), &query("later.test.", RecordType::A, false)).await;
    assert_eq!(a_records(&reply), [IpAddr::V4(PUBLIC)]);
    let entry = h.log.snapshot(&agent()).pop().unwrap();
    assert_eq!(entry.decision, Decision::Allowed);
    assert_eq!(
        entry.reason.as_ref().map(ToString::to_string).as_deref(),
        Some("report_only:not_in_allowlist")
    );
    // An agent the policy does not know is denied.
    h.policy.remove(&agent());
    let reply = ask_udp(h.handle.udp_addr(), &query("later.test.", RecordType::A, false)).await;
    assert_eq!(reply.response_code, ResponseCode::NXDomain);
    // Only the first allowed query reached the upstream: the report-only one was answered from the agent's
    // cache, and the denied ones never left the gateway.
    assert_eq!(dns.queries().len(), 1);
}

#[tokio::test]
async fn big_answer_sets_tc_over_udp_and_comes_whole_over_tcp() {
    let many: Vec<IpAddr> = (1..=40).map(|i| IpAddr::from([93, 184, 216, i])).collect();
    let dns = TestDns::start([("big.test", many.clone())], 300).await;
    let h = serve_open(&dns).await;
    let q = query("big.test.", RecordType::A, false);
    let reply = ask_udp(h.handle.udp_addr(), &q).await;
    assert!(reply.truncation, "no EDNS: 512 bytes at most");
    assert!(reply.answers.is_empty());
    // With EDNS 1232 it fits.
    let reply = ask_udp(h.handle.udp_addr(), &query("big.test.", RecordType::A, true)).await;
    assert!(!reply.truncation);
    assert_eq!(a_records(&reply).len(), 40);
    // Over TCP, several queries on one connection.
    let mut stream = TcpStream::connect(h.handle.tcp_addr()).await.unwrap();
    for _ in 0..3 {
        let q = query("big.test.", RecordType::A, false);
        let reply = send_tcp(&mut stream, &q.to_vec().unwrap()).await;
        assert_eq!(reply.id, q.id);
        assert!(!reply.truncation);
        assert_eq!(a_records(&reply), many);
    }
}

#[tokio::test]
async fn malformed_packets_and_multiple_questions_do_not_crash_the_server() {
    let dns = TestDns::start([("ok.test", vec![IpAddr::V4(PUBLIC)])], 300).await;
    let h = serve_open(&dns).await;
    let addr = h.handle.udp_addr();
    // Shorter than a header, or a response: no answer at all.
    for junk in [
        &b""[..],
        b"\x12",
        b"\x12\x34\x81\x80\x00\x00\x00\x00\x00\x00\x00\x00",
    ] {
        let client = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        client.send_to(junk, addr).await.unwrap();
        let mut buf = [0u8; 512];
        assert!(
            tokio::time::timeout(Duration::from_millis(200), client.recv(&mut buf))
                .await
                .is_err()
        );
    }
    // A query header with a broken body: FORMERR with the same id.
    let garbage = b"\xab\xcd\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xff\xff\xff";
    let reply = Message::from_vec(&exchange_udp(addr, garbage).await.unwrap()).unwrap();
    assert_eq!((reply.id, reply.response_code), (0xabcd, ResponseCode::FormErr));
    // Two questions: FORMERR, nothing forwarded.
    let mut two = query("ok.test.", RecordType::A, false);
    two.add_query(Query::query(
        Name::from_ascii("ok.test.").unwrap(),
        RecordType::TXT,
    ));
    let reply = Message::from_vec(&exchange_udp(addr, &two.to_vec().unwrap()).await.unwrap()).unwrap();
    assert_eq!(reply.response_code, ResponseCode::FormErr);
    // Another opcode: NOTIMP.
    let mut notify = query("ok.test.", RecordType::SOA, false);
    notify.metadata.op_code = OpCode::Notify;
    let reply = Message::from_vec(&exchange_udp(addr, &notify.to_vec().unwrap()).await.unwrap()).unwrap();
    assert_eq!(reply.response_code, ResponseCode::NotImp);
    // A name that is an address is invalid: NXDOMAIN, logged invalid_name.
    let reply = ask_udp(addr, &query("1.2.3.4.", RecordType::A, false)).await;
    assert_eq!(reply.response_code, ResponseCode::NXDomain);
    // A TCP length prefix beyond the cap closes the connection.
    let mut stream = TcpStream::connect(h.handle.tcp_addr()).await.unwrap();
    stream.write_all(&[0xff, 0xff, 0, 0]).await.unwrap();
    let mut byte = [0u8; 1];
    // Closed with unread bytes: the client sees a reset or an end of stream.
    assert!(matches!(stream.read(&mut byte).await, Ok(0) | Err(_)));
    // The server still works.
    let reply = ask_udp(addr, &query("ok.test.", RecordType::A, false)).await;
    assert_eq!(a_records(&reply), [IpAddr::V4(PUBLIC)]);
    assert_eq!(dns.queries().len(), 1);
    let log = h.log.snapshot(&agent());
    let reasons: Vec<_> = log
        .iter()
        .map(|e| e.reason.as_ref().map(ToString::to_string).unwrap_or_default())
        .collect();
    assert_eq!(
        reasons,
        [
            "malformed",
            "malformed",
            "malformed",
            "malformed",
            "malformed",
            "malformed",
            "invalid_name",
            ""
        ]
    );
}

#[tokio::test]
async fn synthetic_names_resolve_without_the_upstream() {
    let dns = TestDns::start([("real.test", vec![IpAddr::V4(PUBLIC)])], 300).await;
    let synthetic = SyntheticNames::new();
    let fake = synthetic.insert("api.override.test").unwrap();
    let h = serve(
        Upstream::new(dns.addr()),
        allowlist(&["api.override.test"]),
        Records::new(),
        synthetic,
    )
    .await;
    let reply = ask_udp(
        h.handle.udp_addr(),
        &query("api.override.test.", RecordType::A, false),
    )
    .await;
    assert_eq!(a_records(&reply), [IpAddr::V4(fake)]);
    let reply = ask_udp(
        h.handle.udp_addr(),
        &query("api.override.test.", RecordType::AAAA, false),
    )
    .await;
    assert_eq!(
        (reply.response_code, reply.answers.len()),
        (ResponseCode::NoError, 0)
    );
    assert!(dns.queries().is_empty());
    assert_eq!(
        h.records.names_for(&agent(), IpAddr::V4(fake)),
        ["api.override.test"]
    );
    // Only that name: the policy still applies to everything else.
    let reply = ask_udp(h.handle.udp_addr(), &query("real.test.", RecordType::A, false)).await;
    assert_eq!(reply.response_code, ResponseCode::NXDomain);
}

#[tokio::test]
async fn tcp_connection_closes_when_idle_and_shutdown_stops_the_server() {
    let dns = TestDns::start([("ok.test", vec![IpAddr::V4(PUBLIC)])], 300).await;
    init_tracing();
    let table = Arc::new(PolicyTable::new());
    table.set(agent(), NetworkPolicy::open());
    let server = Server::new(ServerContext {
        agent: agent(),
        policy: table,
        upstream: Arc::new(Upstream::new(dns.addr())),
        records: Arc::new(Records::new()),
        log: Arc::new(RequestLog::new(10)),
        synthetic: Arc::new(SyntheticNames::new()),
        guard: Arc::new(Guard::new([])),
        budget: Arc::new(DnsBudget::default()),
    })
    .with_limits(agenthold_egress::dns::ServerLimits {
        tcp_idle: Duration::from_millis(200),
        ..Default::default()
    });
    let udp = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let tcp = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let handle = server.spawn_std(udp, tcp).unwrap();
    let mut stream = TcpStream::connect(handle.tcp_addr()).await.unwrap();
    let reply = send_tcp(
        &mut stream,
        &query("ok.test.", RecordType::A, false).to_vec().unwrap(),
    )
    .await;
    assert_eq!(a_records(&reply), [IpAddr::V4(PUBLIC)]);
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut byte))
        .await
        .unwrap();
    assert_eq!(closed.unwrap(), 0, "idle connection closed");

    let tcp_addr = handle.tcp_addr();
    handle.shutdown().await;
    assert!(
        TcpStream::connect(tcp_addr).await.is_err(),
        "the listener is closed"
    );
}

#[tokio::test]
async fn python_client_gets_an_answer() {
    let dns = TestDns::start([("py.test", vec![IpAddr::V4(PUBLIC)])], 300).await;
    let h = serve_open(&dns).await;
    let script = r#"
import socket, struct, sys
port = int(sys.argv[1])
q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(l)]) + l for l in [b"py", b"test"]) + b"\x00" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.sendto(q, ("127.0.0.1", port))
r = s.recv(512)
ident, flags, qd, an = struct.unpack(">HHHH", r[:8])
print(ident, flags & 0xf, an, ".".join(str(b) for b in r[-4:]))
"#;
    let port = h.handle.udp_addr().port().to_string();
    let out = tokio::process::Command::new("python3")
        .args(["-c", script, &port])
        .output()
        .await
        .expect("python3 is needed for this test (it plays a non-Rust client)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{} 0 1 {PUBLIC}", 0x4242)
    );
}

#[tokio::test]
async fn answer_is_callable_without_sockets() {
    let dns = TestDns::start([("direct.test", vec![IpAddr::V4(PUBLIC)])], 300).await;
    let table = Arc::new(PolicyTable::new());
    table.set(agent(), NetworkPolicy::open());
    let server = Server::new(ServerContext {
        agent: agent(),
        policy: table,
        upstream: Arc::new(Upstream::new(dns.addr())),
        records: Arc::new(Records::new()),
        log: Arc::new(RequestLog::new(10)),
        synthetic: Arc::new(SyntheticNames::new()),
        guard: Arc::new(Guard::new([])),
        budget: Arc::new(DnsBudget::default()),
    });
    let q = query("direct.test.", RecordType::A, false);
    let reply = server.answer(&q.to_vec().unwrap(), Transport::Tcp).await.unwrap();
    assert_eq!(
        a_records(&Message::from_vec(&reply).unwrap()),
        [IpAddr::V4(PUBLIC)]
    );
    assert!(server.answer(b"", Transport::Udp).await.is_none());
}
