//! The agent index (which workspace an agent is in, who created it) and agent grants.
// enforces: S5 P4

use agenthold_core::{AgentId, ErrorKind, UserId, WorkspaceId};
use serde::{Deserialize, Serialize};

use super::{AGENTS, Directory, GRANTS, WORKSPACE_AGENTS, delete_op, put_op, rfc3339};
use crate::error::{Error, Result};
use crate::model::{AgentRole, Grant, WorkspaceRole};

/// The record of a registered agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct AgentRecord {
    workspace: WorkspaceId,
    creator: UserId,
    created_at: String,
}

impl Directory {
    /// Record that `agent` belongs to `ws`, and make `creator` its admin (one batch).
    ///
    /// # Errors
    /// [`Error::NotFound`] when the workspace does not exist or `creator` is not a member of it;
    /// [`Error::Conflict`] when the agent id is already registered; [`Error::Store`].
    pub async fn register_agent(&self, ws: &WorkspaceId, agent: &AgentId, creator: &UserId) -> Result<()> {
        let _guard = self.write_lock.acquire().await;
        self.require_workspace(ws).await?;
        self.require_member(ws, creator).await?;
        if self.agent_workspace(agent).await?.is_some() {
            return Err(Error::conflict(format!("agent {agent} is already registered")));
        }
        let record = AgentRecord {
            workspace: ws.clone(),
            creator: creator.clone(),
            created_at: rfc3339(self.now()),
        };
        let grant = Grant {
            workspace: ws.clone(),
            agent: agent.clone(),
            user: creator.clone(),
            role: AgentRole::Admin,
        };
        self.store
            .batch(vec![
                put_op(AGENTS, agent.to_string(), &record)?,
                put_op(WORKSPACE_AGENTS, format!("{ws}/{agent}"), &())?,
                put_op(GRANTS, format!("{ws}/{agent}/{creator}"), &grant)?,
            ])
            .await?;
        Ok(())
    }

    /// The workspace `agent` is registered in, if any.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn agent_workspace(&self, agent: &AgentId) -> Result<Option<WorkspaceId>> {
        let record: Option<AgentRecord> = self.get_json(AGENTS, agent.as_str()).await?;
        Ok(record.map(|r| r.workspace))
    }

    /// The agents registered in `ws`, by id.
    ///
    /// # Errors
    /// [`Error::Store`], also when a stored key is not an agent id ([`ErrorKind::Integrity`]).
    pub async fn agents_in(&self, ws: &WorkspaceId) -> Result<Vec<AgentId>> {
        let prefix = format!("{ws}/");
        self.scan_keys(WORKSPACE_AGENTS, &prefix)
            .await?
            .into_iter()
            .map(|key| {
                AgentId::new(key.strip_prefix(&prefix).unwrap_or(&key)).map_err(|e| {
                    Error::backend(
                        ErrorKind::Integrity,
                        format!("stored key {WORKSPACE_AGENTS}/{key}"),
                        e,
                    )
                })
            })
            .collect()
    }

    /// Forget `agent` and every grant on it (one batch).
    ///
    /// # Errors
    /// [`Error::NotFound`] when `agent` is not registered in `ws`; [`Error::Store`].
    pub async fn unregister_agent(&self, ws: &WorkspaceId, agent: &AgentId) -> Result<()> {
        let _guard = self.write_lock.acquire().await;
        self.require_agent_in(ws, agent).await?;
        let mut ops = vec![
            delete_op(AGENTS, agent.to_string()),
            delete_op(WORKSPACE_AGENTS, format!("{ws}/{agent}")),
        ];
        for key in self.scan_keys(GRANTS, &format!("{ws}/{agent}/")).await? {
            ops.push(delete_op(GRANTS, key));
        }
        self.store.batch(ops).await?;
        Ok(())
    }

    /// Give `user` the role `role` on `agent`. Returns whether the grant is new.
    ///
    /// # Errors
    /// [`Error::NotFound`] when `agent` is not registered in `ws` (`what: "agent"`) or `user` is not a
    /// member of `ws` (`what: "member"`); [`Error::Store`].
    pub async fn set_grant(
        &self,
        ws: &WorkspaceId,
        agent: &AgentId,
        user: &UserId,
        role: AgentRole,
    ) -> Result<bool> {
        let _guard = self.write_lock.acquire().await;
        self.require_agent_in(ws, agent).await?;
        self.require_member(ws, user).await?;
        let key = format!("{ws}/{agent}/{user}");
        let current: Option<Grant> = self.get_json(GRANTS, &key).await?;
        let grant = Grant {
            workspace: ws.clone(),
            agent: agent.clone(),
            user: user.clone(),
            role,
        };
        if current.as_ref() != Some(&grant) {
            self.put_json(GRANTS, &key, &grant).await?;
        }
        Ok(current.is_none())
    }

    /// Take away `user`'s grant on `agent`. Returns whether there was one.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn remove_grant(&self, ws: &WorkspaceId, agent: &AgentId, user: &UserId) -> Result<bool> {
        let _guard = self.write_lock.acquire().await;
        Ok(self
            .store
            .delete(GRANTS, format!("{ws}/{agent}/{user}").as_bytes())
            .await?)
    }

    /// The grants on `agent`, by user id.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn grants(&self, ws: &WorkspaceId, agent: &AgentId) -> Result<Vec<Grant>> {
        Ok(self
            .scan_json(GRANTS, &format!("{ws}/{agent}/"))
            .await?
            .into_iter()
            .map(|(_, g)| g)
            .collect())
    }

    /// The role a user has on an agent: workspace owner/admin → Admin; member → their grant; else None.
    /// Also `None` when `agent` is not registered in `ws`.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn agent_role(
        &self,
        ws: &WorkspaceId,
        agent: &AgentId,
        user: &UserId,
    ) -> Result<Option<AgentRole>> {
        if self.agent_workspace(agent).await?.as_ref() != Some(ws) {
            return Ok(None);
        }
        match self.member_role(ws, user).await? {
            None => Ok(None),
            Some(WorkspaceRole::Owner | WorkspaceRole::Admin) => Ok(Some(AgentRole::Admin)),
            Some(WorkspaceRole::Member) => {
                let grant: Option<Grant> = self.get_json(GRANTS, &format!("{ws}/{agent}/{user}")).await?;
                Ok(grant.map(|g| g.role))
            }
        }
    }

    /// [`Error::NotFound`] (`what: "agent"`) unless `agent` is registered in `ws`.
    async fn require_agent_in(&self, ws: &WorkspaceId, agent: &AgentId) -> Result<()> {
        if self.agent_workspace(agent).await?.as_ref() == Some(ws) {
            Ok(())
        } else {
            Err(Error::not_found("agent", agent.as_str()))
        }
    }

    /// [`Error::NotFound`] (`what: "member"`) unless `user` is a member of `ws`.
    async fn require_member(&self, ws: &WorkspaceId, user: &UserId) -> Result<WorkspaceRole> {
        self.member_role(ws, user)
            .await?
            .ok_or_else(|| Error::not_found("member", user.as_str()))
    }
}
