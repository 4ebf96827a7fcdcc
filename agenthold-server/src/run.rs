//! `agenthold run`: run one command in a fresh network namespace behind an embedded gateway.
//!
//! Layout: a sandbox namespace and a gateway namespace joined by a veth pair (`10.213.0.3` ↔ `10.213.0.2`);
//! the sandbox's default route and DNS point at the gateway; the gateway namespace is served by a
//! [`Datapath`] (the nftables ruleset and the listeners); the gateway itself ([`EgressStack`]: policy, DNS
//! forwarding, dialling) runs in this process, in the caller's namespace. The command runs in the jail ([`crate::jail`]). Namespaces (and with them the
//! veth pair and every rule) are removed when the command ends, fails, or agenthold is interrupted; a later
//! run removes what a killed one left behind.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use agenthold_core::policy::{NetworkPolicy, PolicyEntry, PolicyMode};
use agenthold_core::secret::SecretSpec;
use agenthold_core::{AgentId, Config};
use agenthold_egress::datapath::{self, CaPaths};
use agenthold_egress::gateway::{Dangerous, Gateway};
use agenthold_egress::netns::NetNs;
use agenthold_egress::nft::{AgentAttachment, Ports};
use agenthold_egress::{Attachment, CertificateAuthority, Datapath, EgressStack};
use anyhow::{Context, Result, bail};
use ipnet::Ipv4Net;
use tokio::signal::unix::{SignalKind, signal};

use crate::jail::view::{self, View};

/// The veth pair's network: the gateway at its `.2`, the sandbox at its `.3` (see [`datapath`]).
const SUBNET: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 213, 0, 0), 24);
/// Prefix of the namespaces `agenthold run` creates: `ahr-<pid>-<random>-{gw,sb}`.
const NS_PREFIX: &str = "ahr-";

/// Flags of `agenthold run`. Their names are a contract.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// Allow a destination (repeatable): `github.com`, `*.npmjs.org`, `github.com:22`, `host:*`,
    /// `203.0.113.0/24:443`, `[2001:db8::/32]:443`. Without any, the policy is open.
    #[arg(long = "allow", value_name = "ENTRY")]
    allow: Vec<String>,
    /// Let everything through, but log what the allowlist would deny.
    #[arg(long)]
    report_only: bool,
    /// Write the request log to FILE as JSON lines.
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// Data directory (CA, master key); default from the configuration.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Upstream DNS server; default from the configuration (the host's resolv.conf).
    #[arg(long, value_name = "IP:PORT")]
    dns_upstream: Option<String>,
    /// TESTS ONLY: dial IP:PORT for NAME:PORT, even though the address guard would refuse it.
    #[arg(long = "dangerous-connect-to", value_name = "NAME:PORT=IP:PORT")]
    dangerous_connect_to: Vec<String>,
    /// TESTS ONLY: trust this PEM certificate for upstream TLS, in addition to the system's roots.
    #[arg(long, value_name = "PEM")]
    dangerous_upstream_ca: Option<PathBuf>,
    /// Secrets to inject (YAML list; see docs/secrets.md). The command sees placeholders only.
    #[arg(long, value_name = "FILE")]
    secrets: Option<PathBuf>,
    /// Show your home directory to the command, read through a private layer: it reads your files,
    /// its changes there are discarded when it ends. Default: an empty home of its own.
    #[arg(long)]
    share_home: bool,
    /// The command to run and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "COMMAND"
    )]
    command: Vec<String>,
}

/// Parse `NAME:PORT=IP:PORT`.
pub(crate) fn parse_connect_to(spec: &str) -> Result<(String, u16, SocketAddr)> {
    let (from, to) = spec
        .split_once('=')
        .with_context(|| format!("{spec:?}: expected NAME:PORT=IP:PORT"))?;
    let (name, port) = from
        .rsplit_once(':')
        .with_context(|| format!("{spec:?}: {from:?} has no port"))?;
    let port: u16 = port
        .parse()
        .with_context(|| format!("{spec:?}: bad port {port:?}"))?;
    let to: SocketAddr = to
        .parse()
        .with_context(|| format!("{spec:?}: {to:?} is not IP:PORT"))?;
    let name = agenthold_core::policy::normalize_name(name).with_context(|| format!("{spec:?}"))?;
    Ok((name, port, to))
}

