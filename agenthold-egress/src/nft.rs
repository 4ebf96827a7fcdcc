//! The nftables ruleset of the gateway's network namespace (E3) and the sysctls that go with it.
//!
//! The gateway namespace owns `.2` on every agent network and is each sandbox's default route and DNS
//! server. Its ruleset turns that position into a funnel: DNS (UDP and TCP 53, to any address) goes to our
//! resolver, every other TCP connection not addressed to the gateway goes to the transparent proxy, the
//! gateway itself answers only on the explicit proxy and tunnel ports, and everything else (other UDP,
//! ICMP, IPv6, forwarding) is dropped.
//!
//! Identity is the interface a packet arrived on (`iifname`), never its source address. The rules are the
//! same few whatever the number of agents: what differs per agent lives in sets and a map keyed by the
//! arrival interface ([`MAP_GATEWAY`]: its `.2`; [`SET_GATEWAY`]: interface . its `.2`; [`SET_SOURCE`]:
//! interface . its agent network), so a packet costs a few hash lookups, not a walk over every agent's
//! rules. An interface with no entries gets nothing: its lookups fail and the input policy drops it.
//!
//! At start-up the whole table (rules and every element) is replaced in one nft transaction
//! ([`GatewayRules::apply`]); attaching or detaching an agent adds or deletes its elements in one
//! transaction ([`apply_element_changes`]), so there is never a moment with half a ruleset, and the cost of
//! a change does not grow with the number of agents.
// enforces: E3

use std::borrow::Cow;
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::process::Stdio;

use ipnet::Ipv4Net;
use nftables::expr::{self, Expression, Fib, FibFlag, FibResult, Meta, MetaKey, NamedExpression};
use nftables::schema::{
    Chain, Element, Map, NfCmd, NfListObject, NfObject, Nftables, Rule, Set, SetFlag, SetType, SetTypeValue,
    Table,
};
use nftables::stmt::{self, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use tokio::io::AsyncWriteExt;

use crate::netns::NetNs;
use crate::{Error, Result};

/// The one table agenthold owns in the gateway namespace (`inet`: one table sees IPv4 and IPv6, so IPv6
/// falls into the same drop policies instead of bypassing an `ip`-only table).
pub const TABLE: &str = "agenthold";

/// Map `ifname : ipv4_addr`: each attached interface's gateway address (its `.2`), the target of its
/// redirections.
pub const MAP_GATEWAY: &str = "agent_gateway";
/// Set `ifname . ipv4_addr`: each attached interface with its own gateway address, the only local address
/// an agent may reach through that interface.
pub const SET_GATEWAY: &str = "agent_own_gateway";
/// Set `ifname . ipv4_addr` with intervals: each attached interface with its agent network, the only
/// sources accepted from it.
pub const SET_SOURCE: &str = "agent_source";

/// Priority of the `dstnat` hook point (NF_IP_PRI_NAT_DST).
const PRIO_DSTNAT: i32 = -100;
/// Priority of the `filter` hook point (NF_IP_PRI_FILTER).
const PRIO_FILTER: i32 = 0;

/// Longest interface name the kernel accepts (IFNAMSIZ - 1).
const MAX_IFACE_LEN: usize = 15;

/// The base chains: (name, type, hook, priority, policy).
#[rustfmt::skip] // a table reads better in columns
const CHAINS: [(&str, NfChainType, NfHook, i32, NfChainPolicy); 4] = [
    // Redirections happen before the routing decision, so that redirected packets are local ones.
    ("prerouting", NfChainType::NAT, NfHook::Prerouting, PRIO_DSTNAT, NfChainPolicy::Accept),
    ("input", NfChainType::Filter, NfHook::Input, PRIO_FILTER, NfChainPolicy::Drop),
    // The gateway never routes: sandboxes reach the world only through our listeners.
    ("forward", NfChainType::Filter, NfHook::Forward, PRIO_FILTER, NfChainPolicy::Drop),
    // The gateway namespace only answers; upstream connections leave from the process's own namespace.
    ("output", NfChainType::Filter, NfHook::Output, PRIO_FILTER, NfChainPolicy::Drop),
];

/// The gateway's listening ports inside the gateway namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// The transparent proxy: every redirected TCP connection (`egress.proxy_port`, default 15001).
    pub proxy: u16,
    /// The explicit proxy, reached directly via `HTTPS_PROXY` (`egress.explicit_port`, default 15002).
    pub explicit: u16,
    /// The DNS resolver, UDP and TCP, reached only by redirection from port 53 (`egress.dns_port`,
    /// default 15053).
    pub dns: u16,
    /// The tunnel, reached directly, when the deployment runs one (`egress.tunnel_port`, default 15003).
    pub tunnel: Option<u16>,
}

