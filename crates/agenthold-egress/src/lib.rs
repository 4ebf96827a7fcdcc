//! The egress gateway (E3–E9, E13–E16), usable without Docker.
//!
//! It will own: the address guard (which upstream addresses may ever be dialled), the DNS resolver that
//! answers sandboxes (NXDOMAIN for names the policy refuses, rebinding defence), the transparent proxy
//! (SO_ORIGINAL_DST, decisions by SNI, `Host` or resolved name) and the explicit proxy (CONNECT and
//! absolute-form HTTP), TLS interception with the installation's CA for hosts with a secret rule, header
//! injection on HTTP/1.1 and HTTP/2 streams, the request log, the nftables rules of the gateway namespace and
//! the helper that opens sockets inside another network namespace. Entry point: `Gateway::builder()`.
#![forbid(unsafe_code)]
