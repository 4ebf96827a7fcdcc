//! `…/agents/{agent}/network-policy/suggestions`: what the agent's allowlist refused (E8, E16), grouped by
//! host and port with counts and the last time, each with the allowlist entry that would let it through;
//! and `…/suggestions/approve`, which adds such an entry to the policy and applies it at once.
//!
//! Only refusals *by the allowlist* are suggestions (`not_in_allowlist`, also what report-only mode would
//! have refused): the address guard, budgets and leak refusals are not a policy's to lift. A refused DNS
//! query is grouped without a port (its log entry's port 53 is the resolver's, not the destination's).
//! The suggested entry is the host alone (ports 80 and 443, as E8 reads an entry without a port) for a DNS
//! query or a refusal on port 80 or 443, else `host:port`. Groups the current policy already allows are
//! left out, so an approved suggestion disappears.
// enforces: E8

use std::collections::HashMap;
use std::net::IpAddr;

use agenthold_core::policy::{DenyReason, Destination, PolicyEntry, PolicyMode};
use agenthold_core::{Action, NetworkPolicy};
use agenthold_egress::log::{LogEntry, LogKind, Reason};
use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::agents::agent_meta;
use super::policy::PolicyBody;
use super::{ApiError, ApiResult, Body, Caller, Problem};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_suggestions))
        .routes(routes!(approve_suggestion))
}

/// Most entries a policy may hold (as `PUT …/network-policy`).
const MAX_ENTRIES: usize = 4096;

/// A group of refused traffic and the entry that would allow it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Suggestion {
    /// The host refused (a name, or an address).
    host: String,
    /// The destination port; null for DNS queries.
    port: Option<u16>,
    /// How many log entries the group has.
    count: u64,
    /// The newest entry's time (RFC 3339).
    last_time: String,
    /// The allowlist entry that would allow it (`host`, `host:port`).
    entry: String,
}

/// The suggestions of an agent.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SuggestionList {
    /// Most recent first.
    items: Vec<Suggestion>,
    /// Always absent: every group fits one page.
    next_cursor: Option<String>,
}

/// `POST …/suggestions/approve`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Approve {
    /// The host of a suggestion.
    #[schema(example = "pypi.org")]
    host: String,
    /// Its port (null or absent for a DNS suggestion: ports 80 and 443).
    #[schema(example = 443)]
    port: Option<u16>,
}

/// The allowlist entry for `host` on `port` (see the module documentation).
fn entry_for(host: &str, port: Option<u16>) -> ApiResult<PolicyEntry> {
    if host.is_empty() || host.len() > 253 {
        return Err(ApiError::bad_request("host must be 1 to 253 characters"));
    }
    if port == Some(0) {
        return Err(ApiError::bad_request("port must be 1 to 65535"));
    }
    let host_text = match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(a)) => format!("[{a}]"),
        _ => host.to_owned(),
    };
    let text = match port {
        None | Some(80 | 443) => host_text,
        Some(p) => format!("{host_text}:{p}"),
    };
    PolicyEntry::parse(&text).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Whether `policy` already allows `host` on `port` (resolving, for a DNS group).
fn allowed(policy: &NetworkPolicy, host: &str, port: Option<u16>) -> bool {
    match (port, host.parse::<IpAddr>()) {
        (None, _) => policy.may_resolve(host).is_allowed(),
        (Some(p), Ok(addr)) => policy.decide(&Destination::addr(addr, p)).is_allowed(),
        (Some(p), Err(_)) => policy.decide(&Destination::name(host, p)).is_allowed(),
    }
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/network-policy/suggestions", tag = "network policy",
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = SuggestionList), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn list_suggestions(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
) -> ApiResult<Json<SuggestionList>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::View).await?;
    let policy = state.runtime.policy(&agent).await?;
    let items = suggest(state.runtime.request_log_since(&agent, 0), &policy);
    Ok(Json(SuggestionList {
        items,
        next_cursor: None,
    }))
}

/// The suggestions from `entries` (oldest first) that `policy` does not allow yet, most recent first.
fn suggest(entries: Vec<LogEntry>, policy: &NetworkPolicy) -> Vec<Suggestion> {
    // (host, port) → (count, last time, seq of the last entry)
    let mut groups: HashMap<(String, Option<u16>), (u64, String, u64)> = HashMap::new();
    for e in entries {
        let refused = matches!(
            e.reason,
            Some(Reason::Denied(DenyReason::NotInAllowlist) | Reason::ReportOnly(DenyReason::NotInAllowlist))
        );
        let Some(host) = e.host.filter(|_| refused) else {
            continue;
        };
        let port = if e.kind == LogKind::Dns { None } else { e.port };
        let group = groups
            .entry((host.to_ascii_lowercase(), port))
            .or_insert((0, String::new(), 0));
        group.0 += 1;
        group.1 = e.time;
        group.2 = e.seq;
    }
    let mut items: Vec<(u64, Suggestion)> = groups
        .into_iter()
        .filter(|((host, port), _)| !allowed(policy, host, *port))
        .filter_map(|((host, port), (count, last_time, seq))| {
            let entry = entry_for(&host, port).ok()?.to_string();
            Some((
                seq,
                Suggestion {
                    host,
                    port,
                    count,
                    last_time,
                    entry,
                },
            ))
        })
        .collect();
    items.sort_by_key(|(seq, _)| std::cmp::Reverse(*seq));
    items.into_iter().map(|(_, s)| s).collect()
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/agents/{agent}/network-policy/suggestions/approve", tag = "network policy",
    request_body = Approve,
    params(("ws" = String, Path), ("agent" = String, Path)),
    responses((status = 200, body = PolicyBody, description = "the new policy, applied to new connections and DNS queries at once"),
        (status = 400, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "the policy is open: nothing to allow")),
    extensions(("x-agenthold-role" = json!("agent_admin"))))]
