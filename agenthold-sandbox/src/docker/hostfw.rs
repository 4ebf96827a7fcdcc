//! The host's side of the datapath (E1, S4): measures a prototype on this machine showed are needed.
//!
//! - Bridge netfilter is on, and Docker 20.10's rules for internal networks drop traffic between containers
//!   of the same internal bridge unless the host accepts it in `DOCKER-USER`. Per agent bridge, new
//!   connections to the gateway's `.2` are accepted, every other new connection to an address of the
//!   agent's network is dropped, and the rest on the bridge (traffic framed to the gateway, replies) is
//!   accepted. The drop matters when the gateway holder restarts: its fresh namespace inherits the host's
//!   `ip_forward=1` for a moment before its creation-time sysctls apply, and without the drop it would
//!   forward one agent's packets onto another agent's bridge.
//! - Raw frames and the bridge's IPv6 link-local address reach the host itself: the host table drops input
//!   arriving on the installation's agent bridges.
//!
//! Both live in one host nftables table per installation, whose rules are the same few for any number of
//! agents: the bridges, their `.2`s and their networks are elements of sets keyed by interface, so a packet
//! costs a few hash lookups. The accept has to happen in `DOCKER-USER` itself (an accept in another table
//! does not stop Docker's drop), so the table marks the packets to accept with [`ACCEPT_MARK`] and one
//! constant `DOCKER-USER` rule, shared by every installation, accepts marked packets. An agent's attach or
//! detach adds or deletes its elements in one `nft` run; the table is written whole when this process
//! has not written it yet (and removed with the installation's last agent); other installations' tables
//! are untouched.

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

