//! The transparent proxy (E4, E5): every TCP connection the sandbox makes, redirected here by nftables.
//!
//! It reads the original destination (SO_ORIGINAL_DST) and hands the connection to [`crate::flow`], which
//! decides by name: TLS → the ClientHello's SNI (no SNI: by address); HTTP → the `Host` of every request;
//! anything else → the name the agent resolved for that address through the gateway's DNS (none: by
//! address). Named destinations are resolved and dialled by the gateway itself; the client's address is
//! never dialled for them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agenthold_core::AgentId;
use bytes::BytesMut;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::budget::{AgentBudget, ConnPermit};
use crate::flow::{Aim, Flow};
use crate::gateway::Shared;

/// One agent's listener: what every connection accepted on it is served with.
#[derive(Clone)]
pub(crate) struct Listener {
    pub(crate) gw: Arc<Shared>,
    pub(crate) agent: AgentId,
    pub(crate) budget: Arc<AgentBudget>,
    /// Fires when the agent is detached or the gateway shuts down.
    pub(crate) cancel: CancellationToken,
}

impl Listener {
    /// Accept connections on `listener`: each takes a permit of the agent's connection budget (refused ones
    /// are closed at once) and runs `handle` until it ends or the agent is detached.
    pub(crate) async fn accept<F, Fut>(self, listener: TcpListener, handle: F)
    where
        F: Fn(&Self, TcpStream, ConnPermit) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        loop {
            let accepted = tokio::select! {
                () = self.cancel.cancelled() => return,
                a = listener.accept() => a,
            };
            let stream = match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(permit) = self.gw.budget.connection(&self.budget) else {
                // Counted in the budget's refusals; the connection is closed unread.
                continue;
            };
            let _ = stream.set_nodelay(true);
            let conn = handle(&self, stream, permit);
            let cancel = self.cancel.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = conn => {},
                    () = cancel.cancelled() => {},
                }
            });
        }
    }
}

/// Serve one agent's transparent listener.
pub(crate) async fn serve(on: Listener, listener: TcpListener) {
    on.accept(listener, |on, stream, permit| {
        let span = tracing::debug_span!("transparent", agent = %on.agent);
        handle(on.clone(), stream, permit).instrument(span)
    })
    .await;
}

fn original_dst(stream: &TcpStream) -> std::io::Result<SocketAddr> {
    let sock = socket2::SockRef::from(stream);
    match stream.local_addr()? {
        SocketAddr::V4(_) => sock.original_dst_v4(),
        SocketAddr::V6(_) => sock.original_dst_v6(),
    }
    .and_then(|a| {
        a.as_socket()
            .ok_or_else(|| std::io::Error::other("original destination is not IP"))
    })
}

async fn handle(on: Listener, stream: TcpStream, permit: ConnPermit) {
    let orig = match original_dst(&stream) {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(agent = %on.agent, error = %e, "no original destination; dropping");
            return;
        }
    };
    let flow = Flow {
        gw: on.gw,
        agent: on.agent,
        budget: on.budget,
        cancel: on.cancel,
        aim: Aim::Orig(orig),
        port: orig.port(),
        permit: Some(permit),
        note_ech: false,
    };
    crate::flow::serve(flow, stream, BytesMut::with_capacity(4096), None).await;
}
