//! The harness image `agenthold/harness:latest`: the dev image plus the real `claude` and `codex` native
//! binaries from npm (pinned versions, pinned sha512 integrity) and a non-root user `agent` (uid 1000) whose
//! home is `/workspace`, the agent's volume.
//!
//! Built with the engine's classic build API from a local `FROM agenthold/dev:latest` (never pulled: the
//! dev image is required first) and a context holding only the Dockerfile and the two binaries. Downloading
//! the npm tarballs is the caller's job (the server's `agenthold image build-harness` does an HTTPS GET);
//! this module says what to fetch ([`HARNESS_PACKAGES`], [`tarball_url`]), checks what was fetched
//! ([`verify_integrity`]), takes the binary out ([`extract_binary`]) and builds ([`build_harness_image`]).
//! Reuse follows the dev image's rule: the label [`INPUTS_LABEL`] is the SHA-256 of the dev image's id,
//! the packages with their integrity, and the recipe.
// enforces: P1

use std::path::Path;
use std::time::Instant;

use base64::Engine as _;
use bollard::Docker;
use bollard::query_parameters::BuildImageOptionsBuilder;
use bytes::BytesMut;
use futures_util::StreamExt;
use sha2::{Digest, Sha256, Sha512};
use tokio::io::AsyncReadExt;

use super::image::{
    BUILD_LOCK, DEV_IMAGE, IMPORT_TIMEOUT, INPUTS_LABEL, ImageRef, current, inspect, lock_file,
    remove_unused, tag, tail,
};
use crate::{Error, Result};

/// The harness image.
pub const HARNESS_IMAGE: &str = "agenthold/harness:latest";
/// The non-root user harness processes run as; its home is the agent's volume.
pub const AGENT_USER: &str = "agent";
/// Its uid and gid.
pub const AGENT_UID: u32 = 1000;
/// Its home: the agent's volume (the sandbox's working directory).
pub const AGENT_HOME: &str = "/workspace";
/// The npm registry used unless the caller names another.
pub const DEFAULT_REGISTRY: &str = "https://registry.npmjs.org";
/// Bumped whenever the Dockerfile changes in a way the other inputs do not show.
/// 2: no `chmod` of the binaries in the `RUN` layer (it copied 700 MB again); the context has them 0755.
/// 3: several binaries per package (the packages' inputs name them).
const FORMAT_VERSION: u32 = 3;

/// One npm package whose native binary goes into the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HarnessPackage {
    /// The npm package name (`@scope/name`).
    pub package: &'static str,
    /// The pinned version.
    pub version: &'static str,
    /// The pinned `dist.integrity` (`sha512-<base64>`) from `npm view PACKAGE@VERSION dist.integrity`.
    pub integrity: &'static str,
    /// The binaries taken from the tarball: `(path inside the tarball, name in the image's
    /// /usr/local/bin)`.
    pub binaries: &'static [(&'static str, &'static str)],
}

impl HarnessPackage {
    /// The tarball's file name (`name-version.tgz`, as the registry serves it and the cache keeps it).
    #[must_use]
    pub fn tarball_name(&self) -> String {
        let base = self.package.rsplit('/').next().unwrap_or(self.package);
        format!("{base}-{}.tgz", self.version)
    }
}

/// Claude Code's Linux x64 native build and the Codex CLI's Linux x64 build (a static musl binary).
pub const HARNESS_PACKAGES: [HarnessPackage; 2] = [
    HarnessPackage {
        package: "@anthropic-ai/claude-code-linux-x64",
        version: "2.1.332",
        integrity: "sha512-f4JWhzwYutJIHScC7/dYOPX6s28tt7ZADhsOi8zwOHq5fFPEuUeChh2NMfinSg0GrUckYxaeebC4h0DqiKzLcw==",
        binaries: &[("package/claude", "claude")],
    },
    HarnessPackage {
        package: "@openai/codex",
        version: "0.171.0-linux-x64",
        integrity: "sha512-l66NZkQgdk2C3pbcfULDz42yEUB581MVA6I+Y43Wp4OIqEy73HCdmZ0GTjeAHY2ycuH4N00d9VsLrwT1jxshTw==",
        // Codex looks for its code-mode host beside its own executable; the default model of 0.171 runs
        // every tool through it.
        binaries: &[
            ("package/vendor/x86_64-unknown-linux-musl/bin/codex", "codex"),
            (
                "package/vendor/x86_64-unknown-linux-musl/bin/codex-code-mode-host",
                "codex-code-mode-host",
            ),
        ],
    },
];

