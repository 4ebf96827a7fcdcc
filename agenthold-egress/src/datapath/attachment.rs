//! [`Attachment`]: one agent served by a [`Datapath`], detached when closed or dropped.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use agenthold_core::AgentId;
use tokio_util::sync::CancellationToken;

use super::env::{CaPaths, resolv_conf, sandbox_env};
use super::{Datapath, Inner, retry_in_use};
use crate::Result;
use crate::gateway::AgentSockets;
use crate::nft::AgentAttachment;

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
    /// The attachment of `agent` on `link`, number `generation` in the datapath's agent set (where the
    /// caller has put it already).
    pub(super) fn new(inner: Arc<Inner>, agent: AgentId, link: AgentAttachment, generation: u64) -> Self {
        Self {
            inner,
            agent,
            link,
            generation,
            cancel: CancellationToken::new(),
            tunnel: None,
            done: false,
        }
    }

    /// Rules, listeners, gateway (see [`Datapath::attach`]).
    pub(super) async fn serve(&mut self) -> Result<()> {
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
                            tracing::warn!(agent = %agent, error = %e, "rules not rewritten after a detach");
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
