//! The login providers' HTTP client: one request per connection over the HTTP and TLS stack the workspace
//! already has (hyper, rustls with ring, the webpki roots plus the system store). HTTPS is required unless
//! the host is loopback; every call has a 10-second deadline (connect to last byte) and a response size cap.
// enforces: S6

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Every call to a provider ends within this (connect, TLS, request, the whole answer).
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);
/// The media type of form bodies.
const FORM: &str = "application/x-www-form-urlencoded";
/// The most a provider's answer may weigh (discovery, JWKS, tokens and user records are a few KiB).
pub(crate) const MAX_BODY: usize = 1024 * 1024;

/// An answer: status and body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Bytes,
}

impl Answer {
    /// The body as JSON of type `T`.
    pub(crate) fn json<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T, String> {
        // serde's message can quote the answer (which may hold a token): say only where it failed.
        serde_json::from_slice(&self.body).map_err(|e| {
            format!(
                "{what}: the answer (status {}) is not the expected JSON ({:?} error at line {}, column {})",
                self.status,
                e.classify(),
                e.line(),
                e.column()
            )
        })
    }
}

/// A stream a connection runs over (plain TCP to loopback, or TLS).
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The client (cheap to clone).
#[derive(Clone)]
pub(crate) struct Client {
    tls: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Client")
    }
}

impl Client {
    /// A client trusting the webpki roots and the system's store.
    pub(crate) fn new() -> anyhow::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        // The system store holds what an operator added (a company CA for an in-house Keycloak).
        let _ = roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }

    /// `GET url` with `headers`.
    pub(crate) async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Result<Answer, String> {
        self.send(Method::GET, url, headers, None).await
    }

    /// `POST url` with a form body.
    pub(crate) async fn post_form(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        form: &[(&str, &str)],
    ) -> Result<Answer, String> {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        self.send(Method::POST, url, headers, Some((FORM, body.into_bytes())))
            .await
    }

    /// `POST url` with a JSON body (the provider logins' token endpoints of Claude).
    pub(crate) async fn post_json(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
    ) -> Result<Answer, String> {
        let body = serde_json::to_vec(body).map_err(|e| format!("{url}: {e}"))?;
        self.send(Method::POST, url, headers, Some(("application/json", body)))
            .await
    }

    /// One request, bounded by [`TIMEOUT`] and [`MAX_BODY`]. Errors say what failed, with the URL (URLs
    /// here never carry secrets) but never a header or body sent.
    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Result<Answer, String> {
        tokio::time::timeout(TIMEOUT, self.send_now(method, url, headers, body))
            .await
            .unwrap_or_else(|_| Err(format!("{url}: no answer within {} s", TIMEOUT.as_secs())))
    }

    async fn send_now(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Result<Answer, String> {
        if !agenthold_core::config::is_https_or_loopback(url) {
            return Err(format!("{url}: must be https unless the host is loopback"));
        }
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: not a URL ({e})"))?;
        let https = uri.scheme_str() == Some("https");
        let host = uri.host().ok_or_else(|| format!("{url}: no host"))?;
        let bare_host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = TcpStream::connect((bare_host.as_str(), port))
            .await
            .map_err(|e| format!("{url}: cannot connect ({e})"))?;
        let io: Box<dyn Io> = if https {
            let name = rustls_pki_types::ServerName::try_from(bare_host.clone())
                .map_err(|e| format!("{url}: bad host name ({e})"))?;
            Box::new(
                self.tls
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("{url}: TLS failed ({e})"))?,
            )
        } else {
            Box::new(tcp)
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let authority = uri.authority().map_or(host, |a| a.as_str()).to_owned();
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, authority)
            .header(http::header::USER_AGENT, "agenthold");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let bytes = match body {
            Some((content_type, bytes)) => {
                req = req.header(http::header::CONTENT_TYPE, content_type);
                bytes
            }
            None => Vec::new(),
        };
        let req = req
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| format!("{url}: {e}"))?;
        let response = sender
            .send_request(req)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("{url}: reading the answer failed or it exceeds {MAX_BODY} bytes ({e})"))?
            .to_bytes();
        Ok(Answer { status, body })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    // covers: S6
    #[tokio::test]
    async fn plain_http_only_to_loopback_and_answers_are_capped() {
        let client = Client::new().unwrap();
        let e = client.get("http://id.example.com/x", &[]).await.unwrap_err();
        assert!(e.contains("must be https unless the host is loopback"), "{e}");
        // A loopback server whose answer is larger than the cap.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let big = vec![b'a'; MAX_BODY + 1];
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", big.len());
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(&big).await;
        });
        let e = client.get(&format!("http://{addr}/big"), &[]).await.unwrap_err();
        assert!(e.contains("exceeds"), "{e}");
    }
}
