//! The bounded set of UDP sockets the gateway's DNS client sends its queries from.
//!
//! Each socket is bound to a port the kernel picks at random from the ephemeral range (port 0) and connected
//! to the upstream, and serves one exchange at a time: a query leases a socket, and returns it when its
//! exchange ends. At most [`ForwardLimits::upstream_sockets`] sockets exist at once (a query waits for a free
//! one, within its own timeout); a socket is closed after [`ForwardLimits::socket_queries`] exchanges, after
//! [`ForwardLimits::socket_lifetime`], or after a socket error, and the next lease binds a fresh one on a new
//! random port. So the source port keeps changing (an off-path attacker must still guess port and id) without
//! a socket per query. A late answer to an earlier exchange on a reused socket fails the next exchange's
//! id-and-question check and is dropped (and counted).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::net::UdpSocket;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::forward_cache::ForwardLimits;
use super::upstream::lock;

#[derive(Debug)]
struct Pooled {
    socket: UdpSocket,
    uses: u32,
    born: Instant,
}

/// The pool (see the module docs).
#[derive(Debug)]
pub(crate) struct SocketPool {
    idle: Mutex<Vec<Pooled>>,
    /// One permit per socket that may exist: leased or idle.
    permits: Arc<Semaphore>,
    max_uses: u32,
    lifetime: std::time::Duration,
    /// Sockets currently open (leased or idle).
    open: Arc<AtomicUsize>,
}

impl SocketPool {
    pub(crate) fn new(limits: &ForwardLimits) -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(limits.upstream_sockets.max(1))),
            max_uses: limits.socket_queries.max(1),
            lifetime: limits.socket_lifetime,
            open: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Sockets open now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// A socket connected to `upstream`, ours until the lease drops: an idle one, or a fresh one when none
    /// is idle. Waits while every allowed socket is leased.
    pub(crate) async fn lease(&self, upstream: SocketAddr) -> std::io::Result<Lease<'_>> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| std::io::Error::other("DNS socket pool closed"))?;
        let reused = lock(&self.idle).pop();
        let pooled = match reused {
            Some(p) => p,
            None => {
                let local: SocketAddr = match upstream {
                    SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
                    SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
                };
                // Port 0: the kernel picks a random ephemeral port. Connecting makes the kernel drop
                // datagrams from any other address; the exchange compares the source again all the same.
                let socket = UdpSocket::bind(local).await?;
                socket.connect(upstream).await?;
                self.open.fetch_add(1, Ordering::Relaxed);
                Pooled {
                    socket,
                    uses: 0,
                    born: Instant::now(),
                }
            }
        };
        Ok(Lease {
            pool: self,
            pooled: Some(pooled),
            keep: AtomicBool::new(true),
            _permit: permit,
        })
    }
}

/// One leased socket; back to the pool on drop unless worn out or discarded.
#[derive(Debug)]
pub(crate) struct Lease<'a> {
    pool: &'a SocketPool,
    pooled: Option<Pooled>,
    keep: AtomicBool,
    // Dropped after `Drop::drop` returned the socket: a waiter then finds it idle.
    _permit: OwnedSemaphorePermit,
}

impl Lease<'_> {
    pub(crate) fn socket(&self) -> &UdpSocket {
        // `pooled` is only taken in `drop`.
        #[allow(clippy::expect_used)]
        &self.pooled.as_ref().expect("a lease holds its socket").socket
    }

    /// Close the socket instead of returning it (after a socket error).
    pub(crate) fn discard(&self) {
        self.keep.store(false, Ordering::Relaxed);
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(mut pooled) = self.pooled.take() else {
            return;
        };
        pooled.uses += 1;
        if self.keep.load(Ordering::Relaxed)
            && pooled.uses < self.pool.max_uses
            && pooled.born.elapsed() < self.pool.lifetime
        {
            lock(&self.pool.idle).push(pooled);
        } else {
            self.pool.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
