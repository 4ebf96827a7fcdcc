//! [`AuthConfig`]: session lifetimes, the login link's lifetime and the rate limits. It is the `auth` section
//! of the one configuration, so it is defined in `agenthold-core` beside the other sections.

pub use agenthold_core::config::AuthConfig;
