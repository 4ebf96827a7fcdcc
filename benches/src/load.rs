//! Load generators written in Rust, for what the reference tools cannot do here: new TLS connections with
//! certificate verification and no session resumption, HTTP through an explicit proxy, DNS with many
//! queries outstanding.
//!
//! Each runs on one thread with a current-thread tokio runtime (or plain blocking sockets), started by
//! [`in_namespace`] inside the namespace the client belongs to: a socket belongs to the namespace of the
//! thread that creates it, so every connection these make starts in the sandbox (or the direct client's
//! namespace) exactly as a process there would.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthold_egress::netns::NetNs;
use anyhow::{Context, Result, bail};
use rustls::client::Resumption;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// What a timed run achieved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Operations completed per second (connections, requests or queries).
    pub per_second: f64,
    /// Operations that failed (connection errors, bad answers, lost DNS queries).
    pub errors: u64,
}

/// Runs `f` on a fresh thread inside `ns` (or in this process's namespace for `None`) and returns its
/// result. The caller blocks until `f` is done.
///
/// # Errors
/// What `f` returns, or a failure to enter the namespace.
pub fn in_namespace<T, F>(ns: Option<&NetNs>, f: F) -> Result<T>
where
    T: Send,
    F: FnOnce() -> Result<T> + Send,
{
    let mut result = None;
    let slot = &mut result;
    let run = move || -> io::Result<()> {
        *slot = Some(f());
        Ok(())
    };
    match ns {
        Some(ns) => ns.run(run)?,
        None => std::thread::scope(|s| s.spawn(run).join())
            .map_err(|_| anyhow::anyhow!("load generator thread panicked"))??,
    }
    result.context("load generator did not run")?
}

/// Runs `future` to completion on a current-thread runtime made on the calling thread (so the sockets it
/// creates belong to this thread's namespace).
///
/// # Errors
/// What `future` returns, or a failure to build the runtime.
pub fn block_on<T>(future: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("build the client runtime")?
        .block_on(future)
}

/// A rustls client configuration trusting only `ca`, without session resumption: every connection pays
/// a full handshake, as a fresh process (curl, an SDK) would.
pub fn tls_client_config(ca: &agenthold_testsupport::TestCa) -> Arc<rustls::ClientConfig> {
    let mut config = (*ca.client_config(&[b"http/1.1"])).clone();
    config.resumption = Resumption::disabled();
    Arc::new(config)
}

/// New TLS connections per second: `concurrency` loops, each connecting to `target`, handshaking as
/// `name` (certificate verified), sending one `GET /small` with `Connection: close` and reading the
/// answer to the end, for `duration`.
///
/// # Errors
/// When no connection at all succeeded.
pub async fn tls_connections(
    target: SocketAddr,
    name: &str,
    config: Arc<rustls::ClientConfig>,
    concurrency: usize,
    duration: Duration,
) -> Result<Outcome> {
    let server_name = ServerName::try_from(name.to_owned())?;
    let connector = TlsConnector::from(config);
    let request = format!("GET /small HTTP/1.1\r\nhost: {name}\r\nconnection: close\r\n\r\n").into_bytes();
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (connector, server_name, request) = (connector.clone(), server_name.clone(), request.clone());
        tasks.spawn(async move {
            let (mut done, mut errors) = (0u64, 0u64);
            while Instant::now() < deadline {
                let once = async {
                    let tcp = TcpStream::connect(target).await?;
                    tcp.set_nodelay(true)?;
                    let mut tls = connector.connect(server_name.clone(), tcp).await?;
                    tls.write_all(&request).await?;
                    let mut buf = Vec::with_capacity(1024);
                    read_response(&mut tls, &mut buf, true).await
                };
                match once.await {
                    Ok(()) if Instant::now() <= deadline => done += 1,
                    Ok(()) => {}
                    Err(e) => {
                        errors += 1;
                        tracing::debug!(error = %e, "TLS connection failed");
                    }
                }
            }
            (done, errors)
        });
    }
    finish(tasks, duration).await
}

/// Keep-alive HTTP requests per second: `connections` connections to `target`, each sending `request`
/// (a complete request head) and reading the answer, back to back, for `duration`.
///
/// # Errors
/// When no request at all succeeded.
pub async fn http_keepalive(
    target: SocketAddr,
    request: Vec<u8>,
    connections: usize,
    duration: Duration,
) -> Result<Outcome> {
    let deadline = Instant::now() + duration;
    let request: Arc<[u8]> = request.into();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let request = Arc::clone(&request);
        tasks.spawn(async move {
            let (mut done, mut errors) = (0u64, 0u64);
            while Instant::now() < deadline {
                let run = async {
                    let mut stream = TcpStream::connect(target).await?;
                    stream.set_nodelay(true)?;
                    let mut buf = Vec::with_capacity(4096);
                    while Instant::now() < deadline {
                        stream.write_all(&request).await?;
                        read_response(&mut stream, &mut buf, false).await?;
                        done += 1;
                    }
                    io::Result::Ok(())
                };
                if let Err(e) = run.await {
                    errors += 1;
                    tracing::debug!(error = %e, "HTTP connection failed");
                }
            }
            (done, errors)
        });
    }
    finish(tasks, duration).await
}

