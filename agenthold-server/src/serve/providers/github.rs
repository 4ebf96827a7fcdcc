//! GitHub OAuth apps: authorization with PKCE S256 and state, the code exchanged at `token_url` (with the
//! PKCE verifier, answer as JSON), the identity from `{api_url}/user` (its numeric `id` is the subject) and
//! the primary verified address from `{api_url}/user/emails`.
// enforces: S6

use agenthold_core::config::GithubConfig;
use serde::Deserialize;

use super::http::Client;
use super::{Failure, Identity, query_join};

/// A GitHub OAuth app.
pub(crate) struct Github {
    pub(crate) config: GithubConfig,
    secret: String,
    redirect_uri: String,
}

impl std::fmt::Debug for Github {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Github")
            .field("client_id", &self.config.client_id)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct GithubUser {
    id: u64,
    login: String,
    name: Option<String>,
}

#[derive(Deserialize)]
struct GithubEmail {
    email: String,
    primary: bool,
    verified: bool,
}

impl Github {
    pub(crate) fn new(config: GithubConfig, secret: String, public_url: &str) -> Self {
        Self {
            config,
            secret,
            redirect_uri: format!("{public_url}/auth/github/callback"),
        }
    }

    /// Where the browser goes to sign in.
    pub(crate) fn authorize_url(&self, state: &str, challenge: &str) -> String {
        let query = form_urlencoded::Serializer::new(String::new())
            .extend_pairs([
                ("client_id", self.config.client_id.as_str()),
                ("redirect_uri", self.redirect_uri.as_str()),
                ("scope", "read:user user:email"),
                ("state", state),
                ("code_challenge", challenge),
                ("code_challenge_method", "S256"),
            ])
            .finish();
        query_join(&self.config.authorize_url, &query)
    }

    /// Exchange `code`, then read the user and their primary verified email.
    pub(crate) async fn finish(
        &self,
        client: &Client,
        code: &str,
        verifier: &str,
    ) -> Result<Identity, Failure> {
        let answer = client
            .post_form(
                &self.config.token_url,
                &[("accept", "application/json")],
                &[
                    ("client_id", self.config.client_id.as_str()),
                    ("client_secret", self.secret.as_str()),
                    ("code", code),
                    ("redirect_uri", self.redirect_uri.as_str()),
                    ("code_verifier", verifier),
                ],
            )
            .await
            .map_err(Failure::unreachable)?;
        // GitHub answers a refused code with 200 and an `error` field.
        let token = answer.json::<TokenAnswer>("token").ok();
        let access = match token {
            Some(TokenAnswer {
                access_token: Some(t),
                error: None,
            }) if answer.status == 200 && !t.is_empty() => t,
            Some(TokenAnswer { error, .. }) => return Err(Failure::refused(error.as_deref())),
            None => return Err(Failure::refused(None)),
        };
        let api = self.config.api_url.trim_end_matches('/');
        let auth = format!("Bearer {access}");
        let headers = [
            ("accept", "application/vnd.github+json"),
            ("authorization", auth.as_str()),
            ("x-github-api-version", "2022-11-28"),
        ];
        let answer = client
            .get(&format!("{api}/user"), &headers)
            .await
            .map_err(Failure::unreachable)?;
        if answer.status != 200 {
            return Err(Failure::unreachable(format!(
                "{api}/user: status {}",
                answer.status
            )));
        }
        let user: GithubUser = answer.json("GitHub user").map_err(Failure::unreachable)?;
        // Without the user:email scope (or with every address private) this may be refused: then no email.
        let email = match client.get(&format!("{api}/user/emails"), &headers).await {
            Ok(a) if a.status == 200 => a
                .json::<Vec<GithubEmail>>("GitHub emails")
                .ok()
                .and_then(|list| list.into_iter().find(|e| e.primary && e.verified))
                .map(|e| e.email),
            _ => None,
        };
        Ok(Identity {
            provider: "github",
            subject: user.id.to_string(),
            name: user.name.filter(|n| !n.trim().is_empty()).unwrap_or(user.login),
            email_verified: email.is_some(),
            email,
        })
    }
}
