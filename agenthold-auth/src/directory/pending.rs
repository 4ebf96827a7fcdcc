//! Members added before their first login (SERVER.md §4): an invitation names a workspace, a role and the
//! person, by login provider and subject, or by email address. It is bound (becomes a membership) when
//! someone logs in through a provider as that subject, or with that email address verified by the provider
//! (compared case-insensitively). The local admin link never binds by email.
// enforces: P4, S6

use agenthold_core::{UserId, WorkspaceId};
use serde::{Deserialize, Serialize};

use super::{Directory, MEMBER_OF, MEMBERS, PENDING, delete_op, put_op, rfc3339};
use crate::error::{Error, Result};
use crate::model::{Membership, WorkspaceRole};
use crate::opaque;

/// Prefix of a pending member's id (`inv_` + 20 hex digits); a user id never has it.
pub const PENDING_PREFIX: &str = "inv_";

/// A member who has not logged in yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingMember {
    /// Its id (`inv_…`), for removing it.
    pub id: String,
    /// The workspace.
    pub workspace: WorkspaceId,
    /// The email address that binds it (when verified by the provider), if given.
    pub email: Option<String>,
    /// The login provider (`oidc`, `github`) of `subject`, if given.
    pub provider: Option<String>,
    /// The provider's subject that binds it, if given.
    pub subject: Option<String>,
    /// The role the person gets.
    pub role: WorkspaceRole,
    /// Who invited them.
    pub invited_by: UserId,
    /// When (RFC 3339, UTC).
    pub created_at: String,
}

/// What [`Directory::add_pending_member`] needs: an email, or a provider and a subject (or both).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewPendingMember {
    /// An email address (contains `@`, at most 254 characters).
    pub email: Option<String>,
    /// A login provider (`oidc`, `github`); required with `subject`.
    pub provider: Option<String>,
    /// The provider's subject (its stable user id: OIDC `sub`, GitHub's numeric user id).
    pub subject: Option<String>,
    /// The role.
    pub role: WorkspaceRole,
}

/// A pending membership that a login bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundInvitation {
    /// The invitation that was used.
    pub invitation: PendingMember,
    /// Whether it bound by email (else by provider and subject).
    pub by_email: bool,
}

impl Directory {
    /// Record a member of `ws` who has not logged in yet. Returns the invitation and whether it is new: an
    /// invitation of `ws` for the same email (case-insensitive) or the same provider and subject is kept,
    /// with the new role.
    ///
    /// # Errors
    /// [`Error::BadInput`] when neither an email nor a provider with a subject is given, or one is
    /// malformed; [`Error::NotFound`] for an unknown workspace; [`Error::Store`].
    pub async fn add_pending_member(
        &self,
        ws: &WorkspaceId,
        new: NewPendingMember,
        invited_by: &UserId,
    ) -> Result<(PendingMember, bool)> {
        let email = new.email.map(|e| e.trim().to_owned()).filter(|e| !e.is_empty());
        if let Some(email) = &email
            && (!email.contains('@')
                || email.chars().count() > 254
                || email.chars().any(|c| c.is_control() || c.is_whitespace()))
        {
            return Err(Error::bad_input(
                "email: must contain '@', be at most 254 characters and have no spaces or control characters",
            ));
        }
        match (&new.provider, &new.subject) {
            (Some(p), Some(s)) => {
                if p.is_empty()
                    || p.len() > 64
                    || !p
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
                {
                    return Err(Error::bad_input(
                        "provider: must be 1 to 64 characters of a-z, 0-9, '_' and '-'",
                    ));
                }
                if p == "local" {
                    return Err(Error::bad_input(
                        "provider: the local admin link cannot be invited",
                    ));
                }
                if s.is_empty() || s.chars().count() > 255 || s.chars().any(char::is_control) {
                    return Err(Error::bad_input(
                        "subject: must be 1 to 255 characters without control characters",
                    ));
                }
            }
            (None, None) if email.is_some() => {}
            (None, None) => return Err(Error::bad_input("give an email, or a provider and a subject")),
            _ => return Err(Error::bad_input("provider and subject go together")),
        }
        let _guard = self.write_lock.acquire().await;
        self.require_workspace(ws).await?;
        for mut existing in self.pending_members(ws).await? {
            let same_email =
                matches!((&existing.email, &email), (Some(a), Some(b)) if a.eq_ignore_ascii_case(b));
            let same_subject = existing.subject.is_some()
                && existing.provider == new.provider
                && existing.subject == new.subject;
            if same_email || same_subject {
                // Inviting the same person again changes the role of the invitation.
                existing.role = new.role;
                self.put_json(PENDING, &format!("{ws}/{}", existing.id), &existing)
                    .await?;
                return Ok((existing, false));
            }
        }
        let pending = PendingMember {
            id: format!("{PENDING_PREFIX}{}", opaque::new_id()?),
            workspace: ws.clone(),
            email,
            provider: new.provider,
            subject: new.subject,
            role: new.role,
            invited_by: invited_by.clone(),
            created_at: rfc3339(self.now()),
        };
        self.put_json(PENDING, &format!("{ws}/{}", pending.id), &pending)
            .await?;
        Ok((pending, true))
    }

