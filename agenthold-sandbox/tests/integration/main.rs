//! Docker end-to-end tests of `agenthold-sandbox` (ARCHITECTURE.md §4.3 and §4.4): real `agenthold/dev`
//! containers whose only way out is the gateway, attacked from inside.
//!
//! Every test needs root and a running Docker engine (`make test` provides both) and uses its own data
//! directory, hence its own gateway holder; everything a test creates is removed, also when it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs, unreachable_pub)]

mod at_rest;
mod attacks;
mod egress;
mod engine;
mod files;
mod gateway;
mod gvisor;
mod labels;
mod leaks;
mod lifecycle;
mod live_secrets;
mod messages;
mod pool;
mod probe;
mod reconcile;
mod regressions;
mod support;
mod terminal;
mod tunnel;
