//! Reference forwarders for the splice experiment (`--bench splice`): the gateway's byte-moving loop
//! alone, without nftables, sniffing, policy or logging, in the variants the gateway could use.
//!
//! - [`Forward::Copy`]: what `agenthold-egress`'s `io::splice` does today: `tokio::io::split` and, per
//!   direction, `read` into a userspace buffer of the given size and `write_all` it (two copies per byte:
//!   kernel → user → kernel).
//! - [`Forward::Splice`]: `splice(2)` socket → pipe → socket, per direction with its own pipe: the kernel
//!   moves page references, the bytes are not copied through userspace.
//!
//! Each forwarder accepts on a listener (bound by the caller, e.g. inside a namespace) and dials one fixed
//! upstream from this process's namespace, as the gateway does.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result};
use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream};

/// How a forwarder moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// Userspace copy with a buffer of this many bytes per direction (the gateway: 64 KiB).
    Copy(usize),
    /// `splice(2)` through a pipe of this many bytes per direction.
    Splice(usize),
}

impl Forward {
    /// A short label (`copy 64 KiB`, `splice(2) 1 MiB pipe`).
    pub fn label(self) -> String {
        match self {
            Forward::Copy(n) => format!("userspace copy, {} KiB buffer", n >> 10),
            Forward::Splice(n) if n >= 1 << 20 => format!("splice(2), {} MiB pipe", n >> 20),
            Forward::Splice(n) => format!("splice(2), {} KiB pipe", n >> 10),
        }
    }
}

/// Accepts on `listener` and forwards every connection to `upstream` with `how`, until the runtime
/// stops. Must be called inside a tokio runtime.
///
/// # Errors
/// When the listener cannot be registered with the runtime.
pub fn serve(listener: std::net::TcpListener, upstream: SocketAddr, how: Forward) -> Result<SocketAddr> {
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener).context("register the forwarder listener")?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let Ok(upstream) = TcpStream::connect(upstream).await else {
                    return;
                };
                // As the gateway does on both sides.
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                let result = match how {
                    Forward::Copy(size) => copy_both(client, upstream, size).await,
                    Forward::Splice(size) => splice_both(&client, &upstream, size).await,
                };
                if let Err(e) = result {
                    tracing::debug!(error = %e, "forwarded connection ended with an error");
                }
            });
        }
    });
    Ok(addr)
}

/// The gateway's loop (`io::splice` and `pump` in agenthold-egress), minus the counters and idle clock.
async fn copy_both(client: TcpStream, upstream: TcpStream, size: usize) -> io::Result<()> {
    let (client_r, client_w) = tokio::io::split(client);
    let (up_r, up_w) = tokio::io::split(upstream);
    tokio::try_join!(pump(client_r, up_w, size), pump(up_r, client_w, size))?;
    Ok(())
}

async fn pump<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut from: R,
    mut to: W,
    size: usize,
) -> io::Result<()> {
    let mut buf = vec![0u8; size];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
    }
}

async fn splice_both(client: &TcpStream, upstream: &TcpStream, size: usize) -> io::Result<()> {
    tokio::try_join!(
        splice_one(client, upstream, size),
        splice_one(upstream, client, size)
    )?;
    Ok(())
}

/// One direction: fill the pipe from `from` (as much as is there), drain it all into `to`, repeat; at the
/// end of `from`, half-close `to`.
async fn splice_one(from: &TcpStream, to: &TcpStream, size: usize) -> io::Result<()> {
    let (pipe_r, pipe_w) = pipe(size)?;
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    loop {
        // The pipe is empty here, so a WouldBlock can only mean "the socket has nothing".
        let n = from
            .async_io(Interest::READABLE, || {
                splice(from.as_fd(), None, pipe_w.as_fd(), None, size, flags).map_err(io::Error::from)
            })
            .await?;
        if n == 0 {
            return socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write);
        }
        let mut left = n;
        while left > 0 {
            // The pipe holds `left` bytes, so a WouldBlock can only mean "the socket is full".
            left -= to
                .async_io(Interest::WRITABLE, || {
                    splice(pipe_r.as_fd(), None, to.as_fd(), None, left, flags).map_err(io::Error::from)
                })
                .await?;
        }
    }
}

/// A non-blocking pipe of (at least) `size` bytes.
fn pipe(size: usize) -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe()?;
    for fd in [&r, &w] {
        fcntl(fd.as_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    }
    let size = i32::try_from(size).map_err(|_| io::Error::other("pipe size too large"))?;
    fcntl(w.as_fd(), FcntlArg::F_SETPIPE_SZ(size))?;
    Ok((r, w))
}
