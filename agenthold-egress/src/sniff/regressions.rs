//! Replays every committed fuzz input (`fuzz/regressions/<target>/`, named after what it caught) and every
//! seed (`fuzz/seeds/<target>/`) through the fuzz targets' own checks, so plain `cargo test` keeps what the
//! fuzzer found fixed; then runs the same checks as property tests on random and mutated inputs.

use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::invariants;

/// The files of `fuzz/<kind>/<target>/` (hidden files such as `.gitkeep` left out).
fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(kind)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file() && !path.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    files.sort();
    files
}

fn replay(target: &str, check: fn(&[u8])) {
    let seeds = inputs("seeds", target);
    assert!(!seeds.is_empty(), "no seeds in fuzz/seeds/{target}");
    for path in seeds.iter().chain(&inputs("regressions", target)) {
        let data = std::fs::read(path).unwrap();
        eprintln!("replaying {}", path.display());
        check(&data);
    }
}

// covers: E4
#[test]
fn client_hello_seeds_and_regressions() {
    replay("client_hello", invariants::client_hello);
}

// covers: E4
#[test]
fn http_head_seeds_and_regressions() {
    replay("http_head", invariants::http_head);
}

// covers: E23
#[test]
fn classify_seeds_and_regressions() {
    replay("classify", invariants::classify_first_bytes);
    // The strict parser's seeds and regressions are first bytes too.
    for target in ["http_head", "client_hello"] {
        for path in inputs("seeds", target)
            .iter()
            .chain(&inputs("regressions", target))
        {
            invariants::classify_first_bytes(&std::fs::read(path).unwrap());
        }
    }
}

// covers: E7
#[test]
fn connect_line_seeds_and_regressions() {
    replay("connect_line", invariants::connect_line);
}

const CURL_HELLO: &[u8] = include_bytes!("testdata/curl-7.88-openssl-3.0-h2-sni.bin");
const HEAD: &[u8] = b"GET http://a.example:8080/x HTTP/1.1\r\nHost: a.example:8080\r\nX: y\r\n\r\n";

/// `base` with some bytes overwritten: (position, value) pairs, positions taken modulo the length.
fn mutate(base: &[u8], edits: &[(usize, u8)]) -> Vec<u8> {
    let mut bytes = base.to_vec();
    for &(at, value) in edits {
        let len = bytes.len();
        bytes[at % len] = value;
    }
    bytes
}

proptest! {
    // covers: E4
    #[test]
    fn client_hello_properties_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        invariants::client_hello(&bytes);
    }

    // covers: E4
    #[test]
    fn client_hello_properties_on_mutated_hellos(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        let bytes = mutate(CURL_HELLO, &edits);
        invariants::client_hello(&bytes);
        invariants::client_hello(&bytes[..cut % (bytes.len() + 1)]);
    }

    // covers: E4
    #[test]
    fn http_head_properties_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        invariants::http_head(&bytes);
    }

    // covers: E4, E7
    #[test]
    fn http_head_properties_on_mutated_heads(
        edits in proptest::collection::vec((any::<usize>(), prop::sample::select(&b" \r\n\0\t:/@[]Hh.x"[..])), 1..4),
    ) {
        invariants::http_head(&mutate(HEAD, &edits));
    }

    // covers: E7
    #[test]
    fn connect_line_properties(authority in "[a-zA-Z0-9.:@\\[\\]_ -]{0,40}") {
        invariants::connect_line(authority.as_bytes());
    }
}
