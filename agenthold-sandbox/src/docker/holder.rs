//! The gateway holder (E1, E3, S4): when agenthold is embedded in a host process, a tiny container running
//! `sandboxd hold` provides the gateway's network namespace. The process joins it to every agent network
//! at `.254`, adds `.2` (each network's gateway address) inside it, installs the nftables ruleset and binds
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
use crate::docker::network::{AgentNetwork, GATEWAY_JOIN_HOST};
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

    /// Join `net`: connect the holder at `.254` (idempotent), add `.2` inside, and return the interface name.
    ///
    /// # Errors
    /// When the engine or `ip` fails.
    pub async fn join(&self, engine: &Engine, net: &AgentNetwork) -> Result<String> {
        let join_addr = net.host(GATEWAY_JOIN_HOST);
        let ns = self.netns();
        if ns.iface_with_addr(join_addr)?.is_none() {
            // A container on the `none` network cannot join another one until it leaves `none`.
            let disconnect = NetworkDisconnectRequest {
                container: self.container.clone(),
                force: Some(true),
            };
            match engine.docker.disconnect_network("none", disconnect).await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) || is_not_connected(&e) => {}
                Err(e) => tracing::debug!(error = %e, "leaving the none network"),
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
        // anything anywhere, so it keeps no default route at all.
        while ns.ip(&["route", "del", "default"]).is_ok() {}
        let gateway = net.gateway_addr();
        if ns.iface_with_addr(gateway)?.is_none() {
            ns.ip(&["addr", "add", &format!("{gateway}/24"), "dev", &iface])?;
        }
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