/// Parse `IP:PORT` or `IP` (port 53).
fn parse_dns_upstream(s: &str) -> Result<SocketAddr> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .with_context(|| format!("--dns-upstream {s:?}: expected IP:PORT"))
}

/// Everything checked before touching the system.
struct Plan {
    policy: NetworkPolicy,
    secrets: Vec<SecretSpec>,
    dangerous: Dangerous,
    config: Config,
    data_dir: PathBuf,
    dns_upstream: SocketAddr,
    /// What the command sees (R2, R3).
    view: View,
    /// The `--log` file, resolved.
    log: Option<PathBuf>,
}

fn plan(args: &RunArgs) -> Result<Plan> {
    let entries: Vec<PolicyEntry> = args
        .allow
        .iter()
        .map(|e| PolicyEntry::parse(e))
        .collect::<Result<_, _>>()?;
    let mode = match (entries.is_empty(), args.report_only) {
        (true, false) => PolicyMode::Open,
        (_, true) => PolicyMode::ReportOnly,
        (false, false) => PolicyMode::Allowlist,
    };
    let connect_to = args
        .dangerous_connect_to
        .iter()
        .map(|s| parse_connect_to(s))
        .collect::<Result<_>>()?;
    let upstream_ca_pem = match &args.dangerous_upstream_ca {
        Some(p) => {
            Some(std::fs::read(p).with_context(|| format!("--dangerous-upstream-ca {}", p.display()))?)
        }
        None => None,
    };
    let config = Config::load(None)?;
    let data_dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => config.data_dir()?,
    };
    let (view, log) = plan_view(args, &config, &data_dir)?;
    let secrets = match &args.secrets {
        Some(path) => crate::secrets_file::load(path)?,
        None => Vec::new(),
    };
    let dns_upstream = match &args.dns_upstream {
        Some(s) => parse_dns_upstream(s)?,
        None => config.egress.dns_upstream()?,
    };
    Ok(Plan {
        policy: NetworkPolicy { mode, entries },
        secrets,
        dangerous: Dangerous {
            connect_to,
            upstream_ca_pem,
        },
        config,
        data_dir,
        dns_upstream,
        view,
        log,
    })
}

/// The jail's view of this run: the working directory, the homes, and everything agenthold keeps to
/// itself: the run's data directory, the installation's (from the configuration and its `AGENTHOLD_*`
/// variables, and root's default), the master key file, the secrets file and the log.
fn plan_view(args: &RunArgs, config: &Config, data_dir: &Path) -> Result<(View, Option<PathBuf>)> {
    let cwd = std::env::current_dir()
        .and_then(std::fs::canonicalize)
        .context("the working directory")?;
    let mut own = vec![("--data-dir", data_dir.to_path_buf())];
    own.extend(args.secrets.clone().map(|s| ("--secrets", s)));
    let mut installation = vec![PathBuf::from("/var/lib/agenthold")];
    installation.extend(config.data_dir().ok());
    installation.extend(config.master_key_file().ok());
    let inputs = view::Inputs {
        cwd,
        user: sudo_caller(),
        share_home: args.share_home,
        own,
        log: args.log.clone(),
        installation,
        expose: args.dangerous_upstream_ca.iter().cloned().collect(),
    };
    Ok(View::plan(inputs)?)
}

