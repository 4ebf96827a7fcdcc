//! `template_render`: fixed valid templates (E11) rendered with hostile values of arbitrary bytes.
//!
//! Rendering never panics and every output has exactly the expected content and length: the value is
//! copied byte for byte, `base64` is standard base64 with padding (decoding gives the input back), and a
//! length never exceeds what the template's structure implies.

use agenthold_core::template::{MAX_NESTING, Template};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// The length of standard padded base64 of `n` bytes.
fn b64_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

fn parse(source: &str) -> Template {
    Template::parse(source).unwrap_or_else(|e| panic!("fixed template {source:?}: {e}"))
}

/// Run every check with `data` as the secret value; panics on a violated invariant.
pub fn check(data: &[u8]) {
    let v = data.len();

    let plain = parse("{{.Value}}").render(data);
    assert_eq!(plain.as_slice(), data);

    let bearer = parse("Bearer {{ .Value }}").render(data);
    assert_eq!(bearer.len(), 7 + v);
    assert_eq!(&bearer[..7], b"Bearer ");
    assert_eq!(&bearer[7..], data);

    let basic = parse(r#"Basic {{base64 (print "x-access-token:" .Value)}}"#).render(data);
    assert_eq!(basic.len(), 6 + b64_len(15 + v));
    assert_eq!(&basic[..6], b"Basic ");
    let decoded = STANDARD
        .decode(&basic[6..])
        .unwrap_or_else(|e| panic!("GitHub Basic does not decode: {e}"));
    assert_eq!(&decoded[..15], b"x-access-token:");
    assert_eq!(&decoded[15..], data);

    let b64 = parse("{{base64 .Value}}").render(data);
    assert_eq!(b64.as_slice(), STANDARD.encode(data).as_bytes());

    let printed = parse(r#"{{print .Value "\x00\xff" `|` (.Value)}}"#).render(data);
    assert_eq!(printed.len(), 2 * v + 3);
    assert_eq!(&printed[..v], data);
    assert_eq!(&printed[v..v + 3], b"\x00\xff|");
    assert_eq!(&printed[v + 3..], data);

    // The deepest nesting the grammar allows: MAX_NESTING parenthesised base64 calls inside one more.
    // Each level grows the output by 4/3, so the value is cut to keep an execution fast.
    let short = &data[..v.min(64)];
    let deep_source = format!(
        "{{{{base64 {}.Value{}}}}}",
        "(base64 ".repeat(MAX_NESTING),
        ")".repeat(MAX_NESTING)
    );
    let deep = parse(&deep_source).render(short);
    let expected_len = (0..=MAX_NESTING).fold(short.len(), |n, _| b64_len(n));
    assert_eq!(deep.len(), expected_len);
    let mut unwrapped = deep.to_vec();
    for _ in 0..=MAX_NESTING {
        unwrapped = STANDARD
            .decode(&unwrapped)
            .unwrap_or_else(|e| panic!("nested base64 does not decode: {e}"));
    }
    assert_eq!(unwrapped, short);
}