impl Default for Ports {
    /// The configuration's default ports (the seeds': 15001, 15002, 15053 and the tunnel on 15003).
    fn default() -> Self {
        Self::from_config(&agenthold_core::config::EgressConfig::default())
    }
}

/// One agent network attached to the gateway namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentAttachment {
    /// The gateway-side interface of the agent network: the agent's identity on the datapath.
    pub iface: String,
    /// The gateway's address on that network (the `.2`), where the listeners for this agent are bound.
    pub gateway_addr: Ipv4Addr,
    /// The agent network; packets from this interface must come from inside it.
    pub subnet: Ipv4Net,
}

/// The gateway namespace's ruleset for a set of ports and attached agents.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatewayRules {
    /// Where the gateway listens.
    pub ports: Ports,
    /// Every attached agent network; may be empty (then nothing but loopback is accepted).
    pub agents: Vec<AgentAttachment>,
}

impl GatewayRules {
    /// The nft batch that replaces table `inet agenthold` with the current rules.
    ///
    /// The batch first adds the table (a no-op when it exists) and then deletes it, so that the delete
    /// never fails on a fresh namespace; then it builds the table again: its sets, its chains, their
    /// rules (the same few whatever the number of agents) and one element per agent in each set. nft
    /// applies a batch as one transaction: applying the same rules twice, or an empty agent list, is
    /// always valid.
    pub fn ruleset(&self) -> Nftables<'static> {
        let table = || {
            NfListObject::Table(Table {
                family: NfFamily::INet,
                name: TABLE.into(),
                handle: None,
            })
        };
        let mut objects = vec![
            NfObject::CmdObject(NfCmd::Add(table())),
            NfObject::CmdObject(NfCmd::Delete(table())),
            NfObject::CmdObject(NfCmd::Add(table())),
        ];
        objects.extend(sets().into_iter().map(add));
        objects.extend(CHAINS.iter().map(|&(name, kind, hook, prio, policy)| {
            add(NfListObject::Chain(Chain {
                family: NfFamily::INet,
                table: TABLE.into(),
                name: name.into(),
                _type: Some(kind),
                hook: Some(hook),
                prio: Some(prio),
                policy: Some(policy),
                ..Chain::default()
            }))
        }));
        objects.extend(self.prerouting().into_iter().map(add));
        objects.extend(self.input().into_iter().map(add));
        objects.extend(output().into_iter().map(add));
        objects.extend(elements(&self.agents).into_iter().map(add));
        Nftables {
            objects: objects.into(),
        }
    }

    /// DNS to the resolver, every other TCP not for the gateway to the transparent proxy, each to the
    /// `.2` of the arrival interface (looked up in [`MAP_GATEWAY`]: an interface that is not attached has
    /// no entry, the lookup fails, and the rule does not apply).
    fn prerouting(&self) -> Vec<NfListObject<'static>> {
        let dns = |proto: &'static str| {
            rule(
                "prerouting",
                vec![
                    matches(port_field(proto, "dport"), Expression::Number(53)),
                    dnat_by_iface(self.ports.dns),
                ],
                // DNS to *any* address is answered by our resolver: no query leaves unseen (E9).
                format!("{proto} DNS to the resolver"),
            )
        };
        vec![
            dns("udp"),
            dns("tcp"),
            rule(
                "prerouting",
                vec![
                    // Not addressed to the arrival interface's own .2.
                    matches_op(Operator::NEQ, iface_and(ip_field("daddr")), set_ref(SET_GATEWAY)),
                    matches(meta(MetaKey::L4proto), Expression::String("tcp".into())),
                    // `dnat` to the explicit .2 rather than `redirect`: redirect picks the interface's
                    // primary address, which is not always the .2 the listener is bound to.
                    dnat_by_iface(self.ports.proxy),
                ],
                "other TCP to the transparent proxy".into(),
            ),
        ]
    }

    /// Default drop; accept only what an agent may reach on its own interface's gateway address.
    fn input(&self) -> Vec<NfListObject<'static>> {
        let to_own_gateway = || matches(iface_and(ip_field("daddr")), set_ref(SET_GATEWAY));
        let ports = |ports: &[u16]| match ports {
            [port] => Expression::Number((*port).into()),
            _ => Expression::Named(NamedExpression::Set(
                ports
                    .iter()
                    .map(|&p| expr::SetItem::Element(Expression::Number(p.into())))
                    .collect(),
            )),
        };
        let redirected = || matches_op(Operator::IN, ct("status"), Expression::String("dnat".into()));
        // The transparent and DNS ports take only redirected traffic (`ct status dnat`): a direct
        // connection to them would skip the original-destination bookkeeping the proxy relies on.
        let tcp_redirected = [self.ports.proxy, self.ports.dns];
        // The only ports a sandbox may address directly: the explicit proxy and the tunnel.
        let direct: Vec<u16> = [Some(self.ports.explicit), self.ports.tunnel]
            .into_iter()
            .flatten()
            .collect();
        vec![
            rule(
                "input",
                vec![
                    matches(meta(MetaKey::Iif), Expression::String("lo".into())),
                    accept(),
                ],
                "loopback inside the gateway namespace".into(),
            ),
            // Anti-spoofing: the source must be routable back out of the interface it came in on.
            rule(
                "input",
                vec![
                    matches(
                        fib(FibResult::Oif, [FibFlag::Saddr, FibFlag::Iif]),
                        Expression::Boolean(false),
                    ),
                    drop_packet(),
                ],
                "source not reachable via the arrival interface".into(),
            ),
            // The kernel accepts a packet for any local address on any interface (weak host model): without
            // this, agent A could address agent B's .2 through A's own interface.
            rule(
                "input",
                vec![
                    matches_op(
                        Operator::NEQ,
                        fib(FibResult::Type, [FibFlag::Daddr, FibFlag::Iif]),
                        Expression::String("local".into()),
                    ),
                    drop_packet(),
                ],
                "destination not an address of the arrival interface".into(),
            ),
            // Explicit source check per interface ([`SET_SOURCE`]: interface . its agent network): holds
            // even if the namespace had a default route out of an agent interface (which would make the
            // fib check above accept any source from it). An interface not attached has no entry at all.
            rule(
                "input",
                vec![
                    matches_op(Operator::NEQ, iface_and(ip_field("saddr")), set_ref(SET_SOURCE)),
                    drop_packet(),
                ],
                "source outside the arrival interface's agent network".into(),
            ),
            rule(
                "input",
                vec![
                    to_own_gateway(),
                    matches(port_field("tcp", "dport"), ports(&tcp_redirected)),
                    redirected(),
                    accept(),
                ],
                "redirected tcp to the transparent proxy and DNS".into(),
            ),
            rule(
                "input",
                vec![
                    to_own_gateway(),
                    matches(port_field("udp", "dport"), ports(&[self.ports.dns])),
                    redirected(),
                    accept(),
                ],
                "redirected udp to the DNS".into(),
            ),
            rule(
                "input",
                vec![
                    to_own_gateway(),
                    matches(port_field("tcp", "dport"), ports(&direct)),
                    accept(),
                ],
                "explicit proxy and tunnel".into(),
            ),
        ]
    }

    /// Checks what nft would otherwise reject half-way or, worse, accept with another meaning (an `*` in
    /// an interface name is a wildcard for `iifname`).
    pub fn validate(&self) -> Result<()> {
        let p = self.ports;
        let ports = [Some(p.proxy), Some(p.explicit), Some(p.dns), p.tunnel];
        let ports: Vec<u16> = ports.into_iter().flatten().collect();
        if ports.contains(&0) {
            return Err(config(format!("gateway ports must be 1-65535: {p:?}")));
        }
        if ports
            .iter()
            .enumerate()
            .any(|(i, port)| ports[..i].contains(port))
        {
            return Err(config(format!("gateway ports must all differ: {p:?}")));
        }
        for agent in &self.agents {
            let iface = &agent.iface;
            let valid_name = !iface.is_empty()
                && iface.len() <= MAX_IFACE_LEN
                && iface
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b));
            if !valid_name {
                return Err(config(format!("invalid interface name {iface:?}")));
            }
            if !agent.subnet.contains(&agent.gateway_addr) {
                return Err(config(format!(
                    "{iface}: gateway address {} is outside {}",
                    agent.gateway_addr, agent.subnet
                )));
            }
            if self.agents.iter().filter(|a| a.iface == *iface).count() > 1 {
                return Err(config(format!("interface {iface} attached twice")));
            }
        }
        Ok(())
    }

    /// Replaces table `inet agenthold` inside `ns` with [`GatewayRules::ruleset`], atomically, by running
    /// `nft -j -f -` inside the namespace.
    pub async fn apply(&self, ns: &NetNs) -> Result<()> {
        self.validate()?;
        run_nft(ns, &self.ruleset()).await?;
        tracing::debug!(namespace = %ns, agents = self.agents.len(), "gateway nftables applied");
        Ok(())
    }
}

