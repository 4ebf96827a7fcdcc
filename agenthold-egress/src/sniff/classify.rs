//! Which protocol the first bytes of a connection speak (E4, E23), decided so that nothing a real server
//! would read as HTTP or TLS is ever taken for "other TCP".
//!
//! The gateway decides TLS by its SNI and HTTP by its `Host`; only other protocols are decided by the name
//! the agent resolved and spliced unread. So the "other" answer must be safe: bytes that any lenient HTTP
//! server could accept as a request must be classified HTTP (then parsed strictly, and refused when the
//! strict parser does not accept them), never "other". The shape accepted here is deliberately wider than
//! RFC 9112 (its §2.2 and §3 leniencies and then some):
//! - any number of leading empty lines and whitespace (CR, LF, SP, HTAB, VT, FF);
//! - a method of token characters in any case, of any length;
//! - one or more whitespace bytes (SP, HTAB, VT, FF, bare CR) between the parts;
//! - a target of any non-whitespace bytes;
//! - then `HTTP/` in any case, or (HTTP/0.9 and friends) the end of the line or some other word, when the
//!   target looks like one (`/…`, `*`, `…://…`) or the method is a well-known HTTP method.
//!
//! TLS is a first byte of 0x16 (a handshake record). Everything else is other TCP: SSH banners
//! (`SSH-2.0-…`), Redis and memcached commands (`SET k v`, `get k`), SMTP, binary protocols.
//!
//! Like the parsers, [`classify`] is incremental: it answers [`Protocol::NeedMore`] until it can decide, and
//! a decision never changes when more bytes arrive. It looks at no more than [`MAX_CLASSIFY`] bytes; an
//! input that is still undecided there is classified HTTP (and refused by the strict parser).
// enforces: E23

use super::Protocol;

/// The most bytes [`classify`] looks at.
pub const MAX_CLASSIFY: usize = 16 * 1024;

/// Methods that make a request line HTTP even without a version (HTTP/0.9 `GET /`) or with a broken one.
const KNOWN_METHODS: [&[u8]; 9] = [
    b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH",
];

/// Which parser the first bytes of a connection belong to (see the module documentation).
#[must_use]
pub fn classify(first_bytes: &[u8]) -> Protocol {
    let bytes = first_bytes.get(..MAX_CLASSIFY).unwrap_or(first_bytes);
    let capped = first_bytes.len() >= MAX_CLASSIFY;
    let undecided = if capped {
        Protocol::Http
    } else {
        Protocol::NeedMore
    };
    match bytes.first() {
        None => return Protocol::NeedMore,
        Some(&super::tls::HANDSHAKE_RECORD) => return Protocol::Tls,
        Some(_) => {}
    }
    let mut at = 0;
    // Leading empty lines and whitespace.
    while bytes.get(at).is_some_and(|&b| is_space(b) || b == b'\n') {
        at += 1;
    }
    // The method.
    let method_start = at;
    while bytes.get(at).copied().is_some_and(is_token) {
        at += 1;
    }
    let method = bytes.get(method_start..at).unwrap_or_default();
    let Some(&after_method) = bytes.get(at) else {
        return undecided;
    };
    if method.is_empty() || !is_space(after_method) {
        return Protocol::Other;
    }
    let known = KNOWN_METHODS.contains(&method);
    // Whitespace, then the target.
    at = skip_space(bytes, at);
    let target_start = at;
    while bytes.get(at).is_some_and(|&b| !is_space(b) && b != b'\n') {
        at += 1;
    }
    let target = bytes.get(target_start..at).unwrap_or_default();
    if bytes.get(at).is_none() {
        return undecided;
    }
    if target.is_empty() {
        // `METHOD  \n`: a request line needs a target.
        return if line_ends(bytes, at) == Some(true) {
            Protocol::Other
        } else {
            undecided
        };
    }
    let looks_like_target =
        target.starts_with(b"/") || target == b"*" || target.windows(3).any(|w| w == b"://");
    // What follows the target: a version, the end of the line, or another word.
    at = skip_space(bytes, at);
    match line_ends(bytes, at) {
        None => return undecided,
        Some(true) => return verdict(known || looks_like_target),
        Some(false) => {}
    }
    let version = bytes.get(at..).unwrap_or_default();
    let prefix = b"HTTP/";
    let n = version.len().min(prefix.len());
    let starts_like_version = version
        .get(..n)
        .is_some_and(|v| v.eq_ignore_ascii_case(prefix.get(..n).unwrap_or_default()));
    if starts_like_version && n < prefix.len() {
        return undecided;
    }
    verdict(starts_like_version || known || looks_like_target)
}

