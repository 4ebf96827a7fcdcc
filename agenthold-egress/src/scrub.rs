//! Scrubbing answers from intercepted hosts (E19): every form of every secret value the agent holds is
//! replaced by its placeholder before the sandbox sees it, in response headers and trailers, in bodies as
//! they stream (HTTP/1.1 and h2, server-sent events included: nothing is buffered beyond the few bytes
//! that could start a form), and in WebSocket messages.
//!
//! What makes scanning possible is arranged on the request: `Accept-Encoding: identity` (a compressed body
//! cannot be scanned; an upstream that compresses anyway gets a 502, never a pass), no `Range` (slices of
//! an echoed value would each look harmless), and no WebSocket extensions (permessage-deflate would compress
//! frames). The WebSocket scrubber refuses frames with reserved bits set for the same reason.
// enforces: E19

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agenthold_core::secret::{RedactStream, Redacted, Redactor};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use hyper::body::{Body, Frame, SizeHint};

use crate::upstream::{BoxError, ProxyBody};

/// Prepare a request to an intercepted host so that its answer can be scanned.
pub(crate) fn prepare_request(headers: &mut HeaderMap) {
    headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    headers.remove(header::RANGE);
    headers.remove(header::IF_RANGE);
    headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
}

/// Why an answer cannot be passed on scrubbed.
#[derive(Debug)]
pub(crate) struct Unscannable(pub(crate) &'static str);

/// Scrub response headers in place; refuse an answer whose body is encoded (it cannot be scanned).
pub(crate) fn response_headers(redactor: &Redactor, headers: &mut HeaderMap) -> Result<(), Unscannable> {
    let encoded = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded {
        return Err(Unscannable(
            "upstream sent a compressed body, which cannot be scanned for secrets",
        ));
    }
    scrub_headers(redactor, headers);
    // The body's length changes when a form is replaced.
    headers.remove(header::CONTENT_LENGTH);
    Ok(())
}

/// Replace every form in header values (a value that would stop being a valid header value is dropped).
pub(crate) fn scrub_headers(redactor: &Redactor, headers: &mut HeaderMap) {
    let mut changed = Vec::new();
    for (name, value) in headers.iter() {
        if let Some(new) = redactor.redact(value.as_bytes()) {
            changed.push((name.clone(), value.clone(), new));
        }
    }
    for (name, old, new) in changed {
        let kept: Vec<HeaderValue> = headers
            .get_all(&name)
            .iter()
            .filter(|v| **v != old)
            .cloned()
            .collect();
        headers.remove(&name);
        for v in kept {
            headers.append(&name, v);
        }
        if let Ok(v) = HeaderValue::from_bytes(&new) {
            headers.append(&name, v);
        }
    }
}

/// Answers up to this long, of known length, are read whole and keep an exact `Content-Length`.
pub(crate) const WHOLE_MAX: u64 = 64 * 1024;

/// Whether an answer with these headers is read whole (a `Content-Length` of at most [`WHOLE_MAX`]).
pub(crate) fn whole_length(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|n| n <= WHOLE_MAX)
}

/// Read a short body whole and scrub it; the error says why it could not be read.
pub(crate) async fn whole(mut body: ProxyBody, redactor: &Redactor) -> Result<Bytes, String> {
    let mut out = Vec::new();
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        let frame = frame.map_err(|e| format!("upstream body: {e}"))?;
        if let Ok(data) = frame.into_data() {
            out.extend_from_slice(&data);
            if out.len() as u64 > WHOLE_MAX {
                return Err("upstream body longer than its Content-Length".to_owned());
            }
        }
    }
    Ok(Bytes::from(redactor.redact(&out).unwrap_or(out)))
}

/// A response body with every form replaced as it streams.
pub(crate) struct RedactedBody {
    inner: ProxyBody,
    stream: RedactStream,
    redactor: Arc<Redactor>,
    /// Trailers that arrived while bytes were still held back: sent after them.
    trailers: Option<HeaderMap>,
    done: bool,
}