/// The nft batch that takes `remove` out of the table's sets and puts `add` in, in one transaction (the
/// rules stay as they are: they are the same for any number of agents). Removals come first, so an
/// interface can be removed and added again with other addresses in the same batch.
#[must_use]
pub fn element_changes(remove: &[AgentAttachment], add_: &[AgentAttachment]) -> Nftables<'static> {
    let delete = elements(remove)
        .into_iter()
        .map(|e| NfObject::CmdObject(NfCmd::Delete(e)));
    let objects: Vec<NfObject<'static>> = delete.chain(elements(add_).into_iter().map(add)).collect();
    Nftables {
        objects: objects.into(),
    }
}

/// Applies [`element_changes`] inside `ns` (table `inet agenthold` must be there, with exactly the
/// elements of `remove` among its own): one `nft` run, whatever the number of agents. Nothing to change
/// runs nothing.
///
/// # Errors
/// [`Error::Config`] for an invalid attachment in `add_`; [`Error::Nftables`] when nft refuses (an element
/// to remove is not there, one to add is there already with other addresses): the transaction is then
/// not applied at all.
pub async fn apply_element_changes(
    ns: &NetNs,
    remove: &[AgentAttachment],
    add_: &[AgentAttachment],
) -> Result<()> {
    if remove.is_empty() && add_.is_empty() {
        return Ok(());
    }
    GatewayRules {
        ports: Ports::default(),
        agents: add_.to_vec(),
    }
    .validate()?;
    run_nft(ns, &element_changes(remove, add_)).await?;
    tracing::debug!(namespace = %ns, removed = remove.len(), added = add_.len(), "gateway nftables elements changed");
    Ok(())
}

