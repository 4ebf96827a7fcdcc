//! `sandboxd run` and `sandboxd kill`: exit codes, timeout of a whole tree, cancel by id, binary-safe stdio.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use sandboxd::contract::RUN_DIR;
use sandboxd::contract::request::{self, Request};

use crate::{Guard, Root, alive, eventually, read_pid};

/// Runs `sandboxd run ARGS...` to completion and returns (exit code, stderr).
fn run(root: &Root, args: &[&str]) -> (i32, String) {
    let out = root
        .sandboxd(&[&["run"], args].concat())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code().expect("exited, not killed"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn exit_codes_pass_through() {
    let root = Root::new();
    assert_eq!(run(&root, &["--", "true"]).0, 0);
    assert_eq!(run(&root, &["--", "sh", "-c", "exit 7"]).0, 7);
    assert_eq!(run(&root, &["sh", "-c", "exit 3"]).0, 3, "-- is optional");
    assert_eq!(run(&root, &["--timeout-ms", "10000", "--", "true"]).0, 0);
}

#[test]
fn death_by_signal_is_128_plus_n() {
    let root = Root::new();
    assert_eq!(run(&root, &["--", "sh", "-c", "kill -TERM $$"]).0, 128 + 15);
    assert_eq!(run(&root, &["--", "sh", "-c", "kill -KILL $$"]).0, 128 + 9);
}

#[test]
fn not_found_is_127_and_not_executable_is_126() {
    let root = Root::new();
    let (code, stderr) = run(&root, &["--", "/nonexistent/agenthold-no-such-command"]);
    assert_eq!(code, 127);
    assert!(stderr.contains("agenthold-no-such-command"), "{stderr}");
    assert_eq!(run(&root, &["--", "agenthold-no-such-command-in-path"]).0, 127);

    let script = root.path("/not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, stderr) = run(&root, &["--", script.to_str().unwrap()]);
    assert_eq!(code, 126, "{stderr}");
    assert!(!stderr.is_empty());
    assert_eq!(
        run(&root, &["--", root.path("/").to_str().unwrap()]).0,
        126,
        "a directory"
    );
}

#[test]
fn usage_errors_exit_125() {
    let root = Root::new();
    assert_eq!(run(&root, &[]).0, 125);
    assert_eq!(run(&root, &["--timeout-ms", "soon", "--", "true"]).0, 125);
    assert_eq!(run(&root, &["--id", "../escape", "--", "true"]).0, 125);
}

#[test]
fn timeout_kills_the_whole_tree_and_exits_124() {
    let root = Root::new();
    let (bg, fg) = (root.path("/bg.pid"), root.path("/fg.pid"));
    let script = format!(
        "sleep 100 & echo $! > {}; echo $$ > {}; sleep 100",
        bg.display(),
        fg.display()
    );
    let start = Instant::now();
    let (code, _) = run(&root, &["--timeout-ms", "500", "--", "sh", "-c", &script]);
    assert_eq!(code, 124);
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_secs(10),
        "{elapsed:?}"
    );
    let (bg, fg) = (read_pid(&bg), read_pid(&fg));
    eventually(Duration::from_secs(5), "both sleeps to be gone", || {
        !alive(bg) && !alive(fg)
    });
}

#[test]
fn pid_file_records_the_group_and_kill_cancels() {
    let root = Root::new();
    let bg = root.path("/bg.pid");
    let script = format!("sleep 100 & echo $! > {}; sleep 100", bg.display());
    let mut runner = Guard::spawn(
        root.sandboxd(&["run", "--id", "exec-1", "--", "sh", "-c", &script])
            .stdin(Stdio::null()),
    );
    let pid_file = root.path(&format!("{RUN_DIR}/exec-1.pid"));
    let pgid = read_pid(&pid_file);
    let bg = read_pid(&bg);
    let mode = std::fs::metadata(root.path(RUN_DIR))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    assert_eq!(
        nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(bg)))
            .unwrap()
            .as_raw(),
        pgid
    );
    assert_ne!(
        pgid,
        nix::unistd::getpgrp().as_raw(),
        "runs in its own process group"
    );

    let status = root.sandboxd(&["kill", "--id", "exec-1"]).status().unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(runner.wait_for(Duration::from_secs(10)).code(), Some(137));
    assert!(!pid_file.exists(), "record removed");
    eventually(Duration::from_secs(5), "the background sleep to be gone", || {
        !alive(bg)
    });

    // Already gone: still 0.
    assert_eq!(
        root.sandboxd(&["kill", "--id", "exec-1"])
            .status()
            .unwrap()
            .code(),
        Some(0)
    );
}

