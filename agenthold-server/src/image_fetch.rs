//! Fetching the harness binaries' npm tarballs for `agenthold image build-harness`: a streaming HTTPS GET
//! from the host (hyper + rustls with the webpki roots and the system store, the stack the server already
//! has), hashed while it is written, kept under the data directory only when its sha512 equals the pinned
//! integrity. A cached tarball is re-verified before every use, so a changed file is fetched again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agenthold_sandbox::docker::harness_image::{
    HarnessPackage, IntegrityCheck, tarball_url, verify_integrity,
};
use anyhow::{Context, bail};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// A connection or a read that stalls this long fails the download.
const STALL: Duration = Duration::from_secs(60);
/// At most this many redirects (mirrors may send the tarball elsewhere).
const MAX_REDIRECTS: usize = 3;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The verified tarball of `pkg` in `cache` (`cache/<name>-<version>.tgz`), fetched from `registry` when it
/// is missing or does not match the pinned integrity. Returns its path and whether it was downloaded.
pub(crate) async fn cached_tarball(
    registry: &str,
    pkg: &HarnessPackage,
    cache: &Path,
) -> anyhow::Result<(PathBuf, bool)> {
    tokio::fs::create_dir_all(cache)
        .await
        .with_context(|| format!("create {}", cache.display()))?;
    let path = cache.join(pkg.tarball_name());
    if path.is_file() && verify_integrity(&path, pkg.integrity).await.is_ok() {
        return Ok((path, false));
    }
    let url = tarball_url(registry, pkg);
    let partial = path.with_extension("tgz.partial");
    let result = download(&url, &partial, pkg.integrity).await;
    if let Err(e) = result {
        let _ = tokio::fs::remove_file(&partial).await;
        return Err(e.context(format!("fetch {}@{} from {url}", pkg.package, pkg.version)));
    }
    tokio::fs::rename(&partial, &path)
        .await
        .with_context(|| format!("rename {} to {}", partial.display(), path.display()))?;
    Ok((path, true))
}

/// GET `url` into `dest`, checking `integrity` as the bytes arrive.
async fn download(url: &str, dest: &Path, integrity: &str) -> anyhow::Result<()> {
    let tls = tls_connector()?;
    let mut url = url.to_owned();
    for _ in 0..=MAX_REDIRECTS {
        let response = get(&tls, &url).await?;
        let status = response.status();
        if status.is_redirection() {
            let Some(next) = response
                .headers()
                .get(http::header::LOCATION)
                .and_then(|v| v.to_str().ok())
            else {
                bail!("{url}: redirect ({status}) without a location");
            };
            url = next.to_owned();
            continue;
        }
        if !status.is_success() {
            bail!("{url}: the registry answered {status}");
        }
        let mut file = tokio::fs::File::create(dest)
            .await
            .with_context(|| format!("create {}", dest.display()))?;
        let mut check = IntegrityCheck::default();
        let mut body = response.into_body();
        loop {
            let frame = tokio::time::timeout(STALL, body.frame())
                .await
                .with_context(|| format!("{url}: no data for {} s", STALL.as_secs()))?;
            let Some(frame) = frame else { break };
            let frame = frame.with_context(|| format!("{url}: reading the body"))?;
            if let Ok(data) = frame.into_data() {
                check.update(&data);
                file.write_all(&data)
                    .await
                    .with_context(|| format!("write {}", dest.display()))?;
            }
        }
        file.flush().await.context("flush the download")?;
        check.finish(integrity, &url)?;
        return Ok(());
    }
    bail!("{url}: more than {MAX_REDIRECTS} redirects")
}

async fn get(
    tls: &tokio_rustls::TlsConnector,
    url: &str,
) -> anyhow::Result<http::Response<hyper::body::Incoming>> {
    let uri: http::Uri = url.parse().with_context(|| format!("{url}: not a URL"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => bail!("{url}: expected an http:// or https:// URL"),
    };
    let host = uri.host().with_context(|| format!("{url}: no host"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::time::timeout(STALL, TcpStream::connect((bare.as_str(), port)))
        .await
        .with_context(|| format!("{url}: connect timed out"))?
        .with_context(|| format!("{url}: cannot connect"))?;
    let io: Box<dyn Io> = if https {
        let name = rustls_pki_types::ServerName::try_from(bare.clone())
            .with_context(|| format!("{url}: bad host name"))?;
        Box::new(
            tokio::time::timeout(STALL, tls.connect(name, tcp))
                .await
                .with_context(|| format!("{url}: TLS timed out"))?
                .with_context(|| format!("{url}: TLS failed"))?,
        )
    } else {
        Box::new(tcp)
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .with_context(|| format!("{url}: HTTP handshake"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let authority = uri.authority().map_or(host, |a| a.as_str()).to_owned();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let req = http::Request::builder()
        .method(http::Method::GET)
        .uri(path)
        .header(http::header::HOST, authority)
        .header(http::header::USER_AGENT, "agenthold")
        .header(http::header::ACCEPT, "application/octet-stream")
        .body(Empty::<Bytes>::new())
        .with_context(|| format!("{url}: build the request"))?;
    tokio::time::timeout(STALL, sender.send_request(req))
        .await
        .with_context(|| format!("{url}: no answer within {} s", STALL.as_secs()))?
        .with_context(|| format!("{url}: request failed"))
}

fn tls_connector() -> anyhow::Result<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let _ = roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}
