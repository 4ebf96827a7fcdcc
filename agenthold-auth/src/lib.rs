//! Users, workspaces and who may do what (S3, S5–S8, S13, P4).
//!
//! It will own: users, workspaces, memberships and agent grants, the default `Authz` implementation over
//! role tables, personal API tokens (hashed, expiring, revocable), browser sessions, OIDC and GitHub OAuth
//! with PKCE, state and nonce, CSRF and Origin checks, webhook URLs and signatures, and rate limits.
#![forbid(unsafe_code)]
