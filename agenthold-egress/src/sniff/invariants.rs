//! The properties the sniffing fuzz targets check, shared with `cargo test`: `fuzz/fuzz_targets/`
//! `client_hello.rs`, `http_head.rs` and `connect_line.rs` include this file by path (it names only `super::`
//! items and `std`, and the targets provide a `super` that re-exports `agenthold_egress::sniff`), and
//! `super::regressions` replays every committed fuzz input through the same functions.
//!
//! Every check panics on a violation: that is how libFuzzer and `cargo test` see it.

use std::fmt::Debug;

use super::{
    MAX_CLASSIFY, MAX_HEAD_LEN, Protocol, Sniff, TargetForm, classify, parse_client_hello,
    parse_request_head, split_host_port,
};

/// A split point in `0..=data.len()` derived from the bytes (FNV-1a), so that an input file carries its own
/// split and a plain ClientHello is a meaningful seed.
fn split_point(data: &[u8]) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let len = u64::try_from(data.len()).unwrap_or(u64::MAX - 1);
    usize::try_from(hash % (len + 1)).unwrap_or(0)
}

/// Parses `data` whole, and in two chunks at a few split points (the derived one, the middle, one byte
/// short): a prefix that already decided must have decided what the whole decides.
fn incremental<T: PartialEq + Debug>(data: &[u8], parse: impl Fn(&[u8]) -> Sniff<T>) -> Sniff<T> {
    let whole = parse(data);
    for cut in [split_point(data), data.len() / 2, data.len().saturating_sub(1)] {
        let prefix = parse(data.get(..cut).unwrap_or(data));
        if prefix != Sniff::NeedMore {
            assert_eq!(
                prefix,
                whole,
                "the first {cut} of {} bytes decided differently",
                data.len()
            );
        }
    }
    whole
}

/// Fuzz target `client_hello`: arbitrary bytes as the start of a connection.
pub(crate) fn client_hello(data: &[u8]) {
    let Sniff::Done(hello) = incremental(data, parse_client_hello) else {
        return;
    };
    assert!(
        hello.consumed >= 9 && hello.consumed <= data.len(),
        "consumed {}",
        hello.consumed
    );
    let (exact, short) = (&data[..hello.consumed], &data[..hello.consumed - 1]);
    assert_eq!(
        parse_client_hello(exact),
        Sniff::Done(hello.clone()),
        "the records alone parse the same"
    );
    assert_eq!(
        parse_client_hello(short),
        Sniff::NeedMore,
        "one byte short needs more"
    );
    if let Some(sni) = &hello.sni {
        assert!(!sni.is_empty() && sni.len() <= 255, "SNI length {}", sni.len());
        assert!(sni.bytes().all(|b| b.is_ascii_graphic()), "SNI {sni:?}");
    }
    assert!(
        hello.alpn.len() <= 32 && hello.alpn.iter().all(|p| !p.is_empty()),
        "ALPN {:?}",
        hello.alpn
    );
}

