//! Stand-ins for the model providers' APIs, so the real `claude` and `codex` binaries can run end to end
//! without an account and without a packet leaving the machine: one HTTPS (or plain HTTP) server on
//! loopback with a route table ([`Routes`]), recording every request (headers and body) so a test can
//! assert what arrived upstream, for example the `x-api-key` the gateway injected.
//!
//! - [`anthropic`]: the Messages API (`POST /v1/messages`, streamed as server-sent events): the first turn
//!   asks for a scripted Bash tool call, the turn that carries its result gets a final text message.
//! - [`openai`]: the Responses API (`POST /v1/responses`, streamed) in the shape Codex reads: a shell
//!   function call first, then a final message and `response.completed` with usage.
//!
//! - [`oauth`]: the providers' OAuth endpoints for provider logins (authorization with PKCE S256, code
//!   exchange, refresh with rotation and family revocation on reuse).
//!
//! Other routes are added with [`Routes::route`]; the first matching route
//! answers, anything unmatched gets a `404` JSON error and is recorded all the same.

pub mod anthropic;
pub mod oauth;
pub mod openai;

use std::convert::Infallible;
use std::net::SocketAddr;
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

use crate::{EchoRequest, TestCa};

/// The tool command the scripted first turn asks for; its output is what the final message quotes.
pub const TOOL_COMMAND: &str = "echo hello-from-tool";
/// What [`TOOL_COMMAND`] prints.
pub const TOOL_OUTPUT: &str = "hello-from-tool";
/// The start of every final message (followed by the tool's output as the stand-in received it).
pub const FINAL_TEXT: &str = "Done: the tool said";

/// The host names a provider stand-in's certificate covers.
pub const PROVIDER_HOSTS: &[&str] = &[
    "api.anthropic.com",
    "api.openai.com",
    "console.anthropic.com",
    "claude.ai",
    "platform.claude.com",
    "auth.openai.com",
    "chatgpt.com",
    "statsig.anthropic.com",
];

/// An answer: status, content type, extra headers, body (sent whole; SSE bodies too).
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// `content-type`.
    pub content_type: &'static str,
    /// Further headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Reply {
    /// `status` with a JSON body.
    pub fn json(status: u16, value: &serde_json::Value) -> Self {
        Self {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: value.to_string().into_bytes(),
        }
    }

    /// `200` with a `text/event-stream` body of `(event, data)` pairs.
    pub fn sse(events: &[(&str, serde_json::Value)]) -> Self {
        let mut body = String::new();
        for (event, data) in events {
            body.push_str(&format!("event: {event}\ndata: {data}\n\n"));
        }
        Self {
            status: 200,
            content_type: "text/event-stream",
            headers: vec![("cache-control".into(), "no-cache".into())],
            body: body.into_bytes(),
        }
    }
}

/// What answers a request.
pub type Handler = Arc<dyn Fn(&EchoRequest) -> Reply + Send + Sync>;

/// The route table: `(method, path prefix, handler)`, first match wins (the query is not part of the path).
#[derive(Clone, Default)]
pub struct Routes {
    routes: Vec<(String, String, Handler)>,
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.routes.iter().map(|(m, p, _)| format!("{m} {p}")).collect();
        f.debug_struct("Routes").field("routes", &names).finish()
    }
}

impl Routes {
    /// No routes: everything is a 404.
    pub fn new() -> Self {
        Self::default()
    }

    /// The Messages API and the Responses API stand-ins ([`anthropic::routes`], [`openai::routes`]),
    /// their tool call running [`TOOL_COMMAND`].
    pub fn providers() -> Self {
        Self::providers_running(TOOL_COMMAND)
    }

    /// [`Routes::providers`] with the scripted tool call running `command` (a shell command line).
    pub fn providers_running(command: &str) -> Self {
        let mut routes = Self::new();
        anthropic::routes(&mut routes, command);
        openai::routes(&mut routes, command);
        routes
    }

    /// Add a route: `method` (`*` for any) and a path prefix (`/v1/messages` also matches
    /// `/v1/messages/count_tokens` unless a more specific route was added first).
    pub fn route(
        &mut self,
        method: &str,
        prefix: &str,
        handler: impl Fn(&EchoRequest) -> Reply + Send + Sync + 'static,
    ) -> &mut Self {
        self.routes
            .push((method.to_owned(), prefix.to_owned(), Arc::new(handler)));
        self
    }