/// The registry URL of `pkg`'s tarball: `{registry}/{package}/-/{name}-{version}.tgz`.
#[must_use]
pub fn tarball_url(registry: &str, pkg: &HarnessPackage) -> String {
    format!(
        "{}/{}/-/{}",
        registry.trim_end_matches('/'),
        pkg.package,
        pkg.tarball_name()
    )
}

/// An incremental check of a download against a pinned `sha512-<base64>` integrity.
#[derive(Debug, Clone, Default)]
pub struct IntegrityCheck {
    hash: Sha512,
}

impl IntegrityCheck {
    /// Feed the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.hash.update(bytes);
    }

    /// `Ok` if everything fed hashes to `integrity`; else [`Error::Unavailable`] with both values.
    ///
    /// # Errors
    /// [`Error::Unavailable`] on a mismatch or a malformed integrity string.
    pub fn finish(self, integrity: &str, what: &str) -> Result<()> {
        let Some(expected) = integrity.strip_prefix("sha512-") else {
            return Err(Error::Unavailable {
                problem: format!("{what}: integrity {integrity:?} is not sha512-<base64>"),
            });
        };
        let got = base64::engine::general_purpose::STANDARD.encode(self.hash.finalize());
        if got == expected {
            Ok(())
        } else {
            Err(Error::Unavailable {
                problem: format!(
                    "{what}: integrity mismatch (expected sha512-{expected}, got sha512-{got}); the file \
                     was not used"
                ),
            })
        }
    }
}

/// Check the file at `path` against `integrity` (`sha512-<base64>`).
///
/// # Errors
/// [`Error::Io`] when the file cannot be read; [`Error::Unavailable`] on a mismatch.
pub async fn verify_integrity(path: &Path, integrity: &str) -> Result<()> {
    let mut file = tokio::fs::File::open(path)
        .await
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let mut check = IntegrityCheck::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .await
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        if n == 0 {
            break;
        }
        check.update(&buf[..n]);
    }
    check.finish(integrity, &path.display().to_string())
}

/// Take `member` out of the gzipped tarball `tgz` into the file `dest` (mode 0755).
///
/// # Errors
/// [`Error::Unavailable`] when `tar` fails or the member is missing; [`Error::Io`] for local files.
pub async fn extract_binary(tgz: &Path, member: &str, dest: &Path) -> Result<()> {
    // Streamed straight into the file: the binaries are hundreds of megabytes. Not `Command::output`, which
    // replaces the stdout set here with a pipe (the binary would land in memory and the file stay empty).
    let file = std::fs::File::create(dest).map_err(|e| Error::io(format!("create {}", dest.display()), e))?;
    let output = tokio::process::Command::new("tar")
        .arg("-xzOf")
        .arg(tgz)
        .arg("--")
        .arg(member)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(file))
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::io("run tar", e))?
        .wait_with_output()
        .await
        .map_err(|e| Error::io("run tar", e))?;
    let size = tokio::fs::metadata(dest).await.map_or(0, |m| m.len());
    if !output.status.success() || size == 0 {
        let _ = tokio::fs::remove_file(dest).await;
        return Err(Error::Unavailable {
            problem: format!(
                "{member} from {} ({}): {}",
                tgz.display(),
                output.status,
                tail(&output.stderr, 5)
            ),
        });
    }
    use std::os::unix::fs::PermissionsExt as _;
    tokio::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))
        .await
        .map_err(|e| Error::io(format!("chmod {}", dest.display()), e))
}

/// SHA-256 (hex) of what the harness image is built from: the dev image's id, each package (name,
/// version, integrity, member) and the recipe version.
#[must_use]
pub fn harness_inputs_hash(dev_image_id: &str) -> String {
    let mut text = format!("format={FORMAT_VERSION}\nfrom={dev_image_id}\nuser={AGENT_USER}:{AGENT_UID}\n");
    for p in &HARNESS_PACKAGES {
        text.push_str(&format!("package={}@{} {}\n", p.package, p.version, p.integrity));
        for (member, binary) in p.binaries {
            text.push_str(&format!("binary={member} -> {binary}\n"));
        }
    }
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// `agenthold/harness:latest` if it exists and was built from the current dev image and packages; `None`
/// when it or the dev image is missing, or it is stale.
///
/// # Errors
/// [`Error::Engine`] when the engine fails.
pub async fn current_harness_image(docker: &Docker) -> Result<Option<ImageRef>> {
    let Some((dev_id, _)) = inspect(docker, DEV_IMAGE).await? else {
        return Ok(None);
    };
    current(docker, HARNESS_IMAGE, &harness_inputs_hash(&dev_id)).await
}

/// Every binary's name in the image, in [`HARNESS_PACKAGES`] order.
#[must_use]
pub fn binary_names() -> Vec<&'static str> {
    HARNESS_PACKAGES
        .iter()
        .flat_map(|p| p.binaries.iter().map(|(_, name)| *name))
        .collect()
}

