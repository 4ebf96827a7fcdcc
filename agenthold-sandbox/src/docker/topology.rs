//! Which agents the gateway holder serves, and everything that follows from that set: the holder's
//! network memberships and `.2` addresses, the nftables ruleset of its namespace, each agent's listeners
//! (transparent proxy, explicit proxy, DNS, tunnel) bound at its `.2`, the `DOCKER-USER` accepts and the
//! host table. Changes go through one lock, in an order that never opens the datapath: rules before
//! listeners, listeners before the sandbox starts.

use std::collections::{BTreeMap, HashSet};
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;

use agenthold_core::{AgentId, Store};
use agenthold_egress::Gateway;
use agenthold_egress::gateway::AgentSockets;
use agenthold_egress::nft::{AgentAttachment, GatewayRules};
use ipnet::Ipv4Net;
use tokio_util::sync::CancellationToken;

use super::DockerConfig;
use crate::docker::engine::Engine;
use crate::docker::holder::Holder;
use crate::docker::hostfw;
use crate::docker::network::{AgentNetwork, allocate_subnet};
use crate::error::{Error, Result};
use crate::table::AgentTable;
use crate::tunnel::TunnelServer;

/// Store table of per-agent Docker state.
const TABLE: &str = "docker_agents";

/// What is persisted per agent (so a restarted runtime finds it again: S12).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct AgentRecord {
    pub(crate) net: AgentNetwork,
    /// SHA-256 (hex) of the running boot's tunnel token; never the token itself.
    pub(crate) token: Option<String>,
}

/// The Docker runtime's per-agent records.
pub(crate) const RECORDS: AgentTable<AgentRecord> = AgentTable::new(TABLE, "sandbox record");

pub(crate) async fn save_token(store: &dyn Store, agent: &AgentId, hash: Option<[u8; 32]>) -> Result<()> {
    let Some(mut record) = RECORDS.load(store, agent).await? else {
        return Ok(());
    };
    record.token = hash.map(hex::encode);
    RECORDS.save(store, agent, &record).await
}

/// One agent served by the gateway holder.
struct Attachment {
    net: AgentNetwork,
    iface: String,
    /// Ends the agent's listeners.
    cancel: CancellationToken,
}

/// The holder and the agents it serves.
#[derive(Default)]
pub(crate) struct Topology {
    holder: Option<Holder>,
    agents: BTreeMap<AgentId, Attachment>,
    /// Subnets handed out but maybe not yet visible in the engine.
    reserved: HashSet<Ipv4Net>,
}

impl Topology {
    /// A free /24 for `agent`.
    pub(crate) async fn allocate(
        &mut self,
        engine: &Engine,
        pool: Ipv4Net,
        agent: &AgentId,
    ) -> Result<AgentNetwork> {
        let mut taken = self.reserved.clone();
        taken.extend(self.agents.values().map(|a| a.net.subnet));
        let subnet = allocate_subnet(&engine.docker, pool, &taken).await?;
        self.reserved.insert(subnet);
        Ok(AgentNetwork::for_agent(agent, subnet))
    }

    /// The running holder, (re)created when missing or replaced.
    async fn holder(&mut self, engine: &Engine, config: &DockerConfig) -> Result<Holder> {
        if let Some(h) = &self.holder
            && h.is_current(engine).await?
        {
            return Ok(h.clone());
        }
        let holder = Holder::ensure(engine, &config.sandboxd_image).await?;
        self.holder = Some(holder.clone());
        Ok(holder)
    }

    /// Serve `agent` on `net`: host firewall, holder membership and `.2`, rules, listeners (idempotent: a
    /// re-attach rebinds the listeners, which is how a restarted holder is restored).
    pub(crate) async fn attach(
        &mut self,
        engine: &Engine,
        gateway: &Arc<Gateway>,
        tunnel: &Arc<TunnelServer>,
        config: &DockerConfig,
        agent: &AgentId,
        net: AgentNetwork,
    ) -> Result<()> {
        if let (Some(current), Some(h)) = (self.agents.get(agent), &self.holder)
            && current.net == net
            && h.is_current(engine).await?
        {
            // Already served by the running holder: rebinding would collide with the live listeners.
            return Ok(());
        }
        hostfw::allow_bridge(&net)?;
        self.sync_host_firewall_with(engine, Some(&net))?;
        let holder = self.holder(engine, config).await?;
        let iface = holder.join(engine, &net).await?;
        if let Some(old) = self.agents.remove(agent) {
            old.cancel.cancel();
        }
        self.reserved.remove(&net.subnet);
        let cancel = CancellationToken::new();
        self.agents.insert(
            agent.clone(),
            Attachment {
                net: net.clone(),
                iface,
                cancel: cancel.clone(),
            },
        );
        self.apply_rules(&holder, config).await?;
        listen(&holder, gateway, tunnel, config, agent, &net, cancel)
    }

