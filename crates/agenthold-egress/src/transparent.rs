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

/// Accept loop of one agent's listener: each connection takes a permit of the agent's connection budget
/// (refused ones are closed at once) and runs `handle` until it ends or `cancel` fires.
pub(crate) async fn accept_loop<F, Fut>(
    gw: Arc<Shared>,
    budget: Arc<AgentBudget>,
    listener: TcpListener,
    cancel: CancellationToken,
    handle: F,
) where
    F: Fn(TcpStream, ConnPermit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
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
        let Some(permit) = gw.budget.connection(&budget) else {
            // Counted in the budget's refusals; the connection is closed unread.
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = handle(stream, permit);
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = conn => {},
                () = cancel.cancelled() => {},
            }
        });
    }
}

/// Serve one agent's transparent listener.
pub(crate) async fn serve(
    gw: Arc<Shared>,
    agent: AgentId,
    budget: Arc<AgentBudget>,
    listener: TcpListener,
    cancel: CancellationToken,
) {
    let token = cancel.clone();
    let shared = Arc::clone(&gw);
    let agent_budget = Arc::clone(&budget);
    accept_loop(gw, budget, listener, cancel, move |stream, permit| {
        let span = tracing::debug_span!("transparent", agent = %agent);
        handle(
            Arc::clone(&shared),
            agent.clone(),
            Arc::clone(&agent_budget),
            stream,
            permit,
            token.clone(),
        )
        .instrument(span)
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

async fn handle(
    gw: Arc<Shared>,
    agent: AgentId,
    budget: Arc<AgentBudget>,
    stream: TcpStream,
    permit: ConnPermit,
    cancel: CancellationToken,
) {
    let orig = match original_dst(&stream) {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(agent = %agent, error = %e, "no original destination; dropping");
            return;
        }
    };
    let flow = Flow {
        gw,
        agent,
        budget,
        cancel,
        aim: Aim::Orig(orig),
        port: orig.port(),
        permit: Some(permit),
        note_ech: false,
    };
    crate::flow::serve(flow, stream, BytesMut::with_capacity(4096), None).await;
}
