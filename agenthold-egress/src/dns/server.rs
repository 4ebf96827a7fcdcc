//! The resolver a sandbox's DNS queries reach: one [`Server`] per agent, on sockets the caller bound inside
//! the gateway's network namespace.
//!
//! The agent is the one whose sockets the server runs on: identity comes from where a query arrived, never
//! from its content. What is answered is decided per query in [`Server::answer`] (see `answer.rs`); this file
//! owns the socket loops and their bounds: queries answered without the upstream (refusals, cache hits) are
//! answered inline in the UDP loop, which reads up to 32 datagrams per `recvmmsg(2)` (one while the agent
//! is quiet: the batch grows when reads fill it) and sends the inline replies of a batch with one
//! `sendmmsg(2)`; at most [`ServerLimits::in_flight`] UDP queries are forwarded at once
//! (excess datagrams are dropped: UDP clients retry), at most [`ServerLimits::tcp_connections`] TCP connections, each
//! closed after [`ServerLimits::tcp_idle`] without a complete query, and no TCP query longer than
//! [`ServerLimits::tcp_max_query`] bytes.

use std::fmt;
use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use agenthold_core::AgentId;
use agenthold_core::policy::EgressPolicy;
use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::answer::{Progress, Transport};
use super::wire::WireCache;
use super::{DnsBudget, Forward, Records, SyntheticNames, Upstream};
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::log::RequestLog;

/// The largest query datagram read whole; longer ones are cut and answered FORMERR.
const MAX_UDP_QUERY: usize = 4096;
/// Pause after a failed `recv`/`accept`, so a persistent socket error does not spin a core.
const ERROR_BACKOFF: Duration = Duration::from_millis(50);
/// Datagrams read with one `recvmmsg(2)` (and replies sent with one `sendmmsg(2)`) at most.
const UDP_BATCH: usize = 32;

/// What a [`Server`] works with. The server answers for `agent` only.
pub struct ServerContext<U = Upstream> {
    /// The agent whose sockets the server runs on.
    pub agent: AgentId,
    /// Decides which names the agent may resolve (asked on every query, so changes apply to the next one).
    pub policy: Arc<dyn EgressPolicy>,
    /// Where allowed queries are forwarded.
    pub upstream: Arc<U>,
    /// Where answered addresses are remembered for the proxy.
    pub records: Arc<Records>,
    /// Where every query is logged (kind `dns`).
    pub log: Arc<RequestLog>,
    /// Test-only name overrides answered with synthetic addresses (normally empty).
    pub synthetic: Arc<SyntheticNames>,
    /// The gateway's address guard: answers lose the addresses it refuses, and reverse names of the ranges
    /// it blocks are never forwarded.
    pub guard: Arc<Guard>,
    /// The DNS budgets and counters, shared by every agent of the gateway.
    pub budget: Arc<DnsBudget>,
}

impl<U> fmt::Debug for ServerContext<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerContext")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

/// Bounds of one agent's server. The defaults suit one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Largest UDP answer sent, whatever the client's EDNS size says (answers above the client's size, or
    /// 512 bytes without EDNS, come back with TC set). Default 1232 (DNS flag day 2020).
    pub udp_payload: u16,
    /// UDP queries answered at once; further datagrams are dropped until one finishes. Default 256.
    pub in_flight: usize,
    /// Open TCP connections; further connections are closed at once. Default 64.
    pub tcp_connections: usize,
    /// A TCP connection is closed when no complete query arrives for this long. Default 10 s.
    pub tcp_idle: Duration,
    /// Longest TCP query accepted; a longer one closes the connection. Default 4096 bytes.
    pub tcp_max_query: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            udp_payload: super::upstream::EDNS_PAYLOAD,
            in_flight: 256,
            tcp_connections: 64,
            tcp_idle: Duration::from_secs(10),
            tcp_max_query: 4096,
        }
    }
}

