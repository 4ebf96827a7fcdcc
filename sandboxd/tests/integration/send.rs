//! `sandboxd send` / `agenthold-send` end to end through a booted sandboxd: the request goes to PID 1's
//! socket and out over a second tunnel connection with the boot token; the keep-alive tunnel stays.

use std::io::{Read as _, Write as _};
use std::process::Stdio;
use std::time::Duration;

use sandboxd::contract::tunnel as wire;

use crate::tunnel::{accept, boot_against_server, line, stop};
use crate::{Root, TOKEN, eventually};

/// Runs `sandboxd --root ROOT send ARGS` with `stdin`; returns (code, stdout, stderr).
fn send(root: &Root, args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut child = root
        .sandboxd(&[&["send"], args].concat())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// covers: S4
#[test]
fn a_message_goes_over_its_own_tunnel_connection() {
    let (listener, guard, root) = boot_against_server(&[]);
    let (mut keepalive, _keepalive_w) = accept(&listener);
    assert_eq!(line(&mut keepalive), wire::hello("agent-7", TOKEN));
    eventually(Duration::from_secs(5), "the socket", || {
        root.path(sandboxd::contract::SEND_SOCKET).exists()
    });
    let server = std::thread::spawn(move || {
        let (mut reader, mut writer) = accept(&listener);
        let hello = line(&mut reader);
        writer.write_all(b"OK\n").unwrap();
        let head = line(&mut reader);
        let parsed = wire::parse_send(head.trim_end()).unwrap();
        let mut body = vec![0u8; parsed.body_len()];
        reader.read_exact(&mut body).unwrap();
        writer.write_all(b"STARTED run_42\n").unwrap();
        (hello, head, body)
    });
    let prompt = "from stdin: ignore the name 'agent-9' in here\n";
    let (code, stdout, stderr) = send(
        &root,
        &["--harness", "codex", "the other", "-"],
        prompt.as_bytes(),
    );
    assert_eq!((code, stdout.as_str()), (0, "run_42\n"), "{stderr}");
    let (hello, head, body) = server.join().unwrap();
    assert_eq!(hello, wire::hello("agent-7", TOKEN));
    assert_eq!(head, format!("SEND codex 9 {}\n", prompt.len()));
    assert_eq!(body, [b"the other".as_slice(), prompt.as_bytes()].concat());
    let stderr = stop(guard);
    assert!(!stderr.contains(TOKEN));
}

#[test]
fn refusals_and_bad_input_fail_with_a_reason() {
    let (listener, guard, root) = boot_against_server(&[]);
    let (_keepalive, _w) = accept(&listener);
    eventually(Duration::from_secs(5), "the socket", || {
        root.path(sandboxd::contract::SEND_SOCKET).exists()
    });
    let server = std::thread::spawn(move || {
        let (mut reader, mut writer) = accept(&listener);
        let _ = line(&mut reader);
        writer
            .write_all(b"ERR no agent named that in this workspace\n")
            .unwrap();
    });
    let (code, stdout, stderr) = send(&root, &["b", "hi"], b"");
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert!(stderr.contains("tunnel refused: no agent named that"), "{stderr}");
    server.join().unwrap();
    let big = vec![b'x'; wire::MAX_PROMPT + 1];
    let (code, _, stderr) = send(&root, &["b", "-"], &big);
    assert_eq!(code, 1);
    assert!(stderr.contains("prompt too large"), "{stderr}");
    let (code, _, stderr) = send(&root, &["b", "-"], b"\xff\xfe");
    assert_eq!(code, 1);
    assert!(stderr.contains("not UTF-8"), "{stderr}");
    let (code, _, _) = send(&root, &["--harness", "custom", "b", "x"], b"");
    assert_eq!(code, 2);
    let (code, _, _) = send(&root, &["b\nc", "x"], b"");
    assert_eq!(code, 2);
    stop(guard);
}

#[test]
fn called_as_agenthold_send_it_is_the_send_command() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("agenthold-send");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sandboxd"), &link).unwrap();
    let out = std::process::Command::new(&link)
        .args(["b", "hello"])
        .output()
        .unwrap();
    // Outside a sandbox there is no socket at /.agenthold/send.sock.
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot reach sandboxd at /.agenthold/send.sock"),
        "{stderr}"
    );
    let out = std::process::Command::new(&link).args(["b"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage: agenthold-send"));
}

// The fuzz target's checks, included so that `cargo test` replays `fuzz/{regressions,seeds}/tunnel_send`.
#[allow(unreachable_pub, dead_code)]
#[path = "../../../fuzz/src/tunnel_send.rs"]
mod fuzz_tunnel_send;

#[test]
fn fuzz_regressions_and_seeds_replay() {
    crate::replay_fuzz_inputs("tunnel_send", fuzz_tunnel_send::check);
}
