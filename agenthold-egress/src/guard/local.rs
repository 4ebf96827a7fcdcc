//! The addresses of the network namespace the gateway dials from (E22).
//!
//! Upstream connections leave from the agenthold process's own namespace, so every address of that namespace
//! is the host itself: a name resolving to the host's public address (or to the address of a container
//! bridge, a VPN interface, a second NIC) would reach services that listen only there. The guard refuses:
//!
//! - every IPv4 address of the namespace, as a `/32`. Not its subnet: an IPv4 subnet of a public interface is
//!   often large and shared with unrelated hosts (hosting providers put many customers on one `/24` or more),
//!   and those neighbours are public hosts like any other.
//! - every IPv6 on-link prefix (address & netmask, usually a `/64`): a host commonly holds many addresses in
//!   its prefix (temporary and privacy addresses, addresses added later) and the prefix is the host's own
//!   network segment.
//!
//! The list is read with `getifaddrs(3)` when the guard is made and again whenever the kernel reports an
//! address change on a `NETLINK_ROUTE` socket subscribed to the IPv4 and IPv6 address groups (the message is
//! only a trigger; the whole list is re-read), and every [`PERIOD`] as a fallback (lost notifications, a
//! netlink socket that could not be opened). Both the socket and `getifaddrs` see the namespace of the thread
//! that made them: [`watch`] must be called in the namespace the gateway dials from, and its thread inherits
//! it.

use std::io::{self, Read};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use nix::sys::socket::{AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType};

/// How long the watcher waits after a failed netlink receive before trying again.
const TICK: Duration = Duration::from_secs(2);
/// Re-read the addresses at least this often, notification or not.
pub(super) const PERIOD: Duration = Duration::from_secs(30);
/// `RTMGRP_IPV4_IFADDR` (linux/rtnetlink.h): IPv4 address added or removed.
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
/// `RTMGRP_IPV6_IFADDR` (linux/rtnetlink.h): IPv6 address added or removed.
const RTMGRP_IPV6_IFADDR: u32 = 0x100;

/// The current list, shared between the guard and its watcher thread.
#[derive(Debug, Default)]
pub(super) struct OwnAddresses {
    nets: RwLock<Arc<[IpNet]>>,
    /// The watcher thread, stopped and joined when the list is dropped (an embedder that closes its
    /// runtime expects no agenthold thread left).
    watcher: std::sync::Mutex<Option<Watcher>>,
}

/// A running watcher thread and the write end of the pipe that stops it (closing it wakes the thread).
#[derive(Debug)]
struct Watcher {
    stop: OwnedFd,
    thread: std::thread::JoinHandle<()>,
}

