//! Per-agent Docker networks (E1, S4): each agent gets its own internal bridge network with no host address
//! on it and its default gateway at `.2`, which the gateway namespace owns.
//!
//! Each network is one `/sandbox.subnet_prefix` (default `/28`) of `sandbox.subnet_pool`; an agent keeps the
//! network in its record, so networks of an older size (a `/24` each before) stay valid. Its addresses: the
//! network address; the sandbox's, `.1`; `.2` (the network's gateway, held inside the gateway namespace);
//! the gateway holder's join address, the last address before broadcast (`.254` in a `/24`, `.14` in a
//! `/28`); and broadcast. The engine reserves `.1` and the join address, so it never hands them out.
//!
//! The network is created `--internal` with a stable bridge name and `--gateway <subnet>.2`. On Docker 20.10
//! the bridge gets no host address through `com.docker.network.bridge.inhibit_ipv4=true`; Docker ≥ 28 has
//! `gateway_mode_ipv4=isolated` for that. Neither the sandbox nor the gateway holder is an engine endpoint
//! of it: the runtime plugs both in with veth pairs of its own ([`plug_sandbox`] after every start of the
//! sandbox, [`crate::docker::holder::Holder::join`]). The engine's start of a container on a user-defined
//! network (its endpoint, its embedded DNS) cost ≈ 120 ms more than a start without one, and the network
//! no longer has to exist before the container is created (docs/benchmarks.md, "Issue 14: sandbox start").
//! Sandboxes made by earlier versions (engine endpoints) keep working as they are.
// enforces: E1

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;

use agenthold_core::AgentId;
use bollard::Docker;
use bollard::models::{Ipam, IpamConfig, NetworkCreateRequest};
use bollard::query_parameters::ListNetworksOptions;
use ipnet::Ipv4Net;
use sha2::{Digest, Sha256};

use crate::docker::engine::{Engine, is_not_found};
use crate::docker::hostfw;
use crate::error::{Error, Result};

/// The names and addresses of one agent's network.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentNetwork {
    /// Docker network name.
    pub name: String,
    /// Host-side bridge interface name (≤ 15 bytes).
    pub bridge: String,
    /// The network (a `/sandbox.subnet_prefix` of the pool when it was made; older records: a `/24`).
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

    /// The address the gateway holder joins the network with: the last one before broadcast (`.254` of a
    /// `/24`, `.14` of a `/28`). Docker reserves `.2` as the network's gateway, so the holder joins here
    /// and adds `.2` inside its own namespace.
    #[must_use]
    pub fn join_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.subnet.broadcast()).saturating_sub(1))
    }

    /// The host's end of the veth pair that joins the gateway holder to this network (a port of the
    /// bridge): the bridge's name and `g`, 15 bytes.
    #[must_use]
    pub fn holder_port(&self) -> String {
        format!("{}g", self.bridge)
    }

    /// The gateway's address on this network (`.2`, see [`agenthold_egress::datapath::gateway_addr`]).
    #[must_use]
    pub fn gateway_addr(&self) -> Ipv4Addr {
        agenthold_egress::datapath::gateway_addr(self.subnet)
    }

    /// The sandbox's address on this network: the first one (`.1`), which the engine also gave the
    /// sandboxes it connected itself (before the runtime plugged them, see [`plug_sandbox`]).
    #[must_use]
    pub fn sandbox_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.subnet.network()).saturating_add(1))
    }

    /// The host's end of the veth pair that plugs the sandbox into this network (a port of the bridge): the
    /// bridge's name and `s`, 15 bytes.
    #[must_use]
    pub fn sandbox_port(&self) -> String {
        format!("{}s", self.bridge)
    }
}

/// Pick a free `/prefix` in `pool`: not overlapping any Docker network nor any of `taken`.
///
/// # Errors
/// When the engine cannot list networks or the pool is exhausted.
pub async fn allocate_subnet(
    docker: &Docker,
    pool: Ipv4Net,
    prefix: u8,
    taken: &HashSet<Ipv4Net>,
) -> Result<Ipv4Net> {
    let mut used = engine_subnets(docker).await?;
    used.extend(taken.iter().copied());
    pick_subnet(pool, prefix, &used)
}

/// The subnets of every network the engine has (one listing: its cost grows with the number of networks).
///
/// # Errors
/// When the engine cannot list networks.
pub async fn engine_subnets(docker: &Docker) -> Result<Vec<Ipv4Net>> {
    let networks = docker
        .list_networks(None::<ListNetworksOptions>)
        .await
        .map_err(|e| Error::engine("list networks", e))?;
    Ok(networks
        .iter()
        .filter_map(|n| n.ipam.as_ref()?.config.as_ref())
        .flatten()
        .filter_map(|c| c.subnet.as_deref()?.parse().ok())
        .collect())
}