/// Runs `program ARGS…` with `stdin` written to it, and returns its output.
pub(crate) fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<std::process::Output> {
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

/// [`run`], and an error carrying its standard error when it fails.
pub(crate) fn checked(program: &str, args: &[&str], stdin: Option<&str>) -> Result<()> {
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

/// The packet mark bit the host table sets on what `DOCKER-USER` must accept (agent bridge traffic that
/// passed the table's checks).
pub const ACCEPT_MARK: u32 = 0x0200_0000;

/// The comment of the one `DOCKER-USER` rule agenthold adds.
const MARK_RULE_COMMENT: &str = "agenthold:accept-marked";

/// Whether this process has checked (and if needed added) the `DOCKER-USER` mark rule.
static MARK_RULE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether `DOCKER-USER` had per-bridge rules of an earlier version when this process first looked: then
/// a detach also removes the bridge's old rules.
static LEGACY_RULES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Installations whose host table this process wrote whole (later changes are element changes).
static WRITTEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn mark_rule_args(op: &'static str) -> Vec<String> {
    let mark = format!("{ACCEPT_MARK:#x}/{ACCEPT_MARK:#x}");
    let mut args: Vec<String> = vec![op.into(), "DOCKER-USER".into()];
    if op == "-I" {
        args.push("1".into());
    }
    args.extend(
        [
            "-m",
            "mark",
            "--mark",
            &mark,
            "-m",
            "comment",
            "--comment",
            MARK_RULE_COMMENT,
            "-j",
            "ACCEPT",
        ]
        .map(str::to_owned),
    );
    args
}

/// The `DOCKER-USER` rule accepting [`ACCEPT_MARK`], added once (checked once per process: a constant
/// rule that does nothing for unmarked packets, so it stays).
///
/// # Errors
/// When iptables is missing or refuses.
pub fn ensure_mark_rule() -> Result<()> {
    use std::sync::atomic::Ordering;
    if MARK_RULE.load(Ordering::Acquire) {
        return Ok(());
    }
    let check = mark_rule_args("-C");
    let check: Vec<&str> = check.iter().map(String::as_str).collect();
    let listed = run("iptables", &["-S", "DOCKER-USER"], None)?;
    let legacy = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .any(|l| l.contains("agenthold:ah"));
    LEGACY_RULES.store(legacy, Ordering::Release);
    if !run("iptables", &check, None)?.status.success() {
        let insert = mark_rule_args("-I");
        let insert: Vec<&str> = insert.iter().map(String::as_str).collect();
        checked("iptables", &insert, None)?;
    }
    MARK_RULE.store(true, Ordering::Release);
    Ok(())
}

/// Whether `DOCKER-USER` has the mark rule (for tests).
#[must_use]
pub fn mark_rule_exists() -> bool {
    let check = mark_rule_args("-C");
    let check: Vec<&str> = check.iter().map(String::as_str).collect();
    run("iptables", &check, None).is_ok_and(|o| o.status.success())
}

/// The comment that marked a bridge's `DOCKER-USER` rules in earlier versions (one set per bridge).
fn comment(bridge: &str) -> String {
    format!("agenthold:{bridge}")
}

/// `DOCKER-USER` rules earlier versions made for `bridge`, as `iptables -S` prints them.
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

/// Remove the per-bridge `DOCKER-USER` rules of earlier versions (idempotent): for agents made before the
/// host table took them over, and for sweeps.
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

/// Whether `DOCKER-USER` has per-bridge rules of an earlier version for `bridge` (for tests and leak
/// counting).
#[must_use]
pub fn bridge_allowed(bridge: &str) -> bool {
    rules_of(bridge).is_ok_and(|r| !r.is_empty())
}

/// The elements of `nets` in the host table's sets, as nft `element` commands after `verb` (`add` or
/// `delete`).
fn element_commands(table: &str, verb: &str, nets: &[AgentNetwork]) -> String {
    if nets.is_empty() {
        return String::new();
    }
    let list = |f: &dyn Fn(&AgentNetwork) -> String| nets.iter().map(f).collect::<Vec<_>>().join(", ");
    let bridges = list(&|n| format!("\"{}\"", n.bridge));
    let pairs = list(&|n| format!("\"{b}\" . \"{b}\"", b = n.bridge));
    let gateways = list(&|n| format!("\"{b}\" . \"{b}\" . {}", n.gateway_addr(), b = n.bridge));
    let subnets = list(&|n| format!("\"{b}\" . \"{b}\" . {}", n.subnet, b = n.bridge));
    format!(
        "{verb} element inet {table} bridges {{ {bridges} }}\n\
         {verb} element inet {table} bridge_pairs {{ {pairs} }}\n\
         {verb} element inet {table} bridge_gateways {{ {gateways} }}\n\
         {verb} element inet {table} bridge_subnets {{ {subnets} }}\n"
    )
}

/// The installation's host table for these agent networks, replacing its previous one in one transaction;
/// no networks removes the table.
///
/// # Errors
/// When nft is missing or refuses the ruleset.
pub fn apply_host_table(instance: &str, nets: &[AgentNetwork]) -> Result<()> {
    let table = host_table(instance);
    let mut script = format!("add table inet {table}\ndelete table inet {table}\n");
    if !nets.is_empty() {
        ensure_mark_rule()?;
        let mark = format!("{ACCEPT_MARK:#x}");
        script.push_str(&format!(
            "table inet {table} {{\n\
             \x20 set bridges {{ type ifname; }}\n\
             \x20 set bridge_pairs {{ type ifname . ifname; }}\n\
             \x20 set bridge_gateways {{ type ifname . ifname . ipv4_addr; }}\n\
             \x20 set bridge_subnets {{ type ifname . ifname . ipv4_addr; flags interval; }}\n\
             \x20 chain input {{\n\
             \x20   type filter hook input priority -5; policy accept;\n\
             \x20   iifname @bridges counter drop comment \"agent bridges never reach the host\"\n\
             \x20 }}\n\
             \x20 chain forward {{\n\
             \x20   type filter hook forward priority -5; policy accept;\n\
             \x20   ct state new iifname . oifname . ip daddr != @bridge_gateways \
                     iifname . oifname . ip daddr @bridge_subnets counter drop \
                     comment \"no new connection to the agent network but to its .2\"\n\
             \x20   iifname . oifname @bridge_pairs meta mark set meta mark | {mark} \
                     comment \"within an agent bridge: DOCKER-USER accepts it\"\n\
             \x20 }}\n\
             }}\n"
        ));
        script.push_str(&element_commands(&table, "add", nets));
    }
    checked("nft", &["-f", "-"], Some(&script))?;
    let mut written = WRITTEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    written.retain(|i| i != instance);
    if !nets.is_empty() {
        written.push(instance.to_owned());
    }
    Ok(())
}

/// Serve `net` on the host side: its elements added to the installation's host table in one `nft` run
/// (the whole table, with `all`, the installation's networks including `net`, when this process has not
/// written it yet or the element change fails).
///
/// # Errors
/// When nft or iptables is missing or refuses.
pub fn add_network(instance: &str, all: &[AgentNetwork], net: &AgentNetwork) -> Result<()> {
    change_elements(instance, all, "add", net)
}

/// Stop serving `net` on the host side: its elements deleted from the host table in one `nft` run; the
/// table goes with the installation's last network (`remaining` empty). Falls back to writing the whole
/// table for `remaining`.
///
/// # Errors
/// When nft is missing or refuses.
pub fn remove_network(instance: &str, remaining: &[AgentNetwork], net: &AgentNetwork) -> Result<()> {
    if LEGACY_RULES.load(std::sync::atomic::Ordering::Acquire) {
        disallow_bridge(&net.bridge)?;
    }
    if remaining.is_empty() {
        return apply_host_table(instance, &[]);
    }
    change_elements(instance, remaining, "delete", net)
}

fn change_elements(instance: &str, all: &[AgentNetwork], verb: &str, net: &AgentNetwork) -> Result<()> {
    let known = WRITTEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .any(|i| i == instance);
    if known {
        let script = element_commands(&host_table(instance), verb, std::slice::from_ref(net));
        match checked("nft", &["-f", "-"], Some(&script)) {
            Ok(()) => return Ok(()),
            Err(e) => tracing::debug!(error = %e, "host table element change failed; writing it whole"),
        }
    }
    apply_host_table(instance, all)
}

/// Whether the installation's host table exists (for tests and leak counting).
#[must_use]
pub fn host_table_exists(instance: &str) -> bool {
    run("nft", &["list", "table", "inet", &host_table(instance)], None).is_ok_and(|o| o.status.success())
}