/// Runs `nft -j -f -` inside `ns` with `batch` (one transaction).
/// How long one `nft` run may take (a full ruleset for thousands of agents takes well under a second).
const NFT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

async fn run_nft(ns: &NetNs, batch: &Nftables<'static>) -> Result<()> {
    let json =
        serde_json::to_vec(batch).map_err(|e| nft_error(ns, format!("serialising the ruleset: {e}")))?;
    let mut command = tokio::process::Command::from(ns.command("nft"));
    command
        .args(["-j", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|source| Error::Netns {
        namespace: ns.to_string(),
        context: "starting `nsenter … nft`".into(),
        source,
    })?;
    // A write error (EPIPE when nsenter or nft exits early) is reported only if nft's own exit status
    // does not explain more.
    let stdin = child.stdin.take();
    let finished = async move {
        let written = match stdin {
            // Dropping stdin closes it: nft reads until end of file.
            Some(mut stdin) => stdin.write_all(&json).await,
            None => Ok(()),
        };
        (written, child.wait_with_output().await)
    };
    // Bounded: callers hold locks across this (a stuck nft is killed when the future is dropped).
    let (written, output) = tokio::time::timeout(NFT_WAIT, finished).await.map_err(|_| {
        nft_error(
            ns,
            format!("nft did not finish within {} s; killed", NFT_WAIT.as_secs()),
        )
    })?;
    let output = output.map_err(|e| nft_error(ns, format!("waiting for nft: {e}")))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(nft_error(ns, format!("{} ({})", stderr.trim(), output.status)));
    }
    written.map_err(|e| nft_error(ns, format!("writing the ruleset: {e}")))?;
    Ok(())
}

