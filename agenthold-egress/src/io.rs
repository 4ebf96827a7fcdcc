//! Byte plumbing shared by the proxies: a stream that replays the bytes already read while sniffing, an
//! activity clock that closes connections idle in both directions, and the bidirectional splice that
//! carries every non-intercepted connection.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::log::Counters;

/// Size of each direction's copy buffer. 64 KiB matches the socket buffer sizes loopback and typical
/// links fill per read; larger buffers did not move throughput in measurements and cost memory per
/// connection.
const COPY_BUF: usize = 64 * 1024;

/// A stream that first yields `prefix` (bytes read while sniffing), then reads from `inner`.
#[derive(Debug)]
pub(crate) struct Rewind<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    pub(crate) fn new(prefix: Bytes, inner: S) -> Self {
        Self { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// When a connection last moved a byte, shared by everything that carries it. Touching it is one relaxed
/// atomic store, cheap enough for every read.
#[derive(Debug, Clone)]
pub(crate) struct Activity {
    origin: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Resolves once nothing has moved for `idle`.
    pub(crate) async fn idle_for(&self, idle: Duration) {
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        loop {
            let since = self.now_ms().saturating_sub(self.last_ms.load(Ordering::Relaxed));
            if since >= idle_ms {
                return;
            }
            tokio::time::sleep(Duration::from_millis(idle_ms - since)).await;
        }
    }
}

/// A stream that touches an [`Activity`] on every successful read or write.
#[derive(Debug)]
pub(crate) struct Tracked<S> {
    inner: S,
    activity: Activity,
}

impl<S> Tracked<S> {
    pub(crate) fn new(inner: S, activity: Activity) -> Self {
        Self { inner, activity }
    }

    pub(crate) fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(res, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        res
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(res, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        res
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(res, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        res
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// How a splice ended.
#[derive(Debug)]
pub(crate) enum SpliceEnd {
    /// Both sides closed their sending direction.
    Closed,
    /// Nothing moved in either direction for the idle timeout.
    Idle,
    /// A read or write failed.
    Error(io::Error),
}

/// Copy one direction until end of stream, then shut the writer down (half close).
async fn pump<R, W>(mut from: R, mut to: W, count: &AtomicU64, activity: &Activity) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; COPY_BUF];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        activity.touch();
    }
}

/// A rewrite of the bytes an upstream sends, applied as they pass (the WebSocket scrubber).
pub(crate) trait Rewrite: Send {
    /// Take `input`; append what goes on to `out`. An error closes the connection.
    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> io::Result<()>;
}

/// [`pump`] upstream → client through `rewrite` (counting what the upstream sent).
async fn pump_rewriting<R, W>(
    mut from: R,
    mut to: W,
    count: &AtomicU64,
    activity: &Activity,
    rewrite: &mut dyn Rewrite,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; COPY_BUF];
    let mut out = Vec::with_capacity(COPY_BUF);
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        out.clear();
        rewrite.feed(buf.get(..n).unwrap_or_default(), &mut out)?;
        to.write_all(&out).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        activity.touch();
    }
}

/// Carry bytes both ways between `client` and `upstream` until both directions end, either fails, or
/// nothing moves for `idle`. Counts land in `counters` whatever happens.
pub(crate) async fn splice<C, U>(client: C, upstream: U, idle: Duration, counters: &Counters) -> SpliceEnd
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    splice_rewriting(client, upstream, idle, counters, None).await
}

