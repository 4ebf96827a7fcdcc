//! Upstream HTTP and HTTPS servers on loopback that answer every request with what they received.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::TestCa;

/// What every echo response's `upstream` field says, so a test can tell the real upstream answered.
pub const UPSTREAM_MARKER: &str = "upstream-ok";

/// One request an [`EchoServer`] received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EchoRequest {
    /// `http` or `https`.
    pub scheme: &'static str,
    /// `HTTP/1.1` or `HTTP/2.0`.
    pub version: String,
    /// The method (`GET`).
    pub method: String,
    /// Path and query as received (`/v1/x?key=…`).
    pub path: String,
    /// The authority: `:authority` for h2, else the `Host` header (empty when neither was sent).
    pub host: String,
    /// The TLS server name the client sent (SNI), for HTTPS.
    pub sni: Option<String>,
    /// Every header in order, names in lower case, repeated names kept.
    pub headers: Vec<(String, String)>,
    /// The request body, whole.
    pub body: Vec<u8>,
    /// Who connected.
    pub peer: SocketAddr,
}

impl EchoRequest {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The JSON the server answers with: `{ "upstream": "upstream-ok", "scheme", "version", "method",
    /// "path", "host", "sni", "headers": { name: value }, "body" }` (repeated headers joined by `, `, the
    /// body as UTF-8 with invalid bytes replaced).
    pub fn to_json(&self) -> serde_json::Value {
        let mut headers = serde_json::Map::new();
        for (name, value) in &self.headers {
            match headers.get_mut(name) {
                Some(serde_json::Value::String(previous)) => {
                    previous.push_str(", ");
                    previous.push_str(value);
                }
                _ => {
                    headers.insert(name.clone(), value.clone().into());
                }
            }
        }
        serde_json::json!({
            "upstream": UPSTREAM_MARKER,
            "scheme": self.scheme,
            "version": self.version,
            "method": self.method,
            "path": self.path,
            "host": self.host,
            "sni": self.sni,
            "headers": headers,
            "body": String::from_utf8_lossy(&self.body),
        })
    }
}

/// An upstream on `127.0.0.1` (port 0) that answers every request with `200` and
/// [`EchoRequest::to_json`], and records every request. Plain HTTP speaks HTTP/1.1; HTTPS speaks h2 or
/// HTTP/1.1 as ALPN decides. Stops accepting when dropped.
#[derive(Debug)]
pub struct EchoServer {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<EchoRequest>>>,
    ca: Option<Arc<TestCa>>,
    accept_loop: JoinHandle<()>,
}

impl EchoServer {
    /// A plain HTTP/1.1 upstream.
    pub async fn http() -> Self {
        Self::start(None, None).await
    }

    /// An HTTPS upstream with a certificate for `names` from a new [`TestCa`] (see [`EchoServer::ca`]).
    pub async fn https(names: &[&str]) -> Self {
        Self::https_with_ca(Arc::new(TestCa::new()), names).await
    }

    /// An HTTPS upstream with a certificate for `names` from `ca` (several upstreams, one trust anchor).
    pub async fn https_with_ca(ca: Arc<TestCa>, names: &[&str]) -> Self {
        let acceptor = TlsAcceptor::from(ca.server_config(names));
        Self::start(Some(acceptor), Some(ca)).await
    }

    async fn start(tls: Option<TlsAcceptor>, ca: Option<Arc<TestCa>>) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind the echo server");
        let addr = listener.local_addr().expect("echo server address");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&requests);
        let accept_loop = tokio::spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                let tls = tls.clone();
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let Some(tls) = tls else {
                        return serve(stream, true, "http", None, peer, log).await;
                    };
                    let Ok(stream) = tls.accept(stream).await else {
                        return;
                    };
                    let (_, session) = stream.get_ref();
                    let h2 = session.alpn_protocol() == Some(b"h2");
                    let sni = session.server_name().map(str::to_owned);
                    serve(stream, !h2, "https", sni, peer, log).await;
                });
            }
        });
        tracing::debug!(%addr, tls = ca.is_some(), "echo server listening");
        Self {
            addr,
            requests,
            ca,
            accept_loop,
        }
    }

    /// Where the server listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The CA that issued its certificate (HTTPS servers only).
    pub fn ca(&self) -> Option<&Arc<TestCa>> {
        self.ca.as_ref()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<EchoRequest> {
        self.requests.lock().expect("request log lock").clone()
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

/// Serves one connection with HTTP/1.1 (`http1`) or h2.
async fn serve<S>(
    stream: S,
    http1: bool,
    scheme: &'static str,
    sni: Option<String>,
    peer: SocketAddr,
    log: Arc<Mutex<Vec<EchoRequest>>>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request: Request<Incoming>| {
        let log = Arc::clone(&log);
        let sni = sni.clone();
        async move { Ok::<_, Infallible>(echo(request, scheme, sni, peer, &log).await) }
    });
    let io = TokioIo::new(stream);
    // Connection errors (a client hanging up mid-request) are part of what tests provoke: not failures.
    let result = if http1 {
        http1::Builder::new()
            .serve_connection(io, service)
            .with_upgrades()
            .await
    } else {
        http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, service)
            .await
    };
    if let Err(error) = result {
        tracing::debug!(%peer, %error, "echo connection ended with an error");
    }
}