/// The table's (empty) sets and map: see [`MAP_GATEWAY`], [`SET_GATEWAY`], [`SET_SOURCE`].
fn sets() -> Vec<NfListObject<'static>> {
    let pair = || SetTypeValue::Concatenated(vec![SetType::Ifname, SetType::Ipv4Addr].into());
    let set = |name: &'static str, flags: Option<HashSet<SetFlag>>| {
        NfListObject::Set(Box::new(Set {
            family: NfFamily::INet,
            table: TABLE.into(),
            name: name.into(),
            handle: None,
            set_type: pair(),
            policy: None,
            flags,
            elem: None,
            timeout: None,
            gc_interval: None,
            size: None,
            comment: None,
        }))
    };
    vec![
        NfListObject::Map(Box::new(Map {
            family: NfFamily::INet,
            table: TABLE.into(),
            name: MAP_GATEWAY.into(),
            handle: None,
            set_type: SetTypeValue::Single(SetType::Ifname),
            map: SetTypeValue::Single(SetType::Ipv4Addr),
            policy: None,
            flags: None,
            elem: None,
            timeout: None,
            gc_interval: None,
            size: None,
            comment: None,
        })),
        set(SET_GATEWAY, None),
        // Concatenations with intervals (a prefix per interface): nft >= 0.9.4.
        set(SET_SOURCE, Some(HashSet::from([SetFlag::Interval]))),
    ]
}

/// The elements of `agents` in each of the table's sets (none for no agents: nft refuses empty lists).
fn elements(agents: &[AgentAttachment]) -> Vec<NfListObject<'static>> {
    if agents.is_empty() {
        return Vec::new();
    }
    let name = |a: &AgentAttachment| Expression::String(Cow::Owned(a.iface.clone()));
    let element = |set: &'static str, elem: Vec<Expression<'static>>| {
        NfListObject::Element(Element {
            family: NfFamily::INet,
            table: TABLE.into(),
            name: set.into(),
            elem: elem.into(),
        })
    };
    vec![
        element(
            MAP_GATEWAY,
            agents
                .iter()
                .map(|a| Expression::List(vec![name(a), addr(a.gateway_addr)]))
                .collect(),
        ),
        element(
            SET_GATEWAY,
            agents
                .iter()
                .map(|a| Expression::Named(NamedExpression::Concat(vec![name(a), addr(a.gateway_addr)])))
                .collect(),
        ),
        element(
            SET_SOURCE,
            agents
                .iter()
                .map(|a| Expression::Named(NamedExpression::Concat(vec![name(a), prefix(a.subnet)])))
                .collect(),
        ),
    ]
}