/// [`splice`], with the upstream's bytes passed through `rewrite` when there is one.
pub(crate) async fn splice_rewriting<C, U>(
    client: C,
    upstream: U,
    idle: Duration,
    counters: &Counters,
    rewrite: Option<&mut dyn Rewrite>,
) -> SpliceEnd
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Activity::new();
    activity.touch();
    let (client_r, client_w) = tokio::io::split(client);
    let (up_r, up_w) = tokio::io::split(upstream);
    let down = async {
        match rewrite {
            Some(rewrite) => pump_rewriting(up_r, client_w, &counters.down, &activity, rewrite).await,
            None => pump(up_r, client_w, &counters.down, &activity).await,
        }
    };
    let both = async { tokio::try_join!(pump(client_r, up_w, &counters.up, &activity), down) };
    tokio::select! {
        res = both => match res {
            Ok(_) => SpliceEnd::Closed,
            Err(e) => SpliceEnd::Error(e),
        },
        () = activity.idle_for(idle) => SpliceEnd::Idle,
    }
}

/// Bytes a splice pipe grows to per direction once the connection fills its first, default-sized pipe. A
/// larger pipe moves more per system call (measured on this kind of machine: about a third less CPU per
/// gigabyte than 64 KiB copies); its pages are only used while data is in flight.
const PIPE_SIZE: i32 = 1024 * 1024;

/// What a new pipe holds (the kernel's default, 16 pages). Most connections (an API call, a handshake and a
/// short answer) never fill it, so they never pay for resizing it nor for the larger ring's kernel memory;
/// a bulk transfer fills it on its first read and grows it to [`PIPE_SIZE`].
const PIPE_START: usize = 64 * 1024;

/// [`splice`] for two TCP sockets, zero-copy: the kernel moves the bytes socket → pipe → socket
/// (`splice(2)`), one pipe per direction, never through this process's memory. Same ending rules, counts
/// and idle timeout as [`splice`].
pub(crate) async fn splice_tcp(
    client: &tokio::net::TcpStream,
    upstream: &tokio::net::TcpStream,
    idle: Duration,
    counters: &Counters,
) -> SpliceEnd {
    let activity = Activity::new();
    activity.touch();
    let both = async {
        tokio::try_join!(
            kernel_pump(client, upstream, &counters.up, &activity),
            kernel_pump(upstream, client, &counters.down, &activity)
        )
    };
    tokio::select! {
        res = both => match res {
            Ok(_) => SpliceEnd::Closed,
            Err(e) => SpliceEnd::Error(e),
        },
        () = activity.idle_for(idle) => SpliceEnd::Idle,
    }
}

/// One direction of [`splice_tcp`]: fill the pipe from `from` with what is there, drain it all into `to`,
/// repeat; at the end of `from`, half-close `to`.
async fn kernel_pump(
    from: &tokio::net::TcpStream,
    to: &tokio::net::TcpStream,
    count: &AtomicU64,
    activity: &Activity,
) -> io::Result<()> {
    use std::os::fd::AsFd;

    use nix::fcntl::{SpliceFFlags, splice as sys_splice};
    use tokio::io::Interest;

    let (pipe_r, pipe_w) = pipe()?;
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    let chunk = usize::try_from(PIPE_SIZE).unwrap_or(PIPE_START);
    let mut grown = false;
    loop {
        // The pipe is empty here, so WouldBlock can only mean the socket has nothing yet.
        let n = from
            .async_io(Interest::READABLE, || {
                sys_splice(from.as_fd(), None, pipe_w.as_fd(), None, chunk, flags).map_err(io::Error::from)
            })
            .await?;
        if n == 0 {
            return socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write);
        }
        let mut left = n;
        while left > 0 {
            // The pipe holds `left` bytes, so WouldBlock can only mean the socket is full.
            left -= to
                .async_io(Interest::WRITABLE, || {
                    sys_splice(pipe_r.as_fd(), None, to.as_fd(), None, left, flags).map_err(io::Error::from)
                })
                .await?;
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
        activity.touch();
        if !grown && n >= PIPE_START {
            // A full pipe: this is a bulk transfer. The pipe is empty again here, so it can be resized.
            grown = true;
            grow(&pipe_w);
        }
    }
}

/// A non-blocking pipe of the kernel's default size.
fn pipe() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use nix::fcntl::OFlag;

    Ok(nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?)
}

