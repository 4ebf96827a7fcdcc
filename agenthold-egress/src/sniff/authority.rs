//! `host[:port]` authorities (E4, E7): the Host header, the authority of an absolute-form URI and the
//! target of CONNECT. Strict on purpose: what is refused here never reaches name normalisation or a dial.

use std::net::Ipv6Addr;

/// Longest host accepted (a DNS name is at most 253 bytes, plus a trailing dot; an IPv6 literal is shorter).
const MAX_HOST_LEN: usize = 255;

/// Splits an authority into host and port.
///
/// The host is returned as written (case kept, not normalised) and without the brackets of an IPv6 literal
/// (`[2001:db8::1]:443` gives `2001:db8::1`, ready for `parse::<IpAddr>()`). Without a port the result
/// carries `default_port`; a `default_port` of 0 therefore means "a port is required" (CONNECT).
///
/// Refused: an empty authority or host, userinfo (`user@host`), an unbracketed IPv6 address, a bracketed
/// part that is not an IPv6 address (zone identifiers included), host characters other than ASCII letters,
/// digits, `-`, `.` and `_`, a host over 255 bytes, an empty port (`host:`), and ports that are not 1–65535
/// written with at most five digits.
pub fn split_host_port(authority: &str, default_port: u16) -> Result<(String, u16), &'static str> {
    let (host, port) = split(authority)?;
    let port = match port {
        Some(text) => parse_port(text)?,
        None if default_port == 0 => return Err("port missing"),
        None => default_port,
    };
    Ok((host.to_owned(), port))
}

/// Splits and validates without allocating: the host (brackets removed) and the port, parsed.
pub(super) fn split_parsed(authority: &str) -> Result<(&str, Option<u16>), &'static str> {
    let (host, port) = split(authority)?;
    Ok((host, port.map(parse_port).transpose()?))
}

/// Splits and validates the host; the port text is returned unparsed.
fn split(authority: &str) -> Result<(&str, Option<&str>), &'static str> {
    if authority.is_empty() {
        return Err("empty authority");
    }
    if authority.contains('@') {
        return Err("userinfo (user@host) is not allowed in an authority");
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or("unclosed '[' in authority")?;
        if inside.parse::<Ipv6Addr>().is_err() {
            return Err("not an IPv6 address inside brackets");
        }
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or("characters after ']' that are not a port")?,
            ),
        };
        (inside, port)
    } else {
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        };
        if host.contains(':') {
            return Err("IPv6 address without brackets");
        }
        if host.is_empty() {
            return Err("empty host");
        }
        if !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            return Err("host contains a character other than letters, digits, '-', '.' and '_'");
        }
        (host, port)
    };
    if host.len() > MAX_HOST_LEN {
        return Err("host longer than 255 bytes");
    }
    Ok((host, port))
}

/// A port: one to five ASCII digits, 1–65535.
fn parse_port(text: &str) -> Result<u16, &'static str> {
    if text.is_empty() {
        return Err("empty port");
    }
    if text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("port is not a number of at most five digits");
    }
    match text.parse::<u32>() {
        Ok(port @ 1..=65535) => u16::try_from(port).map_err(|_| "port out of range 1-65535"),
        _ => Err("port out of range 1-65535"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(authority: &str, default_port: u16) -> (String, u16) {
        match split_host_port(authority, default_port) {
            Ok(split) => split,
            Err(problem) => panic!("{authority:?} refused: {problem}"),
        }
    }

    // covers: E4, E7
    #[test]
    fn splits_names_addresses_and_ports() {
        assert_eq!(ok("example.com", 80), ("example.com".into(), 80));
        assert_eq!(ok("Example.COM:8080", 80), ("Example.COM".into(), 8080));
        assert_eq!(ok("example.com.:443", 0), ("example.com.".into(), 443));
        assert_eq!(ok("203.0.113.7:22", 0), ("203.0.113.7".into(), 22));
        assert_eq!(ok("[2001:db8::1]:443", 0), ("2001:db8::1".into(), 443));
        assert_eq!(ok("[::ffff:127.0.0.1]", 80), ("::ffff:127.0.0.1".into(), 80));
        assert_eq!(ok("under_score.example:1", 80), ("under_score.example".into(), 1));
        assert_eq!(ok("h:65535", 80), ("h".into(), 65535));
        assert_eq!(ok("h:00443", 80), ("h".into(), 443));
    }

    // covers: E4, E5, E7
    #[test]
    fn refuses_what_is_not_a_plain_authority() {
        let cases: &[(&str, u16)] = &[
            ("", 80),
            (":443", 80),
            ("user@example.com", 80),
            ("user:pass@example.com:443", 80),
            ("evil.com@allowed.com", 80),
            ("example.com:0", 80),
            ("example.com:65536", 80),
            ("example.com:99999", 80),
            ("example.com:123456", 80),
            ("example.com:", 80),
            ("example.com:+443", 80),
            ("example.com:-1", 80),
            ("example.com: 443", 80),
            ("example.com", 0),
            ("2001:db8::1", 80),
            ("2001:db8::1:443", 80),
            ("[2001:db8::1", 80),
            ("[2001:db8::1]x", 80),
            ("[2001:db8::1]:", 80),
            ("[fe80::1%25eth0]:443", 80),
            ("[example.com]:443", 80),
            ("[]:443", 80),
            ("exa mple.com", 80),
            ("exa\tmple.com", 80),
            ("example.com/path", 80),
            ("example.com%2e", 80),
            ("bücher.example", 80),
            ("exa\0mple.com", 80),
        ];
        for &(authority, default_port) in cases {
            assert!(
                split_host_port(authority, default_port).is_err(),
                "{authority:?} was accepted"
            );
        }
        let long = "a".repeat(256);
        assert!(split_host_port(&long, 80).is_err());
        assert!(split_host_port(&"a".repeat(255), 80).is_ok());
    }
}
