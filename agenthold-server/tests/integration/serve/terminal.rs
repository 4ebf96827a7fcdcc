//! The terminal WebSocket against a real sandbox: keystrokes in and output out, resize (checked with
//! `stty size`), the exit frame, closing the socket kills the shell, and the Origin check (S6).

use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};

use super::fixture::Fixture;
use super::support::Auth;

/// Open the terminal with `token`, an optional `Origin`, and a query; the socket or the refusal's status.
fn open(f: &Fixture, token: &str, origin: Option<&str>, query: &str) -> Result<WebSocket<TcpStream>, u16> {
    let addr = f.server.base.trim_start_matches("http://").to_owned();
    let url = format!("ws://{addr}{}{query}", f.path("/terminal"));
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Authorization", format!("Bearer {token}").parse().unwrap());
    if let Some(origin) = origin {
        request.headers_mut().insert("Origin", origin.parse().unwrap());
    }
    let stream = TcpStream::connect(&addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    match tungstenite::client(request, stream) {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => {
            Err(response.status().as_u16())
        }
        Err(e) => panic!("handshake: {e}"),
    }
}

/// Read output until it contains `needle` (within 20 s); everything read.
fn read_until(socket: &mut WebSocket<TcpStream>, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = String::new();
    while !seen.contains(needle) {
        assert!(Instant::now() < deadline, "no {needle:?} in {seen:?}");
        match socket.read().unwrap() {
            Message::Binary(data) => seen.push_str(&String::from_utf8_lossy(&data)),
            Message::Text(t) => {
                panic!("unexpected control frame {t} while waiting for {needle:?} in {seen:?}")
            }
            _ => {}
        }
    }
    seen
}

fn send(socket: &mut WebSocket<TcpStream>, keys: &str) {
    socket
        .send(Message::Binary(keys.as_bytes().to_vec().into()))
        .unwrap();
}

// covers: P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn the_terminal_echoes_resizes_and_reports_the_exit() {
    let f = Fixture::new();
    let mut socket = open(&f, &f.token, None, "?cols=100&rows=30").unwrap();
    // The shell's own echo of the line shows `hel''lo`; only the command's output shows `hello`.
    send(&mut socket, "echo hel''lo\n");
    read_until(&mut socket, "hello\r\n");
    send(&mut socket, "stty size\n");
    read_until(&mut socket, "30 100");
    socket
        .send(Message::Text(
            json!({"type": "resize", "cols": 120, "rows": 40})
                .to_string()
                .into(),
        ))
        .unwrap();
    send(&mut socket, "stty size\n");
    read_until(&mut socket, "40 120");
    // A bad control message is answered, and the terminal goes on.
    socket.send(Message::Text(r#"{"type":"paste"}"#.into())).unwrap();
    send(&mut socket, "exit 7\n");
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut error, mut exit) = (None, None);
    while exit.is_none() {
        assert!(Instant::now() < deadline, "no exit frame");
        match socket.read() {
            Ok(Message::Text(t)) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                match v["type"].as_str() {
                    Some("error") => error = Some(v),
                    Some("exit") => exit = Some(v),
                    _ => panic!("unexpected {v}"),
                }
            }
            Ok(_) => {}
            Err(e) => panic!("socket ended before the exit frame: {e}"),
        }
    }
    assert!(error.is_some(), "the bad control message was not answered");
    assert_eq!(exit.unwrap()["exit_code"], 7);
    // Then the server closes.
    loop {
        match socket.read() {
            Ok(_) => {}
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => break,
            Err(e) => panic!("{e}"),
        }
    }
}

// covers: P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn closing_the_socket_kills_the_shell() {
    let f = Fixture::new();
    let mut socket = open(&f, &f.token, None, "").unwrap();
    // One foreground job whose shell started a background child: the whole job goes with the terminal.
    send(&mut socket, "sh -c 'sleep 1003 & sleep 1003'\n");
    f.eventually(Duration::from_secs(10), "the sleeps run", || {
        f.processes_with("sleep 1003") == 2
    });
    socket.close(None).unwrap();
    drop(socket);
    f.eventually(Duration::from_secs(10), "no sleep is left", || {
        f.processes_with("sleep 1003") == 0
    });
}

// covers: S6, S5
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn the_terminal_checks_origin_and_role() {
    let f = Fixture::new();
    assert_eq!(
        open(&f, &f.token, Some("http://evil.example"), "").err(),
        Some(403)
    );
    assert_eq!(open(&f, &f.token, Some("null"), "").err(), Some(403));
    let own = f.server.base.clone();
    let mut socket = open(&f, &f.token, Some(&own), "").unwrap();
    send(&mut socket, "echo o''k\n");
    read_until(&mut socket, "ok\r\n");
    drop(socket);
    let Auth::Token(viewer) = f.grant("bob", "viewer") else {
        unreachable!()
    };
    assert_eq!(open(&f, &viewer, None, "").err(), Some(403));
    let (_, stranger) = f.server.user("eve");
    assert_eq!(open(&f, &stranger, None, "").err(), Some(404));
    assert_eq!(open(&f, &f.token, None, "?cols=0").err(), Some(400));
    // Not an upgrade: a problem, not a socket.
    let plain = f.server.call("GET", &f.path("/terminal"), &f.auth, None);
    assert_eq!(plain.status, 400, "{:?}", plain.body);
}
