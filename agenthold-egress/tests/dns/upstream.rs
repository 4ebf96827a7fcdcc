//! The gateway's DNS client: timeouts, spoofed answers, TCP fallback, the lookup cache.

use super::*;

#[tokio::test]
async fn upstream_timeout_gives_servfail_within_the_bound() {
    init_tracing();
    // An upstream that never answers.
    let silent = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let upstream = Upstream::new(silent.local_addr().unwrap()).with_timeout(Duration::from_millis(150));
    let h = serve(
        upstream,
        NetworkPolicy::open(),
        Records::new(),
        SyntheticNames::new(),
    )
    .await;
    let started = Instant::now();
    let reply = ask_udp(h.handle.udp_addr(), &query("slow.test.", RecordType::A, false)).await;
    assert_eq!(reply.response_code, ResponseCode::ServFail);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(1),
        "{took:?}"
    );
    let entry = h.log.snapshot(&agent()).pop().unwrap();
    assert_eq!(
        entry.reason.as_ref().map(ToString::to_string).as_deref(),
        Some("upstream_timeout")
    );
    assert_eq!(entry.status, Some(2));

    let direct = Upstream::new(silent.local_addr().unwrap()).with_timeout(Duration::from_millis(100));
    let err = direct.lookup("slow.test").await.unwrap_err();
    assert!(matches!(err, LookupError::Timeout { attempts: 2, .. }), "{err}");
}

/// A scripted upstream on loopback: each UDP query gets the datagrams `udp` makes of it; TCP queries (same
/// port) get `tcp`'s answer.
async fn scripted(
    udp: impl Fn(&Message) -> Vec<Message> + Send + 'static,
    tcp: impl Fn(&Message) -> Message + Send + 'static,
) -> SocketAddr {
    let (socket, listener) = loop {
        let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        if let Ok(l) = TcpListener::bind(socket.local_addr().unwrap()).await {
            break (socket, l);
        }
    };
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((len, peer)) = socket.recv_from(&mut buf).await {
            let q = Message::from_vec(&buf[..len]).unwrap();
            for m in udp(&q) {
                socket.send_to(&m.to_vec().unwrap(), peer).await.unwrap();
            }
        }
    });
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let len = stream.read_u16().await.unwrap();
            let mut buf = vec![0u8; usize::from(len)];
            stream.read_exact(&mut buf).await.unwrap();
            let bytes = tcp(&Message::from_vec(&buf).unwrap()).to_vec().unwrap();
            stream
                .write_u16(u16::try_from(bytes.len()).unwrap())
                .await
                .unwrap();
            stream.write_all(&bytes).await.unwrap();
        }
    });
    addr
}

fn answer(q: &Message, addrs: &[Ipv4Addr]) -> Message {
    let mut m = Message::response(q.id, OpCode::Query);
    m.queries.clone_from(&q.queries);
    for a in addrs {
        m.add_answer(Record::from_rdata(q.queries[0].name.clone(), 60, RData::A(A(*a))));
    }
    m
}

