//! The TLS ClientHello (E4): the record layer walk that reassembles the handshake message from one or more
//! handshake records, and the message's SNI, ALPN and ECH flag.
//!
//! Decisions (the gateway decides by the SNI, so ambiguity is refused, never guessed):
//! - First byte not 0x16 (a handshake record) is `NotThisProtocol`. That includes SSLv2-compatible hellos
//!   (first byte with the high bit set), which no current client sends: the caller treats them as other TCP.
//! - Record versions 0x0300–0x0303 are accepted; any other version, a record of another content type before
//!   the hello is complete, a zero-length record, a record over 2^14 bytes, a handshake message that is not
//!   a ClientHello, a message over [`MAX_HANDSHAKE_LEN`], more than [`MAX_RECORDS`] records, or handshake
//!   bytes after the ClientHello in its last record are `Invalid`.
//! - Extensions and every vector inside them are bounds-checked and must fill their container exactly; two
//!   `server_name` or two ALPN extensions are `Invalid`. Other extensions are not looked into.
//! - `server_name`: exactly one `host_name` entry (two are `Invalid`, as RFC 6066 demands), 1–255 bytes of
//!   printable ASCII (no space, no control byte, nothing above 0x7e; else `Invalid`). The name is returned
//!   as sent: case and a trailing dot are kept, and an address literal is not refused here; the caller
//!   normalises with `normalize_name`, which lower-cases, strips the dot and refuses numeric names. Entries
//!   of other name types are skipped. No `server_name` extension is `Done` with `sni: None`.

use super::Sniff;

/// Content type of a TLS handshake record.
pub(super) const HANDSHAKE_RECORD: u8 = 0x16;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 0x01;
/// Largest ClientHello handshake message (its 4-byte header included) the parser reassembles.
pub const MAX_HANDSHAKE_LEN: usize = 64 * 1024;
/// Most TLS records a ClientHello may be spread over (real clients use one; this bounds the work per call).
pub const MAX_RECORDS: usize = 64;
/// Largest plaintext record payload (RFC 8446 §5.1).
const MAX_RECORD_PAYLOAD: usize = 1 << 14;
const RECORD_HEADER_LEN: usize = 5;
const HANDSHAKE_HEADER_LEN: usize = 4;
/// Longest host name accepted in `server_name` (a DNS name is at most 253 bytes, plus a trailing dot).
const MAX_HOST_NAME_LEN: usize = 255;
/// Most ALPN protocol names accepted (browsers send two or three).
const MAX_ALPN_PROTOCOLS: usize = 32;
const EXT_SERVER_NAME: u16 = 0x0000;
const EXT_ALPN: u16 = 0x0010;
const EXT_ENCRYPTED_CLIENT_HELLO: u16 = 0xfe0d;
const NAME_TYPE_HOST_NAME: u8 = 0;

/// What the gateway needs from a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientHello {
    /// The `host_name` of the `server_name` extension, as sent (validated printable ASCII, not normalised);
    /// `None` when the client sent no `server_name` (or only entries of other name types).
    pub sni: Option<String>,
    /// The ALPN protocol names offered, in the client's order (empty when no ALPN extension).
    pub alpn: Vec<Vec<u8>>,
    /// Whether the client offered Encrypted Client Hello: then `sni` is only the outer (public) name and the
    /// name the client really wants is encrypted.
    pub ech_offered: bool,
    /// Bytes of the TLS records that carried the ClientHello (record headers included): forward exactly
    /// these before splicing or handing the stream to a TLS server.
    pub consumed: usize,
}

/// Parses a TLS ClientHello from the bytes a connection has sent so far.
///
/// Call again with the longer buffer while it answers [`Sniff::NeedMore`]. The answer depends only on the
/// records the hello occupies: bytes after [`ClientHello::consumed`] are not looked at.
pub fn parse_client_hello(buf: &[u8]) -> Sniff<ClientHello> {
    let framed = match frame(buf) {
        Ok(framed) => framed,
        Err(sniff) => return sniff,
    };
    let parsed = if framed.records == 1 {
        // The common case: one record, parsed in place.
        let start = RECORD_HEADER_LEN + HANDSHAKE_HEADER_LEN;
        match buf.get(start..RECORD_HEADER_LEN + framed.message_len) {
            Some(body) => parse_body(body),
            None => Err("internal: record bounds"),
        }
    } else {
        let message = reassemble(buf, &framed);
        match message.get(HANDSHAKE_HEADER_LEN..) {
            Some(body) => parse_body(body),
            None => Err("internal: message bounds"),
        }
    };
    match parsed {
        Ok(mut hello) => {
            hello.consumed = framed.consumed;
            Sniff::Done(hello)
        }
        Err(problem) => Sniff::Invalid(problem),
    }
}