/// Run the command; returns its exit code (128 + signal when killed by a signal).
pub(crate) fn run(args: &RunArgs) -> Result<i32> {
    let plan = match plan(args) {
        Ok(p) => p,
        Err(e) => {
            // Bad input is the caller's to fix: exit 2, like a usage error.
            eprintln!("agenthold run: {e:#}");
            return Ok(2);
        }
    };
    if !nix::unistd::geteuid().is_root() {
        bail!("agenthold run needs root (it creates network namespaces and nftables rules); try sudo");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(run_async(args, plan))
}

async fn run_async(args: &RunArgs, plan: Plan) -> Result<i32> {
    // Signals are caught from the first step on: an interrupted setup still removes what it made (the
    // setup future owns the namespaces, and dropping it deletes them).
    let mut signals = Signals::install()?;
    let prepared = tokio::select! {
        prepared = prepare(plan) => prepared?,
        signal = signals.next() => return Ok(128 + signal as i32),
    };
    let status = run_jailed(&prepared, &args.command, &mut signals).await?;
    let Prepared {
        net,
        gateway,
        attachment,
        log_writer,
        files,
        ..
    } = prepared;
    // The run's files (resolv.conf, CA bundle, the jail's empty mount point) are no longer needed.
    if let Err(e) = std::fs::remove_dir_all(&files) {
        tracing::warn!(error = %e, dir = %files.display(), "could not remove the run's files");
    }

    // Let connections the command left open close and get logged, then stop.
    tokio::time::sleep(Duration::from_millis(100)).await;
    gateway.shutdown(Duration::from_secs(2)).await;
    // The last references to the gateway: the log writer ends when it is gone.
    if let Err(e) = attachment.close().await {
        tracing::warn!(error = %e, "could not remove the run's rules (its namespaces go anyway)");
    }
    drop(gateway);
    if let Some(writer) = log_writer {
        writer.await.context("log writer")??;
    }
    drop(net);
    Ok(exit_code(status))
}

/// Everything set up for the command.
struct Prepared {
    net: RunNet,
    gateway: Arc<Gateway>,
    /// The command's agent served in the gateway namespace (holds the datapath).
    attachment: Attachment,
    log_writer: Option<tokio::task::JoinHandle<Result<()>>>,
    /// The run's own directory (under the data directory's `run/`).
    files: PathBuf,
    resolv: PathBuf,
    bundle: PathBuf,
    ca_cert: PathBuf,
    env: BTreeMap<String, String>,
    /// What the command sees.
    view: View,
    /// The secret values, to keep them out of the command's environment.
    secret_values: Vec<Vec<u8>>,
}

/// Namespaces, rules, gateway, files and environment of one run.
async fn prepare(plan: Plan) -> Result<Prepared> {
    remove_stale_namespaces();
    let run_dir = plan.data_dir.join("run");
    std::fs::create_dir_all(&run_dir).with_context(|| format!("create {}", run_dir.display()))?;
    let net = RunNet::create()?;

    let agent = AgentId::new("run").context("agent id")?;
    let egress = EgressStack::builder(&plan.config.egress, &plan.data_dir)
        .dns_upstream(plan.dns_upstream)
        .dangerous(plan.dangerous)
        .build()?;
    let (Some(policies), Some(secrets)) = (egress.policy.table(), egress.injector.table()) else {
        anyhow::bail!("the gateway's default tables are missing");
    };
    policies.set(agent.clone(), plan.policy);
    let secret_values: Vec<Vec<u8>> = plan.secrets.iter().map(|s| s.value.expose().to_vec()).collect();
    let placeholders = secrets.set(&agent, plan.secrets);
    let gateway = egress.gateway;
    let log_writer = match &plan.log {
        Some(path) => Some(crate::log_file::spawn_writer(path, gateway.log().subscribe())?),
        None => None,
    };
    // No tunnel: there is no sandboxd in the jail.
    let ports = Ports::from_config(&plan.config.egress).without_tunnel();
    let datapath = Datapath::new(net.gateway.clone(), ports, Arc::clone(&gateway)).await?;
    let attachment = datapath
        .attach(&agent, AgentAttachment::on_subnet(&net.gateway_iface, SUBNET))
        .await?;

    let files = net.dir(&run_dir)?;
    let resolv = files.join("resolv.conf");
    std::fs::write(&resolv, attachment.resolv_conf())
        .with_context(|| format!("write {}", resolv.display()))?;
    let (bundle, ca_cert) = write_ca_files(&files, &egress.ca)?;
    // Inside the jail the CA files are copied to its private /run, readable by the unprivileged user the
    // command runs as (the data directory may not be).
    let mut env = attachment.env(&CaPaths::new(
        crate::jail::JAIL_CA_CERT,
        crate::jail::JAIL_CA_BUNDLE,
    ));
    for p in placeholders {
        if let Some(var) = p.env {
            env.insert(var, p.placeholder);
        }
    }
    // The command runs as the sudo caller: its home, not root's (which sudo leaves in $HOME).
    if let (Some(_), Some(home)) = (plan.view.user, &plan.view.home) {
        env.insert("HOME".to_owned(), home.display().to_string());
    }
    let staging = files.join("jail");
    std::fs::create_dir(&staging).with_context(|| format!("create {}", staging.display()))?;
    Ok(Prepared {
        net,
        gateway,
        attachment,
        log_writer,
        files,
        resolv,
        bundle,
        ca_cert,
        env,
        view: plan.view,
        secret_values,
    })
}

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT, caught for the whole run (so that agenthold always cleans up
/// and gives the caller's terminal its modes back).
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt()).context("catch SIGINT")?,
            term: signal(SignalKind::terminate()).context("catch SIGTERM")?,
            hup: signal(SignalKind::hangup()).context("catch SIGHUP")?,
            quit: signal(SignalKind::quit()).context("catch SIGQUIT")?,
        })
    }

    async fn next(&mut self) -> nix::sys::signal::Signal {
        use nix::sys::signal::Signal;
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
        }
    }
}

