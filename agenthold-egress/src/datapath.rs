//! The one composition of "serve agents inside a network namespace" (E3): a [`Datapath`] owns a gateway
//! namespace's nftables ruleset, and per agent its listeners (bound at the agent's gateway address, the `.2`,
//! inside that namespace) and its attachment to the [`Gateway`]; [`sandbox_env`] is the one environment a
//! sandbox gets (proxy and CA variables, E14).
//!
//! Everything that serves an agent goes through here: the Docker runtime (one gateway holder namespace, an
//! agent network per agent), `agenthold run` (a namespace pair of its own), the benchmarks and the tests.
//!
//! # Order and strictness
//! [`Datapath::new`] hardens the namespace (no forwarding, strict reverse-path filtering, no IPv6; see
//! [`nft::harden`]) and installs a ruleset that accepts nothing but loopback. [`Datapath::attach`] then, for
//! one agent, in an order that never opens the datapath: the ruleset with the agent's interface (its DNS and
//! TCP redirected to its own `.2`, the redirect ports accepting only `ct status dnat`, sources checked
//! against its subnet and the arrival interface), then its listeners bound at exactly its `.2` (never
//! `0.0.0.0`: the listener an agent reaches is its identity), then [`Gateway::attach`]. Detaching reverses
//! it: the gateway stops serving the agent (its open connections close), then the ruleset is installed
//! again without it. The whole table is replaced in one nft transaction every time, serialised, so the
//! rules in force always match the agents attached at the moment they were written.
//!
//! # A namespace you made yourself
//! Any process in a network namespace can be served, Docker or not: make the namespace, join it to the
//! gateway namespace with an interface there (a veth pair, say) whose address is the `.2` of a subnet, give
//! the sandbox side an address on the same subnet and its default route via the `.2`, and hand the gateway
//! side to the datapath:
//!
//! ```no_run
//! # async fn example(gateway: std::sync::Arc<agenthold_egress::Gateway>) -> agenthold_egress::Result<()> {
//! use agenthold_core::AgentId;
//! use agenthold_egress::datapath::{self, CaPaths, Datapath};
//! use agenthold_egress::netns::NetNs;
//! use agenthold_egress::nft::Ports;
//!
//! // The gateway namespace, and in it an interface holding 10.20.0.2/24 (the sandbox side holds 10.20.0.3/24,
//! // its default route via 10.20.0.2).
//! let dp = Datapath::new(NetNs::named("my-gateway"), Ports::default(), gateway).await?;
//! let agent = AgentId::new("worker-1")?;
//! let attached = dp.attach_at(&agent, "10.20.0.2/24".parse().expect("an address")).await?;
//! // Or by interface and subnet, the gateway at the subnet's `.2`:
//! // dp.attach(&agent, nft::AgentAttachment::on_subnet("veth-gw", "10.20.0.0/24".parse()?)).await?;
//! assert_eq!(attached.gateway_addr(), datapath::gateway_addr("10.20.0.0/24".parse().expect("a net")));
//! // What to start the sandboxed process with: the proxy and the CA variables.
//! let env = attached.env(&CaPaths::new("/etc/my-sandbox/ca.crt", "/etc/my-sandbox/ca-bundle.pem"));
//! # let _ = env;
//! // … run the process in its namespace with `env` …
//! attached.close().await?; // or drop it: its listeners close and its rules go
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use agenthold_core::AgentId;
use agenthold_core::config::EgressConfig;
use ipnet::Ipv4Net;
use tokio_util::sync::CancellationToken;

use crate::gateway::{AgentSockets, Gateway};
use crate::netns::NetNs;
use crate::nft::{self, AgentAttachment, GatewayRules, Ports};
use crate::{Error, Result};

/// The host number of the gateway's address on every agent network (`.2`): the sandboxes' default route,
/// DNS server and explicit proxy. (`.1` is left to whatever made the network, a Docker bridge say.)
pub const GATEWAY_HOST: u32 = 2;
/// The host number of the sandbox's address on a network that serves one sandbox and whose addresses the
/// caller picks (`.3`; Docker assigns its own).
pub const SANDBOX_HOST: u32 = 3;

/// The gateway's address on `subnet` (its [`GATEWAY_HOST`]th address).
#[must_use]
pub fn gateway_addr(subnet: Ipv4Net) -> Ipv4Addr {
    host(subnet, GATEWAY_HOST)
}