impl RedactedBody {
    pub(crate) fn new(inner: ProxyBody, redactor: &Arc<Redactor>) -> Self {
        Self {
            inner,
            stream: redactor.stream(),
            redactor: Arc::clone(redactor),
            trailers: None,
            done: false,
        }
    }
}

impl Body for RedactedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(trailers) = this.trailers.take() {
                this.done = true;
                return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    this.done = true;
                    let rest = this.stream.finish();
                    if rest.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                }
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            match frame.into_data() {
                Ok(data) => {
                    let mut out = match this.stream.push(&data) {
                        Redacted::Unchanged => data,
                        Redacted::Changed(bytes) => Bytes::from(bytes),
                    };
                    if this.inner.is_end_stream() && this.stream.is_holding() {
                        let mut joined = out.to_vec();
                        joined.extend_from_slice(&this.stream.finish());
                        out = Bytes::from(joined);
                    }
                    if out.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                Err(frame) => {
                    let Ok(mut trailers) = frame.into_trailers() else {
                        continue;
                    };
                    scrub_headers(&this.redactor, &mut trailers);
                    let rest = this.stream.finish();
                    if rest.is_empty() {
                        this.done = true;
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                    }
                    this.trailers = Some(trailers);
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// WebSocket opcodes (RFC 6455 §5.2).
const OP_CONTINUATION: u8 = 0x0;
const OP_CLOSE: u8 = 0x8;
/// Largest control frame payload.
const MAX_CONTROL: usize = 125;

/// Scrubs the frames an upstream sends on an upgraded WebSocket (RFC 6455). Data messages stream through
/// a [`RedactStream`] each; since a replacement changes lengths, every frame is re-framed with what the
/// stream releases (a message may come out in more, or emptier, fragments than it went in: intermediaries
/// may re-fragment when no extension is negotiated, §5.4). Control frames are scrubbed whole.
pub(crate) struct WsScrubber {
    redactor: Arc<Redactor>,
    /// Bytes of an incomplete frame header.
    header: Vec<u8>,
    /// The frame being read: its opcode, whether it ends its message, payload bytes left.
    frame: Option<WsFrame>,
    /// The current data message.
    message: Option<WsMessage>,
    /// Payload of a control frame being collected.
    control: Vec<u8>,
}

/// A data message being scrubbed.
struct WsMessage {
    stream: RedactStream,
    /// Text or binary.
    opcode: u8,
    /// Whether its first fragment went out.
    started: bool,
}

#[derive(Clone, Copy)]
struct WsFrame {
    opcode: u8,
    fin: bool,
    left: u64,
}

impl WsScrubber {
    pub(crate) fn new(redactor: Arc<Redactor>) -> Self {
        Self {
            redactor,
            header: Vec::new(),
            frame: None,
            message: None,
            control: Vec::new(),
        }
    }

    /// Take bytes from the upstream; append what the sandbox may get to `out`. An error means the stream
    /// cannot be scrubbed (a frame with extension bits, a masked or malformed frame): close it.
    pub(crate) fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), &'static str> {
        while !input.is_empty() {
            let Some(frame) = self.frame else {
                let (used, frame) = self.read_header(input)?;
                input = input.get(used..).unwrap_or_default();
                if let Some(frame) = frame {
                    self.start(frame, out)?;
                }
                continue;
            };
            let take = usize::try_from(frame.left).unwrap_or(usize::MAX).min(input.len());
            let (payload, rest) = input.split_at(take);
            input = rest;
            let left = frame.left - take as u64;
            self.frame = Some(WsFrame { left, ..frame });
            if frame.opcode >= OP_CLOSE {
                self.control.extend_from_slice(payload);
            } else {
                self.data(payload, frame.fin && left == 0, out);
            }
            if left == 0 {
                self.finish_frame(out);
            }
        }
        Ok(())
    }

    /// Parse a frame header from `self.header` + `input`: bytes used, and the frame once complete.
    fn read_header(&mut self, input: &[u8]) -> Result<(usize, Option<WsFrame>), &'static str> {
        let want = |h: &[u8]| -> usize {
            match h.get(1).map(|b| b & 0x7f) {
                Some(126) => 4,
                Some(127) => 10,
                None | Some(_) => 2,
            }
        };
        let mut used = 0;
        while self.header.len() < want(&self.header) {
            let Some(&b) = input.get(used) else {
                return Ok((used, None));
            };
            self.header.push(b);
            used += 1;
        }
        let h = std::mem::take(&mut self.header);
        let (b0, b1) = (h.first().copied().unwrap_or(0), h.get(1).copied().unwrap_or(0));
        if b0 & 0x70 != 0 {
            return Err("WebSocket frame with extension bits set");
        }
        if b1 & 0x80 != 0 {
            return Err("masked WebSocket frame from the server");
        }
        let len = match b1 & 0x7f {
            126 => u64::from(u16::from_be_bytes([
                h.get(2).copied().unwrap_or(0),
                h.get(3).copied().unwrap_or(0),
            ])),
            127 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(h.get(2..10).unwrap_or(&[0; 8]));
                u64::from_be_bytes(b)
            }
            n => u64::from(n),
        };
        let frame = WsFrame {
            opcode: b0 & 0x0f,
            fin: b0 & 0x80 != 0,
            left: len,
        };
        if frame.opcode >= OP_CLOSE && (len > MAX_CONTROL as u64 || !frame.fin) {
            return Err("malformed WebSocket control frame");
        }
        Ok((used, Some(frame)))
    }

    /// A frame header was read.
    fn start(&mut self, frame: WsFrame, out: &mut Vec<u8>) -> Result<(), &'static str> {
        if frame.opcode < OP_CLOSE {
            match (frame.opcode == OP_CONTINUATION, self.message.is_some()) {
                (true, false) => return Err("WebSocket continuation without a message"),
                (false, true) => return Err("WebSocket message inside a message"),
                (false, false) => {
                    self.message = Some(WsMessage {
                        stream: self.redactor.stream(),
                        opcode: frame.opcode,
                        started: false,
                    });
                }
                (true, true) => {}
            }
            self.frame = Some(frame);
        } else {
            self.control.clear();
            self.frame = Some(frame);
        }
        if frame.left == 0 {
            if frame.opcode < OP_CLOSE {
                self.data(&[], frame.fin, out);
            }
            self.finish_frame(out);
        }
        Ok(())
    }

    /// Payload bytes of a data frame; `last` when they end the message.
    fn data(&mut self, payload: &[u8], last: bool, out: &mut Vec<u8>) {
        let Some(message) = self.message.as_mut() else {
            return;
        };
        let mut bytes = match message.stream.push(payload) {
            Redacted::Unchanged => payload.to_vec(),
            Redacted::Changed(b) => b,
        };
        if last {
            bytes.extend_from_slice(&message.stream.finish());
        }
        if bytes.is_empty() && !last {
            return;
        }
        let op = if message.started {
            OP_CONTINUATION
        } else {
            message.opcode
        };
        message.started = true;
        write_frame(out, op, last, &bytes);
        if last {
            self.message = None;
        }
    }

    /// The current frame's payload is complete.
    fn finish_frame(&mut self, out: &mut Vec<u8>) {
        let Some(frame) = self.frame.take() else {
            return;
        };
        if frame.opcode >= OP_CLOSE {
            let mut payload = self
                .redactor
                .redact(&self.control)
                .unwrap_or_else(|| self.control.clone());
            if payload.len() > MAX_CONTROL {
                // A close frame's reason (after its 2-byte code) is cut at a character boundary.
                let mut cut = MAX_CONTROL;
                while cut > 2 && payload.get(cut).is_some_and(|b| b & 0xc0 == 0x80) {
                    cut -= 1;
                }
                payload.truncate(cut);
            }
            write_frame(out, frame.opcode, true, &payload);
            self.control.clear();
        }
    }
}

