//! Benchmarks of agenthold against direct connections, measured side by side in one run
//! (ARCHITECTURE §5). Never shipped.
//!
//! The library holds what every bench target shares; the targets under `benches/` are plain binaries
//! (`harness = false`) that print a table and write JSON next to it:
//!
//! - [`setup`]: the namespaces, nftables rules, gateway and upstreams, built like the integration tests.
//! - [`upstream`]: lean HTTP/1.1 (plain and TLS) and DNS servers answering on every route.
//! - [`load`]: load generators in Rust (new TLS connections, keep-alive HTTP, DNS), run inside a namespace.
//! - [`tools`]: the reference tools, `curl` and `wrk`, run inside a namespace.
//! - [`cpu`]: CPU time per named thread group (gateway, upstream) over a run.
//! - [`proxy`]: reference forwarders (userspace copy, splice(2)) for the splice experiment.
//! - [`report`]: medians, ratios, the table and the JSON.
//! - [`tls_load`]: HTTPS keep-alive and sequential-latency clients (the interception benchmark).
//! - [`mitm`]: mitmproxy's `mitmdump` as the reference interceptor.
//! - [`nginx`]: nginx as a realistic HTTPS upstream.
//! - [`table`]: a plain Markdown table for targets whose columns are not the three routes.
//! - [`docker_events`]: the Docker engine's event stream as a timeline (the sandbox start benchmark).
//! - [`dns_cache`]: dnsmasq as the reference DNS cache, and a DNS load whose names never repeat.
//! - [`harness`]: `main`, the short mode, waiting for a quiet machine, and `target/`, the same for every
//!   target.
//! - [`soak`]: the soak benchmark's load process (its connections and upstream, outside the gateway's
//!   process).
//! - [`plot`]: SVG plots of the benchmarks' JSON files (the `report` target).
//!
//! See `docs/benchmarks.md` for what each number means and the latest results.
#![forbid(unsafe_code)]

pub mod cpu;
pub mod dns_cache;
pub mod docker_events;
pub mod harness;
pub mod load;
pub mod mitm;
pub mod nginx;
pub mod plot;
pub mod proxy;
pub mod report;
pub mod setup;
pub mod soak;
pub mod table;
pub mod tls_load;
pub mod tools;
pub mod upstream;