/// The sandbox's address on `subnet` when the caller picks it (its [`SANDBOX_HOST`]th address).
#[must_use]
pub fn sandbox_addr(subnet: Ipv4Net) -> Ipv4Addr {
    host(subnet, SANDBOX_HOST)
}

fn host(subnet: Ipv4Net, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).saturating_add(n))
}

impl AgentAttachment {
    /// The agent network `subnet` on the gateway-side interface `iface`, with the gateway at the subnet's
    /// `.2` ([`gateway_addr`]).
    #[must_use]
    pub fn on_subnet(iface: impl Into<String>, subnet: Ipv4Net) -> Self {
        Self {
            iface: iface.into(),
            gateway_addr: gateway_addr(subnet),
            subnet: subnet.trunc(),
        }
    }
}

impl Ports {
    /// The ports of the `egress` configuration (`egress.proxy_port`, `explicit_port`, `dns_port`,
    /// `tunnel_port`). A deployment without a tunnel takes [`Ports::without_tunnel`].
    #[must_use]
    pub fn from_config(egress: &EgressConfig) -> Self {
        Self {
            proxy: egress.proxy_port,
            explicit: egress.explicit_port,
            dns: egress.dns_port,
            tunnel: Some(egress.tunnel_port),
        }
    }

    /// The same ports without the tunnel's (it is then neither bound nor reachable).
    #[must_use]
    pub fn without_tunnel(self) -> Self {
        Self { tunnel: None, ..self }
    }
}

/// What a variable of a sandbox's environment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvValue {
    /// `http://<.2>:<explicit port>`: the explicit proxy.
    Proxy,
    /// [`NO_PROXY`]: what never goes through the proxy. The only kind a sandbox's own configuration may
    /// replace (it may know more local names).
    NoProxy,
    /// The bundle (the image's system roots plus the installation's CA), for variables that *replace* a
    /// client's trust store: pointing them at the CA alone would break every other host.
    CaBundle,
    /// The installation's CA alone, for variables that *add* to a client's own roots.
    CaCert,
}

/// Hosts that never go through the proxy (`NO_PROXY`, `no_proxy`): the sandbox's own loopback.
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// The sandbox environment contract: every variable [`sandbox_env`] sets and what it holds. Both spellings
/// of the proxy variables, because clients disagree (curl reads `http_proxy` only in lower case, Go and
/// Python read both).
pub const SANDBOX_ENV: [(&str, EnvValue); 12] = [
    ("HTTPS_PROXY", EnvValue::Proxy),
    ("HTTP_PROXY", EnvValue::Proxy),
    ("https_proxy", EnvValue::Proxy),
    ("http_proxy", EnvValue::Proxy),
    ("NO_PROXY", EnvValue::NoProxy),
    ("no_proxy", EnvValue::NoProxy),
    // OpenSSL's default CA file: Python's ssl (and httpx, urllib), Ruby, Go's crypto/x509, rustls-native-certs.
    ("SSL_CERT_FILE", EnvValue::CaBundle),
    // Python requests (and pip) use it instead of certifi's bundle.
    ("REQUESTS_CA_BUNDLE", EnvValue::CaBundle),
    // curl's CA bundle; requests reads it too.
    ("CURL_CA_BUNDLE", EnvValue::CaBundle),
    // git's `http.sslCAInfo`.
    ("GIT_SSL_CAINFO", EnvValue::CaBundle),
    // The AWS CLI and SDKs.
    ("AWS_CA_BUNDLE", EnvValue::CaBundle),
    // Node adds these certificates to its bundled roots.
    ("NODE_EXTRA_CA_CERTS", EnvValue::CaCert),
];

const fn reserved_count() -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < SANDBOX_ENV.len() {
        if !matches!(SANDBOX_ENV[i].1, EnvValue::NoProxy) {
            n += 1;
        }
        i += 1;
    }
    n
}

const fn reserved() -> [&'static str; reserved_count()] {
    let mut out = [""; reserved_count()];
    let (mut i, mut n) = (0, 0);
    while i < SANDBOX_ENV.len() {
        if !matches!(SANDBOX_ENV[i].1, EnvValue::NoProxy) {
            out[n] = SANDBOX_ENV[i].0;
            n += 1;
        }
        i += 1;
    }
    out
}

