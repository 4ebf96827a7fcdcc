//! The gateway: one process-wide composition of policy, resolver, dialer, upstream HTTP client and request
//! log, and per agent a set of already-bound sockets (made inside the gateway's network namespace by the
//! caller) on which it serves the transparent proxy, the explicit proxy and DNS.
//!
//! This module only builds and wires: [`GatewayBuilder::build`] makes the state every proxy shares (the
//! crate's internal `context`), [`Gateway::attach`] starts an agent's listeners on it, and the stats read
//! it back. The proxies never call into the gateway.
//!
//! Agent identity comes from which sockets a connection or query arrives on: the caller binds each agent's
//! sockets to that agent's gateway address, and the nftables rules only let an agent's interface reach its
//! own address. Nothing the sandbox sends is used to identify it.
//!
//! The gateway owns one address [`Guard`] (E22), made in [`GatewayBuilder::build`] from the namespace of the
//! thread that builds it (the namespace it dials from) and consulted by every dial and every DNS answer, and
//! one [`dns::DnsBudget`] shared by every agent's resolver (E20); [`Gateway::guard`] and
//! [`Gateway::dns_counters`] expose them.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agenthold_core::AgentId;
use agenthold_core::config::EgressConfig;
use agenthold_core::policy::{DenyReason, Destination, EgressPolicy, Verdict, normalize_name};
use agenthold_core::secret::SecretInjector;
use ipnet::IpNet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::budget::{AgentBudget, Budget};
use crate::ca::CertificateAuthority;
use crate::context::{AgentContext, Context};
use crate::dial::{Dialer, Resolve};
use crate::dns;
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::log::RequestLog;
use crate::open::OpenConnections;

pub use crate::context::Timeouts;

/// Options that weaken the gateway for tests on a machine without internet. Nothing here is needed in
/// production; each option says what it gives up.
#[derive(Debug, Clone, Default)]
pub struct Dangerous {
    /// `(name, port) → address`: dial this address for this name and port, bypassing the address guard
    /// (only that name and port). The gateway's DNS answers the name with a synthetic address that routes
    /// through the gateway, so the sandbox still goes through the proxy.
    pub connect_to: Vec<(String, u16, SocketAddr)>,
    /// Extra PEM trust anchors for upstream TLS (used by TLS interception).
    pub upstream_ca_pem: Option<Vec<u8>>,
}

/// Sockets an agent is served on, bound by the caller inside the gateway's network namespace. Any may be
/// absent (a test may serve only the explicit proxy).
#[derive(Debug, Default)]
pub struct AgentSockets {
    /// Transparent proxy (`egress.proxy_port`): receives the sandbox's redirected TCP.
    pub transparent: Option<std::net::TcpListener>,
    /// Explicit proxy (`egress.explicit_port`): CONNECT and absolute-form HTTP.
    pub explicit: Option<std::net::TcpListener>,
    /// DNS over UDP and TCP (`egress.dns_port`).
    pub dns: Option<(std::net::UdpSocket, std::net::TcpListener)>,
}

/// Builds a [`Gateway`].
pub struct GatewayBuilder {
    policy: Option<Arc<dyn EgressPolicy>>,
    injector: Option<Arc<dyn SecretInjector>>,
    ca: Option<Arc<CertificateAuthority>>,
    dns_upstream: Option<SocketAddr>,
    resolver: Option<Arc<dyn Resolve>>,
    timeouts: Timeouts,
    log_keep: usize,
    log_max_bytes: usize,
    limits: Limits,
    disabled: bool,
    dangerous: Dangerous,
    deny_cidrs: Vec<IpNet>,
    dns_limits: dns::DnsLimits,
    dns_forward: dns::ForwardLimits,
}

/// Budgets of the gateway (E20); see `egress.max_*` in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections at once, all agents together (0: derived from the descriptor limit).
    pub connections: usize,
    /// Connections one agent may hold at once (client connections, CONNECT tunnels, WebSockets).
    pub connections_per_agent: usize,
    /// Requests one agent may have in flight upstream.
    pub requests_per_agent: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 0,
            connections_per_agent: 1024,
            requests_per_agent: 256,
        }
    }
}