/// The Dockerfile of the harness image (the binaries sit beside it in the context).
fn dockerfile(inputs: &str) -> String {
    let binaries = binary_names();
    format!(
        "FROM {DEV_IMAGE}\n\
         COPY {bins} /usr/local/bin/\n\
         RUN groupadd --gid {AGENT_UID} {AGENT_USER} \\\n \
         && useradd --uid {AGENT_UID} --gid {AGENT_UID} --home-dir {AGENT_HOME} --no-create-home \
         --shell /bin/bash {AGENT_USER} \\\n \
         && mkdir -p {AGENT_HOME} && chown {AGENT_UID}:{AGENT_UID} {AGENT_HOME} && chmod 0755 {AGENT_HOME}\n\
         LABEL {INPUTS_LABEL}={inputs}\n",
        bins = binaries.join(" "),
    )
}

/// An exclusive lock on harness builds using `work_dir` (a file lock, held until dropped): take it before
/// assembling the context, then check [`current_harness_image`] again, since another process may have
/// built it meanwhile.
///
/// # Errors
/// [`Error::Io`] when the lock file cannot be created or locked.
pub async fn lock_harness_build(work_dir: &Path) -> Result<HarnessBuildLock> {
    tokio::fs::create_dir_all(work_dir)
        .await
        .map_err(|e| Error::io(format!("create {}", work_dir.display()), e))?;
    Ok(HarnessBuildLock {
        _lock: lock_file(work_dir.join("harness-image.lock")).await?,
    })
}

/// The lock [`lock_harness_build`] holds.
#[derive(Debug)]
pub struct HarnessBuildLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// Build `agenthold/harness:latest` from `context`, a directory holding the verified binaries named as
/// [`binary_names`] (this writes the Dockerfile beside them). The dev image must exist; the
/// build runs without network and never pulls. Returns the tagged image; the image the tag named before is
/// removed when unused.
///
/// # Errors
/// [`Error::Unavailable`] when the dev image is missing or the build fails (with the build's last lines);
/// [`Error::Io`] for local files; [`Error::Engine`] when the engine fails.
pub async fn build_harness_image(docker: &Docker, context: &Path) -> Result<ImageRef> {
    let _guard = BUILD_LOCK.lock().await;
    let Some((dev_id, _)) = inspect(docker, DEV_IMAGE).await? else {
        return Err(Error::Unavailable {
            problem: format!("{DEV_IMAGE} is missing: build it first (`agenthold image build-dev`)"),
        });
    };
    let inputs = harness_inputs_hash(&dev_id);
    for name in binary_names() {
        let path = context.join(name);
        if !path.is_file() {
            return Err(Error::Unavailable {
                problem: format!("{} is missing from the build context", path.display()),
            });
        }
    }
    tokio::fs::write(context.join("Dockerfile"), dockerfile(&inputs))
        .await
        .map_err(|e| Error::io("write the Dockerfile", e))?;
    let started = Instant::now();
    let before = inspect(docker, HARNESS_IMAGE).await?;
    let id = build(docker, context).await?;
    tag(docker, &id, HARNESS_IMAGE).await?;
    if let Some((old, _)) = before
        && old != id
    {
        remove_unused(docker, &old).await;
    }
    tracing::info!(image = HARNESS_IMAGE, %id, elapsed_ms = started.elapsed().as_millis(), "harness image built");
    Ok(ImageRef {
        name: HARNESS_IMAGE.to_owned(),
        id,
    })
}