/// The variables of [`SANDBOX_ENV`] a sandbox's own configuration may not set (all but `NO_PROXY`).
pub const RESERVED_ENV: [&str; reserved_count()] = reserved();

/// The sandbox's `/etc/resolv.conf`: its only resolver is the gateway's `.2` (DNS to any address is
/// redirected there anyway; naming it keeps glibc from trying anything else). No search domains, so
/// `ndots:0`; short timeouts, because an answer that does not come at once will not come later.
#[must_use]
pub fn resolv_conf(gateway: Ipv4Addr) -> String {
    format!("nameserver {gateway}\noptions ndots:0 timeout:2 attempts:2\n")
}

/// Where a sandbox finds the installation's CA, as paths the sandbox sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaPaths {
    /// The CA certificate alone (PEM).
    pub cert: String,
    /// The image's system roots followed by the CA (PEM).
    pub bundle: String,
}

impl CaPaths {
    /// The CA at `cert`, the bundle at `bundle`.
    #[must_use]
    pub fn new(cert: impl Into<String>, bundle: impl Into<String>) -> Self {
        Self {
            cert: cert.into(),
            bundle: bundle.into(),
        }
    }
}

/// The environment of a sandbox served at `gateway` (its `.2`) on `ports`, with the CA files at `ca`: every
/// variable of [`SANDBOX_ENV`], each holding what its [`EnvValue`] says.
#[must_use]
pub fn sandbox_env(gateway: Ipv4Addr, ports: Ports, ca: &CaPaths) -> BTreeMap<String, String> {
    let proxy = format!("http://{}", SocketAddr::from((gateway, ports.explicit)));
    SANDBOX_ENV
        .iter()
        .map(|&(name, value)| {
            let value = match value {
                EnvValue::Proxy => proxy.clone(),
                EnvValue::NoProxy => NO_PROXY.to_owned(),
                EnvValue::CaBundle => ca.bundle.clone(),
                EnvValue::CaCert => ca.cert.clone(),
            };
            (name.to_owned(), value)
        })
        .collect()
}

/// The agents a datapath serves; `next` numbers attachments so a stale one never undoes a newer one.
#[derive(Debug, Default)]
struct Agents {
    links: BTreeMap<AgentId, (AgentAttachment, u64)>,
    next: u64,
}

struct Inner {
    ns: NetNs,
    ports: Ports,
    gateway: Arc<Gateway>,
    agents: Mutex<Agents>,
    /// Serialises rule writes: each one reads the agent set once it holds this, so the last write always
    /// reflects the last change.
    writing: tokio::sync::Mutex<()>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Agents> {
        self.agents.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the ruleset for the agents attached now.
    async fn apply(&self) -> Result<()> {
        let _writing = self.writing.lock().await;
        let rules = GatewayRules {
            ports: self.ports,
            agents: self.lock().links.values().map(|(l, _)| l.clone()).collect(),
        };
        rules.apply(&self.ns).await
    }
}

/// One gateway namespace's datapath: its ruleset and the agents served in it. Cheap to clone (a handle).
#[derive(Clone)]
pub struct Datapath {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Datapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datapath")
            .field("ns", &self.inner.ns)
            .field("ports", &self.inner.ports)
            .field("agents", &self.agents())
            .finish_non_exhaustive()
    }
}

impl Datapath {
    /// Takes over `ns` for `gateway` on `ports`: hardens it and installs a ruleset that accepts nothing
    /// but loopback (replacing whatever table `inet agenthold` held). Needs root (or `CAP_NET_ADMIN` over
    /// the namespace) and `nft`.
    ///
    /// # Errors
    /// [`Error::Config`] for invalid ports; [`Error::Netns`] or [`Error::Nftables`] when the namespace
    /// cannot be hardened or its rules written.
    pub async fn new(ns: NetNs, ports: Ports, gateway: Arc<Gateway>) -> Result<Self> {
        GatewayRules {
            ports,
            agents: Vec::new(),
        }
        .validate()?;
        nft::harden(&ns)?;
        let datapath = Self {
            inner: Arc::new(Inner {
                ns,
                ports,
                gateway,
                agents: Mutex::new(Agents::default()),
                writing: tokio::sync::Mutex::new(()),
            }),
        };
        datapath.inner.apply().await?;
        Ok(datapath)
    }