/// The system's roots plus the installation's CA, and the CA alone, for the command to trust: the paths
/// of the bundle and of the CA.
fn write_ca_files(dir: &Path, ca: &CertificateAuthority) -> Result<(PathBuf, PathBuf)> {
    let mut bundle = std::fs::read(SYSTEM_BUNDLE).unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(ca.cert_pem().as_bytes());
    let bundle_path = dir.join("ca-bundle.pem");
    std::fs::write(&bundle_path, bundle).with_context(|| format!("write {}", bundle_path.display()))?;
    let cert_path = dir.join("ca.crt");
    std::fs::write(&cert_path, ca.cert_pem()).with_context(|| format!("write {}", cert_path.display()))?;
    Ok((bundle_path, cert_path))
}

/// Where Debian-family systems keep the trust store the jail replaces with the bundle.
pub(crate) const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Run `command` in the jail with `env` added; forward SIGINT, SIGTERM, SIGHUP and SIGQUIT to it. When
/// stdin is a terminal, it goes into raw mode for the jail's relayed pty until the jail ends.
async fn run_jailed(prepared: &Prepared, command: &[String], signals: &mut Signals) -> Result<ExitStatus> {
    let exe = std::env::current_exe().context("find the agenthold executable")?;
    let view = &prepared.view;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("__jail")
        .arg("--netns")
        .arg(prepared.net.sandbox.path())
        .arg("--resolv")
        .arg(&prepared.resolv)
        .arg("--ca-bundle")
        .arg(&prepared.bundle)
        .arg("--ca-cert")
        .arg(&prepared.ca_cert)
        .arg("--root")
        .arg(prepared.files.join("jail"))
        .arg("--cwd")
        .arg(&view.cwd);
    if let Some(home) = &view.home {
        cmd.arg("--home").arg(home);
    }
    if view.share_home {
        cmd.arg("--share-home");
    }
    for (flag, paths) in [
        ("--private-dir", &view.private_dirs),
        ("--hide", &view.existing_hidden()),
        ("--expose", &view.expose),
    ] {
        for path in paths {
            cmd.arg(flag).arg(path);
        }
    }
    if let Some((uid, gid)) = view.user {
        cmd.arg("--uid")
            .arg(uid.to_string())
            .arg("--gid")
            .arg(gid.to_string());
    }
    // The command gets this process's environment minus anything that carries a secret (a `value_env`
    // source, the master key), plus the datapath's variables.
    cmd.env_clear();
    for (key, value) in std::env::vars_os() {
        let carries_secret = prepared
            .secret_values
            .iter()
            .any(|s| s.len() >= 4 && contains(value.as_encoded_bytes(), s));
        if key != "AGENTHOLD_MASTER_KEY" && !carries_secret {
            cmd.env(key, value);
        }
    }
    // Raw mode from here until this function returns (also through `?`): the jail's pty does the line
    // discipline.
    let terminal = crate::jail::RawTerminal::enter();
    if terminal.is_some() {
        cmd.arg("--tty");
    }
    cmd.arg("--").args(command).envs(&prepared.env).kill_on_drop(true);
    let mut child = cmd.spawn().context("start the jailed command")?;
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(nix::unistd::Pid::from_raw);
    loop {
        let forward = tokio::select! {
            status = child.wait() => return status.context("wait for the command"),
            signal = signals.next() => signal,
        };
        if let Some(pid) = pid {
            let _ = nix::sys::signal::kill(pid, forward);
        }
    }
}

