//! Response redaction (E19): the forms a secret's value can take in an upstream's answer, and a streaming
//! replacer that swaps every one of them for the secret's placeholder before the sandbox sees it.
//!
//! Header rules only put a value where the rule says (E13), but an upstream may still send it back: an API
//! that quotes a bad header in its error, a debugging endpoint that echoes the request, a resource that
//! stored an `Authorization` header. So every answer from an intercepted host passes through a
//! [`Redactor`] built from the agent's secrets. It looks for, per secret value:
//! - the raw value, and every header value a rule renders from it (`Bearer …`, `Basic base64(…)`);
//! - percent-encoded forms (upper- and lower-case hex, `+` for space);
//! - JSON-escaped forms (minimal escaping, `\uXXXX` for non-ASCII, `\/` for slashes);
//! - base64 (standard and URL-safe alphabets) at each of the three byte alignments a value can have
//!   inside a longer encoded text: only the characters that depend on the value alone are matched, so the
//!   value is found wherever it sits in the encoded input.
//!
//! Derived forms shorter than [`MIN_DERIVED_FORM`] bytes are not looked for (they would match ordinary
//! text); the raw value always is. Transformations other than these (a value reversed, hashed, cut in
//! pieces by the upstream) are not recognised: that is why rules list only hosts the operator trusts.
//!
//! [`RedactStream`] applies a redactor to a body that arrives in chunks. A form split across chunks is
//! still found: the stream holds back the shortest tail of a chunk that could be the start of a form (at
//! most the longest form minus one byte) and only that, so text that cannot start a form (the `\n\n` that
//! ends a server-sent event, say) is never delayed.
// enforces: E19

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use base64::Engine;
use zeroize::Zeroizing;

/// Derived forms shorter than this many bytes are not looked for.
pub const MIN_DERIVED_FORM: usize = 8;

/// One secret as a redactor needs it: its value, the header values its rules render from it, and the
/// placeholder that replaces every form of both.
#[derive(Debug)]
pub struct RedactSource<'a> {
    /// The secret's value.
    pub value: &'a [u8],
    /// Header values rendered from it (`Bearer …`); the raw value need not be repeated here.
    pub rendered: Vec<Zeroizing<Vec<u8>>>,
    /// The placeholder that replaces every form.
    pub placeholder: &'a str,
}

/// Finds every form of a set of secret values and replaces each with its secret's placeholder.
///
/// Built once per agent when its secrets change; cheap to share (`Arc`). The matcher copies the forms
/// into its own tables, which are not zeroized on drop (the values live in the gateway's memory anyway).
pub struct Redactor {
    matcher: AhoCorasick,
    /// Per pattern: the placeholder that replaces it.
    replacement: Vec<Arc<str>>,
    /// The patterns, for the check of a chunk's tail.
    patterns: Vec<Zeroizing<Vec<u8>>>,
    /// Whether a byte starts some pattern.
    starts: Box<[bool; 256]>,
    /// Length of the longest pattern.
    longest: usize,
    /// Length of the shortest pattern: shorter inputs cannot contain one.
    shortest: usize,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("forms", &self.patterns.len())
            .field("longest", &self.longest)
            .finish_non_exhaustive()
    }
}

/// The outcome of redacting one input.
#[derive(Debug, PartialEq, Eq)]
pub enum Redacted {
    /// Nothing found and nothing held back: pass the input on as it is.
    Unchanged,
    /// Pass these bytes on instead.
    Changed(Vec<u8>),
}