async fn approve_suggestion(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Body(body): Body<Approve>,
) -> ApiResult<Json<PolicyBody>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Administer).await?;
    let entry = entry_for(&body.host, body.port)?;
    let _edits = state.edits.lock().await;
    let mut policy = state.runtime.policy(&agent).await?;
    if policy.mode == PolicyMode::Open {
        return Err(ApiError::conflict(
            "the policy is open: every public destination is allowed already",
        ));
    }
    if !policy.entries.contains(&entry) {
        if policy.entries.len() >= MAX_ENTRIES {
            return Err(ApiError::conflict(format!(
                "a policy holds at most {MAX_ENTRIES} entries"
            )));
        }
        policy.entries.push(entry.clone());
        state.runtime.set_policy(&agent, policy.clone()).await?;
        tracing::info!(agent = %agent, entry = %entry, "suggestion approved");
    }
    Ok(Json(PolicyBody::from(&policy)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use agenthold_core::policy::Verdict;
    use agenthold_core::{AgentId, PolicyMode};

    use super::*;

    fn entry(seq: u64, kind: LogKind, host: &str, port: u16, verdict: Verdict) -> LogEntry {
        let mut e = LogEntry::new(&AgentId::new("a1").unwrap(), kind, verdict).to(host, port);
        e.seq = seq;
        e.time = format!("t{seq}");
        e
    }

    // covers: E8
    #[test]
    fn groups_allowlist_refusals_and_names_their_entry() {
        let no = Verdict::Denied(DenyReason::NotInAllowlist);
        let log = vec![
            entry(1, LogKind::Dns, "pypi.org", 53, no),
            entry(2, LogKind::Connect, "PyPI.org", 443, no),
            entry(3, LogKind::Connect, "pypi.org", 443, no),
            entry(4, LogKind::Tcp, "git.example.com", 22, no),
            entry(5, LogKind::Tcp, "203.0.113.9", 8443, no),
            entry(6, LogKind::Tcp, "2001:db8::1", 443, no),
            entry(
                7,
                LogKind::Tls,
                "guarded.example",
                443,
                Verdict::Denied(DenyReason::BlockedAddress),
            ),
            entry(8, LogKind::Tls, "allowed.example", 443, Verdict::Allowed),
            entry(
                9,
                LogKind::Tls,
                "reported.example",
                443,
                Verdict::Reported(DenyReason::NotInAllowlist),
            ),
            entry(10, LogKind::Tls, "later.example", 443, no),
        ];
        let policy = NetworkPolicy::parse(PolicyMode::Allowlist, &["later.example"]).unwrap();
        let got: Vec<(String, Option<u16>, u64, String, String)> = suggest(log, &policy)
            .into_iter()
            .map(|s| (s.host, s.port, s.count, s.last_time, s.entry))
            .collect();
        let want = [
            ("reported.example", Some(443), 1, "t9", "reported.example"),
            ("2001:db8::1", Some(443), 1, "t6", "[2001:db8::1]"),
            ("203.0.113.9", Some(8443), 1, "t5", "203.0.113.9:8443"),
            ("git.example.com", Some(22), 1, "t4", "git.example.com:22"),
            ("pypi.org", Some(443), 2, "t3", "pypi.org"),
            ("pypi.org", None, 1, "t1", "pypi.org"),
        ];
        let want: Vec<_> = want
            .iter()
            .map(|(h, p, c, t, e)| ((*h).to_owned(), *p, *c, (*t).to_owned(), (*e).to_owned()))
            .collect();
        assert_eq!(got, want);
        assert!(suggest(Vec::new(), &policy).is_empty());
        let open = NetworkPolicy::open();
        let log = vec![entry(1, LogKind::Dns, "pypi.org", 53, no)];
        assert!(suggest(log, &open).is_empty(), "an open policy allows everything");
    }

    // covers: E8
    #[test]
    fn entries_are_checked() {
        assert_eq!(entry_for("pypi.org", None).unwrap().to_string(), "pypi.org");
        assert_eq!(entry_for("pypi.org", Some(80)).unwrap().to_string(), "pypi.org");
        assert_eq!(
            entry_for("pypi.org", Some(5432)).unwrap().to_string(),
            "pypi.org:5432"
        );
        for (host, port) in [("", None), ("bad host", None), ("pypi.org", Some(0)), ("*", None)] {
            assert!(entry_for(host, port).is_err(), "{host:?} {port:?}");
        }
        assert!(entry_for(&"a".repeat(300), None).is_err());
    }
}
