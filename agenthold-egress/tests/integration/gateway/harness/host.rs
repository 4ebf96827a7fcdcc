//! A stand-in for the host: a network namespace of the test's own that the gateway dials from, with
//! public-looking addresses on a veth pair the test owns, so that dials to "the host itself" can be tried
//! without touching the machine's real interfaces (E22).
//!
//! The gateway dials from the namespace of the threads it runs on, so [`HostNs::runtime`] builds a tokio
//! runtime whose worker threads are created inside the namespace (threads inherit the namespace of the
//! thread that spawns them); the harness then builds the gateway, its upstream DNS server and its loopback
//! upstreams on that runtime. Nothing here routes anywhere: the namespace has only its loopback and the veth
//! pair (both ends inside it), so a dial the guard wrongly let through either lands on a listener of the
//! test or fails with "network unreachable" before a packet leaves.

use std::sync::atomic::{AtomicU32, Ordering};

use agenthold_egress::netns::NetNs;

/// The host's public-looking IPv4 address (on `hv0`, `/24`).
pub(crate) const OWN_V4: &str = "45.76.0.10";
/// The host's public-looking IPv6 address (on `hv0`, `/64`).
pub(crate) const OWN_V6: &str = "2a0e:1234:5678:9abc::10";
/// Another address in the host's IPv6 on-link prefix (no one has it).
pub(crate) const OWN_V6_NEIGHBOUR: &str = "2a0e:1234:5678:9abc::99";
/// The interface the addresses are on.
pub(crate) const IFACE: &str = "hv0";

/// The namespace and the runtime whose threads live in it. Dropping it stops the runtime (without
/// waiting) and deletes the namespace.
pub(crate) struct HostNs {
    pub(crate) ns: NetNs,
    runtime: Option<tokio::runtime::Runtime>,
}

impl HostNs {
    /// A fresh namespace: `lo` up, a veth pair `hv0`/`hv1` (both inside) up, [`OWN_V4`]`/24` and
    /// [`OWN_V6`]`/64` on `hv0`; and a runtime inside it.
    pub(crate) fn create() -> Self {
        static RUN: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "aht-host-{}-{}",
            std::process::id(),
            RUN.fetch_add(1, Ordering::Relaxed)
        );
        let ns = NetNs::named(&name);
        if ns.exists() {
            ns.delete().unwrap();
        }
        NetNs::create(&name).unwrap();
        let mut host = Self { ns, runtime: None };
        let ns = &host.ns;
        ns.link_up("lo").unwrap();
        ns.veth_pair(IFACE, ns, "hv1").unwrap();
        ns.ip(&["addr", "add", &format!("{OWN_V4}/24"), "dev", IFACE])
            .unwrap();
        ns.ip(&["addr", "add", &format!("{OWN_V6}/64"), "dev", IFACE, "nodad"])
            .unwrap();
        ns.link_up(IFACE).unwrap();
        ns.link_up("hv1").unwrap();
        let runtime = ns
            .run(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
            })
            .unwrap();
        host.runtime = Some(runtime);
        host
    }

    /// The runtime whose threads are inside the namespace.
    pub(crate) fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().unwrap()
    }
}

impl Drop for HostNs {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        if self.ns.exists() {
            let _ = self.ns.delete();
        }
    }
}
