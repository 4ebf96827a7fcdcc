//! Cloud providers' internal endpoints that sit at public-looking addresses.
//!
//! Metadata services and platform agents answer any VM that asks and identify the caller by its source
//! address, so a sandbox reaching one through the gateway speaks as the host. Most of them live in ranges
//! the registry rows block already; only those at addresses the registries call public need a row here.
//!
//! Already blocked by the registry rows (listed so nobody adds them twice; a test checks each):
//! `169.254.169.254` (instance metadata on AWS, GCP, Azure, OCI, DigitalOcean, OpenStack, …),
//! `169.254.169.253` (AWS VPC DNS), `169.254.169.123` (AWS time sync), `169.254.170.2` (AWS ECS task
//! metadata), `169.254.0.23` (Tencent Cloud metadata), `169.254.42.42` (Scaleway metadata),
//! `100.100.100.200` (Alibaba Cloud metadata, inside `100.64.0.0/10`), `fd00:ec2::254`, `fd00:ec2::23` and
//! `fd00:ec2::123` (AWS metadata, DNS and time over IPv6, inside `fc00::/7`).
//!
//! Endpoints an operator knows of and that are not here (a provider's metadata at a public address on a
//! private platform, say) go into `egress.deny_cidrs`.

use std::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net};

/// One provider endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Provider {
    /// The address block.
    pub block: IpNet,
    /// The provider.
    pub provider: &'static str,
    /// What answers there.
    pub service: &'static str,
}

/// Provider endpoints at addresses no registry row covers.
pub const PROVIDERS: &[Provider] = &[Provider {
    block: IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(168, 63, 129, 16), 32)),
    provider: "Microsoft Azure",
    service: "WireServer (platform DNS, DHCP, health probes, VM agent and extension channel)",
}];

/// Endpoints the registry rows cover already, as (address, what answers there), for the test that keeps
/// this module's documentation honest.
#[cfg(test)]
pub(super) const COVERED: &[(&str, &str)] = &[
    (
        "169.254.169.254",
        "instance metadata (AWS, GCP, Azure, OCI, DigitalOcean, OpenStack, …)",
    ),
    ("169.254.169.253", "AWS VPC DNS"),
    ("169.254.169.123", "AWS time sync"),
    ("169.254.170.2", "AWS ECS task metadata"),
    ("169.254.0.23", "Tencent Cloud metadata"),
    ("169.254.42.42", "Scaleway metadata"),
    ("100.100.100.200", "Alibaba Cloud metadata"),
    ("fd00:ec2::254", "AWS instance metadata over IPv6"),
    ("fd00:ec2::23", "AWS DNS over IPv6"),
    ("fd00:ec2::123", "AWS time sync over IPv6"),
];