fn verdict(http: bool) -> Protocol {
    if http { Protocol::Http } else { Protocol::Other }
}

/// Whitespace a lenient server takes as a separator (RFC 9112 §3: SP, HTAB, VT, FF, bare CR).
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | 0x0b | 0x0c | b'\r')
}

/// A token character (RFC 9110 §5.6.2).
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The index after a run of separators from `at`, not past a CR that may start a line end.
fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while let Some(&b) = bytes.get(at) {
        if !is_space(b) || (b == b'\r' && matches!(bytes.get(at + 1), Some(b'\n') | None)) {
            break;
        }
        at += 1;
    }
    at
}

/// Whether the line ends at `at` (`\n` or `\r\n`); `None` when that is not known yet.
fn line_ends(bytes: &[u8], at: usize) -> Option<bool> {
    match bytes.get(at) {
        None => None,
        Some(b'\n') => Some(true),
        Some(b'\r') => bytes.get(at + 1).map(|&b| b == b'\n'),
        Some(_) => Some(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_prefixes_agree(input: &[u8]) -> Protocol {
        let whole = classify(input);
        for cut in 0..input.len() {
            let p = classify(&input[..cut]);
            assert!(
                p == Protocol::NeedMore || p == whole,
                "{:?} at {cut}: {p:?} vs {whole:?}",
                String::from_utf8_lossy(input)
            );
        }
        whole
    }

    // covers: E4, E23
    #[test]
    fn anything_a_lenient_server_reads_as_http_is_http() {
        for input in [
            &b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
            b"\r\n\r\n\nGET / HTTP/1.1\r\n",
            b"  GET / HTTP/1.1\r\n",
            b"GET  / HTTP/1.1\r\n",
            b"GET\t/\tHTTP/1.1\r\n",
            b"GET /  HTTP/1.1\r\n",
            b"GET\x0b/\x0cHTTP/1.1\r\n",
            b"GET\r/ HTTP/1.1\r\n",
            b"get / http/1.1\r\n",
            b"FOO / HTTP/1.1\r\n",
            b"foo-bar x hTtP/2\r\n",
            b"GET /\r\n",
            b"GET /\n",
            b"GET http://evil.test/\r\n",
            b"POST x\r\n",
            b"GET / FOO/1.1\r\n",
            b"OPTIONS * HTTP/1.1\r\n",
            b"CONNECT evil.test:443 HTTP/1.1\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ] {
            assert_eq!(
                all_prefixes_agree(input),
                Protocol::Http,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        // Undecided at the cap: HTTP (the strict parser refuses it), never other.
        let long = [b"A".repeat(MAX_CLASSIFY), b" / HTTP/1.1".to_vec()].concat();
        assert_eq!(classify(&long), Protocol::Http);
        assert_eq!(classify(&b"\r\n".repeat(MAX_CLASSIFY)), Protocol::Http);
    }

    // covers: E4
    #[test]
    fn other_protocols_stay_other() {
        for input in [
            &b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"[..],
            b"SSH-2.0-Go\r\n",
            b"SET key value\r\n",
            b"get key\r\n",
            b"set key 0 0 5\r\n",
            b"*1\r\n$4\r\nPING\r\n",
            b"NICK bot\r\n",
            b"EHLO mail.example\r\n",
            b"\x00\x00\x00\x08\x04\xd2\x16\x2f",
            b"\x80\x2e\x01",
            b"{\"jsonrpc\":\"2.0\"}",
            b"GET\r\n",
            b"GET:x",
        ] {
            assert_eq!(
                all_prefixes_agree(input),
                Protocol::Other,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    // covers: E4
    #[test]
    fn tls_is_the_handshake_byte_and_nothing_is_decided_early() {
        assert_eq!(classify(&[0x16]), Protocol::Tls);
        assert_eq!(classify(b""), Protocol::NeedMore);
        for partial in [
            &b"G"[..],
            b"GET",
            b"GET ",
            b"GET /",
            b"GET / ",
            b"GET / HT",
            b"\r\n",
            b"SSH-2.0-Open",
        ] {
            assert_eq!(
                classify(partial),
                Protocol::NeedMore,
                "{:?}",
                String::from_utf8_lossy(partial)
            );
        }
    }
}
