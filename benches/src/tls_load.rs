//! HTTPS load generators for the interception benchmark: keep-alive requests over TLS (many connections,
//! for the loaded rate) and a single sequential connection (for the unloaded latency of each request).
//!
//! The same hand-written HTTP/1.1 client as [`load::http_keepalive`] (request bytes written, the answer read
//! with [`load::read_response`]), over tokio-rustls. Run them on a thread inside the client's namespace
//! ([`load::in_namespace`] + [`load::block_on`]), like every other Rust load generator here.
//!
//! [`load::http_keepalive`]: crate::load::http_keepalive

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustls_pki_types::ServerName;
use rustls_pki_types::pem::PemObject;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::load::{self, Outcome};

/// A rustls client configuration (ring, HTTP/1.1 by ALPN) trusting only the certificates in `ca_pem`: the
/// gateway's CA for the intercepted route, mitmproxy's for mitmdump. Resumption stays on: keep-alive
/// connections handshake once anyway.
///
/// # Errors
/// When `ca_pem` holds no usable certificate.
pub fn client_config(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.context("parse a CA certificate")?)?;
    }
    if roots.is_empty() {
        bail!("no CA certificate in the PEM");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The request every HTTPS client here sends: `GET /small` to `name`, keep-alive.
pub fn small_request(name: &str) -> Vec<u8> {
    format!("GET /small HTTP/1.1\r\nhost: {name}\r\n\r\n").into_bytes()
}

async fn connect(
    target: SocketAddr,
    name: &ServerName<'static>,
    connector: &TlsConnector,
) -> io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(target).await?;
    tcp.set_nodelay(true)?;
    connector.connect(name.clone(), tcp).await
}

/// Keep-alive HTTPS requests per second: `connections` TLS connections to `target` (handshake as `name`,
/// certificate verified), each sending `request` and reading the answer, back to back, for `duration`. A
/// connection that fails is counted as an error and replaced.
///
/// # Errors
/// When no request at all succeeded.
pub async fn keepalive(
    target: SocketAddr,
    name: &str,
    config: Arc<rustls::ClientConfig>,
    request: Vec<u8>,
    connections: usize,
    duration: Duration,
) -> Result<Outcome> {
    let server_name = ServerName::try_from(name.to_owned())?;
    let connector = TlsConnector::from(config);
    let request: Arc<[u8]> = request.into();
    let deadline = Instant::now() + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (request, connector, server_name) =
            (Arc::clone(&request), connector.clone(), server_name.clone());
        tasks.spawn(async move {
            let (mut done, mut errors) = (0u64, 0u64);
            while Instant::now() < deadline {
                let run = async {
                    let mut tls = connect(target, &server_name, &connector).await?;
                    let mut buf = Vec::with_capacity(4096);
                    while Instant::now() < deadline {
                        tls.write_all(&request).await?;
                        load::read_response(&mut tls, &mut buf, false).await?;
                        done += 1;
                    }
                    io::Result::Ok(())
                };
                if let Err(e) = run.await {
                    errors += 1;
                    tracing::debug!(error = %e, "HTTPS connection failed");
                }
            }
            (done, errors)
        });
    }
    let (mut done, mut errors) = (0u64, 0u64);
    while let Some(joined) = tasks.join_next().await {
        let (d, e) = joined?;
        done += d;
        errors += e;
    }
    if done == 0 {
        bail!("no HTTPS request succeeded ({errors} errors)");
    }
    Ok(Outcome {
        per_second: done as f64 / duration.as_secs_f64(),
        errors,
    })
}

/// Latencies of sequential requests on one keep-alive HTTPS connection: connect and handshake first (not
/// timed), then for `duration` send `request`, read the answer, record the time from the first byte
/// written to the last byte read. One request at a time, so nothing queues behind another request.
///
/// # Errors
/// When the connection or a request fails.
pub async fn sequential(
    target: SocketAddr,
    name: &str,
    config: Arc<rustls::ClientConfig>,
    request: &[u8],
    duration: Duration,
) -> Result<Vec<Duration>> {
    let server_name = ServerName::try_from(name.to_owned())?;
    let connector = TlsConnector::from(config);
    let mut tls = connect(target, &server_name, &connector)
        .await
        .with_context(|| format!("connect to {target} as {name}"))?;
    let mut buf = Vec::with_capacity(4096);
    // One untimed request: the gateway's pooled upstream connection is made on the first one.
    tls.write_all(request).await?;
    load::read_response(&mut tls, &mut buf, false).await?;
    let mut samples = Vec::with_capacity(64 * 1024);
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        let start = Instant::now();
        tls.write_all(request).await?;
        load::read_response(&mut tls, &mut buf, false)
            .await
            .with_context(|| format!("request {} on {target}", samples.len() + 1))?;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

/// The `q`-quantile (0 ≤ q ≤ 1, nearest rank) of `samples`, which must be sorted; `None` when empty.
pub fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(quantile(&samples, 0.5), Some(Duration::from_micros(50)));
        assert_eq!(quantile(&samples, 0.99), Some(Duration::from_micros(99)));
        assert_eq!(quantile(&samples, 0.0), Some(Duration::from_micros(1)));
        assert_eq!(quantile(&samples, 1.0), Some(Duration::from_micros(100)));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
