//! Engine look-ups the tests share: an agent's container and network as Docker sees them, an
//! installation's objects by label, and the sweep that removes whatever a failed test left behind.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use agenthold_core::AgentId;
use bollard::query_parameters::{
    InspectContainerOptions, InspectNetworkOptions, ListContainersOptions, ListNetworksOptions,
    ListVolumesOptions, RemoveContainerOptions, RemoveVolumeOptions,
};

use crate::support::docker;

/// What the engine says about an agent's sandbox container.
#[derive(Debug, Clone)]
pub struct ContainerFacts {
    /// Container id.
    pub id: String,
    /// `State.StartedAt`.
    pub started_at: String,
    /// Init process on the host.
    pub pid: i64,
    /// Its address on the agent network.
    pub ip: Ipv4Addr,
    /// Labels.
    pub labels: HashMap<String, String>,
}

/// Inspect `agenthold-<agent>`.
pub async fn container(agent: &AgentId) -> ContainerFacts {
    let docker = docker().await;
    let c = docker
        .inspect_container(&format!("agenthold-{agent}"), None::<InspectContainerOptions>)
        .await
        .expect("inspect the sandbox");
    let state = c.state.unwrap_or_default();
    let pid = state.pid.unwrap_or(0);
    ContainerFacts {
        id: c.id.unwrap_or_default(),
        started_at: state.started_at.unwrap_or_default(),
        pid,
        ip: address_inside(pid),
        labels: c.config.and_then(|c| c.labels).unwrap_or_default(),
    }
}

/// The engine's host configuration of `agenthold-<agent>`.
pub async fn host_config(agent: &AgentId) -> bollard::models::HostConfig {
    docker()
        .await
        .inspect_container(&format!("agenthold-{agent}"), None::<InspectContainerOptions>)
        .await
        .expect("inspect the sandbox")
        .host_config
        .expect("the sandbox's host configuration")
}

/// The sandbox's address as its own namespace has it (the runtime plugs it in: the engine knows none).
fn address_inside(pid: i64) -> Ipv4Addr {
    let netns = format!("--net=/proc/{pid}/ns/net");
    let out = crate::support::host(
        "nsenter",
        &[&netns, "--", "ip", "-o", "-4", "addr", "show", "dev", "eth0"],
    );
    assert!(out.status.success(), "the sandbox has an eth0: {out:?}");
    let listing = String::from_utf8_lossy(&out.stdout);
    let cidr = listing
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .expect("an IPv4 address on eth0");
    cidr.split('/')
        .next()
        .unwrap_or_default()
        .parse()
        .expect("sandbox address")
}

/// The agent network's bridge, subnet and gateway (`.2`).
#[derive(Debug, Clone)]
pub struct NetFacts {
    /// Host bridge interface.
    pub bridge: String,
    /// The agent network (a /28 by default).
    pub subnet: ipnet::Ipv4Net,
    /// `.2`.
    pub gateway: Ipv4Addr,
}

/// Inspect the agent network `agenthold-<agent>`.
pub async fn network(agent: &AgentId) -> NetFacts {
    let docker = docker().await;
    let n = docker
        .inspect_network(&format!("agenthold-{agent}"), None::<InspectNetworkOptions>)
        .await
        .expect("inspect the agent network");
    let options = n.options.unwrap_or_default();
    let ipam = n.ipam.and_then(|i| i.config).unwrap_or_default();
    let config = ipam.first().expect("one IPAM config");
    NetFacts {
        bridge: options
            .get("com.docker.network.bridge.name")
            .cloned()
            .expect("a named bridge"),
        subnet: config
            .subnet
            .as_deref()
            .expect("subnet")
            .parse()
            .expect("a subnet"),
        gateway: config
            .gateway
            .as_deref()
            .expect("gateway")
            .parse()
            .expect("gateway address"),
    }
}

/// Names of this installation's containers, networks and volumes.
pub async fn engine_objects(instance: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let docker = docker().await;
    let label = HashMap::from([("label".to_owned(), vec![format!("agenthold.instance={instance}")])]);
    let containers = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(label.clone()),
            ..Default::default()
        }))
        .await
        .expect("list containers")
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .collect();
    let networks = docker
        .list_networks(Some(ListNetworksOptions {
            filters: Some(label.clone()),
        }))
        .await
        .expect("list networks")
        .into_iter()
        .filter_map(|n| n.name)
        .collect();
    let volumes = docker
        .list_volumes(Some(ListVolumesOptions { filters: Some(label) }))
        .await
        .expect("list volumes")
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect();
    (containers, networks, volumes)
}

/// Remove whatever is left with `instance`'s label (containers, networks, volumes) and their
/// `DOCKER-USER` accepts, and the installation's host table. Best effort: this only runs after a test already
/// finished.
pub async fn sweep(instance: &str) {
    let docker = docker().await;
    let (containers, networks, volumes) = engine_objects(instance).await;
    for name in containers {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        let _ = docker
            .remove_container(name.trim_start_matches('/'), Some(options))
            .await;
    }
    for name in networks {
        if let Ok(n) = docker.inspect_network(&name, None::<InspectNetworkOptions>).await
            && let Some(bridge) = n
                .options
                .unwrap_or_default()
                .get("com.docker.network.bridge.name")
        {
            let _ = agenthold_sandbox::docker::hostfw::disallow_bridge(bridge);
        }
        let _ = docker.remove_network(&name).await;
    }
    for name in volumes {
        let _ = docker
            .remove_volume(&name, Some(RemoveVolumeOptions { force: true }))
            .await;
    }
    // No bridges: the installation's host table goes.
    let _ = agenthold_sandbox::docker::hostfw::apply_host_table(instance, &[]);
}

/// Sweeps an installation when dropped (for the stretch of a test before an `Env` guards it).
pub struct SweepOnDrop(pub String);

impl Drop for SweepOnDrop {
    fn drop(&mut self) {
        let instance = self.0.clone();
        // Drop cannot await: sweep on a thread with a runtime of its own.
        let swept = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(sweep(&instance));
        });
        let _ = swept.join();
    }
}
