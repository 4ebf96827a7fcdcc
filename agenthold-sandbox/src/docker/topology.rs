//! Which agents the gateway holder serves, and everything that follows from that set: the holder's
//! network memberships and `.2` addresses, the holder namespace's [`Datapath`] (its nftables ruleset and
//! each agent's listeners bound at its `.2`; the tunnel listener served here), the `DOCKER-USER` accepts
//! and the host table. Changes go through one lock, in an order that never opens the datapath: rules
//! before listeners, listeners before the sandbox starts.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use agenthold_core::{AgentId, Store};
use agenthold_egress::nft::AgentAttachment;
use agenthold_egress::{Attachment, Datapath, Gateway};
use ipnet::Ipv4Net;

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
struct Served {
    net: AgentNetwork,
    /// Rules, listeners and gateway attachment in the holder's namespace; ends the tunnel listener too.
    attachment: Attachment,
}

/// The holder and the agents it serves.
#[derive(Default)]
pub(crate) struct Topology {
    /// The running holder and the datapath of its namespace.
    holder: Option<(Holder, Datapath)>,
    agents: BTreeMap<AgentId, Served>,
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

    /// The running holder and its datapath, (re)created when missing or replaced.
    async fn holder(
        &mut self,
        engine: &Engine,
        gateway: &Arc<Gateway>,
        config: &DockerConfig,
    ) -> Result<(Holder, Datapath)> {
        if let Some((h, datapath)) = &self.holder
            && h.is_current(engine).await?
        {
            return Ok((h.clone(), datapath.clone()));
        }
        let holder = Holder::ensure(engine, &config.sandboxd_image).await?;
        let datapath = Datapath::new(holder.netns(), config.ports, Arc::clone(gateway)).await?;
        self.holder = Some((holder.clone(), datapath.clone()));
        Ok((holder, datapath))
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
        if let (Some(current), Some((h, _))) = (self.agents.get(agent), &self.holder)
            && current.net == net
            && h.is_current(engine).await?
        {
            // Already served by the running holder: rebinding would collide with the live listeners.
            return Ok(());
        }
        hostfw::allow_bridge(&net)?;
        self.sync_host_firewall_with(engine, Some(&net))?;
        let (holder, datapath) = self.holder(engine, gateway, config).await?;
        let iface = holder.join(engine, &net).await?;
        if let Some(old) = self.agents.remove(agent) {
            // Attached again at once below, which writes the rules: the gateway keeps the agent's state.
            old.attachment.forget();
        }
        self.reserved.remove(&net.subnet);
        let link = AgentAttachment {
            iface,
            gateway_addr: net.gateway_addr(),
            subnet: net.subnet,
        };
        let mut attachment = datapath.attach(agent, link).await?;
        if let Some(listener) = attachment.take_tunnel() {
            let listener =
                tokio::net::TcpListener::from_std(listener).map_err(|e| Error::io("tunnel listener", e))?;
            tokio::spawn(Arc::clone(tunnel).serve(agent.clone(), listener, attachment.cancelled()));
        }
        self.agents.insert(agent.clone(), Served { net, attachment });
        Ok(())
    }

    /// Stop serving `agent` and take the holder off `net` (its network, also when it was not attached, e.g.
    /// before a reconcile); the holder goes with the last agent.
    pub(crate) async fn detach(
        &mut self,
        engine: &Engine,
        gateway: &Arc<Gateway>,
        config: &DockerConfig,
        agent: &AgentId,
        net: &AgentNetwork,
    ) -> Result<()> {
        // Also when it is not attached here (before a reconcile): nothing of it may stay served.
        gateway.detach(agent);
        let gone = self.agents.remove(agent).map(|s| s.attachment);
        self.reserved.remove(&net.subnet);
        hostfw::disallow_bridge(&net.bridge)?;
        let (holder, datapath) = match self.holder.clone() {
            Some((h, datapath)) => (h, Some(datapath)),
            // Not found yet in this process: look for a running one without creating it.
            None => match Holder::find(engine).await? {
                Some(h) => (h, None),
                None => return self.sync_host_firewall_with(engine, None),
            },
        };
        // Its rules go before the holder leaves the network.
        if holder.is_current(engine).await? {
            match (gone, datapath) {
                (Some(a), Some(datapath)) if a.belongs_to(&datapath) => a.close().await?,
                (gone, Some(_)) => gone.into_iter().for_each(Attachment::forget),
                // A holder this process has not served yet: the rules of the agents served here (none).
                (gone, None) => {
                    gone.into_iter().for_each(Attachment::forget);
                    Datapath::new(holder.netns(), config.ports, Arc::clone(gateway)).await?;
                }
            }
        } else if let Some(a) = gone {
            // Attached in a namespace that is gone.
            a.forget();
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

    /// Whether the holder this topology uses is still the running one (false when it was replaced or is
    /// gone, or none was found yet).
    pub(crate) async fn holder_is_current(&self, engine: &Engine) -> Result<bool> {
        match &self.holder {
            Some((h, _)) => h.is_current(engine).await,
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
            .map(|(agent, served)| {
                // The namespace is gone: the agent is attached again in the new one.
                served.attachment.forget();
                (agent, served.net)
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

impl Drop for Topology {
    /// A runtime that goes away leaves the holder's rules as they are: its sandboxes keep running, and the
    /// next runtime reconciles them (S12). Dropping the attachments would rewrite the rules later, perhaps
    /// over those of that next runtime.
    fn drop(&mut self) {
        for served in std::mem::take(&mut self.agents).into_values() {
            served.attachment.forget();
        }
    }
}
