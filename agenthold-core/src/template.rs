//! The header template language (E11): a strict subset of Go's `text/template`, just enough to build a
//! header value around a secret, e.g. `Basic {{base64 (print "x-access-token:" .Value)}}`.
//!
//! ```text
//! template = { text | action }
//! action   = "{{" [sp] command [sp] "}}"
//! command  = func { sp operand } | operand        ; base64 takes exactly one operand, print any number
//! operand  = ".Value" | string | raw | "(" [sp] command [sp] ")"
//! func     = "base64" | "print"
//! string   = '"' { char | \\ | \" | \n | \r | \t | \xHH | \uHHHH } '"'
//! raw      = "`" { any byte but "`" and CR } "`"
//! sp       = { " " | TAB }
//! ```
//!
//! Text outside actions is copied verbatim, including a lone `{`, a lone `}` and a stray `}}` (as in Go); a
//! literal `{{` is written `{{"{{"}}`. Everything else Go would accept (other functions and fields, pipes,
//! variables, trim markers, comments, numbers, control structures) is rejected at parse time with the byte
//! position of the problem, so an accepted template renders here exactly as under Go with a `base64`
//! function. Sources are limited to [`MAX_TEMPLATE_LEN`] bytes and [`MAX_NESTING`] levels of parentheses,
//! which bounds both the parser's and the renderer's recursion.
//!
//! A template is parsed once into a tree; [`Template::render`] walks it. The output holds the secret, so it
//! is built in one zeroizing buffer allocated at its exact final size ([`Template::rendered_len`]): it never
//! grows, so no reallocation leaves a copy of the secret behind. The one intermediate a `base64` call needs
//! is sized and zeroized the same way.
// enforces: E11

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use zeroize::Zeroizing;

use crate::error::Error;

/// Longest accepted template source, in bytes.
pub const MAX_TEMPLATE_LEN: usize = 4096;

/// Deepest accepted nesting of parentheses.
pub const MAX_NESTING: usize = 16;

/// A parsed template, rendered per request without re-parsing. `Display` and serde use the source text.
#[derive(Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Expr>,
}

/// A node of the tree. Text between actions is a [`Expr::Literal`] too.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    Value,
    Literal(Vec<u8>),
    Print(Vec<Expr>),
    Base64(Box<Expr>),
}

impl Expr {
    /// Exact rendered length for a value of `value_len` bytes (saturating: a length past `usize::MAX`
    /// cannot be rendered anyway).
    fn len(&self, value_len: usize) -> usize {
        match self {
            Self::Value => value_len,
            Self::Literal(bytes) => bytes.len(),
            Self::Print(args) => args.iter().fold(0, |n, a| n.saturating_add(a.len(value_len))),
            Self::Base64(arg) => arg.len(value_len).div_ceil(3).saturating_mul(4),
        }
    }

    fn uses_value(&self) -> bool {
        match self {
            Self::Value => true,
            Self::Literal(_) => false,
            Self::Print(args) => args.iter().any(Self::uses_value),
            Self::Base64(arg) => arg.uses_value(),
        }
    }

    /// Append the rendering to `out`, whose spare capacity is at least `self.len(value.len())`.
    fn render_into(&self, value: &[u8], out: &mut Vec<u8>) {
        match self {
            Self::Value => out.extend_from_slice(value),
            Self::Literal(bytes) => out.extend_from_slice(bytes),
            Self::Print(args) => {
                for arg in args {
                    arg.render_into(value, out);
                }
            }
            Self::Base64(arg) => {
                let mut inner = Zeroizing::new(Vec::with_capacity(arg.len(value.len())));
                arg.render_into(value, &mut inner);
                let start = out.len();
                out.resize(start.saturating_add(self.len(value.len())), 0);
                // Cannot fail: the slice has exactly the encoded length. Encoding straight into `out`
                // avoids a second, non-zeroized copy of the secret.
                let written = STANDARD
                    .encode_slice(inner.as_slice(), &mut out[start..])
                    .unwrap_or(0);
                out.truncate(start + written);
            }
        }
    }
}