/// Where a complete handshake message lies in the buffer.
struct Framed {
    /// Records that carry it (they start at offset 0 and follow each other).
    records: usize,
    /// Its length, 4-byte handshake header included.
    message_len: usize,
    /// Bytes of those records, headers included.
    consumed: usize,
}

/// Walks the records in stream order until the ClientHello message is complete. Every check runs as soon as
/// the bytes it needs are there, in the order of those bytes, so a prefix is refused exactly as the whole.
fn frame(buf: &[u8]) -> Result<Framed, Sniff<ClientHello>> {
    let invalid = |problem| Err(Sniff::Invalid(problem));
    let mut pos = 0;
    let mut records = 0;
    // Handshake bytes declared by the records before the current one.
    let mut seen = 0;
    let mut header = [0_u8; HANDSHAKE_HEADER_LEN];
    let mut header_len = 0;
    let mut message_len = None;
    loop {
        let Some(&content_type) = buf.get(pos) else {
            return Err(Sniff::NeedMore);
        };
        if content_type != HANDSHAKE_RECORD {
            return if pos == 0 {
                Err(Sniff::NotThisProtocol)
            } else {
                invalid("a non-handshake record arrived before the ClientHello was complete")
            };
        }
        let Some(&major) = buf.get(pos + 1) else {
            return Err(Sniff::NeedMore);
        };
        if major != 3 {
            return invalid("record version is not SSL 3 or TLS");
        }
        let Some(&minor) = buf.get(pos + 2) else {
            return Err(Sniff::NeedMore);
        };
        if minor > 3 {
            return invalid("record version is not 0x0300-0x0303");
        }
        let Some(&[hi, lo]) = buf.get(pos + 3..pos + RECORD_HEADER_LEN) else {
            return Err(Sniff::NeedMore);
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if len == 0 {
            return invalid("zero-length handshake record");
        }
        if len > MAX_RECORD_PAYLOAD {
            return invalid("record longer than 2^14 bytes");
        }
        records += 1;
        if records > MAX_RECORDS {
            return invalid("ClientHello spread over too many records");
        }
        if let Some(total) = message_len
            && seen + len > total
        {
            return invalid("handshake data after the ClientHello");
        }
        let start = pos + RECORD_HEADER_LEN;
        let available = buf.get(start..).unwrap_or_default();
        let available = available.get(..len).unwrap_or(available);
        if message_len.is_none() {
            for &b in available.iter().take(HANDSHAKE_HEADER_LEN - header_len) {
                if header_len == 0 && b != CLIENT_HELLO {
                    return invalid("first handshake message is not a ClientHello");
                }
                if let Some(slot) = header.get_mut(header_len) {
                    *slot = b;
                }
                header_len += 1;
            }
            if header_len == HANDSHAKE_HEADER_LEN {
                let [_, a, b, c] = header;
                let total =
                    HANDSHAKE_HEADER_LEN + usize::from(a) * 65536 + usize::from(b) * 256 + usize::from(c);
                if total > MAX_HANDSHAKE_LEN {
                    return invalid("ClientHello longer than 64 KiB");
                }
                if seen + len > total {
                    return invalid("handshake data after the ClientHello");
                }
                message_len = Some(total);
            }
        }
        if available.len() < len {
            return Err(Sniff::NeedMore);
        }
        seen += len;
        pos = start + len;
        if message_len == Some(seen) {
            return Ok(Framed {
                records,
                message_len: seen,
                consumed: pos,
            });
        }
    }
}

/// Copies the handshake message out of several records (one allocation of the message's size).
fn reassemble(buf: &[u8], framed: &Framed) -> Vec<u8> {
    let mut message = Vec::with_capacity(framed.message_len);
    let mut pos = 0;
    for _ in 0..framed.records {
        let Some(&[hi, lo]) = buf.get(pos + 3..pos + RECORD_HEADER_LEN) else {
            break;
        };
        let end = pos + RECORD_HEADER_LEN + usize::from(u16::from_be_bytes([hi, lo]));
        message.extend_from_slice(buf.get(pos + RECORD_HEADER_LEN..end).unwrap_or_default());
        pos = end;
    }
    message
}

/// Reads big-endian integers and length-prefixed vectors off a slice, never past its end.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    fn take(&mut self, n: usize, problem: &'static str) -> Result<&'a [u8], &'static str> {
        let (head, tail) = self.rest.split_at_checked(n).ok_or(problem)?;
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self, problem: &'static str) -> Result<u8, &'static str> {
        let (&b, tail) = self.rest.split_first().ok_or(problem)?;
        self.rest = tail;
        Ok(b)
    }

    fn u16(&mut self, problem: &'static str) -> Result<u16, &'static str> {
        match self.take(2, problem)? {
            &[hi, lo] => Ok(u16::from_be_bytes([hi, lo])),
            _ => Err(problem),
        }
    }

    /// A vector with a one-byte length.
    fn vec8(&mut self, problem: &'static str) -> Result<&'a [u8], &'static str> {
        let len = self.u8(problem)?;
        self.take(usize::from(len), problem)
    }

    /// A vector with a two-byte length.
    fn vec16(&mut self, problem: &'static str) -> Result<&'a [u8], &'static str> {
        let len = self.u16(problem)?;
        self.take(usize::from(len), problem)
    }
}

/// Parses the ClientHello body (after the handshake header). `consumed` is left 0 for the caller.
fn parse_body(body: &[u8]) -> Result<ClientHello, &'static str> {
    const SHORT: &str = "ClientHello shorter than its fixed fields";
    let mut r = Reader::new(body);
    let version = r.u16(SHORT)?;
    if version >> 8 != 3 {
        return Err("ClientHello version is not SSL 3 or TLS");
    }
    r.take(32, SHORT)?;
    if r.vec8("session id past the end of the ClientHello")?.len() > 32 {
        return Err("session id longer than 32 bytes");
    }
    let suites = r.vec16("cipher suites past the end of the ClientHello")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err("cipher suite list empty or of odd length");
    }
    if r.vec8("compression methods past the end of the ClientHello")?
        .is_empty()
    {
        return Err("no compression method");
    }
    let mut hello = ClientHello {
        sni: None,
        alpn: Vec::new(),
        ech_offered: false,
        consumed: 0,
    };
    if r.is_empty() {
        // SSL 3 and early TLS clients may send no extensions block at all.
        return Ok(hello);
    }
    let extensions = r.vec16("extensions past the end of the ClientHello")?;
    if !r.is_empty() {
        return Err("bytes after the extensions of the ClientHello");
    }
    let mut r = Reader::new(extensions);
    let (mut server_name_seen, mut alpn_seen) = (false, false);
    while !r.is_empty() {
        let kind = r.u16("truncated extension header")?;
        let data = r.vec16("extension past the end of the extensions block")?;
        match kind {
            EXT_SERVER_NAME => {
                if std::mem::replace(&mut server_name_seen, true) {
                    return Err("two server_name extensions");
                }
                hello.sni = parse_server_name(data)?;
            }
            EXT_ALPN => {
                if std::mem::replace(&mut alpn_seen, true) {
                    return Err("two ALPN extensions");
                }
                hello.alpn = parse_alpn(data)?;
            }
            EXT_ENCRYPTED_CLIENT_HELLO => hello.ech_offered = true,
            _ => {}
        }
    }
    Ok(hello)
}

