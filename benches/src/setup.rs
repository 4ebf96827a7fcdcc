//! The benchmark's world, built the way the integration tests build theirs: a [`TestNet`] whose gateway
//! namespace is served by a real [`Datapath`] (the nftables rules, the listeners at the `.2`) and a real
//! [`Gateway`], a second [`TestNet`] without any rules
//! for the "direct over veth" path, and one set of upstreams (HTTP, HTTPS, DNS) answering on loopback and
//! inside the direct namespace.
//!
//! ```text
//! direct (lo):   client (host ns) ──lo──────────────────────────────────▶ upstream 127.0.0.1
//! direct (veth): client (direct sandbox) ──veth──▶ upstream 10.213.M.2 (same code, same runtime)
//! gateway:       client (sandbox) ──veth──▶ nft dnat ▶ gateway ──lo──▶ upstream 127.0.0.1
//! ```
//!
//! The gateway reaches the loopback upstream by name only through `Dangerous::connect_to` (the address
//! guard refuses loopback otherwise); the sandbox learns `bench.test` from the gateway's own DNS as a
//! synthetic address that routes through the gateway.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use agenthold_core::AgentId;
use agenthold_core::policy::{NetworkPolicy, PolicyMode, PolicyTable};
use agenthold_core::secret::SecretInjector;
use agenthold_egress::dns::DnsLimits;
use agenthold_egress::netns::NetNs;
use agenthold_egress::nft::Ports;
use agenthold_egress::{Attachment, CertificateAuthority, Dangerous, Datapath, Gateway};
use agenthold_testsupport::{TestCa, TestNet};
use anyhow::{Context, Result, bail};
use tokio::runtime::Runtime;

use crate::load;
use crate::report::Route;
use crate::upstream;

/// The name every client asks for (SNI, `Host`, DNS).
pub const NAME: &str = "bench.test";

/// Where a client on one route sends each kind of traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoints {
    /// HTTPS (the bulk download and new TLS connections).
    pub tls: SocketAddr,
    /// Plain HTTP.
    pub http: SocketAddr,
    /// DNS over UDP.
    pub dns: SocketAddr,
    /// The raw bulk protocol (neither TLS nor HTTP), see [`upstream::serve_raw`].
    pub raw: SocketAddr,
}

/// The port a sandbox uses for the raw bulk protocol (any port but 80 and 443 is "other TCP").
pub const RAW_PORT: u16 = 9000;

/// What [`Env::start_with`] adds to the world [`Env::start`] builds.
#[derive(Default)]
pub struct Options {
    /// TLS interception (issue 4): the gateway gets this injector and CA, so it terminates TLS for the
    /// hosts the injector names for [`Env::agent`], and it trusts the upstreams' test CA (what
    /// `Dangerous::upstream_ca_pem` is for). Without it the gateway has neither and splices every TLS
    /// connection.
    pub intercept: Option<Intercept>,
    /// More `(name, port, address)` mappings for the gateway (`Dangerous::connect_to`): another upstream
    /// the sandbox reaches by name through the gateway, besides [`NAME`]'s.
    pub connect_to: Vec<(String, u16, SocketAddr)>,
    /// More PEM trust anchors for the gateway's upstream TLS (with [`Options::intercept`]): the CA of such
    /// another upstream.
    pub upstream_ca_pem: Option<String>,
}

/// The pieces of a gateway that intercepts (see [`Options::intercept`]).
pub struct Intercept {
    /// Decides which hosts are intercepted and injects the secrets (a `SecretTable`, say).
    pub injector: Arc<dyn SecretInjector>,
    /// Signs the leaf certificates the sandbox sees for intercepted hosts.
    pub ca: Arc<CertificateAuthority>,
}

/// Everything a run needs; [`Env::close`] takes it down again.
pub struct Env {
    upstream_rt: Runtime,
    gateway_rt: Runtime,
    gateway: Option<Arc<Gateway>>,
    /// The benchmark's agent in the gateway namespace.
    attachment: Option<Attachment>,
    gateway_net: Option<TestNet>,
    direct_net: Option<TestNet>,
    lo: Endpoints,
    veth: Endpoints,
    through: Endpoints,
    explicit: SocketAddr,
    agent: AgentId,
    ca_file: tempfile::NamedTempFile,
    client_tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("lo", &self.lo)
            .field("veth", &self.veth)
            .field("gateway", &self.through)
            .finish_non_exhaustive()
    }
}

