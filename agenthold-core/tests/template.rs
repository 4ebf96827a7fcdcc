//! The header template language (E11): what it accepts and renders, every rejection with its position,
//! hostile values, serde, and replay of the fuzz regressions and seeds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;

use agenthold_core::secret::{Preset, RuleKind};
use agenthold_core::template::{MAX_NESTING, MAX_TEMPLATE_LEN, Template};
use agenthold_core::{Error, ErrorKind};
use base64::Engine;

// The fuzz targets' checks, included so that `cargo test` replays `fuzz/regressions` through them.
#[allow(unreachable_pub)]
#[path = "../../fuzz/src/template_parse.rs"]
mod fuzz_template_parse;
#[allow(unreachable_pub)]
#[path = "../../fuzz/src/template_render.rs"]
mod fuzz_template_render;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn render(source: &str, value: &[u8]) -> Vec<u8> {
    Template::parse(source)
        .unwrap_or_else(|e| panic!("{source:?}: {e}"))
        .render(value)
        .to_vec()
}

fn rejection(source: &str) -> (usize, String) {
    match Template::parse(source) {
        Err(Error::Template {
            template,
            position,
            problem,
        }) => {
            assert_eq!(template, source);
            (position, problem)
        }
        other => panic!("{source:?} was not rejected as a template: {other:?}"),
    }
}

// covers: E11
#[test]
fn github_basic_for_git_over_https() {
    let out = render(
        r#"Basic {{base64 (print "x-access-token:" .Value)}}"#,
        b"ghp_abc123",
    );
    assert_eq!(
        out,
        format!("Basic {}", B64.encode("x-access-token:ghp_abc123")).as_bytes()
    );
    assert_eq!(out, b"Basic eC1hY2Nlc3MtdG9rZW46Z2hwX2FiYzEyMw==");
}

// covers: E11
#[test]
fn bearer_and_api_key() {
    assert_eq!(render("Bearer {{.Value}}", b"sk-1"), b"Bearer sk-1");
    assert_eq!(render("{{ .Value }}", b"sk-ant-2"), b"sk-ant-2");
    assert_eq!(render("{{\t.Value\t}}", b"t"), b"t");
    assert_eq!(render("{{.Value}}{{.Value}}", b"ab"), b"abab");
}

