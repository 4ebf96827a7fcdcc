//! Request heads: the forms of the target, the Host rules, the line rules and the limits.

use super::*;

fn done(bytes: &[u8]) -> RequestHead {
    match parse_request_head(bytes) {
        Sniff::Done(head) => head,
        other => panic!(
            "{:?}: expected a head, got {other:?}",
            String::from_utf8_lossy(bytes)
        ),
    }
}

fn invalid(bytes: &[u8]) -> &'static str {
    match parse_request_head(bytes) {
        Sniff::Invalid(problem) => problem,
        other => panic!(
            "{:?}: expected Invalid, got {other:?}",
            String::from_utf8_lossy(bytes)
        ),
    }
}

/// Every strict prefix either needs more or already gives the same answer as the whole.
fn assert_prefixes_agree(bytes: &[u8]) {
    let whole = parse_request_head(bytes);
    for cut in 0..bytes.len() {
        let got = parse_request_head(&bytes[..cut]);
        assert!(
            got == Sniff::NeedMore || got == whole,
            "prefix of {cut}: {got:?}, whole: {whole:?}"
        );
    }
}

fn dest(host: &str, port: u16) -> Option<(String, u16)> {
    Some((host.to_owned(), port))
}

// covers: E4
#[test]
fn origin_form_with_host() {
    let bytes = b"GET /v1/models?x=1 HTTP/1.1\r\nHost: API.example.com\r\nAccept: */*\r\n\r\nBODY";
    let head = done(bytes);
    assert_eq!(head.method, "GET");
    assert_eq!(head.target, "/v1/models?x=1");
    assert_eq!(head.form, TargetForm::Origin);
    assert_eq!(head.version, 1);
    assert_eq!(head.host.as_deref(), Some("API.example.com"));
    assert_eq!(head.head_len, bytes.len() - 4);
    assert_eq!(head.destination(80), dest("API.example.com", 80));
    assert_eq!(head.host_port(8080), dest("API.example.com", 8080));
    assert_eq!(head.target_host_port(), None);
    assert_eq!(head.path_and_query().as_deref(), Some("/v1/models?x=1"));
    assert_prefixes_agree(bytes);
    for cut in 0..head.head_len {
        assert_eq!(parse_request_head(&bytes[..cut]), Sniff::NeedMore);
    }
    let head = done(b"POST /x HTTP/1.0\r\nhost:\t example.com:8080 \t\r\n\r\n");
    assert_eq!((head.version, head.host_port(80)), (0, dest("example.com", 8080)));
    // A pipelined second request is not read.
    let two = b"GET /a HTTP/1.1\r\nHost: a.example\r\n\r\nGET /b HTTP/1.1\r\nHost: b.example\r\n\r\n";
    assert_eq!(done(two).head_len, 36);
    assert_eq!(done(&two[36..]).host.as_deref(), Some("b.example"));
}

// covers: E4, E7
#[test]
fn absolute_form_through_the_explicit_proxy() {
    let head = done(b"GET http://h.example:8080/x?q HTTP/1.1\r\nHost: H.example:8080\r\n\r\n");
    assert_eq!(head.form, TargetForm::Absolute);
    assert_eq!(head.destination(80), dest("h.example", 8080));
    assert_eq!(head.target_host_port(), dest("h.example", 8080));
    assert_eq!(head.path_and_query().as_deref(), Some("/x?q"));
    let head = done(b"GET HTTPS://h.example HTTP/1.1\r\n\r\n");
    assert_eq!(
        (head.destination(80), head.path_and_query().as_deref()),
        (dest("h.example", 443), Some("/"))
    );
    let head = done(b"GET http://h.example?q=1 HTTP/1.1\r\nHost: h.example:80\r\n\r\n");
    assert_eq!(
        (head.destination(1), head.path_and_query().as_deref()),
        (dest("h.example", 80), Some("/?q=1"))
    );
    let head = done(b"GET http://[2001:db8::1]:81/ HTTP/1.1\r\nHost: [2001:db8::1]:81\r\n\r\n");
    assert_eq!(head.destination(80), dest("2001:db8::1", 81));

    let disagree = "Host header disagrees with the absolute-form target";
    assert_eq!(
        invalid(b"GET http://allowed.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n"),
        disagree
    );
    assert_eq!(
        invalid(b"GET http://h.example:8080/ HTTP/1.1\r\nHost: h.example\r\n\r\n"),
        disagree
    );
    assert_eq!(
        invalid(b"GET http://h.example/ HTTP/1.1\r\nHost: h.example:8080\r\n\r\n"),
        disagree
    );
    assert_eq!(
        invalid(b"GET https://h.example/ HTTP/1.1\r\nHost: h.example:80\r\n\r\n"),
        disagree
    );
    assert_eq!(
        invalid(b"GET ftp://h.example/ HTTP/1.1\r\n\r\n"),
        "absolute-form target with a scheme other than http or https"
    );
    assert_eq!(
        invalid(b"GET h.example:80 HTTP/1.1\r\nHost: h.example\r\n\r\n"),
        "request target is neither origin-form nor absolute-form"
    );
    assert!(invalid(b"GET http://user@h.example/ HTTP/1.1\r\n\r\n").contains("userinfo"));
    assert!(invalid(b"GET http://evil.example@allowed.example/ HTTP/1.1\r\n\r\n").contains("userinfo"));
    assert_eq!(
        invalid(b"GET http:///x HTTP/1.1\r\nHost: h\r\n\r\n"),
        "empty authority"
    );
}