/// What the gateway holds and has refused (for `/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct GatewayStats {
    /// Connections held now, all agents together.
    pub connections: usize,
    /// The gateway-wide connection limit in force.
    pub connection_limit: usize,
    /// Connections refused because a budget was spent.
    pub refused_connections: u64,
    /// Upstream requests refused because an agent had too many in flight.
    pub refused_requests: u64,
    /// Long-lived connections open (spliced, tunnels, WebSockets, streaming answers).
    pub open: usize,
}

/// What one agent holds and has lost (for `/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct AgentStats {
    /// Connections held now.
    pub connections: usize,
    /// Requests in flight upstream now.
    pub requests: usize,
    /// Long-lived connections open now.
    pub open: usize,
    /// Connections refused because a budget was spent.
    pub refused_connections: u64,
    /// Requests refused because too many were in flight.
    pub refused_requests: u64,
    /// Request log entries that fell out of the agent's ring.
    pub log_dropped: u64,
    /// Bytes of request log held for the agent.
    pub log_bytes: usize,
}

impl fmt::Debug for GatewayBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatewayBuilder")
            .field("dns_upstream", &self.dns_upstream)
            .field("timeouts", &self.timeouts)
            .field("log_keep", &self.log_keep)
            .field("disabled", &self.disabled)
            .field("dangerous", &self.dangerous)
            .field("deny_cidrs", &self.deny_cidrs)
            .field("dns_limits", &self.dns_limits)
            .field("dns_forward", &self.dns_forward)
            .finish_non_exhaustive()
    }
}

