//! HTTP/1.x request heads (E4, E7): the Host header of plain HTTP, and the absolute-form and CONNECT
//! targets of the explicit proxy, parsed with `httparse` under stricter rules. Up to eight empty lines
//! before the request line are skipped (RFC 9112 §2.2), as hyper, which serves the connection afterwards,
//! skips them.
//!
//! Rules on top of httparse (each one closes a way for the gateway and the upstream to read a head
//! differently): lines end with CRLF only (a bare CR or a bare LF is `Invalid`); no NUL; no obs-fold
//! (a header line starting with a space or tab); the request line is at most 8 KiB and the head at most
//! [`MAX_HEAD_LEN`] with at most [`MAX_HEADERS`] headers; the target is ASCII without a fragment; exactly
//! one Host header, a valid `host[:port]`, required for origin- and asterisk-form targets; an absolute-form
//! (`http://` or `https://` only) or CONNECT target must name the same host as Host (ASCII case-insensitive)
//! and, when Host carries a port (or, for absolute-form, always), the same port. HTTP/2 prior knowledge
//! (`PRI * HTTP/2.0`) is `Invalid`.
//!
//! `NotThisProtocol` comes from the shape of the request line alone, as soon as it breaks it: a method (a
//! token of at most 24 bytes starting with an upper-case ASCII letter), a space, a target without spaces or
//! line breaks, a space, `HTTP/`. So an SSH banner (`SSH-2.0-OpenSSH_9.2p1 Debian-2`), IRC (`NICK x`) or
//! Redis (`SET k v`) go to the "other TCP" path instead of being refused as broken HTTP. A target longer
//! than the request line limit is `Invalid`.

use std::borrow::Cow;

use super::{Sniff, authority};

/// Longest request head accepted, the final empty line included.
pub const MAX_HEAD_LEN: usize = 64 * 1024;
/// Most header fields accepted in one head.
pub const MAX_HEADERS: usize = 100;
/// Most empty lines accepted before the request line.
const MAX_EMPTY_LINES: usize = 8;
/// Longest method token (registered methods have at most 17 characters).
const MAX_METHOD_LEN: usize = 24;
/// Longest request line, without its CRLF.
const MAX_REQUEST_LINE: usize = 8 * 1024;
/// What follows the target.
const VERSION_PREFIX: &[u8] = b"HTTP/";

/// The shape of a request target (RFC 9112 §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TargetForm {
    /// `/path?query`: the destination is in the Host header.
    Origin,
    /// `http://host:port/path`: sent to proxies; the destination is the URI's authority.
    Absolute,
    /// `host:port`: the target of CONNECT.
    Authority,
    /// `*`: `OPTIONS *`.
    Asterisk,
}

/// A parsed HTTP/1.x request head.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestHead {
    /// The method, as sent (`GET`, `CONNECT`, …).
    pub method: String,
    /// The request target, as sent (raw, not decoded).
    pub target: String,
    /// The shape of the target.
    pub form: TargetForm,
    /// The minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    /// The value of the one Host header (surrounding spaces and tabs removed), validated as `host[:port]`.
    /// `None` only for absolute-form and CONNECT targets, whose authority names the destination.
    pub host: Option<String>,
    /// Bytes of the head, its final empty line included: the body or the next request starts here.
    pub head_len: usize,
}

impl RequestHead {
    /// Host and port of the Host header (`default_port` when it names none); `None` without a Host header.
    #[must_use]
    pub fn host_port(&self, default_port: u16) -> Option<(String, u16)> {
        authority::split_host_port(self.host.as_deref()?, default_port).ok()
    }

    /// Host and port of an absolute-form target (the scheme's port when it names none: 80 for `http`, 443
    /// for `https`) or of a CONNECT target; `None` for origin- and asterisk-form targets.
    #[must_use]
    pub fn target_host_port(&self) -> Option<(String, u16)> {
        let (authority, default_port) = match self.form {
            TargetForm::Authority => (self.target.as_str(), 0),
            TargetForm::Absolute => {
                let (default_port, authority, _) = split_absolute(&self.target).ok()?;
                (authority, default_port)
            }
            TargetForm::Origin | TargetForm::Asterisk => return None,
        };
        authority::split_host_port(authority, default_port).ok()
    }

    /// Where the request is for: the target's authority when it has one (it agrees with Host, if any),
    /// else the Host header with `default_port`. Always `Some` for a head [`parse_request_head`] accepted.
    #[must_use]
    pub fn destination(&self, default_port: u16) -> Option<(String, u16)> {
        self.target_host_port().or_else(|| self.host_port(default_port))
    }

