//! The running gateway's namespace lets only TCP and DNS out of a sandbox (E3). The rules themselves are
//! covered with stand-in listeners in `datapath.rs`; here the real listeners are bound, so a port left open
//! by them would show.

use std::net::SocketAddr;

use serde_json::json;

use super::harness::{Harness, Setup, allow, get};
use crate::support::probe;

// covers: E3
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn with_the_gateway_running_only_tcp_and_dns_leave_the_sandbox() {
    let h = Harness::start(Setup::new().policy(allow(&["api.test"]))).await;
    assert_eq!(h.net.gateway().read_sysctl("net.ipv4.ip_forward").unwrap(), "0");
    assert_eq!(
        h.net
            .gateway()
            .read_sysctl("net.ipv4.conf.all.rp_filter")
            .unwrap(),
        "1"
    );
    let gw = h.gw(0);
    let at = |port: u16| SocketAddr::from((gw, port));
    let agent = h.agent(0);
    let c = &h.config;

    let (
        udp_out,
        udp_ntp,
        icmp_out,
        icmp_gw,
        proxy_direct,
        dns_udp_direct,
        dns_tcp_direct,
        ssh_gw,
        tunnel_gw,
    ) = tokio::join!(
        probe(agent, "udp", "1.1.1.1:443".parse().unwrap(), &["x"]),
        probe(agent, "udp", "192.0.2.1:123".parse().unwrap(), &["x"]),
        probe(agent, "icmp", "1.1.1.1:0".parse().unwrap(), &[]),
        probe(agent, "icmp", at(0), &[]),
        probe(agent, "tcp", at(c.proxy_port), &[]),
        probe(agent, "udp", at(c.dns_port), &["x"]),
        probe(agent, "tcp", at(c.dns_port), &[]),
        probe(agent, "tcp", at(22), &[]),
        // No tunnel listener is bound in these tests: the port is accepted by the rules but nobody answers.
        probe(agent, "tcp", at(c.tunnel_port), &[]),
    );
    udp_out.assert_silence("UDP (QUIC) to the outside");
    udp_ntp.assert_silence("UDP (NTP) to the host's router");
    icmp_out.assert_silence("ping to the outside");
    icmp_gw.assert_silence("ping to the gateway");
    proxy_direct.assert_silence("the transparent proxy's port, addressed directly");
    dns_udp_direct.assert_silence("the resolver's port over UDP, addressed directly");
    dns_tcp_direct.assert_silence("the resolver's port over TCP, addressed directly");
    ssh_gw.assert_silence("port 22 of the gateway");
    assert_eq!(
        tunnel_gw.result(),
        "refused",
        "the tunnel port passes the rules: {:?}",
        tunnel_gw.0
    );

    // Controls, on the same datapath: the explicit proxy answers when addressed directly, DNS to any address
    // is answered by the resolver, and TCP to anywhere reaches the transparent proxy.
    let explicit = h
        .py(
            0,
            &[
                "session",
                &gw.to_string(),
                &c.explicit_port.to_string(),
                &json!([get("/", "api.test")]).to_string(),
                "sequential",
            ],
        )
        .await;
    assert_eq!(
        explicit[0]["status"], 400,
        "origin-form to the explicit proxy is a bad request: {explicit}"
    );
    let dns = h.py(0, &["dns", "1.1.1.1", "api.test", "A", "udp"]).await;
    assert_eq!(dns["rcode"], 0, "{dns}");
    assert_eq!(
        h.curl(0, &["--connect-to", "api.test:80:1.1.1.1:80", "http://api.test/"])
            .await
            .status,
        200
    );
    h.close().await;
}
