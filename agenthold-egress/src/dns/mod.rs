//! The gateway's DNS (E9, with E6 and E8): the resolver every sandbox's queries reach, and the gateway's own
//! DNS client.
//!
//! - [`Server`] answers one agent's queries on sockets the caller bound inside the gateway's network
//!   namespace (the agent is whoever's socket a query arrived on, never something the packet says). Names the
//!   agent's policy refuses get NXDOMAIN without any upstream query (E9), and so do, under every policy,
//!   names that only mean something on a local network ([`LOCAL_SUFFIXES`], single labels, reverse names of
//!   blocked ranges); allowed names are forwarded, and every A record whose address the gateway's
//!   [`Guard`](crate::guard::Guard) refuses is stripped (DNS rebinding, E6, E22).
//! - [`DnsBudget`] bounds queries per agent and for the whole gateway, with a reserve so that flooding agents
//!   cannot starve quiet ones, and counts what happened to every query (E20).
//! - [`Upstream`] is the DNS client towards `egress.dns_upstream`: [`Forward::forward_for`] for the server
//!   (answers cached per agent within [`ForwardLimits`], identical concurrent questions coalesced, sent from
//!   a bounded pool of randomly bound sockets) and [`Upstream::lookup`] (cached) for the proxy's own
//!   dialling. The cache sits below every check: a cached answer goes through the same policy check,
//!   rebinding filter and name records as a fresh one.
//! - [`Records`] remembers, per agent, which name each answered address came from, so the transparent proxy
//!   can decide a plain TCP connection (SSH, databases) by the name the agent resolved.
//! - [`SyntheticNames`] backs the test-only `--dangerous-connect-to` override: a name answers with a
//!   synthetic address from [`SYNTHETIC_RANGE`] that the proxy maps back to the name.
//!
//! **IPv4 only towards sandboxes.** The gateway disables IPv6 in sandbox namespaces, so [`Server`] answers
//! AAAA questions with NOERROR and no AAAA records (and removes AAAA records from every section): a client
//! then uses the A records instead of trying an IPv6 address that cannot route. [`Upstream::lookup`] still
//! returns both families, because the proxy dials from the host's namespace.
//!
//! Wire format is hickory-proto's; it is re-exported as [`proto`] because its types appear in this API.

mod answer;
mod budget;
mod cache;
mod forward_cache;
mod pool;
mod records;
mod server;
mod special;
mod synthetic;
mod upstream;
mod wire;

use std::future::Future;
use std::time::Instant;

use agenthold_core::{AgentId, ErrorKind};

pub use hickory_proto as proto;

/// Why a DNS lookup or forwarded query failed (defined beside the crate's error enum, which wraps it).
pub use crate::error::LookupError;

pub use answer::Transport;
pub use budget::{DnsBudget, DnsCount, DnsCounters, DnsLimits};
pub use forward_cache::ForwardLimits;
pub use records::{RECORDS_MIN_TTL, Records};
pub use server::{Server, ServerContext, ServerHandle, ServerLimits};
pub use special::LOCAL_SUFFIXES;
pub use synthetic::{SYNTHETIC_RANGE, SyntheticNames};
pub use upstream::{Lookup, Upstream};
pub use wire::QueryView;

use proto::op::Message;

use crate::log::DnsFailure;

/// Sends one question to an upstream DNS server and returns its answer: what [`Server`] needs from
/// [`Upstream`], as a trait so that tests and the fuzz target can answer without a network.
pub trait Forward: Send + Sync + 'static {
    /// Ask the upstream `query`'s one question. The returned message is the upstream's answer to that question
    /// (its id is the upstream exchange's, not `query`'s); its response code may be an error code.
    ///
    /// # Errors
    /// [`LookupError`] when no acceptable answer arrived.
    fn forward(&self, query: &Message) -> impl Future<Output = Result<Message, LookupError>> + Send;

    /// [`Forward::forward`] on behalf of `agent`: what [`Server`] calls. An implementation may answer from a
    /// cache, but only from answers it got for the same `agent` (so one agent cannot learn by timing what
    /// another resolved). The server applies its policy, rebinding filter and name records to whatever
    /// comes back, cached or not. The default forwards without a cache.
    ///
    /// # Errors
    /// As [`Forward::forward`].
    fn forward_for(
        &self,
        agent: &AgentId,
        query: &Message,
    ) -> impl Future<Output = Result<Message, LookupError>> + Send {
        let _ = agent;
        self.forward(query)
    }

    /// An answer to `query` from `agent`'s cache entries, without waiting, or `None` (then the server calls
    /// [`Forward::forward_for`]). The default has no cache.
    fn cached_for(&self, agent: &AgentId, query: &Message) -> Option<Message> {
        let _ = (agent, query);
        None
    }

    /// [`Forward::cached_for`] with the entry's times, in [`Forward::now`]'s clock: what the server calls.
    /// The server keeps the final reply bytes of such an answer until [`CachedAnswer::expires`] (see
    /// `wire.rs`). The default wraps [`Forward::cached_for`] with an expiry of now (nothing kept).
    fn cached_entry_for(&self, agent: &AgentId, query: &Message) -> Option<CachedAnswer> {
        let now = self.now();
        self.cached_for(agent, query).map(|message| CachedAnswer {
            message,
            stored: now,
            age: 0,
            expires: now,
        })
    }

    /// The cache's clock (tests drive it by hand). The default is [`Instant::now`].
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// An answer from a [`Forward`] implementation's cache, with the entry's times.
#[derive(Debug, Clone)]
pub struct CachedAnswer {
    /// The answer, every TTL lowered by `age`.
    pub message: Message,
    /// When the entry was stored.
    pub stored: Instant,
    /// The whole seconds the TTLs of `message` were lowered by (the entry's age when it was read).
    pub age: u32,
    /// When the entry stops being served.
    pub expires: Instant,
}

impl LookupError {
    /// Whether the upstream said the name has no address (NXDOMAIN or no records), as opposed to a failure.
    #[must_use]
    pub fn is_negative(&self) -> bool {
        matches!(self, Self::NxDomain { .. } | Self::NoAddress { .. })
    }

    /// A short snake_case label for logs (`upstream_timeout`, `nxdomain`, …).
    #[must_use]
    pub fn label(&self) -> &'static str {
        DnsFailure::from(self).as_str()
    }

    /// The class of this error.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Timeout { .. } => ErrorKind::Timeout,
            Self::ServFail { .. } | Self::Malformed { .. } | Self::Io { .. } => ErrorKind::Upstream,
            Self::NxDomain { .. } | Self::NoAddress { .. } => ErrorKind::NotFound,
            Self::InvalidName { .. } => ErrorKind::BadInput,
        }
    }
}

impl From<&LookupError> for DnsFailure {
    fn from(e: &LookupError) -> Self {
        match e {
            LookupError::Timeout { .. } => Self::Timeout,
            LookupError::ServFail { .. } => Self::ServFail,
            LookupError::NxDomain { .. } => Self::NxDomain,
            LookupError::NoAddress { .. } => Self::NoAddress,
            LookupError::Malformed { .. } => Self::Malformed,
            LookupError::Io { .. } => Self::Io,
            LookupError::InvalidName { .. } => Self::InvalidName,
        }
    }
}
