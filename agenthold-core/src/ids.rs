//! Identifier newtypes. Each is a validated string: lower-case ASCII letters, digits, `-` and `_`,
//! 1 to 63 characters, starting with a letter or digit. That keeps ids safe to embed in Docker object names,
//! file names, store keys and log lines without escaping.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Characters of a freshly generated id (lower-case base32 without padding, RFC 4648 alphabet).
const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

fn validate(kind: &'static str, value: &str) -> Result<(), Error> {
    let problem = if value.is_empty() {
        Some("must not be empty")
    } else if value.len() > 63 {
        Some("must be at most 63 characters")
    } else if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        Some("may contain only a-z, 0-9, '-' and '_'")
    } else if !value.as_bytes()[0].is_ascii_alphanumeric() {
        Some("must start with a letter or digit")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(Error::InvalidId {
            kind,
            value: value.to_owned(),
            problem,
        }),
        None => Ok(()),
    }
}

/// A random id of `len` base32 characters (5 bits each), from the operating system's generator.
fn random_id(len: usize) -> String {
    let mut bytes = vec![0u8; len];
    // The OS generator failing is not recoverable in any useful way; an id from a broken generator would be
    // predictable, which is worse than stopping.
    #[allow(clippy::expect_used)]
    getrandom::fill(&mut bytes).expect("operating system random number generator failed");
    bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(b & 31)]))
        .collect()
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validate and wrap `value`.
            ///
            /// # Errors
            /// [`Error::InvalidId`] when the value breaks the id rules of [`crate::ids`].
            pub fn new(value: impl Into<String>) -> Result<Self, Error> {
                let value = value.into();
                validate($kind, &value)?;
                Ok(Self(value))
            }

            /// A new random id: 16 base32 characters (80 bits).
            #[must_use]
            pub fn random() -> Self {
                Self(random_id(16))
            }

            /// The id as a string slice.
            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self, Error> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = Error;
            fn try_from(s: String) -> Result<Self, Error> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

id_type!(
    /// Identifies an agent: one sandbox with its network, volume, policy and secrets.
    AgentId,
    "agent id"
);
id_type!(
    /// Identifies a secret (its encrypted value is bound to this id).
    SecretId,
    "secret id"
);
id_type!(
    /// Identifies a user.
    UserId,
    "user id"
);
id_type!(
    /// Identifies a workspace.
    WorkspaceId,
    "workspace id"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_ids() {
        for v in ["a", "agent-1", "0abc", "x_y", &"a".repeat(63)] {
            assert!(AgentId::new(v).is_ok(), "{v}");
        }
    }

    #[test]
    fn rejects_invalid_ids() {
        for v in ["", "-a", "_a", "A", "a b", "a/b", "a.b", "é", &"a".repeat(64)] {
            let err = AgentId::new(v).unwrap_err();
            assert!(err.to_string().contains("agent id"), "{err}");
        }
    }

    #[test]
    fn random_ids_are_valid_and_distinct() {
        let a = AgentId::random();
        let b = AgentId::random();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 16);
        AgentId::new(a.as_str()).unwrap();
    }

    #[test]
    fn serde_validates() {
        let ok: AgentId = serde_json::from_str("\"abc\"").unwrap();
        assert_eq!(ok.as_str(), "abc");
        assert!(serde_json::from_str::<AgentId>("\"../etc\"").is_err());
    }
}
