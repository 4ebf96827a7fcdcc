//! The gateway holder (E1, E3, S4): when agenthold is embedded in a host process, a tiny container running
//! `sandboxd hold` provides the gateway's network namespace. The process joins it to every agent network
//! at its join address (the last before broadcast: `.254` of a `/24`), adds `.2` (each network's gateway address) inside it, installs the nftables ruleset and binds
//! the gateway's listeners in it; upstream connections are still made from the process's own namespace.
//!
//! It is created with `ip_forward=0`, `rp_filter=1` and IPv6 disabled as creation-time sysctls, no
//! capabilities and `restart=no`: a gateway container restarted behind agenthold's back comes up with an
//! empty, closed namespace (no `.2`, no rules, no listeners) and stays closed until reconciled.

use std::collections::HashMap;

use agenthold_egress::netns::NetNs;
use bollard::models::{
    ContainerCreateBody, EndpointIpamConfig, EndpointSettings, HostConfig, NetworkConnectRequest,
    NetworkDisconnectRequest, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, StartContainerOptions,
};

use crate::docker::engine::{Engine, is_not_connected, is_not_found};
use crate::docker::network::AgentNetwork;
use crate::error::{Error, Result};

/// The running holder container.
#[derive(Debug, Clone)]
pub struct Holder {
    /// Container name.
    pub container: String,
    /// Its init process (the namespace lives as long as it does).
    pub pid: u32,
}

impl Holder {
    /// The holder's container name for this installation.
    #[must_use]
    pub fn name(engine: &Engine) -> String {
        format!("agenthold-gw-{}", engine.instance())
    }

    /// Find or create the holder and make sure it runs.
    ///
    /// # Errors
    /// When the engine fails or the holder does not start.
    pub async fn ensure(engine: &Engine, image: &str) -> Result<Self> {
        let name = Self::name(engine);
        if !exists(engine, &name).await? {
            create(engine, &name, image).await?;
        }
        let state = inspect(engine, &name).await?;
        if !state.0 {
            engine
                .docker
                .start_container(&name, None::<StartContainerOptions>)
                .await
                .map_err(|e| Error::engine(format!("start {name}"), e))?;
        }
        let (running, pid) = inspect(engine, &name).await?;
        if !running || pid == 0 {
            return Err(Error::Unavailable {
                problem: format!("the gateway container {name} does not stay up"),
            });
        }
        let holder = Self { container: name, pid };
        agenthold_egress::nft::harden(&holder.netns())?;
        Ok(holder)
    }

    /// The holder if it exists and runs; never creates or starts it.
    ///
    /// # Errors
    /// When the engine fails.
    pub async fn find(engine: &Engine) -> Result<Option<Self>> {
        let name = Self::name(engine);
        if !exists(engine, &name).await? {
            return Ok(None);
        }
        let (running, pid) = inspect(engine, &name).await?;
        Ok((running && pid != 0).then_some(Self { container: name, pid }))
    }

    /// Whether the holder found earlier is still the running one (same process).
    ///
    /// # Errors
    /// When the engine fails.
    pub async fn is_current(&self, engine: &Engine) -> Result<bool> {
        let (running, pid) = inspect(engine, &self.container).await?;
        Ok(running && pid == self.pid)
    }

    /// The gateway network namespace.
    #[must_use]
    pub fn netns(&self) -> NetNs {
        NetNs::of_pid(self.pid)
    }

