//! Tests of the tunnel server: authentication (S2) and the budgets (E20).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A `tracing` subscriber that counts WARN and ERROR events (installed per test thread).
struct CountWarnings(Arc<AtomicUsize>);

impl tracing::Subscriber for CountWarnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() <= tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Serve a listener on loopback for `agent`.
async fn listen(
    server: &Arc<TunnelServer>,
    agent: &AgentId,
    cancel: &CancellationToken,
) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(server).serve(agent.clone(), listener, cancel.clone()));
    addr
}

/// Whether the server closed `stream` within `limit` (EOF or a reset).
async fn closed_within(mut stream: TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(limit, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Forty agents flood their tunnel listeners with half-sent hellos and bogus ones; a forty-first agent's
/// sandboxd still connects and keeps its tunnel, the flooders' connections are cut down to their budget
/// at once instead of each holding a task and a descriptor until its hello times out, and the log gets
/// a summary instead of a line per refusal.
// covers: E20, S2
#[tokio::test]
async fn a_flood_is_bounded_and_quiet_and_never_starves_another_agent() {
    let warnings = Arc::new(AtomicUsize::new(0));
    let _log = tracing::subscriber::set_default(CountWarnings(Arc::clone(&warnings)));
    let server = TunnelServer::new();
    let cancel = CancellationToken::new();
    let mut half_sent = Vec::new();
    let mut bogus = 0;
    for n in 0..40 {
        let agent = AgentId::new(format!("flooder-{n:02}")).unwrap();
        server.expect(&agent, new_token().1);
        let addr = listen(&server, &agent, &cancel).await;
        for _ in 0..20 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("AGENTHOLD-TUNNEL 1 {agent} ").as_bytes())
                .await
                .unwrap();
            half_sent.push(s);
        }
        for _ in 0..10 {
            if let Ok(mut s) = TcpStream::connect(addr).await {
                let _ = s
                    .write_all(wire::hello(agent.as_str(), &"0".repeat(64)).as_bytes())
                    .await;
                bogus += 1;
            }
        }
    }
    assert_eq!(half_sent.len(), 800);
    assert_eq!(bogus, 400);

    let victim = AgentId::new("victim").unwrap();
    let (token, hash) = new_token();
    server.expect(&victim, hash);
    let addr = listen(&server, &victim, &cancel).await;
    let started = Instant::now();
    let (answer, mut live) = hello(addr, &wire::hello("victim", &token)).await;
    assert_eq!(answer, "OK\n", "the victim's tunnel is refused during the flood");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the victim waited {:?}",
        started.elapsed()
    );
    live.write_all(b"PING\n").await.unwrap();
    let mut buf = [0u8; 8];
    let n = tokio::time::timeout(Duration::from_secs(2), live.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf[..n], b"PONG\n");
    assert_eq!(server.status(&victim), TunnelStatus::Connected);

    // Each flooder keeps at most its own budget of connections; the rest were closed at once.
    let closed = futures_util::future::join_all(
        half_sent
            .into_iter()
            .map(|s| closed_within(s, Duration::from_secs(1))),
    )
    .await;
    let kept = closed.iter().filter(|c| !**c).count();
    assert!(
        kept <= 40 * 8,
        "{kept} half-sent hellos are still held after a second"
    );

    let warned = warnings.load(Ordering::SeqCst);
    assert!(warned <= 3, "{warned} warnings for one flood");
    cancel.cancel();
}

async fn hello(addr: std::net::SocketAddr, line: &str) -> (String, TcpStream) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(line.as_bytes()).await.unwrap();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).await.unwrap();
    (String::from_utf8_lossy(&buf[..n]).into_owned(), s)
}

// covers: S2
#[tokio::test]
async fn accepts_only_the_current_token_of_the_listener_agent() {
    let server = TunnelServer::new();
    let agent = AgentId::new("a").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(Arc::clone(&server).serve(agent.clone(), listener, cancel.clone()));
    let (token, hash) = new_token();
    assert_eq!(token.len(), 64);
    let (answer, _) = hello(addr, &wire::hello("a", &token)).await;
    assert_eq!(answer, "ERR unknown agent\n");
    server.expect(&agent, hash);
    let (answer, _) = hello(addr, &wire::hello("b", &token)).await;
    assert_eq!(answer, "ERR wrong agent\n");
    let (answer, _) = hello(addr, &wire::hello("a", &new_token().0)).await;
    assert_eq!(answer, "ERR bad token\n");
    let (answer, mut live) = hello(addr, &wire::hello("a", &token)).await;
    assert_eq!(answer, "OK\n");
    assert_eq!(server.status(&agent), TunnelStatus::Connected);
    live.write_all(b"PING\n").await.unwrap();
    let mut buf = [0u8; 8];
    let n = live.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"PONG\n");
    server.revoke(&agent);
    assert_eq!(server.status(&agent), TunnelStatus::Disconnected);
    let (answer, _) = hello(addr, &wire::hello("a", &token)).await;
    assert_eq!(answer, "ERR sandbox not running\n");
    cancel.cancel();
}

fn small(per_agent: usize, reserved_per_agent: usize, shared: usize) -> TunnelLimits {
    TunnelLimits {
        per_agent,
        reserved_per_agent,
        shared,
        hello_timeout: Duration::from_secs(5),
        log_interval: Duration::from_secs(30),
    }
}

/// Connect `n` times to `addr` sending half a hello; the streams (some closed by the server at once).
async fn half_hellos(addr: std::net::SocketAddr, agent: &str, n: usize) -> Vec<TcpStream> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s
            .write_all(format!("AGENTHOLD-TUNNEL 1 {agent} ").as_bytes())
            .await;
        out.push(s);
    }
    out
}

