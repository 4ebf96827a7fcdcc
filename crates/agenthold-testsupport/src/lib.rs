//! Shared helpers for agenthold's integration tests: loopback upstream servers, a DNS server, network
//! namespaces and privilege checks. Never shipped.
#![forbid(unsafe_code)]
