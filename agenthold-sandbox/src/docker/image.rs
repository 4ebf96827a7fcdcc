//! Images without a registry: the `agenthold/dev` image (Debian packages via `debootstrap`, then
//! `docker import`), the sandboxd image (one static binary in an otherwise empty image, imported from a tar
//! written in memory), and the existence check every container creation goes through.
//!
//! Nothing here pulls. Each built image carries the label [`INPUTS_LABEL`] = SHA-256 of what it was built
//! from; an image whose label matches the current inputs is reused, anything else (no label, another
//! mirror, another package list) is stale and rebuilt. See `docs/images.md`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::{
    CreateImageOptionsBuilder, RemoveImageOptionsBuilder, TagImageOptionsBuilder,
};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::docker::archive::Entry;
use crate::docker::engine::is_not_found;
use crate::{Error, Result};

/// The development image: Debian [`DEV_SUITE`] with [`DEV_PACKAGES`], built by [`ensure_dev_image`].
pub const DEV_IMAGE: &str = "agenthold/dev:latest";
/// Repository of the sandboxd images, tagged with the first 12 hex digits of the binary's SHA-256.
pub const SANDBOXD_REPOSITORY: &str = "agenthold/sandboxd";
/// Label holding the SHA-256 (hex) of an image's inputs; reuse requires it to equal the current inputs.
pub const INPUTS_LABEL: &str = "agenthold.inputs";
/// The Debian release of the dev image.
pub const DEV_SUITE: &str = "bookworm";
/// Packages of the dev image (on top of debootstrap's `minbase`), one reason each:
/// `ca-certificates` (the CA store sandboxd adds the gateway's CA to), `curl`, `git`, `python3` and
/// `python3-requests` (what agents and the egress tests run), `nodejs` (Node 18: `fetch` tests),
/// `iproute2` (tests that try `ip route`), `procps` (`ps`, `kill`). Changing it rebuilds the image.
pub const DEV_PACKAGES: &[&str] = &[
    "ca-certificates",
    "curl",
    "git",
    "iproute2",
    "nodejs",
    "procps",
    "python3",
    "python3-requests",
];
/// The mirror used when the host's apt sources name no Debian archive.
pub const FALLBACK_MIRROR: &str = "http://deb.debian.org/debian";
/// Bumped whenever the recipe changes in a way the other inputs do not show (image config, cleanup).
/// 2: downloaded packages and apt lists removed before the import.
const FORMAT_VERSION: u32 = 2;
/// `PATH` of both images (an imported image has no environment of its own).
const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Imports stream hundreds of megabytes; the engine connection's default timeout (120 s) is too short.
pub(super) const IMPORT_TIMEOUT: Duration = Duration::from_secs(900);
/// Serialises builds inside this process (parallel tests); [`ensure_dev_image`] also takes a file lock.
pub(super) static BUILD_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A local image: the reference it was asked for or tagged with, and the engine's content id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    /// The reference, e.g. `agenthold/dev:latest` or `agenthold/sandboxd:0123456789ab`.
    pub name: String,
    /// The image id, `sha256:<64 hex>`; containers created from it do not depend on the tag.
    pub id: String,
}

/// How [`ensure_dev_image`] builds `agenthold/dev:latest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DevImageOptions {
    /// Debian mirror for debootstrap (`http://`, `https://`, `ftp://` or `file:/`); `None`: [`host_mirror`].
    /// Part of the inputs: another mirror rebuilds the image.
    pub mirror: Option<String>,
    /// Rebuild even when the existing image is current.
    pub force: bool,
}

impl DevImageOptions {
    /// Use this Debian mirror.
    #[must_use]
    pub fn with_mirror(mut self, mirror: impl Into<String>) -> Self {
        self.mirror = Some(mirror.into());
        self
    }