impl Drop for OwnAddresses {
    fn drop(&mut self) {
        let watcher = self
            .watcher
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(Watcher { stop, thread }) = watcher {
            drop(stop);
            // The last reference may be the watcher's own, briefly upgraded: it is ending anyway.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl OwnAddresses {
    pub(super) fn new(nets: Vec<IpNet>) -> Self {
        Self {
            nets: RwLock::new(nets.into()),
            watcher: std::sync::Mutex::default(),
        }
    }

    /// The range of the namespace's own addresses containing `addr`, if any.
    pub(super) fn find(&self, addr: IpAddr) -> Option<IpNet> {
        self.snapshot().iter().find(|n| n.contains(&addr)).copied()
    }

    /// The first own range overlapping `net`.
    pub(super) fn overlapping(&self, net: IpNet) -> Option<IpNet> {
        self.snapshot()
            .iter()
            .find(|n| n.contains(&net.network()) || net.contains(&n.network()))
            .copied()
    }

    pub(super) fn snapshot(&self) -> Arc<[IpNet]> {
        // Writers replace the whole list in one assignment: a poisoned lock still holds a whole list.
        Arc::clone(&self.nets.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn set(&self, nets: Vec<IpNet>) {
        let mut current = self.nets.write().unwrap_or_else(PoisonError::into_inner);
        if *current.as_ref() != nets[..] {
            tracing::info!(addresses = ?nets, "the gateway's own addresses changed");
            *current = nets.into();
        }
    }
}

/// The addresses of the calling thread's network namespace: IPv4 as `/32`, IPv6 as on-link prefixes,
/// sorted and without duplicates.
///
/// # Errors
/// When `getifaddrs(3)` fails.
pub(super) fn read() -> io::Result<Vec<IpNet>> {
    let mut nets = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs().map_err(io::Error::from)? {
        let Some(address) = ifa.address else { continue };
        if let Some(sin) = address.as_sockaddr_in() {
            nets.push(IpNet::V4(Ipv4Net::from(sin.ip())));
        } else if let Some(sin6) = address.as_sockaddr_in6() {
            let ip = sin6.ip();
            // A missing or non-contiguous netmask: the address alone.
            let net = ifa
                .netmask
                .as_ref()
                .and_then(|m| m.as_sockaddr_in6())
                .and_then(|m| Ipv6Net::with_netmask(ip, m.ip()).ok())
                .unwrap_or_else(|| Ipv6Net::from(ip));
            nets.push(IpNet::V6(net.trunc()));
        }
    }
    nets.sort_unstable();
    nets.dedup();
    Ok(nets)
}

/// Read the addresses now and keep them current from a background thread until `own`'s last strong
/// reference is gone. Must run in the namespace the gateway dials from.
///
/// # Errors
/// When the first read fails (the guard would not know the host's addresses: fail closed).
pub(super) fn watch() -> io::Result<Arc<OwnAddresses>> {
    // Subscribe before the first read, so a change between the two is not missed.
    let socket = match subscribe() {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(
                error = %e, period = ?PERIOD,
                "no netlink address notifications; re-reading periodically"
            );
            None
        }
    };
    let own = Arc::new(OwnAddresses::new(read()?));
    let weak = Arc::downgrade(&own);
    let (stopped, stop) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let thread = std::thread::Builder::new()
        .name("guard-addresses".into())
        .spawn(move || run(&weak, socket.as_ref(), &stopped))?;
    *own.watcher.lock().unwrap_or_else(PoisonError::into_inner) = Some(Watcher { stop, thread });
    Ok(own)
}

/// A `NETLINK_ROUTE` socket subscribed to IPv4 and IPv6 address changes, with a receive timeout of [`TICK`].
fn subscribe() -> io::Result<socket2::Socket> {
    let fd = nix::sys::socket::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    let groups = NetlinkAddr::new(0, RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR);
    nix::sys::socket::bind(fd.as_raw_fd(), &groups)?;
    let socket = socket2::Socket::from(fd);
    socket.set_read_timeout(Some(TICK))?;
    Ok(socket)
}

/// The watcher: wait for a notification (or [`PERIOD`]), re-read on a change or every [`PERIOD`], stop as
/// soon as the guard is gone (the write end of `stopped` is closed then).
fn run(own: &Weak<OwnAddresses>, socket: Option<&socket2::Socket>, stopped: &OwnedFd) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut buf = vec![0u8; 16 * 1024];
    let mut last_read = Instant::now();
    let timeout = PollTimeout::try_from(PERIOD).unwrap_or(PollTimeout::MAX);
    loop {
        let mut fds = vec![PollFd::new(stopped.as_fd(), PollFlags::POLLIN)];
        if let Some(s) = socket {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
        }
        if poll(&mut fds, timeout).is_err() {
            std::thread::sleep(TICK);
        }
        let stop = fds
            .first()
            .and_then(PollFd::revents)
            .is_some_and(|r| !r.is_empty());
        let notified = fds
            .get(1)
            .and_then(PollFd::revents)
            .is_some_and(|r| !r.is_empty());
        drop(fds);
        if stop {
            return;
        }
        let changed = match socket {
            Some(s) if notified => wait(s, &mut buf),
            _ => false,
        };
        let Some(own) = own.upgrade() else { return };
        if changed && let Some(s) = socket {
            drain(s, &mut buf);
        }
        if changed || last_read.elapsed() >= PERIOD {
            match read() {
                Ok(nets) => own.set(nets),
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        "re-reading the gateway's own addresses failed; keeping the last list"
                    );
                }
            }
            last_read = Instant::now();
        }
    }
}

/// Whether a notification arrived within one tick.
fn wait(socket: &socket2::Socket, buf: &mut [u8]) -> bool {
    match (&mut &*socket).read(buf) {
        Ok(_) => true,
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => false,
        // ENOBUFS: notifications were lost; the list may have changed.
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => true,
        Err(e) => {
            tracing::warn!(error = %e, "netlink receive failed");
            std::thread::sleep(TICK);
            false
        }
    }
}

/// Read every queued notification without waiting: one re-read covers a burst of changes.
fn drain(socket: &socket2::Socket, buf: &mut [u8]) {
    if socket.set_nonblocking(true).is_err() {
        return;
    }
    while (&mut &*socket).read(buf).is_ok() {}
    let _ = socket.set_nonblocking(false);
}