async fn echo(
    request: Request<Incoming>,
    scheme: &'static str,
    sni: Option<String>,
    peer: SocketAddr,
    log: &Mutex<Vec<EchoRequest>>,
) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let header_host = parts
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok());
    let host = parts
        .uri
        .authority()
        .map(|a| a.as_str())
        .or(header_host)
        .unwrap_or_default()
        .to_owned();
    let received = EchoRequest {
        scheme,
        version: format!("{:?}", parts.version),
        method: parts.method.to_string(),
        path: parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
        host,
        sni,
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
        peer,
    };
    let json = received.to_json().to_string();
    log.lock().expect("request log lock").push(received);
    Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(json)))
        .expect("a static response head is valid")
}

#[cfg(test)]
mod tests {
    use http_body_util::Empty;
    use hyper::client::conn::{http1 as client1, http2 as client2};
    use tokio::net::TcpStream;
    use tokio_rustls::TlsConnector;

    use super::*;

    #[tokio::test]
    async fn plain_http_echoes_and_records() {
        let server = EchoServer::http().await;
        let stream = TcpStream::connect(server.addr()).await.unwrap();
        let (mut sender, conn) = client1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let request = Request::post("/v1/x?q=1")
            .header("Host", "api.test")
            .header("X-Token", "abc")
            .body(Full::new(Bytes::from_static(b"hello")))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["upstream"], UPSTREAM_MARKER);
        assert_eq!(json["scheme"], "http");
        assert_eq!(json["method"], "POST");
        assert_eq!(json["path"], "/v1/x?q=1");
        assert_eq!(json["headers"]["x-token"], "abc");
        assert_eq!(json["body"], "hello");
        let recorded = server.requests();
        assert_eq!(recorded.len(), 1);
        assert_eq!(recorded[0].host, "api.test");
        assert_eq!(recorded[0].header("x-token"), Some("abc"));
    }

    #[tokio::test]
    async fn https_speaks_h2_and_http1_by_alpn() {
        let server = EchoServer::https(&["upstream.test"]).await;
        let ca = server.ca().unwrap();
        for (alpn, version) in [(&b"h2"[..], "HTTP/2.0"), (&b"http/1.1"[..], "HTTP/1.1")] {
            let connector = TlsConnector::from(ca.client_config(&[alpn]));
            let tcp = TcpStream::connect(server.addr()).await.unwrap();
            let name = rustls_pki_types::ServerName::try_from("upstream.test").unwrap();
            let tls = connector.connect(name, tcp).await.unwrap();
            let io = TokioIo::new(tls);
            let request = Request::get("https://upstream.test/h")
                .body(Empty::<Bytes>::new())
                .unwrap();
            let response = if alpn == b"h2" {
                let (mut sender, conn) = client2::handshake(TokioExecutor::new(), io).await.unwrap();
                tokio::spawn(conn);
                sender.send_request(request).await.unwrap()
            } else {
                let (mut sender, conn) = client1::handshake(io).await.unwrap();
                tokio::spawn(conn);
                let mut request = request;
                request
                    .headers_mut()
                    .insert("host", "upstream.test".parse().unwrap());
                sender.send_request(request).await.unwrap()
            };
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(json["version"], version);
            assert_eq!(json["scheme"], "https");
            assert_eq!(json["sni"], "upstream.test");
            assert_eq!(json["host"], "upstream.test");
        }
        assert_eq!(server.requests().len(), 2);
    }
}
