//! Hand-made ClientHellos: framing over records, every boundary, and malicious lengths.

use super::*;

/// A ClientHello body (after the handshake header) with these extensions, or no extensions block at all.
pub(super) fn body(extensions: Option<&[(u16, Vec<u8>)]>) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend([0x11; 32]);
    body.extend([0x00, 0x00, 0x02, 0x13, 0x01, 0x01, 0x00]);
    if let Some(extensions) = extensions {
        let mut block = Vec::new();
        for (kind, data) in extensions {
            block.extend(kind.to_be_bytes());
            block.extend(u16::try_from(data.len()).unwrap().to_be_bytes());
            block.extend(data);
        }
        body.extend(u16::try_from(block.len()).unwrap().to_be_bytes());
        body.extend(block);
    }
    body
}

/// The handshake message around a body.
pub(super) fn message(body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(body.len()).unwrap().to_be_bytes();
    let mut message = vec![CLIENT_HELLO, len[1], len[2], len[3]];
    message.extend(body);
    message
}

/// `message` framed into handshake records of these payload sizes (the last record takes the rest).
pub(super) fn records(message: &[u8], sizes: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = message;
    for (i, &size) in sizes.iter().enumerate() {
        if rest.is_empty() {
            break;
        }
        let size = if i + 1 == sizes.len() {
            rest.len()
        } else {
            size.min(rest.len())
        };
        let (chunk, tail) = rest.split_at(size);
        out.extend([HANDSHAKE_RECORD, 0x03, 0x01]);
        out.extend(u16::try_from(chunk.len()).unwrap().to_be_bytes());
        out.extend(chunk);
        rest = tail;
    }
    out
}

/// A `server_name` extension with these (name type, name) entries.
pub(super) fn server_name(entries: &[(u8, &[u8])]) -> (u16, Vec<u8>) {
    let mut list = Vec::new();
    for (kind, name) in entries {
        list.push(*kind);
        list.extend(u16::try_from(name.len()).unwrap().to_be_bytes());
        list.extend(*name);
    }
    let mut data = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
    data.extend(list);
    (EXT_SERVER_NAME, data)
}

/// An ALPN extension.
pub(super) fn alpn(protocols: &[&[u8]]) -> (u16, Vec<u8>) {
    let mut list = Vec::new();
    for protocol in protocols {
        list.push(u8::try_from(protocol.len()).unwrap());
        list.extend(*protocol);
    }
    let mut data = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
    data.extend(list);
    (EXT_ALPN, data)
}

fn hello_with(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
    records(&message(&body(Some(extensions))), &[usize::MAX])
}

fn done(bytes: &[u8]) -> ClientHello {
    match parse_client_hello(bytes) {
        Sniff::Done(hello) => hello,
        other => panic!("expected a ClientHello, got {other:?}"),
    }
}