/// Worker threads of the gateway's runtime: what `agenthold run` uses.
const GATEWAY_WORKERS: usize = 2;
/// Worker threads of the upstreams' runtime.
const UPSTREAM_WORKERS: usize = 2;

impl Env {
    /// Creates the namespaces, rules, upstreams and gateway, and resolves [`NAME`] through the gateway.
    /// Needs root.
    ///
    /// # Errors
    /// Any setup step that fails, with what it was doing.
    pub fn start() -> Result<Self> {
        Self::start_with(Options::default())
    }

    /// As [`Env::start`], with the additions `options` asks for.
    ///
    /// # Errors
    /// Any setup step that fails, with what it was doing.
    pub fn start_with(options: Options) -> Result<Self> {
        if !nix_is_root() {
            bail!("needs root (network namespaces, nftables): run `cargo bench` as root or via sudo -E");
        }
        let runtime = crate::harness::runtime;
        let upstream_rt = runtime("upstream", UPSTREAM_WORKERS)?;
        let gateway_rt = runtime("gateway", GATEWAY_WORKERS)?;
        let gateway_net = TestNet::new();
        let direct_net = TestNet::new();

        // Upstreams: one TLS certificate, the same servers on loopback and in the direct namespace.
        let ca = TestCa::new();
        let acceptor = upstream::tls_acceptor(&ca, &[NAME])?;
        let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let veth_addr = SocketAddr::from((direct_net.gateway_addr(), 0));
        let direct_ns = direct_net.gateway();
        let (lo, veth) = {
            let _rt = upstream_rt.enter();
            let lo = Endpoints {
                tls: upstream::serve_http(std::net::TcpListener::bind(loopback)?, Some(acceptor.clone()))?,
                http: upstream::serve_http(std::net::TcpListener::bind(loopback)?, None)?,
                dns: upstream::serve_dns(std::net::UdpSocket::bind(loopback)?)?,
                raw: upstream::serve_raw(std::net::TcpListener::bind(loopback)?)?,
            };
            let veth = Endpoints {
                tls: upstream::serve_http(direct_ns.bind_tcp(veth_addr)?, Some(acceptor))?,
                http: upstream::serve_http(direct_ns.bind_tcp(veth_addr)?, None)?,
                dns: upstream::serve_dns(direct_ns.bind_udp(veth_addr)?)?,
                raw: upstream::serve_raw(direct_ns.bind_tcp(veth_addr)?)?,
            };
            (lo, veth)
        };

        // The gateway, as `agenthold run` sets it up, with an allowlist covering the benchmark's names.
        let ports = Ports::default().without_tunnel();
        let gw_addr = gateway_net.gateway_addr();
        let agent = AgentId::new("bench")?;
        let policies = Arc::new(PolicyTable::new());
        let entries = [format!("{NAME}:*"), format!("*.{NAME}")];
        policies.set(
            agent.clone(),
            NetworkPolicy::parse(PolicyMode::Allowlist, &entries)?,
        );
        let gateway = {
            let _rt = gateway_rt.enter();
            let upstream_ca_pem = options.intercept.as_ref().map(|_| {
                let mut pem = ca.pem();
                pem.push('\n');
                pem.push_str(options.upstream_ca_pem.as_deref().unwrap_or_default());
                pem.into_bytes()
            });
            let mut connect_to = vec![
                (NAME.into(), 443, lo.tls),
                (NAME.into(), 80, lo.http),
                (NAME.into(), RAW_PORT, lo.raw),
            ];
            connect_to.extend(options.connect_to);
            let mut builder = Gateway::builder()
                .policy(policies)
                .dns_upstream(lo.dns)
                // The DNS benchmark measures the resolver, not its per-agent budget (200 queries/s by
                // default): lift the budget far above anything one machine sends.
                .dns_limits(DnsLimits {
                    agent_qps: 10_000_000,
                    agent_burst: 10_000_000,
                    gateway_qps: 10_000_000,
                    gateway_burst: 10_000_000,
                    gateway_reserve: 0,
                })
                .dangerous(Dangerous {
                    connect_to,
                    upstream_ca_pem,
                });
            if let Some(intercept) = options.intercept {
                builder = builder
                    .injector(intercept.injector)
                    .certificate_authority(intercept.ca);
            }
            Arc::new(builder.build()?)
        };
        let attachment = gateway_rt.block_on(async {
            let datapath = Datapath::new(gateway_net.gateway().clone(), ports, Arc::clone(&gateway)).await?;
            datapath.attach(&agent, gateway_net.agent(0).attachment()).await
        })?;

        // The sandbox learns the name from the gateway's resolver (port 53 of any address is redirected).
        let resolver = SocketAddr::from((gw_addr, 53));
        let synthetic = load::in_namespace(Some(gateway_net.sandbox()), || load::resolve_a(resolver, NAME))
            .context("resolve the benchmark name through the gateway")?;
        let through = Endpoints {
            tls: SocketAddr::from((synthetic, 443)),
            http: SocketAddr::from((synthetic, 80)),
            dns: resolver,
            raw: SocketAddr::from((synthetic, RAW_PORT)),
        };
        let explicit = attachment.explicit_proxy();

        let mut ca_file = tempfile::NamedTempFile::new()?;
        std::io::Write::write_all(&mut ca_file, ca.pem().as_bytes())?;
        let client_tls = load::tls_client_config(&ca);
        Ok(Self {
            upstream_rt,
            gateway_rt,
            gateway: Some(gateway),
            attachment: Some(attachment),
            gateway_net: Some(gateway_net),
            direct_net: Some(direct_net),
            lo,
            veth,
            through,
            explicit,
            agent,
            ca_file,
            client_tls,
        })
    }