impl GatewayBuilder {
    /// The policy deciding every destination and DNS name (required).
    #[must_use]
    pub fn policy(mut self, policy: Arc<dyn EgressPolicy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The secret injector (TLS is intercepted only for hosts it names).
    #[must_use]
    pub fn injector(mut self, injector: Arc<dyn SecretInjector>) -> Self {
        self.injector = Some(injector);
        self
    }

    /// The CA that signs the certificates of intercepted hosts (required with an injector).
    #[must_use]
    pub fn certificate_authority(mut self, ca: Arc<CertificateAuthority>) -> Self {
        self.ca = Some(ca);
        self
    }

    /// The DNS server the gateway forwards allowed queries to and resolves names with (required unless a
    /// custom resolver is given for dialling and no agent is served DNS).
    #[must_use]
    pub fn dns_upstream(mut self, addr: SocketAddr) -> Self {
        self.dns_upstream = Some(addr);
        self
    }

    /// Resolve names for dialling with `resolver` instead of the DNS upstream.
    #[must_use]
    pub fn resolver(mut self, resolver: Arc<dyn Resolve>) -> Self {
        self.resolver = Some(resolver);
        self
    }

    /// Timeouts (default [`Timeouts::default`]).
    #[must_use]
    pub fn timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Request log entries kept per agent (default 5000).
    #[must_use]
    pub fn log_keep(mut self, keep: usize) -> Self {
        self.log_keep = keep;
        self
    }

    /// Bytes of request log kept per agent (default 2 MiB).
    #[must_use]
    pub fn log_max_bytes(mut self, bytes: usize) -> Self {
        self.log_max_bytes = bytes;
        self
    }

    /// Connection and request budgets (default [`Limits::default`]).
    #[must_use]
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Refuse everything (`egress.disabled`).
    #[must_use]
    pub fn disabled(mut self, disabled: bool) -> Self {
        self.disabled = disabled;
        self
    }

    /// Ranges never dialled on top of the built-in guard (`egress.deny_cidrs`; default none). Host bits are
    /// cleared.
    #[must_use]
    pub fn deny_cidrs(mut self, cidrs: Vec<IpNet>) -> Self {
        self.deny_cidrs = cidrs;
        self
    }

    /// DNS budgets per agent and for the gateway (default [`dns::DnsLimits::default`]).
    #[must_use]
    pub fn dns_limits(mut self, limits: dns::DnsLimits) -> Self {
        self.dns_limits = limits;
        self
    }

    /// The resolver's answer cache and upstream socket bounds (default [`dns::ForwardLimits::default`]).
    #[must_use]
    pub fn dns_forward_limits(mut self, limits: dns::ForwardLimits) -> Self {
        self.dns_forward = limits;
        self
    }

    /// Apply the `egress` section of the configuration: timeouts, log size, disabled, deny list, DNS budgets
    /// and cache. The DNS upstream is resolved from it as well when not set explicitly.
    ///
    /// # Errors
    /// When `dns_upstream` is empty and resolv.conf has no usable nameserver.
    pub fn config(mut self, egress: &EgressConfig) -> Result<Self> {
        self.timeouts = Timeouts::from_config(egress);
        self.log_keep = egress.log_keep;
        self.log_max_bytes = egress.log_max_bytes;
        self.limits = Limits {
            connections: egress.max_connections,
            connections_per_agent: egress.max_connections_per_agent,
            requests_per_agent: egress.max_requests_per_agent,
        };
        self.disabled = egress.disabled;
        self.deny_cidrs.clone_from(&egress.deny_cidrs);
        self.dns_limits = dns::DnsLimits::from_config(egress);
        self.dns_forward = dns::ForwardLimits::from_config(egress);
        if self.dns_upstream.is_none() {
            self.dns_upstream = Some(egress.dns_upstream()?);
        }
        Ok(self)
    }

    /// Weaken the gateway for tests (see [`Dangerous`]).
    #[must_use]
    pub fn dangerous(mut self, dangerous: Dangerous) -> Self {
        self.dangerous = dangerous;
        self
    }

    /// Build the gateway. Must be called inside a tokio runtime, on a thread in the network namespace the
    /// gateway dials from (the process's own, normally): the address guard reads and follows that
    /// namespace's addresses.
    ///
    /// # Errors
    /// [`Error::Config`] when no policy or no DNS upstream was given, or an injector without a CA;
    /// [`Error::Tls`] when the extra upstream trust anchor is not a PEM certificate; [`Error::Io`] when the
    /// namespace's own addresses cannot be read.
    pub fn build(self) -> Result<Gateway> {
        let policy = self.policy.ok_or_else(|| Error::Config {
            problem: "a policy is required".into(),
        })?;
        let upstream_addr = self.dns_upstream.ok_or_else(|| Error::Config {
            problem: "a DNS upstream is required (egress.dns_upstream or resolv.conf)".into(),
        })?;
        let upstream = Arc::new(dns::Upstream::new(upstream_addr).with_forward_limits(self.dns_forward));
        let resolver: Arc<dyn Resolve> = match self.resolver {
            Some(r) => r,
            None => Arc::clone(&upstream) as Arc<dyn Resolve>,
        };
        let connect_to: HashMap<(String, u16), SocketAddr> = self
            .dangerous
            .connect_to
            .iter()
            .map(|(n, p, a)| Ok(((normalize_name(n)?, *p), *a)))
            .collect::<std::result::Result<_, agenthold_core::Error>>()?;
        let synthetic = dns::SyntheticNames::new();
        for (name, _) in connect_to.keys() {
            synthetic.insert(name)?;
        }
        let synthetic = Arc::new(synthetic);
        if self.injector.is_some() && self.ca.is_none() {
            return Err(Error::Config {
                problem: "a secret injector needs a certificate authority".into(),
            });
        }
        let tls_client = crate::tls::client_config(self.dangerous.upstream_ca_pem.as_deref())?;
        let tls_server = self.ca.map(crate::tls::server_config).transpose()?;
        let guard = Arc::new(
            Guard::watching(self.deny_cidrs)
                .map_err(|e| Error::io("reading the host's own addresses for the address guard", e))?,
        );
        let dns_budget = Arc::new(dns::DnsBudget::new(self.dns_limits));
        let dialer = Dialer::new(resolver, Arc::clone(&guard), connect_to, self.timeouts.connect);
        let shared = Arc::new(Context {
            policy,
            injector: self.injector,
            tls_server,
            log: Arc::new(RequestLog::with_limits(self.log_keep, self.log_max_bytes)),
            records: Arc::new(dns::Records::new()),
            client: crate::upstream::client(dialer.clone(), Arc::clone(&tls_client), self.timeouts.connect),
            client_h1: crate::upstream::client(
                dialer.clone(),
                crate::tls::http1_only(&tls_client),
                self.timeouts.connect,
            ),
            dialer,
            timeouts: self.timeouts,
            disabled: self.disabled,
            budget: Arc::new(Budget::new(
                self.limits.connections,
                self.limits.connections_per_agent,
                self.limits.requests_per_agent,
            )),
            open: Arc::new(OpenConnections::default()),
            refresh_locks: crate::context::RefreshLocks::default(),
        });
        let root = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(Context::sweep_open_forever(Arc::downgrade(&shared), root.clone()));
        Ok(Gateway {
            shared,
            upstream,
            synthetic,
            guard,
            dns_budget,
            agents: Mutex::new(HashMap::new()),
            root,
            tasks,
        })
    }
}

/// The egress gateway. Serve an agent with [`Gateway::attach`]; read its log with [`Gateway::log`].
pub struct Gateway {
    shared: Arc<Context>,
    upstream: Arc<dns::Upstream>,
    synthetic: Arc<dns::SyntheticNames>,
    guard: Arc<Guard>,
    dns_budget: Arc<dns::DnsBudget>,
    agents: Mutex<HashMap<AgentId, (CancellationToken, Arc<AgentBudget>)>>,
    root: CancellationToken,
    tasks: TaskTracker,
}

impl fmt::Debug for Gateway {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gateway")
            .field("timeouts", &self.shared.timeouts)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// Start building a gateway.
    #[must_use]
    pub fn builder() -> GatewayBuilder {
        GatewayBuilder {
            policy: None,
            injector: None,
            ca: None,
            dns_upstream: None,
            resolver: None,
            timeouts: Timeouts::default(),
            log_keep: 5000,
            log_max_bytes: crate::log::DEFAULT_MAX_BYTES,
            limits: Limits::default(),
            disabled: false,
            dangerous: Dangerous::default(),
            deny_cidrs: Vec::new(),
            dns_limits: dns::DnsLimits::default(),
            dns_forward: dns::ForwardLimits::default(),
        }
    }