#[test]
fn kill_before_run_records_cancels_the_run() {
    let root = Root::new();
    assert_eq!(
        root.sandboxd(&["kill", "--id", "early"]).status().unwrap().code(),
        Some(0)
    );
    let marker = root.path("/ran");
    let (code, _) = run(&root, &["--id", "early", "--", "touch", marker.to_str().unwrap()]);
    assert_eq!(code, 137);
    assert!(!marker.exists(), "a cancelled command never starts");
    assert!(!root.path(&format!("{RUN_DIR}/early.cancel")).exists());
    // The marker is consumed: the next run with that id runs.
    assert_eq!(run(&root, &["--id", "early", "--", "true"]).0, 0);
}

#[test]
fn kill_refuses_a_bogus_record() {
    let root = Root::new();
    root.write(&format!("{RUN_DIR}/bogus.pid"), "1\n");
    assert_eq!(
        root.sandboxd(&["kill", "--id", "bogus"]).status().unwrap().code(),
        Some(1)
    );
    assert_eq!(root.sandboxd(&["kill"]).status().unwrap().code(), Some(2));
}

#[test]
fn signals_to_run_reach_the_command() {
    let root = Root::new();
    let ready = root.path("/ready");
    let script = format!(
        "trap 'exit 42' TERM; touch {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let mut runner = Guard::spawn(
        root.sandboxd(&["run", "--", "sh", "-c", &script])
            .stdin(Stdio::null()),
    );
    eventually(Duration::from_secs(5), "the trap to be set", || ready.exists());
    runner.signal(Signal::SIGTERM);
    assert_eq!(runner.wait_for(Duration::from_secs(10)).code(), Some(42));
}

#[test]
fn stdio_is_binary_safe() {
    let root = Root::new();
    let input: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    let mut child = root
        .sandboxd(&["run", "--", "sh", "-c", "cat; printf '\\000\\377err' >&2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = {
        let input = input.clone();
        std::thread::spawn(move || stdin.write_all(&input).unwrap())
    };
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout == input, "stdout differs ({} bytes)", out.stdout.len());
    assert_eq!(out.stderr, b"\x00\xfferr");
}