    /// Rebuild even when the existing image is current.
    #[must_use]
    pub fn with_force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// The mirror that will be used, validated.
    fn resolved_mirror(&self) -> Result<String> {
        let mirror = self.mirror.clone().unwrap_or_else(host_mirror);
        let mirror = mirror.trim().trim_end_matches('/').to_owned();
        let scheme_ok = ["http://", "https://", "ftp://", "file:/"]
            .iter()
            .any(|s| mirror.starts_with(s));
        if !scheme_ok || mirror.contains(char::is_whitespace) || mirror.contains(',') {
            return Err(Error::BadInput {
                problem: format!("mirror {mirror:?}: expected an http://, https://, ftp:// or file:/ URL"),
            });
        }
        Ok(mirror)
    }
}

/// Whether `reference` (a name, `name:tag` or id) exists in the local engine. Never pulls.
///
/// # Errors
/// [`Error::Engine`] when the engine fails for another reason than "no such image".
pub async fn image_exists(docker: &Docker, reference: &str) -> Result<bool> {
    Ok(inspect(docker, reference).await?.is_some())
}

/// The local image `reference`, or [`Error::Unavailable`] naming it and how to build it. Call this before
/// creating a container: the engine would otherwise try a registry for a missing image.
///
/// # Errors
/// [`Error::Unavailable`] when the image is missing; [`Error::Engine`] when the engine fails.
pub async fn require_image(docker: &Docker, reference: &str) -> Result<ImageRef> {
    match inspect(docker, reference).await? {
        Some((id, _)) => Ok(ImageRef {
            name: reference.to_owned(),
            id,
        }),
        None => Err(Error::Unavailable {
            problem: missing_image_problem(reference),
        }),
    }
}

fn missing_image_problem(reference: &str) -> String {
    let hint = if reference == DEV_IMAGE || reference == "agenthold/dev" {
        "build it with `agenthold image build-dev`".to_owned()
    } else if reference == super::harness_image::HARNESS_IMAGE || reference == "agenthold/harness" {
        "build it with `agenthold image build-harness`".to_owned()
    } else if reference.starts_with(SANDBOXD_REPOSITORY) {
        "the runtime builds it from the sandboxd binary when it starts".to_owned()
    } else {
        "build or load it locally (`docker build`, `docker load`, `docker import`), or use \
         agenthold/dev:latest (`agenthold image build-dev`)"
            .to_owned()
    };
    format!(
        "image {reference} is not in the local Docker engine and agenthold never pulls from a \
         registry: {hint}"
    )
}

/// `agenthold/dev:latest` if it exists and was built from the inputs `opts` gives; `None` if it is
/// missing or stale (for example built by hand, without the [`INPUTS_LABEL`] label).
///
/// # Errors
/// [`Error::BadInput`] for an invalid mirror; [`Error::Engine`] when the engine fails.
pub async fn current_dev_image(docker: &Docker, opts: &DevImageOptions) -> Result<Option<ImageRef>> {
    let inputs = dev_inputs_hash(&opts.resolved_mirror()?);
    current(docker, DEV_IMAGE, &inputs).await
}

