//! Where things are on an agent network, and the ports, as every datapath user states them: the gateway at
//! the subnet's `.2`, a sandbox whose address the caller picks at its `.3`, the ports from the `egress`
//! configuration.

use std::net::Ipv4Addr;

use agenthold_core::config::EgressConfig;
use ipnet::Ipv4Net;

use crate::nft::{AgentAttachment, Ports};

/// The host number of the gateway's address on every agent network (`.2`): the sandboxes' default route,
/// DNS server and explicit proxy. (`.1` is left to whatever made the network, a Docker bridge say.)
pub const GATEWAY_HOST: u32 = 2;
/// The host number of the sandbox's address on a network that serves one sandbox and whose addresses the
/// caller picks (`.3`; Docker assigns its own).
pub const SANDBOX_HOST: u32 = 3;

/// The gateway's address on `subnet` (its [`GATEWAY_HOST`]th address).
#[must_use]
pub fn gateway_addr(subnet: Ipv4Net) -> Ipv4Addr {
    host(subnet, GATEWAY_HOST)
}

/// The sandbox's address on `subnet` when the caller picks it (its [`SANDBOX_HOST`]th address).
#[must_use]
pub fn sandbox_addr(subnet: Ipv4Net) -> Ipv4Addr {
    host(subnet, SANDBOX_HOST)
}

fn host(subnet: Ipv4Net, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).saturating_add(n))
}

impl AgentAttachment {
    /// The agent network `subnet` on the gateway-side interface `iface`, with the gateway at the subnet's
    /// `.2` ([`gateway_addr`]).
    #[must_use]
    pub fn on_subnet(iface: impl Into<String>, subnet: Ipv4Net) -> Self {
        Self {
            iface: iface.into(),
            gateway_addr: gateway_addr(subnet),
            subnet: subnet.trunc(),
        }
    }
}

impl Ports {
    /// The ports of the `egress` configuration (`egress.proxy_port`, `explicit_port`, `dns_port`,
    /// `tunnel_port`). A deployment without a tunnel takes [`Ports::without_tunnel`].
    #[must_use]
    pub fn from_config(egress: &EgressConfig) -> Self {
        Self {
            proxy: egress.proxy_port,
            explicit: egress.explicit_port,
            dns: egress.dns_port,
            tunnel: Some(egress.tunnel_port),
        }
    }

    /// The same ports without the tunnel's (it is then neither bound nor reachable).
    #[must_use]
    pub fn without_tunnel(self) -> Self {
        Self { tunnel: None, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_on_a_subnet() {
        let subnet: Ipv4Net = "10.213.4.0/24".parse().unwrap();
        assert_eq!(gateway_addr(subnet), Ipv4Addr::new(10, 213, 4, 2));
        assert_eq!(sandbox_addr(subnet), Ipv4Addr::new(10, 213, 4, 3));
        let link = AgentAttachment::on_subnet("ah4", "10.213.4.9/24".parse().unwrap());
        assert_eq!(
            link,
            AgentAttachment {
                iface: "ah4".into(),
                gateway_addr: Ipv4Addr::new(10, 213, 4, 2),
                subnet,
            }
        );
    }

    #[test]
    fn ports_come_from_the_configuration() {
        let config = EgressConfig::default();
        assert_eq!(Ports::from_config(&config), Ports::default());
        let custom = EgressConfig {
            proxy_port: 1,
            explicit_port: 2,
            dns_port: 3,
            tunnel_port: 4,
            ..EgressConfig::default()
        };
        assert_eq!(
            Ports::from_config(&custom).without_tunnel(),
            Ports {
                proxy: 1,
                explicit: 2,
                dns: 3,
                tunnel: None
            }
        );
    }
}
