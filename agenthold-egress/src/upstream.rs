//! The pooled upstream HTTP client shared by every agent: its connector dials only what the gateway
//! resolved and the guard allowed (E5, E6) and, for intercepted hosts, speaks verified TLS with ALPN; plus
//! the request and response plumbing around it (hop-by-hop headers, byte counting, logging at the end of
//! a body).

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Uri, Version};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::budget::RequestPermit;
use crate::dial::{DialError, Dialer};
use crate::log::{Counters, PendingEntry};
use crate::open::Registration;
use crate::target::Target;

/// Body type of everything the proxies send.
pub(crate) type ProxyBody = BoxBody<Bytes, BoxError>;
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The pooled upstream client.
pub(crate) type HttpClient = Client<Connector, ProxyBody>;

/// Build the upstream client over `dialer`, speaking TLS with `tls` for `https` URIs.
pub(crate) fn client(
    dialer: Dialer,
    tls: Arc<rustls::ClientConfig>,
    connect_timeout: Duration,
) -> HttpClient {
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(32)
        .http1_max_buf_size(1024 * 1024)
        .set_host(false)
        .retry_canceled_requests(false)
        .build(Connector {
            dialer,
            tls: tokio_rustls::TlsConnector::from(tls),
            connect_timeout,
        })
}

/// Dials upstreams for the pooled client: names through the gateway's resolver and the guard, addresses
/// through the guard; TLS (verified, ALPN h2/http1.1) for `https`.
#[derive(Clone)]
pub(crate) struct Connector {
    dialer: Dialer,
    tls: tokio_rustls::TlsConnector,
    connect_timeout: Duration,
}

/// A connection made by [`Connector`].
pub(crate) enum UpstreamConn {
    Plain(TokioIo<TcpStream>),
    // Boxed: a TLS session is over a kilobyte; plain connections should not pay for it.
    Tls {
        io: Box<TokioIo<TlsStream<TcpStream>>>,
        h2: bool,
    },
}

impl Connection for UpstreamConn {
    fn connected(&self) -> Connected {
        match self {
            Self::Tls { h2: true, .. } => Connected::new().negotiated_h2(),
            _ => Connected::new(),
        }
    }
}

impl hyper::rt::Read for UpstreamConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Self::Tls { io, .. } => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for UpstreamConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Self::Tls { io, .. } => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_flush(cx),
            Self::Tls { io, .. } => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tls { io, .. } => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = UpstreamConn;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamConn, DialError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), DialError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .unwrap_or_default()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let tls = uri.scheme_str() == Some("https");
            let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
            let stream = match host.parse::<IpAddr>() {
                Ok(ip) => this.dialer.dial_addr((ip, port).into()).await?,
                Err(_) => this.dialer.dial_name(&host, port, None).await?.0,
            };
            if !tls {
                return Ok(UpstreamConn::Plain(TokioIo::new(stream)));
            }
            let name = ServerName::try_from(host).map_err(|e| DialError::Tls(std::io::Error::other(e)))?;
            let handshake = this.tls.connect(name, stream);
            let tls = match tokio::time::timeout(this.connect_timeout, handshake).await {
                Err(_) => return Err(DialError::Timeout),
                Ok(Err(e)) => return Err(DialError::Tls(e)),
                Ok(Ok(t)) => t,
            };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            Ok(UpstreamConn::Tls {
                io: Box::new(TokioIo::new(tls)),
                h2,
            })
        })
    }
}

/// The request as it goes upstream: absolute URI for the pool key, hop-by-hop headers removed, HTTP/1.1
/// (the pool speaks h2 itself when the upstream negotiated it), body counted.
pub(crate) fn upstream_request(
    mut parts: http::request::Parts,
    body: ProxyBody,
    scheme: &str,
    target: &Target,
    port: u16,
    keep_upgrade: bool,
) -> Result<Request<ProxyBody>, &'static str> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let default_port = if scheme == "https" { 443 } else { 80 };
    let authority = match target {
        Target::Name(n) if port == default_port => n.clone(),
        Target::Name(n) => format!("{n}:{port}"),
        Target::Addr(IpAddr::V4(a)) => format!("{a}:{port}"),
        Target::Addr(IpAddr::V6(a)) => format!("[{a}]:{port}"),
    };
    parts.uri = format!("{scheme}://{authority}{path}")
        .parse()
        .map_err(|_| "request target is not a valid URI")?;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers, keep_upgrade);
    // The upstream sees the host the request was decided by, never a different or a second `Host` the
    // sandbox wrote: on shared addresses (CDNs, virtual hosting) `Host` picks the site.
    parts.headers.insert(
        header::HOST,
        HeaderValue::from_str(&authority).map_err(|_| "bad host")?,
    );
    Ok(Request::from_parts(parts, body))
}