    /// Join `net`: connect the holder at [`AgentNetwork::join_addr`] (idempotent), add `.2` inside, and return the interface name.
    ///
    /// # Errors
    /// When the engine or `ip` fails.
    pub async fn join(&self, engine: &Engine, net: &AgentNetwork) -> Result<String> {
        let join_addr = net.join_addr();
        let ns = self.netns();
        let listing = ns.ip(&["-o", "-4", "addr", "show"])?;
        if iface_of(&listing, join_addr).is_none() {
            // A container on the `none` network cannot join another one until it leaves `none`; one with an
            // address on any interface but `lo` has left it already (one engine call fewer per join).
            if !joined_any(&listing) {
                let disconnect = NetworkDisconnectRequest {
                    container: self.container.clone(),
                    force: Some(true),
                };
                match engine.docker.disconnect_network("none", disconnect).await {
                    Ok(()) => {}
                    Err(e) if is_not_found(&e) || is_not_connected(&e) => {}
                    Err(e) => tracing::debug!(error = %e, "leaving the none network"),
                }
            }
            let request = NetworkConnectRequest {
                container: self.container.clone(),
                endpoint_config: Some(EndpointSettings {
                    ipam_config: Some(EndpointIpamConfig {
                        ipv4_address: Some(join_addr.to_string()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            };
            engine
                .docker
                .connect_network(&net.name, request)
                .await
                .map_err(|e| Error::engine(format!("connect the gateway to {}", net.name), e))?;
        }
        let iface = ns.iface_with_addr(join_addr)?.ok_or_else(|| Error::Unavailable {
            problem: format!(
                "the gateway joined {} but has no interface with {join_addr}",
                net.name
            ),
        })?;
        // Docker gives the holder a default route via the network's gateway, which is the holder itself
        // once `.2` is added below; on the next join Docker cannot find that route to replace it (the
        // lookup resolves to `lo`) and fails with "file exists". The gateway namespace never routes
        // anything anywhere, so it keeps no default route at all: one flush of every default route, or
        // (when `ip` refuses the flush) deleting them one by one.
        if ns.ip(&["-4", "route", "flush", "exact", "0.0.0.0/0"]).is_err() {
            while ns.ip(&["route", "del", "default"]).is_ok() {}
        }
        // `.2` on the agent's interface; `replace` is idempotent (a re-attach).
        let gateway = net.gateway_addr();
        let prefix = net.subnet.prefix_len();
        ns.ip(&["addr", "replace", &format!("{gateway}/{prefix}"), "dev", &iface])?;
        Ok(iface)
    }

    /// Leave `net` (idempotent).
    ///
    /// # Errors
    /// When the engine fails.
    pub async fn leave(&self, engine: &Engine, net: &AgentNetwork) -> Result<()> {
        let request = NetworkDisconnectRequest {
            container: self.container.clone(),
            force: Some(true),
        };
        match engine.docker.disconnect_network(&net.name, request).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) if is_not_connected(&e) => Ok(()),
            Err(e) => Err(Error::engine(
                format!("disconnect the gateway from {}", net.name),
                e,
            )),
        }
    }
}

/// The interface that holds `addr` in an `ip -o -4 addr show` listing (a veth's `@peer` suffix is not part
/// of the name).
fn iface_of(listing: &str, addr: std::net::Ipv4Addr) -> Option<String> {
    let wanted = addr.to_string();
    listing.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let iface = words.nth(1)?;
        let inet = words.skip_while(|w| *w != "inet").nth(1)?;
        (inet.split('/').next() == Some(wanted.as_str()))
            .then(|| iface.split('@').next().unwrap_or(iface).to_owned())
    })
}

/// Whether an `ip -o -4 addr show` listing has an address on an interface other than `lo` (the holder
/// joined a network, so it is no longer on `none`).
fn joined_any(listing: &str) -> bool {
    listing
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .any(|iface| iface != "lo")
}

async fn exists(engine: &Engine, name: &str) -> Result<bool> {
    match engine
        .docker
        .inspect_container(name, None::<InspectContainerOptions>)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(Error::engine(format!("inspect {name}"), e)),
    }
}

/// (running, pid) of a container.
async fn inspect(engine: &Engine, name: &str) -> Result<(bool, u32)> {
    let c = engine
        .docker
        .inspect_container(name, None::<InspectContainerOptions>)
        .await
        .map_err(|e| Error::engine(format!("inspect {name}"), e))?;
    let state = c.state.unwrap_or_default();
    let pid = state.pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0);
    Ok((state.running.unwrap_or(false), pid))
}

async fn create(engine: &Engine, name: &str, image: &str) -> Result<()> {
    let sysctls = HashMap::from(
        [
            ("net.ipv4.ip_forward", "0"),
            ("net.ipv4.conf.all.rp_filter", "1"),
            ("net.ipv4.conf.default.rp_filter", "1"),
            ("net.ipv6.conf.all.disable_ipv6", "1"),
            ("net.ipv6.conf.default.disable_ipv6", "1"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        cmd: Some(vec!["/sandboxd".to_owned(), "hold".to_owned()]),
        labels: Some(engine.labels(None, "gateway")),
        network_disabled: Some(false),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_owned()),
            sysctls: Some(sysctls),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            }),
            cap_drop: Some(vec!["ALL".to_owned()]),
            readonly_rootfs: Some(true),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            pids_limit: Some(16),
            memory: Some(16 * 1024 * 1024),
            ..Default::default()
        }),
        ..Default::default()
    };
    let options = CreateContainerOptionsBuilder::default().name(name).build();
    engine
        .docker
        .create_container(Some(options), body)
        .await
        .map_err(|e| Error::engine(format!("create the gateway container {name}"), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str =
        "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
23: eth0@if24    inet 10.213.4.254/24 brd 10.213.4.255 scope global eth0\\       valid_lft forever
23: eth0@if24    inet 10.213.4.2/24 scope global secondary eth0\\       valid_lft forever";

    #[test]
    fn listings_name_the_interface_of_an_address() {
        let at = |a: &str| iface_of(LISTING, a.parse().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED));
        assert_eq!(at("10.213.4.254").as_deref(), Some("eth0"));
        assert_eq!(at("10.213.4.2").as_deref(), Some("eth0"));
        assert_eq!(at("127.0.0.1").as_deref(), Some("lo"));
        assert_eq!(at("10.213.4.25"), None, "no prefix match");
        assert!(joined_any(LISTING));
        assert!(!joined_any(
            "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever"
        ));
        assert!(!joined_any(""));
    }
}
