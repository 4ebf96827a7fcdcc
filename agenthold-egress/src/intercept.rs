//! TLS interception (E13, E14): for a host one of the agent's secret rules covers, the gateway terminates
//! the sandbox's TLS with a leaf minted by the installation's CA, serves HTTP/1.1 or HTTP/2 (by ALPN) on
//! it, and forwards each request, injected, over verified TLS to the real upstream. Every other host is
//! spliced untouched; this module never sees it. Interception starts only once the bytes are a ClientHello
//! (on any port), never because of a port or a CONNECT target: a rule host reached with something other
//! than TLS is decided like any other connection.
// enforces: E13

use std::sync::Arc;

use agenthold_core::AgentId;
use agenthold_core::policy::Verdict;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::budget::ConnPermit;
use crate::context::{AgentContext, Context};
use crate::http::{ConnCtx, Mode, Proto};
use crate::log::{LogEntry, LogKind};

/// Terminate TLS on `io` (positioned at the ClientHello) as `sni` and serve the requests on it: a
/// connection of `on` to `sni:port` that `crate::flow` decided to intercept (see
/// `Context::intercepts`), holding `permit`.
pub(crate) async fn serve<IO>(on: AgentContext, permit: Option<ConnPermit>, port: u16, io: IO, sni: String)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let gw = &on.gw;
    let Some(config) = gw.tls_server.clone() else {
        return;
    };
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(io);
    let tls = match tokio::time::timeout(gw.timeouts.sniff, accept).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            return handshake_failed(gw, &on.agent, &sni, port, &format!("client TLS handshake: {e}"));
        }
        Err(_) => return handshake_failed(gw, &on.agent, &sni, port, "client TLS handshake timed out"),
    };
    let proto = if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
        Proto::Http2
    } else {
        Proto::Http1
    };
    let ctx = ConnCtx::new(on, permit, Mode::Intercepted { sni, port });
    crate::http::serve(Arc::new(ctx), tls, proto).await;
}

/// Log a client that did not complete the handshake (typically: it does not trust the CA).
fn handshake_failed(gw: &Context, agent: &AgentId, sni: &str, port: u16, why: &str) {
    let mut entry = LogEntry::new(agent, LogKind::Tls, Verdict::Allowed).to(sni, port);
    entry.fail(why);
    gw.log.record(entry);
}