/// A sandbox's request body, counted into `counters` as it streams upstream.
pub(crate) fn counted(body: Incoming, counters: &Arc<Counters>) -> ProxyBody {
    CountedBody {
        inner: body,
        counters: Arc::clone(counters),
    }
    .boxed()
}

/// Remove hop-by-hop headers (RFC 9110 §7.6.1), and the headers `Connection` names; keep `Connection:
/// upgrade` and `Upgrade` for protocol switches.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // The common case, a head without any of them: one pass over the names instead of a removal per
    // hop-by-hop name.
    if !keep_upgrade && !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| !(keep_upgrade && n == header::UPGRADE))
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
    ] {
        headers.remove(name);
    }
    headers.remove(header::TRANSFER_ENCODING);
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

/// Whether `name` is one of the headers [`strip_hop_by_hop`] removes whatever `Connection` says (itself
/// included, since it may name others).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name == header::TE
        || name == header::TRAILER
        || name == header::PROXY_AUTHENTICATE
        || name == header::PROXY_AUTHORIZATION
        || matches!(name.as_str(), "keep-alive" | "proxy-connection")
}

/// A request body that counts the bytes it carries upstream.
struct CountedBody {
    inner: Incoming,
    counters: Arc<Counters>,
}

impl Body for CountedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let res = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &res
            && let Some(data) = frame.data_ref()
        {
            self.counters.up.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        res.map_err(Into::into)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that counts the bytes it carries to the sandbox; the request's log entry is recorded
/// when the body ends or is dropped (a client that hangs up early still gets a log line). It holds the
/// request's budget permit while it streams, and ends with an error when a policy change revokes the
/// destination (E21: a long server-sent event stream is closed like a spliced connection).
pub(crate) struct LoggedBody {
    inner: Incoming,
    pending: PendingEntry,
    _permit: RequestPermit,
    /// With the future that fires when it is revoked (streams only: short answers end on their own).
    revocable: Option<(Registration, Pin<Box<WaitForCancellationFutureOwned>>)>,
}

impl LoggedBody {
    pub(crate) fn new(
        inner: Incoming,
        pending: PendingEntry,
        permit: RequestPermit,
        registration: Option<Registration>,
    ) -> Self {
        let revocable = registration.map(|r| {
            let fired = Box::pin(r.revoke.clone().cancelled_owned());
            (r, fired)
        });
        Self {
            inner,
            pending,
            _permit: permit,
            revocable,
        }
    }
}

impl Body for LoggedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let revoked = self
            .revocable
            .as_mut()
            .is_some_and(|(r, fired)| fired.as_mut().poll(cx).is_ready() && r.was_revoked());
        if revoked {
            self.pending.revoked();
            return Poll::Ready(Some(Err(
                "revoked: the agent's policy no longer allows this host".into(),
            )));
        }
        let res = Pin::new(&mut self.inner).poll_frame(cx);
        match &res {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.pending
                        .counters
                        .down
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let why = format!("upstream body: {e}");
                self.pending.entry.fail(why);
            }
            Poll::Ready(None) | Poll::Pending => {}
        }
        res.map_err(Into::into)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn names(map: &HeaderMap) -> Vec<&str> {
        let mut names: Vec<&str> = map.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn a_head_without_hop_by_hop_headers_is_left_as_it_is() {
        let mut map = headers(&[("host", "a.test"), ("accept", "*/*"), ("x-a", "1"), ("x-a", "2")]);
        let before = map.clone();
        strip_hop_by_hop(&mut map, false);
        assert_eq!(map, before);
    }

    #[test]
    fn every_hop_by_hop_header_and_those_connection_names_are_removed() {
        for hop in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
        ] {
            // Each alone is enough to be removed (the fast path must not skip any of them).
            let mut map = headers(&[("host", "a.test"), (hop, "x")]);
            strip_hop_by_hop(&mut map, false);
            assert_eq!(names(&map), ["host"], "{hop}");
        }
        let mut map = headers(&[
            ("host", "a.test"),
            ("connection", "close, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("x-kept", "2"),
        ]);
        strip_hop_by_hop(&mut map, false);
        assert_eq!(names(&map), ["host", "x-kept"]);
    }

    #[test]
    fn an_upgrade_keeps_connection_upgrade_and_the_upgrade_header() {
        let mut map = headers(&[("host", "a.test"), ("upgrade", "websocket"), ("keep-alive", "5")]);
        strip_hop_by_hop(&mut map, true);
        assert_eq!(names(&map), ["connection", "host", "upgrade"]);
        assert_eq!(map[header::CONNECTION], "upgrade");
    }
}
