//! `NetNs`: entering a namespace on a short-lived thread, sockets and sysctls that stay inside it,
//! commands run inside it, and the lifecycle helpers.

use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use agenthold_egress::netns::NetNs;
use agenthold_testsupport::{TestNet, init_tracing, require_root};
use tokio::io::AsyncReadExt;

/// The inode of the network namespace of the calling thread (or of a namespace file).
fn ns_inode(path: &str) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

#[test]
#[ignore = "needs root and nftables: run with make test"]
fn run_enters_on_a_short_lived_thread_and_leaves_the_caller_alone() {
    require_root();
    init_tracing();
    let net = TestNet::new();
    let before = ns_inode("/proc/thread-self/ns/net");
    let caller = std::thread::current().id();
    let (inside, thread) = net
        .gateway()
        .run(|| Ok((ns_inode("/proc/thread-self/ns/net"), std::thread::current().id())))
        .unwrap();
    assert_eq!(
        inside,
        ns_inode(net.gateway().path().to_str().unwrap()),
        "the closure ran in the gateway"
    );
    assert_ne!(thread, caller, "the closure ran on its own thread");
    assert_eq!(
        ns_inode("/proc/thread-self/ns/net"),
        before,
        "the caller's namespace did not change"
    );
    // The process's own namespace, by pid, is where the caller is.
    let own = NetNs::of_pid(std::process::id());
    assert_eq!(
        own.run(|| Ok(ns_inode("/proc/thread-self/ns/net"))).unwrap(),
        before
    );
    // Errors from the closure come back with the namespace named.
    let err = net
        .gateway()
        .run(|| Err::<(), _>(std::io::Error::other("boom")))
        .unwrap_err();
    assert!(err.to_string().contains(net.gateway().name().unwrap()) && err.to_string().contains("boom"));
    net.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn sockets_bound_inside_serve_from_any_thread() {
    require_root();
    init_tracing();
    let net = TestNet::new();
    let gw = net.gateway_addr();
    let listener = net.gateway().bind_tcp(SocketAddr::from((gw, 0))).unwrap();
    let addr = listener.local_addr().unwrap();
    assert_eq!(
        addr.ip(),
        gw,
        "bound to the gateway's .2, which exists only inside the gateway namespace"
    );
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let udp = net.gateway().bind_udp(SocketAddr::from((gw, 0))).unwrap();
    let udp_addr = udp.local_addr().unwrap();
    let udp = tokio::net::UdpSocket::from_std(udp).unwrap();

    // A client inside the sandbox (no rules yet) reaches both; tokio serves them from its own threads.
    let client = tokio::task::spawn_blocking({
        let sandbox = net.sandbox().clone();
        move || {
            sandbox.run(|| {
                let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
                std::io::Write::write_all(&mut tcp, b"over tcp")?;
                let udp = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
                udp.send_to(b"over udp", udp_addr)?;
                Ok(())
            })
        }
    });
    let (mut stream, peer) = listener.accept().await.unwrap();
    assert_eq!(peer.ip(), net.sandbox_addr());
    let mut received = String::new();
    stream.read_to_string(&mut received).await.unwrap();
    assert_eq!(received, "over tcp");
    let mut buf = [0u8; 64];
    let (len, from) = udp.recv_from(&mut buf).await.unwrap();
    assert_eq!(
        (&buf[..len], from.ip()),
        (&b"over udp"[..], net.sandbox_addr().into())
    );
    client.await.unwrap().unwrap();

    // Binding an address the namespace does not have fails, naming the namespace and the address.
    let err = net
        .sandbox()
        .bind_tcp(SocketAddr::from((gw, 0)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(net.sandbox().name().unwrap()) && err.contains(&gw.to_string()),
        "{err}"
    );
    drop((listener, stream, udp));
    net.close();
}

#[test]
#[ignore = "needs root and nftables: run with make test"]
fn sysctls_are_per_namespace() {
    require_root();
    init_tracing();
    let net = TestNet::new();
    let host = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap();
    let flipped = if host.trim() == "1" { "0" } else { "1" };
    net.gateway().sysctl("net.ipv4.ip_forward", flipped).unwrap();
    assert_eq!(net.gateway().read_sysctl("net.ipv4.ip_forward").unwrap(), flipped);
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap(),
        host,
        "host unchanged"
    );
    // A new namespace starts with the host's IPv4 `all`/`default` settings (devconf_inherit_init_net=0
    // means "inherit" for IPv4): the sandbox still has the host's value, whatever we wrote next door.
    assert_eq!(
        net.sandbox().read_sysctl("net.ipv4.ip_forward").unwrap(),
        host.trim(),
        "sandbox unchanged"
    );
    // Interface names may contain dots: the slash form addresses them.
    let key = format!("net/ipv4/conf/{}/rp_filter", net.iface());
    net.gateway().sysctl(&key, "2").unwrap();
    assert_eq!(net.gateway().read_sysctl(&key).unwrap(), "2");
    // Global sysctls are refused: from "inside" they would change the whole machine.
    assert!(net.gateway().sysctl("kernel.hostname", "x").is_err());
    net.close();
}

#[test]
#[ignore = "needs root and nftables: run with make test"]
fn commands_run_inside_and_lifecycle_errors_carry_stderr() {
    require_root();
    init_tracing();
    let net = TestNet::new();
    let addrs = net.gateway().ip(&["-o", "-4", "addr", "show"]).unwrap();
    assert!(addrs.contains(&format!("{}/24", net.gateway_addr())), "{addrs}");
    assert!(!addrs.contains(&net.sandbox_addr().to_string()), "{addrs}");
    let output = net
        .gateway()
        .command("cat")
        .arg("/proc/net/dev")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&output.stdout).contains(net.iface()));
    // No IPv6 anywhere in a TestNet (not even link-local).
    for ns in net.namespaces() {
        assert_eq!(
            ns.ip(&["-6", "addr", "show"]).unwrap().trim(),
            "",
            "IPv6 address in {ns}"
        );
    }

    // create / delete, and what their failures say.
    let name = format!("ahx-{}", std::process::id());
    let ns = NetNs::create(&name).unwrap();
    assert!(ns.exists());
    let err = NetNs::create(&name).unwrap_err().to_string();
    assert!(err.contains(&name) && err.contains("exists"), "{err}");
    ns.delete().unwrap();
    assert!(!ns.exists());
    let err = ns.delete().unwrap_err().to_string();
    assert!(err.contains(&name) && err.contains("deleting"), "{err}");
    let err = net.gateway().link_up("no-such-if").unwrap_err().to_string();
    assert!(err.contains("no-such-if") && err.contains("ip link set"), "{err}");
    net.close();
}