impl Redactor {
    /// A redactor for `sources`; `None` when they give no form to look for (no secret, or only empty
    /// values).
    #[must_use]
    pub fn new<'a>(sources: impl IntoIterator<Item = RedactSource<'a>>) -> Option<Self> {
        let mut patterns: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        let mut replacement: Vec<Arc<str>> = Vec::new();
        for source in sources {
            let placeholder: Arc<str> = Arc::from(source.placeholder);
            for form in forms(source.value, &source.rendered) {
                if !patterns.iter().any(|p| **p == *form) {
                    patterns.push(form);
                    replacement.push(Arc::clone(&placeholder));
                }
            }
        }
        if patterns.is_empty() {
            return None;
        }
        let matcher = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(patterns.iter().map(|p| p.as_slice()))
            .ok()?;
        let mut starts = Box::new([false; 256]);
        for p in &patterns {
            if let Some(&b) = p.first() {
                starts[usize::from(b)] = true;
            }
        }
        let longest = patterns.iter().map(|p| p.len()).max().unwrap_or(0);
        let shortest = patterns.iter().map(|p| p.len()).min().unwrap_or(0);
        Some(Self {
            matcher,
            replacement,
            patterns,
            starts,
            longest,
            shortest,
        })
    }

    /// Length of the longest form looked for: a stream holds back fewer bytes than this.
    #[must_use]
    pub fn longest_form(&self) -> usize {
        self.longest
    }

    /// `input` with every form replaced, or `None` when it contains none (one complete input, such as a
    /// header value).
    #[must_use]
    pub fn redact(&self, input: &[u8]) -> Option<Vec<u8>> {
        // Most header values (dates, content types) are shorter than any form: no scan needed.
        if input.len() < self.shortest {
            return None;
        }
        let mut out = None;
        let last = self.replace_into(input, &mut out);
        let mut out = out?;
        out.extend_from_slice(input.get(last..).unwrap_or_default());
        Some(out)
    }

    /// A stream over this redactor for one body.
    #[must_use]
    pub fn stream(self: &Arc<Self>) -> RedactStream {
        RedactStream {
            redactor: Arc::clone(self),
            held: Zeroizing::new(Vec::new()),
        }
    }

    /// Copy `data` up to the end of its last match into `out` (created on the first match), each match
    /// replaced; returns where the copy stopped.
    fn replace_into(&self, data: &[u8], out: &mut Option<Vec<u8>>) -> usize {
        let mut last = 0;
        for m in self.matcher.find_iter(data) {
            let buf = out.get_or_insert_with(|| Vec::with_capacity(data.len()));
            buf.extend_from_slice(data.get(last..m.start()).unwrap_or_default());
            let placeholder = self.replacement.get(m.pattern().as_usize()).map_or("", |p| &**p);
            buf.extend_from_slice(placeholder.as_bytes());
            last = m.end();
        }
        last
    }

    /// Where the shortest tail of `data` (starting at or after `from`) that could begin a form starts;
    /// `data.len()` when no tail could.
    fn partial_start(&self, data: &[u8], from: usize) -> usize {
        let lo = from.max(data.len().saturating_sub(self.longest.saturating_sub(1)));
        for at in lo..data.len() {
            let Some(tail) = data.get(at..) else { break };
            let could_start = tail.first().is_some_and(|&b| self.starts[usize::from(b)])
                && self
                    .patterns
                    .iter()
                    .any(|p| p.len() > tail.len() && p.starts_with(tail));
            if could_start {
                return at;
            }
        }
        data.len()
    }
}

/// A [`Redactor`] applied to a body that arrives in chunks (see the module documentation).
#[derive(Debug)]
pub struct RedactStream {
    redactor: Arc<Redactor>,
    /// The tail of the previous chunks that could begin a form.
    held: Zeroizing<Vec<u8>>,
}

impl RedactStream {
    /// The bytes to pass on after `chunk`: [`Redacted::Unchanged`] means `chunk` itself (nothing was held
    /// back before it, nothing in it matched, and no tail of it is held back now).
    pub fn push(&mut self, chunk: &[u8]) -> Redacted {
        let data: Cow<'_, [u8]> = if self.held.is_empty() {
            Cow::Borrowed(chunk)
        } else {
            let mut joined = std::mem::take(&mut *self.held);
            joined.extend_from_slice(chunk);
            Cow::Owned(joined)
        };
        let mut out = None;
        let last = self.redactor.replace_into(&data, &mut out);
        let keep = self.redactor.partial_start(&data, last);
        if out.is_none() && keep == data.len() && matches!(data, Cow::Borrowed(_)) {
            return Redacted::Unchanged;
        }
        let mut out = out.unwrap_or_default();
        out.extend_from_slice(data.get(last..keep).unwrap_or_default());
        self.held.extend_from_slice(data.get(keep..).unwrap_or_default());
        if let Cow::Owned(mut joined) = data {
            zeroize::Zeroize::zeroize(&mut joined);
        }
        Redacted::Changed(out)
    }

    /// The end of the body: everything still held back, redacted (forms cannot continue past the end).
    pub fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut *self.held);
        let out = self.redactor.redact(&held).unwrap_or_else(|| held.clone());
        drop(Zeroizing::new(held));
        out
    }

    /// Whether bytes are held back waiting for the next chunk.
    #[must_use]
    pub fn is_holding(&self) -> bool {
        !self.held.is_empty()
    }
}

