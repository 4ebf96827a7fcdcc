//! The one typed configuration (E17).
// Implementation pending (issue 2, item 5).

/// agenthold's configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {}