fn invalid(bytes: &[u8]) -> &'static str {
    match parse_client_hello(bytes) {
        Sniff::Invalid(problem) => problem,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// Every strict prefix needs more; the whole gives `expected`.
fn assert_every_prefix(bytes: &[u8], expected: &Sniff<ClientHello>) {
    for cut in 0..bytes.len() {
        let got = parse_client_hello(&bytes[..cut]);
        assert!(
            got == Sniff::NeedMore || got == *expected,
            "prefix of {cut} bytes: {got:?}"
        );
    }
    assert_eq!(parse_client_hello(bytes), *expected);
}

// covers: E4
#[test]
fn reads_sni_and_alpn() {
    let bytes = hello_with(&[
        server_name(&[(0, b"api.Example.com.")]),
        alpn(&[b"h2", b"http/1.1"]),
    ]);
    let hello = done(&bytes);
    assert_eq!(
        hello.sni.as_deref(),
        Some("api.Example.com."),
        "kept as sent: the caller normalises"
    );
    assert_eq!(hello.alpn, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
    assert!(!hello.ech_offered);
    assert_eq!(hello.consumed, bytes.len());
    assert_every_prefix(&bytes, &Sniff::Done(hello));
}

// covers: E4
#[test]
fn no_sni_no_extensions_and_other_name_types() {
    assert_eq!(done(&hello_with(&[])).sni, None);
    let bare = records(&message(&body(None)), &[usize::MAX]);
    assert_eq!(
        done(&bare),
        ClientHello {
            sni: None,
            alpn: vec![],
            ech_offered: false,
            consumed: bare.len()
        }
    );
    let other_type = hello_with(&[server_name(&[(7, b"opaque"), (0, b"x.example")])]);
    assert_eq!(done(&other_type).sni.as_deref(), Some("x.example"));
    assert_eq!(done(&hello_with(&[server_name(&[(7, b"opaque")])])).sni, None);
    assert!(done(&hello_with(&[(EXT_ENCRYPTED_CLIENT_HELLO, vec![0; 8])])).ech_offered);
}

// covers: E4
#[test]
fn reassembles_a_hello_fragmented_over_records() {
    let msg = message(&body(Some(&[
        server_name(&[(0, b"frag.example")]),
        alpn(&[b"h2"]),
    ])));
    for sizes in [
        &[1, usize::MAX][..],
        &[3, 1, usize::MAX],
        &[4, 5],
        &[10, 20, 30, 40, 50],
        &[msg.len() - 1, 1],
    ] {
        let bytes = records(&msg, sizes);
        let hello = done(&bytes);
        assert_eq!(hello.sni.as_deref(), Some("frag.example"), "{sizes:?}");
        assert_eq!(hello.consumed, bytes.len());
        assert_every_prefix(&bytes, &Sniff::Done(hello));
    }
    // Trailing bytes after the hello's records are not read, whatever they are.
    let mut bytes = records(&msg, &[7, usize::MAX]);
    let consumed = bytes.len();
    bytes.extend([0x14, 0x03, 0x03, 0x00, 0x01, 0x01, 0xff, 0xff]);
    assert_eq!(done(&bytes).consumed, consumed);
}

// covers: E4
#[test]
fn record_layer_rules() {
    let good = hello_with(&[server_name(&[(0, b"a.example")])]);
    assert_eq!(parse_client_hello(b""), Sniff::NeedMore);
    assert_eq!(parse_client_hello(&[0x16]), Sniff::NeedMore);
    assert_eq!(parse_client_hello(&[0x17, 0x03, 0x03]), Sniff::NotThisProtocol);
    // An SSLv2-compatible hello (2-byte header with the high bit set, message type 1) is not ours.
    assert_eq!(
        parse_client_hello(&[0x80, 0x2e, 0x01, 0x03, 0x01]),
        Sniff::NotThisProtocol
    );
    for minor in 0..=3 {
        let mut bytes = good.clone();
        bytes[2] = minor;
        assert!(
            matches!(parse_client_hello(&bytes), Sniff::Done(_)),
            "record version 3.{minor}"
        );
    }
    // 0x16 followed by garbage is refused at the first wrong byte.
    assert_eq!(
        invalid(b"\x16GET / HTTP/1.1"),
        "record version is not SSL 3 or TLS"
    );
    assert_eq!(
        invalid(&[0x16, 0x03, 0x04]),
        "record version is not 0x0300-0x0303"
    );
    assert_eq!(
        invalid(&[0x16, 0x02, 0x00, 0x00, 0x10]),
        "record version is not SSL 3 or TLS"
    );
    assert_eq!(
        invalid(&[0x16, 0x03, 0x01, 0x00, 0x00]),
        "zero-length handshake record"
    );
    assert_eq!(
        invalid(&[0x16, 0x03, 0x01, 0x40, 0x01]),
        "record longer than 2^14 bytes"
    );
    assert_eq!(
        invalid(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x02]),
        "first handshake message is not a ClientHello"
    );
    // A zero-length record in the middle of a fragmented hello.
    let msg = message(&body(Some(&[])));
    let mut bytes = records(&msg, &[10, usize::MAX]);
    bytes.truncate(15);
    bytes.extend([0x16, 0x03, 0x01, 0x00, 0x00]);
    assert_eq!(invalid(&bytes), "zero-length handshake record");
    // An alert (or any other record type) before the hello is complete.
    let mut bytes = records(&msg, &[10, usize::MAX]);
    bytes.truncate(15);
    bytes.extend([0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x28]);
    assert_eq!(
        invalid(&bytes),
        "a non-handshake record arrived before the ClientHello was complete"
    );
}

// covers: E4
#[test]
fn caps_size_and_record_count() {
    // A handshake header announcing more than 64 KiB is refused before any of it arrives.
    assert_eq!(
        invalid(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x01, 0x00, 0x00]),
        "ClientHello longer than 64 KiB"
    );
    assert_eq!(
        invalid(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0xff, 0xff, 0xff]),
        "ClientHello longer than 64 KiB"
    );
    // The largest accepted message (with a padding extension) still parses, over several full records.
    let empty = body(Some(&[(0x0015, vec![])])).len();
    let padding = MAX_HANDSHAKE_LEN - HANDSHAKE_HEADER_LEN - empty;
    let msg = message(&body(Some(&[(0x0015, vec![0; padding])])));
    assert_eq!(msg.len(), MAX_HANDSHAKE_LEN);
    let bytes = records(&msg, &[MAX_RECORD_PAYLOAD; 4]);
    assert_eq!(done(&bytes).consumed, bytes.len());
    // One byte more is refused.
    let msg = message(&body(Some(&[(0x0015, vec![0; padding + 1])])));
    assert_eq!(
        invalid(&records(&msg, &[MAX_RECORD_PAYLOAD; 4])),
        "ClientHello longer than 64 KiB"
    );
    // One-byte records: the 65th is refused.
    let msg = message(&body(Some(&[(0x0015, vec![0; 100])])));
    assert_eq!(
        invalid(&records(&msg, &[1; 200])),
        "ClientHello spread over too many records"
    );
    let bytes = records(&msg, &[1; MAX_RECORDS]);
    assert_eq!(done(&bytes).consumed, bytes.len(), "64 records are fine");
}

