//! Where a login may send the browser afterwards (S6): only a path on this server. One function, used by
//! every provider and by `/auth/local`.
// enforces: S6

/// `next` when it is a local path, else `/`. A local path starts with one `/` whose next character is not
/// `/` or `\` (nor their percent-encodings), has no backslash and no control characters (tabs and newlines
/// included: browsers drop them, which could turn `/\t/evil.example` into `//evil.example`), and is at most
/// 2048 bytes of ASCII (a `Location` header carries nothing else: a browser sends non-ASCII
/// percent-encoded, and a raw one would fail the header and leave a redirect without a target). Everything
/// else (`//evil.example`, `https://…`, `javascript:…`, empty) becomes `/`.
pub(crate) fn sanitize_next(next: Option<&str>) -> String {
    match next {
        Some(n) if is_local_path(n) => n.to_owned(),
        _ => "/".to_owned(),
    }
}

fn is_local_path(n: &str) -> bool {
    let lower = n.to_ascii_lowercase();
    n.len() <= 2048
        && n.is_ascii()
        && n.starts_with('/')
        && !n[1..].starts_with(['/', '\\'])
        && !lower.starts_with("/%2f")
        && !lower.starts_with("/%5c")
        && !n.contains('\\')
        && !n.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: S6
    #[test]
    fn only_local_paths_pass() {
        for good in ["/", "/w/team", "/w/team/agents/a?tab=files#x", "/login?next=%2Fx"] {
            assert_eq!(sanitize_next(Some(good)), good);
        }
        for bad in [
            "//evil.example",
            "/\\evil.example",
            "\\\\evil.example",
            "https://evil.example/",
            "http:/evil.example",
            "/%2Fevil.example",
            "/%2fevil.example",
            "/%5Cevil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/ok\r\nSet-Cookie: x=y",
            "/a\\..\\b",
            "javascript:alert(1)",
            "",
            "evil.example",
            " /x",
            "/w/caf\u{e9}",
            "/\u{2215}\u{2215}evil.example",
            "/\u{ff0f}evil.example",
        ] {
            assert_eq!(sanitize_next(Some(bad)), "/", "{bad:?}");
        }
        assert_eq!(sanitize_next(None), "/");
        assert_eq!(sanitize_next(Some(&format!("/{}", "a".repeat(3000)))), "/");
    }
}