    /// The target in origin form, to forward upstream or log: the target itself for origin-form, the part
    /// after the authority for absolute-form (with a `/` in front when it has none: `http://h?q` gives
    /// `/?q`); `None` for CONNECT and `OPTIONS *`.
    #[must_use]
    pub fn path_and_query(&self) -> Option<Cow<'_, str>> {
        match self.form {
            TargetForm::Origin => Some(Cow::Borrowed(&self.target)),
            TargetForm::Absolute => match split_absolute(&self.target).ok()? {
                (_, _, path) if path.starts_with('/') => Some(Cow::Borrowed(path)),
                (_, _, path) => Some(Cow::Owned(format!("/{path}"))),
            },
            TargetForm::Authority | TargetForm::Asterisk => None,
        }
    }
}

/// Parses an HTTP/1.x request head from the bytes a connection has sent so far.
///
/// Call again with the longer buffer while it answers [`Sniff::NeedMore`]; bytes after
/// [`RequestHead::head_len`] are not looked at. Each call re-reads the head from its start (at most
/// [`MAX_HEAD_LEN`] bytes): a caller reading many small segments should call again only once the new bytes
/// contain a `\n` (a head cannot complete otherwise).
pub fn parse_request_head(buf: &[u8]) -> Sniff<RequestHead> {
    // RFC 9112 §2.2: a server ignores empty lines before the request line (hyper does), so they are
    // accepted here too, a bounded number of them.
    let mut skip = 0;
    while buf.get(skip..skip + 2) == Some(b"\r\n") {
        skip += 2;
        if skip > 2 * MAX_EMPTY_LINES {
            return Sniff::Invalid("too many empty lines before the request line");
        }
    }
    let rest = buf.get(skip..).unwrap_or_default();
    if rest.is_empty() || rest == b"\r" {
        return Sniff::NeedMore;
    }
    match parse_head(rest) {
        Sniff::Done(mut head) => {
            head.head_len += skip;
            Sniff::Done(head)
        }
        other => other,
    }
}

/// [`parse_request_head`] without the leading empty lines.
fn parse_head(buf: &[u8]) -> Sniff<RequestHead> {
    match request_line_shape(buf) {
        Sniff::Done(()) => {}
        Sniff::NeedMore => return Sniff::NeedMore,
        Sniff::NotThisProtocol => return Sniff::NotThisProtocol,
        Sniff::Invalid(problem) => return Sniff::Invalid(problem),
    }
    let capped = buf.get(..MAX_HEAD_LEN).unwrap_or(buf);
    let (region_end, issue) = match scan(capped) {
        Scan::End(end) | Scan::Incomplete(end) => (end, None),
        Scan::Issue(at, problem) => (at, Some(problem)),
    };
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(capped.get(..region_end).unwrap_or(capped)) {
        Err(error) => Sniff::Invalid(httparse_problem(error)),
        Ok(httparse::Status::Complete(head_len)) => match build(&request, head_len) {
            Ok(head) => Sniff::Done(head),
            Err(problem) => Sniff::Invalid(problem),
        },
        Ok(httparse::Status::Partial) => match issue {
            Some(problem) => Sniff::Invalid(problem),
            None if buf.len() > MAX_HEAD_LEN => Sniff::Invalid("request head longer than 64 KiB"),
            None => Sniff::NeedMore,
        },
    }
}

/// Whether the bytes start like `METHOD SP target SP HTTP/` (`Done`), could still (`NeedMore`), or cannot.
/// Only the bytes that make this shape are judged here; everything else is for [`scan`] and httparse.
fn request_line_shape(buf: &[u8]) -> Sniff<()> {
    match buf.first() {
        None => return Sniff::NeedMore,
        Some(b) if !b.is_ascii_uppercase() => return Sniff::NotThisProtocol,
        Some(_) => {}
    }
    let Some(method_len) = buf.iter().take(MAX_METHOD_LEN + 1).position(|&b| !is_token(b)) else {
        return if buf.len() > MAX_METHOD_LEN {
            Sniff::NotThisProtocol
        } else {
            Sniff::NeedMore
        };
    };
    if buf.get(method_len) != Some(&b' ') {
        return Sniff::NotThisProtocol;
    }
    let target_start = method_len + 1;
    for (at, &b) in buf.iter().enumerate().skip(target_start) {
        match b {
            b' ' if at == target_start => return Sniff::NotThisProtocol,
            b' ' => {
                let version = buf.get(at + 1..).unwrap_or_default();
                let version = version.get(..VERSION_PREFIX.len()).unwrap_or(version);
                return if !VERSION_PREFIX.starts_with(version) {
                    Sniff::NotThisProtocol
                } else if version.len() < VERSION_PREFIX.len() {
                    Sniff::NeedMore
                } else {
                    Sniff::Done(())
                };
            }
            b'\r' | b'\n' => return Sniff::NotThisProtocol,
            _ if at > MAX_REQUEST_LINE => return Sniff::Invalid("request line longer than 8 KiB"),
            _ => {}
        }
    }
    Sniff::NeedMore
}

