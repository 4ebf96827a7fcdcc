//! Parsers of the first bytes a sandbox sends (E4, E7): the TLS ClientHello (for its SNI and ALPN), HTTP/1.x
//! request heads (for Host, absolute-form and CONNECT targets) and `host:port` authorities.
//!
//! Every input here comes from an untrusted sandbox, so every parser is incremental and pure: call it with
//! everything received so far; it answers [`Sniff::NeedMore`] until it can decide, then the answer never
//! changes when more bytes arrive (a decision only depends on the bytes it covers). Inputs are capped
//! (64 KiB), nothing panics, nothing allocates per input byte, and the work per call is linear in the
//! capped input. The parsers never normalise names: the caller does that once with
//! [`agenthold_core::policy::normalize_name`].
//!
//! The caller's order: [`classify`] on the first bytes, then [`parse_client_hello`] or
//! [`parse_request_head`]. Only [`Protocol::Other`] from `classify` means "other TCP" (decided by the name
//! the agent resolved for the address); once the bytes look like TLS or HTTP, whatever the strict parser
//! does not accept is refused (E23).

mod authority;
mod classify;
mod http;
mod tls;

#[cfg(test)]
mod invariants;
#[cfg(test)]
mod regressions;

pub use authority::split_host_port;
pub use classify::{MAX_CLASSIFY, classify};
pub use http::{MAX_HEAD_LEN, MAX_HEADERS, RequestHead, TargetForm, parse_request_head};
pub use tls::{ClientHello, MAX_HANDSHAKE_LEN, MAX_RECORDS, parse_client_hello};

/// The answer of an incremental parser for the bytes received so far.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Sniff<T> {
    /// The bytes so far are a valid beginning: call again with more.
    NeedMore,
    /// Parsed. Bytes after the parsed part (see the value's length field) are not looked at.
    Done(T),
    /// The bytes cannot start this protocol: let another parser (or the "other TCP" path) have them.
    NotThisProtocol,
    /// The bytes start this protocol but break its rules or our limits: refuse the connection.
    Invalid(&'static str),
}

/// What the first bytes of a connection are, as [`classify`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// First byte 0x16 (a TLS handshake record): parse with [`parse_client_hello`]; anything it does not
    /// accept is refused.
    Tls,
    /// Something a lenient HTTP server could read as a request: parse with [`parse_request_head`]; anything
    /// it does not accept is refused (never spliced as other TCP).
    Http,
    /// Neither: decide by the name the agent resolved for the destination address.
    Other,
    /// Not enough bytes to tell yet.
    NeedMore,
}