    fn answer(&self, request: &EchoRequest) -> Reply {
        let path = request.path.split('?').next().unwrap_or_default();
        self.routes
            .iter()
            .find(|(m, p, _)| (m == "*" || *m == request.method) && path.starts_with(p.as_str()))
            .map_or_else(
                || {
                    Reply::json(
                        404,
                        &serde_json::json!({"type": "error", "error": {"type": "not_found_error",
                            "message": format!("stand-in: no route for {} {path}", request.method)}}),
                    )
                },
                |(_, _, handler)| handler(request),
            )
    }
}

/// A running stand-in on loopback. Stops accepting when dropped.
pub struct Standin {
    addr: SocketAddr,
    ca: Option<Arc<TestCa>>,
    requests: Arc<Mutex<Vec<EchoRequest>>>,
    accept_loop: JoinHandle<()>,
}

impl std::fmt::Debug for Standin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Standin")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Standin {
    /// `routes` (e.g. [`Routes::providers`]) over HTTPS on `127.0.0.1` (port 0), with a certificate from
    /// `ca` for [`PROVIDER_HOSTS`].
    pub async fn providers(ca: Arc<TestCa>, routes: Routes) -> Self {
        Self::start(
            "127.0.0.1:0".parse().expect("a literal address"),
            Some(ca),
            PROVIDER_HOSTS,
            routes,
        )
        .await
        .expect("bind the stand-in")
    }

    /// A stand-in on `listen`: HTTPS with a certificate from `ca` for `names`, or plain HTTP/1.1 without
    /// a CA; answering from `routes`.
    ///
    /// # Errors
    /// When the address cannot be bound.
    pub async fn start(
        listen: SocketAddr,
        ca: Option<Arc<TestCa>>,
        names: &[&str],
        routes: Routes,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let tls = ca.as_ref().map(|ca| TlsAcceptor::from(ca.server_config(names)));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&requests);
        let routes = Arc::new(routes);
        let accept_loop = tokio::spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                let tls = tls.clone();
                let log = Arc::clone(&log);
                let routes = Arc::clone(&routes);
                tokio::spawn(async move {
                    let Some(tls) = tls else {
                        return serve(stream, true, "http", None, peer, log, routes).await;
                    };
                    let Ok(stream) = tls.accept(stream).await else {
                        return;
                    };
                    let (_, session) = stream.get_ref();
                    let h2 = session.alpn_protocol() == Some(b"h2");
                    let sni = session.server_name().map(str::to_owned);
                    serve(stream, !h2, "https", sni, peer, log, routes).await;
                });
            }
        });
        Ok(Self {
            addr,
            ca,
            requests,
            accept_loop,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA that issued its certificate (HTTPS only).
    pub fn ca(&self) -> Option<&Arc<TestCa>> {
        self.ca.as_ref()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<EchoRequest> {
        self.requests.lock().expect("request log lock").clone()
    }

    /// The requests whose path starts with `prefix`.
    pub fn requests_to(&self, prefix: &str) -> Vec<EchoRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.starts_with(prefix))
            .collect()
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

async fn serve<S>(
    stream: S,
    http1: bool,
    scheme: &'static str,
    sni: Option<String>,
    peer: SocketAddr,
    log: Arc<Mutex<Vec<EchoRequest>>>,
    routes: Arc<Routes>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request: Request<Incoming>| {
        let log = Arc::clone(&log);
        let routes = Arc::clone(&routes);
        let sni = sni.clone();
        async move {
            let received = record(request, scheme, sni, peer).await;
            let reply = routes.answer(&received);
            tracing::debug!(method = %received.method, path = %received.path, status = reply.status, "stand-in");
            log.lock().expect("request log lock").push(received);
            let mut response = Response::builder()
                .status(reply.status)
                .header(http::header::CONTENT_TYPE, reply.content_type);
            for (name, value) in &reply.headers {
                response = response.header(name.as_str(), value.as_str());
            }
            let response = response
                .body(Full::new(Bytes::from(reply.body)))
                .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
            Ok::<_, Infallible>(response)
        }
    });
    let io = TokioIo::new(stream);
    let result = if http1 {
        http1::Builder::new().serve_connection(io, service).await
    } else {
        http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, service)
            .await
    };
    if let Err(error) = result {
        tracing::debug!(%peer, %error, "stand-in connection ended with an error");
    }
}

async fn record(
    request: Request<Incoming>,
    scheme: &'static str,
    sni: Option<String>,
    peer: SocketAddr,
) -> EchoRequest {
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
    EchoRequest {
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
    }
}

/// The text of a tool result as the provider received it: a string, or the text blocks of an array.
pub(crate) fn text_of(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items) => items
            .iter()
            .filter_map(|i| i.get("text").and_then(|t| t.as_str()))
            .collect::<Vec<_>>()
            .join(""),
        other => other.to_string(),
    }
}