/// Build `agenthold/dev:latest` unless it is current ([`current_dev_image`]); return it either way.
///
/// Building runs `debootstrap --variant=minbase --include=<DEV_PACKAGES> bookworm <work_dir>/dev-rootfs
/// <mirror>` (root, about a minute), drops downloaded packages and apt lists, imports a tar stream of
/// that directory with `CMD ["/bin/bash"]` and the inputs label, tags it, removes the rootfs and, when
/// unused, the image the tag pointed to before. `work_dir` (created if needed) belongs to the builder: it
/// also holds the lock file that serialises concurrent builds, and debootstrap's log when it fails.
///
/// # Errors
/// [`Error::BadInput`] for an invalid mirror; [`Error::Unavailable`] when debootstrap is missing, not run
/// as root or fails (with its last lines and what to check); [`Error::Io`] for local files;
/// [`Error::Engine`] when the import fails.
pub async fn ensure_dev_image(docker: &Docker, work_dir: &Path, opts: &DevImageOptions) -> Result<ImageRef> {
    let mirror = opts.resolved_mirror()?;
    let inputs = dev_inputs_hash(&mirror);
    if !opts.force
        && let Some(image) = current(docker, DEV_IMAGE, &inputs).await?
    {
        return Ok(image);
    }
    let _guard = BUILD_LOCK.lock().await;
    tokio::fs::create_dir_all(work_dir)
        .await
        .map_err(|e| Error::io(format!("create {}", work_dir.display()), e))?;
    let _file_lock = lock_file(work_dir.join("dev-image.lock")).await?;
    // Someone else may have built it while this call waited for the locks.
    let before = inspect(docker, DEV_IMAGE).await?;
    if !opts.force
        && let Some((id, Some(label))) = &before
        && *label == inputs
    {
        return Ok(ImageRef {
            name: DEV_IMAGE.to_owned(),
            id: id.clone(),
        });
    }
    let started = Instant::now();
    let rootfs = work_dir.join("dev-rootfs");
    clear_dir(&rootfs).await?;
    debootstrap(&rootfs, &mirror).await?;
    slim(&rootfs).await?;
    tracing::info!(elapsed_ms = started.elapsed().as_millis(), "debootstrap done");
    let imported = import_dir(docker, &rootfs, &inputs).await;
    clear_dir(&rootfs).await?;
    let id = imported?;
    tag(docker, &id, DEV_IMAGE).await?;
    if let Some((old, _)) = before
        && old != id
    {
        remove_unused(docker, &old).await;
    }
    tracing::info!(image = DEV_IMAGE, %id, elapsed_ms = started.elapsed().as_millis(), "dev image built");
    Ok(ImageRef {
        name: DEV_IMAGE.to_owned(),
        id,
    })
}

/// The image holding only `/sandboxd` (mode 0755), `CMD ["/sandboxd","hold"]`, tagged
/// `agenthold/sandboxd:<first 12 hex of sha256(sandboxd)>`; built by importing a tar written in memory
/// (ustar, uid 0, mtime 0), reused when present with the matching label.
///
/// # Errors
/// [`Error::BadInput`] for a binary too large for a tar entry; [`Error::Engine`] when the engine fails.
pub async fn ensure_sandboxd_image(docker: &Docker, sandboxd: &[u8]) -> Result<ImageRef> {
    let digest = hex::encode(Sha256::digest(sandboxd));
    let name = format!("{SANDBOXD_REPOSITORY}:{}", &digest[..12]);
    if let Some(image) = current(docker, &name, &digest).await? {
        return Ok(image);
    }
    let _guard = BUILD_LOCK.lock().await;
    if let Some(image) = current(docker, &name, &digest).await? {
        return Ok(image);
    }
    let before = inspect(docker, &name).await?;
    let tar = crate::docker::archive::pack(
        &[Entry {
            path: "sandboxd",
            mode: 0o755,
            data: sandboxd,
        }],
        0o755,
    )?;
    let changes = vec![
        r#"CMD ["/sandboxd","hold"]"#.to_owned(),
        format!("ENV {PATH_ENV}"),
        label_change(&digest),
    ];
    let id = import(
        docker,
        TarBody::Bytes(Bytes::from(tar)),
        changes,
        "agenthold sandboxd",
    )
    .await?;
    tag(docker, &id, &name).await?;
    if let Some((old, _)) = before {
        remove_unused(docker, &old).await;
    }
    tracing::info!(image = %name, %id, "sandboxd image built");
    Ok(ImageRef { name, id })
}

