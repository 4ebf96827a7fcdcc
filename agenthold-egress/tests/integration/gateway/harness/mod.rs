//! A real gateway in a `TestNet`, served the way every deployment serves one: through a `Datapath` (hardened
//! gateway namespace, the real nftables ruleset, each agent's listeners bound at its `.2` inside the gateway
//! namespace), with a `PolicyTable`, `TestDns` as the DNS upstream and echo upstreams on loopback reached
//! through `Dangerous::connect_to` (never by switching the address guard off).
//!
//! Clients run inside a sandbox namespace with `nsenter --net` plus a private mount namespace in which the
//! sandbox's own `resolv.conf` (`nameserver <.2>`, what Docker's `--dns .2` writes) is bind-mounted over
//! `/etc/resolv.conf`. `nsenter --net` alone would leave curl and glibc reading the host's resolv.conf; that
//! happens to work here (DNS to any address is redirected to the gateway), but only while the host's
//! nameserver is an address that routes out of the sandbox (not `127.0.0.53`). `ip netns exec` would do the
//! same bind mount but needs a file under `/etc/netns/`, a host-wide change; `unshare --mount` keeps it
//! private to the one command.
//!
//! Every upstream name (`api.test`, `evil.test`, …) is a `connect_to` override: the gateway's DNS answers it
//! with a synthetic address (198.18.0.0/15) without asking `TestDns`, and the proxy dials the loopback
//! server for that name and port. Such names have no `TestDns` record, so a dial that missed the override
//! would fail to resolve rather than leave the machine. Sandboxes aim forged names at [`PUBLIC`] or
//! [`BLOCKED_ORIG`]; their packets never leave: nftables hands them to the gateway.
//!
//! With [`Setup::host_namespace`] the gateway, `TestDns` and the loopback upstreams run in a namespace of
//! the test's own that stands for the host (see `host.rs`): tests that make the gateway dial the host itself
//! or public-looking addresses use it, so that even a wrong dial stays inside the test's namespaces.

mod host;
mod sandbox;
mod upstreams;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agenthold_core::AgentId;
use agenthold_core::config::EgressConfig;
use agenthold_core::policy::{NetworkPolicy, PolicyMode, PolicyTable};
use agenthold_egress::log::{LogEntry, LogKind, Phase};
use agenthold_egress::nft::Ports;
use agenthold_egress::{Attachment, Dangerous, Datapath, Gateway, Limits, Timeouts};
use agenthold_testsupport::{EchoServer, TestAgent, TestCa, TestDns, TestNet, init_tracing, require_root};

pub(crate) use host::{HostNs, IFACE as HOST_IFACE, OWN_V4, OWN_V6, OWN_V6_NEIGHBOUR};
pub(crate) use upstreams::{BANNER, Canary, Web};
use upstreams::{Stalled, TcpUpstream, closed_loopback_port};

/// A public-looking address the sandbox may *aim* at: the sandbox's packets to it are redirected to the
/// gateway, and the gateway, deciding by name, never dials it. Tests that could make the gateway dial the
/// client's address (no name at all) use [`BLOCKED_ORIG`] instead, so that even a wrong dial stays inside.
pub(crate) const PUBLIC: &str = "93.184.216.34";

/// A destination in a blocked range (TEST-NET-2), for connections whose name is forged: if the gateway ever
/// fell back to the client's address, the address guard would stop the dial before a packet left.
pub(crate) const BLOCKED_ORIG: &str = "198.51.100.7";

