//! The sandbox container itself (S1, E2, E12, E14): how it is created (hardening, limits, network
//! settings, the read-only sandboxd mount) and how each start is prepared (a fresh boot token and the CA
//! written into it before the engine starts it).
// enforces: E2 S1

use std::net::SocketAddr;

use agenthold_core::AgentId;
use agenthold_core::sandbox::ContainerSpec;
use agenthold_egress::datapath::{CaPaths, RESERVED_ENV, sandbox_env};
use bollard::body_full;
use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountType, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{CreateContainerOptionsBuilder, UploadToContainerOptions};
use bytes::Bytes;
use sandboxd::contract;

use super::DockerConfig;
use crate::docker::archive::{self, Entry};
use crate::docker::engine::Engine;
use crate::docker::handout::Limits;
use crate::docker::network::AgentNetwork;
use crate::error::{Error, Result};

/// The agent's persistent volume.
pub(crate) const WORKSPACE: &str = "/workspace";

/// Environment variables the datapath sets in every sandbox; a spec may not set them (it may set
/// `NO_PROXY`): the sandbox environment contract's ([`RESERVED_ENV`]) and sandboxd's ([`contract::ENV`]).
pub const DATAPATH_ENV: &[&str] = &datapath_env();

const fn datapath_env() -> [&'static str; RESERVED_ENV.len() + contract::ENV.len()] {
    let mut all = [""; RESERVED_ENV.len() + contract::ENV.len()];
    let mut i = 0;
    while i < RESERVED_ENV.len() {
        all[i] = RESERVED_ENV[i];
        i += 1;
    }
    let mut j = 0;
    while j < contract::ENV.len() {
        all[i + j] = contract::ENV[j];
        j += 1;
    }
    all
}

/// Names of an agent's engine objects.
pub(crate) fn container_name(agent: &AgentId) -> String {
    format!("agenthold-{agent}")
}

/// The agent's volume name.
pub(crate) fn volume_name(agent: &AgentId) -> String {
    format!("agenthold-{agent}")
}