    /// The request log.
    #[must_use]
    pub fn log(&self) -> &Arc<RequestLog> {
        &self.shared.log
    }

    /// The address guard every dial and DNS answer goes through.
    #[must_use]
    pub fn guard(&self) -> &Arc<Guard> {
        &self.guard
    }

    /// What the resolvers did with DNS queries: totals and per attached agent (forwarded, refused over
    /// budget, refused as local names).
    #[must_use]
    pub fn dns_counters(&self) -> dns::DnsCounters {
        self.dns_budget.counters()
    }

    /// Serve `agent` on `sockets` (replacing a previous attachment of the same agent). Must be called inside
    /// a tokio runtime.
    ///
    /// # Errors
    /// When a socket cannot be registered with the runtime.
    pub fn attach(&self, agent: &AgentId, sockets: AgentSockets) -> Result<()> {
        let token = self.root.child_token();
        let budget = {
            let mut agents = self.lock_agents();
            // A re-attached agent keeps its budget: its connections from before still count.
            let budget = agents
                .get(agent)
                .map_or_else(Arc::default, |(_, b)| Arc::clone(b));
            if let Some((old, _)) = agents.insert(agent.clone(), (token.clone(), Arc::clone(&budget))) {
                old.cancel();
            }
            budget
        };
        let on = AgentContext {
            gw: Arc::clone(&self.shared),
            agent: agent.clone(),
            budget,
            cancel: token.clone(),
        };
        let tcp = |l: std::net::TcpListener| -> Result<tokio::net::TcpListener> {
            l.set_nonblocking(true).map_err(|e| Error::io("listener", e))?;
            tokio::net::TcpListener::from_std(l).map_err(|e| Error::io("listener", e))
        };
        if let Some(l) = sockets.transparent {
            let l = tcp(l)?;
            self.tasks.spawn(crate::transparent::serve(on.clone(), l));
        }
        if let Some(l) = sockets.explicit {
            let l = tcp(l)?;
            self.tasks.spawn(crate::explicit::serve(on, l));
        }
        if let Some((udp, tcp_listener)) = sockets.dns {
            let server = dns::Server::new(dns::ServerContext {
                agent: agent.clone(),
                policy: self.dns_policy(),
                upstream: Arc::clone(&self.upstream),
                records: Arc::clone(&self.shared.records),
                log: Arc::clone(&self.shared.log),
                synthetic: Arc::clone(&self.synthetic),
                guard: Arc::clone(&self.guard),
                budget: Arc::clone(&self.dns_budget),
            });
            let handle = server.spawn_std(udp, tcp_listener)?;

            self.tasks.spawn(async move {
                token.cancelled().await;
                handle.shutdown().await;
            });
        }
        Ok(())
    }