/// Every form of `value` and of the header values rendered from it.
fn forms(value: &[u8], rendered: &[Zeroizing<Vec<u8>>]) -> Vec<Zeroizing<Vec<u8>>> {
    let mut out: Vec<Zeroizing<Vec<u8>>> = Vec::new();
    let mut add = |form: Vec<u8>, derived: bool| {
        let form = Zeroizing::new(form);
        let long_enough = !form.is_empty() && (!derived || form.len() >= MIN_DERIVED_FORM);
        if long_enough && !out.contains(&form) {
            out.push(form);
        }
    };
    add(value.to_vec(), false);
    for form in percent_forms(value).into_iter().chain(json_forms(value)) {
        add(form, true);
    }
    for form in base64_cores(value) {
        add(form, true);
    }
    for r in rendered.iter().filter(|r| r.as_slice() != value) {
        add(r.to_vec(), false);
        for form in percent_forms(r).into_iter().chain(json_forms(r)) {
            add(form, true);
        }
        for form in base64_cores(r) {
            add(form, true);
        }
    }
    out
}

/// `value` percent-encoded (everything but RFC 3986 unreserved characters) with upper- and lower-case hex,
/// and as form data (`+` for a space).
fn percent_forms(value: &[u8]) -> Vec<Vec<u8>> {
    let encode = |upper: bool, plus: bool| {
        let mut out = Vec::with_capacity(value.len() * 3);
        for &b in value {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(b);
            } else if plus && b == b' ' {
                out.push(b'+');
            } else {
                let hex = if upper {
                    b"0123456789ABCDEF"
                } else {
                    b"0123456789abcdef"
                };
                out.extend_from_slice(&[b'%', hex[usize::from(b >> 4)], hex[usize::from(b & 15)]]);
            }
        }
        out
    };
    vec![encode(true, false), encode(false, false), encode(true, true)]
}