// covers: E7
#[test]
fn connect_targets() {
    let head = done(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n");
    assert_eq!(head.form, TargetForm::Authority);
    assert_eq!(head.destination(80), dest("api.example.com", 443));
    assert_eq!(head.path_and_query(), None);
    let head = done(b"CONNECT [2001:db8::2]:8443 HTTP/1.1\r\nHost: [2001:DB8::2]:8443\r\n\r\n");
    assert_eq!(head.destination(80), dest("2001:db8::2", 8443));
    assert_eq!(
        done(b"CONNECT a.example:22 HTTP/1.0\r\n\r\n").destination(80),
        dest("a.example", 22)
    );
    assert_eq!(
        done(b"CONNECT a.example:22 HTTP/1.1\r\nHost: A.example\r\n\r\n")
            .host
            .as_deref(),
        Some("A.example")
    );

    assert_eq!(
        invalid(b"CONNECT a.example HTTP/1.1\r\n\r\n"),
        "CONNECT target without a port"
    );
    assert_eq!(
        invalid(b"CONNECT a.example:443 HTTP/1.1\r\nHost: b.example:443\r\n\r\n"),
        "Host header disagrees with the CONNECT target"
    );
    assert_eq!(
        invalid(b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:22\r\n\r\n"),
        "Host header disagrees with the CONNECT target"
    );
    assert!(invalid(b"CONNECT user@a.example:443 HTTP/1.1\r\n\r\n").contains("userinfo"));
    assert!(invalid(b"CONNECT a.example:0 HTTP/1.1\r\n\r\n").contains("port"));
    assert!(invalid(b"CONNECT a.example:65536 HTTP/1.1\r\n\r\n").contains("port"));
    assert!(invalid(b"CONNECT 2001:db8::1:443 HTTP/1.1\r\n\r\n").contains("brackets"));
    assert!(matches!(
        parse_request_head(b"CONNECT http://a.example:443/ HTTP/1.1\r\n\r\n"),
        Sniff::Invalid(_)
    ));
}

// covers: E4, E5
#[test]
fn host_header_rules() {
    assert_eq!(
        invalid(b"GET / HTTP/1.1\r\n\r\n"),
        "request without a Host header"
    );
    assert_eq!(
        invalid(b"GET / HTTP/1.0\r\n\r\n"),
        "request without a Host header"
    );
    assert_eq!(
        invalid(b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n\r\n"),
        "several Host headers"
    );
    assert_eq!(
        invalid(b"GET / HTTP/1.1\r\nHost: a.example\r\nhOST: b.example\r\n\r\n"),
        "several Host headers"
    );
    assert_eq!(invalid(b"GET / HTTP/1.1\r\nHost:\r\n\r\n"), "empty authority");
    assert!(invalid(b"GET / HTTP/1.1\r\nHost: a.example, b.example\r\n\r\n").contains("character"));
    assert!(invalid(b"GET / HTTP/1.1\r\nHost: evil@a.example\r\n\r\n").contains("userinfo"));
    assert!(invalid("GET / HTTP/1.1\r\nHost: bücher.example\r\n\r\n".as_bytes()).contains("character"));
    assert!(invalid(b"GET / HTTP/1.1\r\nHost: \xff\r\n\r\n").contains("ASCII"));
    // A space before the colon would let another parser see a different header name.
    assert_eq!(
        invalid(b"GET / HTTP/1.1\r\nHost : evil.example\r\nHost: a.example\r\n\r\n"),
        "invalid header name"
    );
    assert_eq!(
        done(b"OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n").form,
        TargetForm::Asterisk
    );
    assert_eq!(
        invalid(b"GET * HTTP/1.1\r\nHost: a.example\r\n\r\n"),
        "asterisk-form target with a method other than OPTIONS"
    );
}

// covers: E4
#[test]
fn line_rules() {
    let cases: &[(&[u8], &str)] = &[
        (
            b"GET / HTTP/1.1\r\nHost: a.example\r\nX: 1\r\n continued\r\n\r\n",
            "header line folded (obs-fold) or starting with whitespace",
        ),
        (
            b"GET / HTTP/1.1\r\n\tHost: a.example\r\n\r\n",
            "header line folded (obs-fold) or starting with whitespace",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a.example\rX: y\r\n\r\n",
            "CR not followed by LF in request head",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a.example\nHost: evil.example\r\n\r\n",
            "LF without CR in request head",
        ),
        (
            b"GET / HTTP/1.1\nHost: a.example\n\n",
            "LF without CR in request head",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a.example\r\nX: \0\r\n\r\n",
            "NUL byte in request head",
        ),
        (
            b"GET /\0 HTTP/1.1\r\nHost: a.example\r\n\r\n",
            "NUL byte in request head",
        ),
        (
            b"GET / HTTP/1.2\r\nHost: a.example\r\n\r\n",
            "not HTTP/1.0 or HTTP/1.1",
        ),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "not HTTP/1.0 or HTTP/1.1"),
        (
            b"GET /#frag HTTP/1.1\r\nHost: a.example\r\n\r\n",
            "fragment in request target",
        ),
        (
            "GET /é HTTP/1.1\r\nHost: a.example\r\n\r\n".as_bytes(),
            "non-ASCII byte in request target",
        ),
    ];
    for (bytes, problem) in cases {
        assert_eq!(invalid(bytes), *problem, "{:?}", String::from_utf8_lossy(bytes));
        assert_prefixes_agree(bytes);
    }
    // Refused at the bad byte, before the head is complete.
    assert_eq!(
        invalid(b"GET / HTTP/1.1\r\nX: a\rb"),
        "CR not followed by LF in request head"
    );
    assert_eq!(invalid(b"GET / HTTP/1.1\nX"), "LF without CR in request head");
    assert_eq!(parse_request_head(b"GET / HTTP/1.1\r\nX: a\r"), Sniff::NeedMore);
    assert_eq!(parse_request_head(b"GET / HTTP/1.1\r\nX: a\r\n"), Sniff::NeedMore);
}

// covers: E23
#[test]
fn what_the_strict_parser_calls_not_http_the_classifier_still_calls_http() {
    // The strict parser's `NotThisProtocol` no longer routes a connection: `classify` does, and every one
    // of these reads as a request to some lenient server, so it is refused, never spliced as other TCP.
    for bytes in [
        &b"get / HTTP/1.1\r\n"[..],
        b" GET / HTTP/1.1\r\n",
        b"GET  / HTTP/1.1\r\n",
        b"GET / http/1.1\r\n",
        b"GET /a\rb HTTP/1.1\r\n",
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZ / HTTP/1.1\r\n",
    ] {
        assert_eq!(
            crate::sniff::classify(bytes),
            crate::sniff::Protocol::Http,
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
        assert!(!matches!(parse_request_head(bytes), Sniff::Done(_)));
    }
}

// covers: E4
#[test]
fn not_http_is_recognised_from_the_first_bytes() {
    let cases: &[&[u8]] = &[
        b"\x16\x03\x01\x02\x00",
        b"get / HTTP/1.1\r\n",
        b" GET / HTTP/1.1\r\n",
        b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n",
        b"G\0",
        b"GET\r\n",
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZ / HTTP/1.1\r\n",
        b"\x80\x2e\x01\x03\x01",
        b"NICK agent\r\n",
        b"CAP LS 302\r\n",
        b"SET key value\r\n",
        b"GET /a\rb HTTP/1.1\r\n",
        b"GET /a\nb HTTP/1.1\r\n",
        b"GET  / HTTP/1.1\r\n",
        b"GET / http/1.1\r\n",
        b"GET / HTTPS",
        b"GET / H2",
    ];
    for bytes in cases {
        assert_eq!(
            parse_request_head(bytes),
            Sniff::NotThisProtocol,
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert_eq!(parse_request_head(b""), Sniff::NeedMore);
    // Empty lines before the request line are skipped, as hyper skips them.
    assert_eq!(parse_request_head(b"\r\n"), Sniff::NeedMore);
    assert_eq!(parse_request_head(b"\r\n\r"), Sniff::NeedMore);
    let Sniff::Done(head) = parse_request_head(b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n") else {
        panic!("leading empty lines")
    };
    assert_eq!((head.host.as_deref(), head.head_len), (Some("a"), 4 + 27));
    assert!(matches!(
        parse_request_head(&b"\r\n".repeat(20)),
        Sniff::Invalid(_)
    ));
    assert_eq!(parse_request_head(b"CONNEC"), Sniff::NeedMore);
    assert_eq!(parse_request_head(b"GET /x HTTP"), Sniff::NeedMore);
    assert_eq!(parse_request_head(b"GET /x "), Sniff::NeedMore);
    assert_eq!(parse_request_head(b"M-SEARCH"), Sniff::NeedMore);
    assert_eq!(parse_request_head(b"ABCDEFGHIJKLMNOPQRSTUVWX"), Sniff::NeedMore);
    assert_eq!(
        parse_request_head(b"ABCDEFGHIJKLMNOPQRSTUVWXY"),
        Sniff::NotThisProtocol
    );
    assert_eq!(
        done(b"ABCDEFGHIJKLMNOPQRSTUVWX / HTTP/1.1\r\nHost: a\r\n\r\n")
            .method
            .len(),
        MAX_METHOD_LEN
    );
}

// covers: E4
#[test]
fn limits() {
    let with_headers = |count: usize| {
        let mut head = b"GET / HTTP/1.1\r\nHost: a.example\r\n".to_vec();
        for i in 1..count {
            head.extend(format!("X-{i}: v\r\n").as_bytes());
        }
        head.extend(b"\r\n");
        head
    };
    assert!(matches!(
        parse_request_head(&with_headers(MAX_HEADERS)),
        Sniff::Done(_)
    ));
    assert_eq!(invalid(&with_headers(MAX_HEADERS + 1)), "more than 100 headers");

    // A head of exactly 64 KiB is accepted; one byte more is refused, also before its end arrives.
    let sized = |len: usize| {
        let mut head = b"GET / HTTP/1.1\r\nHost: a.example\r\nX: ".to_vec();
        let fill = len - head.len() - 4;
        head.extend(std::iter::repeat_n(b'v', fill));
        head.extend(b"\r\n\r\n");
        head
    };
    let max = sized(MAX_HEAD_LEN);
    assert_eq!(done(&max).head_len, MAX_HEAD_LEN);
    assert_eq!(
        invalid(&sized(MAX_HEAD_LEN + 1)),
        "request head longer than 64 KiB"
    );
    assert_eq!(
        invalid(&max[..MAX_HEAD_LEN - 4].repeat(2)),
        "request head longer than 64 KiB"
    );
    assert_eq!(parse_request_head(&max[..MAX_HEAD_LEN - 1]), Sniff::NeedMore);

    // The request line is capped at 8 KiB, checked as it arrives.
    let line = |target_len: usize| {
        let mut head = b"GET /".to_vec();
        head.extend(std::iter::repeat_n(b'a', target_len - 1));
        head.extend(b" HTTP/1.1\r\nHost: a.example\r\n\r\n");
        head
    };
    let longest = MAX_REQUEST_LINE - "GET  HTTP/1.1".len();
    assert!(matches!(parse_request_head(&line(longest)), Sniff::Done(_)));
    assert_eq!(invalid(&line(longest + 1)), "request line longer than 8 KiB");
    assert_eq!(
        invalid(&line(100_000)[..MAX_REQUEST_LINE + 2]),
        "request line longer than 8 KiB"
    );
}
