//! Upstreams on loopback for the gateway under test: echo servers behind a name, a banner-and-echo TCP
//! server, a listener that never completes a handshake, and a canary that catches dials to the host itself.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agenthold_testsupport::EchoServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The HTTPS and HTTP echo servers behind one name.
pub(crate) struct Web {
    pub(crate) https: EchoServer,
    pub(crate) http: EchoServer,
}

impl Web {
    /// Requests both servers received.
    pub(crate) fn total(&self) -> usize {
        self.https.requests().len() + self.http.requests().len()
    }
}

/// What a [`TcpUpstream`] sends first.
pub(crate) const BANNER: &str = "SSH-2.0-upstream\r\n";

/// A loopback TCP server that greets with [`BANNER`] and echoes what it receives; counts connections.
pub(crate) struct TcpUpstream {
    pub(crate) addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl TcpUpstream {
    pub(super) async fn start() -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    if stream.write_all(BANNER.as_bytes()).await.is_err() {
                        return;
                    }
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { addr, accepted, task }
    }

    pub(crate) fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TcpUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A TCP listener on `0.0.0.0:PORT` in the host namespace (the gateway process's own), counting every
/// connection: it catches a dial to 127.0.0.1, 0.0.0.0 or any of the host's own addresses on that port.
pub(crate) struct Canary {
    pub(crate) port: u16,
    accepted: Arc<Mutex<Vec<SocketAddr>>>,
    task: JoinHandle<()>,
}

impl Canary {
    pub(crate) async fn start() -> Self {
        Self::listen(TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).await.unwrap())
    }

    /// On `[::]:PORT`, dual-stack: catches dials to every IPv4 and IPv6 address of the namespace (for the
    /// host namespace of the harness, which has IPv6).
    pub(crate) async fn start_dual() -> Self {
        Self::listen(
            TcpListener::bind((std::net::Ipv6Addr::UNSPECIFIED, 0))
                .await
                .unwrap(),
        )
    }

    fn listen(listener: TcpListener) -> Self {
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            while let Ok((_stream, peer)) = listener.accept().await {
                log.lock().unwrap().push(peer);
            }
        });
        Self { port, accepted, task }
    }

    pub(crate) fn accepted(&self) -> Vec<SocketAddr> {
        self.accepted.lock().unwrap().clone()
    }

    pub(crate) fn clear(&self) {
        self.accepted.lock().unwrap().clear();
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A loopback listener that never accepts, its queue filled: a connection to it waits for the SYN-ACK that
/// never comes (what an unreachable upstream looks like), without a packet leaving loopback.
pub(crate) struct Stalled {
    pub(crate) addr: SocketAddr,
    _listener: socket2::Socket,
    _fillers: Vec<std::net::TcpStream>,
}

impl Stalled {
    pub(super) fn start() -> Self {
        use socket2::{Domain, Socket, Type};
        let listener = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        listener
            .bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
            .unwrap();
        listener.listen(0).unwrap();
        let addr = listener.local_addr().unwrap().as_socket().unwrap();
        // Fill the accept queue until a connection attempt hangs.
        let mut fillers = Vec::new();
        while let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            fillers.push(s);
            assert!(fillers.len() < 16, "the accept queue of {addr} never fills");
        }
        Self {
            addr,
            _listener: listener,
            _fillers: fillers,
        }
    }
}

/// A loopback port where nothing listens (bound, then closed).
pub(super) async fn closed_loopback_port() -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    listener.local_addr().unwrap()
}