/// Whether `haystack` contains `needle`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The user behind sudo, if agenthold was started through it.
fn sudo_caller() -> Option<(u32, u32)> {
    let uid: u32 = std::env::var("SUDO_UID").ok()?.parse().ok()?;
    let gid: u32 = std::env::var("SUDO_GID").ok()?.parse().ok()?;
    (uid != 0).then_some((uid, gid))
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// The pair of namespaces of one run. Dropping it deletes both (the veth pair and the rules go with them).
struct RunNet {
    gateway: NetNs,
    sandbox: NetNs,
    gateway_iface: String,
    base: String,
}

impl RunNet {
    fn create() -> Result<Self> {
        let tag = random_tag();
        let base = format!("{NS_PREFIX}{}-{tag}", std::process::id());
        let gateway = NetNs::create(&format!("{base}-gw"))?;
        let sandbox = match NetNs::create(&format!("{base}-sb")) {
            Ok(ns) => ns,
            Err(e) => {
                let _ = gateway.delete();
                return Err(e.into());
            }
        };
        let net = Self {
            gateway,
            sandbox,
            gateway_iface: format!("ahg{tag}"),
            base,
        };
        let sandbox_iface = format!("ahs{tag}");
        net.gateway
            .veth_pair(&net.gateway_iface, &net.sandbox, &sandbox_iface)?;
        net.gateway.link_up("lo")?;
        net.sandbox.link_up("lo")?;
        let (gateway_addr, sandbox_addr) = (datapath::gateway_addr(SUBNET), datapath::sandbox_addr(SUBNET));
        let on_subnet = |addr| Ipv4Net::new(addr, SUBNET.prefix_len()).map(ipnet::IpNet::V4);
        net.gateway
            .add_address(&net.gateway_iface, on_subnet(gateway_addr)?)?;
        net.sandbox
            .add_address(&sandbox_iface, on_subnet(sandbox_addr)?)?;
        net.gateway.link_up(&net.gateway_iface)?;
        net.sandbox.link_up(&sandbox_iface)?;
        net.sandbox.add_default_route(gateway_addr.into())?;
        // The sandbox is IPv4-only: the gateway's resolver answers A records only.
        net.sandbox.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        net.sandbox.sysctl("net.ipv6.conf.default.disable_ipv6", "1")?;
        Ok(net)
    }

    /// A private folder for this run's files under `run_dir`.
    fn dir(&self, run_dir: &Path) -> Result<PathBuf> {
        let dir = run_dir.join(&self.base);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(dir)
    }
}

impl Drop for RunNet {
    fn drop(&mut self) {
        for ns in [&self.sandbox, &self.gateway] {
            if let Err(e) = ns.delete() {
                tracing::warn!(error = %e, "could not remove a namespace");
            }
        }
    }
}

/// Six random lower-case characters for names (interface names are limited to 15 bytes).
fn random_tag() -> String {
    let id = AgentId::random();
    id.as_str()[..6].to_owned()
}

/// Remove namespaces left by runs whose process no longer exists (killed with SIGKILL).
fn remove_stale_namespaces() {
    let Ok(dir) = std::fs::read_dir("/var/run/netns") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = NetNs::named(&name).delete();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_to_specs() {
        let (n, p, a) = parse_connect_to("API.example.test:443=127.0.0.1:8443").unwrap();
        assert_eq!(
            (n.as_str(), p, a),
            ("api.example.test", 443, "127.0.0.1:8443".parse().unwrap())
        );
        for bad in [
            "x",
            "a.test=1.2.3.4:1",
            "a.test:x=1.2.3.4:1",
            "a.test:1=1.2.3.4",
            "a b:1=1.2.3.4:5",
        ] {
            assert!(parse_connect_to(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dns_upstream_forms() {
        assert_eq!(
            parse_dns_upstream("127.0.0.1:5353").unwrap(),
            "127.0.0.1:5353".parse().unwrap()
        );
        assert_eq!(
            parse_dns_upstream("10.0.0.1").unwrap(),
            "10.0.0.1:53".parse().unwrap()
        );
        assert!(parse_dns_upstream("dns.example").is_err());
    }
}
