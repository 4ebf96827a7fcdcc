//! The sandbox container itself (S1, E2, E12, E14): how it is created (hardening, limits, network
//! settings, the read-only sandboxd mount) and how each start is prepared (a fresh boot token put where
//! sandboxd finds it: a host directory mounted into the sandbox, so no engine call is on the way to the
//! start; uploaded into sandboxes made before that mount).
// enforces: E2 S1

use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use agenthold_core::AgentId;
use agenthold_core::sandbox::ContainerSpec;
use agenthold_egress::datapath::{CaPaths, RESERVED_ENV, sandbox_env};
use bollard::body_full;
use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountType, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, UploadToContainerOptions,
};
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
        // The boot token: written here on the host before every start (`write_boot_token`), deleted by
        // sandboxd once read. Read-write so that the delete reaches the host.
        Mount {
            target: Some(contract::BOOT_DIR.to_owned()),
            source: Some(boot_dir(config, agent).display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(false),
            ..Default::default()
        },
        Mount {
            target: Some(contract::CA_FILE.to_owned()),
            source: Some(ca_file(config).display().to_string()),
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

/// The host directory mounted at [`contract::BOOT_DIR`] in `agent`'s sandbox.
pub(crate) fn boot_dir(config: &DockerConfig, agent: &AgentId) -> PathBuf {
    config.state_dir.join("boot").join(agent.as_str())
}

/// The host file mounted read-only at [`contract::CA_FILE`] in every sandbox.
fn ca_file(config: &DockerConfig) -> PathBuf {
    config.state_dir.join("ca.crt")
}

/// A name for a file being written in `dir` that nobody can have planted in advance (the sandbox can write
/// into its boot directory).
fn unguessable_name(dir: &Path, prefix: &str) -> Result<PathBuf> {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).map_err(|e| Error::Unavailable {
        problem: format!("the operating system's random number generator failed: {e}"),
    })?;
    Ok(dir.join(format!("{prefix}{}", hex::encode(bytes))))
}

/// Write `contents` to `path` with `mode` through a new file in the same directory renamed over it: whatever
/// was at `path` (a symlink the sandbox planted, say) is replaced, never followed, and the new file is
/// made with `O_EXCL`, which follows no link either.
fn replace_file(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let tmp = unguessable_name(dir, ".agenthold-")?;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut file| file.write_all(contents))
        .and_then(|()| std::fs::rename(&tmp, path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format!("write {}", path.display()), e)
    })
}

/// The installation's CA in [`ca_file`], written when it is missing or differs (a running sandbox keeps
/// the file it was started with; the next boot mounts the new one).
fn write_ca_file(config: &DockerConfig) -> Result<()> {
    let path = ca_file(config);
    if std::fs::read(&path).is_ok_and(|pem| pem == config.ca_pem.as_bytes()) {
        return Ok(());
    }
    std::fs::create_dir_all(&config.state_dir)
        .map_err(|e| Error::io(format!("create {}", config.state_dir.display()), e))?;
    replace_file(&path, config.ca_pem.as_bytes(), contract::CA_FILE_MODE)
}

/// Put `token` where `agent`'s sandbox reads it at its next boot: the host side of its
/// [`contract::BOOT_DIR`] (made here, mode 0700), and the CA beside all sandboxes. No engine call: the
/// sandbox can be created and started at once. The directory is the sandbox's to write in as well; the
/// token replaces whatever it put at the token's name.
pub(crate) fn write_boot_token(config: &DockerConfig, agent: &AgentId, token: &str) -> Result<()> {
    write_ca_file(config)?;
    let dir = boot_dir(config, agent);
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(format!("create {}", parent.display()), e))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // The mount's root: the sandbox cannot replace it, but it can change its mode.
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| Error::io(format!("chmod {}", dir.display()), e))?;
        }
        Err(e) => return Err(Error::io(format!("create {}", dir.display()), e)),
    }
    let name = Path::new(contract::BOOT_FILE).file_name().unwrap_or_default();
    replace_file(&dir.join(name), token.as_bytes(), contract::BOOT_FILE_MODE)
}

/// Put `token` where `agent`'s created sandbox reads it at its next boot: [`write_boot_token`] for a
/// sandbox with the boot directory mounted, an upload for one made before that mount existed.
pub(crate) async fn put_boot_token(
    engine: &Engine,
    config: &DockerConfig,
    agent: &AgentId,
    token: &str,
) -> Result<()> {
    let found = engine
        .docker
        .inspect_container(&container_name(agent), None::<InspectContainerOptions>)
        .await
        .map_err(|e| Error::engine(format!("inspect the sandbox of {agent}"), e))?;
    let mounted = found
        .mounts
        .unwrap_or_default()
        .iter()
        .any(|m| m.destination.as_deref() == Some(contract::BOOT_DIR));
    if mounted {
        write_boot_token(config, agent, token)
    } else {
        upload_legacy_boot_files(engine, agent, token, &config.ca_pem).await
    }
}

/// Write the boot token and the CA into a sandbox made before [`contract::BOOT_DIR`] existed, where the
/// sandboxd of its version reads them ([`contract::LEGACY_BOOT_FILE`]).
async fn upload_legacy_boot_files(engine: &Engine, agent: &AgentId, token: &str, ca_pem: &str) -> Result<()> {
    let tar = archive::pack(
        &[
            Entry {
                path: contract::relative(contract::LEGACY_BOOT_FILE),
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
