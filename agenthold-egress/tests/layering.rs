//! The crate's modules import each other one way only: no import loop between the top-level modules of
//! `src/` (issue 10), so that a connection's path runs down the layers (explicit → flow → http or intercept
//! → upstream) and never calls back up, and `gateway` only wires what lies below it.
//!
//! The check reads the sources: every `crate::…` and `super::…` path (in `use` lines and inline), comments
//! and literals left out, resolved to the top-level module it names (`crate::Error` through the re-exports
//! of `lib.rs`). A path it cannot resolve fails the test, so the parser cannot silently miss an edge.

// A test reading this crate's own sources: a missing file is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Edges allowed although they close a loop, each with the reason. None today: keep it that way.
const ALLOWED_LOOPS: &[(&str, &str, &str)] = &[];

/// Modules below `gateway` that must never name it (it builds and wires them).
const WIRED_BY_GATEWAY: &[&str] = &[
    "accept",
    "context",
    "explicit",
    "flow",
    "http",
    "inject",
    "intercept",
    "open",
    "refresh",
    "reply",
    "scrub",
    "target",
    "transparent",
    "upstream",
];

// covers: issue 10 (no import loop in agenthold-egress; gateway only wires)
#[test]
fn modules_import_each_other_one_way() {
    let graph = Graph::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));

    // The parser sees the wiring at all (a parser that finds nothing would pass the rest vacuously).
    for (from, to) in [
        ("gateway", "transparent"),
        ("gateway", "explicit"),
        ("explicit", "flow"),
        ("flow", "http"),
        ("flow", "intercept"),
        ("intercept", "http"),
        ("http", "upstream"),
        ("dns", "error"),
    ] {
        assert!(
            graph.has(from, to),
            "expected {from} → {to}; edges: {:#?}",
            graph.edges
        );
    }

    let loops = graph.loops();
    assert!(
        loops.is_empty(),
        "import loops between modules of agenthold-egress (each listed as a path back to its start):\n{}",
        loops.iter().map(|l| l.join(" → ")).collect::<Vec<_>>().join("\n")
    );

    for module in WIRED_BY_GATEWAY {
        assert!(
            !graph.has(module, "gateway"),
            "{module} imports gateway, which only wires the modules below it (use the context module)"
        );
    }
}

#[test]
fn the_parser_resolves_paths_and_ignores_comments_and_literals() {
    let code = r####"
        //! doc crate::doc_only
        use crate::a::{B, c::D};
        use crate::{Error, b};
        use super::sibling::X;
        /* block crate::in_block /* nested crate::nested */ */
        let s = "crate::in_string";
        let r = r#"crate::in_raw " still raw"#;
        let c = '"';
        fn f<'a>(x: &'a str) -> crate::c::T { crate::d::call() }
        mod tests {
            use super::*;
            use super::super::super::e::Y;
        }
    "####;
    let aliases = BTreeMap::from([("Error".to_owned(), "error".to_owned())]);
    let modules: BTreeSet<String> = ["a", "b", "c", "d", "e", "error", "here", "doc_only", "in_block"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let found = imports(code, &["here".to_owned(), "inner".to_owned()], &modules, &aliases);
    let expected: BTreeSet<String> = ["a", "b", "c", "d", "e", "error", "here"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(found, expected);
}

/// Top-level modules and the modules each one names.
struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    fn read(src: &Path) -> Self {
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        let modules = declared_modules(&lib);
        let aliases = root_reexports(&lib);
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in rust_files(src) {
            let relative = file.strip_prefix(src).unwrap();
            if relative == Path::new("lib.rs") {
                continue;
            }
            let path = module_path(relative);
            let top = path[0].clone();
            let code = std::fs::read_to_string(&file).unwrap();
            let found = imports(&code, &path, &modules, &aliases);
            let out = edges.entry(top.clone()).or_default();
            out.extend(found.into_iter().filter(|m| *m != top));
        }
        Self { edges }
    }

    fn has(&self, from: &str, to: &str) -> bool {
        self.edges.get(from).is_some_and(|t| t.contains(to))
    }

    /// One loop per strongly connected group of modules (ignoring the allowed edges).
    fn loops(&self) -> Vec<Vec<String>> {
        let allowed = |from: &str, to: &str| ALLOWED_LOOPS.iter().any(|(f, t, _)| *f == from && *t == to);
        let next = |m: &str| -> Vec<String> {
            self.edges
                .get(m)
                .into_iter()
                .flatten()
                .filter(|t| !allowed(m, t))
                .cloned()
                .collect()
        };
        let mut loops = Vec::new();
        let mut reported: BTreeSet<String> = BTreeSet::new();
        for start in self.edges.keys() {
            if reported.contains(start) {
                continue;
            }
            // Shortest path from `start` back to itself, breadth first.
            let mut came_from: BTreeMap<String, String> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start.clone()]);
            let mut closed = None;
            while let Some(m) = queue.pop_front() {
                for t in next(&m) {
                    if t == *start {
                        closed = Some(m.clone());
                        break;
                    }
                    if !came_from.contains_key(&t) {
                        came_from.insert(t.clone(), m.clone());
                        queue.push_back(t);
                    }
                }
                if closed.is_some() {
                    break;
                }
            }
            let Some(mut last) = closed else { continue };
            let mut path = vec![start.clone()];
            while last != *start {
                path.push(last.clone());
                last = came_from[&last].clone();
            }
            path.push(start.clone());
            let end = path.len() - 1;
            path[1..end].reverse();
            reported.extend(path.iter().cloned());
            loops.push(path);
        }
        loops
    }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The module path of a file below `src/` (`dns/answer.rs` → `dns::answer`, `dns/mod.rs` → `dns`).
