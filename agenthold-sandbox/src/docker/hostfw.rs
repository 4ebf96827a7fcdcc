//! The host's side of the datapath (E1, S4): measures a prototype on this machine showed are needed.
//!
//! - Bridge netfilter is on, and Docker 20.10's rules for internal networks drop traffic between containers
//!   of the same internal bridge unless the host accepts it. For each agent bridge, `DOCKER-USER` accepts
//!   new connections to the gateway's `.2`, drops every other new connection to an address of the agent's
//!   network, and accepts the rest (traffic framed to the gateway, replies). The drop matters when the gateway holder restarts: its fresh namespace
//!   inherits the host's `ip_forward=1` for a moment before its creation-time sysctls apply, and without
//!   the drop it would forward one agent's packets onto another agent's bridge.
//! - Raw frames and the bridge's IPv6 link-local address reach the host itself: a host nftables table per
//!   installation drops input arriving on that installation's agent bridges. It exists while the
//!   installation has agents and is removed with the last one; other installations' tables are untouched.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::docker::network::AgentNetwork;
use crate::error::{Error, Result};

/// Prefix of the host nftables tables agenthold owns: `agenthold_host_<instance>`.
pub const HOST_TABLE: &str = "agenthold_host";

/// The host table of one installation.
#[must_use]
pub fn host_table(instance: &str) -> String {
    format!("{HOST_TABLE}_{instance}")
}

fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<std::process::Output> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(format!("run {program} (is it installed?)"), e))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|e| Error::io(format!("write to {program}"), e))?;
    }
    child
        .wait_with_output()
        .map_err(|e| Error::io(format!("wait for {program}"), e))
}

fn checked(program: &str, args: &[&str], stdin: Option<&str>) -> Result<()> {
    let out = run(program, args, stdin)?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(Error::io(
        format!("{program} {}", args.join(" ")),
        std::io::Error::other(format!("{} ({})", stderr.trim(), out.status)),
    ))
}

/// The comment that marks a bridge's `DOCKER-USER` rules.
fn comment(bridge: &str) -> String {
    format!("agenthold:{bridge}")
}

/// `DOCKER-USER` rules agenthold made for `bridge`, as `iptables -S` prints them.
fn rules_of(bridge: &str) -> Result<Vec<String>> {
    let out = run("iptables", &["-S", "DOCKER-USER"], None)?;
    let mark = comment(bridge);
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        // `iptables -S` quotes the comment; the arguments carry no spaces, so quotes are the only noise.
        .map(|l| l.replace('"', ""))
        .filter(|l| {
            l.split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w == ["--comment", mark.as_str()])
        })
        .collect())
}

/// Install the bridge's `DOCKER-USER` rules (replacing earlier ones of the same bridge).
///
/// # Errors
/// When iptables is missing or refuses.
pub fn allow_bridge(net: &AgentNetwork) -> Result<()> {
    disallow_bridge(&net.bridge)?;
    let bridge = net.bridge.as_str();
    let gateway = format!("{}/32", net.gateway_addr());
    let subnet = net.subnet.to_string();
    let new = "-m conntrack --ctstate NEW";
    let rules = [
        // Sandboxes open connections to the gateway's .2 (DNS, explicit proxy, tunnel).
        format!("{new} -d {gateway} -j ACCEPT"),
        // Nothing starts a connection to any other address of the agent's own network, not even a gateway
        // forwarding for a moment. (Sandbox traffic to outside addresses is framed to the gateway, keeps its
        // outside destination on the bridge, and is redirected there.)
        format!("{new} -d {subnet} -j DROP"),
        // Traffic to the gateway, replies.
        "-j ACCEPT".to_owned(),
    ];
    let mark = comment(bridge);
    // Inserted at the top, last one first, so they end up in this order ahead of Docker's own.
    for rule in rules.iter().rev() {
        let args: Vec<&str> = ["-I", "DOCKER-USER", "1", "-i", bridge, "-o", bridge]
            .into_iter()
            .chain(rule.split(' '))
            .chain(["-m", "comment", "--comment", mark.as_str()])
            .collect();
        checked("iptables", &args, None)?;
    }
    Ok(())
}

/// Remove the bridge's `DOCKER-USER` rules (idempotent).
///
/// # Errors
/// When iptables is missing.
pub fn disallow_bridge(bridge: &str) -> Result<()> {
    for rule in rules_of(bridge)? {
        let Some(spec) = rule.strip_prefix("-A DOCKER-USER ") else {
            continue;
        };
        let args: Vec<&str> = ["-D", "DOCKER-USER"]
            .into_iter()
            .chain(spec.split_whitespace())
            .collect();
        checked("iptables", &args, None)?;
    }
    Ok(())
}

/// The installation's host table for these agent bridges, replacing its previous one in one transaction;
/// no bridges removes the table.
///
/// # Errors
/// When nft is missing or refuses the ruleset.
pub fn apply_host_table(instance: &str, bridges: &[String]) -> Result<()> {
    let table = host_table(instance);
    let mut script = format!("add table inet {table}\ndelete table inet {table}\n");
    if !bridges.is_empty() {
        let set = bridges
            .iter()
            .map(|b| format!("\"{b}\""))
            .collect::<Vec<_>>()
            .join(", ");
        script.push_str(&format!(
            "table inet {table} {{\n  chain input {{\n    type filter hook input priority -5; policy accept;\n    \
             iifname {{ {set} }} counter drop comment \"agent bridges never reach the host\"\n  }}\n}}\n"
        ));
    }
    checked("nft", &["-f", "-"], Some(&script))
}

/// Whether the installation's host table exists (for tests and leak counting).
#[must_use]
pub fn host_table_exists(instance: &str) -> bool {
    run("nft", &["list", "table", "inet", &host_table(instance)], None).is_ok_and(|o| o.status.success())
}

/// Whether `DOCKER-USER` has the bridge's rules (for tests and leak counting).
#[must_use]
pub fn bridge_allowed(bridge: &str) -> bool {
    rules_of(bridge).is_ok_and(|r| !r.is_empty())
}
