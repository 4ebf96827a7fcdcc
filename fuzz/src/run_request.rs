//! `run_request`: arbitrary bytes as the request a `sandboxd run --request-stdin` reads from stdin
//! (`sandboxd::contract::request`, P1): the command, environment, working directory and timeout of a warm-pool
//! sandbox's first command.
//!
//! Reading never panics and never reads past the request (the header is at most `MAX_HEADER` bytes, the body
//! its announced length); an accepted request has a command, environment names without `=`, a positive
//! timeout, and encodes to bytes that read back as the same request.

use sandboxd::contract::request::{MAX_BODY, MAX_HEADER, Request};

/// Run every check on `data`; panics on a violated invariant.
pub fn check(data: &[u8]) {
    let mut input = data;
    let Ok(request) = Request::read_from(&mut input) else {
        return;
    };
    let consumed = data.len() - input.len();
    let header = data.iter().position(|&b| b == b'\n').map_or(0, |p| p + 1);
    assert!(header <= MAX_HEADER && consumed >= header && consumed - header <= MAX_BODY);
    assert!(!request.argv.is_empty(), "{request:?}");
    assert!(
        request
            .env
            .iter()
            .all(|(name, _)| !name.is_empty() && !name.contains(&b'=')),
        "{request:?}"
    );
    assert!(request.timeout_ms.is_none_or(|ms| ms > 0), "{request:?}");
    let encoded = request
        .encode()
        .unwrap_or_else(|e| panic!("an accepted request does not encode: {e}: {request:?}"));
    let again = Request::read_from(&mut encoded.as_slice()).unwrap_or_else(|e| panic!("{e}: {request:?}"));
    assert_eq!(again, request, "encode and read round-trip");
}
