//! Properties of the allowlist entry grammar (E8): print/parse round trips, idempotence, normalisation,
//! wildcard and port semantics, and robustness on garbage; plus replay of the `policy_entry` fuzz
//! regressions and seeds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use agenthold_core::ErrorKind;
use agenthold_core::policy::{HostPattern, PolicyEntry, PortSpec};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use proptest::prelude::*;
use proptest::sample::select;

// The fuzz target's checks, included so that `cargo test` replays `fuzz/regressions` through them.
#[allow(unreachable_pub)]
#[path = "../../fuzz/src/policy_entry.rs"]
mod fuzz_policy_entry;

/// A DNS label as normalisation leaves it: lower case letters, digits, `-`, `_`, 1–63 bytes.
fn label() -> impl Strategy<Value = String> {
    prop_oneof![4 => "[a-z0-9_-]{1,12}", 1 => "[a-z0-9_-]{1,63}"]
        .prop_filter("not an A-label (see name())", |l| !l.starts_with("xn--"))
}

/// A normalised name: labels ending in one that is not numeric (it starts with a letter).
fn name() -> impl Strategy<Value = String> {
    (prop::collection::vec(label(), 0..4), "[a-z][a-z0-9_-]{0,10}")
        .prop_map(|(mut labels, last)| {
            labels.push(last);
            labels.join(".")
        })
        .prop_filter("DNS names are at most 253 bytes", |n| n.len() <= 253)
        // An `xn--` label must be valid punycode when the name also goes through IDNA; keep them out.
        .prop_filter("no A-labels", |n| !n.split('.').any(|l| l.starts_with("xn--")))
}

fn v4_net() -> impl Strategy<Value = IpNet> {
    (any::<u32>(), 0..=32u8)
        .prop_map(|(a, len)| IpNet::V4(Ipv4Net::new(Ipv4Addr::from(a), len).unwrap().trunc()))
}

fn v6_net() -> impl Strategy<Value = IpNet> {
    let addr = prop_oneof![
        any::<u128>().prop_map(Ipv6Addr::from),
        any::<u32>().prop_map(|a| Ipv4Addr::from(a).to_ipv6_mapped()),
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, a, b)),
    ];
    (addr, 0..=128u8).prop_map(|(a, len)| IpNet::V6(Ipv6Net::new(a, len).unwrap().trunc()))
}

fn ports() -> impl Strategy<Value = PortSpec> {
    prop_oneof![
        Just(PortSpec::Web),
        Just(PortSpec::Any),
        (1..=u16::MAX).prop_map(PortSpec::One)
    ]
}

fn host() -> impl Strategy<Value = HostPattern> {
    prop_oneof![
        name().prop_map(HostPattern::Exact),
        name().prop_map(HostPattern::Subdomains),
        v4_net().prop_map(HostPattern::Network),
        v6_net().prop_map(HostPattern::Network),
    ]
}

/// Entries of every form, built directly (already canonical).
fn entry() -> impl Strategy<Value = PolicyEntry> {
    (host(), ports()).prop_map(|(host, ports)| PolicyEntry { host, ports })
}

/// A name as an operator might write it: mixed case, an internationalised label, a trailing dot.
fn written_name() -> impl Strategy<Value = String> {
    let unicode = select(vec!["", "bücher.", "münchen.", "ñandú.", "élan.", "日本語."]);
    // Room for the punycode of the internationalised label within 253 bytes.
    let name = name().prop_filter("room for a label", |n| n.len() <= 200);
    (
        unicode,
        name,
        prop::collection::vec(any::<bool>(), 0..64),
        any::<bool>(),
    )
        .prop_map(|(unicode, name, upper, dot)| {
            let mixed: String = name
                .chars()
                .zip(upper.iter().copied().chain(std::iter::repeat(false)))
                .map(|(c, up)| if up { c.to_ascii_uppercase() } else { c })
                .collect();
            format!("{unicode}{mixed}{}", if dot { "." } else { "" })
        })
}

