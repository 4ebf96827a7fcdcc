//! The host operator's channel: `agenthold admin …` talks to the running server over a Unix socket in the
//! data directory (`admin.sock`, mode 0600, in the 0700 data directory), because the store file is locked
//! by the server. One request per connection: a JSON line in, a JSON line out.
//!
//! Whoever can open the socket can act as any user: it is as powerful as the data directory itself, which
//! holds the store and the master key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agenthold_auth::NewUser;
use agenthold_core::UserId;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::state::AppState;

/// File name of the socket inside the data directory.
pub(crate) const SOCKET: &str = "admin.sock";
/// Longest request line accepted.
const MAX_LINE: u64 = 64 * 1024;
/// How long one admin exchange may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What an admin client asks.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdminRequest {
    /// Create a user (provider `local`).
    UserCreate {
        /// Display name.
        name: String,
        /// Email.
        email: Option<String>,
    },
    /// Create a personal token for a user.
    TokenCreate {
        /// The user.
        user: String,
        /// Seconds until it expires.
        expires_in: Option<u64>,
        /// Its name (default `admin`).
        name: Option<String>,
    },
    /// A new one-time local admin link.
    LoginLink,
    /// A browser session for a user (its cookie value), for scripts and tests.
    SessionCreate {
        /// The user.
        user: String,
    },
}

/// The answer.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct AdminResponse {
    /// The one line the command prints on success.
    pub(crate) value: Option<String>,
    /// Why it failed.
    pub(crate) error: Option<String>,
}

/// Bind the socket (replacing a stale one left by a killed server).
pub(crate) async fn bind(data_dir: &Path) -> Result<UnixListener> {
    let path = data_dir.join(SOCKET);
    if path.exists() {
        if UnixStream::connect(&path).await.is_ok() {
            bail!(
                "another agenthold server answers on {}; stop it first",
                path.display()
            );
        }
        std::fs::remove_file(&path).with_context(|| format!("remove the stale {}", path.display()))?;
    }
    let listener = UnixListener::bind(&path).with_context(|| format!("bind {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))?;
    Ok(listener)
}

/// Serve admin requests until `stop`.
pub(crate) async fn serve(listener: UnixListener, state: AppState, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "admin socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            if let Err(e) = tokio::time::timeout(TIMEOUT, answer(stream, &state)).await {
                tracing::warn!(error = %e, "admin request timed out");
            }
        });
    }
}

async fn answer(stream: UnixStream, state: &AppState) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read).take(MAX_LINE);
    let response = match reader.read_line(&mut line).await {
        Ok(_) => match serde_json::from_str::<AdminRequest>(&line) {
            Ok(request) => match handle(request, state).await {
                Ok(value) => AdminResponse {
                    value: Some(value),
                    error: None,
                },
                Err(e) => AdminResponse {
                    value: None,
                    error: Some(format!("{e:#}")),
                },
            },
            Err(e) => AdminResponse {
                value: None,
                error: Some(format!("bad request: {e}")),
            },
        },
        Err(e) => AdminResponse {
            value: None,
            error: Some(format!("read: {e}")),
        },
    };
    let mut out = serde_json::to_vec(&response).unwrap_or_default();
    out.push(b'\n');
    let _ = write.write_all(&out).await;
}

async fn handle(request: AdminRequest, state: &AppState) -> Result<String> {
    match request {
        AdminRequest::UserCreate { name, email } => {
            let user = state
                .dir
                .create_user(NewUser {
                    name,
                    email,
                    provider: "local".into(),
                    subject: None,
                })
                .await?;
            tracing::info!(user = %user.id, "user created by the host operator");
            Ok(user.id.to_string())
        }
        AdminRequest::TokenCreate {
            user,
            expires_in,
            name,
        } => {
            let user = known_user(state, &user).await?;
            let expires = expires_in.map(Duration::from_secs);
            let (_, token) = state
                .dir
                .create_token(&user, name.as_deref().unwrap_or("admin"), expires)
                .await?;
            Ok(token)
        }
        AdminRequest::LoginLink => Ok(login_link(state).await?),
        AdminRequest::SessionCreate { user } => {
            let user = known_user(state, &user).await?;
            Ok(state.dir.create_session(&user).await?)
        }
    }
}

async fn known_user(state: &AppState, id: &str) -> Result<UserId> {
    let user = UserId::new(id).map_err(|e| anyhow::anyhow!("{id:?} is not a user id: {e}"))?;
    if state.dir.user(&user).await?.is_none() {
        bail!("no user {user}");
    }
    Ok(user)
}

/// A new one-time local admin link (`<public_url>/login/local#<token>`: the fragment never reaches a log).
pub(crate) async fn login_link(state: &AppState) -> Result<String> {
    let token = state.dir.create_login_link().await?;
    Ok(format!("{}/login/local#{token}", state.public_url))
}

/// Client side: send one request to the server of `data_dir` and return the line to print.
pub async fn call(data_dir: &Path, request: &AdminRequest) -> Result<String> {
    let path: PathBuf = data_dir.join(SOCKET);
    let exchange = async {
        let mut stream = UnixStream::connect(&path).await.with_context(|| {
            format!(
                "no agenthold server answers on {} (is `agenthold serve` running with this data directory?)",
                path.display()
            )
        })?;
        let mut line = serde_json::to_vec(request)?;
        line.push(b'\n');
        stream.write_all(&line).await?;
        let mut reply = String::new();
        BufReader::new(stream)
            .take(MAX_LINE)
            .read_line(&mut reply)
            .await?;
        let reply: AdminResponse =
            serde_json::from_str(&reply).context("the server's answer is not an admin response")?;
        match (reply.value, reply.error) {
            (Some(value), None) => Ok(value),
            (_, Some(error)) => bail!("{error}"),
            (None, None) => bail!("the server answered nothing"),
        }
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .context("the server did not answer within 10 s")?
}