    /// The policy the resolver asks: the gateway's, or one that refuses everything when egress is disabled.
    fn dns_policy(&self) -> Arc<dyn EgressPolicy> {
        if self.shared.disabled {
            Arc::new(DenyAll)
        } else {
            Arc::clone(&self.shared.policy)
        }
    }

    /// Stop serving `agent`: its listeners close and its open connections are dropped.
    pub fn detach(&self, agent: &AgentId) {
        if let Some((token, _)) = self.lock_agents().remove(agent) {
            token.cancel();
        }
        self.shared.records.forget(agent);
        self.dns_budget.forget(agent);
    }

    /// Stop everything and wait (up to `grace`) for tasks to end.
    pub async fn shutdown(&self, grace: Duration) {
        self.root.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(grace, self.tasks.wait()).await;
    }

    /// What the gateway holds and has refused.
    #[must_use]
    pub fn stats(&self) -> GatewayStats {
        use std::sync::atomic::Ordering::Relaxed;
        let b = &self.shared.budget;
        GatewayStats {
            connections: b.used(),
            connection_limit: b.total(),
            refused_connections: b.refused.connections.load(Relaxed),
            refused_requests: b.refused.requests.load(Relaxed),
            open: self.shared.open.count(None),
        }
    }

    /// What `agent` holds and has lost; `None` when it is not attached.
    #[must_use]
    pub fn agent_stats(&self, agent: &AgentId) -> Option<AgentStats> {
        use std::sync::atomic::Ordering::Relaxed;
        let budget = self.lock_agents().get(agent).map(|(_, b)| Arc::clone(b))?;
        Some(AgentStats {
            connections: budget.connections(),
            requests: budget.requests(),
            open: self.shared.open.count(Some(agent)),
            refused_connections: budget.refused.connections.load(Relaxed),
            refused_requests: budget.refused.requests.load(Relaxed),
            log_dropped: self.shared.log.dropped(agent),
            log_bytes: self.shared.log.bytes(agent),
        })
    }

    fn lock_agents(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<AgentId, (CancellationToken, Arc<AgentBudget>)>> {
        self.agents.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The resolver's policy when egress is disabled.
struct DenyAll;

impl EgressPolicy for DenyAll {
    fn decide(&self, _: &AgentId, _: &Destination) -> Verdict {
        Verdict::Denied(DenyReason::EgressDisabled)
    }
    fn may_resolve(&self, _: &AgentId, _: &str) -> Verdict {
        Verdict::Denied(DenyReason::EgressDisabled)
    }
}

impl Resolve for dns::Upstream {
    fn resolve<'a>(
        &'a self,
        name: &'a str,
    ) -> futures_util::future::BoxFuture<'a, std::result::Result<Vec<IpAddr>, String>> {
        Box::pin(async move {
            self.lookup(name)
                .await
                .map(|l| l.addrs)
                .map_err(|e| e.to_string())
        })
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.root.cancel();
    }
}
