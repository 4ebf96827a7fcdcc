//! Accepting an agent's connections, for the transparent and the explicit proxy alike: each connection
//! takes a permit of the agent's connection budget (E20) and is served until it ends or the agent is
//! detached.

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use crate::budget::ConnPermit;
use crate::context::AgentContext;

/// Accept connections on `listener` for `on`: each takes a permit of the agent's connection budget
/// (refused ones are closed at once) and runs `handle` until it ends or the agent is detached.
pub(crate) async fn accept<F, Fut>(on: AgentContext, listener: TcpListener, handle: F)
where
    F: Fn(&AgentContext, TcpStream, ConnPermit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            () = on.cancel.cancelled() => return,
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
        let Some(permit) = on.gw.budget.connection(&on.budget) else {
            // Counted in the budget's refusals; the connection is closed unread.
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = handle(&on, stream, permit);
        let cancel = on.cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = conn => {},
                () = cancel.cancelled() => {},
            }
        });
    }
}
