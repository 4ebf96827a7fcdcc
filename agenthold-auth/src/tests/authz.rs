//! The authorization table of `RoleAuthz`, checked against the directory for every kind of caller, every
//! action and every kind of resource.

use std::sync::Arc;

use agenthold_core::authz::{Action, Authz, AuthzDecision, Credential, Principal, Resource};
use agenthold_core::{AgentId, UserId, WorkspaceId};

use super::{Env, TestResult};
use crate::authz::RoleAuthz;
use crate::model::{AgentRole, WorkspaceRole};

/// The actions, in the column order of the tables below.
const ACTIONS: [Action; 6] = [
    Action::View,
    Action::Operate,
    Action::Administer,
    Action::CreateAgent,
    Action::CreateToken,
    Action::Own,
];

/// One row per caller kind: its workspace role, its grant on the agent, then the expected decisions on the
/// workspace and on the agent, one letter per action of [`ACTIONS`] (A allow, F forbidden, N not found).
type Row = (
    &'static str,
    Option<WorkspaceRole>,
    Option<AgentRole>,
    &'static str,
    &'static str,
);

const MEMBER: Option<WorkspaceRole> = Some(WorkspaceRole::Member);

// Columns of the last two: View, Operate, Administer, CreateAgent, CreateToken, Own.
#[rustfmt::skip]
const TABLE: [Row; 7] = [
    // kind                   member                        grant                      workspace agent
    ("non-member",            None,                         None,                      "NNNNNN", "NNNNNN"),
    ("member without grant",  MEMBER,                       None,                      "AFFAFF", "NNNNNN"),
    ("viewer",                MEMBER,                       Some(AgentRole::Viewer),   "AFFAFF", "AFFFFF"),
    ("operator",              MEMBER,                       Some(AgentRole::Operator), "AFFAFF", "AAFFFF"),
    ("agent admin",           MEMBER,                       Some(AgentRole::Admin),    "AFFAFF", "AAAFFA"),
    ("workspace admin",       Some(WorkspaceRole::Admin),   None,                      "AAAAFF", "AAAFFA"),
    ("owner",                 Some(WorkspaceRole::Owner),   None,                      "AAAAFA", "AAAFFA"),
];

fn decision(letter: u8) -> AuthzDecision {
    match letter {
        b'A' => AuthzDecision::Allow,
        b'F' => AuthzDecision::Forbidden,
        _ => AuthzDecision::NotFound,
    }
}

fn principal(user: &UserId, credential: Credential) -> Principal {
    Principal {
        user: user.clone(),
        credential,
    }
}

