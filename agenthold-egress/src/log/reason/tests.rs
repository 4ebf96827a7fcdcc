//! The log's reasons against the strings it has always written.

use super::*;

/// Every kind of reason, with the decision its entry has and the text the log has always written.
fn every_reason() -> Vec<(Reason, Decision, String)> {
    let mut all = Vec::new();
    for r in DenyReason::ALL {
        all.push((Reason::Denied(r), Decision::Denied, r.as_str().to_owned()));
        all.push((
            Reason::ReportOnly(r),
            Decision::Allowed,
            format!("report_only:{r}"),
        ));
        all.push((
            Reason::SyntheticAddress { reported: Some(r) },
            Decision::Allowed,
            format!("report_only:{r};dangerous_synthetic_address"),
        ));
        all.push((
            Reason::AddressesStripped { reported: Some(r) },
            Decision::Allowed,
            format!("report_only:{r}; blocked_address"),
        ));
    }
    for f in DnsFailure::ALL {
        all.push((Reason::DnsUpstream(f), Decision::Allowed, f.as_str().to_owned()));
    }
    all.extend([
        (
            Reason::LeakLogged {
                secrets: "api,other".into(),
            },
            Decision::Allowed,
            "placeholder_leak:api,other (logged only)".to_owned(),
        ),
        (Reason::EchOffered, Decision::Allowed, "ech_offered".to_owned()),
        (
            Reason::HttpAfterServerGreeting,
            Decision::Denied,
            "malformed:http_after_server_greeting".to_owned(),
        ),
        (
            Reason::RateLimited {
                scope: BudgetScope::Agent,
                refused: 1,
            },
            Decision::Denied,
            "rate_limited;agent;refused=1".to_owned(),
        ),
        (
            Reason::RateLimited {
                scope: BudgetScope::Gateway,
                refused: u64::MAX,
            },
            Decision::Denied,
            format!("rate_limited;gateway;refused={}", u64::MAX),
        ),
        (
            Reason::SyntheticAddress { reported: None },
            Decision::Allowed,
            "dangerous_synthetic_address".to_owned(),
        ),
        (
            Reason::AddressesStripped { reported: None },
            Decision::Allowed,
            "blocked_address".to_owned(),
        ),
        (
            Reason::Failed("upstream: connection refused".into()),
            Decision::Allowed,
            "upstream: connection refused".to_owned(),
        ),
        (
            Reason::Failed("client TLS handshake timed out".into()),
            Decision::Allowed,
            "client TLS handshake timed out".to_owned(),
        ),
    ]);
    all
}

// covers: E16 (the log's reasons are typed and written as the same strings as before)
#[test]
fn every_reason_is_written_as_before_and_read_back() {
    for (reason, decision, text) in every_reason() {
        assert_eq!(reason.to_string(), text);
        assert_eq!(reason.text_len(), text.len(), "{text}");
        assert_eq!(reason.decision(), decision, "{text}");
        assert_eq!(Reason::parse(&text, decision), reason, "{text}");
        let json = serde_json::to_string(&reason).unwrap();
        assert_eq!(json, serde_json::to_string(&text).unwrap());
        let ambiguous = matches!(
            reason,
            Reason::AddressesStripped { reported: None } | Reason::DnsUpstream(DnsFailure::InvalidName)
        );
        if !ambiguous {
            assert_eq!(serde_json::from_str::<Reason>(&json).unwrap(), reason, "{text}");
            assert_eq!(text.parse::<Reason>(), Ok(reason.clone()));
        }
    }
}

// covers: E16 (a JSON line reads back as the entry it was, whatever its reason)
#[test]
fn every_reason_survives_a_json_line() {
    let agent = agenthold_core::AgentId::new("a").unwrap();
    for (reason, decision, text) in every_reason() {
        let mut entry = crate::log::LogEntry::new(&agent, crate::log::LogKind::Dns, Verdict::Allowed);
        entry.set_reason(reason);
        assert_eq!(entry.decision, decision);
        let line = entry.to_json_line();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["reason"], text.as_str(), "{line}");
        let back: crate::log::LogEntry = serde_json::from_str(&line).unwrap();
        assert_eq!(back, entry, "{line}");
    }
}

#[test]
fn the_two_ambiguous_strings_read_by_the_decision() {
    let denied = |t: &str| Reason::parse(t, Decision::Denied);
    let allowed = |t: &str| Reason::parse(t, Decision::Allowed);
    assert_eq!(
        denied("blocked_address"),
        Reason::Denied(DenyReason::BlockedAddress)
    );
    assert_eq!(
        allowed("blocked_address"),
        Reason::AddressesStripped { reported: None }
    );
    assert_eq!(denied("invalid_name"), Reason::Denied(DenyReason::InvalidName));
    assert_eq!(
        allowed("invalid_name"),
        Reason::DnsUpstream(DnsFailure::InvalidName)
    );
    // Anything else reads the same either way.
    assert_eq!(
        allowed("not_in_allowlist"),
        Reason::Denied(DenyReason::NotInAllowlist)
    );
}

#[test]
fn near_misses_are_free_text() {
    for text in [
        "",
        "report_only:",
        "report_only:nonsense",
        "report_only:not_in_allowlist;",
        "x;dangerous_synthetic_address",
        "report_only:nonsense; blocked_address",
        "rate_limited;agent;refused=",
        "rate_limited;agent;refused=01",
        "rate_limited;agent;refused=-1",
        "rate_limited;nobody;refused=1",
        "placeholder_leak:api",
        "upstream: timed out",
    ] {
        assert_eq!(
            Reason::parse(text, Decision::Allowed),
            Reason::Failed(text.to_owned()),
            "{text:?}"
        );
    }
}

#[test]
fn long_free_text_is_cut_to_the_limit() {
    let mut failed = Reason::Failed("x".repeat(1000));
    failed.truncate(256);
    assert!(failed.text_len() <= 256);
    let mut leak = Reason::LeakLogged {
        secrets: "s,".repeat(500),
    };
    leak.truncate(256);
    let text = leak.to_string();
    assert!(text.len() <= 256, "{}", text.len());
    assert!(text.ends_with("… (logged only)"), "{text}");
    assert_eq!(Reason::parse(&text, Decision::Allowed), leak);
}
