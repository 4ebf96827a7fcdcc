//! The nftables ruleset of the gateway's network namespace (E3) and the sysctls that go with it.
//!
//! The gateway namespace owns `.2` on every agent network and is each sandbox's default route and DNS
//! server. Its ruleset turns that position into a funnel: DNS (UDP and TCP 53, to any address) goes to our
//! resolver, every other TCP connection not addressed to the gateway goes to the transparent proxy, the
//! gateway itself answers only on the explicit proxy and tunnel ports, and everything else (other UDP,
//! ICMP, IPv6, forwarding) is dropped. The whole table is replaced in one nft transaction, so there is
//! never a moment with half a ruleset.
//!
//! Identity is the interface a packet arrived on (`iifname`), never its source address: every per-agent
//! rule names the agent's interface, and source addresses are only checked to drop spoofing.
// enforces: E3

use std::borrow::Cow;
use std::net::Ipv4Addr;
use std::process::Stdio;

use ipnet::Ipv4Net;
use nftables::expr::{self, Expression, Fib, FibFlag, FibResult, Meta, MetaKey, NamedExpression};
use nftables::schema::{Chain, NfCmd, NfListObject, NfObject, Nftables, Rule, Table};
use nftables::stmt::{self, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use tokio::io::AsyncWriteExt;

use crate::netns::NetNs;
use crate::{Error, Result};

/// The one table agenthold owns in the gateway namespace (`inet`: one table sees IPv4 and IPv6, so IPv6
/// falls into the same drop policies instead of bypassing an `ip`-only table).
pub const TABLE: &str = "agenthold";

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
    /// never fails on a fresh namespace; then it builds the table again. nft applies a batch as one
    /// transaction: applying the same rules twice, or an empty agent list, is always valid.
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
        for agent in &self.agents {
            objects.extend(self.prerouting(agent).into_iter().map(add));
        }
        objects.extend(self.input().into_iter().map(add));
        objects.extend(output().into_iter().map(add));
        Nftables {
            objects: objects.into(),
        }
    }

    /// Per agent: DNS to the resolver, every other TCP not for the gateway to the transparent proxy.
    fn prerouting(&self, agent: &AgentAttachment) -> Vec<NfListObject<'static>> {
        let gw = agent.gateway_addr;
        let iface = &agent.iface;
        let dns = |proto: &'static str| {
            rule(
                "prerouting",
                vec![
                    iifname(iface),
                    matches(port_field(proto, "dport"), Expression::Number(53)),
                    dnat(gw, self.ports.dns),
                ],
                // DNS to *any* address is answered by our resolver: no query leaves unseen (E9).
                format!("{iface}: {proto} DNS to the resolver"),
            )
        };
        vec![
            dns("udp"),
            dns("tcp"),
            rule(
                "prerouting",
                vec![
                    iifname(iface),
                    matches_op(Operator::NEQ, ip_field("daddr"), addr(gw)),
                    matches(meta(MetaKey::L4proto), Expression::String("tcp".into())),
                    // `dnat` to the explicit .2 rather than `redirect`: redirect picks the interface's
                    // primary address, which is not always the .2 the listener is bound to.
                    dnat(gw, self.ports.proxy),
                ],
                format!("{iface}: other TCP to the transparent proxy"),
            ),
        ]
    }

    /// Default drop; accept only what an agent may reach on its own interface's gateway address.
    fn input(&self) -> Vec<NfListObject<'static>> {
        let mut rules = vec![
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
        ];
        for agent in &self.agents {
            let iface = &agent.iface;
            let gw = agent.gateway_addr;
            // Explicit per-agent source check: holds even if the namespace had a default route out of
            // this interface (which would make the fib check above accept any source from it).
            rules.push(rule(
                "input",
                vec![
                    iifname(iface),
                    matches_op(Operator::NEQ, ip_field("saddr"), prefix(agent.subnet)),
                    drop_packet(),
                ],
                format!("{iface}: source outside the agent network"),
            ));
            // The transparent and DNS ports take only redirected traffic (`ct status dnat`): a direct
            // connection to them would skip the original-destination bookkeeping the proxy relies on.
            for (proto, port, what) in [
                ("tcp", self.ports.proxy, "transparent proxy"),
                ("udp", self.ports.dns, "DNS"),
                ("tcp", self.ports.dns, "DNS"),
            ] {
                rules.push(rule(
                    "input",
                    vec![
                        iifname(iface),
                        matches(ip_field("daddr"), addr(gw)),
                        matches(port_field(proto, "dport"), Expression::Number(port.into())),
                        matches_op(Operator::IN, ct("status"), Expression::String("dnat".into())),
                        accept(),
                    ],
                    format!("{iface}: redirected {proto} to the {what}"),
                ));
            }
            // The only ports a sandbox may address directly: the explicit proxy and the tunnel.
            let direct = match self.ports.tunnel {
                Some(tunnel) => Expression::Named(NamedExpression::Set(vec![
                    expr::SetItem::Element(Expression::Number(self.ports.explicit.into())),
                    expr::SetItem::Element(Expression::Number(tunnel.into())),
                ])),
                None => Expression::Number(self.ports.explicit.into()),
            };
            rules.push(rule(
                "input",
                vec![
                    iifname(iface),
                    matches(ip_field("daddr"), addr(gw)),
                    matches(port_field("tcp", "dport"), direct),
                    accept(),
                ],
                format!("{iface}: explicit proxy and tunnel"),
            ));
        }
        rules
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
        let json = serde_json::to_vec(&self.ruleset())
            .map_err(|e| nft_error(ns, format!("serialising the ruleset: {e}")))?;
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
        let written = match child.stdin.take() {
            // Dropping stdin closes it: nft reads until end of file.
            Some(mut stdin) => stdin.write_all(&json).await,
            None => Ok(()),
        };
        let output = child
            .wait_with_output()
            .await
            .map_err(|e| nft_error(ns, format!("waiting for nft: {e}")))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(nft_error(ns, format!("{} ({})", stderr.trim(), output.status)));
        }
        written.map_err(|e| nft_error(ns, format!("writing the ruleset: {e}")))?;
        tracing::debug!(namespace = %ns, agents = self.agents.len(), "gateway nftables applied");
        Ok(())
    }
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

fn iifname(iface: &str) -> Statement<'static> {
    matches(
        meta(MetaKey::Iifname),
        Expression::String(Cow::Owned(iface.to_owned())),
    )
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

fn dnat(ip: Ipv4Addr, port: u16) -> Statement<'static> {
    Statement::DNAT(Some(stmt::NAT {
        addr: Some(addr(ip)),
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