fn module_path(relative: &Path) -> Vec<String> {
    let mut path: Vec<String> = relative
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    path
}

/// `mod x;` and `pub mod x;` at the top of `lib.rs`.
fn declared_modules(lib: &str) -> BTreeSet<String> {
    let tokens = tokens(&strip(lib));
    tokens
        .windows(3)
        .filter(|w| w[0] == "mod" && w[2] == ";")
        .map(|w| w[1].clone())
        .collect()
}

/// Names `lib.rs` re-exports at the root (`pub use gateway::{Gateway, …}` → `Gateway` is in `gateway`).
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let tokens = tokens(&strip(lib));
    let mut aliases = BTreeMap::new();
    let mut i = 0;
    while i + 2 < tokens.len() {
        if tokens[i] == "pub" && tokens[i + 1] == "use" {
            let module = tokens[i + 2].clone();
            let mut j = i + 3;
            while j < tokens.len() && tokens[j] != ";" {
                let t = &tokens[j];
                if is_ident(t) && tokens[j - 1] != "as" && tokens.get(j + 1).is_none_or(|n| n != "::") {
                    aliases.insert(t.clone(), module.clone());
                }
                j += 1;
            }
            i = j;
        }
        i += 1;
    }
    aliases
}

/// The top-level modules `code` (the file of module `path`) names through `crate::` and `super::` paths.
fn imports(
    code: &str,
    path: &[String],
    modules: &BTreeSet<String>,
    aliases: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let tokens = tokens(&strip(code));
    let mut found = BTreeSet::new();
    // Inline modules (`mod tests { … }`) open below the file's own path.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        match t {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                while inline.last().is_some_and(|(_, d)| *d > depth) {
                    inline.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|b| b == "{") => {
                inline.push((tokens[i + 1].clone(), depth + 1));
            }
            "crate" | "super"
                if tokens.get(i + 1).is_some_and(|c| c == "::") && !follows_dollar(&tokens, i) =>
            {
                let mut base: Vec<String> = Vec::new();
                let mut j = i;
                if t == "super" {
                    base = path.to_vec();
                    base.extend(inline.iter().map(|(m, _)| m.clone()));
                    while tokens.get(j).is_some_and(|s| s == "super")
                        && tokens.get(j + 1).is_some_and(|c| c == "::")
                    {
                        assert!(!base.is_empty(), "super:: above the crate root in {path:?}");
                        base.pop();
                        j += 2;
                    }
                } else {
                    j += 2;
                }
                for first in first_segments(&tokens, j) {
                    let top = if let Some(top) = base.first() {
                        Some(top.clone())
                    } else if modules.contains(&first) {
                        Some(first.clone())
                    } else {
                        aliases.get(&first).cloned()
                    };
                    match top {
                        Some(top) => {
                            found.insert(top);
                        }
                        // `use super::*` in a file directly below the root, and `self` in a group.
                        None if first == "*" || first == "self" => {}
                        None => panic!("{path:?}: cannot resolve `{t}::{first}`"),
                    }
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

fn follows_dollar(tokens: &[String], i: usize) -> bool {
    i > 0 && tokens[i - 1] == "$"
}

/// The first segment of the path that starts at `tokens[at]`: one name, or each item's first name of a
/// `{…}` group.
fn first_segments(tokens: &[String], at: usize) -> Vec<String> {
    match tokens.get(at).map(String::as_str) {
        Some("{") => {
            let mut out = Vec::new();
            let mut depth = 0;
            let mut expect = true;
            for t in &tokens[at..] {
                match t.as_str() {
                    "{" => {
                        depth += 1;
                        if depth > 1 {
                            expect = false;
                        }
                    }
                    "}" => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    "," if depth == 1 => expect = true,
                    _ if expect && depth == 1 => {
                        out.push(t.clone());
                        expect = false;
                    }
                    _ => {}
                }
            }
            out
        }
        Some(name) => vec![name.to_owned()],
        None => Vec::new(),
    }
}

fn is_ident(t: &str) -> bool {
    t.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Identifiers, `::`, and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            i += 2;
            continue;
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
        i += 1;
    }
    out
}

/// `code` with comments, strings and character literals blanked out.
fn strip(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
            continue;
        }
        // Raw strings: r"…", r#"…"#, br"…" (the `r` starts a word, or follows a word-starting `b`).
        let word_start =
            i == 0 || !ident(chars[i - 1]) || (chars[i - 1] == 'b' && (i == 1 || !ident(chars[i - 2])));
        if c == 'r' && word_start {
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                j += 1;
            }
            if chars.get(j) == Some(&'"') {
                let hashes = j - i - 1;
                j += 1;
                loop {
                    if j >= chars.len() {
                        break;
                    }
                    if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                out.push_str(" \"\" ");
                i = j;
                continue;
            }
        }
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str(" \"\" ");
            continue;
        }
        if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'); otherwise a lifetime, kept.
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str(" ' ");
                continue;
            }
            if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str(" ' ");
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}
