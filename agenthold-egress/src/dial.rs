//! Dialling upstreams (E5, E6, E22): resolve the name on the gateway, pass every address through the
//! gateway's [`Guard`] (registry rows, provider endpoints, the deny list, the host's own addresses), connect
//! with a timeout. The address a sandbox used is never dialled for a named destination; only
//! destinations without any name (a ClientHello without SNI, a TCP connection to an address the agent did
//! not resolve through us) are dialled by address, and those addresses pass the guard too.
// enforces: E5

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::net::TcpStream;

use crate::guard::{Blocked, Guard};

/// Resolves names to addresses for dialling. The gateway's implementation is its DNS upstream client with
/// a cache; tests may plug their own.
pub trait Resolve: Send + Sync {
    /// The addresses of `name` (normalised), IPv4 first. An empty list or an error means no address.
    fn resolve<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, String>>;
}

/// Why a dial failed.
#[derive(Debug)]
pub enum DialError {
    /// The name did not resolve.
    Resolve(String),
    /// Every address the name resolved to (or the one address given) is refused by the guard.
    Blocked(Blocked),
    /// The name resolved to no address at all.
    NoAddress,
    /// Connecting failed on every address.
    Connect(std::io::Error),
    /// Connecting took longer than the connect timeout.
    Timeout,
    /// The TLS handshake with the upstream failed (including certificate verification: never downgraded).
    Tls(std::io::Error),
}

impl fmt::Display for DialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Resolve(e) => write!(f, "resolve failed: {e}"),
            Self::Blocked(b) => write!(f, "{b}"),
            Self::NoAddress => f.write_str("name has no address"),
            Self::Connect(e) => write!(f, "connect failed: {e}"),
            Self::Timeout => f.write_str("connect timed out"),
            Self::Tls(e) => write!(f, "upstream TLS: {e}"),
        }
    }
}

impl std::error::Error for DialError {}

impl DialError {
    /// Whether this is a refusal (the guard) rather than an upstream failure.
    #[must_use]
    pub fn is_blocked(&self) -> bool {
        matches!(self, Self::Blocked(_))
    }
}

/// Connects to upstreams on behalf of sandboxes.
#[derive(Clone)]
pub(crate) struct Dialer {
    resolver: Arc<dyn Resolve>,
    /// Consulted on every address before it is dialled.
    guard: Arc<Guard>,
    /// `dangerous` test overrides: (name, port) → address, dialled without the guard.
    connect_to: Arc<HashMap<(String, u16), SocketAddr>>,
    connect_timeout: Duration,
}

impl fmt::Debug for Dialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dialer")
            .field("connect_to", &self.connect_to)
            .finish_non_exhaustive()
    }
}