#[tokio::test]
async fn spoofed_upstream_answers_are_ignored() {
    init_tracing();
    let addr = scripted(
        |q| {
            let mut wrong_id = answer(q, &[Ipv4Addr::new(6, 6, 6, 6)]);
            wrong_id.metadata.id = q.id.wrapping_add(1);
            let mut wrong_question = answer(q, &[Ipv4Addr::new(6, 6, 6, 7)]);
            wrong_question.queries[0].set_name(Name::from_ascii("evil.test.").unwrap());
            let mut wrong_type = answer(q, &[Ipv4Addr::new(6, 6, 6, 8)]);
            wrong_type.queries[0].set_query_type(RecordType::TXT);
            let mut not_a_response = answer(q, &[Ipv4Addr::new(6, 6, 6, 9)]);
            not_a_response.metadata.message_type = MessageType::Query;
            vec![
                wrong_id,
                wrong_question,
                wrong_type,
                not_a_response,
                answer(q, &[PUBLIC]),
            ]
        },
        |q| answer(q, &[]),
    )
    .await;
    let h = serve(
        Upstream::new(addr),
        NetworkPolicy::open(),
        Records::new(),
        SyntheticNames::new(),
    )
    .await;
    let reply = ask_udp(h.handle.udp_addr(), &query("spoofed.test.", RecordType::A, false)).await;
    assert_eq!(a_records(&reply), [IpAddr::V4(PUBLIC)]);

    // A datagram from another address never counts, even with a matching id: the upstream here only ever
    // answers with a copy sent from a second socket.
    let (real, spoofer) = (
        UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap(),
        UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap(),
    );
    let real_addr = real.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((len, peer)) = real.recv_from(&mut buf).await {
            let q = Message::from_vec(&buf[..len]).unwrap();
            let bytes = answer(&q, &[Ipv4Addr::new(6, 6, 6, 6)]).to_vec().unwrap();
            spoofer.send_to(&bytes, peer).await.unwrap();
        }
    });
    let upstream = Upstream::new(real_addr).with_timeout(Duration::from_millis(100));
    assert!(matches!(
        upstream.lookup("spoofed.test").await,
        Err(LookupError::Timeout { .. })
    ));
}

#[tokio::test]
async fn truncated_upstream_answer_is_asked_again_over_tcp() {
    init_tracing();
    let addr = scripted(
        |q| {
            let mut m = answer(q, &[]);
            m.metadata.truncation = true;
            vec![m]
        },
        |q| answer(q, &[PUBLIC, Ipv4Addr::new(93, 184, 216, 35)]),
    )
    .await;
    let h = serve(
        Upstream::new(addr),
        NetworkPolicy::open(),
        Records::new(),
        SyntheticNames::new(),
    )
    .await;
    let reply = ask_udp(h.handle.udp_addr(), &query("tc.test.", RecordType::A, true)).await;
    assert_eq!(a_records(&reply), [IpAddr::V4(PUBLIC), ip("93.184.216.35")]);
}

#[tokio::test]
async fn lookup_returns_both_families_caches_and_coalesces() {
    init_tracing();
    let dns = TestDns::start(
        [
            ("dual.test", vec![ip(PUBLIC_V6), IpAddr::V4(PUBLIC)]),
            ("busy.test", vec![IpAddr::V4(PUBLIC)]),
            ("empty.test", vec![]),
        ],
        1,
    )
    .await;
    let upstream = Arc::new(Upstream::new(dns.addr()));
    let found = upstream.lookup("Dual.Test.").await.unwrap();
    assert_eq!(found.name, "dual.test");
    assert_eq!(found.addrs, [IpAddr::V4(PUBLIC), ip(PUBLIC_V6)], "IPv4 first");
    assert_eq!(found.ttl, Duration::from_secs(5), "TTL 1 s is raised to 5 s");
    assert_eq!(dns.queries().len(), 2);
    assert_eq!(upstream.lookup("dual.test").await.unwrap(), found);
    assert_eq!(dns.queries().len(), 2, "second lookup from the cache");

    dns.clear_queries();
    let lookups: Vec<_> = (0..10)
        .map(|_| {
            let upstream = Arc::clone(&upstream);
            tokio::spawn(async move { upstream.lookup("busy.test").await })
        })
        .collect();
    for l in lookups {
        assert_eq!(l.await.unwrap().unwrap().addrs, [IpAddr::V4(PUBLIC)]);
    }
    assert_eq!(
        dns.queries().len(),
        2,
        "ten concurrent lookups, one A and one AAAA query"
    );

    dns.clear_queries();
    assert!(matches!(
        upstream.lookup("missing.test").await,
        Err(LookupError::NxDomain { .. })
    ));
    assert!(matches!(
        upstream.lookup("missing.test").await,
        Err(LookupError::NxDomain { .. })
    ));
    assert!(matches!(
        upstream.lookup("empty.test").await,
        Err(LookupError::NoAddress { .. })
    ));
    assert_eq!(dns.queries().len(), 4, "negative answers are cached");
    assert!(matches!(
        upstream.lookup("1.2.3.4").await,
        Err(LookupError::InvalidName { .. })
    ));
}