/// One agent's DNS server. Build it with [`Server::new`], run it with [`Server::spawn`]; [`Server::answer`]
/// is the per-query logic on its own (no sockets), for tests and the fuzz target.
pub struct Server<U = Upstream> {
    pub(super) ctx: ServerContext<U>,
    pub(super) limits: ServerLimits,
    /// Final reply bytes of cache hits (see `wire.rs`).
    pub(super) wire: WireCache,
}

impl<U> fmt::Debug for Server<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("agent", &self.ctx.agent)
            .field("limits", &self.limits)
            .finish()
    }
}

impl<U: Forward> Server<U> {
    /// A server for `ctx.agent` with the default [`ServerLimits`].
    #[must_use]
    pub fn new(ctx: ServerContext<U>) -> Self {
        Self {
            ctx,
            limits: ServerLimits::default(),
            wire: WireCache::default(),
        }
    }

    /// Replace the limits.
    #[must_use]
    pub fn with_limits(mut self, limits: ServerLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The agent this server answers for.
    #[must_use]
    pub fn agent(&self) -> &AgentId {
        &self.ctx.agent
    }

    /// Serve on an already-bound UDP socket and TCP listener (bound by the caller inside the gateway's
    /// namespace) until the returned handle is dropped or shut down. Must be called within a tokio runtime.
    ///
    /// # Errors
    /// [`Error::Io`] when a socket's local address cannot be read.
    pub fn spawn(self, udp: UdpSocket, tcp: TcpListener) -> Result<ServerHandle> {
        let udp_addr = udp
            .local_addr()
            .map_err(|e| Error::io("DNS UDP socket address", e))?;
        let tcp_addr = tcp
            .local_addr()
            .map_err(|e| Error::io("DNS TCP listener address", e))?;
        let token = CancellationToken::new();
        let server = Arc::new(self);
        let tasks = vec![
            tokio::spawn(Arc::clone(&server).serve_udp(Arc::new(udp), token.clone())),
            tokio::spawn(server.serve_tcp(tcp, token.clone())),
        ];
        Ok(ServerHandle {
            token,
            udp_addr,
            tcp_addr,
            tasks,
        })
    }

    /// [`Server::spawn`] for std sockets (as opened on a thread inside another network namespace).
    ///
    /// # Errors
    /// [`Error::Io`] when the sockets cannot be made non-blocking or registered with the runtime.
    pub fn spawn_std(self, udp: std::net::UdpSocket, tcp: std::net::TcpListener) -> Result<ServerHandle> {
        udp.set_nonblocking(true)
            .map_err(|e| Error::io("DNS UDP socket non-blocking", e))?;
        tcp.set_nonblocking(true)
            .map_err(|e| Error::io("DNS TCP listener non-blocking", e))?;
        let udp = UdpSocket::from_std(udp).map_err(|e| Error::io("DNS UDP socket registration", e))?;
        let tcp = TcpListener::from_std(tcp).map_err(|e| Error::io("DNS TCP listener registration", e))?;
        self.spawn(udp, tcp)
    }

    async fn serve_udp(self: Arc<Self>, socket: Arc<UdpSocket>, token: CancellationToken) {
        let permits = Arc::new(Semaphore::new(self.limits.in_flight.max(1)));
        // One receive buffer while the agent is quiet, doubled (up to UDP_BATCH) each time a read fills them
        // all: an idle agent holds 4 KiB here instead of 128 (hundreds of agents per process).
        let mut bufs = vec![[0u8; MAX_UDP_QUERY]; 1];
        let mut received: Vec<(usize, usize, SocketAddr)> = Vec::with_capacity(UDP_BATCH);
        let mut replies: Vec<(Vec<u8>, SocketAddr)> = Vec::with_capacity(UDP_BATCH);
        loop {
            let ready = tokio::select! {
                () = token.cancelled() => return,
                r = socket.readable() => r,
            };
            received.clear();
            let read = ready.and_then(|()| {
                socket.try_io(Interest::READABLE, || {
                    recv_batch(&socket, &mut bufs, &mut received)
                })
            });
            match read {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    tracing::warn!(agent = %self.ctx.agent, error = %e, "DNS UDP receive failed");
                    tokio::time::sleep(ERROR_BACKOFF).await;
                    continue;
                }
            }
            for &(index, len, peer) in &received {
                if permits.available_permits() == 0 {
                    tracing::debug!(agent = %self.ctx.agent, "DNS query dropped: too many in flight");
                    continue;
                }
                let packet = bufs.get(index).and_then(|b| b.get(..len)).unwrap_or_default();
                // Everything that needs no upstream exchange (refusals, cache hits) is answered here, without
                // a task; only a query to forward gets one.
                let pending = match self.answer_now(packet, Transport::Udp) {
                    Progress::Done(None) => continue,
                    Progress::Done(Some(reply)) => {
                        replies.push((reply, peer));
                        continue;
                    }
                    Progress::Forward(pending) => pending,
                };
                let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                    tracing::debug!(agent = %self.ctx.agent, "DNS query dropped: too many in flight");
                    continue;
                };
                let (server, socket) = (Arc::clone(&self), Arc::clone(&socket));
                let task_token = token.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    task_token
                        .run_until_cancelled(async {
                            if let Some(reply) = server.finish(pending).await
                                && let Err(e) = socket.send_to(&reply, peer).await
                            {
                                tracing::debug!(agent = %server.ctx.agent, error = %e, "DNS UDP send failed");
                            }
                        })
                        .await;
                });
            }
            self.send_replies(&socket, &mut replies).await;
            if received.len() == bufs.len() && bufs.len() < UDP_BATCH {
                bufs.resize((bufs.len() * 2).min(UDP_BATCH), [0u8; MAX_UDP_QUERY]);
            }
        }
    }

    /// Send the replies answered inline: several in one `sendmmsg(2)`, the rest (or all, when that fails or
    /// the socket is full) one by one.
    async fn send_replies(&self, socket: &UdpSocket, replies: &mut Vec<(Vec<u8>, SocketAddr)>) {
        let sent = if replies.len() > 1 {
            socket
                .try_io(Interest::WRITABLE, || send_batch(socket, replies))
                .unwrap_or(0)
        } else {
            0
        };
        for (reply, peer) in replies.drain(..).skip(sent) {
            match socket.try_send_to(&reply, peer) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Err(e) = socket.send_to(&reply, peer).await {
                        tracing::debug!(agent = %self.ctx.agent, error = %e, "DNS UDP send failed");
                    }
                }
                Err(e) => tracing::debug!(agent = %self.ctx.agent, error = %e, "DNS UDP send failed"),
            }
        }
    }

    async fn serve_tcp(self: Arc<Self>, listener: TcpListener, token: CancellationToken) {
        let permits = Arc::new(Semaphore::new(self.limits.tcp_connections.max(1)));
        loop {
            let accepted = tokio::select! {
                () = token.cancelled() => return,
                r = listener.accept() => r,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(agent = %self.ctx.agent, error = %e, "DNS TCP accept failed");
                    tokio::time::sleep(ERROR_BACKOFF).await;
                    continue;
                }
            };
            let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                tracing::debug!(agent = %self.ctx.agent, "DNS TCP connection refused: too many open");
                continue;
            };
            let server = Arc::clone(&self);
            let task_token = token.clone();
            tokio::spawn(async move {
                let _permit = permit;
                task_token
                    .run_until_cancelled(server.serve_connection(stream))
                    .await;
            });
        }
    }

    /// Length-prefixed queries, answered one after the other, until the client closes, goes idle, or sends
    /// something out of bounds.
    async fn serve_connection(&self, mut stream: TcpStream) {
        let idle = self.limits.tcp_idle;
        loop {
            let mut len = [0u8; 2];
            if !matches!(
                tokio::time::timeout(idle, stream.read_exact(&mut len)).await,
                Ok(Ok(_))
            ) {
                return;
            }
            let len = usize::from(u16::from_be_bytes(len));
            if len == 0 || len > self.limits.tcp_max_query {
                tracing::debug!(agent = %self.ctx.agent, len, "DNS TCP query of invalid length: closing");
                return;
            }
            let mut packet = vec![0u8; len];
            if !matches!(
                tokio::time::timeout(idle, stream.read_exact(&mut packet)).await,
                Ok(Ok(_))
            ) {
                return;
            }
            let Some(reply) = self.answer(&packet, Transport::Tcp).await else {
                continue;
            };
            // `answer` keeps TCP replies within 65535 bytes (it truncates beyond).
            let Ok(reply_len) = u16::try_from(reply.len()) else {
                return;
            };
            let mut framed = Vec::with_capacity(reply.len() + 2);
            framed.extend_from_slice(&reply_len.to_be_bytes());
            framed.extend_from_slice(&reply);
            if !matches!(
                tokio::time::timeout(idle, stream.write_all(&framed)).await,
                Ok(Ok(()))
            ) {
                return;
            }
        }
    }
}

