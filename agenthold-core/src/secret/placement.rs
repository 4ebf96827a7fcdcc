//! Where placeholders sit in a request head (E13, E15): finding an agent's placeholders in every part of a
//! head, in any form an upstream could still read as the placeholder (percent-encoded, even repeatedly, and
//! in any ASCII case), and the small URL helpers the injector needs (query parameters, the normal form of
//! a path).
//!
//! The injector replaces a placeholder only where a rule names it; everything this module finds anywhere
//! else is a leak attempt. So the search errs on the side of finding: a head is percent-decoded until it no
//! longer changes (at most [`MAX_DECODE_ROUNDS`] times) and compared without regard to ASCII case.
// enforces: E13 E15

use std::borrow::Cow;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

use super::RequestHead;

/// Rounds of percent-decoding before a text is searched (`%2561` needs two).
const MAX_DECODE_ROUNDS: usize = 4;

/// Where in a request head a placeholder was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Place {
    /// The path (before `?`): never a place a placeholder may go.
    Path,
    /// The value of the query parameter with this (decoded) name.
    Query(String),
    /// A query parameter's name.
    QueryName,
    /// The value of this header (lower-case name).
    Header(String),
    /// A header's name.
    HeaderName,
}

/// One placeholder found in a head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Hit {
    /// Index of the secret (in the order the finder was built).
    pub(super) secret: usize,
    /// Where.
    pub(super) place: Place,
    /// Whether every occurrence there is the placeholder exactly as handed out (no encoding, same case):
    /// only those are ever replaced.
    pub(super) exact: bool,
}

/// Finds an agent's placeholders in request heads.
#[derive(Debug)]
pub(super) struct Finder {
    /// Placeholders in any ASCII case; pattern `i` is secret `i`.
    matcher: AhoCorasick,
    /// The placeholders as handed out.
    exact: Vec<String>,
}

impl Finder {
    /// A finder for `placeholders` (secret `i` has `placeholders[i]`); `None` when there are none.
    pub(super) fn new(placeholders: Vec<String>) -> Option<Self> {
        if placeholders.is_empty() {
            return None;
        }
        let matcher = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::LeftmostFirst)
            .build(&placeholders)
            .ok()?;
        Some(Self {
            matcher,
            exact: placeholders,
        })
    }

    /// Every placeholder in `head`, with where it is.
    pub(super) fn scan(&self, head: &RequestHead) -> Vec<Hit> {
        let mut hits = Vec::new();
        for (name, value) in &head.headers {
            self.find(name.as_bytes(), || Place::HeaderName, &mut hits);
            self.find(value, || Place::Header(name.clone()), &mut hits);
        }
        let (path, query) = split_query(&head.path_and_query);
        self.find(path.as_bytes(), || Place::Path, &mut hits);
        for param in query_params(query) {
            self.find(param.name.as_bytes(), || Place::QueryName, &mut hits);
            if let Some(value) = param.value {
                self.find(value.as_bytes(), || Place::Query(param.decoded_name()), &mut hits);
            }
        }
        hits
    }

    /// Record a hit per secret whose placeholder `text` contains in any form.
    fn find(&self, text: &[u8], place: impl Fn() -> Place, hits: &mut Vec<Hit>) {
        let decoded = decode_fully(text);
        if !self.matcher.is_match(&*decoded) {
            return;
        }
        let mut found: Vec<(usize, usize)> = Vec::new(); // (secret, occurrences in any form)
        for m in self.matcher.find_iter(&*decoded) {
            let secret = m.pattern().as_usize();
            match found.iter_mut().find(|(s, _)| *s == secret) {
                Some((_, n)) => *n += 1,
                None => found.push((secret, 1)),
            }
        }
        for (secret, any_form) in found {
            let as_handed_out = self
                .exact
                .get(secret)
                .map_or(0, |p| memchr::memmem::find_iter(text, p.as_bytes()).count());
            hits.push(Hit {
                secret,
                place: place(),
                exact: as_handed_out == any_form,
            });
        }
    }
}

/// `text` percent-decoded until it no longer changes (bounded); borrowed when it has no `%`.
fn decode_fully(text: &[u8]) -> Cow<'_, [u8]> {
    let mut current = Cow::Borrowed(text);
    for _ in 0..MAX_DECODE_ROUNDS {
        match percent_decode(&current) {
            Cow::Borrowed(_) => break,
            Cow::Owned(next) => current = Cow::Owned(next),
        }
    }
    current
}