// covers: S5, S7
#[tokio::test]
async fn every_caller_kind_gets_the_table_for_every_action_and_resource() -> TestResult {
    let env = Env::new()?;
    let authz: Arc<dyn Authz> = Arc::new(RoleAuthz::new(env.dir.clone()));
    let creator = env.user("creator").await?;
    let ws = env.dir.create_workspace("w", &creator).await?.id;
    let agent = AgentId::new("target")?;
    env.dir.register_agent(&ws, &agent, &creator).await?;
    // An agent of another workspace where everyone of the table is an owner: asked for through `ws`, it is
    // not there.
    let ws2 = env.dir.create_workspace("w2", &creator).await?.id;
    let foreign = AgentId::new("foreign")?;
    env.dir.register_agent(&ws2, &foreign, &creator).await?;

    let mut checked = 0;
    for (kind, member, grant, workspace_letters, agent_letters) in TABLE {
        let user = env.user(kind).await?;
        if let Some(role) = member {
            env.dir.set_member(&ws, &user, role).await?;
        }
        if let Some(role) = grant {
            env.dir.set_grant(&ws, &agent, &user, role).await?;
        }
        env.dir.set_member(&ws2, &user, WorkspaceRole::Owner).await?;
        for credential in [Credential::Session, Credential::Token] {
            let who = principal(&user, credential);
            for (i, action) in ACTIONS.into_iter().enumerate() {
                let on_ws = authz
                    .check(&who, action, &Resource::Workspace(ws.clone()))
                    .await?;
                assert_eq!(
                    on_ws,
                    decision(workspace_letters.as_bytes()[i]),
                    "{} {action:?} on workspace",
                    kind
                );
                let on_agent = Resource::Agent {
                    workspace: ws.clone(),
                    agent: agent.clone(),
                };
                let got = authz.check(&who, action, &on_agent).await?;
                assert_eq!(
                    got,
                    decision(agent_letters.as_bytes()[i]),
                    "{} {action:?} on agent",
                    kind
                );
                // Indistinguishable from ids that do not exist (S5).
                for missing in [
                    Resource::Agent {
                        workspace: ws.clone(),
                        agent: foreign.clone(),
                    },
                    Resource::Agent {
                        workspace: ws.clone(),
                        agent: AgentId::new("no-such-agent")?,
                    },
                    Resource::Agent {
                        workspace: WorkspaceId::random(),
                        agent: agent.clone(),
                    },
                    Resource::Workspace(WorkspaceId::random()),
                ] {
                    let got = authz.check(&who, action, &missing).await?;
                    assert_eq!(got, AuthzDecision::NotFound, "{} {action:?} on {missing:?}", kind);
                }
                // The own account: everything, but tokens only from a browser session (S7).
                let on_account = authz.check(&who, action, &Resource::Account).await?;
                let want = if action == Action::CreateToken && credential == Credential::Token {
                    AuthzDecision::Forbidden
                } else {
                    AuthzDecision::Allow
                };
                assert_eq!(
                    on_account, want,
                    "{} {action:?} on account with {credential:?}",
                    kind
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, TABLE.len() * 2 * ACTIONS.len());
    Ok(())
}

// covers: S5
#[tokio::test]
async fn losing_membership_or_grant_turns_answers_into_not_found() -> TestResult {
    let env = Env::new()?;
    let authz = RoleAuthz::new(env.dir.clone());
    let owner = env.user("owner").await?;
    let bob = env.user("bob").await?;
    let ws = env.dir.create_workspace("w", &owner).await?.id;
    let agent = AgentId::new("a1")?;
    env.dir.register_agent(&ws, &agent, &owner).await?;
    env.dir.set_member(&ws, &bob, WorkspaceRole::Member).await?;
    env.dir.set_grant(&ws, &agent, &bob, AgentRole::Operator).await?;
    let who = principal(&bob, Credential::Token);
    let on_agent = Resource::Agent {
        workspace: ws.clone(),
        agent: agent.clone(),
    };
    assert_eq!(
        authz.check(&who, Action::Operate, &on_agent).await?,
        AuthzDecision::Allow
    );
    env.dir.remove_grant(&ws, &agent, &bob).await?;
    assert_eq!(
        authz.check(&who, Action::View, &on_agent).await?,
        AuthzDecision::NotFound
    );
    assert_eq!(
        authz
            .check(&who, Action::View, &Resource::Workspace(ws.clone()))
            .await?,
        AuthzDecision::Allow
    );
    env.dir.remove_member(&ws, &bob).await?;
    assert_eq!(
        authz
            .check(&who, Action::View, &Resource::Workspace(ws.clone()))
            .await?,
        AuthzDecision::NotFound
    );
    // A deleted agent or workspace is not found, even for the owner.
    let own = principal(&owner, Credential::Session);
    env.dir.unregister_agent(&ws, &agent).await?;
    assert_eq!(
        authz.check(&own, Action::View, &on_agent).await?,
        AuthzDecision::NotFound
    );
    env.dir.delete_workspace(&ws).await?;
    assert_eq!(
        authz.check(&own, Action::View, &Resource::Workspace(ws)).await?,
        AuthzDecision::NotFound
    );
    Ok(())
}