    /// The namespace a client on `route` runs in (`None`: this process's).
    pub fn client_ns(&self, route: Route) -> Option<&NetNs> {
        match route {
            Route::DirectLoopback => None,
            Route::DirectVeth => self.direct_net.as_ref().map(TestNet::sandbox),
            Route::Gateway => self.gateway_net.as_ref().map(TestNet::sandbox),
        }
    }

    /// Where a client on `route` connects.
    pub fn endpoints(&self, route: Route) -> Endpoints {
        match route {
            Route::DirectLoopback => self.lo,
            Route::DirectVeth => self.veth,
            Route::Gateway => self.through,
        }
    }

    /// The namespace the direct (veth) route's upstreams run in, across the veth pair from its client.
    pub fn direct_upstream_ns(&self) -> Option<&NetNs> {
        self.direct_net.as_ref().map(TestNet::gateway)
    }

    /// The agent the gateway serves the sandbox as (for its secrets, its request log).
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }

    /// The gateway's explicit proxy, as the sandbox reaches it (`HTTP_PROXY`).
    pub fn explicit_proxy(&self) -> SocketAddr {
        self.explicit
    }

    /// The test CA's certificate as a PEM file (for curl's `--cacert`).
    pub fn ca_pem_path(&self) -> &std::path::Path {
        self.ca_file.path()
    }

    /// A rustls client configuration trusting the test CA, without session resumption.
    pub fn client_tls(&self) -> Arc<rustls::ClientConfig> {
        Arc::clone(&self.client_tls)
    }

    /// The gateway's request log entries still kept for the benchmark's agent (the newest 5000): proof
    /// that traffic went through it, and what it denied or failed.
    pub fn gateway_log(&self) -> Vec<agenthold_egress::log::LogEntry> {
        self.gateway
            .as_ref()
            .map_or_else(Vec::new, |g| g.log().snapshot(&self.agent))
    }

    /// Stops the gateway and the upstreams and deletes the namespaces.
    pub fn close(mut self) {
        if let Some(gateway) = self.gateway.take() {
            self.gateway_rt.block_on(gateway.shutdown(Duration::from_secs(2)));
        }
        if let Some(attachment) = self.attachment.take()
            && let Err(e) = self.gateway_rt.block_on(attachment.close())
        {
            tracing::warn!(error = %e, "could not remove the benchmark's rules (its namespaces go anyway)");
        }
        let Self {
            upstream_rt,
            gateway_rt,
            gateway_net,
            direct_net,
            ..
        } = self;
        // Sockets inside the namespaces close with the runtimes that own them.
        upstream_rt.shutdown_timeout(Duration::from_secs(2));
        gateway_rt.shutdown_timeout(Duration::from_secs(2));
        for net in [gateway_net, direct_net].into_iter().flatten() {
            net.close();
        }
    }
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}