// covers: E4
#[test]
fn handshake_data_after_the_hello_is_refused() {
    let mut msg = message(&body(Some(&[])));
    msg.extend([0x01, 0x00, 0x00, 0x00]);
    assert_eq!(
        invalid(&records(&msg, &[usize::MAX])),
        "handshake data after the ClientHello"
    );
    // Extra bytes in a record of their own come after the hello's records: not read.
    let hello_len = msg.len() - 4;
    assert_eq!(
        done(&records(&msg, &[hello_len, 4])).consumed,
        RECORD_HEADER_LEN + hello_len
    );
}

// covers: E4
#[test]
fn malicious_lengths_are_refused() {
    let base = body(Some(&[server_name(&[(0, b"a.example")])]));
    let hello = |body: &[u8]| records(&message(body), &[usize::MAX]);
    // Lengths pointing past the end of the message.
    for (at, value) in [
        (34, 33_u8),
        (34, 0xff),
        (35, 0xff),
        (36, 0xff),
        (39, 2),
        (41, 0xff),
        (42, 0xff),
    ] {
        let mut b = base.clone();
        b[at] = value;
        assert!(
            matches!(parse_client_hello(&hello(&b)), Sniff::Invalid(_)),
            "byte {at} = {value}"
        );
    }
    // Truncated inside the fixed fields.
    for len in [0, 1, 2, 33, 34, 35, 37, 39] {
        assert!(
            matches!(parse_client_hello(&hello(&base[..len])), Sniff::Invalid(_)),
            "body of {len} bytes"
        );
    }
    // An extension whose length runs past the block; a block longer than the message.
    let mut b = base.clone();
    b[45] = 0xff;
    assert_eq!(
        invalid(&hello(&b)),
        "extension past the end of the extensions block"
    );
    let mut b = base.clone();
    b[41] = 0xff;
    assert_eq!(invalid(&hello(&b)), "extensions past the end of the ClientHello");
    let mut b = base;
    b.push(0);
    assert!(matches!(parse_client_hello(&hello(&b)), Sniff::Invalid(_)));
    // A server_name list whose inner length exceeds the outer one, and the reverse.
    let mut data = vec![0x00, 0x20, 0x00, 0x00, 0x03];
    data.extend(b"a.b");
    assert_eq!(
        invalid(&hello(&body(Some(&[(EXT_SERVER_NAME, data)])))),
        "server_name list longer than its extension"
    );
    let data = vec![0x00, 0x06, 0x00, 0x00, 0x10, b'a', b'.', b'b'];
    assert_eq!(
        invalid(&hello(&body(Some(&[(EXT_SERVER_NAME, data)])))),
        "server_name entry past the end of its list"
    );
    let data = vec![0x00, 0x01, 0x00, 0x00];
    assert_eq!(
        invalid(&hello(&body(Some(&[(EXT_SERVER_NAME, data)])))),
        "server_name list shorter than its extension"
    );
    assert_eq!(
        invalid(&hello(&body(Some(&[(EXT_SERVER_NAME, vec![])])))),
        "server_name list longer than its extension"
    );
    assert_eq!(
        invalid(&hello(&body(Some(&[(EXT_SERVER_NAME, vec![0, 0])])))),
        "empty server_name list"
    );
    assert_eq!(
        invalid(&hello(&body(Some(&[(EXT_ALPN, vec![0, 2, 2, b'h'])])))),
        "ALPN protocol name past the end of its list"
    );
    assert_eq!(
        invalid(&hello(&body(Some(&[(EXT_ALPN, vec![0, 0])])))),
        "empty ALPN list"
    );
    assert_eq!(
        invalid(&hello(&body(Some(&[alpn(&[b"h2", b""])])))),
        "empty ALPN protocol name"
    );
    let many = vec![&b"x"[..]; 33];
    assert_eq!(
        invalid(&hello(&body(Some(&[alpn(&many)])))),
        "more than 32 ALPN protocol names"
    );
}