impl crate::io::Rewrite for WsScrubber {
    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
        Self::feed(self, input, out).map_err(std::io::Error::other)
    }
}

/// Whether `headers` ask for (or, on a 101, agree to) exactly a WebSocket upgrade: the one protocol switch
/// the gateway carries (E23). Any other `Upgrade` (`h2c`, `TLS/1.0`, …) is dropped from the request, so it
/// is served as a plain request instead of becoming a raw tunnel.
pub(crate) fn is_websocket(headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(header::UPGRADE).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => v
            .to_str()
            .is_ok_and(|v| v.trim().eq_ignore_ascii_case("websocket")),
        _ => false,
    }
}

/// Append one unmasked frame.
fn write_frame(out: &mut Vec<u8>, opcode: u8, fin: bool, payload: &[u8]) {
    out.push(if fin { 0x80 } else { 0 } | opcode);
    match payload.len() {
        n if n < 126 => out.push(u8::try_from(n).unwrap_or(0)),
        n if n <= usize::from(u16::MAX) => {
            out.push(126);
            out.extend_from_slice(&u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use agenthold_core::secret::RedactSource;
    use http_body_util::BodyExt;

    use super::*;

    const VALUE: &str = "sk-live-0123456789abcdef";
    const PLACEHOLDER: &str = "agenthold-placeholder-x";

    fn redactor() -> Arc<Redactor> {
        Arc::new(
            Redactor::new([RedactSource {
                value: VALUE.as_bytes(),
                rendered: vec![zeroize::Zeroizing::new(format!("Bearer {VALUE}").into_bytes())],
                placeholder: PLACEHOLDER,
            }])
            .unwrap(),
        )
    }

    /// A body that yields `chunks` then `trailers`.
    fn body(chunks: &[&[u8]], trailers: Option<HeaderMap>) -> ProxyBody {
        let mut frames: Vec<Result<Frame<Bytes>, BoxError>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        if let Some(t) = trailers {
            frames.push(Ok(Frame::trailers(t)));
        }
        http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed()
    }

    // covers: E19
    #[tokio::test]
    async fn bodies_are_scrubbed_across_frames_and_trailers_too() {
        let value = VALUE.as_bytes();
        let (a, b) = value.split_at(7);
        let mut trailers = HeaderMap::new();
        trailers.insert("x-echo", HeaderValue::from_static("sk-live-0123456789abcdef"));
        let inner = body(&[b"data: {\"k\":\"", a, b, b"\"}\n\n", b"done"], Some(trailers));
        let collected = RedactedBody::new(inner, &redactor()).collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap();
        let text = collected.to_bytes();
        let text = String::from_utf8_lossy(&text);
        assert_eq!(text, format!("data: {{\"k\":\"{PLACEHOLDER}\"}}\n\ndone"));
        assert_eq!(trailers["x-echo"], PLACEHOLDER);
    }

    // covers: E19
    #[tokio::test]
    async fn short_answers_are_read_whole_and_keep_a_length() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(WHOLE_MAX));
        assert!(whole_length(&h));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(WHOLE_MAX + 1));
        assert!(!whole_length(&h));
        assert!(!whole_length(&HeaderMap::new()));
        let value = VALUE.as_bytes();
        let inner = body(&[b"{\"echo\":\"", &value[..5], &value[5..], b"\"}"], None);
        let out = whole(inner, &redactor()).await.unwrap();
        assert_eq!(out, format!("{{\"echo\":\"{PLACEHOLDER}\"}}").as_bytes());
        let too_long = body(&[&vec![b'x'; 70_000]], None);
        assert!(whole(too_long, &redactor()).await.is_err());
    }

    // covers: E19
    #[test]
    fn headers_are_scrubbed_and_encoded_bodies_refused() {
        let r = redactor();
        let mut h = HeaderMap::new();
        h.insert(
            "www-authenticate",
            HeaderValue::from_str(&format!("bad key Bearer {VALUE}")).unwrap(),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        response_headers(&r, &mut h).unwrap();
        assert_eq!(h["www-authenticate"], format!("bad key {PLACEHOLDER}").as_str());
        assert!(h.get(header::CONTENT_LENGTH).is_none());
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(response_headers(&r, &mut h).is_err());
        let mut req = HeaderMap::new();
        req.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip, br"));
        req.insert(header::RANGE, HeaderValue::from_static("bytes=0-3"));
        req.insert(
            header::SEC_WEBSOCKET_EXTENSIONS,
            HeaderValue::from_static("permessage-deflate"),
        );
        prepare_request(&mut req);
        assert_eq!(req[header::ACCEPT_ENCODING], "identity");
        assert!(req.get(header::RANGE).is_none() && req.get(header::SEC_WEBSOCKET_EXTENSIONS).is_none());
    }

    /// Parse unmasked frames back into (opcode, fin, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, bool, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let (b0, b1) = (bytes[0], bytes[1]);
            let (len, head) = match b1 & 0x7f {
                126 => (usize::from(u16::from_be_bytes([bytes[2], bytes[3]])), 4),
                127 => (
                    usize::try_from(u64::from_be_bytes(bytes[2..10].try_into().unwrap())).unwrap(),
                    10,
                ),
                n => (usize::from(n), 2),
            };
            out.push((b0 & 0x0f, b0 & 0x80 != 0, bytes[head..head + len].to_vec()));
            bytes = &bytes[head + len..];
        }
        out
    }

    // covers: E19
    #[test]
    fn websocket_messages_are_scrubbed_whatever_the_framing() {
        let mut upstream = Vec::new();
        // A text message in three fragments with the value split across them, a ping quoting it, a
        // 70 000-byte binary message with it at the end, and a close frame quoting it.
        let value = VALUE.as_bytes();
        write_frame(&mut upstream, 0x1, false, b"echo: ");
        write_frame(&mut upstream, 0x0, false, &value[..10]);
        write_frame(&mut upstream, 0x9, true, value);
        write_frame(&mut upstream, 0x0, true, &value[10..]);
        let mut big = vec![b'x'; 70_000];
        big.extend_from_slice(value);
        write_frame(&mut upstream, 0x2, true, &big);
        let mut close = vec![0x03, 0xe8];
        close.extend_from_slice(value);
        write_frame(&mut upstream, 0x8, true, &close);
        for chunk in [1, 3, 64, 100_000] {
            let mut scrubber = WsScrubber::new(redactor());
            let mut out = Vec::new();
            for piece in upstream.chunks(chunk) {
                scrubber.feed(piece, &mut out).unwrap();
            }
            let got = frames(&out);
            let mut messages: Vec<(u8, Vec<u8>)> = Vec::new();
            let mut current: Option<(u8, Vec<u8>)> = None;
            for (op, fin, payload) in got {
                if op >= 0x8 {
                    messages.push((op, payload));
                    continue;
                }
                let m = current.get_or_insert((op, Vec::new()));
                m.1.extend_from_slice(&payload);
                if fin {
                    messages.push(current.take().unwrap());
                }
            }
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            assert_eq!(
                messages[0],
                (0x9, PLACEHOLDER.as_bytes().to_vec()),
                "chunk {chunk}"
            );
            assert_eq!(
                text(&messages[1].1),
                format!("echo: {PLACEHOLDER}"),
                "chunk {chunk}"
            );
            assert_eq!(messages[1].0, 0x1);
            assert_eq!(messages[2].0, 0x2);
            assert_eq!(messages[2].1.len(), 70_000 + PLACEHOLDER.len(), "chunk {chunk}");
            assert_eq!(messages[3].0, 0x8);
            assert_eq!(text(&messages[3].1[2..]), PLACEHOLDER, "chunk {chunk}");
            assert!(!text(&out).contains(VALUE), "chunk {chunk}");
        }
    }

    #[test]
    fn websocket_frames_that_cannot_be_read_close_the_stream() {
        for bad in [
            vec![0xc1, 0x01, b'x'],             // RSV1: permessage-deflate
            vec![0x81, 0x81, 0, 0, 0, 0, b'x'], // masked from the server
            vec![0x80, 0x01, b'x'],             // continuation without a message
            vec![0x09, 0x00],                   // fragmented control frame
        ] {
            let mut s = WsScrubber::new(redactor());
            assert!(s.feed(&bad, &mut Vec::new()).is_err(), "{bad:?}");
        }
    }
}
