//! Images without a registry, against the real engine: the sandboxd image from a static binary, the
//! `agenthold/dev` image (built once, then reused), and the clear error for a missing image.
//!
//! These tests leave `agenthold/dev:latest` in place (other tests use it) and nothing else: every
//! container they create and the sandboxd image they build are removed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use agenthold_sandbox::Error;
use agenthold_sandbox::docker::image::{
    DEV_IMAGE, DevImageOptions, INPUTS_LABEL, current_dev_image, ensure_dev_image, ensure_sandboxd_image,
    image_exists, require_image,
};
use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    RemoveImageOptionsBuilder,
};
use futures_util::StreamExt;

async fn docker() -> Docker {
    Docker::connect_with_local_defaults()
        .expect("docker socket")
        .negotiate_version()
        .await
        .expect("docker engine")
}

/// Where the dev image is built: one directory for every test process, so the builder's file lock
/// serialises them.
fn dev_work_dir() -> PathBuf {
    std::env::temp_dir().join("agenthold-image-tests")
}

/// `docker run --rm --network none IMAGE [CMD…]`: exit code and combined output. The container is removed
/// before returning, whatever happened.
async fn run(docker: &Docker, image: &str, cmd: Option<Vec<&str>>) -> (i64, String) {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "agenthold-image-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        cmd: cmd.map(|c| c.into_iter().map(str::to_owned).collect()),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let options = CreateContainerOptionsBuilder::new().name(&name).build();
    docker
        .create_container(Some(options), body)
        .await
        .expect("create container");
    let result = async {
        docker.start_container(&name, None).await?;
        let code = match docker
            .wait_container(&name, None)
            .next()
            .await
            .expect("wait answers")
        {
            Ok(response) => response.status_code,
            Err(bollard::errors::Error::DockerContainerWaitError { code, .. }) => code,
            Err(e) => return Err(e),
        };
        let logs = LogsOptionsBuilder::new().stdout(true).stderr(true).build();
        let chunks: Vec<_> = docker.logs(&name, Some(logs)).collect().await;
        let mut output = String::new();
        for chunk in chunks {
            output.push_str(&chunk?.to_string());
        }
        Ok::<_, bollard::errors::Error>((code, output))
    }
    .await;
    let remove = RemoveContainerOptionsBuilder::new().force(true).build();
    docker
        .remove_container(&name, Some(remove))
        .await
        .expect("remove container");
    result.expect("run container")
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// A small static binary that prints its arguments; a nonce in its source makes it (and its image) new on
/// every run, so the test really builds.
fn static_test_binary(dir: &Path) -> Vec<u8> {
    let since_epoch = std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos();
    let nonce = format!("{}-{since_epoch}", std::process::id());
    let src = dir.join("hello.rs");
    let program = format!(
        "fn main() {{ let a: Vec<String> = std::env::args().skip(1).collect(); \
         println!(\"static-hello {{}}\", a.join(\" \")); \
         if std::env::var_os(\"NONCE\").is_some() {{ println!({nonce:?}); }} }}"
    );
    std::fs::write(&src, program).unwrap();
    let out = dir.join("hello");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let status = Command::new(rustc)
        .args([
            "-O",
            "-C",
            "target-feature=+crt-static",
            "--target",
            "x86_64-unknown-linux-gnu",
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run rustc");
    assert!(status.success(), "rustc failed");
    std::fs::read(out).unwrap()
}

#[tokio::test]
#[ignore = "needs Docker: run with make test"]
async fn sandboxd_image_runs_its_binary_and_is_reused() {
    let docker = docker().await;
    let dir = tempfile::tempdir().unwrap();
    let binary = static_test_binary(dir.path());

    let expected = format!("agenthold/sandboxd:{}", &sha256_hex(&binary)[..12]);
    assert!(
        !image_exists(&docker, &expected).await.unwrap(),
        "a fresh binary has no image yet"
    );
    let started = Instant::now();
    let first = ensure_sandboxd_image(&docker, &binary)
        .await
        .expect("build the sandboxd image");
    eprintln!("sandboxd image built in {:?}", started.elapsed());
    let result = async {
        assert_eq!(first.name, expected);
        assert!(first.id.starts_with("sha256:"), "{first:?}");
        let inspect = docker.inspect_image(&first.name).await.unwrap();
        let config = inspect.config.unwrap();
        assert_eq!(config.cmd.unwrap(), ["/sandboxd", "hold"]);
        assert!(config.labels.unwrap().contains_key(INPUTS_LABEL));

        let (code, output) = run(&docker, &first.name, None).await;
        assert_eq!((code, output.trim()), (0, "static-hello hold"));

        let started = Instant::now();
        let second = ensure_sandboxd_image(&docker, &binary)
            .await
            .expect("reuse the sandboxd image");
        assert_eq!(second, first);
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "reuse took {:?}",
            started.elapsed()
        );
    };
    let outcome = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(result)).await;
    let remove = RemoveImageOptionsBuilder::new().force(true).build();
    docker
        .remove_image(&first.id, Some(remove), None)
        .await
        .expect("remove the test image");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[tokio::test]
#[ignore = "needs Docker: run with make test"]
async fn dev_image_is_built_once_then_reused() {
    let docker = docker().await;
    let opts = DevImageOptions::default();
    let started = Instant::now();
    let first = ensure_dev_image(&docker, &dev_work_dir(), &opts)
        .await
        .expect("build or reuse the dev image");
    eprintln!("first ensure: {:?}", started.elapsed());
    assert_eq!(first.name, DEV_IMAGE);

    let started = Instant::now();
    let second = ensure_dev_image(&docker, &dev_work_dir(), &opts)
        .await
        .expect("reuse the dev image");
    let reuse = started.elapsed();
    eprintln!("second ensure: {reuse:?}");
    assert_eq!(second, first);
    assert!(reuse < Duration::from_secs(1), "reuse took {reuse:?}");
    assert_eq!(current_dev_image(&docker, &opts).await.unwrap(), Some(first));
    assert!(
        !dev_work_dir().join("dev-rootfs").exists(),
        "the rootfs is removed after the import"
    );
}

#[tokio::test]
#[ignore = "needs Docker: run with make test"]
async fn dev_image_has_the_tools_agents_use() {
    let docker = docker().await;
    let image = ensure_dev_image(&docker, &dev_work_dir(), &DevImageOptions::default())
        .await
        .unwrap();
    let script = "set -e
        curl --version | head -n1
        git --version
        python3 -c 'import requests; print(\"requests\", requests.__version__)'
        node -e 'console.log(\"node\", process.version, typeof fetch)'
        test -s /etc/ssl/certs/ca-certificates.crt && echo ca-bundle-ok
        test -d /usr/local/share/ca-certificates && echo ca-dir-ok
        command -v update-ca-certificates
        ip route; echo ip-ok
        ps -p 1 -o pid= && echo ps-ok";
    let (code, output) = run(&docker, &image.id, Some(vec!["/bin/bash", "-c", script])).await;
    assert_eq!(code, 0, "{output}");
    for expected in [
        "curl ",
        "git version",
        "requests ",
        "node v",
        " function",
        "ca-bundle-ok",
        "ca-dir-ok",
        "ip-ok",
        "ps-ok",
    ] {
        assert!(output.contains(expected), "missing {expected:?} in:\n{output}");
    }
}

#[tokio::test]
#[ignore = "needs Docker: run with make test"]
async fn a_missing_image_fails_fast_with_the_command_to_build_it() {
    let docker = docker().await;
    let missing = format!("agenthold/missing-{}:never-built", std::process::id());
    let started = Instant::now();
    assert!(!image_exists(&docker, &missing).await.unwrap());
    let err = require_image(&docker, &missing).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&missing) && message.contains("agenthold image build-dev"),
        "{message}"
    );
}