/// The Debian mirror the host's apt uses: the first source (apt's order: `sources.list`, then
/// `sources.list.d/*.list` and `*.sources` by name, skipping disabled entries) that serves
/// [`DEV_SUITE`]; else the first that serves a plain release of a Debian archive; else
/// [`FALLBACK_MIRROR`].
#[must_use]
pub fn host_mirror() -> String {
    let mut files = Vec::new();
    if let Ok(text) = std::fs::read_to_string("/etc/apt/sources.list") {
        files.push(("sources.list".to_owned(), text));
    }
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut names: Vec<_> = dir.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        names.sort();
        for path in names {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if let Ok(text) = std::fs::read_to_string(&path) {
                files.push((name, text));
            }
        }
    }
    mirror_from_sources(&files).unwrap_or_else(|| FALLBACK_MIRROR.to_owned())
}

/// The mirror choice of [`host_mirror`] over `(file name, contents)` in apt's order.
fn mirror_from_sources(files: &[(String, String)]) -> Option<String> {
    let mut entries: Vec<(String, Vec<String>)> = Vec::new();
    for (name, text) in files {
        if name.ends_with(".list") {
            entries.extend(one_line_entries(text));
        } else if name.ends_with(".sources") {
            entries.extend(deb822_entries(text));
        }
    }
    let serves = |suites: &[String], f: &dyn Fn(&str) -> bool| suites.iter().any(|s| f(s));
    let plain = |s: &str| !s.is_empty() && !s.contains(['-', '/']);
    let found = entries
        .iter()
        .find(|(_, suites)| serves(suites, &|s| s == DEV_SUITE))
        .or_else(|| {
            entries
                .iter()
                .find(|(uri, suites)| uri.contains("debian") && serves(suites, &plain))
        });
    found.map(|(uri, _)| uri.trim_end_matches('/').to_owned())
}

/// `deb [options] URI SUITE COMPONENTS…` lines.
fn one_line_entries(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace();
        if words.next() != Some("deb") {
            continue;
        }
        let mut rest: Vec<&str> = words.collect();
        if rest.first().is_some_and(|w| w.starts_with('[')) {
            let end = rest.iter().position(|w| w.ends_with(']')).unwrap_or(0);
            rest.drain(..=end);
        }
        if let [uri, suite, ..] = rest.as_slice() {
            out.push(((*uri).to_owned(), vec![(*suite).to_owned()]));
        }
    }
    out
}

/// deb822 stanzas (`Types: deb`, `URIs:`, `Suites:`, `Enabled:`), one entry per URI.
fn deb822_entries(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for stanza in text.split("\n\n") {
        let field = |key: &str| {
            stanza.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(key)
                    .then(|| v.split_whitespace().map(str::to_owned).collect())
            })
        };
        let types: Vec<String> = field("Types").unwrap_or_default();
        let enabled: Vec<String> = field("Enabled").unwrap_or_default();
        if !types.iter().any(|t| t == "deb") || enabled.first().is_some_and(|e| e.eq_ignore_ascii_case("no"))
        {
            continue;
        }
        let suites: Vec<String> = field("Suites").unwrap_or_default();
        for uri in field("URIs").unwrap_or_default() {
            out.push((uri, suites.clone()));
        }
    }
    out
}

