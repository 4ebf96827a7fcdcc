//! The `custom_runtime` example runs to completion without Docker or root: a process sandbox built through
//! `RuntimeBuilder::sandbox_factory` on the runtime's real gateway (allowed, denied, injected, a policy
//! change, the request log).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;

// covers: C2
#[test]
fn the_custom_runtime_example_runs_on_the_real_gateway_without_docker() {
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("skipped: the example's commands need curl on the host");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_custom_runtime"))
        .env("AGENTHOLD_DATA_DIR", dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "api.example.com: 200",
        "example.org: refused (not on the allowlist)",
        "note.txt holds the placeholder: agenthold-placeholder-",
        "the upstream received Authorization: Some(\"Bearer sk-custom-runtime-real-value\")",
        "api.example.com: refused after set_policy",
        "\"decision\":\"denied\",\"reason\":\"not_in_allowlist\"",
        "\"secret_injected\":true",
        "sandbox removed",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    assert!(
        !stdout.contains("placeholder: sk-"),
        "the sandbox saw the real value:\n{stdout}"
    );
}
