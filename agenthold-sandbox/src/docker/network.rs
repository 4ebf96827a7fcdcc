//! Per-agent Docker networks (E1, S4): each agent gets its own internal bridge network with no host address
//! on it and its default gateway at `.2`, which the gateway namespace owns.
//!
//! The network is created `--internal` with a stable bridge name and `--gateway <subnet>.2`: Docker then
//! gives every container on it a default route via `.2` by itself, across restarts, without any privileged
//! step in the sandbox (E2). On Docker 20.10 the bridge gets no host address through
//! `com.docker.network.bridge.inhibit_ipv4=true`; Docker ≥ 28 has `gateway_mode_ipv4=isolated` for that.
// enforces: E1

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;

use agenthold_core::AgentId;
use bollard::Docker;
use bollard::models::{Ipam, IpamConfig, NetworkCreateRequest};
use bollard::query_parameters::ListNetworksOptions;
use ipnet::Ipv4Net;
use sha2::{Digest, Sha256};

use crate::docker::engine::{Engine, is_not_found};
use crate::error::{Error, Result};

/// The address the gateway container joins every agent network with (Docker reserves `.2` as the network's
/// gateway, so the container takes `.254` and adds `.2` inside its own namespace).
pub const GATEWAY_JOIN_HOST: u8 = 254;

/// The names and addresses of one agent's network.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentNetwork {
    /// Docker network name.
    pub name: String,
    /// Host-side bridge interface name (≤ 15 bytes).
    pub bridge: String,
    /// The network's /24.
    pub subnet: Ipv4Net,
}

impl AgentNetwork {
    /// The names for `agent` on `subnet`.
    #[must_use]
    pub fn for_agent(agent: &AgentId, subnet: Ipv4Net) -> Self {
        let digest = Sha256::digest(agent.as_str().as_bytes());
        Self {
            name: format!("agenthold-{agent}"),
            // "ah" + 12 hex digits: 14 bytes, under the kernel's 15-byte limit for any agent id.
            bridge: format!("ah{}", &hex::encode(digest)[..12]),
            subnet,
        }
    }

    /// An address of the subnet by its last octet.
    #[must_use]
    pub fn host(&self, last: u8) -> Ipv4Addr {
        let [a, b, c, _] = self.subnet.network().octets();
        Ipv4Addr::new(a, b, c, last)
    }

    /// The gateway's address on this network (`.2`, see [`agenthold_egress::datapath::gateway_addr`]).
    #[must_use]
    pub fn gateway_addr(&self) -> Ipv4Addr {
        agenthold_egress::datapath::gateway_addr(self.subnet)
    }
}

/// Pick a free /24 in `pool`: not used by any Docker network and not in `taken`.
///
/// # Errors
/// When the engine cannot list networks or the pool is exhausted.
pub async fn allocate_subnet(docker: &Docker, pool: Ipv4Net, taken: &HashSet<Ipv4Net>) -> Result<Ipv4Net> {
    let networks = docker
        .list_networks(None::<ListNetworksOptions>)
        .await
        .map_err(|e| Error::engine("list networks", e))?;
    let used: Vec<Ipv4Net> = networks
        .iter()
        .filter_map(|n| n.ipam.as_ref()?.config.as_ref())
        .flatten()
        .filter_map(|c| c.subnet.as_deref()?.parse().ok())
        .collect();
    let free = pool
        .subnets(24)
        .map_err(|e| Error::BadInput {
            problem: format!("subnet pool {pool}: {e}"),
        })?
        .find(|s| {
            !taken.contains(s)
                && !used
                    .iter()
                    .any(|u| u.contains(&s.network()) || s.contains(&u.network()))
        });
    free.ok_or_else(|| Error::Unavailable {
        problem: format!("no free /24 left in the subnet pool {pool} (sandbox.subnet_pool)"),
    })
}

/// What [`create`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The network exists now (made, or already there).
    Made,
    /// The engine refused the subnet: another network on the same engine (of another runtime, made
    /// concurrently) overlaps it. Pick another subnet and try again.
    SubnetTaken,
}

/// Create the agent's network (idempotent: an existing network of that name is reused).
///
/// # Errors
/// When the engine refuses for another reason than an overlapping subnet.
pub async fn create(engine: &Engine, agent: &AgentId, net: &AgentNetwork) -> Result<Created> {
    if exists(&engine.docker, &net.name).await? {
        return Ok(Created::Made);
    }
    let mut options = HashMap::from([
        ("com.docker.network.bridge.name".to_owned(), net.bridge.clone()),
        (
            "com.docker.network.bridge.enable_icc".to_owned(),
            "true".to_owned(),
        ),
    ]);
    if engine.isolated_gateway_mode() {
        options.insert(
            "com.docker.network.bridge.gateway_mode_ipv4".to_owned(),
            "isolated".to_owned(),
        );
    } else {
        options.insert(
            "com.docker.network.bridge.inhibit_ipv4".to_owned(),
            "true".to_owned(),
        );
    }
    let request = NetworkCreateRequest {
        name: net.name.clone(),
        driver: Some("bridge".to_owned()),
        internal: Some(true),
        attachable: Some(false),
        enable_ipv6: Some(false),
        ipam: Some(Ipam {
            driver: Some("default".to_owned()),
            config: Some(vec![IpamConfig {
                subnet: Some(net.subnet.to_string()),
                gateway: Some(net.gateway_addr().to_string()),
                ..Default::default()
            }]),
            options: None,
        }),
        options: Some(options),
        labels: Some(engine.labels(Some(agent), "network")),
        ..Default::default()
    };
    match engine.docker.create_network(request).await {
        Ok(_) => Ok(Created::Made),
        Err(e) if crate::docker::engine::is_pool_overlap(&e) => Ok(Created::SubnetTaken),
        Err(e) => Err(Error::engine(format!("create network {}", net.name), e)),
    }
}

/// Remove the agent's network (idempotent).
///
/// # Errors
/// When the engine refuses (containers still attached).
pub async fn remove(docker: &Docker, name: &str) -> Result<()> {
    match docker.remove_network(name).await {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(Error::engine(format!("remove network {name}"), e)),
    }
}

/// Whether a network of that name exists.
///
/// # Errors
/// When the engine fails.
pub async fn exists(docker: &Docker, name: &str) -> Result<bool> {
    match docker
        .inspect_network(name, None::<bollard::query_parameters::InspectNetworkOptions>)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(Error::engine(format!("inspect network {name}"), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_kernel_limits() {
        let agent = AgentId::new("a".repeat(63)).unwrap();
        let net = AgentNetwork::for_agent(&agent, "10.213.5.0/24".parse().unwrap());
        assert!(net.bridge.len() <= 15);
        assert_eq!(net.gateway_addr(), Ipv4Addr::new(10, 213, 5, 2));
        assert_eq!(net.host(GATEWAY_JOIN_HOST), Ipv4Addr::new(10, 213, 5, 254));
        let other = AgentNetwork::for_agent(&AgentId::new("b").unwrap(), net.subnet);
        assert_ne!(net.bridge, other.bridge);
    }
}