/// One round of percent-decoding (`%XX` with two hex digits; other `%` left as they are); borrowed when
/// nothing changes.
pub(super) fn percent_decode(text: &[u8]) -> Cow<'_, [u8]> {
    if !text.contains(&b'%') {
        return Cow::Borrowed(text);
    }
    let mut out = Vec::with_capacity(text.len());
    let mut changed = false;
    let mut i = 0;
    while let Some(&b) = text.get(i) {
        if b == b'%'
            && let (Some(h), Some(l)) = (
                text.get(i + 1).and_then(|c| hex(*c)),
                text.get(i + 2).and_then(|c| hex(*c)),
            )
        {
            out.push(h << 4 | l);
            changed = true;
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(text)
    }
}

fn hex(c: u8) -> Option<u8> {
    char::from(c).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

/// The path and the query (without `?`) of a path-and-query.
pub(super) fn split_query(path_and_query: &str) -> (&str, &str) {
    path_and_query.split_once('?').unwrap_or((path_and_query, ""))
}

/// One `name[=value]` of a query string.
#[derive(Debug)]
pub(super) struct Param<'a> {
    /// The name as written.
    pub(super) name: &'a str,
    /// The value as written, if there is an `=`.
    pub(super) value: Option<&'a str>,
}

impl Param<'_> {
    /// The name percent-decoded (`+` as a space), as servers read it.
    pub(super) fn decoded_name(&self) -> String {
        decode_name(self.name)
    }
}

/// A query parameter name percent-decoded, `+` as a space.
fn decode_name(name: &str) -> String {
    let plus = name.replace('+', " ");
    String::from_utf8_lossy(&percent_decode(plus.as_bytes())).into_owned()
}

/// The parameters of a query string. Both `&` and `;` separate them: some servers split on either, and a
/// value that hid a second parameter behind `;` must not pass as one named parameter.
pub(super) fn query_params(query: &str) -> impl Iterator<Item = Param<'_>> {
    query
        .split(['&', ';'])
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((name, value)) => Param {
                name,
                value: Some(value),
            },
            None => Param { name: p, value: None },
        })
}

/// `path_and_query` with `placeholder` replaced by `encoded` in the values of the parameters named `name`
/// (decoded); `None` when nothing was replaced.
pub(super) fn replace_in_query(
    path_and_query: &str,
    name: &str,
    placeholder: &str,
    encoded: &str,
) -> Option<String> {
    let (path, query) = split_query(path_and_query);
    let mut out = String::with_capacity(path_and_query.len() + encoded.len());
    out.push_str(path);
    out.push('?');
    let mut changed = false;
    let mut rest = query;
    while !rest.is_empty() {
        let end = rest.find(['&', ';']).unwrap_or(rest.len());
        let (segment, tail) = rest.split_at(end);
        let param = query_params(segment).next();
        match param {
            Some(Param {
                name: n,
                value: Some(v),
            }) if decode_name(n) == name && v.contains(placeholder) => {
                out.push_str(n);
                out.push('=');
                out.push_str(&v.replace(placeholder, encoded));
                changed = true;
            }
            _ => out.push_str(segment),
        }
        // The separator, if any.
        out.push_str(tail.get(..1).unwrap_or_default());
        rest = tail.get(1..).unwrap_or_default();
    }
    changed.then_some(out)
}

