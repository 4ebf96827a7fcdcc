//! Workspaces and their members. A workspace always keeps at least one owner.
// enforces: P4

use agenthold_core::{UserId, WorkspaceId};

use super::{
    AGENTS, AUDIT, Directory, GRANTS, MEMBER_OF, MEMBERS, PENDING, WORKSPACE_AGENTS, WORKSPACES, check_name,
    delete_op, put_op, rfc3339,
};
use crate::error::{Error, Result};
use crate::model::{Grant, Membership, Workspace, WorkspaceRole};

impl Directory {
    /// Create a workspace named `name`, with `owner` as its one owner (one batch).
    ///
    /// # Errors
    /// [`Error::BadInput`] for a name that is not 1 to 100 characters or has control characters;
    /// [`Error::NotFound`] when `owner` is not a user; [`Error::Store`].
    pub async fn create_workspace(&self, name: &str, owner: &UserId) -> Result<Workspace> {
        check_name("name", name)?;
        self.require_user(owner).await?;
        let workspace = Workspace {
            id: WorkspaceId::random(),
            name: name.to_owned(),
            created_at: rfc3339(self.now()),
        };
        let membership = Membership {
            workspace: workspace.id.clone(),
            user: owner.clone(),
            role: WorkspaceRole::Owner,
        };
        self.store
            .batch(vec![
                put_op(WORKSPACES, workspace.id.to_string(), &workspace)?,
                put_op(MEMBERS, format!("{}/{owner}", workspace.id), &membership)?,
                put_op(MEMBER_OF, format!("{owner}/{}", workspace.id), &membership)?,
            ])
            .await?;
        tracing::debug!(workspace = %workspace.id, %owner, "workspace created");
        Ok(workspace)
    }

