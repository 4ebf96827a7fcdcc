//! Plain data types of the directory: users, workspaces, memberships, grants, token metadata and audit
//! entries. They serialise as JSON (the store's record format and the API's).

use agenthold_core::authz::Credential;
use agenthold_core::{AgentId, UserId, WorkspaceId};
use serde::{Deserialize, Serialize};

/// A member's role in a workspace. Ordered by power: `Member < Admin < Owner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceRole {
    /// Sees the workspace, creates agents, sees only the agents granted to them.
    Member,
    /// Manages members and secrets; agent admin of every agent of the workspace.
    Admin,
    /// Everything an admin may, plus deleting the workspace and making or unmaking owners.
    Owner,
}

/// A member's role on one agent. Ordered by power: `Viewer < Operator < Admin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentRole {
    /// Status, output, request log, file reads.
    Viewer,
    /// Exec, runs, terminal, file writes, start and stop.
    Operator,
    /// Settings, policy, secrets, grants.
    Admin,
}

/// A user: who logged in, through which provider. Never holds a password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// The user's id.
    pub id: UserId,
    /// Display name.
    pub name: String,
    /// Email address, when the provider gave one.
    pub email: Option<String>,
    /// The login provider (`local`, `github`, an OIDC provider's name).
    pub provider: String,
    /// The provider's subject (its stable id for the user), when there is one.
    pub subject: Option<String>,
    /// When the user was created (RFC 3339, UTC).
    pub created_at: String,
}

/// What [`Directory::create_user`](crate::Directory::create_user) needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewUser {
    /// Display name: 1 to 100 characters, no control characters.
    pub name: String,
    /// Email address: contains `@`, at most 254 characters.
    pub email: Option<String>,
    /// The login provider: 1 to 64 characters of `a-z`, `0-9`, `_` and `-`.
    pub provider: String,
    /// The provider's subject; one user per (provider, subject).
    pub subject: Option<String>,
}

/// A workspace: the unit of membership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workspace {
    /// The workspace's id.
    pub id: WorkspaceId,
    /// Display name.
    pub name: String,
    /// When the workspace was created (RFC 3339, UTC).
    pub created_at: String,
}

/// One user's membership of one workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    /// The workspace.
    pub workspace: WorkspaceId,
    /// The member.
    pub user: UserId,
    /// Their role.
    pub role: WorkspaceRole,
}

/// One member's role on one agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The agent's workspace.
    pub workspace: WorkspaceId,
    /// The agent.
    pub agent: AgentId,
    /// The member granted.
    pub user: UserId,
    /// Their role on the agent.
    pub role: AgentRole,
}

/// What is known about a personal API token, without the token itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    /// The token's id (for listing and revoking; not the secret).
    pub id: String,
    /// Its owner.
    pub user: UserId,
    /// The name its owner gave it.
    pub name: String,
    /// The first 8 characters of the token after `ahp_`, so its owner can recognise it.
    pub prefix: String,
    /// When it was created (RFC 3339, UTC).
    pub created_at: String,
    /// When it stops working, if ever (RFC 3339, UTC).
    pub expires_at: Option<String>,
    /// When it was last used (RFC 3339, UTC; updated at most once a minute).
    pub last_used_at: Option<String>,
}

/// One entry of a workspace's audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// The entry's id: its sequence number in the workspace, zero-padded to 20 digits, so ids sort like
    /// numbers. Monotonic per workspace.
    pub id: String,
    /// When it was recorded (RFC 3339, UTC).
    pub time: String,
    /// The workspace.
    pub workspace: WorkspaceId,
    /// Who acted, when known.
    pub actor: Option<UserId>,
    /// How they authenticated, when known.
    pub credential: Option<Credential>,
    /// What was done (`agent.create`, `member.set`, …).
    pub action: String,
    /// What it was done to.
    pub target: String,
    /// `ok`, `denied` or `failed`.
    pub result: String,
    /// Why, for a refusal or failure.
    pub reason: Option<String>,
}

/// What [`Directory::audit`](crate::Directory::audit) records; the id and time are added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewAuditEntry {
    /// The workspace.
    pub workspace: WorkspaceId,
    /// Who acted, when known.
    pub actor: Option<UserId>,
    /// How they authenticated, when known.
    pub credential: Option<Credential>,
    /// What was done: 1 to 100 characters, no control characters.
    pub action: String,
    /// What it was done to (control characters are replaced, long values cut).
    pub target: String,
    /// `ok`, `denied` or `failed`.
    pub result: String,
    /// Why, for a refusal or failure (control characters are replaced, long values cut).
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_by_power() {
        assert!(WorkspaceRole::Member < WorkspaceRole::Admin);
        assert!(WorkspaceRole::Admin < WorkspaceRole::Owner);
        assert!(AgentRole::Viewer < AgentRole::Operator);
        assert!(AgentRole::Operator < AgentRole::Admin);
        let mut roles = vec![WorkspaceRole::Owner, WorkspaceRole::Member, WorkspaceRole::Admin];
        roles.sort();
        assert_eq!(
            roles,
            [WorkspaceRole::Member, WorkspaceRole::Admin, WorkspaceRole::Owner]
        );
    }

    #[test]
    fn roles_serialise_as_snake_case() -> serde_json::Result<()> {
        assert_eq!(
            serde_json::to_string(&[WorkspaceRole::Owner, WorkspaceRole::Admin, WorkspaceRole::Member])?,
            r#"["owner","admin","member"]"#
        );
        assert_eq!(
            serde_json::to_string(&[AgentRole::Admin, AgentRole::Operator, AgentRole::Viewer])?,
            r#"["admin","operator","viewer"]"#
        );
        let role: AgentRole = serde_json::from_str(r#""operator""#)?;
        assert_eq!(role, AgentRole::Operator);
        assert!(serde_json::from_str::<WorkspaceRole>(r#""Owner""#).is_err());
        Ok(())
    }
}
