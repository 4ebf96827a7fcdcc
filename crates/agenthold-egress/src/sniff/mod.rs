//! Parsers of the first bytes a sandbox sends (E4, E7): the TLS ClientHello (for its SNI and ALPN), HTTP/1.x
//! request heads (for Host, absolute-form and CONNECT targets) and `host:port` authorities.
//!
//! Every input here comes from an untrusted sandbox, so every parser is incremental and pure: call it with
//! everything received so far; it answers [`Sniff::NeedMore`] until it can decide, then the answer never
//! changes when more bytes arrive (a decision only depends on the bytes it covers). Inputs are capped
//! (64 KiB), nothing panics, nothing allocates per input byte, and the work per call is linear in the
//! capped input. The parsers never normalise names: the caller does that once with
//! [`agenthold_core::policy::normalize_name`].
//!
//! The caller's order: [`classify`] on the first byte, then [`parse_client_hello`] or
//! [`parse_request_head`]; `NotThisProtocol` from either means "other TCP" (decided by the name the agent
//! resolved for the address).

mod authority;
mod http;
mod tls;

#[cfg(test)]
mod invariants;
#[cfg(test)]
mod regressions;

pub use authority::split_host_port;
pub use http::{MAX_HEAD_LEN, MAX_HEADERS, RequestHead, TargetForm, parse_request_head};
pub use tls::{ClientHello, MAX_HANDSHAKE_LEN, MAX_RECORDS, parse_client_hello};

/// The answer of an incremental parser for the bytes received so far.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Sniff<T> {
    /// The bytes so far are a valid beginning: call again with more.
    NeedMore,
    /// Parsed. Bytes after the parsed part (see the value's length field) are not looked at.
    Done(T),
    /// The bytes cannot start this protocol: let another parser (or the "other TCP" path) have them.
    NotThisProtocol,
    /// The bytes start this protocol but break its rules or our limits: refuse the connection.
    Invalid(&'static str),
}

/// What the first bytes of a connection look like, from as few bytes as possible (one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// First byte 0x16 (a TLS handshake record): try [`parse_client_hello`].
    Tls,
    /// First byte an upper-case ASCII letter (the start of a method such as `GET` or `CONNECT`): try
    /// [`parse_request_head`]. A guess: its `NotThisProtocol` (`SSH-2.0-…` starts with a letter too) means
    /// [`Protocol::Other`].
    Http,
    /// Neither: decide by the name the agent resolved for the destination address.
    Other,
    /// Nothing received yet.
    NeedMore,
}

/// Which parser the first bytes of a connection belong to. Looks at the first byte only.
#[must_use]
pub fn classify(first_bytes: &[u8]) -> Protocol {
    match first_bytes.first() {
        None => Protocol::NeedMore,
        Some(&tls::HANDSHAKE_RECORD) => Protocol::Tls,
        Some(b) if b.is_ascii_uppercase() => Protocol::Http,
        Some(_) => Protocol::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: E4
    #[test]
    fn classify_looks_at_the_first_byte_only() {
        assert_eq!(classify(b""), Protocol::NeedMore);
        assert_eq!(classify(&[0x16]), Protocol::Tls);
        assert_eq!(classify(&[0x16, 0xff, 0xff]), Protocol::Tls);
        assert_eq!(classify(b"G"), Protocol::Http);
        assert_eq!(classify(b"CONNECT x:443 HTTP/1.1\r\n"), Protocol::Http);
        assert_eq!(classify(b"get / HTTP/1.1\r\n"), Protocol::Other);
        assert_eq!(
            classify(&[0x80, 0x2e, 0x01]),
            Protocol::Other,
            "SSLv2-compatible hello"
        );
        assert_eq!(classify(b"\r\nGET / HTTP/1.1\r\n"), Protocol::Other);
        assert_eq!(classify(&[0x00]), Protocol::Other);
    }

    // covers: E4
    #[test]
    fn classify_agrees_with_the_parsers() {
        for first in 0..=u8::MAX {
            let tls = parse_client_hello(&[first]);
            let http = parse_request_head(&[first]);
            match classify(&[first]) {
                Protocol::Tls => assert_eq!(tls, Sniff::NeedMore),
                Protocol::Http => assert_eq!(http, Sniff::NeedMore),
                Protocol::Other => {
                    assert_eq!(tls, Sniff::NotThisProtocol);
                    assert_eq!(http, Sniff::NotThisProtocol);
                }
                Protocol::NeedMore => unreachable!("one byte is enough"),
            }
        }
    }
}
