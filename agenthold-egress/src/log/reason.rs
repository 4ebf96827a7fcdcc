//! Why an entry was denied, would have been (report-only), or what else it notes: [`Reason`], written in the
//! JSON log (and shown to Python) as the same stable strings as ever (`not_in_allowlist`,
//! `report_only:not_in_allowlist`, `rate_limited;agent;refused=3`, …).
//!
//! Two strings have two meanings, told apart by the entry's decision: `blocked_address` and `invalid_name`
//! are denials on a denied entry, and on an allowed DNS entry a note (blocked addresses stripped from the
//! answer) and an upstream failure. [`Reason::parse`] takes the decision; a reason read on its own
//! ([`FromStr`], [`serde::Deserialize`]) takes the denial.

use std::convert::Infallible;
use std::fmt::{self, Write as _};
use std::str::FromStr;

use agenthold_core::policy::{DenyReason, Verdict};

use super::Decision;

const REPORT_ONLY: &str = "report_only:";
const LEAK: &str = "placeholder_leak:";
const LOGGED_ONLY: &str = " (logged only)";
const SYNTHETIC: &str = "dangerous_synthetic_address";
const HTTP_AFTER_GREETING: &str = "malformed:http_after_server_greeting";
const ECH_OFFERED: &str = "ech_offered";

/// The `reason` of a log entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Refused for this reason (decision `denied`): `not_in_allowlist`.
    Denied(DenyReason),
    /// Let through in report-only mode; an allowlist would have refused it for this reason:
    /// `report_only:not_in_allowlist`.
    ReportOnly(DenyReason),
    /// A request carried placeholders of these secrets (names, comma-separated) to a host outside their
    /// rules, and the leak guard only logs: `placeholder_leak:a,b (logged only)`.
    LeakLogged {
        /// The secrets' names, comma-separated (as in the entry's `secret`).
        secrets: String,
    },
    /// The ClientHello offered Encrypted Client Hello, so its SNI is only the public name: `ech_offered`.
    EchOffered,
    /// On a connection whose server spoke first, the client then sent HTTP (whose requests would each need
    /// their own decision), refused (decision `denied`): `malformed:http_after_server_greeting`.
    HttpAfterServerGreeting,
    /// DNS queries refused over a budget (decision `denied`), `refused` of them since the last such entry:
    /// `rate_limited;agent;refused=3`.
    RateLimited {
        /// Which budget was spent.
        scope: BudgetScope,
        /// Queries refused since the previous entry.
        refused: u64,
    },
    /// DNS: the name was answered with the synthetic address of a dangerous test override
    /// (`Dangerous::connect_to`), after a report-only denial when there was one:
    /// `dangerous_synthetic_address`, `report_only:not_in_allowlist;dangerous_synthetic_address`.
    SyntheticAddress {
        /// The report-only reason the query carried.
        reported: Option<DenyReason>,
    },
    /// DNS: blocked addresses were removed from an answer that still had others (decision `allowed`):
    /// `blocked_address`, `report_only:not_in_allowlist; blocked_address`.
    AddressesStripped {
        /// The report-only reason the query carried.
        reported: Option<DenyReason>,
    },
    /// DNS: the forwarded query failed upstream: `upstream_timeout`.
    DnsUpstream(DnsFailure),
    /// Allowed, but it could not be delivered; free text for people: `upstream: connection refused`.
    Failed(String),
}

/// Which DNS budget refused a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetScope {
    /// The agent's own budget.
    Agent,
    /// The budget of the whole gateway.
    Gateway,
}

impl BudgetScope {
    /// `agent` or `gateway`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Gateway => "gateway",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::Agent, Self::Gateway]
            .into_iter()
            .find(|s| s.as_str() == name)
    }
}

