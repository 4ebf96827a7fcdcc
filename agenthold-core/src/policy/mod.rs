//! Network policy (E8, E9): what an agent may reach, decided by name.
//!
//! A [`NetworkPolicy`] is `open` (any public address and port), an `allowlist` of [`PolicyEntry`]s, or
//! `report_only` (the allowlist is evaluated and what it would deny is reported, but let through). Deciding
//! is a pure function of the policy and a [`Destination`]; the [`EgressPolicy`] trait adds the per-agent
//! lookup, and [`PolicyTable`] is its default implementation (policies replaceable at run time).
//!
//! Address safety (private, loopback, metadata ranges) is *not* decided here: the egress gateway's address
//! guard refuses those whatever the policy says, so no entry can re-open them.
// enforces: E8

mod entry;
mod name;

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

pub use entry::{HostPattern, PolicyEntry, PortSpec, is_strict_subdomain};
pub use name::normalize_name;

use crate::error::Error;
use crate::ids::AgentId;

/// How a policy's entries are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyMode {
    /// Any public destination (the default).
    #[default]
    Open,
    /// Only destinations covered by an entry.
    Allowlist,
    /// Entries are evaluated like an allowlist, denials are reported but not enforced.
    ReportOnly,
}

/// An agent's network policy.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// How the entries apply.
    pub mode: PolicyMode,
    /// The allowlist entries (ignored in `open` mode).
    #[serde(default)]
    pub entries: Vec<PolicyEntry>,
}

/// Where a connection or query wants to go, as far as the gateway knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// The normalised name (SNI, `Host`, CONNECT target, or the name the agent resolved), if any.
    pub name: Option<String>,
    /// The address that would be dialled, when it is known without resolving a name the policy refused.
    pub addr: Option<IpAddr>,
    /// The destination port.
    pub port: u16,
}

impl Destination {
    /// A destination known by name.
    #[must_use]
    pub fn name(name: impl Into<String>, port: u16) -> Self {
        Self {
            name: Some(name.into()),
            addr: None,
            port,
        }
    }

    /// A destination known only by address.
    #[must_use]
    pub fn addr(addr: IpAddr, port: u16) -> Self {
        Self {
            name: None,
            addr: Some(addr),
            port,
        }
    }
}

/// Why a destination was (or in report-only mode, would have been) refused. Machine-readable: the
/// snake_case form is what logs and APIs show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DenyReason {
    /// No allowlist entry covers the destination.
    NotInAllowlist,
    /// The address is private, loopback, link-local, reserved or otherwise never dialled (address guard).
    BlockedAddress,
    /// The name resolved to no address the guard allows.
    NoPublicAddress,
    /// The agent is not known to the gateway.
    UnknownAgent,
    /// Egress is disabled for this installation.
    EgressDisabled,
    /// A name from the sandbox could not be normalised.
    InvalidName,
    /// The connection carried no name, and the policy only allows names.
    NoName,
    /// A request carried a placeholder of a secret whose rule does not cover this host (leak guard).
    PlaceholderLeak,
    /// A request's `Host`/`:authority` differs from the connection's TLS SNI.
    HostMismatch,
    /// The protocol or request could not be understood well enough to decide.
    Malformed,
    /// A request to a rule host carried a placeholder outside the places its rule replaces it (another
    /// header, the path, an unnamed query parameter, a cookie, an encoded or case-changed form): a leak
    /// attempt (E13).
    PlaceholderMisplaced,
    /// A login rule's path limit could not be checked because the path is not in normal form (dot
    /// segments, empty segments, encoded slashes or unreserved characters).
    AmbiguousPath,
    /// An open connection was closed because the agent's policy no longer allows it (E21).
    Revoked,
    /// The agent (or the whole gateway) is at its budget of connections or upstream requests (E20).
    OverBudget,
    /// A DNS name that only has a meaning on a local network (`.local`, `.internal`, a single label, …):
    /// never forwarded, whatever the policy.
    LocalName,
    /// A reverse DNS name (`in-addr.arpa`, `ip6.arpa`) of an address range the address guard blocks: never
    /// forwarded, whatever the policy.
    PrivateReverse,
    /// The agent's (or the whole gateway's) budget for this kind of traffic is spent.
    RateLimited,
}

