//! The transparent proxy (E4, E5): every TCP connection the sandbox makes, redirected here by nftables.
//!
//! It reads the original destination (SO_ORIGINAL_DST) and hands the connection to [`crate::flow`], which
//! decides by name: TLS → the ClientHello's SNI (no SNI: by address); HTTP → the `Host` of every request;
//! anything else → the name the agent resolved for that address through the gateway's DNS (none: by
//! address). Named destinations are resolved and dialled by the gateway itself; the client's address is
//! never dialled for them.
// enforces: E4

use std::net::SocketAddr;

use bytes::BytesMut;
use tokio::net::{TcpListener, TcpStream};
use tracing::Instrument;

use crate::accept::accept;
use crate::budget::ConnPermit;
use crate::context::AgentContext;
use crate::flow::{Aim, Flow};

/// Serve one agent's transparent listener.
pub(crate) async fn serve(on: AgentContext, listener: TcpListener) {
    accept(on, listener, |on, stream, permit| {
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

async fn handle(on: AgentContext, stream: TcpStream, permit: ConnPermit) {
    let orig = match original_dst(&stream) {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(agent = %on.agent, error = %e, "no original destination; dropping");
            return;
        }
    };
    let flow = Flow {
        on,
        aim: Aim::Orig(orig),
        port: orig.port(),
        permit: Some(permit),
        note_ech: false,
    };
    crate::flow::serve(flow, stream, BytesMut::with_capacity(4096), None).await;
}
