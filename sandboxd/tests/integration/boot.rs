//! `sandboxd boot` and `sandboxd hold`: token taken and deleted, CA bundle, workload exit status, signals and
//! reaping.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use sandboxd::contract::{BOOT_FILE, CA_BUNDLE, CA_FILE, RUN_DIR};

use crate::{Guard, Root, TOKEN, children_of, eventually};

const SYSTEM_ROOTS: &str = "-----BEGIN CERTIFICATE-----\nU1lTVEVNUk9PVA==\n-----END CERTIFICATE-----\n";
const CA: &str = "-----BEGIN CERTIFICATE-----\nQUdFTlRIT0xEQ0E=\n-----END CERTIFICATE-----\n";

/// A root prepared as the runtime leaves it before a start: boot token, CA and a Debian-like trust store.
fn prepared_root() -> Root {
    let root = Root::new();
    root.write(BOOT_FILE, TOKEN);
    root.write(CA_FILE, CA);
    root.write("/etc/ssl/certs/ca-certificates.crt", SYSTEM_ROOTS);
    std::fs::create_dir_all(root.path("/usr/local/share/ca-certificates")).unwrap();
    root
}

/// Runs `sandboxd boot ARGS...` to completion; returns (exit code, stderr).
fn boot(root: &Root, args: &[&str]) -> (i32, String) {
    let out = root
        .sandboxd(&[&["boot"], args].concat())
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
fn token_is_read_and_deleted_before_the_workload_starts() {
    let root = prepared_root();
    let boot_file = root.path(BOOT_FILE);
    let check = format!("test -e {} && exit 1; exit 5", boot_file.display());
    let (code, stderr) = boot(&root, &["--", "sh", "-c", &check]);
    assert_eq!(code, 5, "{stderr}");
    assert!(!boot_file.exists());
    assert!(!stderr.contains(TOKEN));
}

#[test]
fn missing_or_malformed_token_fails_the_boot() {
    let root = prepared_root();
    std::fs::remove_file(root.path(BOOT_FILE)).unwrap();
    let out = root
        .sandboxd(&["boot", "--", "true"])
        .env("AGENTHOLD_BOOT_WAIT_MS", "200")
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no boot token"));

    root.write(BOOT_FILE, "NOT A TOKEN");
    let (code, stderr) = boot(&root, &["--", "true"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("malformed") && !stderr.contains("NOT A TOKEN"),
        "{stderr}"
    );
    assert!(!root.path(BOOT_FILE).exists(), "a bad token file is deleted too");
}

#[test]
fn boot_waits_for_a_late_token() {
    let root = prepared_root();
    std::fs::remove_file(root.path(BOOT_FILE)).unwrap();
    let mut booting = Guard::spawn(root.sandboxd(&["boot", "--", "true"]).stdin(Stdio::null()));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        booting.0.try_wait().unwrap().is_none(),
        "still waiting for the token"
    );
    root.write(BOOT_FILE, TOKEN);
    assert_eq!(booting.wait_for(Duration::from_secs(10)).code(), Some(0));
}

#[test]
fn ca_bundle_is_built_and_the_ca_appended_once() {
    let root = prepared_root();
    for _ in 0..2 {
        root.write(BOOT_FILE, TOKEN);
        let (code, stderr) = boot(&root, &["--", "true"]);
        assert_eq!(code, 0, "{stderr}");
        assert!(!stderr.contains("CA:"), "{stderr}");
    }
    assert_eq!(root.read(CA_BUNDLE), format!("{SYSTEM_ROOTS}{CA}"));
    let system = root.read("/etc/ssl/certs/ca-certificates.crt");
    assert!(system.starts_with(SYSTEM_ROOTS));
    assert_eq!(system.matches("QUdFTlRIT0xEQ0E=").count(), 1, "{system}");
    assert_eq!(root.read("/usr/local/share/ca-certificates/agenthold.crt"), CA);
}

#[test]
fn ca_problems_do_not_stop_the_boot() {
    let root = Root::new();
    root.write(BOOT_FILE, TOKEN);
    let (code, stderr) = boot(&root, &["--", "sh", "-c", "exit 4"]);
    assert_eq!(code, 4);
    assert!(stderr.contains("ca.crt"), "{stderr}");
}

#[test]
fn workload_exit_status_passes_through() {
    let root = prepared_root();
    assert_eq!(boot(&root, &["--", "sh", "-c", "exit 9"]).0, 9);
    root.write(BOOT_FILE, TOKEN);
    assert_eq!(boot(&root, &["--", "sh", "-c", "kill -KILL $$"]).0, 137);
    root.write(BOOT_FILE, TOKEN);
    assert_eq!(boot(&root, &["--", "/nonexistent/workload"]).0, 127);
}

#[test]
fn signals_are_forwarded_to_the_workload() {
    let root = prepared_root();
    let ready = root.path("/ready");
    let script = format!(
        "trap 'exit 42' TERM; trap ':' HUP; touch {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let mut booted = Guard::spawn(
        root.sandboxd(&["boot", "--", "sh", "-c", &script])
            .stdin(Stdio::null()),
    );
    eventually(Duration::from_secs(10), "the workload's traps", || ready.exists());
    booted.signal(Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        booted.0.try_wait().unwrap().is_none(),
        "SIGHUP is forwarded, not fatal"
    );
    booted.signal(Signal::SIGTERM);
    assert_eq!(booted.wait_for(Duration::from_secs(10)).code(), Some(42));
}

#[test]
fn without_a_workload_boot_waits_for_sigterm() {
    let root = prepared_root();
    let mut booted = Guard::spawn(root.sandboxd(&["boot"]).stdin(Stdio::null()));
    eventually(Duration::from_secs(10), "the token to be taken", || {
        !root.path(BOOT_FILE).exists()
    });
    booted.signal(Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        booted.0.try_wait().unwrap().is_none(),
        "SIGHUP does not stop an idle boot"
    );
    booted.signal(Signal::SIGTERM);
    assert_eq!(booted.wait_for(Duration::from_secs(5)).code(), Some(0));
}

#[test]
fn orphans_are_adopted_and_reaped() {
    let root = prepared_root();
    // The subshell exits at once; its `sleep` is orphaned, adopted by sandboxd (init or subreaper), and exits
    // 0.3 s later while the workload still runs.
    let mut booted = Guard::spawn(
        root.sandboxd(&["boot", "--", "sh", "-c", "(sleep 0.3 &); exec sleep 3"])
            .stdin(Stdio::null()),
    );
    let pid = booted.pid();
    eventually(Duration::from_secs(5), "an adopted orphan", || {
        children_of(pid).len() == 2
    });
    std::thread::sleep(Duration::from_millis(800));
    let children = children_of(pid);
    assert_eq!(children.len(), 1, "the orphan was reaped: {children:?}");
    assert!(children.iter().all(|(_, state, _)| *state != 'Z'), "{children:?}");
    booted.signal(Signal::SIGTERM);
    assert_eq!(booted.wait_for(Duration::from_secs(5)).code(), Some(128 + 15));
}

#[test]
fn stale_run_records_are_cleared_at_boot() {
    let root = prepared_root();
    let (old_pid, old_cancel) = (format!("{RUN_DIR}/old.pid"), format!("{RUN_DIR}/old.cancel"));
    root.write(&old_pid, "4242\n");
    root.write(&old_cancel, "");
    assert_eq!(boot(&root, &["--", "true"]).0, 0);
    assert!(!root.path(&old_pid).exists());
    assert!(!root.path(&old_cancel).exists());
}

#[test]
fn hold_sleeps_until_sigterm() {
    let root = Root::new();
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let mut held = Guard::spawn(root.sandboxd(&["hold"]).stdin(Stdio::null()));
        std::thread::sleep(Duration::from_millis(300));
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", held.pid())).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        // utime + stime in clock ticks (fields 14 and 15 of stat; 12 and 13 after the name).
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        assert!(ticks <= 5, "hold used {ticks} ticks of CPU");
        assert_eq!(fields[0], "S", "sleeping");
        held.signal(signal);
        assert_eq!(held.wait_for(Duration::from_secs(5)).code(), Some(0));
    }
}

#[test]
fn version_is_printed() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("sandboxd {}\n", env!("CARGO_PKG_VERSION"))
    );
}