/// An entry as an operator might write it, in every form, with spacing and port variants.
fn written_entry() -> impl Strategy<Value = String> {
    let host = prop_oneof![
        written_name(),
        written_name().prop_map(|n| format!("*.{n}")),
        v4_net().prop_map(|n| match n.prefix_len() {
            32 => n.addr().to_string(),
            _ => n.to_string(),
        }),
        v6_net().prop_map(|n| match n.prefix_len() {
            128 => format!("[{}]", n.addr()),
            _ => format!("[{n}]"),
        }),
    ];
    let port = prop_oneof![
        Just(String::new()),
        Just(":*".to_owned()),
        (1..=u16::MAX).prop_map(|p| format!(":{p}")),
        (1..=u16::MAX).prop_map(|p| format!(":{p:05}")),
    ];
    (
        select(vec!["", " ", "\t"]),
        host,
        port,
        select(vec!["", " ", "\n"]),
    )
        .prop_map(|(lead, host, port, trail)| format!("{lead}{host}{port}{trail}"))
}

/// Strings over the grammar's own alphabet, more likely to reach deep into the parser than random text.
fn grammar_garbage() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9.*:/\\[\\]_ -]{0,40}|[0-9a-fA-F:.\\[\\]/*]{0,40}|(xn--)?[a-z0-9ü.-]{0,20}(:[0-9*]{0,6})?"
}

fn parse(s: &str) -> PolicyEntry {
    PolicyEntry::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

fn port_suffix(ports: PortSpec) -> String {
    match ports {
        PortSpec::Web => String::new(),
        PortSpec::One(p) => format!(":{p}"),
        PortSpec::Any => ":*".into(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    // covers: E8
    #[test]
    fn printed_entries_parse_back(entry in entry()) {
        let printed = entry.to_string();
        prop_assert_eq!(parse(&printed), entry, "printed as {:?}", printed);
    }

    // covers: E8
    #[test]
    fn written_entries_parse_and_printing_is_idempotent(written in written_entry()) {
        let entry = parse(&written);
        let printed = entry.to_string();
        let again = parse(&printed);
        prop_assert_eq!(&again, &entry);
        prop_assert_eq!(again.to_string(), printed);
    }

    // covers: E8
    #[test]
    fn case_and_a_trailing_dot_never_change_a_name(
        name in written_name(),
        wildcard in any::<bool>(),
        ports in ports(),
    ) {
        let star = if wildcard { "*." } else { "" };
        let bare = name.strip_suffix('.').unwrap_or(&name);
        let port = port_suffix(ports);
        let reference = parse(&format!("{star}{bare}{port}"));
        for variant in [
            format!("{star}{bare}.{port}"),
            format!("{star}{}{port}", bare.to_uppercase()),
            format!("{star}{}.{port}", bare.to_lowercase()),
            format!("  {star}{bare}{port}\t"),
        ] {
            prop_assert_eq!(parse(&variant), reference.clone(), "{:?}", variant);
        }
    }

    // covers: E8
    #[test]
    fn upper_casing_the_canonical_form_changes_nothing(entry in entry()) {
        prop_assert_eq!(parse(&entry.to_string().to_uppercase()), entry);
    }

    // covers: E8
    #[test]
    fn a_wildcard_never_matches_its_apex_nor_an_undotted_suffix(
        suffix in name(),
        label in label(),
        port in prop_oneof![Just(80u16), Just(443u16)],
    ) {
        let wildcard = parse(&format!("*.{suffix}"));
        let exact = parse(&suffix);
        let undotted = format!("{label}{suffix}");
        let above = format!("{suffix}.{label}");
        let empty_label = format!(".{suffix}");
        let child = format!("{label}.{suffix}");
        let grandchild = format!("{label}.{child}");
        for never in [&suffix, &undotted, &empty_label] {
            prop_assert!(!wildcard.matches_name(never, port), "*.{} matched {}", suffix, never);
        }
        // `f.f` is below `f`: a name above the suffix is only outside when it does not end with `.suffix`.
        let outside = !above.ends_with(&format!(".{suffix}"));
        prop_assert_eq!(wildcard.matches_name(&above, port), !outside, "*.{} and {}", suffix, above);
        prop_assert!(wildcard.matches_name(&child, port));
        prop_assert!(wildcard.matches_name(&grandchild, port));
        // The exact entry is the complement on the apex.
        prop_assert!(exact.matches_name(&suffix, port));
        prop_assert!(!exact.matches_name(&child, port));
    }

    // covers: E8
    #[test]
    fn a_port_rule_never_widens(
        host in host(),
        n in 1..=u16::MAX,
        port in prop_oneof![Just(80u16), Just(443u16), Just(22u16), any::<u16>()],
        other in name(),
        addr in prop_oneof![any::<u32>().prop_map(|a| IpAddr::V4(a.into())), any::<u128>().prop_map(|a| IpAddr::V6(a.into()))],
    ) {
        let with = |ports| PolicyEntry { host: host.clone(), ports };
        let (one, any, web) = (with(PortSpec::One(n)), with(PortSpec::Any), with(PortSpec::Web));
        let names = match &host {
            HostPattern::Exact(name) => vec![name.clone(), format!("a.{name}"), other],
            HostPattern::Subdomains(suffix) => vec![suffix.clone(), format!("a.{suffix}"), other],
            HostPattern::Network(_) => vec![other],
        };
        let addrs = match &host {
            HostPattern::Network(net) => vec![net.network(), net.broadcast(), addr],
            _ => vec![addr],
        };
        for name in &names {
            for q in [port, n] {
                let covered = any.matches_name(name, q);
                prop_assert_eq!(one.matches_name(name, q), covered && q == n);
                prop_assert_eq!(web.matches_name(name, q), covered && (q == 80 || q == 443));
                prop_assert!(!one.matches_name(name, q) || covered);
                prop_assert!(!web.matches_name(name, q) || covered);
            }
        }
        for &a in &addrs {
            for q in [port, n] {
                let covered = any.matches_addr(a, q);
                prop_assert_eq!(one.matches_addr(a, q), covered && q == n);
                prop_assert_eq!(web.matches_addr(a, q), covered && (q == 80 || q == 443));
            }
        }
    }

    // covers: E8
    #[test]
    fn garbage_never_panics_and_errors_quote_the_entry(
        s in prop_oneof![any::<String>(), grammar_garbage()],
    ) {
        match PolicyEntry::parse(&s) {
            Ok(entry) => prop_assert_eq!(parse(&entry.to_string()), entry),
            Err(err) => {
                prop_assert_eq!(err.kind(), ErrorKind::Policy);
                let message = err.to_string();
                prop_assert!(message.contains(&format!("{s:?}")), "{}", message);
            }
        }
    }

    // covers: E8
    #[test]
    fn the_fuzz_checks_hold_on_generated_input(
        s in prop_oneof![grammar_garbage(), written_entry(), entry().prop_map(|e| e.to_string())],
    ) {
        fuzz_policy_entry::check(s.as_bytes());
    }
}

// covers: E8
#[test]
fn documented_forms_hold_the_properties() {
    for s in [
        "github.com",
        "*.npmjs.org",
        "github.com:22",
        "registry.example.com:*",
        "203.0.113.0/24:443",
        "[2001:db8::/32]:443",
        "*.Bücher.example.:8443",
        "0.0.0.0/0",
        "[::/0]:*",
        "[::ffff:192.0.2.1]",
    ] {
        fuzz_policy_entry::check(s.as_bytes());
    }
}

// covers: E8
#[test]
fn fuzz_regressions_and_seeds_replay() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut replayed = 0;
    for kind in ["regressions", "seeds"] {
        let Ok(entries) = fs::read_dir(root.join(kind).join("policy_entry")) else {
            continue;
        };
        let mut paths: Vec<_> = entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .collect();
        paths.sort();
        for path in paths {
            eprintln!("replaying {}", path.display());
            fuzz_policy_entry::check(&fs::read(&path).unwrap());
            replayed += 1;
        }
    }
    assert!(replayed > 0, "no seeds found under fuzz/");
}