/// The first `/prefix` of `pool` that overlaps none of `used` (networks of any size: older agents keep
/// their `/24`).
///
/// # Errors
/// [`Error::BadInput`] when `prefix` does not fit `pool`; [`Error::Unavailable`] when every one overlaps.
pub fn pick_subnet(pool: Ipv4Net, prefix: u8, used: &[Ipv4Net]) -> Result<Ipv4Net> {
    let overlaps = |s: &Ipv4Net, u: &Ipv4Net| u.contains(&s.network()) || s.contains(&u.network());
    // Only the used networks that touch the pool matter (a host has others).
    let used: Vec<Ipv4Net> = used.iter().filter(|u| overlaps(&pool, u)).copied().collect();
    let mut candidates = pool.subnets(prefix).map_err(|e| Error::BadInput {
        problem: format!("subnet pool {pool} with /{prefix} networks: {e}"),
    })?;
    let capacity = 1u64 << (prefix - pool.prefix_len()).min(63);
    candidates
        .find(|s| !used.iter().any(|u| overlaps(s, u)))
        .ok_or_else(|| Error::Unavailable {
            problem: format!(
                "no free /{prefix} left in the subnet pool {pool} (sandbox.subnet_pool, {capacity} networks of \
                 sandbox.subnet_prefix /{prefix}): remove agents, or configure a larger pool or a longer prefix"
            ),
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
                // The holder's join address is the runtime's (its own veth, not an engine endpoint):
                // the engine must never give it to a container.
                // The same for the sandbox's own address (also plugged by the runtime).
                auxiliary_addresses: Some(HashMap::from([
                    ("agenthold-gateway".to_owned(), net.join_addr().to_string()),
                    ("agenthold-sandbox".to_owned(), net.sandbox_addr().to_string()),
                ])),
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

/// The sandbox's interface inside its namespace.
pub const SANDBOX_IFACE: &str = "eth0";

/// Locally administered MAC prefix of the sandbox's interface, the rest its address: the gateway's neighbour
/// entry for `.1` stays right across the sandbox's restarts, as the holder's own (`02:61`) does for `.2`.
const SANDBOX_MAC_PREFIX: &str = "02:73";

/// Plug a running sandbox into `net` (E1, E2): the sandbox is created without any network of the engine's
/// (`none`, so the engine's start makes no endpoint), and after each start the runtime adds a veth pair, the
/// host's end ([`AgentNetwork::sandbox_port`]) a port of the agent's bridge, the other [`SANDBOX_IFACE`]
/// inside the sandbox with [`AgentNetwork::sandbox_addr`] and its default route via `.2`. Nothing in the
/// sandbox is privileged for it, and a sandbox started by anyone else has no interface but loopback until
/// the runtime plugs it. Idempotent: an interface plugged earlier in this boot is kept, what an interrupted
/// plug left is made again. Two `ip` runs on the fast path.
///
/// `pid` is the sandbox's first process and `container_id` its container: the namespace is opened first and
/// the process then checked to still be in the container's cgroup, so a process id reused after the sandbox
/// stopped never gets (or loses) an interface.
///
/// # Errors
/// When `pid` is not the sandbox's process (any more), or `ip` fails.
pub(crate) fn plug_sandbox(net: &AgentNetwork, container_id: &str, pid: u32) -> Result<()> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|e| Error::io(format!("open the network namespace of process {pid}"), e))?;
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    if container_id.is_empty() || !cgroup.contains(container_id) {
        return Err(Error::Unavailable {
            problem: format!("process {pid} is no longer the sandbox's; its network was not plugged"),
        });
    }
    // The pinned namespace, for the `ip` and `nsenter` runs (they open it through this process).
    let ns_path = format!("/proc/{}/fd/{}", std::process::id(), ns.as_raw_fd());
    let enter = format!("--net={ns_path}");
    let port = net.sandbox_port();
    let [a, b, c, d] = net.sandbox_addr().octets();
    let mac = format!("{SANDBOX_MAC_PREFIX}:{a:02x}:{b:02x}:{c:02x}:{d:02x}");
    let make = format!(
        "link add {port} type veth peer name {SANDBOX_IFACE} address {mac} netns {ns_path}\n\
         link set {port} master {bridge} up\n",
        bridge = net.bridge
    );
    if hostfw::checked("ip", &["-batch", "-"], Some(&make)).is_err() {
        let inside = hostfw::run(
            "nsenter",
            &[&enter, "--", "ip", "-o", "link", "show", SANDBOX_IFACE],
            None,
        )?;
        if inside.status.success() {
            // Plugged earlier in this boot: the port back on the bridge, in case the engine made it anew.
            hostfw::checked("ip", &["link", "set", &port, "master", &net.bridge, "up"], None)?;
        } else {
            // A port an interrupted plug (or an earlier boot's) left: the pair goes with it; start over once.
            let _ = hostfw::run("ip", &["link", "del", &port], None);
            hostfw::checked("ip", &["-batch", "-"], Some(&make))?;
        }
    }
    let inside = format!(
        "addr replace {addr}/{prefix} dev {SANDBOX_IFACE}\nlink set {SANDBOX_IFACE} up\n\
         route replace default via {gateway}\n",
        addr = net.sandbox_addr(),
        prefix = net.subnet.prefix_len(),
        gateway = net.gateway_addr(),
    );
    hostfw::checked("nsenter", &[&enter, "--", "ip", "-batch", "-"], Some(&inside))?;
    drop(ns);
    Ok(())
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
        assert_eq!(
            net.join_addr(),
            Ipv4Addr::new(10, 213, 5, 254),
            "old /24 records keep .254"
        );
        let small = AgentNetwork::for_agent(&agent, "10.213.5.32/28".parse().unwrap());
        assert_eq!(small.gateway_addr(), Ipv4Addr::new(10, 213, 5, 34));
        assert_eq!(small.join_addr(), Ipv4Addr::new(10, 213, 5, 46));
        let smallest = AgentNetwork::for_agent(&agent, "10.213.5.8/29".parse().unwrap());
        assert_eq!(smallest.join_addr(), Ipv4Addr::new(10, 213, 5, 14));
        let other = AgentNetwork::for_agent(&AgentId::new("b").unwrap(), net.subnet);
        assert_ne!(net.bridge, other.bridge);
        assert!(net.holder_port().len() <= 15 && net.holder_port() != net.bridge);
        assert!(net.sandbox_port().len() <= 15 && net.sandbox_port() != net.holder_port());
        assert_eq!(small.sandbox_addr(), Ipv4Addr::new(10, 213, 5, 33));
        assert_eq!(net.sandbox_addr(), Ipv4Addr::new(10, 213, 5, 1));
    }

    /// A process that is not the container's (a reused process id) never gets the sandbox's interface.
    // covers: E1
    #[test]
    fn a_process_outside_the_container_is_never_plugged() {
        let agent = AgentId::new("plug-guard").unwrap();
        let net = AgentNetwork::for_agent(&agent, "10.213.250.0/28".parse().unwrap());
        let refused = plug_sandbox(&net, &"ab".repeat(32), std::process::id());
        assert!(matches!(refused, Err(Error::Unavailable { .. })), "{refused:?}");
        assert!(
            std::path::Path::new("/sys/class/net").exists()
                && !std::path::Path::new("/sys/class/net")
                    .join(net.sandbox_port())
                    .exists(),
            "no port was made"
        );
    }

    fn pool() -> Ipv4Net {
        "10.213.0.0/16".parse().unwrap()
    }

    #[test]
    fn allocation_goes_past_256_agents() {
        let mut used = Vec::new();
        for i in 0..1000u32 {
            let s = pick_subnet(pool(), 28, &used).unwrap();
            assert_eq!(s.prefix_len(), 28);
            assert!(pool().contains(&s.network()) && pool().contains(&s.broadcast()));
            assert!(
                used.iter().all(|u: &Ipv4Net| !u.contains(&s.network())),
                "#{i} reused"
            );
            used.push(s);
        }
        assert_eq!(used[300], "10.213.18.192/28".parse::<Ipv4Net>().unwrap());
    }

    #[test]
    fn exhaustion_is_a_clear_error() {
        let small: Ipv4Net = "10.99.0.0/26".parse().unwrap();
        let mut used = Vec::new();
        for _ in 0..4 {
            used.push(pick_subnet(small, 28, &used).unwrap());
        }
        let err = pick_subnet(small, 28, &used).unwrap_err().to_string();
        assert!(
            err.contains("no free /28") && err.contains("10.99.0.0/26"),
            "{err}"
        );
        assert!(
            err.contains("sandbox.subnet_pool") && err.contains("4 networks"),
            "{err}"
        );
        assert!(pick_subnet(small, 24, &[]).is_err(), "a /24 does not fit a /26");
    }

    #[test]
    fn old_24s_and_foreign_networks_stay_out_of_the_way() {
        // Records from before: /24s at the start of the pool; a foreign network inside it too.
        let used: Vec<Ipv4Net> = [
            "10.213.0.0/24",
            "10.213.1.0/24",
            "10.213.2.16/28",
            "172.17.0.0/16",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let first = pick_subnet(pool(), 28, &used).unwrap();
        assert_eq!(first, "10.213.2.0/28".parse::<Ipv4Net>().unwrap());
        let mut all = used;
        all.push(first);
        assert_eq!(
            pick_subnet(pool(), 28, &all).unwrap(),
            "10.213.2.32/28".parse::<Ipv4Net>().unwrap()
        );
        // A new /28 never lands inside an old /24, and an old-size /24 is still picked whole.
        assert_eq!(
            pick_subnet(pool(), 24, &all).unwrap(),
            "10.213.3.0/24".parse::<Ipv4Net>().unwrap()
        );
        // A network that contains the whole pool leaves nothing.
        assert!(pick_subnet(pool(), 28, &["10.0.0.0/8".parse().unwrap()]).is_err());
    }
}