// covers: E11
#[test]
fn nested_prints_concatenate_without_separators() {
    assert_eq!(
        render(r#"{{print (print "a" (print "b" .Value)) "c"}}"#, b"V"),
        b"abVc"
    );
    assert_eq!(render("{{print}}", b"V"), b"");
    assert_eq!(render(r#"{{print .Value .Value "-" (.Value)}}"#, b"x"), b"xx-x");
    assert_eq!(render(r#"{{ ( print "a" ) }}"#, b""), b"a");
    assert_eq!(render(r#"{{base64 (print)}}"#, b"x"), b"");
    assert_eq!(
        render(r#"{{base64 (base64 "a")}}"#, b""),
        B64.encode(B64.encode("a")).as_bytes()
    );
}

// covers: E11
#[test]
fn literals_with_escapes() {
    assert_eq!(render(r#"{{"a\\b\"c"}}"#, b""), b"a\\b\"c");
    assert_eq!(render(r#"{{"\n\r\t"}}"#, b""), b"\n\r\t");
    assert_eq!(render(r#"{{"\x00\x7F\xfF"}}"#, b""), b"\x00\x7f\xff");
    assert_eq!(
        render(r#"{{"\u00e9\u20AC\uFFFF"}}"#, b""),
        "é€\u{ffff}".as_bytes()
    );
    assert_eq!(
        render(r#"{{"é€ unicode as is"}}"#, b""),
        "é€ unicode as is".as_bytes()
    );
    // Raw strings take everything verbatim, backslashes, quotes and delimiters included.
    assert_eq!(render(r#"{{`\n "}}" {{ (`}}"#, b""), br#"\n "}}" {{ ("#);
    assert_eq!(render("{{`line\nbreak`}}", b""), b"line\nbreak");
}

// covers: E11
#[test]
fn braces_in_text_are_literal() {
    assert_eq!(render("a { b } c", b"v"), b"a { b } c");
    assert_eq!(render("stray }} is text", b"v"), b"stray }} is text");
    assert_eq!(render("{x}{{.Value}}}", b"v"), b"{x}v}");
    assert_eq!(render(r#"{{"{{"}}.Value}}"#, b"v"), b"{{.Value}}");
    assert_eq!(render("{ {.Value} }", b"v"), b"{ {.Value} }");
    assert!(!Template::parse("{ {.Value} }").unwrap().uses_value());
}

// covers: E11
#[test]
fn every_rejection_names_its_position() {
    let deep = |n: usize| format!("{{{{print {}.Value{}}}}}", "(print ".repeat(n), ")".repeat(n));
    let cases: Vec<(String, usize, &str)> = vec![
        // Unknown functions, keywords and fields.
        ("{{foo .Value}}".into(), 2, "unknown function"),
        ("x {{ and .Value .Value }}".into(), 5, "unknown function"),
        ("{{if .Value}}a{{end}}".into(), 2, "unknown function"),
        ("{{printf \"%s\" .Value}}".into(), 2, "unknown function"),
        ("{{.Other}}".into(), 2, "unknown field .Other"),
        ("{{.value}}".into(), 2, "unknown field .value"),
        ("{{print \"x\" .Token}}".into(), 12, "unknown field"),
        ("{{.Value.Token}}".into(), 8, "fields of .Value"),
        ("{{.}}".into(), 2, "'.' alone"),
        // Trim markers and comments.
        ("{{- .Value}}".into(), 2, "trim markers"),
        ("{{.Value -}}".into(), 9, "trim markers"),
        ("{{.Value-}}".into(), 8, "trim markers"),
        ("{{/* note */}}".into(), 2, "comments"),
        ("{{ /* note */ }}".into(), 3, "comments"),
        // Pipes and variables.
        ("{{.Value | base64}}".into(), 9, "pipes"),
        ("{{print .Value|base64}}".into(), 14, "pipes"),
        ("{{|}}".into(), 2, "pipes"),
        ("{{$x := .Value}}".into(), 2, "variables"),
        ("{{print $}}".into(), 8, "variables"),
        // Unterminated actions, strings and parentheses.
        ("Bearer {{.Value".into(), 7, "unterminated action"),
        ("{{".into(), 0, "unterminated action"),
        ("ok {{ ".into(), 3, "unterminated action"),
        ("{{print \"a\"".into(), 0, "unterminated action"),
        ("{{.Value}".into(), 8, "expected '}}'"),
        ("{{print \"}} {{.Value}}".into(), 8, "unterminated string"),
        ("{{\"abc\\".into(), 2, "unterminated string"),
        ("{{`abc}}".into(), 2, "unterminated raw string"),
        ("{{base64 (.Value}}".into(), 9, "unclosed '('"),
        ("{{base64 (print (.Value)".into(), 9, "unclosed '('"),
        ("{{)}}".into(), 2, "unexpected ')'"),
        ("{{.Value)}}".into(), 8, "unexpected ')'"),
        // Empty actions and parentheses.
        ("{{}}".into(), 0, "empty action"),
        ("a{{   }}".into(), 1, "empty action"),
        ("{{print ()}}".into(), 8, "empty parentheses"),
        // Arity.
        ("{{base64}}".into(), 2, "exactly one argument, got 0"),
        (
            "{{ base64 .Value \"x\" }}".into(),
            3,
            "exactly one argument, got 2",
        ),
        ("{{base64 print .Value}}".into(), 9, "must be parenthesised"),
        ("{{print print}}".into(), 8, "must be parenthesised"),
        ("{{.Value \"x\"}}".into(), 9, "expected '}}'"),
        ("{{print \"a\"(.Value)}}".into(), 11, "separated by spaces"),
        ("{{print \"a\"\"b\"}}".into(), 11, "separated by spaces"),
        // Bad escapes (including escapes Go has but this subset does not).
        ("{{\"\\q\"}}".into(), 3, "unknown escape \\q"),
        ("{{\"\\a\"}}".into(), 3, "unknown escape \\a"),
        ("{{\"\\101\"}}".into(), 3, "unknown escape \\1"),
        ("{{\"\\U0001F600\"}}".into(), 3, "unknown escape \\U"),
        ("{{\"\\x4\"}}".into(), 3, "\\x needs exactly 2 hex digits"),
        ("{{\"\\xZZ\"}}".into(), 3, "\\x needs"),
        ("{{\"\\u12\"}}".into(), 3, "\\u needs exactly 4 hex digits"),
        ("{{\"\\u+123\"}}".into(), 3, "\\u needs"),
        ("{{\"\\uD800\"}}".into(), 3, "surrogate"),
        ("{{\"\\é\"}}".into(), 3, "unknown escape \\é"),
        ("{{\"a\nb\"}}".into(), 4, "newline in string"),
        ("{{`a\r\nb`}}".into(), 4, "carriage return"),
        // Other syntax Go has.
        ("{{1}}".into(), 2, "numbers"),
        ("{{print -1}}".into(), 8, "numbers"),
        ("{{'a'}}".into(), 2, "character constants"),
        ("{{\n.Value}}".into(), 2, "unexpected '\\n'"),
        ("{{{.Value}}".into(), 2, "unexpected '{'"),
        ("{{print é}}".into(), 8, "unexpected 'é'"),
        ("a {{.Value}} b {{".into(), 15, "unterminated action"),
        // Limits.
        (
            deep(MAX_NESTING + 1),
            8 + MAX_NESTING * 7,
            "nested deeper than 16",
        ),
        (
            "a".repeat(MAX_TEMPLATE_LEN + 1),
            MAX_TEMPLATE_LEN,
            "longer than 4096 bytes",
        ),
    ];
    for (source, position, needle) in &cases {
        let (at, problem) = rejection(source);
        assert_eq!(
            (at, problem.contains(needle)),
            (*position, true),
            "{source:?}: {at}: {problem}"
        );
    }
    // Just inside the limits is fine.
    assert!(Template::parse(&deep(MAX_NESTING)).is_ok());
    assert!(Template::parse(&"a".repeat(MAX_TEMPLATE_LEN)).is_ok());
}

// covers: E11
#[test]
fn errors_are_bad_input_and_say_where() {
    let err = Template::parse("Bearer {{.Token}}").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Secret);
    assert!(err.kind().is_bad_input());
    let message = err.to_string();
    assert!(message.contains("\"Bearer {{.Token}}\""), "{message}");
    assert!(message.contains("at byte 9"), "{message}");
}

// covers: E11
#[test]
fn every_byte_value_renders_without_panicking() {
    let value: Vec<u8> = (0..=255).collect();
    assert_eq!(render("{{.Value}}", &value), value);
    let basic = render(r#"Basic {{base64 (print "x-access-token:" .Value)}}"#, &value);
    let decoded = B64.decode(&basic[6..]).unwrap();
    assert_eq!(&decoded[15..], value.as_slice());
    // CR, LF and NUL pass through: header-value validity is the injector's check, not the template's.
    assert_eq!(render("Bearer {{.Value}}", b"a\r\nb\0"), b"Bearer a\r\nb\0");
    for byte in 0..=255u8 {
        fuzz_template_render::check(&[byte]);
        fuzz_template_render::check(&[byte; 100]);
    }
    fuzz_template_render::check(&value);
}

// covers: E11
#[test]
fn rendered_len_predicts_the_output() {
    let t = Template::parse(r#"Basic {{base64 (print "x-access-token:" .Value)}}"#).unwrap();
    for n in [0, 1, 2, 3, 40, 1000] {
        assert_eq!(t.rendered_len(n), t.render(&vec![b'a'; n]).len());
        assert_eq!(t.rendered_len(n), 6 + (15 + n).div_ceil(3) * 4);
    }
    assert_eq!(t.rendered_len(usize::MAX), usize::MAX, "saturates");
}

// covers: E11
#[test]
fn uses_value_display_and_from_str() {
    let t: Template = r#"Basic {{base64 (print "u:" .Value)}}"#.parse().unwrap();
    assert!(t.uses_value());
    assert_eq!(t.to_string(), r#"Basic {{base64 (print "u:" .Value)}}"#);
    assert_eq!(t.source(), t.to_string());
    assert!(!Template::parse("static").unwrap().uses_value());
    assert!(!Template::parse(r#"{{".Value"}}"#).unwrap().uses_value());
    assert_eq!(
        format!("{t:?}"),
        r#"Template("Basic {{base64 (print \"u:\" .Value)}}")"#
    );
}

// covers: E11
#[test]
fn serde_is_the_source_string_and_parses_on_deserialize() {
    let t = Template::parse("Bearer {{.Value}}").unwrap();
    let json = serde_json::to_string(&t).unwrap();
    assert_eq!(json, r#""Bearer {{.Value}}""#);
    assert_eq!(serde_json::from_str::<Template>(&json).unwrap(), t);
    let err = serde_json::from_str::<Template>(r#""Bearer {{.Token}}""#).unwrap_err();
    assert!(err.to_string().contains("invalid template"), "{err}");
    assert!(serde_json::from_str::<Template>("42").is_err());
}

// covers: E11
#[test]
fn preset_templates_parse_and_use_the_value() {
    for preset in Preset::ALL {
        for rule in preset.rules() {
            if let RuleKind::Header { template, .. } = &rule.kind {
                assert!(template.uses_value(), "{preset:?}: {template}");
                assert_eq!(Template::parse(template.source()).unwrap(), *template);
                let out = template.render(b"s3cret");
                assert!(!out.is_empty());
            }
        }
    }
}

/// Every file directly inside `fuzz/<kind>/<target>/`.
fn fuzz_inputs(kind: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(kind)
        .join(target);
    let Ok(entries) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut inputs: Vec<_> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .map(|p| (p.display().to_string(), fs::read(&p).unwrap()))
        .collect();
    inputs.sort();
    inputs
}

// covers: E11
#[test]
fn fuzz_regressions_and_seeds_replay() {
    let mut replayed = 0;
    for kind in ["regressions", "seeds"] {
        for (name, data) in fuzz_inputs(kind, "template_parse") {
            eprintln!("replaying {name}");
            fuzz_template_parse::check(&data);
            replayed += 1;
        }
        for (name, data) in fuzz_inputs(kind, "template_render") {
            eprintln!("replaying {name}");
            fuzz_template_render::check(&data);
            replayed += 1;
        }
    }
    assert!(replayed > 0, "no seeds found under fuzz/");
}