/// SHA-256 (hex) of everything the dev image is built from.
fn dev_inputs_hash(mirror: &str) -> String {
    let text = format!(
        "format={FORMAT_VERSION}\nsuite={DEV_SUITE}\nvariant=minbase\nmirror={mirror}\npackages={}\n",
        DEV_PACKAGES.join(",")
    );
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn label_change(inputs: &str) -> String {
    format!("LABEL {INPUTS_LABEL}={inputs}")
}

/// `reference` as an [`ImageRef`] if it exists and its [`INPUTS_LABEL`] equals `inputs`.
pub(super) async fn current(docker: &Docker, reference: &str, inputs: &str) -> Result<Option<ImageRef>> {
    Ok(match inspect(docker, reference).await? {
        Some((id, Some(label))) if label == inputs => Some(ImageRef {
            name: reference.to_owned(),
            id,
        }),
        _ => None,
    })
}

/// The image's id and [`INPUTS_LABEL`], `None` if it does not exist.
pub(super) async fn inspect(docker: &Docker, reference: &str) -> Result<Option<(String, Option<String>)>> {
    match docker.inspect_image(reference).await {
        Ok(image) => {
            let label = image
                .config
                .and_then(|c| c.labels)
                .and_then(|mut l| l.remove(INPUTS_LABEL));
            Ok(Some((image.id.unwrap_or_default(), label)))
        }
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(Error::engine(format!("inspect image {reference}"), e)),
    }
}

/// A tar to import: written in memory, or streamed from `tar`.
enum TarBody {
    Bytes(Bytes),
    Stream(BoxStream<'static, std::io::Result<Bytes>>),
}

/// `docker import` of a tar body, untagged (tagging after success keeps a failed import from ever
/// carrying the name); returns the new image id.
async fn import(docker: &Docker, tar: TarBody, changes: Vec<String>, message: &str) -> Result<String> {
    let options = CreateImageOptionsBuilder::new()
        .from_src("-")
        .changes(changes)
        .message(message)
        .build();
    let docker = docker.clone().with_timeout(IMPORT_TIMEOUT);
    // bollard does not export its body type: build it here, from either kind of tar.
    let body = match tar {
        TarBody::Bytes(bytes) => bollard::body_full(bytes),
        TarBody::Stream(stream) => bollard::body_try_stream(stream),
    };
    let mut stream = docker.create_image(Some(options), Some(body), None);
    let mut id = None;
    while let Some(info) = stream.next().await {
        let info = info.map_err(|e| Error::engine("import image", e))?;
        if let Some(status) = info.status.filter(|s| s.starts_with("sha256:")) {
            id = Some(status);
        }
    }
    id.ok_or_else(|| Error::Unavailable {
        problem: "docker import finished without reporting an image id".into(),
    })
}

/// Stream `tar -C rootfs -c .` into an import; fails (and removes the image) if tar does.
async fn import_dir(docker: &Docker, rootfs: &Path, inputs: &str) -> Result<String> {
    let mut child = tokio::process::Command::new("tar")
        .args(["--numeric-owner", "-C"])
        .arg(rootfs)
        .args(["-cf", "-", "."])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::io("run tar", e))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::io("tar stdout", std::io::ErrorKind::Other.into()))?;
    // Drained alongside the import: a full stderr pipe would stall tar, and with it the import.
    let stderr = child.stderr.take().map(|mut err| {
        tokio::spawn(async move {
            let mut text = Vec::new();
            let _ = err.read_to_end(&mut text).await;
            text
        })
    });
    let chunks = futures_util::stream::try_unfold(stdout, |mut out| async move {
        let mut buf = BytesMut::with_capacity(256 * 1024);
        let n = out.read_buf(&mut buf).await?;
        Ok::<_, std::io::Error>((n > 0).then(|| (buf.freeze(), out)))
    });
    let changes = vec![
        r#"CMD ["/bin/bash"]"#.to_owned(),
        format!("ENV {PATH_ENV}"),
        label_change(inputs),
    ];
    let imported = import(docker, TarBody::Stream(chunks.boxed()), changes, "agenthold dev").await;
    let status = child.wait().await.map_err(|e| Error::io("wait for tar", e))?;
    if !status.success() {
        let stderr = match stderr {
            Some(task) => task.await.unwrap_or_default(),
            None => Vec::new(),
        };
        if let Ok(id) = &imported {
            remove_unused(docker, id).await;
        }
        return Err(Error::Unavailable {
            problem: format!(
                "tar of {} failed ({}): {}",
                rootfs.display(),
                status,
                tail(&stderr, 10)
            ),
        });
    }
    imported
}