/// The `host_name` of a `server_name` extension (RFC 6066 §3).
fn parse_server_name(data: &[u8]) -> Result<Option<String>, &'static str> {
    let mut r = Reader::new(data);
    let list = r.vec16("server_name list longer than its extension")?;
    if !r.is_empty() {
        return Err("server_name list shorter than its extension");
    }
    if list.is_empty() {
        return Err("empty server_name list");
    }
    let mut r = Reader::new(list);
    let mut host = None;
    while !r.is_empty() {
        let name_type = r.u8("truncated server_name entry")?;
        let name = r.vec16("server_name entry past the end of its list")?;
        if name_type != NAME_TYPE_HOST_NAME {
            continue;
        }
        if host.is_some() {
            return Err("several host names in server_name");
        }
        if name.is_empty() {
            return Err("empty host name in server_name");
        }
        if name.len() > MAX_HOST_NAME_LEN {
            return Err("host name in server_name longer than 255 bytes");
        }
        if !name.iter().all(u8::is_ascii_graphic) {
            return Err("host name in server_name is not printable ASCII");
        }
        host = Some(
            std::str::from_utf8(name)
                .map_err(|_| "host name in server_name is not ASCII")?
                .to_owned(),
        );
    }
    Ok(host)
}

/// The protocol names of an ALPN extension (RFC 7301 §3.1).
fn parse_alpn(data: &[u8]) -> Result<Vec<Vec<u8>>, &'static str> {
    let mut r = Reader::new(data);
    let list = r.vec16("ALPN list longer than its extension")?;
    if !r.is_empty() {
        return Err("ALPN list shorter than its extension");
    }
    if list.is_empty() {
        return Err("empty ALPN list");
    }
    let mut r = Reader::new(list);
    let mut protocols = Vec::new();
    while !r.is_empty() {
        let name = r.vec8("ALPN protocol name past the end of its list")?;
        if name.is_empty() {
            return Err("empty ALPN protocol name");
        }
        if protocols.len() == MAX_ALPN_PROTOCOLS {
            return Err("more than 32 ALPN protocol names");
        }
        protocols.push(name.to_vec());
    }
    Ok(protocols)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod real;