    /// Stop serving `agent` and take the holder off `net` (its network, also when it was not attached, e.g.
    /// before a reconcile); the holder goes with the last agent.
    pub(crate) async fn detach(
        &mut self,
        engine: &Engine,
        gateway: &Gateway,
        config: &DockerConfig,
        agent: &AgentId,
        net: &AgentNetwork,
    ) -> Result<()> {
        gateway.detach(agent);
        if let Some(gone) = self.agents.remove(agent) {
            gone.cancel.cancel();
        }
        self.reserved.remove(&net.subnet);
        hostfw::disallow_bridge(&net.bridge)?;
        let holder = match self.holder.clone() {
            Some(h) => h,
            // Not found yet in this process: look for a running one without creating it.
            None => match Holder::find(engine).await? {
                Some(h) => h,
                None => return self.sync_host_firewall_with(engine, None),
            },
        };
        if holder.is_current(engine).await? {
            self.apply_rules(&holder, config).await?;
        }
        holder.leave(engine, net).await?;
        self.sync_host_firewall_with(engine, None)?;
        if self.agents.is_empty() {
            let options = bollard::query_parameters::RemoveContainerOptions {
                force: true,
                v: true,
                link: false,
            };
            match engine
                .docker
                .remove_container(&holder.container, Some(options))
                .await
            {
                Ok(()) => {}
                Err(e) if crate::docker::engine::is_not_found(&e) => {}
                Err(e) => return Err(Error::engine("remove the gateway container", e)),
            }
            self.holder = None;
        }
        Ok(())
    }

    fn sync_host_firewall_with(&self, engine: &Engine, extra: Option<&AgentNetwork>) -> Result<()> {
        let mut bridges: Vec<String> = self.agents.values().map(|a| a.net.bridge.clone()).collect();
        if let Some(net) = extra
            && !bridges.contains(&net.bridge)
        {
            bridges.push(net.bridge.clone());
        }
        hostfw::apply_host_table(engine.instance(), &bridges)
    }

    async fn apply_rules(&self, holder: &Holder, config: &DockerConfig) -> Result<()> {
        let rules = GatewayRules {
            ports: config.ports,
            agents: self
                .agents
                .values()
                .map(|a| AgentAttachment {
                    iface: a.iface.clone(),
                    gateway_addr: a.net.gateway_addr(),
                    subnet: a.net.subnet,
                })
                .collect(),
        };
        rules.apply(&holder.netns()).await?;
        Ok(())
    }

    /// Whether the holder this topology uses is still the running one (false when it was replaced or is
    /// gone, or none was found yet).
    pub(crate) async fn holder_is_current(&self, engine: &Engine) -> Result<bool> {
        match &self.holder {
            Some(h) => h.is_current(engine).await,
            None => Ok(false),
        }
    }

    /// Forget the holder (it was replaced) and every attachment, handing back what was attached: the caller
    /// attaches each again, which finds or starts the current holder and rebinds every listener in its
    /// namespace.
    pub(crate) fn take_all(&mut self) -> Vec<(AgentId, AgentNetwork)> {
        self.holder = None;
        std::mem::take(&mut self.agents)
            .into_iter()
            .map(|(agent, a)| {
                a.cancel.cancel();
                (agent, a.net)
            })
            .collect()
    }

    /// Agents currently attached.
    pub(crate) fn agents(&self) -> Vec<AgentId> {
        self.agents.keys().cloned().collect()
    }

    /// The network of an attached agent.
    pub(crate) fn network(&self, agent: &AgentId) -> Option<AgentNetwork> {
        self.agents.get(agent).map(|a| a.net.clone())
    }
}

/// Bind `agent`'s listeners at its `.2` inside the holder's namespace and serve them.
fn listen(
    holder: &Holder,
    gateway: &Gateway,
    tunnel: &Arc<TunnelServer>,
    config: &DockerConfig,
    agent: &AgentId,
    net: &AgentNetwork,
    cancel: CancellationToken,
) -> Result<()> {
    let ns = holder.netns();
    let at = |port| SocketAddr::V4(SocketAddrV4::new(net.gateway_addr(), port));
    let sockets = AgentSockets {
        transparent: Some(ns.bind_tcp(at(config.ports.proxy))?),
        explicit: Some(ns.bind_tcp(at(config.ports.explicit))?),
        dns: Some((
            ns.bind_udp(at(config.ports.dns))?,
            ns.bind_tcp(at(config.ports.dns))?,
        )),
    };
    gateway.attach(agent, sockets)?;
    if let Some(port) = config.ports.tunnel {
        let listener = ns.bind_tcp(at(port))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("tunnel listener", e))?;
        let listener =
            tokio::net::TcpListener::from_std(listener).map_err(|e| Error::io("tunnel listener", e))?;
        tokio::spawn(Arc::clone(tunnel).serve(agent.clone(), listener, cancel));
    }
    Ok(())
}