/// Grow `pipe` to [`PIPE_SIZE`] bytes. Above fs.pipe-max-size (1 MiB by default) or past a user's pipe
/// budget the kernel refuses: the default size still works, only slower.
fn grow(pipe: &std::os::fd::OwnedFd) {
    use std::os::fd::AsFd;

    use nix::fcntl::{FcntlArg, fcntl};

    let _ = fcntl(pipe.as_fd(), FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn kernel_splice_moves_bytes_both_ways_and_counts_them() {
        let (client_side, gateway_client) = tcp_pair().await;
        let (gateway_upstream, upstream_side) = tcp_pair().await;
        let counters = Counters::default();
        let run = splice_tcp(
            &gateway_client,
            &gateway_upstream,
            Duration::from_secs(5),
            &counters,
        );
        let peers = async {
            let (mut c, mut u) = (client_side, upstream_side);
            let big = vec![7u8; 3 * 1024 * 1024 + 17];
            c.write_all(&big).await.unwrap();
            c.shutdown().await.unwrap();
            let mut got = Vec::new();
            u.read_to_end(&mut got).await.unwrap();
            assert!(got == big, "{} bytes arrived", got.len());
            u.write_all(b"pong").await.unwrap();
            u.shutdown().await.unwrap();
            let mut back = Vec::new();
            c.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, b"pong");
        };
        let (end, ()) = tokio::join!(run, peers);
        assert!(matches!(end, SpliceEnd::Closed), "{end:?}");
        assert_eq!(counters.get(), (3 * 1024 * 1024 + 17, 4));
    }

    #[test]
    fn pipes_start_small_and_grow_to_the_splice_size() {
        use std::os::fd::AsFd;

        use nix::fcntl::{FcntlArg, fcntl};

        let (_r, w) = pipe().unwrap();
        let size = || fcntl(w.as_fd(), FcntlArg::F_GETPIPE_SZ).unwrap();
        assert_eq!(usize::try_from(size()).unwrap(), PIPE_START);
        grow(&w);
        // Root may always grow a pipe up to fs.pipe-max-size (1 MiB unless lowered).
        let max: i32 = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(PIPE_SIZE);
        if nix::unistd::geteuid().is_root() && max >= PIPE_SIZE {
            assert_eq!(size(), PIPE_SIZE);
        }
    }

    async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn rewind_replays_the_prefix_first() {
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(b" world").await.unwrap();
        drop(a);
        let mut r = Rewind::new(Bytes::from_static(b"hello"), b);
        let mut s = String::new();
        r.read_to_string(&mut s).await.unwrap();
        assert_eq!(s, "hello world");
    }

    #[tokio::test]
    async fn splice_counts_both_ways_and_half_closes() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (upstream, mut upstream_peer) = tokio::io::duplex(1024);
        let counters = Counters::default();
        let run = splice(client, upstream, Duration::from_secs(5), &counters);
        let peers = async {
            client_peer.write_all(b"ping").await.unwrap();
            client_peer.shutdown().await.unwrap();
            let mut got = Vec::new();
            upstream_peer.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"ping");
            upstream_peer.write_all(b"pong!").await.unwrap();
            upstream_peer.shutdown().await.unwrap();
            let mut back = Vec::new();
            client_peer.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, b"pong!");
        };
        let (end, ()) = tokio::join!(run, peers);
        assert!(matches!(end, SpliceEnd::Closed), "{end:?}");
        assert_eq!(counters.get(), (4, 5));
    }

    #[tokio::test(start_paused = true)]
    async fn splice_ends_when_idle() {
        let (client, _client_peer) = tokio::io::duplex(1024);
        let (upstream, _upstream_peer) = tokio::io::duplex(1024);
        let counters = Counters::default();
        let end = splice(client, upstream, Duration::from_secs(30), &counters).await;
        assert!(matches!(end, SpliceEnd::Idle));
    }
}
