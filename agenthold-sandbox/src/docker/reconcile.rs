//! Reconcile (S12): after the runtime process is killed and started again on the same data directory,
//! running sandboxes are found by label, the gateway holder is re-joined to their networks, rules and
//! listeners are restored and their tunnels accepted again with the token hash persisted at their boot, all
//! without restarting any sandbox. Then engine events are watched: a gateway holder that dies or restarts
//! is restored (until then its namespace is closed), a sandbox started behind agenthold's back gets a new
//! boot token, and a stopped one loses its tunnel. An event is acted on only when the container's name is
//! the one agenthold gives the object its labels describe (S15): labels alone are not trusted.
// enforces: S12

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agenthold_core::AgentId;
use agenthold_core::sandbox::ReconcileReport;
use bollard::query_parameters::{EventsOptions, InspectContainerOptions};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::container::{container_name, put_boot_token};
use super::{DockerSandbox, topology};
use crate::docker::engine::{LABEL_AGENT, LABEL_INSTANCE, LABEL_ROLE, is_not_found};
use crate::docker::holder::Holder;
use crate::error::{Error, Result};
use crate::tunnel::new_token;

/// When agents that a gateway restore could not attach again are tried again first; the wait doubles
/// with every attempt that leaves one of them unattached, up to [`RESTORE_RETRY_MAX`].
const RESTORE_RETRY: Duration = Duration::from_secs(2);
/// The longest wait between two attempts to attach agents a restore left unattached.
const RESTORE_RETRY_MAX: Duration = Duration::from_secs(60);

impl DockerSandbox {
    /// Restore every agent this installation knows (by its own records).
    pub(super) async fn reconcile_records(&self) -> Result<ReconcileReport> {
        let mut report = ReconcileReport::default();
        for (agent, record) in topology::RECORDS.list(self.store.as_ref()).await? {
            let running = match self
                .engine
                .docker
                .inspect_container(&container_name(&agent), None::<InspectContainerOptions>)
                .await
            {
                Ok(c) => c.state.and_then(|s| s.running).unwrap_or(false),
                Err(e) if is_not_found(&e) => {
                    report.missing.push(agent);
                    continue;
                }
                Err(e) => return Err(Error::engine(format!("inspect the sandbox of {agent}"), e)),
            };
            {
                let mut topo = self.topology.lock("restore a sandbox after a restart").await?;
                self.serve(&mut topo, &agent, record.net.clone()).await?;
            }
            // Plugged already unless it was started while no runtime watched (idempotent). One that cannot
            // be plugged stays without a network (closed) and must not cost the others their restore.
            if running && let Err(e) = self.plug(&agent, &record.net).await {
                tracing::warn!(agent = %agent, error = %e, "cannot plug the sandbox into its network; it stays without one");
            }
            match (running, record.token.as_deref().and_then(parse_hash)) {
                (true, Some(hash)) => self.tunnel.expect(&agent, hash),
                // Running without a known token: a boot we never saw; give it a fresh one.
                (true, None) => self.reboot_token(&agent).await?,
                (false, _) => self.tunnel.revoke(&agent),
            }
            report.restored.push(agent);
        }
        Ok(report)
    }

    /// A new token for a sandbox that is already running (sandboxd waits for the boot file).
    async fn reboot_token(&self, agent: &AgentId) -> Result<()> {
        let (token, hash) = new_token();
        self.tunnel.expect(agent, hash);
        topology::save_token(self.store.as_ref(), agent, Some(hash)).await?;
        put_boot_token(&self.engine, &self.config, agent, &token).await
    }

    /// Re-attach every served agent when the holder was replaced or is gone: a restarted holder's namespace
    /// comes back empty and closed. Events about the holder agenthold itself just started change nothing.
    async fn restore_gateway(&self) -> Result<()> {
        let mut topo = self.topology.lock("restore the gateway container").await?;
        let pending = if topo.holder_is_current(&self.engine).await? {
            // Nothing, or what a restore that failed part-way left for the new holder.
            topo.awaiting()
        } else if topo.is_empty() {
            return Ok(());
        } else {
            tracing::warn!("the gateway container was restarted or stopped; restoring the datapath");
            let served = topo.take_all();
            // Closed until each agent is attached again below.
            Holder::unplug_all(served.iter().map(|(_, net)| net));
            served
        };
        for (agent, net) in pending {
            // One agent that cannot be attached (its network broken, say) must not cost the others their
            // egress: it stays known without an attachment, closed, and is tried again
            // ([`RESTORE_RETRY`]).
            let attached = self.serve(&mut topo, &agent, net).await;
            if let Err(e) = attached {
                tracing::warn!(
                    agent = %agent,
                    error = %e,
                    "cannot attach the agent to the gateway container again; it stays closed and is tried again"
                );
            }
        }
        Ok(())
    }