impl Dialer {
    pub(crate) fn new(
        resolver: Arc<dyn Resolve>,
        guard: Arc<Guard>,
        connect_to: HashMap<(String, u16), SocketAddr>,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            resolver,
            guard,
            connect_to: Arc::new(connect_to),
            connect_timeout,
        }
    }

    /// Dial `name:port`: resolve on the gateway, guard every address, try them in order (`prefer` first if
    /// the name resolves to it).
    pub(crate) async fn dial_name(
        &self,
        name: &str,
        port: u16,
        prefer: Option<IpAddr>,
    ) -> Result<(TcpStream, SocketAddr), DialError> {
        if let Some(addr) = self.connect_to.get(&(name.to_owned(), port)) {
            return self.connect(*addr).await.map(|s| (s, *addr));
        }
        let mut addrs = self.resolver.resolve(name).await.map_err(DialError::Resolve)?;
        if addrs.is_empty() {
            return Err(DialError::NoAddress);
        }
        let mut first_block = None;
        addrs.retain(|a| match self.guard.check(*a) {
            Ok(()) => true,
            Err(b) => {
                first_block.get_or_insert(b);
                false
            }
        });
        if let Some(p) = prefer
            && let Some(i) = addrs.iter().position(|a| *a == p)
        {
            addrs.swap(0, i);
        }
        let mut last = None;
        for addr in addrs {
            let sa = SocketAddr::new(addr, port);
            match self.connect(sa).await {
                Ok(s) => return Ok((s, sa)),
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .or(first_block.map(DialError::Blocked))
            .unwrap_or(DialError::NoAddress))
    }

    /// Dial an address the sandbox gave (no name known), after the guard.
    pub(crate) async fn dial_addr(&self, addr: SocketAddr) -> Result<TcpStream, DialError> {
        self.guard.check(addr.ip()).map_err(DialError::Blocked)?;
        self.connect(addr).await
    }

    async fn connect(&self, addr: SocketAddr) -> Result<TcpStream, DialError> {
        match tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr)).await {
            Err(_) => Err(DialError::Timeout),
            Ok(Err(e)) => Err(DialError::Connect(e)),
            Ok(Ok(s)) => {
                // Latency over Nagle: proxied protocols are request/response.
                let _ = s.set_nodelay(true);
                Ok(s)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<IpAddr>);
    impl Resolve for Fixed {
        fn resolve<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, String>> {
            Box::pin(async move { Ok(self.0.clone()) })
        }
    }

    fn dialer(addrs: &[&str], connect_to: &[(&str, u16, SocketAddr)]) -> Dialer {
        dialer_with(Guard::new([]), addrs, connect_to)
    }

    fn dialer_with(guard: Guard, addrs: &[&str], connect_to: &[(&str, u16, SocketAddr)]) -> Dialer {
        Dialer::new(
            Arc::new(Fixed(addrs.iter().map(|a| a.parse().unwrap()).collect())),
            Arc::new(guard),
            connect_to
                .iter()
                .map(|(n, p, a)| ((n.to_string(), *p), *a))
                .collect(),
            Duration::from_secs(2),
        )
    }

    // covers: E5, E6
    #[tokio::test]
    async fn names_resolving_to_blocked_addresses_are_refused() {
        let d = dialer(&["127.0.0.1", "169.254.169.254"], &[]);
        let err = d.dial_name("evil.example", 80, None).await.unwrap_err();
        assert!(err.is_blocked(), "{err}");
        let err = d.dial_addr("10.0.0.1:80".parse().unwrap()).await.unwrap_err();
        assert!(err.is_blocked(), "{err}");
    }

    #[tokio::test]
    async fn connect_to_override_reaches_loopback_for_that_name_only() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let d = dialer(&["127.0.0.1"], &[("api.example.test", 443, addr)]);
        let (_, used) = d.dial_name("api.example.test", 443, None).await.unwrap();
        assert_eq!(used, addr);
        assert!(
            d.dial_name("api.example.test", 80, None)
                .await
                .unwrap_err()
                .is_blocked()
        );
        assert!(
            d.dial_name("other.example.test", 443, None)
                .await
                .unwrap_err()
                .is_blocked()
        );
    }

    // covers: E22
    #[tokio::test]
    async fn the_hosts_own_denied_and_provider_addresses_are_refused() {
        let guard = || {
            Guard::with_own_addresses(
                ["45.77.0.0/16".parse().unwrap()],
                vec![
                    "45.76.0.10/32".parse().unwrap(),
                    "2a0e:1234:5678:9abc::/64".parse().unwrap(),
                ],
            )
        };
        for addr in [
            "45.76.0.10",
            "2a0e:1234:5678:9abc::99",
            "45.77.3.4",
            "168.63.129.16",
            "2001:4::1",
            "::ffff:45.76.0.10",
        ] {
            let d = dialer_with(guard(), &[addr], &[]);
            let err = d.dial_name("own.example", 80, None).await.unwrap_err();
            assert!(err.is_blocked(), "{addr}: {err}");
            let err = d
                .dial_addr((addr.parse::<IpAddr>().unwrap(), 80).into())
                .await
                .unwrap_err();
            assert!(err.is_blocked(), "{addr}: {err}");
        }
    }
}