/// How a forwarded DNS query failed upstream (the kinds of `dns::LookupError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DnsFailure {
    /// No answer in time: `upstream_timeout`.
    Timeout,
    /// The upstream answered SERVFAIL: `upstream_servfail`.
    ServFail,
    /// The name does not exist: `nxdomain`.
    NxDomain,
    /// The name has no address: `no_address`.
    NoAddress,
    /// The upstream's answer could not be used: `upstream_malformed`.
    Malformed,
    /// A socket operation failed: `upstream_io`.
    Io,
    /// The name is not a valid host name: `invalid_name`.
    InvalidName,
}

impl DnsFailure {
    /// Every kind.
    pub const ALL: [Self; 7] = [
        Self::Timeout,
        Self::ServFail,
        Self::NxDomain,
        Self::NoAddress,
        Self::Malformed,
        Self::Io,
        Self::InvalidName,
    ];

    /// The label in the log.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "upstream_timeout",
            Self::ServFail => "upstream_servfail",
            Self::NxDomain => "nxdomain",
            Self::NoAddress => "no_address",
            Self::Malformed => "upstream_malformed",
            Self::Io => "upstream_io",
            Self::InvalidName => "invalid_name",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == name)
    }
}

impl fmt::Display for DnsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Reason {
    /// Whether the entry's connection or query failed after it was allowed ([`Reason::Failed`],
    /// [`Reason::DnsUpstream`]): what a load test counts as an error besides denials.
    #[must_use]
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::Failed(_) | Self::DnsUpstream(_))
    }

    /// The reason a verdict gives an entry: none for allowed, [`Reason::ReportOnly`] for reported,
    /// [`Reason::Denied`] for denied.
    #[must_use]
    pub fn from_verdict(verdict: Verdict) -> Option<Self> {
        match verdict {
            Verdict::Allowed => None,
            Verdict::Reported(r) => Some(Self::ReportOnly(r)),
            Verdict::Denied(r) => Some(Self::Denied(r)),
        }
    }

    /// The decision an entry with this reason has (`denied` for the refusals, `allowed` for the rest).
    #[must_use]
    pub fn decision(&self) -> Decision {
        match self {
            Self::Denied(_) | Self::HttpAfterServerGreeting | Self::RateLimited { .. } => Decision::Denied,
            Self::ReportOnly(_)
            | Self::LeakLogged { .. }
            | Self::EchOffered
            | Self::SyntheticAddress { .. }
            | Self::AddressesStripped { .. }
            | Self::DnsUpstream(_)
            | Self::Failed(_) => Decision::Allowed,
        }
    }

    /// The report-only reason this reason carries, if any.
    #[must_use]
    pub fn reported(&self) -> Option<DenyReason> {
        match self {
            Self::ReportOnly(r) => Some(*r),
            Self::SyntheticAddress { reported } | Self::AddressesStripped { reported } => *reported,
            _ => None,
        }
    }

    /// The reason written as `text` in the log of an entry with `decision`. Text that is no other reason
    /// reads as [`Reason::Failed`].
    #[must_use]
    pub fn parse(text: &str, decision: Decision) -> Self {
        if let Some(reported) = text.strip_suffix(SYNTHETIC) {
            let reported = match reported {
                "" => Some(None),
                r => r
                    .strip_suffix(';')
                    .and_then(|r| r.strip_prefix(REPORT_ONLY))
                    .and_then(DenyReason::from_name)
                    .map(Some),
            };
            if let Some(reported) = reported {
                return Self::SyntheticAddress { reported };
            }
        }
        if let Some(reported) = text
            .strip_suffix("; blocked_address")
            .and_then(|r| r.strip_prefix(REPORT_ONLY))
            .and_then(DenyReason::from_name)
        {
            return Self::AddressesStripped {
                reported: Some(reported),
            };
        }
        if let Some(r) = text.strip_prefix(REPORT_ONLY).and_then(DenyReason::from_name) {
            return Self::ReportOnly(r);
        }
        if let Some(secrets) = text.strip_prefix(LEAK).and_then(|t| t.strip_suffix(LOGGED_ONLY)) {
            return Self::LeakLogged {
                secrets: secrets.to_owned(),
            };
        }
        if text == ECH_OFFERED {
            return Self::EchOffered;
        }
        if text == HTTP_AFTER_GREETING {
            return Self::HttpAfterServerGreeting;
        }
        if let Some(limited) = parse_rate_limited(text) {
            return limited;
        }
        match (DenyReason::from_name(text), decision) {
            (Some(DenyReason::BlockedAddress), Decision::Allowed) => {
                Self::AddressesStripped { reported: None }
            }
            (Some(DenyReason::InvalidName), Decision::Allowed) => Self::DnsUpstream(DnsFailure::InvalidName),
            (Some(r), _) => Self::Denied(r),
            (None, _) => {
                DnsFailure::from_name(text).map_or_else(|| Self::Failed(text.to_owned()), Self::DnsUpstream)
            }
        }
    }

    /// Cut the free text in the reason (a failure, a list of secret names) so that the whole is at most
    /// `max` bytes where it can be; the other reasons are short.
    pub(crate) fn truncate(&mut self, max: usize) {
        match self {
            Self::Failed(text) => super::cut_text(text, max),
            Self::LeakLogged { secrets } => {
                super::cut_text(secrets, max.saturating_sub(LEAK.len() + LOGGED_ONLY.len()));
            }
            _ => {}
        }
    }

    /// Bytes of the reason as written.
    pub(crate) fn text_len(&self) -> usize {
        /// Counts what is written to it.
        struct Count(usize);
        impl fmt::Write for Count {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                self.0 += s.len();
                Ok(())
            }
        }
        let mut count = Count(0);
        // Writing to a counter cannot fail.
        let _ = write!(count, "{self}");
        count.0
    }
}

