//! The library half of sandboxd: the [`contract`] between the runtime (`agenthold-sandbox`) and the sandboxd
//! binary, so that both sides read one definition of the paths, variables, command lines and tunnel wire
//! format. std only: the binary stays static with `nix` as its only dependency, and the runtime gets no
//! more than these definitions.
#![forbid(unsafe_code)]

pub mod contract;