/// A token character (RFC 9110 §5.6.2).
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The outcome of the line scan that runs before httparse.
enum Scan {
    /// The head ends here (just after its empty line).
    End(usize),
    /// The first byte that breaks a line rule, and which rule.
    Issue(usize, &'static str),
    /// No end yet; httparse may look at the bytes before this offset (a final CR waits for its LF).
    Incomplete(usize),
}

/// Finds, in stream order, the end of the head or the first byte that breaks the line rules. httparse then
/// only sees the bytes before that point, so that whichever rule a head breaks first decides, for a prefix
/// as for the whole.
fn scan(head: &[u8]) -> Scan {
    let mut line_start = 0;
    let mut in_request_line = true;
    let mut previous = 0_u8;
    for (at, &b) in head.iter().enumerate() {
        match b {
            0 => return Scan::Issue(at, "NUL byte in request head"),
            b'\r' => match head.get(at + 1) {
                Some(b'\n') => {}
                Some(_) => return Scan::Issue(at, "CR not followed by LF in request head"),
                None => return Scan::Incomplete(at),
            },
            b'\n' if previous != b'\r' => return Scan::Issue(at, "LF without CR in request head"),
            b'\n' => {
                if at + 1 - line_start == 2 && !in_request_line {
                    return Scan::End(at + 1);
                }
                in_request_line = false;
                line_start = at + 1;
                if let Some(b' ' | b'\t') = head.get(at + 1) {
                    return Scan::Issue(
                        at + 1,
                        "header line folded (obs-fold) or starting with whitespace",
                    );
                }
            }
            _ => {}
        }
        if in_request_line && at > MAX_REQUEST_LINE {
            return Scan::Issue(at, "request line longer than 8 KiB");
        }
        previous = b;
    }
    Scan::Incomplete(head.len())
}

/// The head's fields and the Host rules, once httparse has a complete head.
fn build(request: &httparse::Request<'_, '_>, head_len: usize) -> Result<RequestHead, &'static str> {
    let (Some(method), Some(target), Some(version)) = (request.method, request.path, request.version) else {
        return Err("incomplete request line");
    };
    if !target.is_ascii() {
        return Err("non-ASCII byte in request target");
    }
    if target.contains('#') {
        return Err("fragment in request target");
    }
    let mut host = None;
    for header in request.headers.iter() {
        if header.name.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return Err("several Host headers");
            }
            let value = std::str::from_utf8(header.value).map_err(|_| "Host header is not ASCII")?;
            host = Some(value.trim_matches([' ', '\t']));
        }
    }
    let host_parts = host.map(authority::split_parsed).transpose()?;
    let form = if method == "CONNECT" {
        let (target_host, target_port) = authority::split_parsed(target)?;
        let target_port = target_port.ok_or("CONNECT target without a port")?;
        if let Some((host, port)) = host_parts
            && (!host.eq_ignore_ascii_case(target_host) || port.is_some_and(|port| port != target_port))
        {
            return Err("Host header disagrees with the CONNECT target");
        }
        TargetForm::Authority
    } else if target == "*" {
        if method != "OPTIONS" {
            return Err("asterisk-form target with a method other than OPTIONS");
        }
        TargetForm::Asterisk
    } else if target.starts_with('/') {
        TargetForm::Origin
    } else {
        let (default_port, authority, _) = split_absolute(target)?;
        let (target_host, target_port) = authority::split_parsed(authority)?;
        let target_port = target_port.unwrap_or(default_port);
        if let Some((host, port)) = host_parts
            && (!host.eq_ignore_ascii_case(target_host) || port.unwrap_or(default_port) != target_port)
        {
            return Err("Host header disagrees with the absolute-form target");
        }
        TargetForm::Absolute
    };
    if host.is_none() && matches!(form, TargetForm::Origin | TargetForm::Asterisk) {
        return Err("request without a Host header");
    }
    Ok(RequestHead {
        method: method.to_owned(),
        target: target.to_owned(),
        form,
        version,
        host: host.map(str::to_owned),
        head_len,
    })
}

/// The scheme's default port, the authority and the path-and-query of an absolute-form target.
fn split_absolute(target: &str) -> Result<(u16, &str, &str), &'static str> {
    let (scheme, rest) = target
        .split_once("://")
        .ok_or("request target is neither origin-form nor absolute-form")?;
    let default_port = if scheme.eq_ignore_ascii_case("http") {
        80
    } else if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        return Err("absolute-form target with a scheme other than http or https");
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at_checked(end).ok_or("request target is not ASCII")?;
    Ok((default_port, authority, path))
}

/// A fixed description of an httparse error.
fn httparse_problem(error: httparse::Error) -> &'static str {
    match error {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status",
        httparse::Error::Token => "invalid method or request target",
        httparse::Error::TooManyHeaders => "more than 100 headers",
        httparse::Error::Version => "not HTTP/1.0 or HTTP/1.1",
    }
}

#[cfg(test)]
mod tests;