    /// The pending members of `ws`, by id.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn pending_members(&self, ws: &WorkspaceId) -> Result<Vec<PendingMember>> {
        Ok(self
            .scan_json(PENDING, &format!("{ws}/"))
            .await?
            .into_iter()
            .map(|(_, p)| p)
            .collect())
    }

    /// Remove the pending member `id` of `ws`; whether it existed.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn remove_pending_member(&self, ws: &WorkspaceId, id: &str) -> Result<Option<PendingMember>> {
        let _guard = self.write_lock.acquire().await;
        let key = format!("{ws}/{id}");
        let found: Option<PendingMember> = self.get_json(PENDING, &key).await?;
        if found.is_some() {
            self.store.delete(PENDING, key.as_bytes()).await?;
        }
        Ok(found)
    }

    /// Bind the invitations that match a login: by `provider` and `subject`, or by `verified_email`
    /// (case-insensitive; pass `None` when the provider did not verify the address). A workspace the user
    /// is already a member of keeps their role; the invitation is used up either way. Returns the
    /// invitations that became memberships.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown user; [`Error::Store`].
    pub async fn bind_pending_members(
        &self,
        user: &UserId,
        provider: &str,
        subject: &str,
        verified_email: Option<&str>,
    ) -> Result<Vec<BoundInvitation>> {
        let _guard = self.write_lock.acquire().await;
        self.require_user(user).await?;
        let mut ops = Vec::new();
        let mut bound: Vec<BoundInvitation> = Vec::new();
        for (key, p) in self.scan_json::<PendingMember>(PENDING, "").await? {
            let by_subject = p.provider.as_deref() == Some(provider) && p.subject.as_deref() == Some(subject);
            let by_email = !by_subject
                && provider != "local"
                && matches!((&p.email, verified_email), (Some(a), Some(b)) if a.eq_ignore_ascii_case(b));
            if !(by_subject || by_email) {
                continue;
            }
            ops.push(delete_op(PENDING, key));
            let already = self.member_role(&p.workspace, user).await?.is_some()
                || bound.iter().any(|b| b.invitation.workspace == p.workspace);
            if already || self.workspace(&p.workspace).await?.is_none() {
                continue;
            }
            let membership = Membership {
                workspace: p.workspace.clone(),
                user: user.clone(),
                role: p.role,
            };
            ops.push(put_op(MEMBERS, format!("{}/{user}", p.workspace), &membership)?);
            ops.push(put_op(MEMBER_OF, format!("{user}/{}", p.workspace), &membership)?);
            bound.push(BoundInvitation {
                invitation: p,
                by_email,
            });
        }
        if !ops.is_empty() {
            self.store.batch(ops).await?;
        }
        Ok(bound)
    }
}