pub(super) async fn tag(docker: &Docker, id: &str, name: &str) -> Result<()> {
    let (repo, tag) = name.rsplit_once(':').unwrap_or((name, "latest"));
    let options = TagImageOptionsBuilder::new().repo(repo).tag(tag).build();
    docker
        .tag_image(id, Some(options))
        .await
        .map_err(|e| Error::engine(format!("tag {id} as {name}"), e))
}

/// Remove an image that lost its tag, unless a container or another tag still uses it.
pub(super) async fn remove_unused(docker: &Docker, id: &str) {
    let options = RemoveImageOptionsBuilder::new()
        .force(false)
        .noprune(false)
        .build();
    match docker.remove_image(id, Some(options), None).await {
        Ok(_) => tracing::info!(%id, "removed the replaced image"),
        Err(e) => tracing::warn!(%id, error = %e, "kept the replaced image (still in use?)"),
    }
}

/// Run debootstrap into `rootfs`, output captured; on failure an error that says what to check.
async fn debootstrap(rootfs: &Path, mirror: &str) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::Unavailable {
            problem: "building agenthold/dev:latest runs debootstrap, which needs root: run \
                      `sudo agenthold image build-dev`"
                .into(),
        });
    }
    let include = format!("--include={}", DEV_PACKAGES.join(","));
    tracing::info!(%mirror, rootfs = %rootfs.display(), "running debootstrap (about a minute)");
    let output = tokio::process::Command::new("debootstrap")
        .args(["--variant=minbase", &include, DEV_SUITE])
        .arg(rootfs)
        .arg(mirror)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::Unavailable {
                problem: "debootstrap is not installed: install it (`apt-get install debootstrap`) to build \
                          agenthold/dev:latest"
                    .into(),
            },
            _ => Error::io("run debootstrap", e),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = output.stdout;
    text.extend_from_slice(&output.stderr);
    Err(Error::Unavailable {
        problem: format!(
            "debootstrap {DEV_SUITE} from {mirror} failed ({}); check that the mirror is reachable and \
             serves {DEV_SUITE} (choose another with --mirror URL / DevImageOptions::mirror); full log \
             in {}; last lines: {}",
            output.status,
            rootfs.join("debootstrap/debootstrap.log").display(),
            tail(&text, 15)
        ),
    })
}

/// What the image does not need (~130 MB): debootstrap's downloaded packages and the apt lists and caches
/// (regenerated by `apt-get update`, as in Debian's own images).
async fn slim(rootfs: &Path) -> Result<()> {
    let rootfs = rootfs.to_owned();
    tokio::task::spawn_blocking(move || {
        for dir in ["var/cache/apt/archives", "var/cache/apt", "var/lib/apt/lists"] {
            let dir = rootfs.join(dir);
            let entries =
                std::fs::read_dir(&dir).map_err(|e| Error::io(format!("read {}", dir.display()), e))?;
            for entry in entries.filter_map(std::result::Result::ok) {
                let name = entry.file_name();
                let keep = name == "lock" || entry.file_type().map_or(true, |t| !t.is_file());
                if !keep {
                    std::fs::remove_file(entry.path())
                        .map_err(|e| Error::io(format!("remove {}", entry.path().display()), e))?;
                }
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| Error::io("slim the dev rootfs", std::io::Error::other(e)))?
}

pub(super) fn tail(bytes: &[u8], lines: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

/// Remove `dir` entirely. A killed debootstrap leaves `proc`, `sys` or `dev` mounted inside its target:
/// unmount those first so the removal never walks into a host filesystem.
pub(super) async fn clear_dir(dir: &Path) -> Result<()> {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || {
        if !dir.exists() {
            return Ok(());
        }
        for mount in mounts_under(&dir)? {
            nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH)
                .map_err(|e| Error::io(format!("unmount {}", mount.display()), e.into()))?;
        }
        std::fs::remove_dir_all(&dir).map_err(|e| Error::io(format!("remove {}", dir.display()), e))
    })
    .await
    .map_err(|e| Error::io("remove the dev rootfs", std::io::Error::other(e)))?
}

/// Mount points at or below `dir`, deepest first.
fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let dir = dir
        .canonicalize()
        .map_err(|e| Error::io(format!("resolve {}", dir.display()), e))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::io("read /proc/self/mountinfo", e))?;
    let mut mounts: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(&dir))
        .collect();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    Ok(mounts)
}