impl Template {
    /// Parse `source`.
    ///
    /// # Errors
    /// [`Error::Template`] with the byte position of the problem: anything outside the grammar in the module
    /// documentation, a source longer than [`MAX_TEMPLATE_LEN`] or parentheses nested deeper than
    /// [`MAX_NESTING`].
    pub fn parse(source: &str) -> Result<Self, Error> {
        let parts = Parser { src: source, pos: 0 }
            .template()
            .map_err(|(position, problem)| Error::Template {
                template: source.to_owned(),
                position,
                problem,
            })?;
        Ok(Self {
            source: source.to_owned(),
            parts,
        })
    }

    /// The source text.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether `.Value` appears anywhere: a template without it sends a constant and never the secret.
    #[must_use]
    pub fn uses_value(&self) -> bool {
        self.parts.iter().any(Expr::uses_value)
    }

    /// The exact length of [`render`](Self::render)'s output for a value of `value_len` bytes, without
    /// rendering (useful to enforce a header size limit first). Saturates at `usize::MAX`.
    #[must_use]
    pub fn rendered_len(&self, value_len: usize) -> usize {
        self.parts
            .iter()
            .fold(0, |n, p| n.saturating_add(p.len(value_len)))
    }

    /// Render with `value` as `.Value`. Never fails and never panics, whatever the bytes of `value`; whether
    /// the result is a valid header value (no CR, LF or NUL) is checked by the caller.
    #[must_use]
    pub fn render(&self, value: &[u8]) -> Zeroizing<Vec<u8>> {
        let mut out = Zeroizing::new(Vec::with_capacity(self.rendered_len(value.len())));
        for part in &self.parts {
            part.render_into(value, &mut out);
        }
        out
    }
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Template").field(&self.source).finish()
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl FromStr for Template {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

impl serde::Serialize for Template {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

impl<'de> serde::Deserialize<'de> for Template {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A parse failure: byte position and problem.
type Problem = (usize, String);

/// What closes the command being parsed: the action opened at this position, or the `(` at this position.
#[derive(Clone, Copy)]
enum Closer {
    Action(usize),
    Paren(usize),
}

impl Closer {
    fn unterminated(self) -> Problem {
        match self {
            Self::Action(open) => (open, "unterminated action: missing '}}'".into()),
            Self::Paren(open) => (open, "unclosed '(': missing ')'".into()),
        }
    }
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.src[self.pos..]
    }

    fn peek(&self) -> Option<u8> {
        self.src.as_bytes().get(self.pos).copied()
    }

    fn skip_space(&mut self) -> bool {
        let start = self.pos;
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
        self.pos > start
    }

    /// At something that ends a command's argument list (the closer, or a rejected construct that the
    /// closer check reports).
    fn at_command_end(&self) -> bool {
        let rest = self.rest();
        rest.is_empty()
            || rest.starts_with("}}")
            || rest.starts_with(')')
            || rest.starts_with('|')
            || rest.starts_with("-}}")
    }

    fn ident(&mut self) -> &str {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            self.pos += 1;
        }
        &self.src[start..self.pos]
    }

    /// The problem with the unexpected input at the current position, `wanted` saying what would fit.
    fn unexpected(&self, closer: Closer, wanted: &str) -> Problem {
        let rest = self.rest();
        let pos = self.pos;
        match (rest.chars().next(), closer) {
            (None, _) => closer.unterminated(),
            (Some('}'), Closer::Paren(_)) if rest.starts_with("}}") => closer.unterminated(),
            (Some(')'), Closer::Action(_)) => (pos, "unexpected ')' without a matching '('".into()),
            (Some('|'), _) => (pos, "pipes ('|') are not supported".into()),
            (Some('$'), _) => (pos, "variables ('$') are not supported".into()),
            (Some('-'), _) if rest.starts_with("-}}") => (pos, TRIM.into()),
            (Some('/'), _) if rest.starts_with("/*") => (pos, "comments are not supported".into()),
            (Some('0'..='9' | '-' | '+' | '\''), _) => (
                pos,
                "numbers and character constants are not supported; use a string".into(),
            ),
            (Some(c), _) => (pos, format!("unexpected {c:?}; expected {wanted}")),
        }
    }

    fn template(mut self) -> Result<Vec<Expr>, Problem> {
        if self.src.len() > MAX_TEMPLATE_LEN {
            let mut at = MAX_TEMPLATE_LEN;
            while !self.src.is_char_boundary(at) {
                at -= 1;
            }
            return Err((at, format!("template longer than {MAX_TEMPLATE_LEN} bytes")));
        }
        let mut parts = Vec::new();
        while self.pos < self.src.len() {
            let text_len = self.rest().find("{{").unwrap_or(self.rest().len());
            if text_len > 0 {
                parts.push(Expr::Literal(self.rest().as_bytes()[..text_len].to_vec()));
                self.pos += text_len;
            } else {
                let open = self.pos;
                self.pos += 2;
                parts.push(self.action(open)?);
            }
        }
        Ok(parts)
    }

    fn action(&mut self, open: usize) -> Result<Expr, Problem> {
        let closer = Closer::Action(open);
        if self.peek() == Some(b'-') {
            return Err((self.pos, TRIM.into()));
        }
        let expr = self.command(0, closer)?;
        self.close(closer)?;
        Ok(expr)
    }

    /// `func args...` or a single operand, then optional spaces; the caller checks the closer.
    fn command(&mut self, depth: usize, closer: Closer) -> Result<Expr, Problem> {
        self.skip_space();
        let start = self.pos;
        match (closer, self.peek()) {
            (_, None) => return Err(closer.unterminated()),
            (Closer::Action(open), Some(b'}')) if self.rest().starts_with("}}") => {
                return Err((open, "empty action".into()));
            }
            (Closer::Paren(open), Some(b')')) => return Err((open, "empty parentheses".into())),
            _ => {}
        }
        if !self.peek().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_') {
            let operand = self.operand(depth, closer)?;
            self.skip_space();
            return Ok(operand);
        }
        let name = self.ident();
        let base64 = match name {
            "base64" => true,
            "print" => false,
            _ => return Err((start, unknown_function(name))),
        };
        let mut args = Vec::new();
        loop {
            let spaced = self.skip_space();
            if self.at_command_end() {
                break;
            }
            if !spaced {
                return Err((self.pos, "arguments must be separated by spaces".into()));
            }
            args.push(self.operand(depth, closer)?);
        }
        if !base64 {
            return Ok(Expr::Print(args));
        }
        match <[Expr; 1]>::try_from(args) {
            Ok([arg]) => Ok(Expr::Base64(Box::new(arg))),
            Err(args) => Err((
                start,
                format!("base64 takes exactly one argument, got {}", args.len()),
            )),
        }
    }

    fn operand(&mut self, depth: usize, closer: Closer) -> Result<Expr, Problem> {
        let start = self.pos;
        match self.peek() {
            Some(b'.') => {
                self.pos += 1;
                let field = self.ident().to_owned();
                match field.as_str() {
                    "Value" if self.peek() == Some(b'.') => {
                        Err((self.pos, "fields of .Value are not supported".into()))
                    }
                    "Value" => Ok(Expr::Value),
                    "" => Err((start, "'.' alone is not supported; the secret is .Value".into())),
                    other => Err((start, format!("unknown field .{other}; the only field is .Value"))),
                }
            }
            Some(b'"') => self.interpreted(),
            Some(b'`') => self.raw(),
            Some(b'(') => {
                if depth >= MAX_NESTING {
                    return Err((start, format!("parentheses nested deeper than {MAX_NESTING}")));
                }
                self.pos += 1;
                let paren = Closer::Paren(start);
                let expr = self.command(depth + 1, paren)?;
                self.close(paren)?;
                Ok(expr)
            }
            Some(b) if b.is_ascii_alphabetic() || b == b'_' => match self.ident() {
                name @ ("print" | "base64") => Err((
                    start,
                    format!("a call used as an argument must be parenthesised: ({name} ...)"),
                )),
                name => Err((start, unknown_function(name))),
            },
            _ => Err(self.unexpected(closer, "an argument (.Value, a string or a parenthesised call)")),
        }
    }

    fn close(&mut self, closer: Closer) -> Result<(), Problem> {
        match closer {
            Closer::Action(_) if self.rest().starts_with("}}") => self.pos += 2,
            Closer::Paren(_) if self.peek() == Some(b')') => self.pos += 1,
            Closer::Action(_) => return Err(self.unexpected(closer, "'}}'")),
            Closer::Paren(_) => return Err(self.unexpected(closer, "')'")),
        }
        Ok(())
    }

    /// A Go interpreted string literal, restricted to the escapes `\\ \" \n \r \t \xHH \uHHHH`.
    fn interpreted(&mut self) -> Result<Expr, Problem> {
        let open = self.pos;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            let Some(c) = self.rest().chars().next() else {
                return Err((open, "unterminated string: missing '\"'".into()));
            };
            match c {
                '"' => {
                    self.pos += 1;
                    return Ok(Expr::Literal(out));
                }
                '\n' => return Err((self.pos, "newline in string".into())),
                '\\' => self.escape(&mut out, open)?,
                c => {
                    let mut buf = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    self.pos += c.len_utf8();
                }
            }
        }
    }