    /// The workspace `id`, if it exists.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn workspace(&self, id: &WorkspaceId) -> Result<Option<Workspace>> {
        self.get_json(WORKSPACES, id.as_str()).await
    }

    /// Rename the workspace `id`.
    ///
    /// # Errors
    /// [`Error::BadInput`] for a bad name (as for [`Directory::create_workspace`]); [`Error::NotFound`]
    /// when there is no such workspace; [`Error::Store`].
    pub async fn rename_workspace(&self, id: &WorkspaceId, name: &str) -> Result<Workspace> {
        check_name("name", name)?;
        let _guard = self.write_lock.acquire().await;
        let mut workspace = self.require_workspace(id).await?;
        workspace.name = name.to_owned();
        self.put_json(WORKSPACES, id.as_str(), &workspace).await?;
        Ok(workspace)
    }

    /// Delete the workspace `id` with its members, agent index, grants and audit log, in one batch.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such workspace; [`Error::Store`].
    pub async fn delete_workspace(&self, id: &WorkspaceId) -> Result<()> {
        let _guard = self.write_lock.acquire().await;
        self.require_workspace(id).await?;
        let prefix = format!("{id}/");
        let mut ops = vec![delete_op(WORKSPACES, id.to_string())];
        for (key, member) in self.scan_json::<Membership>(MEMBERS, &prefix).await? {
            ops.push(delete_op(MEMBERS, key));
            ops.push(delete_op(MEMBER_OF, format!("{}/{id}", member.user)));
        }
        for key in self.scan_keys(WORKSPACE_AGENTS, &prefix).await? {
            if let Some(agent) = key.strip_prefix(&prefix) {
                ops.push(delete_op(AGENTS, agent.to_owned()));
            }
            ops.push(delete_op(WORKSPACE_AGENTS, key));
        }
        for table in [GRANTS, AUDIT, PENDING] {
            for key in self.scan_keys(table, &prefix).await? {
                ops.push(delete_op(table, key));
            }
        }
        self.store.batch(ops).await?;
        self.forget_audit_seq(id);
        tracing::debug!(workspace = %id, "workspace deleted");
        Ok(())
    }

    /// The workspaces `user` is a member of, with their role in each, by workspace id.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn workspaces_of(&self, user: &UserId) -> Result<Vec<(Workspace, WorkspaceRole)>> {
        let mut out = Vec::new();
        for (_, membership) in self
            .scan_json::<Membership>(MEMBER_OF, &format!("{user}/"))
            .await?
        {
            if let Some(workspace) = self.workspace(&membership.workspace).await? {
                out.push((workspace, membership.role));
            }
        }
        Ok(out)
    }

    /// Make `user` a member of `ws` with `role`, or change their role. Returns whether they were new.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the workspace or the user does not exist; [`Error::Conflict`] when this
    /// would demote the workspace's last owner; [`Error::Store`].
    pub async fn set_member(&self, ws: &WorkspaceId, user: &UserId, role: WorkspaceRole) -> Result<bool> {
        let _guard = self.write_lock.acquire().await;
        self.require_workspace(ws).await?;
        self.require_user(user).await?;
        let current = self.member_role(ws, user).await?;
        if current == Some(role) {
            return Ok(false);
        }
        if current == Some(WorkspaceRole::Owner) {
            self.keep_an_owner(ws, user).await?;
        }
        let membership = Membership {
            workspace: ws.clone(),
            user: user.clone(),
            role,
        };
        self.store
            .batch(vec![
                put_op(MEMBERS, format!("{ws}/{user}"), &membership)?,
                put_op(MEMBER_OF, format!("{user}/{ws}"), &membership)?,
            ])
            .await?;
        Ok(current.is_none())
    }

    /// Remove `user` from `ws`, with their grants on the workspace's agents (one batch). Returns whether
    /// they were a member.
    ///
    /// # Errors
    /// [`Error::Conflict`] when `user` is the workspace's last owner; [`Error::Store`].
    pub async fn remove_member(&self, ws: &WorkspaceId, user: &UserId) -> Result<bool> {
        let _guard = self.write_lock.acquire().await;
        match self.member_role(ws, user).await? {
            None => return Ok(false),
            Some(WorkspaceRole::Owner) => self.keep_an_owner(ws, user).await?,
            Some(_) => {}
        }
        let mut ops = vec![
            delete_op(MEMBERS, format!("{ws}/{user}")),
            delete_op(MEMBER_OF, format!("{user}/{ws}")),
        ];
        for (key, grant) in self.scan_json::<Grant>(GRANTS, &format!("{ws}/")).await? {
            if grant.user == *user {
                ops.push(delete_op(GRANTS, key));
            }
        }
        self.store.batch(ops).await?;
        Ok(true)
    }

    /// The role of `user` in `ws`, if they are a member.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn member_role(&self, ws: &WorkspaceId, user: &UserId) -> Result<Option<WorkspaceRole>> {
        let membership: Option<Membership> = self.get_json(MEMBERS, &format!("{ws}/{user}")).await?;
        Ok(membership.map(|m| m.role))
    }

    /// The members of `ws`, by user id.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn members(&self, ws: &WorkspaceId) -> Result<Vec<Membership>> {
        Ok(self
            .scan_json(MEMBERS, &format!("{ws}/"))
            .await?
            .into_iter()
            .map(|(_, m)| m)
            .collect())
    }

    /// The workspace `id`, or [`Error::NotFound`].
    pub(super) async fn require_workspace(&self, id: &WorkspaceId) -> Result<Workspace> {
        self.workspace(id)
            .await?
            .ok_or_else(|| Error::not_found("workspace", id.as_str()))
    }

    /// [`Error::Conflict`] unless `ws` has an owner other than `leaving`.
    async fn keep_an_owner(&self, ws: &WorkspaceId, leaving: &UserId) -> Result<()> {
        let others = self
            .members(ws)
            .await?
            .into_iter()
            .any(|m| m.role == WorkspaceRole::Owner && m.user != *leaving);
        if others {
            Ok(())
        } else {
            Err(Error::conflict(format!(
                "{leaving} is the last owner of workspace {ws}: make another member owner first"
            )))
        }
    }
}