/// Take an exclusive `flock` on `path` (created if needed), waiting for other processes' builds.
pub(super) async fn lock_file(path: PathBuf) -> Result<nix::fcntl::Flock<std::fs::File>> {
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| Error::io(format!("lock {}", path.display()), e.into()))
    })
    .await
    .map_err(|e| Error::io("lock the image build", std::io::Error::other(e)))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect()
    }

    #[test]
    fn mirror_prefers_a_source_serving_the_suite() {
        let sources = files(&[
            (
                "nodesource.sources.disabled-by-farm",
                "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\n",
            ),
            (
                "debian.sources",
                "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n\
                 Types: deb deb-src\nURIs: http://mirror.example/debian/\n\
                 Suites: bookworm bookworm-updates\n",
            ),
        ]);
        assert_eq!(
            mirror_from_sources(&sources).as_deref(),
            Some("http://mirror.example/debian")
        );
    }

    #[test]
    fn mirror_skips_disabled_and_source_only_entries() {
        let sources = files(&[
            (
                "a.sources",
                "Types: deb\nEnabled: no\nURIs: http://off.example/debian\nSuites: bookworm\n",
            ),
            (
                "b.list",
                "deb-src http://src.example/debian bookworm main\n# deb http://c.example/debian bookworm\n",
            ),
            (
                "c.list",
                "deb [arch=amd64 signed-by=/k.gpg] http://on.example/debian bookworm main\n",
            ),
        ]);
        assert_eq!(
            mirror_from_sources(&sources).as_deref(),
            Some("http://on.example/debian")
        );
    }

    #[test]
    fn mirror_falls_back_to_a_plain_debian_release_or_nothing() {
        let trixie = files(&[(
            "debian.sources",
            "Types: deb\nURIs: http://m.example/debian\nSuites: trixie\n",
        )]);
        assert_eq!(
            mirror_from_sources(&trixie).as_deref(),
            Some("http://m.example/debian")
        );
        let ubuntu = files(&[(
            "sources.list",
            "deb http://archive.ubuntu.com/ubuntu noble main\n",
        )]);
        assert_eq!(mirror_from_sources(&ubuntu), None);
    }

    #[test]
    fn inputs_hash_depends_on_the_mirror_only_among_options() {
        assert_eq!(
            dev_inputs_hash("http://a/debian"),
            dev_inputs_hash("http://a/debian")
        );
        assert_ne!(
            dev_inputs_hash("http://a/debian"),
            dev_inputs_hash("http://b/debian")
        );
        let opts = DevImageOptions::default().with_mirror("http://a/debian/ ");
        assert_eq!(opts.resolved_mirror().unwrap(), "http://a/debian");
    }

    #[test]
    fn bad_mirrors_are_bad_input() {
        for bad in ["deb.debian.org/debian", "http://a b", "http://a,b"] {
            let err = DevImageOptions::default()
                .with_mirror(bad)
                .resolved_mirror()
                .unwrap_err();
            assert_eq!(err.kind(), agenthold_core::ErrorKind::BadInput, "{bad}");
        }
    }

    #[test]
    fn missing_image_message_names_image_and_command() {
        let problem = missing_image_problem(DEV_IMAGE);
        assert!(
            problem.contains(DEV_IMAGE) && problem.contains("agenthold image build-dev"),
            "{problem}"
        );
        let problem = missing_image_problem("example/custom:1");
        assert!(
            problem.contains("example/custom:1") && problem.contains("never pulls"),
            "{problem}"
        );
    }
}
