//! The crate's one error type; [`Error::kind`] classifies it as the shared [`ErrorKind`], so callers (the
//! server) branch on the class and never on message text.

use agenthold_core::ErrorKind;

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of `agenthold-auth`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An input is invalid; `problem` names the field and says what is wrong.
    #[error("{problem}")]
    BadInput {
        /// What is wrong, starting with the field's name (`name: must be 1 to 100 characters`).
        problem: String,
    },
    /// The thing asked for does not exist.
    #[error("{what} not found: {id}")]
    NotFound {
        /// What kind of thing ("user", "workspace", "member", "agent").
        what: &'static str,
        /// Its identifier.
        id: String,
    },
    /// The change would break an invariant (the last owner of a workspace, an id already taken).
    #[error("conflict: {problem}")]
    Conflict {
        /// What the change would break.
        problem: String,
    },
    /// The store failed, or a stored record does not parse (then the kind is
    /// [`ErrorKind::Integrity`]).
    #[error(transparent)]
    Store(#[from] agenthold_core::Error),
}

impl Error {
    /// The class of this error.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::BadInput { .. } => ErrorKind::BadInput,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::Conflict { .. } => ErrorKind::Conflict,
            Self::Store(e) => e.kind(),
        }
    }

    pub(crate) fn bad_input(problem: impl Into<String>) -> Self {
        Self::BadInput {
            problem: problem.into(),
        }
    }

    pub(crate) fn not_found(what: &'static str, id: impl Into<String>) -> Self {
        Self::NotFound { what, id: id.into() }
    }

    pub(crate) fn conflict(problem: impl Into<String>) -> Self {
        Self::Conflict {
            problem: problem.into(),
        }
    }

    /// A failure classified `kind`, reported through core's error (a stored record that does not parse, the
    /// random generator failing).
    pub(crate) fn backend(
        kind: ErrorKind,
        context: impl Into<String>,
        source: impl Into<agenthold_core::BoxError>,
    ) -> Self {
        Self::Store(agenthold_core::Error::backend(kind, context, source))
    }
}

/// For [`Authz`](agenthold_core::Authz) and other core traits: the store's own error passes through
/// unchanged, the others keep their kind.
impl From<Error> for agenthold_core::Error {
    fn from(error: Error) -> Self {
        match error {
            Error::Store(e) => e,
            other => Self::backend(other.kind(), "", other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_its_kind_and_keeps_it_through_core() {
        let cases = [
            (Error::bad_input("name: empty"), ErrorKind::BadInput),
            (Error::not_found("user", "u1"), ErrorKind::NotFound),
            (Error::conflict("last owner"), ErrorKind::Conflict),
            (
                Error::backend(
                    ErrorKind::Integrity,
                    "auth_users/u1",
                    std::io::Error::other("bad json"),
                ),
                ErrorKind::Integrity,
            ),
        ];
        for (error, kind) in cases {
            assert_eq!(error.kind(), kind, "{error:?}");
            let text = error.to_string();
            let core = agenthold_core::Error::from(error);
            assert_eq!(core.kind(), kind);
            assert_eq!(core.to_string(), text);
        }
        assert_eq!(
            Error::not_found("member", "u1").to_string(),
            "member not found: u1"
        );
    }
}