/// Fuzz target `http_head`: arbitrary bytes as the start of an HTTP connection.
pub(crate) fn http_head(data: &[u8]) {
    let Sniff::Done(head) = incremental(data, parse_request_head) else {
        return;
    };
    assert!(
        head.head_len <= data.len() && head.head_len <= MAX_HEAD_LEN,
        "head_len {}",
        head.head_len
    );
    let exact = &data[..head.head_len];
    assert!(exact.ends_with(b"\r\n\r\n"), "a head ends with an empty line");
    assert!(!exact.contains(&0), "no NUL in an accepted head");
    assert_eq!(
        parse_request_head(exact),
        Sniff::Done(head.clone()),
        "the head alone parses the same"
    );
    assert_eq!(
        parse_request_head(&exact[..exact.len() - 1]),
        Sniff::NeedMore,
        "one byte short needs more"
    );
    assert!(head.target.is_ascii() && !head.target.is_empty());
    assert!(head.version <= 1);
    let Some((host, port)) = head.destination(80) else {
        panic!("accepted head without destination: {head:?}")
    };
    assert!(!host.is_empty() && port != 0);
    if let Some(value) = &head.host {
        let Ok((host_header, _)) = split_host_port(value, 80) else {
            panic!("accepted Host {value:?}")
        };
        if let Some((target_host, _)) = head.target_host_port() {
            assert!(
                host_header.eq_ignore_ascii_case(&target_host),
                "Host {value:?} vs target {:?}",
                head.target
            );
        }
    } else {
        assert!(
            matches!(head.form, TargetForm::Absolute | TargetForm::Authority),
            "no Host: {head:?}"
        );
    }
    match head.form {
        TargetForm::Authority => {
            assert_eq!(head.method, "CONNECT");
            assert_eq!(head.target_host_port(), split_host_port(&head.target, 0).ok());
            assert_eq!(head.path_and_query(), None);
        }
        TargetForm::Absolute => {
            assert!(head.target_host_port().is_some());
            assert!(head.path_and_query().is_some_and(|p| p.starts_with('/')));
        }
        TargetForm::Origin => assert!(head.target.starts_with('/')),
        TargetForm::Asterisk => assert_eq!((head.method.as_str(), head.target.as_str()), ("OPTIONS", "*")),
    }
}

/// Fuzz target `connect_line`: arbitrary bytes as an authority, alone and as the target and Host of a
/// CONNECT head.
pub(crate) fn connect_line(data: &[u8]) {
    let text = std::str::from_utf8(data).ok();
    if let Some(text) = text {
        for default_port in [0, 80, 443] {
            let Ok((host, port)) = split_host_port(text, default_port) else {
                continue;
            };
            assert!(
                port != 0 && !host.is_empty() && host.len() <= 255,
                "{text:?} gave {host:?}:{port}"
            );
            let again = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            assert_eq!(
                split_host_port(&again, 0),
                Ok((host.clone(), port)),
                "{again:?} does not round-trip"
            );
        }
    }
    let mut head = b"CONNECT ".to_vec();
    head.extend_from_slice(data);
    head.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    head.extend_from_slice(data);
    head.extend_from_slice(b"\r\n\r\n");
    let expected = text.and_then(|text| split_host_port(text, 0).ok());
    http_head(&head);
    match incremental(&head, parse_request_head) {
        Sniff::Done(parsed) if parsed.head_len == head.len() => {
            assert_eq!(parsed.form, TargetForm::Authority);
            assert_eq!(parsed.target.as_bytes(), data);
            assert_eq!(
                parsed.target_host_port(),
                expected,
                "CONNECT head and split_host_port disagree"
            );
        }
        // The bytes themselves ended a head early: only the general properties apply (checked above).
        Sniff::Done(_) => {}
        other => assert!(
            expected.is_none(),
            "{:?} splits but its CONNECT head is {other:?}",
            text
        ),
    }
}

/// Fuzz target `classify`: arbitrary bytes as the first bytes of a connection. A decision never changes
/// with more bytes; the cap always decides; and what the strict HTTP parser accepts, or what a lenient
/// server could read as a request line, is never "other TCP" (E23).
pub(crate) fn classify_first_bytes(data: &[u8]) {
    let whole = classify(data);
    for cut in [split_point(data), data.len() / 2, data.len().saturating_sub(1)] {
        let prefix = classify(data.get(..cut).unwrap_or(data));
        if prefix != Protocol::NeedMore {
            assert_eq!(
                prefix,
                whole,
                "the first {cut} of {} bytes decided differently",
                data.len()
            );
        }
    }
    if data.len() >= MAX_CLASSIFY {
        assert_ne!(whole, Protocol::NeedMore, "undecided at the cap");
    }
    if matches!(parse_request_head(data), Sniff::Done(_)) {
        assert_eq!(
            whole,
            Protocol::Http,
            "a head the strict parser accepts must classify as HTTP"
        );
    }
    if matches!(parse_client_hello(data), Sniff::Done(_)) {
        assert_eq!(whole, Protocol::Tls);
    }
}