    fn escape(&mut self, out: &mut Vec<u8>, open: usize) -> Result<(), Problem> {
        let at = self.pos;
        self.pos += 1;
        let simple = match self.peek() {
            None => return Err((open, "unterminated string: missing '\"'".into())),
            Some(b'\\') => Some(b'\\'),
            Some(b'"') => Some(b'"'),
            Some(b'n') => Some(b'\n'),
            Some(b'r') => Some(b'\r'),
            Some(b't') => Some(b'\t'),
            Some(b'x' | b'u') => None,
            Some(_) => {
                let c = self.rest().chars().next().unwrap_or('\\');
                return Err((
                    at,
                    format!("unknown escape \\{c}; allowed: \\\\ \\\" \\n \\r \\t \\xHH \\uHHHH"),
                ));
            }
        };
        if let Some(byte) = simple {
            out.push(byte);
            self.pos += 1;
            return Ok(());
        }
        let (digits, what) = if self.peek() == Some(b'x') {
            (2, "\\x")
        } else {
            (4, "\\u")
        };
        let hex = self
            .src
            .get(self.pos + 1..self.pos + 1 + digits)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        let code = hex.and_then(|h| u32::from_str_radix(h, 16).ok());
        let Some(code) = code else {
            return Err((at, format!("{what} needs exactly {digits} hex digits")));
        };
        if digits == 2 {
            // `\xHH` is a byte, not a character, as in Go.
            out.push(u8::try_from(code).unwrap_or(0));
        } else {
            let Some(c) = char::from_u32(code) else {
                return Err((at, format!("\\u{code:04X} is a surrogate, not a character")));
            };
            let mut buf = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
        self.pos += 1 + digits;
        Ok(())
    }

    /// A raw string in backquotes. Go drops carriage returns from raw strings; rejecting them keeps the
    /// rendering identical.
    fn raw(&mut self) -> Result<Expr, Problem> {
        let open = self.pos;
        let Some(len) = self.src[open + 1..].find('`') else {
            return Err((open, "unterminated raw string: missing '`'".into()));
        };
        let body = &self.src[open + 1..open + 1 + len];
        if let Some(cr) = body.find('\r') {
            return Err((open + 1 + cr, "carriage return in raw string".into()));
        }
        self.pos = open + 2 + len;
        Ok(Expr::Literal(body.as_bytes().to_vec()))
    }
}

const TRIM: &str = "trim markers ('{{-', '-}}') are not supported";

fn unknown_function(name: &str) -> String {
    format!("unknown function or keyword {name:?}; the functions are base64 and print")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(s: &str) -> Vec<Expr> {
        Template::parse(s).unwrap_or_else(|e| panic!("{s}: {e}")).parts
    }

    fn lit(s: &str) -> Expr {
        Expr::Literal(s.as_bytes().to_vec())
    }

    fn problem(s: &str) -> (usize, String) {
        match Template::parse(s) {
            Err(Error::Template {
                position, problem, ..
            }) => (position, problem),
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn builds_the_tree() {
        assert_eq!(parts("Bearer {{.Value}}"), [lit("Bearer "), Expr::Value]);
        assert_eq!(
            parts(r#"Basic {{base64 (print "x-access-token:" .Value)}}"#),
            [
                lit("Basic "),
                Expr::Base64(Box::new(Expr::Print(vec![lit("x-access-token:"), Expr::Value])))
            ]
        );
        assert_eq!(parts("{{ print }}"), [Expr::Print(vec![])]);
        assert_eq!(parts("{{\t( .Value )\t}}"), [Expr::Value]);
        assert_eq!(parts("{{`a\"b`}}"), [lit("a\"b")]);
        assert_eq!(parts(""), []);
    }

    #[test]
    fn text_braces_are_literal() {
        assert_eq!(parts("a { b } c }} d"), [lit("a { b } c }} d")]);
        assert_eq!(parts("{{.Value}}}"), [Expr::Value, lit("}")]);
        assert_eq!(parts(r#"{{"{{"}}"#), [lit("{{")]);
        assert_eq!(
            parts(r#"{{print "}}" `)`}}"#),
            [Expr::Print(vec![lit("}}"), lit(")")])]
        );
    }

    #[test]
    fn decodes_escapes() {
        assert_eq!(
            parts(r#"{{"\\\"\n\r\t\x41\xff\u00e9\u20AC"}}"#),
            [Expr::Literal(b"\\\"\n\r\tA\xff\xc3\xa9\xe2\x82\xac".to_vec())]
        );
    }

    #[test]
    fn positions_point_at_the_problem() {
        assert_eq!(problem("ab{{.Value").0, 2);
        assert_eq!(problem(r#"{{print "x" .Other}}"#).0, 12);
        assert_eq!(problem(r#"{{print "a\q"}}"#).0, 10);
        assert_eq!(problem("{{base64 .Value .Value}}").0, 2);
        assert_eq!(
            problem("{{print(.Value)}}"),
            (7, "arguments must be separated by spaces".into())
        );
        assert_eq!(problem("{{print print}}").0, 8);
    }

    #[test]
    fn length_limit_cuts_on_a_character_boundary() {
        let src = format!("{}é", "a".repeat(MAX_TEMPLATE_LEN - 1));
        assert_eq!(problem(&src).0, MAX_TEMPLATE_LEN - 1);
        assert!(Template::parse(&"a".repeat(MAX_TEMPLATE_LEN)).is_ok());
    }

    #[test]
    fn rendered_len_is_exact_and_the_buffer_never_grows() {
        let t = Template::parse(r#"x{{base64 (print "ab" (base64 .Value) .Value)}}{{.Value}}"#).unwrap();
        for n in 0..40 {
            let value = vec![b'v'; n];
            let out = t.render(&value);
            assert_eq!(out.len(), t.rendered_len(n));
            assert_eq!(out.capacity(), t.rendered_len(n), "the output was reallocated");
        }
    }

    #[test]
    fn uses_value() {
        assert!(
            Template::parse("{{base64 (print (.Value))}}")
                .unwrap()
                .uses_value()
        );
        assert!(!Template::parse(r#"Bearer {{print "x"}}"#).unwrap().uses_value());
    }
}
