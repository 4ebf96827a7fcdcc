//! The host's side of the datapath (E1, S4), two measures a prototype on this machine showed are needed:
//!
//! - Bridge netfilter is on, and Docker 20.10's rules for internal networks drop traffic between containers
//!   of the same internal bridge unless the host accepts it: a `DOCKER-USER` accept for each agent bridge's
//!   own traffic (`-i BR -o BR`), added with the agent and removed with it.
//! - Raw frames (a sandbox with NET_RAW) and the bridge's IPv6 link-local address reach the host itself: a
//!   host nftables table drops input arriving on any agent bridge. It exists while there are agents and is
//!   removed with the last one.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// The host nftables table agenthold owns.
pub const HOST_TABLE: &str = "agenthold_host";

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

/// Accept the bridge's own traffic in `DOCKER-USER` (idempotent).
///
/// # Errors
/// When iptables is missing or refuses.
pub fn allow_bridge(bridge: &str) -> Result<()> {
    let rule = ["DOCKER-USER", "-i", bridge, "-o", bridge, "-j", "ACCEPT"];
    let exists = run("iptables", &[&["-C"], &rule[..]].concat(), None)?
        .status
        .success();
    if exists {
        Ok(())
    } else {
        checked("iptables", &[&["-I"], &rule[..]].concat(), None)
    }
}

/// Remove the bridge's `DOCKER-USER` accept (idempotent).
///
/// # Errors
/// When iptables is missing.
pub fn disallow_bridge(bridge: &str) -> Result<()> {
    let rule = ["DOCKER-USER", "-i", bridge, "-o", bridge, "-j", "ACCEPT"];
    while run("iptables", &[&["-C"], &rule[..]].concat(), None)?
        .status
        .success()
    {
        checked("iptables", &[&["-D"], &rule[..]].concat(), None)?;
    }
    Ok(())
}

/// The host table for these agent bridges, replacing the previous one in one transaction; no bridges
/// removes the table.
///
/// # Errors
/// When nft is missing or refuses the ruleset.
pub fn apply_host_table(bridges: &[String]) -> Result<()> {
    let mut script = format!("add table inet {HOST_TABLE}\ndelete table inet {HOST_TABLE}\n");
    if !bridges.is_empty() {
        let set = bridges
            .iter()
            .map(|b| format!("\"{b}\""))
            .collect::<Vec<_>>()
            .join(", ");
        script.push_str(&format!(
            "table inet {HOST_TABLE} {{\n  chain input {{\n    type filter hook input priority -5; policy accept;\n    \
             iifname {{ {set} }} counter drop comment \"agent bridges never reach the host\"\n  }}\n}}\n"
        ));
    }
    checked("nft", &["-f", "-"], Some(&script))
}

/// Whether the host table exists (for tests and leak counting).
#[must_use]
pub fn host_table_exists() -> bool {
    run("nft", &["list", "table", "inet", HOST_TABLE], None).is_ok_and(|o| o.status.success())
}

/// Whether `DOCKER-USER` has the bridge's accept (for tests and leak counting).
#[must_use]
pub fn bridge_allowed(bridge: &str) -> bool {
    let rule = ["-C", "DOCKER-USER", "-i", bridge, "-o", bridge, "-j", "ACCEPT"];
    run("iptables", &rule, None).is_ok_and(|o| o.status.success())
}