    /// The gateway namespace.
    #[must_use]
    pub fn ns(&self) -> &NetNs {
        &self.inner.ns
    }

    /// The ports the listeners are bound on.
    #[must_use]
    pub fn ports(&self) -> Ports {
        self.inner.ports
    }

    /// The gateway the agents are attached to.
    #[must_use]
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.inner.gateway
    }

    /// The agents attached now.
    #[must_use]
    pub fn agents(&self) -> Vec<AgentId> {
        self.inner.lock().links.keys().cloned().collect()
    }

    /// Serves `agent` on `link`: rules first, then its listeners bound at `link.gateway_addr` inside the
    /// namespace (transparent proxy, explicit proxy, DNS over UDP and TCP, and the tunnel port when the
    /// ports have one, left for the caller in [`Attachment::take_tunnel`]), then [`Gateway::attach`].
    /// Must be called inside a tokio runtime. On failure nothing of it is left.
    ///
    /// # Errors
    /// [`Error::Config`] when `agent` is already attached here, or `link` is invalid or collides with an
    /// attached one (same interface); [`Error::Nftables`] or [`Error::Netns`] when the rules cannot be
    /// written or a socket cannot be bound (the address is not in the namespace, a port is taken).
    pub async fn attach(&self, agent: &AgentId, link: AgentAttachment) -> Result<Attachment> {
        let generation = {
            let mut agents = self.inner.lock();
            if agents.links.contains_key(agent) {
                return Err(Error::Config {
                    problem: format!("agent {agent} is already attached in {}", self.inner.ns),
                });
            }
            let mut all: Vec<AgentAttachment> = agents.links.values().map(|(l, _)| l.clone()).collect();
            all.push(link.clone());
            GatewayRules {
                ports: self.inner.ports,
                agents: all,
            }
            .validate()?;
            agents.next += 1;
            let generation = agents.next;
            agents.links.insert(agent.clone(), (link.clone(), generation));
            generation
        };
        // From here on, dropping or closing `attachment` undoes whatever was done.
        let mut attachment = Attachment {
            inner: Arc::clone(&self.inner),
            agent: agent.clone(),
            link,
            generation,
            cancel: CancellationToken::new(),
            tunnel: None,
            done: false,
        };
        match attachment.serve().await {
            Ok(()) => Ok(attachment),
            Err(e) => {
                if let Err(undo) = attachment.close().await {
                    tracing::warn!(agent = %agent, error = %undo, "undoing a failed attach");
                }
                Err(e)
            }
        }
    }

    /// [`Datapath::attach`] on the interface of the namespace that holds `gateway`'s address, with the
    /// agent network `gateway`'s subnet: for a namespace the caller set up, named by the gateway's address
    /// and prefix alone (`10.20.0.2/24`).
    ///
    /// # Errors
    /// [`Error::Config`] when no interface of the namespace holds the address; as [`Datapath::attach`].
    pub async fn attach_at(&self, agent: &AgentId, gateway: Ipv4Net) -> Result<Attachment> {
        let iface = self
            .inner
            .ns
            .iface_with_addr(gateway.addr())?
            .ok_or_else(|| Error::Config {
                problem: format!("no interface in {} holds {}", self.inner.ns, gateway.addr()),
            })?;
        let link = AgentAttachment {
            iface,
            gateway_addr: gateway.addr(),
            subnet: gateway.trunc(),
        };
        self.attach(agent, link).await
    }
}

