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
use crate::docker::network::{AgentNetwork, engine_subnets, pick_subnet};
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
    /// `None` while the agent waits to be attached to a new holder (the old one died and attaching it again
    /// failed so far): it stays here so that the host table, the subnet pick and a later restore still see
    /// it.
    attachment: Option<Attachment>,
}

/// How long a listing of the engine's subnets is used for new networks before it is taken again (networks
/// other programs removed meanwhile become free again then).
const ENGINE_SUBNETS_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// The holder and the agents it serves.
#[derive(Default)]
pub(crate) struct Topology {
    /// The running holder and the datapath of its namespace.
    holder: Option<(Holder, Datapath)>,
    agents: BTreeMap<AgentId, Served>,
    /// Subnets handed out but maybe not yet visible in the engine.
    reserved: HashSet<Ipv4Net>,
    /// The engine's subnets as last listed, and when: listed again after [`ENGINE_SUBNETS_TTL`] or when the
    /// engine refused a subnet as taken ([`Topology::subnet_refused`]), not on every create (the listing
    /// grows with the number of networks).
    engine_subnets: Option<(std::time::Instant, Vec<Ipv4Net>)>,
    /// Whether the holder goes when it serves no agent (the runtime is shutting down); otherwise an idle
    /// holder stays up for the next create.
    release_idle: bool,
}

impl Topology {
    /// A free `/prefix` of `pool` for `agent`.
    pub(crate) async fn allocate(
        &mut self,
        engine: &Engine,
        pool: Ipv4Net,
        prefix: u8,
        agent: &AgentId,
    ) -> Result<AgentNetwork> {
        let listed = match &self.engine_subnets {
            Some((at, subnets)) if at.elapsed() < ENGINE_SUBNETS_TTL => subnets.clone(),
            _ => {
                let subnets = engine_subnets(&engine.docker).await?;
                self.engine_subnets = Some((std::time::Instant::now(), subnets.clone()));
                subnets
            }
        };
        // Ours made since the listing are here; another program's are refused by the engine, which makes
        // the next allocation list again.
        let mut used = listed;
        used.extend(self.reserved.iter().copied());
        used.extend(self.agents.values().map(|a| a.net.subnet));
        let subnet = pick_subnet(pool, prefix, &used)?;
        self.reserved.insert(subnet);
        Ok(AgentNetwork::for_agent(agent, subnet))
    }

