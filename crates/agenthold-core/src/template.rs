//! The header template language (E11): `{{.Value}}`, `{{base64 X}}`, `{{print A B ...}}`, string literals
//! and parenthesised nesting, e.g. `Basic {{base64 (print "x-access-token:" .Value)}}`.
// Implementation pending (issue 2, item 4).

use zeroize::Zeroizing;

use crate::error::Error;

/// A parsed template, rendered per request without re-parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
}

impl Template {
    /// Parse `source`.
    ///
    /// # Errors
    /// [`Error::Template`] with the byte position of the problem.
    pub fn parse(source: &str) -> Result<Self, Error> {
        Ok(Self { source: source.to_owned() })
    }

    /// The source text.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render with `value` as `.Value`.
    #[must_use]
    pub fn render(&self, value: &[u8]) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(value.to_vec())
    }
}