/// How long a bind waits for the listeners of an agent detached a moment ago to close: the gateway ends
/// them on its own tasks, a few milliseconds after [`Gateway::detach`].
const BIND_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// `bind()`, again while the address is still in use (up to [`BIND_WAIT`]).
async fn retry_in_use<T>(mut bind: impl FnMut() -> Result<T>) -> Result<T> {
    let deadline = tokio::time::Instant::now() + BIND_WAIT;
    loop {
        match bind() {
            Err(Error::Netns { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            result => return result,
        }
    }
}

/// One agent served by a [`Datapath`]. Dropping it (or [`Attachment::close`], which also reports errors)
/// detaches the agent: the gateway stops serving it, its listeners close, and the ruleset is written again
/// without it.
pub struct Attachment {
    inner: Arc<Inner>,
    agent: AgentId,
    link: AgentAttachment,
    generation: u64,
    cancel: CancellationToken,
    tunnel: Option<std::net::TcpListener>,
    /// Detached already (closed, forgotten, or undone).
    done: bool,
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment")
            .field("agent", &self.agent)
            .field("link", &self.link)
            .field("ns", &self.inner.ns)
            .finish_non_exhaustive()
    }
}

impl Attachment {
    /// Rules, listeners, gateway (see [`Datapath::attach`]).
    async fn serve(&mut self) -> Result<()> {
        self.inner.apply().await?;
        let ns = &self.inner.ns;
        let ports = self.inner.ports;
        let at = |port| SocketAddr::from((self.link.gateway_addr, port));
        let tcp = |port| retry_in_use(move || ns.bind_tcp(at(port)));
        let sockets = AgentSockets {
            transparent: Some(tcp(ports.proxy).await?),
            explicit: Some(tcp(ports.explicit).await?),
            dns: Some((
                retry_in_use(|| ns.bind_udp(at(ports.dns))).await?,
                tcp(ports.dns).await?,
            )),
        };
        self.tunnel = match ports.tunnel {
            Some(port) => Some(tcp(port).await?),
            None => None,
        };
        self.inner.gateway.attach(&self.agent, sockets)
    }

    /// The agent.
    #[must_use]
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }

    /// The agent network as the rules see it.
    #[must_use]
    pub fn link(&self) -> &AgentAttachment {
        &self.link
    }

    /// The gateway's address on the agent network (its `.2`), where every listener of the agent is bound.
    #[must_use]
    pub fn gateway_addr(&self) -> Ipv4Addr {
        self.link.gateway_addr
    }

    /// The explicit proxy as the sandbox reaches it.
    #[must_use]
    pub fn explicit_proxy(&self) -> SocketAddr {
        SocketAddr::from((self.link.gateway_addr, self.inner.ports.explicit))
    }

    /// The tunnel address as the sandbox reaches it, when the ports have a tunnel.
    #[must_use]
    pub fn tunnel_addr(&self) -> Option<SocketAddr> {
        self.inner
            .ports
            .tunnel
            .map(|p| SocketAddr::from((self.link.gateway_addr, p)))
    }

    /// The tunnel listener (bound at the `.2`, non-blocking), once: serve it until [`Attachment::cancelled`].
    pub fn take_tunnel(&mut self) -> Option<std::net::TcpListener> {
        self.tunnel.take()
    }

    /// A token cancelled when this attachment ends (for tasks the caller serves for the agent, such as
    /// the tunnel).
    #[must_use]
    pub fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// The sandbox's environment ([`sandbox_env`] for this agent's `.2` and ports).
    #[must_use]
    pub fn env(&self, ca: &CaPaths) -> BTreeMap<String, String> {
        sandbox_env(self.link.gateway_addr, self.inner.ports, ca)
    }

    /// The sandbox's `/etc/resolv.conf` ([`resolv_conf`] for this agent's `.2`).
    #[must_use]
    pub fn resolv_conf(&self) -> String {
        resolv_conf(self.link.gateway_addr)
    }

    /// Whether this attachment was made by `datapath` (or a clone of it).
    #[must_use]
    pub fn belongs_to(&self, datapath: &Datapath) -> bool {
        Arc::ptr_eq(&self.inner, &datapath.inner)
    }

    /// Detaches the agent and waits until the ruleset without it is written.
    ///
    /// # Errors
    /// When the ruleset cannot be written (the agent is detached from the gateway anyway).
    pub async fn close(mut self) -> Result<()> {
        if self.release(true) {
            self.inner.apply().await?;
        }
        Ok(())
    }

    /// Stops tracking the agent here without detaching it from the gateway and without writing the
    /// rules: for a namespace that is gone (a replaced gateway holder), just before the agent is attached
    /// again elsewhere. The agent keeps its gateway state (DNS records, budgets); tasks waiting on
    /// [`Attachment::cancelled`] end.
    pub fn forget(mut self) {
        self.release(false);
    }

    /// Removes this attachment from the agent set (and with `detach`, from the gateway) unless a newer one
    /// replaced it. Whether the rules need writing again.
    fn release(&mut self, detach: bool) -> bool {
        if std::mem::replace(&mut self.done, true) {
            return false;
        }
        self.cancel.cancel();
        let mut agents = self.inner.lock();
        let ours = agents
            .links
            .get(&self.agent)
            .is_some_and(|(_, g)| *g == self.generation);
        if !ours {
            return false;
        }
        agents.links.remove(&self.agent);
        drop(agents);
        if detach {
            self.inner.gateway.detach(&self.agent);
        }
        true
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        if !self.release(true) {
            return;
        }
        // The listeners are closed already; the rules follow as soon as the runtime gets to them.
        let inner = Arc::clone(&self.inner);
        let agent = self.agent.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    match inner.apply().await {
                        Ok(()) => {}
                        // Its namespace went first: no rules left to rewrite.
                        Err(e) if !inner.ns.exists() => {
                            tracing::debug!(agent = %agent, error = %e, "namespace gone before its rules");
                        }
                        Err(e) => {
                            tracing::warn!(agent = %agent, error = %e, "rules not rewritten after a detach")
                        }
                    }
                });
            }
            Err(_) => tracing::warn!(
                agent = %agent, namespace = %inner.ns,
                "detached outside a tokio runtime: its rules stay until the next change"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> CaPaths {
        CaPaths::new("/x/ca.crt", "/x/bundle.pem")
    }

    // covers: E14
    #[test]
    fn every_variable_is_set_and_points_where_it_should() {
        let env = sandbox_env(Ipv4Addr::new(10, 213, 7, 2), Ports::default(), &ca());
        assert_eq!(env.len(), SANDBOX_ENV.len());
        for key in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            assert_eq!(env[key], "http://10.213.7.2:15002", "{key}");
        }
        for key in ["NO_PROXY", "no_proxy"] {
            assert_eq!(env[key], "localhost,127.0.0.1,::1", "{key}");
        }
        // These replace the client's trust store: the bundle, or every other host would fail.
        for key in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
            "AWS_CA_BUNDLE",
        ] {
            assert_eq!(env[key], "/x/bundle.pem", "{key}");
        }
        // Node adds these to its own roots: the CA alone.
        assert_eq!(env["NODE_EXTRA_CA_CERTS"], "/x/ca.crt");
    }

    #[test]
    fn the_resolver_is_the_gateway() {
        let text = resolv_conf(Ipv4Addr::new(10, 213, 7, 2));
        let nameservers: Vec<&str> = text.lines().filter(|l| l.starts_with("nameserver")).collect();
        assert_eq!(nameservers, ["nameserver 10.213.7.2"]);
        assert!(!text.contains("search"), "{text}");
    }

    #[test]
    fn only_no_proxy_may_be_set_by_a_sandbox() {
        assert_eq!(RESERVED_ENV.len(), SANDBOX_ENV.len() - 2);
        for (name, value) in SANDBOX_ENV {
            assert_eq!(RESERVED_ENV.contains(&name), value != EnvValue::NoProxy, "{name}");
        }
    }

    #[test]
    fn the_explicit_port_is_the_configured_one() {
        let ports = Ports {
            explicit: 3128,
            ..Ports::default()
        };
        let env = sandbox_env(Ipv4Addr::new(192, 168, 9, 2), ports, &ca());
        assert_eq!(env["HTTPS_PROXY"], "http://192.168.9.2:3128");
    }

    #[test]
    fn addresses_on_a_subnet() {
        let subnet: Ipv4Net = "10.213.4.0/24".parse().unwrap();
        assert_eq!(gateway_addr(subnet), Ipv4Addr::new(10, 213, 4, 2));
        assert_eq!(sandbox_addr(subnet), Ipv4Addr::new(10, 213, 4, 3));
        let link = AgentAttachment::on_subnet("ah4", "10.213.4.9/24".parse().unwrap());
        assert_eq!(
            link,
            AgentAttachment {
                iface: "ah4".into(),
                gateway_addr: Ipv4Addr::new(10, 213, 4, 2),
                subnet,
            }
        );
    }

    #[test]
    fn ports_come_from_the_configuration() {
        let config = EgressConfig::default();
        assert_eq!(Ports::from_config(&config), Ports::default());
        let custom = EgressConfig {
            proxy_port: 1,
            explicit_port: 2,
            dns_port: 3,
            tunnel_port: 4,
            ..EgressConfig::default()
        };
        assert_eq!(
            Ports::from_config(&custom).without_tunnel(),
            Ports {
                proxy: 1,
                explicit: 2,
                dns: 3,
                tunnel: None
            }
        );
    }
}