/// `rate_limited;<scope>;refused=<n>`.
fn parse_rate_limited(text: &str) -> Option<Reason> {
    let rest = text
        .strip_prefix(DenyReason::RateLimited.as_str())?
        .strip_prefix(';')?;
    let (scope, refused_text) = rest.split_once(";refused=")?;
    let refused: u64 = refused_text.parse().ok()?;
    // Only the number as it is written reads back (not `01` or `+1`).
    if refused.to_string() != refused_text {
        return None;
    }
    Some(Reason::RateLimited {
        scope: BudgetScope::from_name(scope)?,
        refused,
    })
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Denied(r) => f.write_str(r.as_str()),
            Self::ReportOnly(r) => write!(f, "{REPORT_ONLY}{r}"),
            Self::LeakLogged { secrets } => write!(f, "{LEAK}{secrets}{LOGGED_ONLY}"),
            Self::EchOffered => f.write_str(ECH_OFFERED),
            Self::HttpAfterServerGreeting => f.write_str(HTTP_AFTER_GREETING),
            Self::RateLimited { scope, refused } => {
                write!(
                    f,
                    "{};{};refused={refused}",
                    DenyReason::RateLimited,
                    scope.as_str()
                )
            }
            Self::SyntheticAddress { reported: None } => f.write_str(SYNTHETIC),
            Self::SyntheticAddress { reported: Some(r) } => write!(f, "{REPORT_ONLY}{r};{SYNTHETIC}"),
            Self::AddressesStripped { reported: None } => f.write_str(DenyReason::BlockedAddress.as_str()),
            Self::AddressesStripped { reported: Some(r) } => {
                write!(f, "{REPORT_ONLY}{r}; {}", DenyReason::BlockedAddress)
            }
            Self::DnsUpstream(failure) => f.write_str(failure.as_str()),
            Self::Failed(text) => f.write_str(text),
        }
    }
}

impl FromStr for Reason {
    type Err = Infallible;

    /// [`Reason::parse`] for a denied entry (the reading of `blocked_address` and `invalid_name` as denials).
    fn from_str(text: &str) -> Result<Self, Infallible> {
        Ok(Self::parse(text, Decision::Denied))
    }
}

impl serde::Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Reason {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Self::parse(&text, Decision::Denied))
    }
}

#[cfg(test)]
mod tests;
