//! Builds `sandboxd` as a static binary and hands it to the crate, which embeds it (`include_bytes!`): the
//! runtime then always has the sandboxd that matches its own protocol, also inside a Python wheel.
//!
//! `AGENTHOLD_SANDBOXD_BIN=/path/to/sandboxd` skips the build and embeds that file instead (for packagers
//! who build it separately).

#![allow(clippy::expect_used, clippy::panic)] // a build script fails by panicking

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out.join("sandboxd");
    println!("cargo:rerun-if-env-changed=AGENTHOLD_SANDBOXD_BIN");
    if let Ok(prebuilt) = env::var("AGENTHOLD_SANDBOXD_BIN") {
        std::fs::copy(&prebuilt, &dest).unwrap_or_else(|e| panic!("copy {prebuilt}: {e}"));
        return;
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.join("..");
    let sandboxd = root.join("sandboxd");
    println!("cargo:rerun-if-changed={}", sandboxd.join("src").display());
    println!("cargo:rerun-if-changed={}", sandboxd.join("Cargo.toml").display());
    let target = env::var("TARGET").expect("cargo sets TARGET");
    // A separate target directory: the outer cargo holds the lock on the workspace's own.
    let target_dir = out.join("sandboxd-target");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "sandboxd",
            "--target",
            &target,
            "--target-dir",
        ])
        .arg(&target_dir)
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        // Static: the binary runs in scratch images and in any user image, whatever its libc.
        .env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-feature=+crt-static")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .status()
        .expect("run cargo to build sandboxd");
    assert!(status.success(), "building sandboxd failed");
    let built = target_dir.join(&target).join("release/sandboxd");
    std::fs::copy(&built, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", built.display()));
}