/// `value` as the inside of a JSON string: as serde_json writes it, with every non-ASCII character as
/// `\uXXXX` (Python's default), and with `/` written `\/` (PHP's default). Nothing for non-UTF-8 values.
fn json_forms(value: &[u8]) -> Vec<Vec<u8>> {
    let Ok(text) = std::str::from_utf8(value) else {
        return Vec::new();
    };
    let minimal = serde_json::to_string(text).unwrap_or_default();
    let minimal = minimal
        .get(1..minimal.len().saturating_sub(1))
        .unwrap_or_default()
        .to_owned();
    let mut ascii = String::with_capacity(minimal.len());
    for c in minimal.chars() {
        if c.is_ascii() {
            ascii.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                ascii.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    let slashes = minimal.replace('/', "\\/");
    vec![minimal.into_bytes(), ascii.into_bytes(), slashes.into_bytes()]
}

/// The base64 characters that depend on `value` alone, for each byte alignment it can have inside a longer
/// encoded input (0, 1 or 2 bytes after a 3-byte boundary), in the standard and URL-safe alphabets.
fn base64_cores(value: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for align in 0..3_usize {
        let mut bytes = Zeroizing::new(vec![0u8; align]);
        bytes.extend_from_slice(value);
        let encoded = Zeroizing::new(base64::engine::general_purpose::STANDARD_NO_PAD.encode(&*bytes));
        // Character i carries bits 6i..6i+6: keep those that lie entirely within the value's bits.
        let first = (8 * align).div_ceil(6);
        let end = (8 * bytes.len()) / 6;
        let Some(core) = encoded.as_bytes().get(first..end) else {
            continue;
        };
        let url_safe: Vec<u8> = core
            .iter()
            .map(|&c| match c {
                b'+' => b'-',
                b'/' => b'_',
                c => c,
            })
            .collect();
        out.push(core.to_vec());
        out.push(url_safe);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUE: &[u8] = b"sk-ant-api03-Zx9/+q\"\\w\xc3\xa9 end";

    fn redactor() -> Arc<Redactor> {
        let rendered = vec![Zeroizing::new([b"Bearer ".as_slice(), VALUE].concat())];
        Arc::new(
            Redactor::new([RedactSource {
                value: VALUE,
                rendered,
                placeholder: "agenthold-placeholder-test",
            }])
            .unwrap(),
        )
    }

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    fn stream_through(r: &Arc<Redactor>, input: &[u8], chunk: usize) -> Vec<u8> {
        let mut s = r.stream();
        let mut out = Vec::new();
        for piece in input.chunks(chunk.max(1)) {
            match s.push(piece) {
                Redacted::Unchanged => out.extend_from_slice(piece),
                Redacted::Changed(b) => out.extend_from_slice(&b),
            }
        }
        out.extend_from_slice(&s.finish());
        out
    }

    /// Each way the value can come back, inside ordinary text.
    fn echoes() -> Vec<Vec<u8>> {
        let json = serde_json::to_string(std::str::from_utf8(VALUE).unwrap()).unwrap();
        let mut out = vec![
            VALUE.to_vec(),
            percent_forms(VALUE)[0].clone(),
            percent_forms(VALUE)[1].clone(),
            json.into_bytes(),
            json_forms(VALUE)[1].clone(),
            json_forms(VALUE)[2].clone(),
        ];
        for prefix in ["", "a", "ab", "abc:"] {
            let mut embedded = prefix.as_bytes().to_vec();
            embedded.extend_from_slice(VALUE);
            embedded.extend_from_slice(b"!tail");
            out.push(b64(&embedded).into_bytes());
            out.push(
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .encode(&embedded)
                    .into_bytes(),
            );
        }
        out
    }

    /// Whether `text` still shows the value, in any form [`echoes`] produces or its middle 12 bytes raw.
    fn shows_value(text: &[u8]) -> bool {
        let middle = &VALUE[4..16];
        memchr::memmem::find(text, middle).is_some()
            || forms(VALUE, &[])
                .iter()
                .any(|f| memchr::memmem::find(text, f).is_some())
    }

    // covers: E19
    #[test]
    fn every_form_is_replaced_in_one_piece_and_across_every_chunk_boundary() {
        let r = redactor();
        for echo in echoes() {
            let body = [b"{\"error\": \"bad value ".as_slice(), &echo, b"\"}\n\n"].concat();
            let whole = r.redact(&body).unwrap_or_else(|| body.clone());
            assert!(!shows_value(&whole), "{}", String::from_utf8_lossy(&whole));
            for chunk in [1, 2, 3, 5, 7, 16, 64] {
                let out = stream_through(&r, &body, chunk);
                assert!(
                    !shows_value(&out),
                    "chunk {chunk}: {}",
                    String::from_utf8_lossy(&out)
                );
                assert!(
                    String::from_utf8_lossy(&out).contains("agenthold-placeholder-test"),
                    "chunk {chunk}"
                );
            }
        }
    }

    // covers: E19
    #[test]
    fn the_rendered_header_value_is_replaced_whole() {
        let r = redactor();
        let out = r
            .redact(b"you sent: Bearer sk-ant-api03-Zx9/+q\"\\w\xc3\xa9 end.")
            .unwrap();
        assert_eq!(out, b"you sent: agenthold-placeholder-test.");
    }

    #[test]
    fn text_without_forms_passes_unchanged_and_is_not_delayed() {
        let r = redactor();
        let mut s = r.stream();
        assert_eq!(s.push(b"data: {\"delta\": \"hello\"}\n\n"), Redacted::Unchanged);
        assert!(!s.is_holding());
        // A tail that could start the value is held, and released once it cannot.
        assert_eq!(s.push(b"data: sk-an"), Redacted::Changed(b"data: ".to_vec()));
        assert!(s.is_holding());
        assert_eq!(s.push(b"chor\n\n"), Redacted::Changed(b"sk-anchor\n\n".to_vec()));
        assert!(!s.is_holding());
        assert_eq!(r.redact(b"plain text"), None);
    }

    #[test]
    fn short_values_match_raw_only_and_empty_sources_give_no_redactor() {
        let r = Redactor::new([RedactSource {
            value: b"k3y",
            rendered: Vec::new(),
            placeholder: "P",
        }])
        .unwrap();
        assert_eq!(r.redact(b"a k3y b").unwrap(), b"a P b");
        assert_eq!(r.redact(&b64(b"k3y").into_bytes()), None, "too short to look for");
        assert!(
            Redactor::new([RedactSource {
                value: b"",
                rendered: Vec::new(),
                placeholder: "P"
            }])
            .is_none()
        );
    }

    #[test]
    fn held_back_bytes_are_bounded_by_the_longest_form() {
        let r = redactor();
        let mut s = r.stream();
        let mut total = 0;
        for _ in 0..1000 {
            if let Redacted::Changed(b) = s.push(b"sk-ant-api03-Zx9") {
                total += b.len();
            }
            assert!(s.held.len() < r.longest_form());
        }
        total += s.finish().len();
        assert_eq!(total, 16 * 1000);
    }

    #[test]
    fn base64_cores_depend_on_the_value_only() {
        for align in 0..3 {
            for other in [[0u8; 3], [0xff; 3], [0x41, 0x7f, 0x80]] {
                let mut embedded = other[..align].to_vec();
                embedded.extend_from_slice(VALUE);
                embedded.extend_from_slice(&other);
                let text = b64(&embedded);
                let cores = base64_cores(VALUE);
                assert!(
                    cores
                        .iter()
                        .any(|c| text.as_bytes().windows(c.len()).any(|w| w == c.as_slice())),
                    "alignment {align}, neighbours {other:?}"
                );
            }
        }
    }
}
