//! `TestNet`: sandbox namespaces joined to one gateway namespace by veth pairs, made and removed per test.

use std::fs::{File, OpenOptions};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agenthold_egress::datapath;
use agenthold_egress::netns::NetNs;
use agenthold_egress::nft::AgentAttachment;
use ipnet::{IpNet, Ipv4Net};
use nix::fcntl::{Flock, FlockArg};

/// Lock files that hand out subnet numbers across threads and processes (flock: released by the kernel
/// when the holder dies, so a crashed test run never leaks a number).
const LOCK_DIR: &str = "/run/agenthold-testnet";

/// The sandbox-side interface name, as Docker would call it.
const SANDBOX_IFACE: &str = "eth0";

/// One sandbox attached to the gateway: its namespace, `10.213.N.0/24`, the gateway side `.2` on
/// interface `ahN` (in the gateway namespace) and the sandbox side `.3` on `eth0`.
#[derive(Debug)]
pub struct TestAgent {
    sandbox: NetNs,
    n: u8,
    iface: String,
    /// Holding the lock reserves `n` (and the namespace names derived from it) for this agent.
    _slot: Flock<File>,
}

impl TestAgent {
    /// The sandbox namespace.
    pub fn sandbox(&self) -> &NetNs {
        &self.sandbox
    }

    /// The gateway-side interface name (`ahN`, in the gateway namespace).
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// `10.213.N.0/24`.
    pub fn subnet(&self) -> Ipv4Net {
        Ipv4Net::new(Ipv4Addr::new(10, 213, self.n, 0), 24).expect("a /24 is a valid prefix")
    }

    /// The gateway's address on this agent's network (`10.213.N.2`).
    pub fn gateway_addr(&self) -> Ipv4Addr {
        datapath::gateway_addr(self.subnet())
    }

    /// The sandbox's address (`10.213.N.3`).
    pub fn sandbox_addr(&self) -> Ipv4Addr {
        datapath::sandbox_addr(self.subnet())
    }

    /// This agent as the gateway's rules see it (what `Datapath::attach` takes).
    pub fn attachment(&self) -> AgentAttachment {
        AgentAttachment::on_subnet(self.iface.clone(), self.subnet())
    }

    /// Runs `args[0]` with the other arguments inside the sandbox and waits for it (curl, python3 -c …).
    pub fn run(&self, args: &[&str]) -> Output {
        let (program, rest) = args.split_first().expect("a program to run");
        self.sandbox
            .command(program)
            .args(rest)
            .output()
            .expect("run a command in the sandbox")
    }

    /// [`TestAgent::run`] without blocking the runtime: for tests whose listeners run on the same runtime.
    pub async fn run_async(&self, args: &[&str]) -> Output {
        let (program, rest) = args.split_first().expect("a program to run");
        let mut command = tokio::process::Command::from(self.sandbox.command(program));
        command.args(rest).kill_on_drop(true);
        command.output().await.expect("run a command in the sandbox")
    }
}

/// A gateway namespace and one or more sandbox namespaces, each sandbox joined to the gateway by its own
/// veth pair (one "agent network" each), with unique names so tests run in parallel, in one process or
/// many.
///
/// Agent `i` gets `10.213.N.0/24` with N unique on the machine while the test runs: gateway side
/// `10.213.N.2/24` on `ahN`, sandbox side `10.213.N.3/24` on `eth0` with its default route via `.2`.
/// Links and `lo` are up and IPv6 is disabled in every namespace. No rules and no gateway sysctls are
/// set: that is the code under test's job. Dropping it deletes the namespaces (the veth pairs go with
/// them); [`TestNet::close`] does the same and asserts it.
#[derive(Debug)]
pub struct TestNet {
    gateway: NetNs,
    agents: Vec<TestAgent>,
    closed: bool,
}

impl TestNet {
    /// A gateway with one sandbox.
    pub fn new() -> Self {
        Self::with_agents(1)
    }

    /// A gateway with `count` sandboxes, each on its own network.
    pub fn with_agents(count: usize) -> Self {
        crate::require_root();
        assert!(count >= 1, "a TestNet needs at least one agent");
        std::fs::create_dir_all(LOCK_DIR).expect("create the TestNet lock directory");
        let slots: Vec<(u8, Flock<File>)> = (0..count).map(|_| reserve_slot()).collect();
        let gateway = NetNs::named(&format!("aht{}-gw", slots[0].0));
        let agents: Vec<TestAgent> = slots
            .into_iter()
            .map(|(n, slot)| TestAgent {
                sandbox: NetNs::named(&format!("aht{n}-sb")),
                n,
                iface: format!("ah{n}"),
                _slot: slot,
            })
            .collect();
        // From here on, Drop removes whatever was created, also when a step below panics.
        let net = Self {
            gateway,
            agents,
            closed: false,
        };
        let _creating = creation_lock();
        for ns in std::iter::once(&net.gateway).chain(net.agents.iter().map(|a| &a.sandbox)) {
            // Our slot lock is held, so a namespace with our name is a leftover of a crashed run.
            if ns.exists() {
                ns.delete().expect("delete a leftover test namespace");
            }
            NetNs::create(ns.name().expect("named")).expect("create a test namespace");
            // Before any interface exists, so that none ever gets an IPv6 (link-local) address.
            for key in [
                "net.ipv6.conf.all.disable_ipv6",
                "net.ipv6.conf.default.disable_ipv6",
            ] {
                ns.sysctl(key, "1").expect("disable IPv6");
            }
            ns.link_up("lo").expect("lo up");
        }
        for agent in &net.agents {
            let gw = &net.gateway;
            gw.veth_pair(&agent.iface, &agent.sandbox, SANDBOX_IFACE)
                .expect("create the veth pair");
            gw.add_address(&agent.iface, IpNet::V4(net_addr(agent.gateway_addr())))
                .expect("gateway address");
            gw.link_up(&agent.iface).expect("gateway side up");
            let sb = &agent.sandbox;
            sb.add_address(SANDBOX_IFACE, IpNet::V4(net_addr(agent.sandbox_addr())))
                .expect("sandbox address");
            sb.link_up(SANDBOX_IFACE).expect("sandbox side up");
            sb.add_default_route(IpAddr::V4(agent.gateway_addr()))
                .expect("sandbox default route");
        }
        for agent in &net.agents {
            wait_until_up(&net.gateway, &agent.iface);
            wait_until_up(&agent.sandbox, SANDBOX_IFACE);
        }
        tracing::debug!(gateway = %net.gateway, agents = net.agents.len(), "test network ready");
        net
    }

