//! Authorization vocabulary: who ([`Principal`]) wants to do what ([`Action`]) to which thing
//! ([`Resource`]), and the [`Authz`] trait that answers. The default implementation (workspace role tables
//! and agent grants) lives in `agenthold-auth`.

use crate::error::Result;
use crate::ids::{AgentId, UserId, WorkspaceId};

/// How a principal authenticated; some actions need a browser session (S3, S7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Credential {
    /// A browser session cookie.
    Session,
    /// A personal API token.
    Token,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Principal {
    /// The user acting.
    pub user: UserId,
    /// How they authenticated.
    pub credential: Credential,
}

/// Something a principal may try to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Action {
    /// See a workspace or agent and its metadata.
    View,
    /// Run commands, send prompts, read and write files (operator).
    Operate,
    /// Change settings, policy, secrets and grants (admin).
    Administer,
    /// Create an agent in a workspace.
    CreateAgent,
    /// Create a personal API token (needs a browser session).
    CreateToken,
    /// Owner-only workspace changes: delete the workspace, make or unmake owners.
    Own,
}

/// The thing acted on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Resource {
    /// A workspace.
    Workspace(WorkspaceId),
    /// An agent inside a workspace.
    Agent {
        /// The agent's workspace.
        workspace: WorkspaceId,
        /// The agent.
        agent: AgentId,
    },
    /// The caller's own account (tokens, logins).
    Account,
}

/// The answer to an authorization question.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthzDecision {
    /// Go ahead.
    Allow,
    /// The principal is not a member: answer as if the resource did not exist (404).
    NotFound,
    /// The principal is a member without the needed role (403).
    Forbidden,
}

/// Decides whether a principal may perform an action on a resource.
///
/// Contract: non-members of the resource's workspace get [`AuthzDecision::NotFound`], members without the
/// needed role [`AuthzDecision::Forbidden`]; every request handler asks before acting (S5).
#[async_trait::async_trait]
pub trait Authz: Send + Sync {
    /// Decide.
    async fn check(&self, who: &Principal, action: Action, on: &Resource) -> Result<AuthzDecision>;
}
