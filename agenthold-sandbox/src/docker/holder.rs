//! The gateway holder (E1, E3, S4): when agenthold is embedded in a host process, a tiny container running
//! `sandboxd hold` provides the gateway's network namespace. The process joins it to every agent network
//! with a veth pair of its own (one end a port of the network's bridge, the other in the holder), at the
//! network's join address (the last before broadcast: `.254` of a `/24`, reserved in the engine's IPAM) and
//! `.2` (each network's gateway address), installs the nftables ruleset and binds the gateway's listeners
//! in it; upstream connections are still made from the process's own namespace. The holder itself stays on
//! the engine's `none` network: the engine knows nothing of these links, so joining costs the same with
//! 1 or 500 networks.
//!
//! It is created with `ip_forward=0`, `rp_filter=1` and IPv6 disabled as creation-time sysctls, no
//! capabilities and `restart=no`: a gateway container restarted behind agenthold's back comes up with an
//! empty, closed namespace (no `.2`, no rules, no listeners) and stays closed until reconciled.

use std::collections::HashMap;

use agenthold_egress::netns::NetNs;
use bollard::models::{
    ContainerCreateBody, HostConfig, NetworkDisconnectRequest, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, StartContainerOptions,
};

use crate::docker::engine::{Engine, is_not_connected, is_not_found};
use crate::docker::hostfw;
use crate::docker::network::AgentNetwork;
use crate::error::{Error, Result};

/// The first two bytes of the MAC address of the holder's interface on an agent network (locally
/// administered, unicast; the engine's own are `02:42`); the other four are the join address.
const HOLDER_MAC_PREFIX: &str = "02:61";

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

    /// Join `net` and return the holder's interface on it: a veth pair made by the runtime (not an engine
    /// endpoint: the engine's `network connect` got slower with every network the holder was on, 95 ms
    /// to 934 ms between 50 and 250 agents), the holder's end named as the bridge and holding
    /// [`AgentNetwork::join_addr`] and `.2`, the host's end ([`AgentNetwork::holder_port`]) a port of the
    /// bridge. Idempotent: an interface holding the join address is kept (also one an older runtime joined
    /// through the engine), and the port is put back on the bridge in case the engine made the bridge anew.
    ///
    /// # Errors
    /// When `ip` fails.
    pub fn join(&self, net: &AgentNetwork) -> Result<String> {
        let join_addr = net.join_addr();
        let ns = self.netns();
        let prefix = net.subnet.prefix_len();
        let gateway = format!("{}/{prefix}", net.gateway_addr());
        let listing = ns.ip(&["-o", "-4", "addr", "show"])?;
        if let Some(iface) = iface_of(&listing, join_addr) {
            if iface == net.bridge {
                hostfw::checked(
                    "ip",
                    &["link", "set", &net.holder_port(), "master", &net.bridge, "up"],
                    None,
                )?;
            }
            // `.2` on the agent's interface; `replace` is idempotent (a re-attach).
            ns.ip(&["addr", "replace", &gateway, "dev", &iface])?;
            return Ok(iface);
        }
        let port = net.holder_port();
        let inside = net.bridge.as_str();
        let make = [
            "link",
            "add",
            &port,
            "type",
            "veth",
            "peer",
            "name",
            inside,
            "netns",
            &self.pid.to_string(),
        ];
        if hostfw::checked("ip", &make, None).is_err() {
            // What an interrupted join left (either end; the pair goes with either): start over once.
            let _ = hostfw::run("ip", &["link", "del", &port], None);
            let _ = ns.ip(&["link", "del", inside]);
            hostfw::checked("ip", &make, None)?;
        }
        hostfw::checked("ip", &["link", "set", &port, "master", &net.bridge, "up"], None)?;
        // The holder's end, inside its namespace, in one `ip` run. No default route: the gateway
        // namespace never routes anything anywhere.
        // The same MAC address for the same network every time (as the engine's endpoints had): after a
        // holder restart the sandbox's neighbour entry for `.2` still points at it, and a new random
        // address would leave the agent without a gateway until that entry expired (30 s or more).
        let [a, b, c, d] = join_addr.octets();
        let mac = format!("{HOLDER_MAC_PREFIX}:{a:02x}:{b:02x}:{c:02x}:{d:02x}");
        let batch = format!(
            "link set {inside} address {mac}\naddr add {join_addr}/{prefix} dev {inside}\n\
             addr add {gateway} dev {inside}\nlink set {inside} up\n"
        );
        let netns = format!("--net=/proc/{}/ns/net", self.pid);
        hostfw::checked("nsenter", &[&netns, "--", "ip", "-batch", "-"], Some(&batch))?;
        Ok(inside.to_owned())
    }

    /// Take the holder's ends off every network of `nets` at once (one `ip` run; missing ones are fine):
    /// a holder that died leaves its namespace behind for as long as anything there is still open, and
    /// nothing may be served through a dead holder's namespace until the new one is joined.
    pub fn unplug_all<'a>(nets: impl IntoIterator<Item = &'a AgentNetwork>) {
        let batch: String = nets
            .into_iter()
            .map(|net| format!("link del {}\n", net.holder_port()))
            .collect();
        if !batch.is_empty() {
            let _ = hostfw::run("ip", &["-force", "-batch", "-"], Some(&batch));
        }
    }

    /// Leave `net` (idempotent).
    ///
    /// # Errors
    /// When the engine fails.
    pub async fn leave(&self, engine: &Engine, net: &AgentNetwork) -> Result<()> {
        // The runtime's own veth pair: deleting the host's end deletes both.
        if hostfw::checked("ip", &["link", "del", &net.holder_port()], None).is_ok() {
            return Ok(());
        }
        // No such pair: gone with the holder's namespace, or a join an older runtime made through the
        // engine.
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
    }
}