/// Read up to `bufs.len()` waiting datagrams with one `recvmmsg(2)` (non-blocking) into `bufs`, appending
/// (buffer index, length, sender) to `out`. A datagram longer than its buffer is cut (and then answered
/// FORMERR). `WouldBlock` when none is waiting.
fn recv_batch(
    socket: &UdpSocket,
    bufs: &mut [[u8; MAX_UDP_QUERY]],
    out: &mut Vec<(usize, usize, SocketAddr)>,
) -> std::io::Result<()> {
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(bufs.len(), None);
    let mut slices: Vec<[IoSliceMut<'_>; 1]> = bufs.iter_mut().map(|b| [IoSliceMut::new(b)]).collect();
    let results = recvmmsg(
        socket.as_raw_fd(),
        &mut headers,
        slices.iter_mut(),
        MsgFlags::MSG_DONTWAIT,
        None,
    )
    .map_err(std::io::Error::from)?;
    for (index, msg) in results.enumerate() {
        let peer = msg.address.as_ref().and_then(|a| {
            a.as_sockaddr_in()
                .map(|v4| SocketAddr::V4((*v4).into()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| SocketAddr::V6((*v6).into())))
        });
        if let Some(peer) = peer {
            out.push((index, msg.bytes, peer));
        }
    }
    Ok(())
}

/// Send `replies` with one `sendmmsg(2)` (non-blocking); how many went out (the first ones).
fn send_batch(socket: &UdpSocket, replies: &[(Vec<u8>, SocketAddr)]) -> std::io::Result<usize> {
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(replies.len(), None);
    let slices: Vec<[IoSlice<'_>; 1]> = replies.iter().map(|(r, _)| [IoSlice::new(r)]).collect();
    let addrs: Vec<Option<SockaddrStorage>> = replies
        .iter()
        .map(|(_, peer)| Some(SockaddrStorage::from(*peer)))
        .collect();
    let cmsgs: [ControlMessage<'_>; 0] = [];
    let results = sendmmsg(
        socket.as_raw_fd(),
        &mut headers,
        slices.iter(),
        addrs,
        cmsgs,
        MsgFlags::MSG_DONTWAIT,
    )
    .map_err(std::io::Error::from)?;
    Ok(results.count())
}

/// A running [`Server`]. Dropping it stops the server (without waiting); [`ServerHandle::shutdown`] stops it
/// and waits for its socket loops to end.
#[derive(Debug)]
pub struct ServerHandle {
    token: CancellationToken,
    udp_addr: SocketAddr,
    tcp_addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    /// The UDP socket's address.
    #[must_use]
    pub fn udp_addr(&self) -> SocketAddr {
        self.udp_addr
    }

    /// The TCP listener's address.
    #[must_use]
    pub fn tcp_addr(&self) -> SocketAddr {
        self.tcp_addr
    }

    /// Stop serving: the sockets close once the loops end; queries in progress are abandoned.
    pub async fn shutdown(mut self) {
        self.token.cancel();
        for task in std::mem::take(&mut self.tasks) {
            // A loop that panicked has stopped as well; nothing else to do with the error.
            let _ = task.await;
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.token.cancel();
    }
}