/// Whether a path (without its query) is in the one form every server reads the same way: it starts with
/// `/`, has no empty, `.` or `..` segment (also not before a `;` parameter), no backslash, and no
/// percent-encoding of a character that needs none (unreserved characters), of `/`, `\` or `%`, and no
/// malformed `%`. Path limits are only checked on such paths (E15): a server that resolves
/// `/backend-api/../admin` would serve a path the limit never saw.
pub(super) fn is_normal_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    if path.contains('\\') {
        return false;
    }
    let bytes = path.as_bytes();
    for (at, &b) in bytes.iter().enumerate() {
        if b != b'%' {
            continue;
        }
        let (Some(h), Some(l)) = (
            bytes.get(at + 1).and_then(|c| hex(*c)),
            bytes.get(at + 2).and_then(|c| hex(*c)),
        ) else {
            return false;
        };
        let decoded = h << 4 | l;
        if decoded.is_ascii_alphanumeric() || b"-._~/\\%".contains(&decoded) {
            return false;
        }
    }
    // A trailing slash gives one final empty segment; every other segment must be a real name.
    let segments: Vec<&str> = rest.split('/').collect();
    let last = segments.len().saturating_sub(1);
    segments.iter().enumerate().all(|(i, segment)| {
        let name = segment.split(';').next().unwrap_or_default();
        (!name.is_empty() || (i == last && segment.is_empty())) && name != "." && name != ".."
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "agenthold-placeholder-abcdefghijklmnopqrstuvwxyz234567";

    fn head(path: &str, headers: &[(&str, &str)]) -> RequestHead {
        RequestHead {
            method: "GET".into(),
            host: "h.test".into(),
            path_and_query: path.into(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    fn finder() -> Finder {
        Finder::new(vec![P.to_owned()]).unwrap()
    }

    // covers: E13
    #[test]
    fn finds_the_placeholder_in_every_place_and_form() {
        let encoded: String = P.bytes().map(|b| format!("%{b:02X}")).collect();
        let twice = encoded.replace('%', "%25");
        let upper = P.to_ascii_uppercase();
        let half = format!("agenthold%2dplaceholder-{}", &P[22..]);
        for (path, headers, want) in [
            (format!("/v1/{P}"), vec![], Place::Path),
            (format!("/v1/{encoded}"), vec![], Place::Path),
            (format!("/?q={twice}"), vec![], Place::Query("q".into())),
            (format!("/?a=1;k={half}"), vec![], Place::Query("k".into())),
            (format!("/?{P}=1"), vec![], Place::QueryName),
            (
                "/".into(),
                vec![("cookie", format!("s={upper}"))],
                Place::Header("cookie".into()),
            ),
            ("/".into(), vec![(P, "1".to_owned())], Place::HeaderName),
        ] {
            let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let hits = finder().scan(&head(&path, &headers));
            assert_eq!(hits.len(), 1, "{path} {headers:?}");
            assert_eq!(hits[0].place, want, "{path} {headers:?}");
            assert_eq!(hits[0].secret, 0);
        }
        assert!(
            finder()
                .scan(&head("/?q=agenthold-placeholder-other", &[]))
                .is_empty()
        );
    }

    #[test]
    fn exact_only_when_every_occurrence_is_as_handed_out() {
        let hits = finder().scan(&head("/", &[("x-key", P)]));
        assert!(hits[0].exact);
        let mixed = format!("{P},{}", P.to_ascii_uppercase());
        let hits = finder().scan(&head("/", &[("x-key", &mixed)]));
        assert!(!hits[0].exact);
        let hits = finder().scan(&head(&format!("/?k=agenthold%2Dplaceholder-{}", &P[22..]), &[]));
        assert!(!hits[0].exact);
    }

    #[test]
    fn query_replacement_touches_only_the_named_parameter() {
        let q = format!("/v1?key={P}&other={P};k2={P}");
        let out = replace_in_query(&q, "key", P, "s%26v").unwrap();
        assert_eq!(out, format!("/v1?key=s%26v&other={P};k2={P}"));
        assert_eq!(replace_in_query("/v1?a=1", "key", P, "v"), None);
        let q = format!("/v1?k%65y={P}");
        assert_eq!(replace_in_query(&q, "key", P, "v").unwrap(), "/v1?k%65y=v");
    }

    // covers: E15
    #[test]
    fn only_paths_in_normal_form_are_normal() {
        for ok in ["/", "/backend-api/", "/backend-api/x", "/a%20b/c%3A", "/a;v=1/b"] {
            assert!(is_normal_path(ok), "{ok}");
        }
        for bad in [
            "",
            "backend-api",
            "/backend-api/../../admin",
            "/backend-api/./x",
            "/backend-api/%2e%2e/admin",
            "/backend-api/%2E%2E/admin",
            "/backend-api/..;/admin",
            "//admin",
            "/backend-api//x",
            "/backend-api%2fadmin",
            "/backend-api%5cadmin",
            "/backend-api\\..\\admin",
            "/backend-api/%252e%252e/admin",
            "/backend-api/%6fk",
            "/backend-api/%zz",
            "/backend-api/%2",
        ] {
            assert!(!is_normal_path(bad), "{bad}");
        }
    }
}