impl DenyReason {
    /// Every reason, in declaration order.
    pub const ALL: [Self; 17] = [
        Self::NotInAllowlist,
        Self::BlockedAddress,
        Self::NoPublicAddress,
        Self::UnknownAgent,
        Self::EgressDisabled,
        Self::InvalidName,
        Self::NoName,
        Self::PlaceholderLeak,
        Self::HostMismatch,
        Self::Malformed,
        Self::PlaceholderMisplaced,
        Self::AmbiguousPath,
        Self::Revoked,
        Self::OverBudget,
        Self::LocalName,
        Self::PrivateReverse,
        Self::RateLimited,
    ];

    /// The reason whose snake_case name is `name` ([`DenyReason::as_str`] read back).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// The snake_case name of the reason.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotInAllowlist => "not_in_allowlist",
            Self::BlockedAddress => "blocked_address",
            Self::NoPublicAddress => "no_public_address",
            Self::UnknownAgent => "unknown_agent",
            Self::EgressDisabled => "egress_disabled",
            Self::InvalidName => "invalid_name",
            Self::NoName => "no_name",
            Self::PlaceholderLeak => "placeholder_leak",
            Self::HostMismatch => "host_mismatch",
            Self::Malformed => "malformed",
            Self::PlaceholderMisplaced => "placeholder_misplaced",
            Self::AmbiguousPath => "ambiguous_path",
            Self::Revoked => "revoked",
            Self::OverBudget => "over_budget",
            Self::LocalName => "local_name",
            Self::PrivateReverse => "private_reverse",
            Self::RateLimited => "rate_limited",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of a policy decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Let it through.
    Allowed,
    /// Let it through, but an allowlist would have refused it (report-only mode).
    Reported(DenyReason),
    /// Refuse it.
    Denied(DenyReason),
}

impl Verdict {
    /// Whether the traffic may pass (true for [`Verdict::Reported`]).
    #[must_use]
    pub fn is_allowed(self) -> bool {
        !matches!(self, Self::Denied(_))
    }

    /// The reason, for denied and reported verdicts.
    #[must_use]
    pub fn reason(self) -> Option<DenyReason> {
        match self {
            Self::Allowed => None,
            Self::Reported(r) | Self::Denied(r) => Some(r),
        }
    }
}

impl NetworkPolicy {
    /// The open policy: any public destination.
    #[must_use]
    pub fn open() -> Self {
        Self {
            mode: PolicyMode::Open,
            entries: Vec::new(),
        }
    }

    /// An allowlist of already parsed entries.
    #[must_use]
    pub fn allowlist(entries: Vec<PolicyEntry>) -> Self {
        Self {
            mode: PolicyMode::Allowlist,
            entries,
        }
    }

    /// Parse entries into a policy of the given mode.
    ///
    /// # Errors
    /// The first entry that does not parse, as [`Error::PolicyEntry`].
    pub fn parse<S: AsRef<str>>(mode: PolicyMode, entries: &[S]) -> Result<Self, Error> {
        let entries = entries
            .iter()
            .map(|e| PolicyEntry::parse(e.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Self { mode, entries })
    }

    /// Decide a destination. A named destination is covered by a name entry that matches the name and port;
    /// an address is covered by a network entry that contains it on that port. Either suffices.
    #[must_use]
    pub fn decide(&self, dest: &Destination) -> Verdict {
        if self.mode == PolicyMode::Open {
            return Verdict::Allowed;
        }
        let covered = self.entries.iter().any(|e| {
            dest.name.as_deref().is_some_and(|n| e.matches_name(n, dest.port))
                || dest.addr.is_some_and(|a| e.matches_addr(a, dest.port))
        });
        self.verdict(covered)
    }

    /// Whether the (normalised) `name` may be resolved: some name entry covers it on any port. Under an
    /// allowlist, names no entry covers get NXDOMAIN and no upstream query (E9).
    #[must_use]
    pub fn may_resolve(&self, name: &str) -> Verdict {
        if self.mode == PolicyMode::Open {
            return Verdict::Allowed;
        }
        self.verdict(self.entries.iter().any(|e| e.host.matches_name(name)))
    }

    fn verdict(&self, covered: bool) -> Verdict {
        match (covered, self.mode) {
            (true, _) | (false, PolicyMode::Open) => Verdict::Allowed,
            (false, PolicyMode::ReportOnly) => Verdict::Reported(DenyReason::NotInAllowlist),
            (false, PolicyMode::Allowlist) => Verdict::Denied(DenyReason::NotInAllowlist),
        }
    }
}

/// Decides, per agent, which destinations are allowed and which names may resolve.
///
/// Contract: both methods are pure lookups that return quickly (they run once per connection, request and
/// DNS query); `name` arguments are already normalised ([`normalize_name`]); an unknown agent is denied with
/// [`DenyReason::UnknownAgent`]. A change of an agent's policy must apply to decisions made after the
/// change returns. The gateway's address guard applies after an allowed verdict and cannot be widened by an
/// implementation.
pub trait EgressPolicy: Send + Sync {
    /// Decide a destination for `agent`.
    fn decide(&self, agent: &AgentId, dest: &Destination) -> Verdict;
    /// Whether `agent` may resolve `name` through the gateway's DNS.
    fn may_resolve(&self, agent: &AgentId, name: &str) -> Verdict;

