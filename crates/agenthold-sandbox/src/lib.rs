//! Sandboxes wired to the egress gateway (E1, E2, E12, E14, S1, S2, S4, S12, P1).
//!
//! It will own: the Docker runtime over bollard, per-agent internal networks and volumes, the gateway's
//! network namespace, `sandboxd` (tunnel client, CA install, gateway holder), the tunnel server, image builds
//! without a registry, and `Runtime`: the embeddable composition of a sandbox runtime, the gateway, a secret
//! injector and a store that the server and the Python bindings share.
#![forbid(unsafe_code)]