async fn finish(mut tasks: tokio::task::JoinSet<(u64, u64)>, duration: Duration) -> Result<Outcome> {
    let (mut done, mut errors) = (0u64, 0u64);
    while let Some(joined) = tasks.join_next().await {
        let (d, e) = joined?;
        done += d;
        errors += e;
    }
    if done == 0 {
        bail!("no operation succeeded ({errors} errors)");
    }
    Ok(Outcome {
        per_second: done as f64 / duration.as_secs_f64(),
        errors,
    })
}

/// Read more of a response into `buf`; end of stream is an error.
async fn read_more<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    chunk: &mut [u8],
) -> io::Result<()> {
    let n = stream.read(chunk).await?;
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// Reads one `200` response (head, and a `content-length` or chunked body) from `stream`; bytes beyond it
/// stay in `buf`. With `to_end`, then reads until the server closes (a `Connection: close` exchange), so
/// that the server, not the client, closes first and the client never holds a port in TIME_WAIT.
pub async fn read_response<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    to_end: bool,
) -> io::Result<()> {
    let mut chunk = [0u8; 8192];
    let (head, length) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(buf) {
            Ok(httparse::Status::Complete(head)) => {
                if response.code != Some(200) {
                    return Err(io::Error::other(format!("status {:?}", response.code)));
                }
                let length = response
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse::<usize>().ok());
                let chunked = response.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("transfer-encoding")
                        && h.value.eq_ignore_ascii_case(b"chunked")
                });
                if length.is_none() && !chunked {
                    return Err(io::Error::other("neither content-length nor chunked"));
                }
                break (head, length);
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let need = match length {
        Some(length) => head + length,
        // Chunked (what an intercepting gateway sends when it may change a body's length): walk the chunks
        // to the last one and its final empty line.
        None => {
            let mut at = head;
            loop {
                match httparse::parse_chunk_size(buf.get(at..).unwrap_or_default()) {
                    Ok(httparse::Status::Complete((used, 0))) => {
                        let end = at + used + 2;
                        while buf.len() < end {
                            read_more(stream, buf, &mut chunk).await?;
                        }
                        break end;
                    }
                    Ok(httparse::Status::Complete((used, size))) => {
                        let size = usize::try_from(size).map_err(io::Error::other)?;
                        let next = at + used + size + 2;
                        while buf.len() < next {
                            read_more(stream, buf, &mut chunk).await?;
                        }
                        at = next;
                    }
                    Ok(httparse::Status::Partial) => read_more(stream, buf, &mut chunk).await?,
                    Err(_) => return Err(io::Error::new(io::ErrorKind::InvalidData, "bad chunk size")),
                }
            }
        }
    };
    while buf.len() < need {
        read_more(stream, buf, &mut chunk).await?;
    }
    buf.drain(..need);
    if to_end {
        // The answer is complete: a TCP close without TLS close_notify is not an error here.
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
    Ok(())
}

/// Raw TCP bulk throughput in bytes per second: asks `target` (an [`upstream::serve_raw`] server) for
/// `bytes` bytes and reads them to the end of the stream. Blocking sockets: call it on a thread inside the
/// client's namespace.
///
/// [`upstream::serve_raw`]: crate::upstream::serve_raw
///
/// # Errors
/// When the connection fails or fewer than `bytes` bytes arrive.
pub fn tcp_bulk(target: SocketAddr, bytes: u64) -> Result<f64> {
    use std::io::{Read, Write};
    let start = Instant::now();
    let mut stream = std::net::TcpStream::connect(target)?;
    stream.write_all(&bytes.to_be_bytes())?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut received = 0u64;
    loop {
        match stream.read(&mut buf)? {
            0 => break,
            n => received += n as u64,
        }
    }
    let elapsed = start.elapsed();
    if received < bytes {
        bail!("{target}: {received} of {bytes} bytes");
    }
    Ok(received as f64 / elapsed.as_secs_f64())
}

/// How long an unanswered DNS query is waited for before it counts as lost and is replaced.
const DNS_LOST_AFTER: Duration = Duration::from_millis(500);