    /// Try again for agents a restore could not attach (none: nothing is done, not even an engine call).
    /// Whether one still waits afterwards.
    async fn retry_restore(&self) -> bool {
        let awaiting = || {
            self.topology
                .try_lock("look for agents awaiting a restore")
                .is_some_and(|topo| topo.awaiting_restore())
        };
        if !awaiting() {
            return false;
        }
        if let Err(e) = self.restore_gateway().await {
            tracing::warn!(error = %e, "restoring the datapath failed");
        }
        awaiting()
    }

    /// Watch engine events until `cancel`, restoring what restarts take away.
    pub(super) fn watch(self: &Arc<Self>, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            while !cancel.is_cancelled() {
                tokio::select! {
                    () = cancel.cancelled() => break,
                    res = this.watch_once() => {
                        if let Err(e) = res {
                            tracing::warn!(error = %e, "engine event stream failed; reconnecting");
                        }
                    }
                }
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            // Shutdown: an idle holder goes now, a busy one with the last agent removed after this.
            let released = match this.topology.lock("release the idle gateway container").await {
                Ok(mut topo) => topo.release(&this.engine).await,
                Err(e) => Err(e),
            };
            if let Err(e) = released {
                tracing::warn!(error = %e, "cannot remove the idle gateway container");
            }
        })
    }

    async fn watch_once(&self) -> Result<()> {
        let filters = HashMap::from([
            ("type".to_owned(), vec!["container".to_owned()]),
            (
                "label".to_owned(),
                vec![format!("{LABEL_INSTANCE}={}", self.engine.instance())],
            ),
        ]);
        let options = EventsOptions {
            filters: Some(filters),
            ..Default::default()
        };
        let mut events = self.engine.docker.events(Some(options));
        let mut retry_in = RESTORE_RETRY;
        let mut retry_at = tokio::time::Instant::now() + retry_in;
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                () = tokio::time::sleep_until(retry_at) => {
                    retry_in = if self.retry_restore().await {
                        (retry_in * 2).min(RESTORE_RETRY_MAX)
                    } else {
                        RESTORE_RETRY
                    };
                    retry_at = tokio::time::Instant::now() + retry_in;
                    continue;
                }
            };
            let Some(event) = event else { break };
            let event = event.map_err(|e| Error::engine("events", e))?;
            self.handle_event(event).await;
        }
        Ok(())
    }

    async fn handle_event(&self, event: bollard::models::EventMessage) {
        let action = event.action.unwrap_or_default();
        let labels = event.actor.and_then(|a| a.attributes).unwrap_or_default();
        let role = labels.get(LABEL_ROLE).map(String::as_str);
        let agent = labels.get(LABEL_AGENT).and_then(|a| AgentId::new(a.clone()).ok());
        // Labels say what an object is; the name agenthold gave it must agree (S15): a container labelled
        // as another agent's sandbox, or as the holder, is not acted on.
        let name = labels.get("name").map(String::as_str);
        let named_as_labelled = match (role, &agent) {
            (Some("sandbox"), Some(agent)) => name == Some(container_name(agent).as_str()),
            (Some("gateway"), _) => name == Some(Holder::name(&self.engine).as_str()),
            _ => true,
        };
        if !named_as_labelled {
            tracing::warn!(
                action,
                container = name.unwrap_or_default(),
                "engine event of a container whose labels do not match its name; ignored"
            );
            return;
        }
        if let Err(e) = self.on_event(&action, role, agent.as_ref()).await {
            tracing::warn!(action, error = %e, "restoring after an engine event failed");
        }
    }

    async fn on_event(&self, action: &str, role: Option<&str>, agent: Option<&AgentId>) -> Result<()> {
        match (role, action, agent) {
            (Some("gateway"), "start" | "die", _) => self.restore_gateway().await,
            (Some("sandbox"), "start", Some(agent)) => {
                if self.own_start(agent) {
                    return Ok(());
                }
                tracing::info!(agent = %agent, "sandbox started outside agenthold; issuing a boot token");
                self.reboot_token(agent).await?;
                // Its network too: nobody else plugs it in (it has loopback only until then).
                match topology::RECORDS.load(self.store.as_ref(), agent).await? {
                    Some(record) => self.plug(agent, &record.net).await,
                    None => Ok(()),
                }
            }
            (Some("sandbox"), "die", Some(agent)) => {
                // A late event of an earlier stop must not revoke the token of a boot that followed it; nor
                // must the death of a container being replaced (the new one boots with the same token).
                if self.is_remade(agent) || self.is_running(agent).await? {
                    return Ok(());
                }
                self.tunnel.revoke(agent);
                topology::save_token(self.store.as_ref(), agent, None).await
            }
            _ => Ok(()),
        }
    }
}

impl DockerSandbox {
    pub(super) async fn is_running(&self, agent: &AgentId) -> Result<bool> {
        match self
            .engine
            .docker
            .inspect_container(&container_name(agent), None::<InspectContainerOptions>)
            .await
        {
            Ok(c) => Ok(c.state.and_then(|s| s.running).unwrap_or(false)),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(Error::engine(format!("inspect the sandbox of {agent}"), e)),
        }
    }
}

fn parse_hash(hex_hash: &str) -> Option<[u8; 32]> {
    hex::decode(hex_hash).ok()?.try_into().ok()
}