/// What a test needs: agents, their policies, named upstreams, DNS records and gateway options.
pub(crate) struct Setup {
    agents: usize,
    policies: Vec<NetworkPolicy>,
    web: Vec<&'static str>,
    tcp: Vec<(&'static str, u16)>,
    refused: Vec<(&'static str, u16)>,
    stalled: Vec<(&'static str, u16)>,
    records: Vec<(&'static str, Vec<IpAddr>)>,
    timeouts: Option<Timeouts>,
    log_keep: Option<usize>,
    also: Vec<(&'static str, u16, bool)>,
    limits: Option<Limits>,
    egress: Option<fn(&mut EgressConfig)>,
    host_namespace: bool,
}

impl Setup {
    /// One agent with the open policy and the web upstreams `api.test` and `evil.test`.
    pub(crate) fn new() -> Self {
        Self {
            agents: 1,
            policies: Vec::new(),
            web: vec!["api.test", "evil.test"],
            tcp: Vec::new(),
            refused: Vec::new(),
            stalled: Vec::new(),
            records: Vec::new(),
            timeouts: None,
            log_keep: None,
            also: Vec::new(),
            limits: None,
            egress: None,
            host_namespace: false,
        }
    }

    /// Web upstream `name` also on `port`: its HTTPS echo (`tls`) or its HTTP echo, servers that wait for
    /// the client to speak first.
    pub(crate) fn also(mut self, name: &'static str, port: u16, tls: bool) -> Self {
        self.also.push((name, port, tls));
        self
    }

    /// The gateway's budgets.
    pub(crate) fn limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// `count` agents, each on its own network.
    pub(crate) fn agents(mut self, count: usize) -> Self {
        self.agents = count;
        self
    }

    /// The policy of every agent (agent `i` takes `policies[i]`, the last one repeats).
    pub(crate) fn policy(mut self, policy: NetworkPolicy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Web upstreams: each name gets an HTTPS echo server (`NAME:443`) and an HTTP one (`NAME:80`).
    pub(crate) fn web(mut self, names: &[&'static str]) -> Self {
        self.web = names.to_vec();
        self
    }

    /// A TCP upstream on loopback for `name:port`: it greets with [`BANNER`], then echoes.
    pub(crate) fn tcp(mut self, name: &'static str, port: u16) -> Self {
        self.tcp.push((name, port));
        self
    }

    /// `name:port` mapped to a loopback port where nothing listens (the upstream refuses).
    pub(crate) fn refused(mut self, name: &'static str, port: u16) -> Self {
        self.refused.push((name, port));
        self
    }

    /// `name:port` mapped to a loopback listener that never completes a handshake (see [`Stalled`]).
    pub(crate) fn stalled(mut self, name: &'static str, port: u16) -> Self {
        self.stalled.push((name, port));
        self
    }

    /// A record of the upstream DNS server (`TestDns`).
    pub(crate) fn record(mut self, name: &'static str, addrs: &[&str]) -> Self {
        self.records
            .push((name, addrs.iter().map(|a| a.parse().unwrap()).collect()));
        self
    }

    pub(crate) fn timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = Some(timeouts);
        self
    }

    pub(crate) fn log_keep(mut self, keep: usize) -> Self {
        self.log_keep = Some(keep);
        self
    }

    /// Change the `egress` configuration the gateway is built from (`Gateway::builder().config`).
    pub(crate) fn egress(mut self, change: fn(&mut EgressConfig)) -> Self {
        self.egress = Some(change);
        self
    }

    /// Run the gateway (and `TestDns`, the upstreams) in a namespace standing for the host (see `host.rs`).
    pub(crate) fn host_namespace(mut self) -> Self {
        self.host_namespace = true;
        self
    }
}

/// An allowlist policy.
pub(crate) fn allow(entries: &[&str]) -> NetworkPolicy {
    NetworkPolicy::parse(PolicyMode::Allowlist, entries).unwrap()
}

/// The gateway under test with its network, upstreams and clients.
pub(crate) struct Harness {
    pub(crate) net: TestNet,
    pub(crate) gateway: Arc<Gateway>,
    datapath: Datapath,
    /// Each agent's attachment (`None` while a test has it detached).
    attached: Mutex<Vec<Option<Attachment>>>,
    pub(crate) policy: Arc<PolicyTable>,
    pub(crate) dns: TestDns,
    pub(crate) config: EgressConfig,
    web: BTreeMap<&'static str, Web>,
    tcp: BTreeMap<&'static str, TcpUpstream>,
    _stalled: Vec<Stalled>,
    ids: Vec<AgentId>,
    dir: Scratch,
    /// Last: dropped after everything that runs on its runtime.
    host: Option<HostNs>,
}

/// A scratch directory (the CA file, each sandbox's resolv.conf), removed when dropped, also on a panic.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Harness {
    pub(crate) async fn start(setup: Setup) -> Self {
        require_root();
        init_tracing();
        if !setup.host_namespace {
            return Self::start_here(setup).await;
        }
        let host = HostNs::create();
        let mut h = host.runtime().spawn(Self::start_here(setup)).await.unwrap();
        h.host = Some(host);
        h
    }

    /// Everything but the host namespace, on the current runtime.
    async fn start_here(setup: Setup) -> Self {
        let dns = TestDns::start(setup.records.clone(), 30).await;
        let ca = Arc::new(TestCa::new());
        let mut connect_to = Vec::new();
        let mut web = BTreeMap::new();
        for name in &setup.web {
            let https = EchoServer::https_with_ca(Arc::clone(&ca), &[name]).await;
            let http = EchoServer::http().await;
            connect_to.push(((*name).to_owned(), 443, https.addr()));
            connect_to.push(((*name).to_owned(), 80, http.addr()));
            web.insert(*name, Web { https, http });
        }
        for (name, port, tls) in &setup.also {
            let w: &Web = &web[name];
            let addr = if *tls { w.https.addr() } else { w.http.addr() };
            connect_to.push(((*name).to_owned(), *port, addr));
        }
        let mut tcp = BTreeMap::new();
        for (name, port) in &setup.tcp {
            let upstream = TcpUpstream::start().await;
            connect_to.push(((*name).to_owned(), *port, upstream.addr));
            tcp.insert(*name, upstream);
        }
        for (name, port) in &setup.refused {
            connect_to.push(((*name).to_owned(), *port, closed_loopback_port().await));
        }
        let mut stalled = Vec::new();
        for (name, port) in &setup.stalled {
            let upstream = tokio::task::block_in_place(Stalled::start);
            connect_to.push(((*name).to_owned(), *port, upstream.addr));
            stalled.push(upstream);
        }

        // The configuration's defaults (ports, log size, timeouts) are what the gateway runs with, except
        // where a test says otherwise.
        let mut config = EgressConfig {
            dns_upstream: dns.addr().to_string(),
            ..EgressConfig::default()
        };
        if let Some(change) = setup.egress {
            change(&mut config);
        }
        let policy = Arc::new(PolicyTable::new());
        let mut builder = Gateway::builder()
            .policy(Arc::clone(&policy) as _)
            .config(&config)
            .unwrap()
            .dangerous(Dangerous {
                connect_to,
                ..Dangerous::default()
            });
        if let Some(t) = setup.timeouts {
            builder = builder.timeouts(t);
        }
        if let Some(keep) = setup.log_keep {
            builder = builder.log_keep(keep);
        }
        if let Some(limits) = setup.limits {
            builder = builder.limits(limits);
        }
        let gateway = Arc::new(builder.build().unwrap());

        let net = TestNet::with_agents(setup.agents);
        let datapath = Datapath::new(
            net.gateway().clone(),
            Ports::from_config(&config),
            Arc::clone(&gateway),
        )
        .await
        .unwrap();

        static RUN: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "agenthold-gateway-test-{}-{}",
            std::process::id(),
            RUN.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let dir = Scratch(dir);
        std::fs::write(dir.0.join("ca.pem"), ca.pem()).unwrap();

        let mut ids = Vec::new();
        let mut attached = Vec::new();
        for (i, agent) in net.agents().iter().enumerate() {
            let id = AgentId::new(format!("agent-{i}")).unwrap();
            let p = setup
                .policies
                .get(i)
                .or(setup.policies.last())
                .cloned()
                .unwrap_or_else(NetworkPolicy::open);
            policy.set(id.clone(), p);
            let gw = agent.gateway_addr();
            attached.push(Some(attach(&datapath, &id, agent).await));
            std::fs::write(
                dir.0.join(format!("resolv-{i}.conf")),
                agenthold_egress::datapath::resolv_conf(gw),
            )
            .unwrap();
            ids.push(id);
        }
        Self {
            net,
            gateway,
            datapath,
            attached: Mutex::new(attached),
            policy,
            dns,
            config,
            web,
            tcp,
            _stalled: stalled,
            ids,
            dir,
            host: None,
        }
    }

    /// The namespace standing for the host (with [`Setup::host_namespace`]).
    pub(crate) fn host_ns(&self) -> &HostNs {
        self.host.as_ref().expect("Setup::host_namespace")
    }

    /// Run `f` where the gateway runs: on the host namespace's runtime when there is one (sockets it opens
    /// are the host's), else here.
    pub(crate) async fn on_host<F>(&self, f: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.host {
            Some(host) => host.runtime().spawn(f).await.unwrap(),
            None => f.await,
        }
    }

    /// Detaches agent `i` through its datapath and attaches it again with fresh listeners (after a
    /// detach: what a reconcile does).
    pub(crate) async fn reattach(&self, i: usize) {
        let old = self.attached.lock().unwrap()[i].take();
        if let Some(old) = old {
            old.close().await.unwrap();
        }
        let new = attach(&self.datapath, self.id(i), self.agent(i)).await;
        self.attached.lock().unwrap()[i] = Some(new);
    }

    /// Detach every agent, stop the gateway, remove the namespaces and the files, and assert nothing is
    /// left.
    pub(crate) async fn close(self) {
        let attached: Vec<Attachment> = std::mem::take(&mut *self.attached.lock().unwrap())
            .into_iter()
            .flatten()
            .collect();
        for attachment in attached {
            attachment.close().await.unwrap();
        }
        assert!(self.datapath.agents().is_empty());
        self.gateway.shutdown(Duration::from_secs(2)).await;
        let Self { net, host, .. } = self;
        net.close();
        if let Some(host) = host {
            let ns = host.ns.clone();
            drop(host);
            assert!(!ns.exists(), "namespace {ns} still exists after close");
        }
    }

    pub(crate) fn id(&self, i: usize) -> &AgentId {
        &self.ids[i]
    }

    pub(crate) fn agent(&self, i: usize) -> &TestAgent {
        self.net.agent(i)
    }

    /// Agent `i`'s gateway address (its `.2`).
    pub(crate) fn gw(&self, i: usize) -> Ipv4Addr {
        self.agent(i).gateway_addr()
    }

    /// `IP:PORT` of agent `i`'s explicit proxy.
    pub(crate) fn explicit(&self, i: usize) -> String {
        format!("{}:{}", self.gw(i), self.config.explicit_port)
    }

    /// `http://IP:PORT` of agent `i`'s explicit proxy (what `HTTPS_PROXY` holds).
    pub(crate) fn proxy_url(&self, i: usize) -> String {
        format!("http://{}", self.explicit(i))
    }

    /// The test CA's certificate file (what `CURL_CA_BUNDLE` would name).
    pub(crate) fn ca_file(&self) -> String {
        self.dir.0.join("ca.pem").display().to_string()
    }

    /// A scratch file path.
    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    pub(crate) fn web(&self, name: &str) -> &Web {
        &self.web[name]
    }

    pub(crate) fn tcp(&self, name: &str) -> &TcpUpstream {
        &self.tcp[name]
    }

    pub(crate) fn set_policy(&self, i: usize, policy: NetworkPolicy) {
        self.policy.set(self.id(i).clone(), policy);
    }

    /// Agent `i`'s request log.
    pub(crate) fn log(&self, i: usize) -> Vec<LogEntry> {
        self.gateway.log().snapshot(self.id(i))
    }

    /// Agent `i`'s log entries of `kind` for `host`: one-shot entries, and long-lived connections' entries
    /// written when they closed.
    pub(crate) fn entries(&self, i: usize, kind: LogKind, host: &str) -> Vec<LogEntry> {
        self.log(i)
            .into_iter()
            .filter(|e| e.kind == kind && e.host.as_deref() == Some(host) && e.phase != Some(Phase::Open))
            .collect()
    }

    /// The entries written when long-lived connections of `kind` to `host` opened.
    pub(crate) fn opened(&self, i: usize, kind: LogKind, host: &str) -> Vec<LogEntry> {
        self.log(i)
            .into_iter()
            .filter(|e| e.kind == kind && e.host.as_deref() == Some(host) && e.phase == Some(Phase::Open))
            .collect()
    }

    /// Waits (up to 3 s) for agent `i`'s log to hold `count` entries of `kind` for `host`, and returns them.
    /// Spliced connections are logged when they close, a moment after the client exits.
    pub(crate) async fn wait_entries(
        &self,
        i: usize,
        kind: LogKind,
        host: &str,
        count: usize,
    ) -> Vec<LogEntry> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        loop {
            let found = self.entries(i, kind, host);
            if found.len() >= count {
                return found;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "expected {count} {kind:?} entries for {host}, log: {:#?}",
                self.log(i)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Serves `agent` as `id` through the datapath (rules, listeners at its `.2` on the configured ports).
async fn attach(datapath: &Datapath, id: &AgentId, agent: &TestAgent) -> Attachment {
    let mut attachment = datapath.attach(id, agent.attachment()).await.unwrap();
    // No tunnel server here: its port is closed, as in a deployment whose tunnel is not up.
    drop(attachment.take_tunnel());
    attachment
}

/// The HTTP/1.1 request text `client.py session` sends.
pub(crate) fn get(path: &str, host: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n")
}

/// Owned strings from string slices (curl arguments built in loops).
pub(crate) fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}
