//! The tunnel client of `sandboxd boot` against a small tunnel server on 127.0.0.1 (test-only short intervals).

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use sandboxd::contract::{BOOT_FILE, ENV_AGENT, ENV_TUNNEL};

use crate::{Guard, Root, TOKEN};

/// The hello line the runtime must receive.
fn expected_hello() -> String {
    sandboxd::contract::tunnel::hello("agent-7", TOKEN)
}

/// A tunnel server socket on loopback and a booted sandboxd pointed at it (no workload).
pub(crate) fn boot_against_server(extra_env: &[(&str, &str)]) -> (TcpListener, Guard, Root) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let root = Root::new();
    root.write(BOOT_FILE, TOKEN);
    let mut cmd = root.sandboxd(&["boot"]);
    cmd.env(ENV_TUNNEL, listener.local_addr().unwrap().to_string())
        .env(ENV_AGENT, "agent-7")
        .env("AGENTHOLD_TUNNEL_PING_MS", "50")
        .env("AGENTHOLD_TUNNEL_TIMEOUT_MS", "300")
        .env("AGENTHOLD_TUNNEL_BACKOFF_MS", "20")
        .env("AGENTHOLD_TUNNEL_BACKOFF_MAX_MS", "80")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    for (key, value) in extra_env {
        cmd.env(key, value);
    }
    let guard = Guard::spawn(&mut cmd);
    (listener, guard, root)
}

/// Accepts the next connection (10 s at most) and returns a line reader and a writer for it.
pub(crate) fn accept(listener: &TcpListener) -> (BufReader<TcpStream>, TcpStream) {
    listener.set_nonblocking(true).unwrap();
    let start = std::time::Instant::now();
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "no connection from sandboxd"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(err) => panic!("accept: {err}"),
        }
    };
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (BufReader::new(stream.try_clone().unwrap()), stream)
}

/// Reads one line (with its newline).
pub(crate) fn line(reader: &mut BufReader<TcpStream>) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    line
}

/// Stops sandboxd with SIGTERM and returns its stderr.
pub(crate) fn stop(mut guard: Guard) -> String {
    guard.signal(Signal::SIGTERM);
    assert_eq!(guard.wait_for(Duration::from_secs(5)).code(), Some(0));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut guard.0.stderr.take().unwrap(), &mut stderr).unwrap();
    stderr
}

#[test]
fn hello_then_ping_pong() {
    let (listener, guard, _root) = boot_against_server(&[]);
    let (mut reader, mut writer) = accept(&listener);
    assert_eq!(line(&mut reader), expected_hello());
    writer.write_all(b"OK\n").unwrap();
    for _ in 0..3 {
        assert_eq!(line(&mut reader), "PING\n");
        writer.write_all(b"PONG\n").unwrap();
    }
    let stderr = stop(guard);
    assert!(stderr.contains("tunnel: connected"), "{stderr}");
    assert!(!stderr.contains(TOKEN), "the token is never logged: {stderr}");
}

#[test]
fn reconnects_with_the_same_token_after_the_server_drops() {
    let (listener, guard, _root) = boot_against_server(&[]);
    for _ in 0..3 {
        let (mut reader, mut writer) = accept(&listener);
        assert_eq!(line(&mut reader), expected_hello());
        writer.write_all(b"OK\n").unwrap();
        // Drop the connection (a runtime restart): the client must come back with the same hello.
    }
    let (mut reader, mut writer) = accept(&listener);
    assert_eq!(line(&mut reader), expected_hello());
    writer.write_all(b"OK\n").unwrap();
    assert_eq!(line(&mut reader), "PING\n");
    stop(guard);
}

#[test]
fn err_answer_is_retried_later() {
    let (listener, guard, _root) = boot_against_server(&[]);
    let (mut reader, mut writer) = accept(&listener);
    assert_eq!(line(&mut reader), expected_hello());
    writer.write_all(b"ERR not ready\n").unwrap();
    // The client closes after ERR.
    assert_eq!(line(&mut reader), "", "closed after ERR");
    let (mut reader, mut writer) = accept(&listener);
    assert_eq!(line(&mut reader), expected_hello());
    writer.write_all(b"OK\n").unwrap();
    assert_eq!(line(&mut reader), "PING\n");
    let stderr = stop(guard);
    assert!(stderr.contains("rejected by the server: not ready"), "{stderr}");
}

#[test]
fn missing_pong_reconnects() {
    let (listener, guard, _root) = boot_against_server(&[]);
    let (mut reader, mut writer) = accept(&listener);
    assert_eq!(line(&mut reader), expected_hello());
    writer.write_all(b"OK\n").unwrap();
    assert_eq!(line(&mut reader), "PING\n");
    // No PONG: after the 300 ms timeout the client gives up on this connection and dials again.
    let (mut reader, _writer) = accept(&listener);
    assert_eq!(line(&mut reader), expected_hello());
    stop(guard);
}

#[test]
fn unreachable_server_is_retried_with_backoff() {
    // Take a free port and close it: connections are refused until a server appears there.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let root = Root::new();
    root.write(BOOT_FILE, TOKEN);
    let guard = Guard::spawn(
        root.sandboxd(&["boot"])
            .env(ENV_TUNNEL, addr.to_string())
            .env(ENV_AGENT, "agent-7")
            .env("AGENTHOLD_TUNNEL_BACKOFF_MS", "20")
            .env("AGENTHOLD_TUNNEL_BACKOFF_MAX_MS", "80")
            .stdin(Stdio::null())
            .stderr(Stdio::piped()),
    );
    std::thread::sleep(Duration::from_millis(400));
    let listener = TcpListener::bind(addr).unwrap();
    let (mut reader, _writer) = accept(&listener);
    assert_eq!(line(&mut reader), expected_hello());
    let stderr = stop(guard);
    // Repeated identical failures are logged once.
    assert_eq!(stderr.matches("connect:").count(), 1, "{stderr}");
}

#[test]
fn bad_tunnel_address_does_not_stop_the_workload() {
    let root = Root::new();
    root.write(BOOT_FILE, TOKEN);
    let out = root
        .sandboxd(&["boot", "--", "sh", "-c", "exit 6"])
        .env(ENV_TUNNEL, "gateway.invalid:15003")
        .env(ENV_AGENT, "agent-7")
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected IP:PORT"));
}
