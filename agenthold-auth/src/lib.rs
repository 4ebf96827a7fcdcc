//! Users, workspaces and who may do what (S5–S7, S13, P4).
//!
//! This crate owns the server's identity and permission state, kept in the core [`Store`](agenthold_core::Store):
//!
//! - **Users** ([`User`]): display name, optional email, the login provider and its subject; never a password.
//! - **Workspaces** with **members**, one [`WorkspaceRole`] each, and **agent grants**, one [`AgentRole`] per
//!   (agent, member). A workspace always keeps at least one owner.
//! - **Credentials**: personal API tokens (`ahp_…`), browser sessions, and the one-time local admin login link.
//! - The **audit log** of each workspace, newest first, paginated by cursor.
//! - [`RoleAuthz`], the default [`Authz`](agenthold_core::Authz) over those tables, and [`RateLimits`].
//!
//! # Roles
//!
//! | workspace role | may |
//! |---|---|
//! | [`Owner`](WorkspaceRole::Owner) | everything an admin may, plus delete the workspace and make or unmake owners ([`Action::Own`](agenthold_core::Action::Own)) |
//! | [`Admin`](WorkspaceRole::Admin) | members, secrets, and every agent of the workspace as its agent admin |
//! | [`Member`](WorkspaceRole::Member) | see the workspace, create agents; sees only agents granted to them |
//!
//! | agent role | may |
//! |---|---|
//! | [`Admin`](AgentRole::Admin) | settings, policy, secrets, grants (the creator of an agent is its admin) |
//! | [`Operator`](AgentRole::Operator) | exec, runs, terminal, file writes, start and stop |
//! | [`Viewer`](AgentRole::Viewer) | status, output, request log, file reads |
//!
//! A caller who is not a member of the workspace, or a member with no role on the agent, is answered
//! [`AuthzDecision::NotFound`](agenthold_core::AuthzDecision::NotFound), exactly as for an id that does not
//! exist; a member whose role is too small gets `Forbidden`. See [`RoleAuthz`] for the full table.
//!
//! # Secrets at rest
//!
//! Token, session cookie and login link values are 256 bits from the operating system's generator, encoded
//! base64url without padding (tokens carry the `ahp_` prefix so secret scanners find leaked ones). They are
//! shown once and never stored: the store keeps only their SHA-256 (hex) as the record's key, so a presented
//! value is checked by hashing it and looking the hash up, never by comparing strings. A presented value
//! that is not well-formed is refused without touching the store. A slow hash would add nothing: 256-bit
//! random values cannot be guessed.
//!
//! Every write is durable when the call returns; changes that touch several keys go through one
//! [`Store::batch`](agenthold_core::Store::batch), so a crash never leaves half of one.
#![forbid(unsafe_code)]

mod authz;
mod config;
mod directory;
mod error;
mod lock;
mod model;
mod opaque;
mod ratelimit;
#[cfg(test)]
mod tests;

pub use authz::RoleAuthz;
pub use config::AuthConfig;
pub use directory::{
    AttemptRefusal, AttemptValues, BoundInvitation, Directory, LOGIN_ATTEMPT_SECS, LoginAttempt,
    NewLoginAttempt, NewPendingMember, PENDING_PREFIX, PendingMember,
};
pub use error::{Error, Result};
pub use model::{
    AgentRole, AuditEntry, Grant, Membership, NewAuditEntry, NewUser, TokenInfo, User, Workspace,
    WorkspaceRole,
};
pub use ratelimit::RateLimits;
