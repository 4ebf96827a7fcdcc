//! The minimum role of an operation, as the OpenAPI extension `x-agenthold-role`. Values:
//! `public` (no credentials), `self` (any authenticated user, on their own account), `session` (a browser
//! session, not a token: S7), `member`, `workspace_admin`, `owner` (workspace roles), `viewer`, `operator`,
//! `agent_admin` (agent grants; workspace admins and owners count as agent admins).

/// The extension's name.
pub(crate) const ROLE_EXTENSION: &str = "x-agenthold-role";