    /// The per-agent table the runtime sets policies in, when this policy has one (capability). The
    /// default [`PolicyTable`] is its own; a platform's policy that decides by itself answers `None` (the
    /// default): the runtime then applies no spec's policy, `set_policy` is unavailable and there is no
    /// warm pool (a pooled sandbox must refuse everything until it is handed out).
    fn table(&self) -> Option<&PolicyTable> {
        None
    }
}

/// The default [`EgressPolicy`]: one [`NetworkPolicy`] per agent, replaceable at run time.
#[derive(Debug, Default)]
pub struct PolicyTable {
    policies: RwLock<HashMap<AgentId, Arc<NetworkPolicy>>>,
}

impl PolicyTable {
    /// An empty table (every agent unknown, hence denied).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Set or replace `agent`'s policy; decisions made after this returns use it.
    pub fn set(&self, agent: AgentId, policy: NetworkPolicy) {
        self.write().insert(agent, Arc::new(policy));
    }

    /// Forget `agent`; it is denied from now on.
    pub fn remove(&self, agent: &AgentId) {
        self.write().remove(agent);
    }

    /// The current policy of `agent`.
    #[must_use]
    pub fn get(&self, agent: &AgentId) -> Option<Arc<NetworkPolicy>> {
        self.read().get(agent).cloned()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<AgentId, Arc<NetworkPolicy>>> {
        // A panic while holding the lock cannot leave the map half-updated (insert/remove are atomic with
        // respect to the map), so a poisoned lock is still consistent.
        self.policies
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<AgentId, Arc<NetworkPolicy>>> {
        self.policies
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl EgressPolicy for PolicyTable {
    fn decide(&self, agent: &AgentId, dest: &Destination) -> Verdict {
        self.get(agent)
            .map_or(Verdict::Denied(DenyReason::UnknownAgent), |p| p.decide(dest))
    }

    fn may_resolve(&self, agent: &AgentId, name: &str) -> Verdict {
        self.get(agent)
            .map_or(Verdict::Denied(DenyReason::UnknownAgent), |p| p.may_resolve(name))
    }

    fn table(&self) -> Option<&PolicyTable> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_reasons_are_listed_once_and_read_back_by_name() {
        // Exhaustive: a new reason fails to compile here until it is placed in `ALL`.
        let position = |r: DenyReason| match r {
            DenyReason::NotInAllowlist => 0,
            DenyReason::BlockedAddress => 1,
            DenyReason::NoPublicAddress => 2,
            DenyReason::UnknownAgent => 3,
            DenyReason::EgressDisabled => 4,
            DenyReason::InvalidName => 5,
            DenyReason::NoName => 6,
            DenyReason::PlaceholderLeak => 7,
            DenyReason::HostMismatch => 8,
            DenyReason::Malformed => 9,
            DenyReason::PlaceholderMisplaced => 10,
            DenyReason::AmbiguousPath => 11,
            DenyReason::Revoked => 12,
            DenyReason::OverBudget => 13,
            DenyReason::LocalName => 14,
            DenyReason::PrivateReverse => 15,
            DenyReason::RateLimited => 16,
        };
        for (i, r) in DenyReason::ALL.into_iter().enumerate() {
            assert_eq!(position(r), i, "{r}");
            assert_eq!(DenyReason::from_name(r.as_str()), Some(r));
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{r}\""));
            assert_eq!(serde_json::from_str::<DenyReason>(&json).unwrap(), r);
        }
        assert_eq!(DenyReason::from_name("report_only:not_in_allowlist"), None);
    }

    fn allow(entries: &[&str]) -> NetworkPolicy {
        NetworkPolicy::parse(PolicyMode::Allowlist, entries).unwrap()
    }

    #[test]
    fn open_allows_everything() {
        let p = NetworkPolicy::open();
        assert_eq!(p.decide(&Destination::name("x.com", 1)), Verdict::Allowed);
        assert_eq!(p.may_resolve("anything.example"), Verdict::Allowed);
    }

    #[test]
    fn allowlist_decides_by_name_and_port() {
        let p = allow(&[
            "github.com",
            "*.npmjs.org",
            "ssh.example.com:22",
            "198.51.100.0/24:443",
        ]);
        assert!(p.decide(&Destination::name("github.com", 443)).is_allowed());
        assert!(!p.decide(&Destination::name("github.com", 22)).is_allowed());
        assert!(
            p.decide(&Destination::name("registry.npmjs.org", 443))
                .is_allowed()
        );
        assert!(!p.decide(&Destination::name("npmjs.org", 443)).is_allowed());
        assert!(p.decide(&Destination::name("ssh.example.com", 22)).is_allowed());
        assert!(
            p.decide(&Destination::addr("198.51.100.9".parse().unwrap(), 443))
                .is_allowed()
        );
        assert!(
            !p.decide(&Destination::addr("198.51.100.9".parse().unwrap(), 80))
                .is_allowed()
        );
        assert_eq!(
            p.decide(&Destination::name("evil.com", 443)),
            Verdict::Denied(DenyReason::NotInAllowlist)
        );
    }

    #[test]
    fn may_resolve_ignores_ports_and_networks() {
        let p = allow(&["ssh.example.com:22", "198.51.100.0/24"]);
        assert!(p.may_resolve("ssh.example.com").is_allowed());
        assert!(!p.may_resolve("other.example.com").is_allowed());
    }

    #[test]
    fn report_only_lets_through_and_reports() {
        let p = NetworkPolicy::parse(PolicyMode::ReportOnly, &["github.com"]).unwrap();
        assert_eq!(p.decide(&Destination::name("github.com", 443)), Verdict::Allowed);
        let v = p.decide(&Destination::name("evil.com", 443));
        assert_eq!(v, Verdict::Reported(DenyReason::NotInAllowlist));
        assert!(v.is_allowed());
    }

    #[test]
    fn table_replaces_policies_and_denies_unknown_agents() {
        let t = PolicyTable::new();
        let a = AgentId::new("a").unwrap();
        let d = Destination::name("github.com", 443);
        assert_eq!(t.decide(&a, &d), Verdict::Denied(DenyReason::UnknownAgent));
        t.set(a.clone(), allow(&["example.com"]));
        assert!(!t.decide(&a, &d).is_allowed());
        t.set(a.clone(), allow(&["github.com"]));
        assert!(t.decide(&a, &d).is_allowed());
        t.remove(&a);
        assert!(!t.decide(&a, &d).is_allowed());
    }

    #[test]
    fn policy_serde_round_trip() {
        let p = allow(&["github.com:22", "*.npmjs.org"]);
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(
            json,
            r#"{"mode":"allowlist","entries":["github.com:22","*.npmjs.org"]}"#
        );
        assert_eq!(serde_json::from_str::<NetworkPolicy>(&json).unwrap(), p);
        assert!(serde_json::from_str::<NetworkPolicy>(r#"{"mode":"allowlist","entries":["a b"]}"#).is_err());
    }
}