/// Wait until `check` holds (at most 2 s).
async fn eventually(check: impl Fn() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(check(), "condition not reached within 2 s");
}

/// Two agents use up the shared pool; a third still gets its reserved slot (and no more), and a
/// sandboxd with the right token gets its tunnel from the reserve.
// covers: E20
#[tokio::test]
async fn the_reserve_lets_every_agent_in_when_the_shared_pool_is_used_up() {
    let server = TunnelServer::with_limits(small(4, 1, 4));
    let cancel = CancellationToken::new();
    let mut held = Vec::new();
    let mut addrs = Vec::new();
    for name in ["f1", "f2", "f3"] {
        let agent = AgentId::new(name).unwrap();
        server.expect(&agent, new_token().1);
        addrs.push(listen(&server, &agent, &cancel).await);
    }
    held.extend(half_hellos(addrs[0], "f1", 10).await);
    eventually(|| {
        server
            .agent_counters(&AgentId::new("f1").unwrap())
            .refused_over_limit
            == 6
    })
    .await;
    held.extend(half_hellos(addrs[1], "f2", 10).await);
    eventually(|| {
        server
            .agent_counters(&AgentId::new("f2").unwrap())
            .refused_over_limit
            == 8
    })
    .await;
    held.extend(half_hellos(addrs[2], "f3", 10).await);
    eventually(|| {
        server
            .agent_counters(&AgentId::new("f3").unwrap())
            .refused_over_limit
            == 9
    })
    .await;
    let open = |name: &str| server.agent_counters(&AgentId::new(name).unwrap()).open;
    assert_eq!(
        (open("f1"), open("f2"), open("f3")),
        (4, 2, 1),
        "f1 took 1 + 3 shared, f2 1 + 1"
    );
    let total = server.counters();
    assert_eq!((total.open, total.accepted, total.refused_over_limit), (7, 7, 23));

    let victim = AgentId::new("victim").unwrap();
    let (token, hash) = new_token();
    server.expect(&victim, hash);
    let addr = listen(&server, &victim, &cancel).await;
    let (answer, _live) = hello(addr, &wire::hello("victim", &token)).await;
    assert_eq!(answer, "OK\n");
    assert_eq!(server.agent_counters(&victim).authenticated, 1);

    // Slots come back when connections close.
    drop(held);
    eventually(|| server.counters().open == 1).await;
    assert_eq!(open("f1"), 0);
    cancel.cancel();
}

/// A connection that does not send its whole hello in time is closed without an answer, also when it
/// trickles bytes; its slot comes back.
// covers: E20
#[tokio::test]
async fn a_hello_must_arrive_whole_within_the_timeout() {
    let limits = TunnelLimits {
        hello_timeout: Duration::from_millis(300),
        ..TunnelLimits::default()
    };
    let server = TunnelServer::with_limits(limits);
    let cancel = CancellationToken::new();
    let agent = AgentId::new("a").unwrap();
    server.expect(&agent, new_token().1);
    let addr = listen(&server, &agent, &cancel).await;
    let silent = TcpStream::connect(addr).await.unwrap();
    let mut trickle = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    let trickling = async {
        for b in b"AGENTHOLD-TUNNEL 1 a ".iter().cycle().take(60) {
            if trickle.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        trickle
    };
    let (closed, trickle) = tokio::join!(closed_within(silent, Duration::from_secs(3)), trickling);
    assert!(closed, "a silent connection is still open");
    assert!(
        closed_within(trickle, Duration::from_secs(3)).await,
        "a trickling hello is still open"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let counters = server.agent_counters(&agent);
    assert_eq!((counters.hello_timeouts, counters.open), (2, 0));
    cancel.cancel();
}

/// Refusals are counted by kind and logged as one summary per interval, however many there are.
// covers: E20
#[tokio::test]
async fn refusals_are_counted_and_summarised_once_per_interval() {
    let warnings = Arc::new(AtomicUsize::new(0));
    let _log = tracing::subscriber::set_default(CountWarnings(Arc::clone(&warnings)));
    let limits = TunnelLimits {
        log_interval: Duration::from_millis(400),
        ..TunnelLimits::default()
    };
    let server = TunnelServer::with_limits(limits);
    let cancel = CancellationToken::new();
    let agent = AgentId::new("a").unwrap();
    server.expect(&agent, new_token().1);
    let addr = listen(&server, &agent, &cancel).await;
    for line in [
        "AGENTHOLD-TUNNEL 1 a bad-token\n",
        "GET / HTTP/1.1\n",
        "AGENTHOLD-TUNNEL 1 b x\n",
    ] {
        for _ in 0..20 {
            let (answer, _) = hello(addr, line).await;
            assert!(answer.starts_with("ERR "), "{answer:?}");
        }
    }
    let counters = server.agent_counters(&agent);
    assert_eq!((counters.refused_token, counters.refused_bad_hello), (20, 40));
    assert_eq!(
        warnings.load(Ordering::SeqCst),
        1,
        "the first refusal is logged at once, the rest wait"
    );
    // The periodic flush reports the rest once the interval has passed, in one line.
    eventually(|| warnings.load(Ordering::SeqCst) == 2).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(warnings.load(Ordering::SeqCst), 2, "nothing new to report");
    server.forget(&agent);
    assert_eq!(server.agent_counters(&agent), TunnelCounters::default());
    assert_eq!(server.counters().refused_token, 20, "totals stay");
    cancel.cancel();
}