/// The environment every sandbox gets: the datapath's (proxy, tunnel, CA) and then the spec's own.
fn environment(
    agent: &AgentId,
    spec: &ContainerSpec,
    net: &AgentNetwork,
    config: &DockerConfig,
) -> Vec<String> {
    let gateway = net.gateway_addr();
    // sandboxd builds the bundle from the image's roots and the CA at every boot.
    let ca = CaPaths::new(contract::CA_FILE, contract::CA_BUNDLE);
    let mut env = sandbox_env(gateway, config.ports, &ca);
    let tunnel = config.ports.tunnel.map(|port| SocketAddr::from((gateway, port)));
    env.extend(
        contract::env(agent.as_str(), tunnel)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v)),
    );
    env.extend(spec.env().iter().map(|(k, v)| (k.clone(), v.clone())));
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// Create the container (not started).
pub(crate) async fn create(
    engine: &Engine,
    agent: &AgentId,
    spec: &ContainerSpec,
    net: &AgentNetwork,
    config: &DockerConfig,
) -> Result<()> {
    let runtime = spec
        .runtime()
        .map_or_else(|| config.default_runtime.clone(), str::to_owned);
    engine.check_runtime(&runtime)?;
    let Limits {
        nano_cpus,
        memory,
        pids,
    } = Limits::of(spec, config)?;
    let resolv = write_resolv_conf(agent, net, config)?;
    // The spec's labels first, agenthold's last: should a reserved key get past the check, ours win (S15).
    let mut labels: std::collections::HashMap<String, String> = spec
        .labels()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.extend(engine.labels(Some(agent), "sandbox"));
    let mounts = vec![
        Mount {
            target: Some(WORKSPACE.to_owned()),
            source: Some(volume_name(agent)),
            typ: Some(MountType::VOLUME),
            ..Default::default()
        },
        // The sandbox's resolver is the gateway itself (E2), not Docker's embedded one: queries go straight
        // to `.2`, and container names on the network are not resolvable.
        Mount {
            target: Some("/etc/resolv.conf".to_owned()),
            source: Some(resolv.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            ..Default::default()
        },
        Mount {
            target: Some(contract::SANDBOXD.to_owned()),
            source: Some(config.sandboxd_path.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            ..Default::default()
        },
        // The same binary as `agenthold-send` on the usual PATH (P3): sandboxd dispatches on argv[0].
        Mount {
            target: Some(contract::SEND_COMMAND.to_owned()),
            source: Some(config.sandboxd_path.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            ..Default::default()
        },
    ];
    let body = ContainerCreateBody {
        image: Some(spec.image().to_owned()),
        hostname: Some(format!(
            "agent-{}",
            &agent.as_str()[..agent.as_str().len().min(20)]
        )),
        entrypoint: Some(contract::command::boot()),
        env: Some(environment(agent, spec, net, config)),
        working_dir: Some(WORKSPACE.to_owned()),
        labels: Some(labels),
        stop_signal: Some("SIGTERM".to_owned()),
        host_config: Some(HostConfig {
            // No engine endpoint: the runtime plugs the sandbox into its network after every start
            // (`network::plug_sandbox`); until then it has loopback only.
            network_mode: Some("none".to_owned()),
            dns: Some(vec![net.gateway_addr().to_string()]),
            // The interface the runtime moves in later takes the namespace's defaults: no IPv6 on it (the
            // agent network has none; no link-local address toward the bridge).
            sysctls: Some(std::collections::HashMap::from([(
                "net.ipv6.conf.default.disable_ipv6".to_owned(),
                "1".to_owned(),
            )])),
            // Default capabilities minus NET_RAW: raw frames reach the bridge's host side otherwise. Never
            // privileged, never NET_ADMIN (E2, S1).
            cap_drop: Some(vec!["NET_RAW".to_owned()]),
            privileged: Some(false),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            nano_cpus: Some(nano_cpus),
            memory: Some(memory),
            memory_swap: Some(memory),
            pids_limit: Some(pids),
            runtime: Some(runtime),
            mounts: Some(mounts),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            }),
            init: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    };
    let options = CreateContainerOptionsBuilder::default()
        .name(&container_name(agent))
        .build();
    engine
        .docker
        .create_container(Some(options), body)
        .await
        .map_err(|e| Error::engine(format!("create the sandbox of {agent}"), e))?;
    Ok(())
}

/// The agent's resolv.conf (`nameserver <.2>`), kept in the state directory for the sandbox's lifetime.
fn write_resolv_conf(
    agent: &AgentId,
    net: &AgentNetwork,
    config: &DockerConfig,
) -> Result<std::path::PathBuf> {
    let dir = config.state_dir.join("resolv");
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let path = dir.join(format!("{agent}.conf"));
    let text = agenthold_egress::datapath::resolv_conf(net.gateway_addr());
    std::fs::write(&path, text).map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    Ok(path)
}

/// Write the boot token and the CA into the (stopped) container, for sandboxd to pick up at start.
pub(crate) async fn write_boot_files(
    engine: &Engine,
    agent: &AgentId,
    token: &str,
    ca_pem: &str,
) -> Result<()> {
    let tar = archive::pack(
        &[
            Entry {
                path: contract::relative(contract::BOOT_FILE),
                mode: contract::BOOT_FILE_MODE,
                data: token.as_bytes(),
            },
            Entry {
                path: contract::relative(contract::CA_FILE),
                mode: contract::CA_FILE_MODE,
                data: ca_pem.as_bytes(),
            },
        ],
        0o755,
    )?;
    let options = UploadToContainerOptions {
        path: "/".to_owned(),
        ..Default::default()
    };
    engine
        .docker
        .upload_to_container(&container_name(agent), Some(options), body_full(Bytes::from(tar)))
        .await
        .map_err(|e| Error::engine(format!("write the boot files of {agent}"), e))
}
