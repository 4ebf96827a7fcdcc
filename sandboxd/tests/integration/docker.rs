//! `sandboxd boot` as the real PID 1 of a container (`--network none`, image `agenthold/dev:latest`, never
//! pulled), the way the runtime uses it: binary bind-mounted read-only at `/.agenthold/bin/sandboxd`, boot token
//! and CA copied in before every start, every exec through `sandboxd run`.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sandboxd::contract::{self, BOOT_FILE, CA_BUNDLE, CA_FILE, SANDBOXD};

use crate::TOKEN;

/// The image the runtime's dev sandboxes use (Debian with a shell and ca-certificates).
const IMAGE: &str = "agenthold/dev:latest";
const CA: &str = "-----BEGIN CERTIFICATE-----\nQUdFTlRIT0xEQ0E=\n-----END CERTIFICATE-----\n";

/// Runs `docker ARGS...` and returns its output.
fn docker(args: &[&str]) -> Output {
    Command::new("docker").args(args).output().expect("docker CLI")
}

/// Runs `docker ARGS...` and fails the test unless it succeeds; returns stdout.
fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A container removed when the test ends.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.0]);
    }
}

impl Container {
    /// Copies the boot token and the CA in (as the runtime does for a sandbox made before `BOOT_DIR`, the
    /// other paths of which are the runtime suite's) and starts the container.
    fn start(&self, dir: &std::path::Path) {
        let staging = dir.join(contract::relative(contract::DIR));
        std::fs::create_dir_all(dir.join(contract::relative(contract::BOOT_DIR))).unwrap();
        std::fs::write(dir.join(contract::relative(BOOT_FILE)), TOKEN).unwrap();
        std::fs::write(dir.join(contract::relative(CA_FILE)), CA).unwrap();
        // Copying the directory works before the first start, when /.agenthold does not exist yet.
        docker_ok(&["cp", staging.to_str().unwrap(), &format!("{}:/", self.0)]);
        docker_ok(&["start", &self.0]);
    }

    /// `docker exec <ctr> sandboxd run -- ARGV...`: (exit code, stdout).
    fn run(&self, argv: &[&str]) -> (i32, String) {
        let out = docker(&[&["exec", &self.0, SANDBOXD, "run", "--"], argv].concat());
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}

#[test]
#[ignore = "needs Docker and the agenthold/dev image: run with make test"]
fn boot_as_pid_1_in_a_container() {
    let inspect = docker(&["image", "inspect", IMAGE]);
    assert!(
        inspect.status.success(),
        "image {IMAGE} is missing: build it with `agenthold image build-dev`"
    );
    let dir = tempfile::tempdir().unwrap();
    let name = format!("sandboxd-test-{}", std::process::id());
    let volume = format!("{}:{SANDBOXD}:ro", env!("CARGO_BIN_EXE_sandboxd"));
    docker_ok(&[
        "create",
        "--name",
        &name,
        "--network",
        "none",
        "--pull",
        "never",
        "--cap-drop",
        "NET_RAW",
        "--security-opt",
        "no-new-privileges",
        "-v",
        &volume,
        "--entrypoint",
        SANDBOXD,
        IMAGE,
        "boot",
    ]);
    let ctr = Container(name);
    ctr.start(dir.path());

    let (code, _) = ctr.run(&["test", "-e", BOOT_FILE]);
    assert_eq!(code, 1, "the boot file is deleted");
    assert_eq!(ctr.run(&["sh", "-c", "exit 7"]).0, 7);
    let (code, _) = ctr.run(&["sh", "-c", "cat /proc/1/environ > /dev/null 2>&1"]);
    assert_ne!(
        code, 0,
        "PID 1's memory and environment are closed to the sandbox"
    );
    let (code, out) = ctr.run(&[
        "grep",
        "-c",
        "QUdFTlRIT0xEQ0E=",
        "/etc/ssl/certs/ca-certificates.crt",
    ]);
    assert_eq!((code, out.trim()), (0, "1"));

    // Orphans of execs are reparented to PID 1 and must not stay zombies.
    assert_eq!(
        ctr.run(&["sh", "-c", "for i in 1 2 3 4 5; do (sleep 0.1 &) ; done"])
            .0,
        0
    );
    std::thread::sleep(Duration::from_millis(800));
    let (_, states) = ctr.run(&["sh", "-c", "cat /proc/[0-9]*/stat"]);
    assert!(
        !states.lines().any(|l| l
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))),
        "{states}"
    );

    // A timeout kills the whole tree from `docker exec` too.
    let timeout = [
        "exec",
        &ctr.0,
        SANDBOXD,
        "run",
        "--timeout-ms",
        "300",
        "--",
        "sh",
        "-c",
        "sleep 30 & sleep 30",
    ];
    assert_eq!(docker(&timeout).status.code(), Some(124));
    let (_, left) = ctr.run(&["sh", "-c", "grep -l '^sleep$' /proc/[0-9]*/comm || true"]);
    assert_eq!(left.trim(), "", "the timed-out tree is gone");

    // `docker stop` sends SIGTERM to PID 1: it must exit 0 at once, not after the kill timeout.
    let start = Instant::now();
    docker_ok(&["stop", "-t", "10", &ctr.0]);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "stop took {:?}",
        start.elapsed()
    );
    assert_eq!(
        docker_ok(&["inspect", "-f", "{{.State.ExitCode}}", &ctr.0]).trim(),
        "0"
    );

    // A second start with a fresh token: the CA is still in the trust store exactly once.
    ctr.start(dir.path());
    let (code, out) = ctr.run(&[
        "grep",
        "-c",
        "QUdFTlRIT0xEQ0E=",
        "/etc/ssl/certs/ca-certificates.crt",
    ]);
    assert_eq!((code, out.trim()), (0, "1"));
    let (code, out) = ctr.run(&["grep", "-c", "BEGIN CERTIFICATE", CA_BUNDLE]);
    assert_eq!(code, 0);
    assert!(
        out.trim().parse::<u32>().unwrap() > 100,
        "system roots + CA: {out}"
    );
}
