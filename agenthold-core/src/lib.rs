//! Domain types and swappable traits of agenthold, with their default implementations.
//!
//! This crate owns everything that is true of agenthold independently of how packets move or containers
//! run: it performs no network I/O and depends on neither tokio networking, hyper nor bollard.
//!
//! - [`ids`]: identifier newtypes ([`AgentId`], [`SecretId`], …).
//! - [`policy`]: the network policy, its entry grammar (`github.com`, `*.npmjs.org`, `github.com:22`,
//!   `registry.example.com:*`, `203.0.113.0/24:443`), name normalisation, [`Destination`] and [`Verdict`],
//!   and the [`EgressPolicy`] trait with its default [`policy::PolicyTable`].
//! - [`template`]: the header template language (`{{.Value}}`, `base64`, `print`).
//! - [`secret`]: secret values, injection rules, presets, placeholders and the [`SecretInjector`] trait.
//! - [`vault`]: XChaCha20-Poly1305 encryption of secret values at rest under the master key.
//! - [`sandbox`]: [`SandboxSpec`] and the [`Sandbox`] runtime trait.
//! - [`authz`]: [`Principal`], [`Action`], [`Resource`] and the [`Authz`] trait.
//! - [`store`]: the durable key-value [`Store`] trait, on redb by default and on sled behind the `sled`
//!   feature.
//! - [`config`]: the one typed [`Config`], loaded from YAML with `AGENTHOLD_*` environment overrides.
//!
//! Every trait is object safe, so a platform passes `Arc<dyn Trait>` and swaps storage, the runtime, the
//! policy or the injector without forking.
// enforces: C2
#![forbid(unsafe_code)]

pub mod authz;
pub mod config;
mod error;
pub mod ids;
pub mod policy;
pub mod sandbox;
pub mod secret;
pub mod store;
pub mod template;
pub mod vault;

pub use authz::{Action, Authz, AuthzDecision, Credential, Principal, Resource};
pub use config::Config;
pub use error::{BoxError, Error, ErrorKind, Result};
pub use ids::{AgentId, SecretId, UserId, WorkspaceId};
pub use policy::{DenyReason, Destination, EgressPolicy, NetworkPolicy, PolicyEntry, PolicyMode, Verdict};
pub use sandbox::{Sandbox, SandboxSpec};
pub use secret::{SecretInjector, SecretRule, SecretValue};
pub use store::Store;
pub use template::Template;
pub use vault::{MasterKey, Vault};