    /// The engine refused a subnet [`Topology::allocate`] picked as overlapping one of its networks: list
    /// them again for the next pick.
    pub(crate) fn subnet_refused(&mut self) {
        self.engine_subnets = None;
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

    /// Have the holder up (created and started when missing), serving nobody yet: what the first create
    /// would otherwise wait for. An idle holder has no agent networks, rules or listeners, and is closed
    /// from its creation (see [`Holder`]).
    pub(crate) async fn warm(
        &mut self,
        engine: &Engine,
        gateway: &Arc<Gateway>,
        config: &DockerConfig,
    ) -> Result<()> {
        self.holder(engine, gateway, config).await.map(|_| ())
    }

    /// From now on the holder goes with the last agent (shutdown); it goes at once when it serves nobody.
    pub(crate) async fn release(&mut self, engine: &Engine) -> Result<()> {
        self.release_idle = true;
        if !self.agents.is_empty() {
            return Ok(());
        }
        let holder = match self.holder.take() {
            Some((h, _)) => Some(h),
            None => Holder::find(engine).await?,
        };
        match holder {
            Some(h) => remove_holder(engine, &h).await,
            None => Ok(()),
        }
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
            && current.attachment.is_some()
            && h.is_current(engine).await?
        {
            // Already served by the running holder: rebinding would collide with the live listeners.
            return Ok(());
        }
        self.host_add(engine, &net)?;
        let (holder, datapath) = self.holder(engine, gateway, config).await?;
        // Three `ip` runs: on a blocking thread, so a create's sandbox side (engine calls polled by the same
        // task) goes on meanwhile.
        let iface = {
            let (holder, net) = (holder.clone(), net.clone());
            tokio::task::spawn_blocking(move || holder.join(&net))
                .await
                .map_err(|e| Error::Unavailable {
                    problem: format!("joining the gateway to the agent network: {e}"),
                })??
        };
        // Taken, not removed: should attaching fail below, a served agent stays known (waiting, closed).
        if let Some(old) = self.agents.get_mut(agent).and_then(|s| s.attachment.take()) {
            // Attached again at once below, which writes the rules: the gateway keeps the agent's state.
            old.forget();
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
        self.agents.insert(
            agent.clone(),
            Served {
                net,
                attachment: Some(attachment),
            },
        );
        Ok(())
    }

    /// Stop serving `agent` and take the holder off `net` (its network, also when it was not attached, e.g.
    /// before a reconcile). The holder stays up without agents (the next create need not start it again)
    /// unless the runtime is shutting down ([`Topology::release`]).
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
        let gone = self.agents.remove(agent).and_then(|s| s.attachment);
        self.reserved.remove(&net.subnet);
        let (holder, datapath) = match self.holder.clone() {
            Some((h, datapath)) => (h, Some(datapath)),
            // Not found yet in this process: look for a running one without creating it.
            None => match Holder::find(engine).await? {
                Some(h) => (h, None),
                None => return self.host_remove(engine, net),
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
        self.host_remove(engine, net)?;
        if self.agents.is_empty() && self.release_idle {
            remove_holder(engine, &holder).await?;
            self.holder = None;
        }
        Ok(())
    }

    /// The host table with `net` added (its elements only, once the table is written).
    fn host_add(&self, engine: &Engine, net: &AgentNetwork) -> Result<()> {
        let mut all: Vec<AgentNetwork> = self.agents.values().map(|a| a.net.clone()).collect();
        all.retain(|n| n.bridge != net.bridge);
        all.push(net.clone());
        hostfw::add_network(engine.instance(), &all, net)
    }

    /// The host table without `net` (the attached agents no longer include it); gone with the last.
    fn host_remove(&self, engine: &Engine, net: &AgentNetwork) -> Result<()> {
        let remaining: Vec<AgentNetwork> = self
            .agents
            .values()
            .map(|a| a.net.clone())
            .filter(|n| n.bridge != net.bridge)
            .collect();
        hostfw::remove_network(engine.instance(), &remaining, net)
    }

    /// Whether the holder this topology uses is still the running one (false when it was replaced or is
    /// gone, or none was found yet).
    pub(crate) async fn holder_is_current(&self, engine: &Engine) -> Result<bool> {
        match &self.holder {
            Some((h, _)) => h.is_current(engine).await,
            None => Ok(false),
        }
    }

    /// Whether no agent is served.
    pub(crate) fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// Whether an agent waits to be attached to a new holder (a restore failed part-way).
    pub(crate) fn awaiting_restore(&self) -> bool {
        self.agents.values().any(|a| a.attachment.is_none())
    }

    /// The agents waiting to be attached to a new holder, and their networks.
    pub(crate) fn awaiting(&self) -> Vec<(AgentId, AgentNetwork)> {
        self.agents
            .iter()
            .filter(|(_, a)| a.attachment.is_none())
            .map(|(agent, a)| (agent.clone(), a.net.clone()))
            .collect()
    }

    /// Forget the holder (it was replaced) and every attachment, handing back every agent: the caller
    /// attaches each again, which finds or starts the current holder and rebinds every listener in its
    /// namespace. The agents stay known (without an attachment) until then, also when attaching one fails.
    pub(crate) fn take_all(&mut self) -> Vec<(AgentId, AgentNetwork)> {
        self.holder = None;
        self.agents
            .iter_mut()
            .map(|(agent, served)| {
                // The namespace is gone: the agent is attached again in the new one.
                if let Some(old) = served.attachment.take() {
                    old.forget();
                }
                (agent.clone(), served.net.clone())
            })
            .collect()
    }

    /// The network of a served agent (attached, or waiting to be attached again).
    pub(crate) fn network(&self, agent: &AgentId) -> Option<AgentNetwork> {
        self.agents.get(agent).map(|a| a.net.clone())
    }
}

/// Remove the holder container.
async fn remove_holder(engine: &Engine, holder: &Holder) -> Result<()> {
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
        Ok(()) => Ok(()),
        Err(e) if crate::docker::engine::is_not_found(&e) => Ok(()),
        Err(e) => Err(Error::engine("remove the gateway container", e)),
    }
}

impl Drop for Topology {
    /// A runtime that goes away leaves the holder's rules as they are: its sandboxes keep running, and the
    /// next runtime reconciles them (S12). Dropping the attachments would rewrite the rules later, perhaps
    /// over those of that next runtime.
    fn drop(&mut self) {
        for served in std::mem::take(&mut self.agents).into_values() {
            if let Some(attachment) = served.attachment {
                attachment.forget();
            }
        }
    }
}

/// How long a change to the topology waits for the one before it. Every step under the lock is bounded
/// (an engine request by the client's 120 s timeout, `nft` and `ip` runs by their own), so a longer wait
/// means something is stuck: it fails with the name of what holds the lock instead of hanging.
pub(crate) const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// After this long waiting, the wait is logged (with what holds the lock).
const LOCK_WAIT_WARN: std::time::Duration = std::time::Duration::from_secs(20);

/// What holds the topology lock, and since when.
#[derive(Debug, Clone, Copy)]
struct Held {
    purpose: &'static str,
    since: std::time::Instant,
}

/// The [`Topology`] behind its lock, with bounded waits that say what the lock is held for.
pub(crate) struct TopologyLock {
    topology: tokio::sync::Mutex<Topology>,
    held: std::sync::Mutex<Option<Held>>,
}

impl Default for TopologyLock {
    fn default() -> Self {
        Self {
            topology: tokio::sync::Mutex::new(Topology::default()),
            held: std::sync::Mutex::new(None),
        }
    }
}

impl TopologyLock {
    /// The topology, for `purpose` (named in logs and errors while it is held), waiting at most `limit`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] naming what holds it, when it is still held after `limit`.
    pub(crate) async fn lock_within(
        &self,
        purpose: &'static str,
        limit: std::time::Duration,
    ) -> Result<TopologyGuard<'_>> {
        let started = std::time::Instant::now();
        let warn_after = LOCK_WAIT_WARN.min(limit);
        let guard = match tokio::time::timeout(warn_after, self.topology.lock()).await {
            Ok(guard) => guard,
            Err(_) => {
                tracing::warn!(
                    purpose,
                    held_by = %self.describe_holder(),
                    waited_secs = warn_after.as_secs(),
                    "waiting for the gateway topology"
                );
                let rest = limit.saturating_sub(started.elapsed());
                tokio::time::timeout(rest, self.topology.lock())
                    .await
                    .map_err(|_| Error::Unavailable {
                        problem: format!(
                            "gave up after {} s waiting to {purpose}: the gateway topology is held by {}",
                            limit.as_secs(),
                            self.describe_holder()
                        ),
                    })?
            }
        };
        *self.held_slot() = Some(Held {
            purpose,
            since: std::time::Instant::now(),
        });
        Ok(TopologyGuard {
            guard,
            held: &self.held,
        })
    }

    /// [`TopologyLock::lock_within`] with [`LOCK_WAIT`].
    pub(crate) async fn lock(&self, purpose: &'static str) -> Result<TopologyGuard<'_>> {
        self.lock_within(purpose, LOCK_WAIT).await
    }

    /// The topology if nobody holds it now.
    pub(crate) fn try_lock(&self, purpose: &'static str) -> Option<TopologyGuard<'_>> {
        let guard = self.topology.try_lock().ok()?;
        *self.held_slot() = Some(Held {
            purpose,
            since: std::time::Instant::now(),
        });
        Some(TopologyGuard {
            guard,
            held: &self.held,
        })
    }

    fn describe_holder(&self) -> String {
        match *self.held_slot() {
            Some(held) => format!("\"{}\" for {} s", held.purpose, held.since.elapsed().as_secs()),
            None => "nobody (it was just released)".to_owned(),
        }
    }

    fn held_slot(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        // Only plain assignments happen under this mutex: a poisoned one still holds a valid value.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The locked topology; says it is free again when dropped.
pub(crate) struct TopologyGuard<'a> {
    guard: tokio::sync::MutexGuard<'a, Topology>,
    held: &'a std::sync::Mutex<Option<Held>>,
}

impl std::ops::Deref for TopologyGuard<'_> {
    type Target = Topology;
    fn deref(&self) -> &Topology {
        &self.guard
    }
}

impl std::ops::DerefMut for TopologyGuard<'_> {
    fn deref_mut(&mut self) -> &mut Topology {
        &mut self.guard
    }
}

impl Drop for TopologyGuard<'_> {
    fn drop(&mut self) {
        *self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_wait_for_a_held_topology_is_bounded_and_names_the_holder() {
        let lock = TopologyLock::default();
        let held = lock.lock("start the gateway container ahead").await.unwrap();
        assert!(lock.try_lock("another").is_none(), "held twice");
        let err = match lock
            .lock_within("create a sandbox network", Duration::from_millis(50))
            .await
        {
            Ok(_) => panic!("locked twice"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("create a sandbox network"), "{err}");
        assert!(err.contains("start the gateway container ahead"), "{err}");
        drop(held);
        let again = lock
            .lock_within("create a sandbox network", Duration::from_millis(50))
            .await;
        assert!(again.is_ok(), "released lock not taken");
    }
}
