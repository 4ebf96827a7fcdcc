//! The harness's credential file inside the sandbox (E15): what `claude` reads from
//! `/workspace/.claude/.credentials.json` and `codex` from `/workspace/.codex/auth.json`, holding the
//! login's placeholders only. The gateway swaps a placeholder for the real token in the one header the
//! harness sends it in, and answers the harness's refreshes itself; the real tokens never enter the sandbox.
//!
//! Codex reads the ChatGPT account from the ID token's claims without checking its signature: the file
//! gets a JWT with the same claims and no valid signature, never the provider's token.
//!
//! Written as the image's user `agent` (mode 0600) when the image has one, else as root; through a
//! temporary file renamed into place, so a symlink the agent planted at the name is replaced, not followed.
// enforces: E15

use agenthold_core::AgentId;
use agenthold_core::sandbox::{ExecRequest, SandboxState};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::Provider;
use super::record::TokenMeta;
use crate::serve::api::{ApiError, ApiResult};
use crate::serve::state::AppState;

/// Where `claude` keeps its login (HOME is the agent's volume, `/workspace`).
pub(crate) const CLAUDE_FILE: &str = "/workspace/.claude/.credentials.json";
/// Where `codex` keeps its login (`CODEX_HOME=/workspace/.codex`).
pub(crate) const CODEX_FILE: &str = "/workspace/.codex/auth.json";

/// The signature part of the ID token written for codex: not a signature.
const NOT_SIGNED: &str = "bm90LXNpZ25lZC1ieS10aGUtcHJvdmlkZXI";

/// The file of `provider`'s harness.
pub(crate) fn path(provider: Provider) -> &'static str {
    match provider {
        Provider::Claude => CLAUDE_FILE,
        Provider::Chatgpt => CODEX_FILE,
    }
}

/// The file's content, with the placeholders of the access and refresh tokens.
pub(crate) fn content(provider: Provider, meta: &TokenMeta, access: &str, refresh: &str) -> Vec<u8> {
    let json = match provider {
        Provider::Claude => serde_json::json!({
            "claudeAiOauth": {
                "accessToken": access,
                "refreshToken": refresh,
                "expiresAt": meta.expires_at_ms,
                "scopes": meta.scopes,
                "subscriptionType": meta.subscription_type,
            }
        }),
        Provider::Chatgpt => serde_json::json!({
            "OPENAI_API_KEY": null,
            "tokens": {
                "id_token": unsigned_jwt(meta),
                "access_token": access,
                "refresh_token": refresh,
                "account_id": meta.account_id,
            },
            "last_refresh": meta.last_refresh,
        }),
    };
    serde_json::to_vec_pretty(&json).unwrap_or_default()
}

/// A JWT with the provider's ID token claims and a signature part that is no signature.
fn unsigned_jwt(meta: &TokenMeta) -> String {
    let header = serde_json::json!({"alg": "none", "typ": "JWT"});
    let claims = meta.id_claims.clone().unwrap_or_else(|| serde_json::json!({}));
    let part = |v: &serde_json::Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap_or_default());
    format!("{}.{}.{NOT_SIGNED}", part(&header), part(&claims))
}

/// Writes the file through a temporary file renamed into place, mode 0600.
const WRITE: &str = r#"set -e
umask 077
f="$1"
d="${f%/*}"
mkdir -p "$d"
t=$(mktemp "$d/.agenthold-login.XXXXXX")
cat > "$t"
chmod 600 "$t"
mv -f "$t" "$f""#;

/// Whether `agent`'s sandbox runs.
async fn running(state: &AppState, agent: &AgentId) -> bool {
    matches!(state.runtime.inspect(agent).await, Ok(info) if info.state == SandboxState::Running)
}

/// `argv` run as the image's user `agent` when it has one, else as root.
async fn as_agent_user(state: &AppState, agent: &AgentId, argv: Vec<String>) -> Vec<String> {
    let probe = ExecRequest {
        argv: vec!["id".into(), "-u".into(), "agent".into()],
        timeout: Some(std::time::Duration::from_secs(10)),
        ..ExecRequest::default()
    };
    match state.runtime.exec_request(agent, probe).await {
        Ok(out) if out.exit_code == 0 => {
            let mut full: Vec<String> = ["setpriv", "--reuid=agent", "--regid=agent", "--init-groups", "--"]
                .map(String::from)
                .to_vec();
            full.extend(argv);
            full
        }
        _ => argv,
    }
}

/// Write the file into `agent`'s sandbox; false when the sandbox does not run (written before the next
/// run instead).
pub(crate) async fn write(
    state: &AppState,
    agent: &AgentId,
    provider: Provider,
    data: Vec<u8>,
) -> ApiResult<bool> {
    if !running(state, agent).await {
        return Ok(false);
    }
    let argv = ["sh", "-c", WRITE, "sh", path(provider)]
        .map(String::from)
        .to_vec();
    let request = ExecRequest {
        argv: as_agent_user(state, agent, argv).await,
        stdin: Some(data),
        timeout: Some(std::time::Duration::from_secs(20)),
        ..ExecRequest::default()
    };
    let out = state.runtime.exec_request(agent, request).await?;
    if out.exit_code != 0 {
        return Err(ApiError::internal(&format!(
            "writing {} in agent {agent} failed ({}): {}",
            path(provider),
            out.exit_code,
            String::from_utf8_lossy(&out.stderr)
                .chars()
                .take(300)
                .collect::<String>()
        )));
    }
    Ok(true)
}

/// Remove the file from `agent`'s sandbox (when it runs; a stopped one is cleaned before its next run).
pub(crate) async fn remove(state: &AppState, agent: &AgentId, provider: Provider) {
    if !running(state, agent).await {
        return;
    }
    let request = ExecRequest {
        argv: ["rm", "-f", path(provider)].map(String::from).to_vec(),
        timeout: Some(std::time::Duration::from_secs(20)),
        ..ExecRequest::default()
    };
    match state.runtime.exec_request(agent, request).await {
        Ok(out) if out.exit_code == 0 => {}
        Ok(out) => {
            tracing::warn!(agent = %agent, code = out.exit_code, "could not remove a provider login's file");
        }
        Err(e) => tracing::warn!(agent = %agent, error = %e, "could not remove a provider login's file"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    // covers: E15
    #[test]
    fn files_hold_placeholders_and_an_unsigned_id_token() {
        let meta = TokenMeta {
            expires_at_ms: 5,
            scopes: vec!["user:inference".into()],
            id_claims: Some(
                serde_json::json!({"email": "a@b", "https://api.openai.com/auth": {"chatgpt_account_id": "acc"}}),
            ),
            account_id: Some("acc".into()),
            last_refresh: "2026-01-01T00:00:00Z".into(),
            ..TokenMeta::default()
        };
        let c: serde_json::Value =
            serde_json::from_slice(&content(Provider::Claude, &meta, "PA", "PR")).unwrap();
        assert_eq!(c["claudeAiOauth"]["accessToken"], "PA");
        assert_eq!(c["claudeAiOauth"]["refreshToken"], "PR");
        assert_eq!(c["claudeAiOauth"]["expiresAt"], 5);
        let x: serde_json::Value =
            serde_json::from_slice(&content(Provider::Chatgpt, &meta, "PA", "PR")).unwrap();
        assert!(x["OPENAI_API_KEY"].is_null());
        assert_eq!(x["tokens"]["access_token"], "PA");
        assert_eq!(x["tokens"]["account_id"], "acc");
        let jwt = x["tokens"]["id_token"].as_str().unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["email"], "a@b");
        assert_eq!(parts[2], NOT_SIGNED);
    }
}
