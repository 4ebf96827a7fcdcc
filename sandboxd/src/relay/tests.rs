//! The relay against a scripted tunnel server: what reaches the runtime, what the sender gets back.

use super::*;
use std::io::{BufRead as _, BufReader, Read as _};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::FileTypeExt as _;
use std::time::Duration;

use crate::token::BootToken;

const TOKEN: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

fn config(addr: SocketAddr) -> TunnelConfig {
    TunnelConfig {
        addr,
        agent: "agent-1".into(),
        token: BootToken::parse(TOKEN.as_bytes()).expect("token"),
        ping_every: Duration::from_millis(50),
        timeout: Duration::from_millis(500),
        backoff: Duration::from_millis(10),
        backoff_max: Duration::from_millis(40),
    }
}

/// A root with `/.agenthold` and a relay serving it; the scripted server's address is given.
fn relay(tunnel: Option<SocketAddr>) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(root.path().join(".agenthold")).expect("dir");
    let layout = Layout::new(root.path().to_path_buf());
    spawn(&layout, tunnel.map(config)).expect("relay");
    let socket = layout.path(SEND_SOCKET);
    (root, socket)
}

/// One scripted tunnel connection: returns (hello line, request bytes) after answering `answer`.
fn tunnel_server(answer: &'static str) -> (SocketAddr, std::thread::JoinHandle<(String, Vec<u8>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().expect("accept");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut hello = String::new();
        reader.read_line(&mut hello).expect("hello");
        (&stream).write_all(b"OK\n").expect("ok");
        let mut line = String::new();
        reader.read_line(&mut line).expect("line");
        let head = wire::parse_send(line.trim_end()).expect("a SEND line");
        let mut body = vec![0u8; head.body_len()];
        reader.read_exact(&mut body).expect("body");
        (&stream).write_all(answer.as_bytes()).expect("answer");
        let mut request = line.into_bytes();
        request.extend_from_slice(&body);
        (hello, request)
    });
    (addr, server)
}

fn ask(socket: &std::path::Path, request: &[u8]) -> Result<Answer, String> {
    crate::send::exchange(socket, request, Duration::from_secs(5))
}

// covers: S4
#[test]
fn a_request_goes_over_a_fresh_tunnel_with_the_boot_token() {
    let (addr, server) = tunnel_server("STARTED run_abc\n");
    let (_root, socket) = relay(Some(addr));
    let meta = std::fs::metadata(&socket).expect("socket");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o666);
    let request = wire::request(wire::Harness::Codex, "other agent", "do it\n").expect("request");
    assert_eq!(ask(&socket, &request), Ok(Answer::Started("run_abc".into())));
    let (hello, forwarded) = server.join().expect("server");
    assert_eq!(hello, format!("AGENTHOLD-TUNNEL 1 agent-1 {TOKEN}\n"));
    assert_eq!(forwarded, request);
}

#[test]
fn refusals_are_relayed_and_never_carry_the_token() {
    let (addr, server) = tunnel_server("ERR not allowed\n");
    let (_root, socket) = relay(Some(addr));
    let request = wire::request(wire::Harness::Claude, "b", "x").expect("request");
    assert_eq!(ask(&socket, &request), Ok(Answer::Refused("not allowed".into())));
    server.join().expect("server");
}

#[test]
fn malformed_requests_never_reach_the_tunnel() {
    // No server listens there: reaching it would answer "cannot reach agenthold".
    let dead = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = dead.local_addr().expect("addr");
    drop(dead);
    let (_root, socket) = relay(Some(addr));
    let cases: [(&[u8], &str); 6] = [
        (b"HELLO\n", "malformed SEND request"),
        (b"SEND custom 1 1\nab", "unknown harness (claude or codex)"),
        (
            b"SEND claude 1 262145\n",
            "prompt too large (at most 262144 bytes)",
        ),
        (b"SEND claude 1 1\n\nx", "bad agent name"),
        (b"SEND claude 1 1\nb\xff", "prompt is not UTF-8"),
        (b"SEND claude 1 1\nbxy", "reading the request: line too long"),
    ];
    for (request, reason) in cases {
        assert_eq!(
            ask(&socket, request),
            Ok(Answer::Refused(reason.into())),
            "{request:?}"
        );
    }
    let long = vec![b'S'; 1000];
    assert!(matches!(ask(&socket, &long), Ok(Answer::Refused(_))));
    let request = wire::request(wire::Harness::Claude, "b", "x").expect("request");
    assert!(
        matches!(ask(&socket, &request), Ok(Answer::Refused(r)) if r.starts_with("cannot reach agenthold")),
        "a valid request is forwarded"
    );
}

#[test]
fn without_a_tunnel_the_answer_says_so() {
    let (_root, socket) = relay(None);
    let request = wire::request(wire::Harness::Claude, "b", "x").expect("request");
    assert_eq!(
        ask(&socket, &request),
        Ok(Answer::Refused(
            "agent messages need the tunnel, and this sandbox has none".into()
        ))
    );
}

#[test]
fn a_stale_socket_file_is_replaced() {
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(root.path().join(".agenthold")).expect("dir");
    let layout = Layout::new(root.path().to_path_buf());
    std::fs::write(layout.path(SEND_SOCKET), b"stale").expect("stale");
    spawn(&layout, None).expect("relay");
    let request = wire::request(wire::Harness::Claude, "b", "x").expect("request");
    assert!(matches!(
        ask(&layout.path(SEND_SOCKET), &request),
        Ok(Answer::Refused(_))
    ));
}
