//! `template_parse`: arbitrary text as a header template (E11), rendered with an arbitrary value.
//!
//! Input: the template's bytes (lossily decoded as UTF-8), then optionally a `0xff` byte (never part of
//! UTF-8) and the value's bytes; without a separator the whole input is also the value. Parsing never
//! panics and an error is a template error at a character boundary inside the source. A template that
//! parses keeps its source, equals what its source parses to, and renders without panicking to exactly
//! [`Template::rendered_len`] bytes; a template without `.Value` renders the same for every value, and text
//! without `{{` renders as itself.

use agenthold_core::Error;
use agenthold_core::template::{MAX_TEMPLATE_LEN, Template};

/// Run every check on `data`; panics on a violated invariant.
pub fn check(data: &[u8]) {
    let (source, value) = match data.iter().position(|&b| b == 0xff) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, data),
    };
    let source = String::from_utf8_lossy(source);
    match Template::parse(&source) {
        Ok(template) => check_template(&source, &template, value),
        Err(Error::Template {
            template,
            position,
            problem,
        }) => {
            assert_eq!(template, source);
            assert!(
                position <= source.len(),
                "{source:?}: position {position} is past the end"
            );
            assert!(
                source.is_char_boundary(position),
                "{source:?}: position {position} splits a character"
            );
            assert!(!problem.is_empty(), "{source:?}: empty problem");
        }
        Err(other) => panic!("{source:?}: not a template error: {other}"),
    }
}

fn check_template(source: &str, template: &Template, value: &[u8]) {
    assert!(
        source.len() <= MAX_TEMPLATE_LEN,
        "{source:?} is over the length limit"
    );
    assert_eq!(template.source(), source);
    assert_eq!(template.to_string(), source);
    let again = Template::parse(template.source()).map_err(|e| e.to_string());
    assert_eq!(
        again.as_ref(),
        Ok(template),
        "{source:?} parses differently the second time"
    );

    let out = template.render(value);
    assert_eq!(
        out.len(),
        template.rendered_len(value.len()),
        "{source:?}: rendered length"
    );
    if !template.uses_value() {
        assert_eq!(
            out,
            template.render(b"constant?"),
            "{source:?} depends on a value it does not use"
        );
    }
    if !source.contains("{{") {
        assert_eq!(
            out.as_slice(),
            source.as_bytes(),
            "{source:?}: text is not literal"
        );
    }
}