/// DNS queries per second over UDP: one socket keeps `window` `A` queries outstanding towards `server`,
/// cycling through `names`, for `duration`. An answer counts when it carries an outstanding id, NOERROR
/// and at least one answer record; unanswered queries are replaced after 500 ms and count as errors.
/// Blocking sockets: call it on a thread inside the client's namespace.
///
/// # Errors
/// When no query at all was answered, or the socket fails.
pub fn dns_queries(
    server: SocketAddr,
    names: &[String],
    window: usize,
    duration: Duration,
) -> Result<Outcome> {
    let queries: Vec<Vec<u8>> = names.iter().map(|n| encode_query(n)).collect::<Result<_>>()?;
    if queries.is_empty() {
        bail!("no names to query");
    }
    let mut next_name = 0usize;
    dns_query_loop(server, window, duration, |packet, id| {
        packet.clear();
        packet.extend_from_slice(&queries[next_name % queries.len()]);
        packet[..2].copy_from_slice(&id.to_be_bytes());
        next_name += 1;
        Ok(())
    })
}

/// The load loop of [`dns_queries`] and of `dns_cache::unique_queries`: `window` queries outstanding on one
/// connected UDP socket for `duration`, each one's bytes written by `next_query(packet, id)` (the id is
/// free among the outstanding ones), answers matched by id and checked (NOERROR, at least one answer);
/// queries unanswered after 500 ms count as errors and are replaced.
///
/// # Errors
/// When no query at all was answered, or the socket or `next_query` fails.
pub(crate) fn dns_query_loop(
    server: SocketAddr,
    window: usize,
    duration: Duration,
    mut next_query: impl FnMut(&mut Vec<u8>, u16) -> Result<()>,
) -> Result<Outcome> {
    let socket = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))?;
    socket.connect(server)?;
    socket.set_read_timeout(Some(Duration::from_millis(20)))?;
    let mut outstanding: HashMap<u16, Instant> = HashMap::with_capacity(window * 2);
    let mut next_id = 0u16;
    let (mut answered, mut errors) = (0u64, 0u64);
    let mut packet = Vec::with_capacity(128);
    let mut send = |outstanding: &mut HashMap<u16, Instant>| -> Result<()> {
        while outstanding.contains_key(&next_id) {
            next_id = next_id.wrapping_add(1);
        }
        next_query(&mut packet, next_id)?;
        socket.send(&packet)?;
        outstanding.insert(next_id, Instant::now());
        next_id = next_id.wrapping_add(1);
        Ok(())
    };
    let start = Instant::now();
    let deadline = start + duration;
    for _ in 0..window {
        send(&mut outstanding)?;
    }
    let mut buf = [0u8; 4096];
    let mut last_sweep = start;
    while Instant::now() < deadline {
        match socket.recv(&mut buf) {
            Ok(len) if len >= 12 => {
                let id = u16::from_be_bytes([buf[0], buf[1]]);
                if outstanding.remove(&id).is_none() {
                    continue;
                }
                let rcode = buf[3] & 0x0f;
                let answers = u16::from_be_bytes([buf[6], buf[7]]);
                if rcode == 0 && answers > 0 {
                    answered += 1;
                } else {
                    errors += 1;
                }
                send(&mut outstanding)?;
            }
            Ok(_) => errors += 1,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e.into()),
        }
        let now = Instant::now();
        if now.duration_since(last_sweep) >= DNS_LOST_AFTER / 5 {
            last_sweep = now;
            let before = outstanding.len();
            outstanding.retain(|_, sent| now.duration_since(*sent) < DNS_LOST_AFTER);
            for _ in outstanding.len()..before {
                errors += 1;
                send(&mut outstanding)?;
            }
        }
    }
    if answered == 0 {
        bail!("no DNS query answered ({errors} errors)");
    }
    Ok(Outcome {
        per_second: answered as f64 / duration.as_secs_f64(),
        errors,
    })
}

/// One `A` question for `name` with recursion desired, id 0 (patched per query).
fn encode_query(name: &str) -> Result<Vec<u8>> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RecordType};
    let mut message = Message::query();
    message.metadata.id = 0;
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name)?, RecordType::A));
    Ok(message.to_vec()?)
}

/// The first `A` address `server` answers for `name`, asked from the calling thread's namespace.
///
/// # Errors
/// When no usable answer arrives within two seconds.
pub fn resolve_a(server: SocketAddr, name: &str) -> Result<std::net::Ipv4Addr> {
    use hickory_proto::op::Message;
    use hickory_proto::rr::RData;
    let socket = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))?;
    socket.connect(server)?;
    socket.set_read_timeout(Some(Duration::from_secs(2)))?;
    socket.send(&encode_query(name)?)?;
    let mut buf = [0u8; 4096];
    let len = socket
        .recv(&mut buf)
        .with_context(|| format!("no DNS answer from {server}"))?;
    let answer = Message::from_vec(&buf[..len])?;
    answer
        .answers
        .iter()
        .find_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .with_context(|| format!("{server} answered {name} without an A record: {answer:?}"))
}
