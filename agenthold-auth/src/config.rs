//! [`AuthConfig`]: session lifetimes, the login link's lifetime and the rate limits.

use serde::{Deserialize, Serialize};

/// Settings of the directory and the rate limits. Every field has a default; unknown keys are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// A browser session ends after this many seconds without a request. Default 43 200 (12 hours).
    pub session_idle_secs: u64,
    /// A browser session ends this many seconds after login, however busy. Default 604 800 (7 days).
    pub session_absolute_secs: u64,
    /// The local admin login link works for this many seconds. Default 900 (15 minutes).
    pub login_link_secs: u64,
    /// Requests per second per user, with bursts of 4 times that. Default 50; 0 turns the limit off.
    pub rate_per_user: u32,
    /// Requests per second per token, with bursts of 4 times that. Default 50; 0 turns the limit off.
    pub rate_per_token: u32,
    /// Requests per second per client address for unauthenticated requests and failed logins, with bursts
    /// of 4 times that. Default 5; 0 turns the limit off.
    pub rate_unauthenticated: u32,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            session_idle_secs: 12 * 60 * 60,
            session_absolute_secs: 7 * 24 * 60 * 60,
            login_link_secs: 15 * 60,
            rate_per_user: 50,
            rate_per_token: 50,
            rate_unauthenticated: 5,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_keys_take_the_defaults_and_unknown_keys_are_refused() -> serde_json::Result<()> {
        let config: AuthConfig = serde_json::from_str(r#"{"login_link_secs": 60}"#)?;
        assert_eq!(
            config,
            AuthConfig {
                login_link_secs: 60,
                ..AuthConfig::default()
            }
        );
        assert_eq!(config.session_idle_secs, 43_200);
        assert_eq!(config.session_absolute_secs, 604_800);
        assert_eq!(config.rate_unauthenticated, 5);
        let error = serde_json::from_str::<AuthConfig>(r#"{"session_idle": 5}"#)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("unknown field"), "{error}");
        Ok(())
    }
}