    /// The gateway namespace.
    pub fn gateway(&self) -> &NetNs {
        &self.gateway
    }

    /// Every agent, in creation order.
    pub fn agents(&self) -> &[TestAgent] {
        &self.agents
    }

    /// Agent `i`.
    pub fn agent(&self, i: usize) -> &TestAgent {
        &self.agents[i]
    }

    /// Every agent as the gateway's rules see it.
    pub fn attachments(&self) -> Vec<AgentAttachment> {
        self.agents.iter().map(TestAgent::attachment).collect()
    }

    /// The first agent's sandbox namespace.
    pub fn sandbox(&self) -> &NetNs {
        self.agents[0].sandbox()
    }

    /// The gateway's address on the first agent's network (`10.213.N.2`).
    pub fn gateway_addr(&self) -> Ipv4Addr {
        self.agents[0].gateway_addr()
    }

    /// The first sandbox's address (`10.213.N.3`).
    pub fn sandbox_addr(&self) -> Ipv4Addr {
        self.agents[0].sandbox_addr()
    }

    /// The gateway-side interface of the first agent's network.
    pub fn iface(&self) -> &str {
        self.agents[0].iface()
    }

    /// Runs a command in the first sandbox (see [`TestAgent::run`]).
    pub fn run_in_sandbox(&self, args: &[&str]) -> Output {
        self.agents[0].run(args)
    }

    /// Runs a command in the first sandbox without blocking the runtime (see [`TestAgent::run_async`]).
    pub async fn run_in_sandbox_async(&self, args: &[&str]) -> Output {
        self.agents[0].run_async(args).await
    }

    /// Every namespace this net created (gateway first).
    pub fn namespaces(&self) -> Vec<NetNs> {
        std::iter::once(self.gateway.clone())
            .chain(self.agents.iter().map(|a| a.sandbox.clone()))
            .collect()
    }

    /// Deletes every namespace and asserts that none is left.
    pub fn close(mut self) {
        let namespaces = self.namespaces();
        self.remove();
        for ns in namespaces {
            assert!(!ns.exists(), "namespace {ns} still exists after close");
        }
    }

    fn remove(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        for ns in self.namespaces() {
            if ns.exists()
                && let Err(error) = ns.delete()
            {
                tracing::warn!(%ns, %error, "could not delete a test namespace");
            }
        }
    }
}

impl Default for TestNet {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Waits until the kernel reports `iface` operationally up. Carrier changes are applied by the kernel's
/// link watcher, up to a second after `ip link set up`, and until then the device's queue discards every
/// packet: a test that sends at once would see a drop that no rule made.
fn wait_until_up(ns: &NetNs, iface: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let link = ns
            .ip(&["-o", "link", "show", "dev", iface])
            .expect("read the link state");
        if link.contains("state UP") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{iface} in {ns} is not up after 5 s: {link}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn net_addr(addr: Ipv4Addr) -> Ipv4Net {
    Ipv4Net::new(addr, 24).expect("a /24 is a valid prefix")
}

/// Takes the first free N in 1..=254, starting at a point that differs between processes and calls so
/// that parallel tests rarely contend for the same lock file.
fn reserve_slot() -> (u8, Flock<File>) {
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let start =
        std::process::id().wrapping_mul(31) ^ nanos ^ CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(97);
    for i in 0..254u32 {
        let n = u8::try_from((start.wrapping_add(i)) % 254 + 1).expect("1..=254 fits in u8");
        let file = open_lock(&Path::new(LOCK_DIR).join(format!("{n}.lock")));
        if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            return (n, lock);
        }
    }
    panic!("all 254 TestNet subnets are in use");
}

/// Serialises `ip netns add` across processes: the first one on a machine makes `/run/netns` a shared
/// mount, and two doing that at once can stack mounts.
fn creation_lock() -> Flock<File> {
    let file = open_lock(&Path::new(LOCK_DIR).join("create.lock"));
    Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| errno)
        .expect("lock namespace creation")
}

fn open_lock(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .expect("open a TestNet lock file")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "needs root and nftables: run with make test"]
    fn slots_are_exclusive_within_a_process() {
        std::fs::create_dir_all(LOCK_DIR).unwrap();
        let slots: Vec<_> = (0..8).map(|_| reserve_slot()).collect();
        let mut numbers: Vec<u8> = slots.iter().map(|(n, _)| *n).collect();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(numbers.len(), 8);
        assert!(numbers.iter().all(|n| (1..=254).contains(n)));
    }
}