/// Stream `tar -C context -c .` to the classic builder (no pull, no network); the new image's id.
async fn build(docker: &Docker, context: &Path) -> Result<String> {
    let mut child = tokio::process::Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(context)
        .args(["-cf", "-", "."])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::io("run tar", e))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::io("tar stdout", std::io::ErrorKind::Other.into()))?;
    let chunks = futures_util::stream::try_unfold(stdout, |mut out| async move {
        let mut buf = BytesMut::with_capacity(256 * 1024);
        let n = out.read_buf(&mut buf).await?;
        Ok::<_, std::io::Error>((n > 0).then(|| (buf.freeze(), out)))
    });
    let options = BuildImageOptionsBuilder::new()
        .dockerfile("Dockerfile")
        .rm(true)
        .forcerm(true)
        .networkmode("none")
        .build();
    let docker = docker.clone().with_timeout(IMPORT_TIMEOUT);
    let mut stream = docker.build_image(options, None, Some(bollard::body_try_stream(chunks.boxed())));
    let mut id = None;
    let mut log = String::new();
    while let Some(info) = stream.next().await {
        let info = match info {
            Ok(info) => info,
            Err(e) => {
                return Err(Error::Unavailable {
                    problem: format!(
                        "building {HARNESS_IMAGE} failed: {e}; last lines: {}",
                        tail(log.as_bytes(), 10)
                    ),
                });
            }
        };
        if let Some(line) = &info.stream {
            log.push_str(line);
        }
        if let Some(aux) = info.aux.and_then(|a| a.id) {
            id = Some(aux);
        }
        if let Some(detail) = info.error_detail.and_then(|d| d.message) {
            return Err(Error::Unavailable {
                problem: format!(
                    "building {HARNESS_IMAGE} failed: {detail}; last lines: {}",
                    tail(log.as_bytes(), 10)
                ),
            });
        }
    }
    let _ = child.wait().await;
    id.ok_or_else(|| Error::Unavailable {
        problem: format!(
            "building {HARNESS_IMAGE} reported no image id; last lines: {}",
            tail(log.as_bytes(), 10)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_follow_the_registry_layout() {
        assert_eq!(
            tarball_url("https://registry.npmjs.org/", &HARNESS_PACKAGES[0]),
            "https://registry.npmjs.org/@anthropic-ai/claude-code-linux-x64/-/claude-code-linux-x64-2.1.332.tgz"
        );
        assert_eq!(
            tarball_url(DEFAULT_REGISTRY, &HARNESS_PACKAGES[1]),
            "https://registry.npmjs.org/@openai/codex/-/codex-0.171.0-linux-x64.tgz"
        );
    }

    #[test]
    fn integrity_accepts_only_the_pinned_hash() {
        let mut ok = IntegrityCheck::default();
        ok.update(b"hello");
        // sha512("hello"), base64.
        let pinned =
            "sha512-m3HSJL1i83hdltRq0+o9czGb+8KJDKra4t/3JRlnPKcjI8PZm6XBHXx6zG4UuMXaDEZjR1wuXDre9G9zvN7AQw==";
        ok.clone().finish(pinned, "x").unwrap();
        let err = ok.clone().finish("sha512-AAAA", "x").unwrap_err();
        assert!(err.to_string().contains("integrity mismatch"), "{err}");
        assert!(ok.finish("sha256-abc", "x").is_err());
        let mut other = IntegrityCheck::default();
        other.update(b"hellO");
        assert!(other.finish(pinned, "x").is_err());
    }

    #[test]
    fn inputs_follow_the_dev_image_and_the_dockerfile_names_the_user() {
        assert_eq!(harness_inputs_hash("sha256:a"), harness_inputs_hash("sha256:a"));
        assert_ne!(harness_inputs_hash("sha256:a"), harness_inputs_hash("sha256:b"));
        let file = dockerfile("abc");
        assert!(file.starts_with("FROM agenthold/dev:latest\n"), "{file}");
        assert!(
            file.contains("COPY claude codex codex-code-mode-host /usr/local/bin/"),
            "{file}"
        );
        assert!(
            file.contains("--uid 1000") && file.contains("--home-dir /workspace"),
            "{file}"
        );
        assert!(file.contains("chown 1000:1000 /workspace"), "{file}");
        assert!(file.contains("LABEL agenthold.inputs=abc"), "{file}");
    }

    /// A tarball made with the real `tar` and `gzip`: the member lands in the file (not in memory, which
    /// `Command::output` would do), executable; a missing member is an error and leaves no file.
    #[tokio::test]
    async fn a_member_is_extracted_into_the_file_and_a_missing_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join("package");
        std::fs::create_dir(&package).unwrap();
        let body: Vec<u8> = (0..300_000u32).flat_map(u32::to_le_bytes).collect();
        std::fs::write(package.join("tool"), &body).unwrap();
        let tgz = dir.path().join("pkg.tgz");
        let made = std::process::Command::new("tar")
            .arg("-czf")
            .arg(&tgz)
            .arg("-C")
            .arg(dir.path())
            .arg("package")
            .status()
            .unwrap();
        assert!(made.success());
        let dest = dir.path().join("tool");
        extract_binary(&tgz, "package/tool", &dest).await.unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), body);
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777,
            0o755
        );
        let missing = dir.path().join("missing");
        let err = extract_binary(&tgz, "package/missing", &missing)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("package/missing"), "{err}");
        assert!(!missing.exists());
    }
}
