//! The seven principals of the matrix and their credentials: a browser session and a personal token each,
//! and a spare token (the `{id}` of token operations), with the roles the fixture gives them.

use crate::serve::client;
use crate::serve::support::{Auth, TestServer};

/// Who is calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Who {
    NonMember,
    Member,
    Viewer,
    Operator,
    AgentAdmin,
    WsAdmin,
    Owner,
}

impl Who {
    pub(crate) const ALL: [Self; 7] = [
        Self::NonMember,
        Self::Member,
        Self::Viewer,
        Self::Operator,
        Self::AgentAdmin,
        Self::WsAdmin,
        Self::Owner,
    ];

    /// Workspace role: 1 member, 2 admin, 3 owner.
    pub(crate) fn ws_rank(self) -> Option<u8> {
        match self {
            Self::NonMember => None,
            Self::Member | Self::Viewer | Self::Operator | Self::AgentAdmin => Some(1),
            Self::WsAdmin => Some(2),
            Self::Owner => Some(3),
        }
    }

    /// Role on the fixture agent: 1 viewer, 2 operator, 3 admin (workspace admins and owners are admins).
    pub(crate) fn agent_rank(self) -> Option<u8> {
        match self {
            Self::NonMember | Self::Member => None,
            Self::Viewer => Some(1),
            Self::Operator => Some(2),
            Self::AgentAdmin | Self::WsAdmin | Self::Owner => Some(3),
        }
    }

    /// The grant that makes a member this principal on an agent.
    pub(crate) fn grant(self) -> Option<&'static str> {
        match self {
            Self::Viewer => Some("viewer"),
            Self::Operator => Some("operator"),
            Self::AgentAdmin => Some("admin"),
            _ => None,
        }
    }

    /// The member role that makes a user this principal in a workspace.
    pub(crate) fn membership(self) -> Option<&'static str> {
        match self.ws_rank() {
            Some(1) => Some("member"),
            Some(2) => Some("admin"),
            _ => None,
        }
    }
}

/// How a principal authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cred {
    Session,
    Token,
}

/// A user in one of the roles, with both credentials and a spare token (for `{id}`).
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    pub(crate) who: Who,
    pub(crate) user: String,
    pub(crate) token: String,
    pub(crate) session: String,
    pub(crate) spare_token: String,
    pub(crate) spare_id: String,
}

impl Principal {
    pub(crate) fn auth(&self, cred: Cred) -> Auth {
        match cred {
            Cred::Session => Auth::Session(self.session.clone()),
            Cred::Token => Auth::Token(self.token.clone()),
        }
    }
}

/// The id of a personal token, found by its prefix in the owner's own list.
pub(crate) fn token_id(server: &TestServer, token: &str) -> String {
    let list = client::call(
        &server.base,
        "GET",
        "/api/v1/me/tokens",
        &Auth::Token(token.to_owned()),
        None,
        &[],
    );
    let prefix = token.strip_prefix("ahp_").unwrap_or(token);
    list.body["items"]
        .as_array()
        .unwrap_or_else(|| panic!("GET /api/v1/me/tokens: {:?}", list.body))
        .iter()
        .find(|t| t["prefix"].as_str().is_some_and(|p| prefix.starts_with(p)))
        .and_then(|t| t["id"].as_str())
        .unwrap_or_else(|| panic!("no token with the prefix of {prefix:.8} in {:?}", list.body))
        .to_owned()
}