/// Sets the gateway namespace's sysctls so that it stays closed even without (or before) its ruleset:
/// no forwarding, strict reverse-path filtering (drops spoofed sources), no IPv6 at all.
///
/// `all` and `default` are both set: `default` is what interfaces attached later start with.
pub fn harden(ns: &NetNs) -> Result<()> {
    // Why each one:
    // - ip_forward=0: the gateway is nobody's router; sandboxes reach the world only via the proxies.
    // - rp_filter=1: a packet whose source would not be routed back out of its arrival interface is
    //   dropped before any rule runs (the kernel uses the maximum of `all` and the interface's value).
    // - disable_ipv6=1: no link-local addresses, no neighbour discovery, nothing IPv6 to listen on.
    const SETTINGS: [(&str, &str); 5] = [
        ("net.ipv4.ip_forward", "0"),
        ("net.ipv4.conf.all.rp_filter", "1"),
        ("net.ipv4.conf.default.rp_filter", "1"),
        ("net.ipv6.conf.all.disable_ipv6", "1"),
        ("net.ipv6.conf.default.disable_ipv6", "1"),
    ];
    for (key, value) in SETTINGS {
        match ns.sysctl(key, value) {
            Ok(()) => {}
            // A kernel without IPv6 has no such files: IPv6 is as off as it gets.
            Err(Error::Netns { source, .. })
                if key.starts_with("net.ipv6.") && source.kind() == std::io::ErrorKind::NotFound =>
            {
                tracing::debug!(namespace = %ns, key, "no IPv6 in this kernel");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn config(problem: String) -> Error {
    Error::Config { problem }
}

fn nft_error(ns: &NetNs, problem: String) -> Error {
    Error::Nftables {
        namespace: ns.to_string(),
        problem,
    }
}

/// `oif lo accept; ct state established,related accept`, then the chain's drop policy.
fn output() -> Vec<NfListObject<'static>> {
    vec![
        rule(
            "output",
            vec![
                matches(meta(MetaKey::Oif), Expression::String("lo".into())),
                accept(),
            ],
            "loopback inside the gateway namespace".into(),
        ),
        rule(
            "output",
            vec![
                matches_op(
                    Operator::IN,
                    ct("state"),
                    Expression::List(vec![
                        Expression::String("established".into()),
                        Expression::String("related".into()),
                    ]),
                ),
                accept(),
            ],
            "answers to accepted connections only".into(),
        ),
    ]
}

fn add(object: NfListObject<'static>) -> NfObject<'static> {
    NfObject::CmdObject(NfCmd::Add(object))
}

fn rule(chain: &'static str, statements: Vec<Statement<'static>>, comment: String) -> NfListObject<'static> {
    NfListObject::Rule(Rule {
        family: NfFamily::INet,
        table: TABLE.into(),
        chain: chain.into(),
        expr: statements.into(),
        comment: Some(comment.into()),
        ..Rule::default()
    })
}

fn matches(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    matches_op(Operator::EQ, left, right)
}

fn matches_op(op: Operator, left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(stmt::Match { left, right, op })
}

/// `iifname . <field>`: the key of [`SET_GATEWAY`] and [`SET_SOURCE`].
fn iface_and(field: Expression<'static>) -> Expression<'static> {
    Expression::Named(NamedExpression::Concat(vec![meta(MetaKey::Iifname), field]))
}

/// `@name`: a reference to one of the table's sets.
fn set_ref(name: &'static str) -> Expression<'static> {
    Expression::String(format!("@{name}").into())
}

fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

fn ct(key: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::CT(expr::CT {
        key: key.into(),
        family: None,
        dir: None,
    }))
}

fn fib<const N: usize>(result: FibResult, flags: [FibFlag; N]) -> Expression<'static> {
    Expression::Named(NamedExpression::Fib(Fib {
        result,
        flags: flags.into_iter().collect(),
    }))
}

fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(expr::Payload::PayloadField(
        expr::PayloadField {
            protocol: protocol.into(),
            field: field.into(),
        },
    )))
}

fn ip_field(field: &'static str) -> Expression<'static> {
    payload("ip", field)
}

fn port_field(proto: &'static str, field: &'static str) -> Expression<'static> {
    payload(proto, field)
}

fn addr(ip: Ipv4Addr) -> Expression<'static> {
    Expression::String(ip.to_string().into())
}

fn prefix(net: Ipv4Net) -> Expression<'static> {
    Expression::Named(NamedExpression::Prefix(expr::Prefix {
        addr: Box::new(addr(net.network())),
        len: net.prefix_len().into(),
    }))
}

/// `dnat ip to iifname map @agent_gateway : port`.
fn dnat_by_iface(port: u16) -> Statement<'static> {
    let target = Expression::Named(NamedExpression::Map(Box::new(expr::Map {
        key: meta(MetaKey::Iifname),
        data: set_ref(MAP_GATEWAY),
    })));
    Statement::DNAT(Some(stmt::NAT {
        addr: Some(target),
        family: Some(stmt::NATFamily::IP),
        port: Some(Expression::Number(port.into())),
        flags: None,
    }))
}

fn accept() -> Statement<'static> {
    Statement::Accept(None)
}

fn drop_packet() -> Statement<'static> {
    Statement::Drop(None)
}