#[test]
fn interactive_command_gets_the_terminal() {
    // `script` (util-linux, essential on Debian) gives sandboxd a pseudo-terminal as its controlling terminal,
    // like `docker exec -t`. The command runs in its own process group; without the hand-over its `read` would
    // be stopped by SIGTTIN and the timeout would fire.
    let root = Root::new();
    let sandboxd = env!("CARGO_BIN_EXE_sandboxd");
    let inner = format!("{sandboxd} run --timeout-ms 5000 -- sh -c 'read x; echo got:$x; exit 3'");
    let mut child = std::process::Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .current_dir(root.path("/"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux");
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("got:hello"),
        "{out:?}"
    );
    assert_eq!(out.status.code(), Some(3));
}

/// Starts `sandboxd run --id ID --request-stdin`, waits a little (the request comes later, as at a hand-out),
/// writes `input` and returns (exit code, stdout, stderr).
fn run_ahead(root: &Root, id: &str, input: Vec<u8>) -> (i32, Vec<u8>, String) {
    let mut child = root
        .sandboxd(&["run", "--id", id, "--request-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (
        out.status.code().expect("exited, not killed"),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn request(argv: &[&str]) -> Request {
    Request {
        argv: argv.iter().map(|a| a.as_bytes().to_vec()).collect(),
        ..Request::default()
    }
}

// covers: P1
/// A `run` started ahead acknowledges its request with one byte before the command's output, runs it with
/// the request's environment on top of its own, in the request's directory, and hands it the rest of stdin.
#[test]
fn a_run_started_ahead_takes_its_command_from_stdin() {
    let root = Root::new();
    let dir = tempfile::tempdir().unwrap();
    let mut req = request(&[
        "sh",
        "-c",
        "printf '%s|%s|%s|' \"$AH_A\" \"$HOME\" \"$PWD\"; cat; exit 7",
    ]);
    req.env = vec![
        (b"AH_A".to_vec(), b"from request".to_vec()),
        (b"HOME".to_vec(), b"/override".to_vec()),
    ];
    req.cwd = Some(dir.path().as_os_str().as_encoded_bytes().to_vec());
    let mut input = req.encode().unwrap();
    input.extend_from_slice(b"the command's stdin\x00\xff");
    let (code, stdout, stderr) = run_ahead(&root, "ahead1", input);
    assert_eq!(code, 7, "{stderr}");
    let mut expected = vec![request::READY];
    expected.extend_from_slice(
        format!(
            "from request|/override|{}|the command's stdin\x00",
            dir.path().display()
        )
        .as_bytes(),
    );
    expected.push(0xff);
    assert_eq!(stdout, expected);
    // Exit codes as for `run -- ARGV`.
    let (code, stdout, _) = run_ahead(
        &root,
        "ahead2",
        request(&["agenthold-no-such-program"]).encode().unwrap(),
    );
    assert_eq!((code, stdout), (127, vec![request::READY]));
}

// covers: P1
/// The request's timeout kills the whole group (124); `kill --id` cancels it like any `run`; a directory
/// that cannot be entered is 126.
#[test]
fn a_run_started_ahead_keeps_timeouts_and_cancel() {
    let root = Root::new();
    let mut req = request(&["sh", "-c", "sleep 30 & sleep 30"]);
    req.timeout_ms = Some(300);
    let started = Instant::now();
    let (code, stdout, _) = run_ahead(&root, "ahead3", req.encode().unwrap());
    assert_eq!((code, stdout), (124, vec![request::READY]));
    assert!(started.elapsed() < Duration::from_secs(10));

    let mut child = root
        .sandboxd(&["run", "--id", "ahead4", "--request-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(&request(&["sleep", "30"]).encode().unwrap())
        .unwrap();
    eventually(Duration::from_secs(10), "the group is recorded", || {
        root.path(&format!("{RUN_DIR}/ahead4.pid")).exists()
    });
    let killed = root.sandboxd(&["kill", "--id", "ahead4"]).status().unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(137));
    assert_eq!(out.stdout, vec![request::READY]);

    let mut req = request(&["true"]);
    req.cwd = Some(b"/nonexistent/agenthold".to_vec());
    let (code, stdout, stderr) = run_ahead(&root, "ahead5", req.encode().unwrap());
    assert_eq!((code, stdout), (126, vec![request::READY]), "{stderr}");
}

// covers: P1
/// A malformed or missing request starts nothing, writes nothing on stdout (so the runtime knows the
/// command never ran) and exits 125.
#[test]
fn a_run_started_ahead_refuses_a_bad_request() {
    let root = Root::new();
    let marker = root.path("/started");
    let good = request(&["sh", "-c", &format!("touch {}", marker.display())])
        .encode()
        .unwrap();
    let mut bad_length = good.clone();
    bad_length.truncate(good.len() - 1);
    let mut wrong_version = good;
    wrong_version[14] = b'9';
    for input in [Vec::new(), b"garbage\n".to_vec(), bad_length, wrong_version] {
        let (code, stdout, stderr) = run_ahead(&root, "ahead6", input);
        assert_eq!(code, 125, "{stderr}");
        assert!(stdout.is_empty(), "{stdout:?}");
        assert!(stderr.contains("run:"), "{stderr}");
        assert!(!marker.exists(), "nothing started");
    }
}

// The fuzz target's checks, included so that `cargo test` replays `fuzz/{regressions,seeds}/run_request`.
#[allow(unreachable_pub, dead_code)]
#[path = "../../../fuzz/src/run_request.rs"]
mod fuzz_run_request;

#[test]
fn fuzz_regressions_and_seeds_replay() {
    crate::replay_fuzz_inputs("run_request", fuzz_run_request::check);
}
