//! [`RoleAuthz`]: the default [`Authz`], over the directory's workspace roles and agent grants (S5).
// enforces: S5

use std::sync::Arc;

use agenthold_core::authz::{Action, Authz, AuthzDecision, Credential, Principal, Resource};

use crate::directory::Directory;
use crate::model::{AgentRole, WorkspaceRole};

/// Answers authorization questions from the [`Directory`].
///
/// | resource | not allowed to know it exists | `View` | `CreateAgent` | `Operate` | `Administer` | `Own` | `CreateToken` |
/// |---|---|---|---|---|---|---|---|
/// | `Account` | — | allow | allow | allow | allow | allow | browser session only |
/// | `Workspace` | not a member (or no such workspace): `NotFound` | member | member | admin, owner | admin, owner | owner | `Forbidden` |
/// | `Agent` | not a member, agent not in that workspace, or no role on it ([`Directory::agent_role`]): `NotFound` | viewer+ | `Forbidden` | operator+ | admin | admin | `Forbidden` |
///
/// Anything not allowed by the table is `Forbidden` (including actions and resources added to core later),
/// once the caller may know the resource exists.
#[derive(Debug, Clone)]
pub struct RoleAuthz {
    dir: Arc<Directory>,
}

impl RoleAuthz {
    /// Decisions from `dir`.
    #[must_use]
    pub fn new(dir: Arc<Directory>) -> Self {
        Self { dir }
    }
}

#[async_trait::async_trait]
impl Authz for RoleAuthz {
    async fn check(
        &self,
        who: &Principal,
        action: Action,
        on: &Resource,
    ) -> agenthold_core::Result<AuthzDecision> {
        let decision = match on {
            Resource::Account => on_account(who.credential, action),
            Resource::Workspace(ws) => on_workspace(self.dir.member_role(ws, &who.user).await?, action),
            Resource::Agent { workspace, agent } => {
                on_agent(self.dir.agent_role(workspace, agent, &who.user).await?, action)
            }
            _ => AuthzDecision::Forbidden,
        };
        tracing::trace!(user = %who.user, ?action, ?on, ?decision, "authz");
        Ok(decision)
    }
}

/// The caller's own account: everything, except that tokens are made only from a browser session (S7).
pub(crate) fn on_account(credential: Credential, action: Action) -> AuthzDecision {
    match (action, credential) {
        (Action::CreateToken, Credential::Session) => AuthzDecision::Allow,
        (Action::CreateToken, _) => AuthzDecision::Forbidden,
        _ => AuthzDecision::Allow,
    }
}

/// A workspace, for a caller with `role` in it (`None`: not a member).
pub(crate) fn on_workspace(role: Option<WorkspaceRole>, action: Action) -> AuthzDecision {
    let Some(role) = role else {
        return AuthzDecision::NotFound;
    };
    let needed = match action {
        Action::View | Action::CreateAgent => WorkspaceRole::Member,
        Action::Operate | Action::Administer => WorkspaceRole::Admin,
        Action::Own => WorkspaceRole::Owner,
        _ => return AuthzDecision::Forbidden,
    };
    allow_if(role >= needed)
}

/// An agent, for a caller with `role` on it (`None`: not a member, no such agent there, or no grant).
pub(crate) fn on_agent(role: Option<AgentRole>, action: Action) -> AuthzDecision {
    let Some(role) = role else {
        return AuthzDecision::NotFound;
    };
    let needed = match action {
        Action::View => AgentRole::Viewer,
        Action::Operate => AgentRole::Operator,
        Action::Administer | Action::Own => AgentRole::Admin,
        _ => return AuthzDecision::Forbidden,
    };
    allow_if(role >= needed)
}

fn allow_if(allowed: bool) -> AuthzDecision {
    if allowed {
        AuthzDecision::Allow
    } else {
        AuthzDecision::Forbidden
    }
}
