//! Host name normalisation. Every name is normalised exactly once, here, before any comparison: lower case,
//! the trailing dot removed, IDNA (UTS #46) mapped to punycode, and checked against DNS length and character
//! rules. The same function serves policy entries and names read from a sandbox (SNI, `Host`, DNS
//! questions), so a name cannot match one way in the policy and another way on the wire.

use crate::error::Error;

/// Longest DNS name in presentation form without the trailing dot.
const MAX_NAME_LEN: usize = 253;
/// Longest DNS label.
const MAX_LABEL_LEN: usize = 63;

/// Normalise a host name: lower case, no trailing dot, IDNA to punycode, valid labels.
///
/// Letters, digits, `-` and `_` are accepted in labels (service labels such as `_dmarc` exist). A name whose
/// last label is numeric (`1.2.3.4`, `0x7f.1`, `2130706433`) is rejected: it would be read as an address by
/// some clients, and addresses are never names.
///
/// # Errors
/// [`Error::HostName`] naming the input and what is wrong.
pub fn normalize_name(input: &str) -> Result<String, Error> {
    let bad = |problem: &str| Error::HostName {
        name: input.to_owned(),
        problem: problem.to_owned(),
    };
    // Plain ASCII without punycode labels is the hot path (SNI and Host headers): lower-case it. Anything
    // else goes through IDNA, which also validates `xn--` labels.
    let needs_idna = !input.is_ascii()
        || input
            .to_ascii_lowercase()
            .split('.')
            .any(|l| l.starts_with("xn--"));
    let mapped = if needs_idna {
        idna::domain_to_ascii(input).map_err(|_| bad("not a valid internationalised domain name"))?
    } else {
        input.to_ascii_lowercase()
    };
    // Strip the trailing dot after mapping: IDNA turns full-width and ideographic dots into '.'.
    let ascii = mapped.strip_suffix('.').unwrap_or(&mapped).to_owned();
    if ascii.is_empty() {
        return Err(bad("empty name"));
    }
    if ascii.len() > MAX_NAME_LEN {
        return Err(bad("longer than 253 characters"));
    }
    for label in ascii.split('.') {
        if label.is_empty() {
            return Err(bad("empty label"));
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(bad("label longer than 63 characters"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(bad("labels may contain only letters, digits, '-' and '_'"));
        }
    }
    if let Some(last) = ascii.rsplit('.').next()
        && looks_numeric(last)
    {
        return Err(bad("the last label is numeric: this is an address, not a name"));
    }
    Ok(ascii)
}

/// Whether a label would be read as a number by an IPv4 parser (decimal, octal or `0x` hex).
fn looks_numeric(label: &str) -> bool {
    let digits = label.strip_prefix("0x").unwrap_or(label);
    !label.is_empty()
        && (digits.is_empty() || digits.bytes().all(|b| b.is_ascii_hexdigit()))
        && (label.starts_with("0x") || label.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises() {
        assert_eq!(normalize_name("GitHub.COM.").unwrap(), "github.com");
        assert_eq!(normalize_name("bücher.example").unwrap(), "xn--bcher-kva.example");
        assert_eq!(
            normalize_name("xn--bcher-kva.example").unwrap(),
            "xn--bcher-kva.example"
        );
        assert_eq!(
            normalize_name("_dmarc.example.com").unwrap(),
            "_dmarc.example.com"
        );
        assert_eq!(normalize_name("localhost").unwrap(), "localhost");
        assert_eq!(normalize_name("github.com\u{3002}").unwrap(), "github.com");
        assert_eq!(normalize_name("github\u{ff0e}com").unwrap(), "github.com");
    }

    #[test]
    fn rejects() {
        for bad in [
            "",
            ".",
            "a..b",
            "a b.com",
            "a/b",
            "a:b",
            "1.2.3.4",
            "0x7f.1",
            "2130706433",
            "a.0x1f",
            "a.123",
            "*.x.com",
            "a@b.com",
            "a\0b.com",
            "xn--zz.example",
            "..",
            "a.b..",
        ] {
            assert!(normalize_name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(normalize_name(&"a".repeat(64)).is_err());
        assert!(normalize_name(&["a"; 130].join(".")).is_err());
    }

    #[test]
    fn hex_looking_tld_that_is_a_word_is_fine() {
        // "cafe" is all hex digits but has no 0x prefix and is not all decimal: a name.
        assert_eq!(normalize_name("example.cafe").unwrap(), "example.cafe");
    }
}