// covers: E4, E5
#[test]
fn ambiguous_or_malformed_names_are_refused() {
    type Extensions<'a> = &'a [(u16, Vec<u8>)];
    let refused: &[(Extensions<'_>, &str)] = &[
        (
            &[server_name(&[(0, b"a.example"), (0, b"b.example")])],
            "several host names in server_name",
        ),
        (
            &[
                server_name(&[(0, b"a.example")]),
                server_name(&[(0, b"a.example")]),
            ],
            "two server_name extensions",
        ),
        (&[alpn(&[b"h2"]), alpn(&[b"h2"])], "two ALPN extensions"),
        (&[server_name(&[(0, b"")])], "empty host name in server_name"),
        (
            &[server_name(&[(0, "bücher.example".as_bytes())])],
            "host name in server_name is not printable ASCII",
        ),
        (
            &[server_name(&[(0, b"a.example\0.evil")])],
            "host name in server_name is not printable ASCII",
        ),
        (
            &[server_name(&[(0, b"a example")])],
            "host name in server_name is not printable ASCII",
        ),
        (
            &[server_name(&[(0, &[b'a'; 256])])],
            "host name in server_name longer than 255 bytes",
        ),
    ];
    for (extensions, problem) in refused {
        assert_eq!(invalid(&hello_with(extensions)), *problem);
    }
    // Accepted as sent, refused or rewritten later by normalize_name: a trailing dot, an address literal.
    assert_eq!(
        done(&hello_with(&[server_name(&[(0, b"a.example.")])]))
            .sni
            .as_deref(),
        Some("a.example.")
    );
    assert_eq!(
        done(&hello_with(&[server_name(&[(0, b"127.0.0.1")])]))
            .sni
            .as_deref(),
        Some("127.0.0.1")
    );
    assert_eq!(
        done(&hello_with(&[server_name(&[(0, b".")])])).sni.as_deref(),
        Some(".")
    );
}

// covers: E4
#[test]
fn old_and_odd_client_versions() {
    let mut b = body(None);
    b[0] = 0x02;
    assert_eq!(
        invalid(&records(&message(&b), &[usize::MAX])),
        "ClientHello version is not SSL 3 or TLS"
    );
    let mut b = body(Some(&[]));
    b[1] = 0x00;
    assert!(matches!(
        parse_client_hello(&records(&message(&b), &[usize::MAX])),
        Sniff::Done(_)
    ));
}
