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
//! it: the gateway stops serving the agent (its open connections close), then its elements leave the
//! ruleset's sets. [`Datapath::new`] replaces the whole table in one nft transaction; each attach or
//! detach after it changes only the agent's set elements, in one transaction (the rules themselves are
//! the same for any number of agents, see [`nft`]). Writes are serialised and each one brings the sets to
//! the agents attached at that moment, so the rules in force always match them.
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

mod addr;
mod attachment;
mod env;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use agenthold_core::AgentId;
use ipnet::Ipv4Net;

pub use addr::{GATEWAY_HOST, SANDBOX_HOST, gateway_addr, sandbox_addr};
pub use attachment::Attachment;
pub use env::{
    CaPaths, EnvValue, NO_PROXY, RESERVED_ENV, SANDBOX_ENV, resolv_conf, sandbox_env, sandbox_env_via,
};

use crate::gateway::Gateway;
use crate::netns::NetNs;
use crate::nft::{self, AgentAttachment, GatewayRules, Ports};
use crate::{Error, Result};

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
    /// reflects the last change. Holds the agent links the namespace's sets have now (by interface), or
    /// `None` when that is not known (before the first write, after a failed one): then the whole table
    /// is written again.
    writing: tokio::sync::Mutex<Option<BTreeMap<String, AgentAttachment>>>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Agents> {
        self.agents.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the rules for the agents attached now: only the set elements that differ from what the
    /// namespace has (one nft transaction of a few elements), or the whole table when what it has is not
    /// known or the element change fails.
    async fn apply(&self) -> Result<()> {
        let mut written = self.writing.lock().await;
        let wanted: BTreeMap<String, AgentAttachment> = self
            .lock()
            .links
            .values()
            .map(|(l, _)| (l.iface.clone(), l.clone()))
            .collect();
        if let Some(have) = written.take() {
            let remove: Vec<AgentAttachment> = have
                .iter()
                .filter(|(iface, link)| wanted.get(*iface) != Some(*link))
                .map(|(_, link)| link.clone())
                .collect();
            let add: Vec<AgentAttachment> = wanted
                .iter()
                .filter(|(iface, link)| have.get(*iface) != Some(*link))
                .map(|(_, link)| link.clone())
                .collect();
            match nft::apply_element_changes(&self.ns, &remove, &add).await {
                Ok(()) => {
                    *written = Some(wanted);
                    return Ok(());
                }
                // Config errors are the caller's; anything else: the table is not what we think.
                Err(e @ Error::Config { .. }) => {
                    *written = Some(have);
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(namespace = %self.ns, error = %e, "element change failed; writing the whole table");
                }
            }
        }
        let rules = GatewayRules {
            ports: self.ports,
            agents: wanted.values().cloned().collect(),
        };
        rules.apply(&self.ns).await?;
        *written = Some(wanted);
        Ok(())
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
                writing: tokio::sync::Mutex::new(None),
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
        let mut attachment = Attachment::new(Arc::clone(&self.inner), agent.clone(), link, generation);
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
