//! "Credentials inside sandbox" (S11): an agent in whose sandbox a harness credential file appears that
//! the server did not write — someone ran `claude /login` or `codex login` inside it, so a provider
//! account's tokens live where the agent can read and send them — is marked `credentials_inside` with the
//! paths, until the files are gone.
//!
//! The check reads each known path once through the engine (the runtime's file read: the engine's archive
//! API, no program in the sandbox, works on a stopped sandbox): a missing file costs one engine call, and
//! the files are small. Known paths: `~/.claude/.credentials.json`, `~/.claude.json` (an API key login
//! keeps `primaryApiKey` there) and `$CODEX_HOME/auth.json` for the harness user (home `/workspace`,
//! `CODEX_HOME=/workspace/.codex`) and for root, plus `$CLAUDE_CONFIG_DIR` and `$CODEX_HOME` from the
//! agent's environment. It runs when an exec or run of the agent ends ([`watch`] follows
//! [`Execs::subscribe_ended`](super::execs::Execs::subscribe_ended)) and every [`SWEEP`] over running
//! agents (at most [`SWEEP_MAX`] per round, one at a time).
//!
//! A file the server writes itself (a provider login attached to the agent writes the harness's credential
//! file holding placeholders only) does not count: [`is_server_written`] says so from the content — every
//! token or key value in it is an `agenthold-placeholder-…`, so a harness that rewrites the file after a
//! refresh the gateway answered (with placeholders) does not trip it either.
// enforces: S11

use std::collections::HashSet;
use std::time::Duration;

use agenthold_core::sandbox::{SandboxState, sandbox_path};
use agenthold_core::secret::PLACEHOLDER_PREFIX;
use agenthold_core::{AgentId, ErrorKind};
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;

use super::records;
use super::state::AppState;

/// How often running agents are checked besides the ends of their execs and runs.
pub(crate) const SWEEP: Duration = Duration::from_secs(60);
/// Most agents checked per sweep.
pub(crate) const SWEEP_MAX: usize = 1000;
/// The harness user's home (the agent's volume).
const HARNESS_HOME: &str = "/workspace";

/// What a watched file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A credential file: there means a login, unless the server wrote it.
    CredentialFile,
    /// Claude Code's settings (`~/.claude.json`): a login only when it holds an API key.
    ClaudeSettings,
}

/// The keys whose values are credentials in the harnesses' files.
const SECRET_KEYS: &[&str] = &[
    "accessToken",
    "refreshToken",
    "access_token",
    "refresh_token",
    "OPENAI_API_KEY",
    "apiKey",
    "api_key",
    "primaryApiKey",
];

/// The paths to check in an agent whose environment is `env`.
fn watched(env: &std::collections::BTreeMap<String, String>) -> Vec<(String, Kind)> {
    let mut out = Vec::new();
    for home in [HARNESS_HOME, "/root"] {
        out.push((format!("{home}/.claude/.credentials.json"), Kind::CredentialFile));
        out.push((format!("{home}/.codex/auth.json"), Kind::CredentialFile));
        out.push((format!("{home}/.claude.json"), Kind::ClaudeSettings));
    }
    for (var, file) in [
        ("CLAUDE_CONFIG_DIR", ".credentials.json"),
        ("CODEX_HOME", "auth.json"),
    ] {
        if let Some(dir) = env.get(var)
            && let Ok(path) = sandbox_path(&format!("{}/{file}", dir.trim_end_matches('/')))
            && !out.iter().any(|(p, _)| *p == path)
        {
            out.push((path, Kind::CredentialFile));
        }
    }
    out
}

/// The credential values in `value` (strings under [`SECRET_KEYS`], at any depth).
fn secret_values<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if let (true, Value::String(s)) = (SECRET_KEYS.contains(&k.as_str()), v) {
                    out.push(s);
                } else {
                    secret_values(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| secret_values(v, out)),
        _ => {}
    }
}

/// Whether `content` is a credential file as the server writes them: JSON whose every credential value
/// (`accessToken`, `refresh_token`, `OPENAI_API_KEY`, … at any depth) is a placeholder
/// (`agenthold-placeholder-…`), with at least one such value. Anything else (another format, a real
/// token, no token at all) is not the server's.
pub(crate) fn is_server_written(content: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<Value>(content) else {
        return false;
    };
    let mut values = Vec::new();
    secret_values(&value, &mut values);
    !values.is_empty() && values.iter().all(|v| v.starts_with(PLACEHOLDER_PREFIX))
}

/// Whether a file of `kind` with `content` means credentials inside the sandbox.
fn holds_credentials(kind: Kind, content: &[u8]) -> bool {
    match kind {
        Kind::CredentialFile => !is_server_written(content),
        Kind::ClaudeSettings => serde_json::from_slice::<Value>(content).is_ok_and(|v| {
            let mut values = Vec::new();
            secret_values(&v, &mut values);
            values
                .iter()
                .any(|s| !s.is_empty() && !s.starts_with(PLACEHOLDER_PREFIX))
        }),
    }
}

/// Check `agent` now and update its record: the paths that hold credentials the server did not write.
/// An engine error leaves the record as it was.
pub(crate) async fn check(state: &AppState, agent: &AgentId) {
    // Only the server's agents (a sandbox of the runtime without a record is not shown anywhere).
    if !matches!(records::load(state.store.as_ref(), agent).await, Ok(Some(_))) {
        return;
    }
    let env = match state.runtime.spec(agent).await {
        Ok(spec) => spec.env,
        Err(e) if e.kind() == ErrorKind::NotFound => return,
        Err(_) => Default::default(),
    };
    let mut found = Vec::new();
    for (path, kind) in watched(&env) {
        match state.runtime.read_file(agent, &path).await {
            Ok(content) => {
                if holds_credentials(kind, &content) {
                    found.push(path);
                }
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            // Something is there that is not a plain small file (a directory, a link the engine will not
            // follow, a huge file): a credential file in an odd form still counts.
            Err(e) if e.kind() == ErrorKind::BadInput && kind == Kind::CredentialFile => found.push(path),
            Err(e) if e.kind() == ErrorKind::BadInput => {}
            Err(e) => {
                tracing::debug!(agent = %agent, error = %e, "credential check skipped");
                return;
            }
        }
    }
    record(state, agent, found).await;
}

/// Store the outcome when it changed, and audit the change in the agent's workspace.
async fn record(state: &AppState, agent: &AgentId, found: Vec<String>) {
    let Ok(Some(mut meta)) = records::load(state.store.as_ref(), agent).await else {
        return;
    };
    let inside = !found.is_empty();
    if meta.credentials_inside == inside && meta.credentials_files == found {
        return;
    }
    meta.credentials_inside = inside;
    meta.credentials_files.clone_from(&found);
    if let Err(e) = records::save(state.store.as_ref(), &meta).await {
        tracing::warn!(agent = %agent, error = %e, "could not record credentials inside the sandbox");
        return;
    }
    let (action, reason) = if inside {
        ("credentials inside sandbox", found.join(", "))
    } else {
        ("credentials gone from sandbox", String::new())
    };
    tracing::info!(agent = %agent, files = ?found, "{action}");
    state
        .audit(
            &meta.workspace,
            None,
            action.to_owned(),
            format!("agents/{agent}"),
            "ok",
            (!reason.is_empty()).then_some(reason),
        )
        .await;
}

/// Check every running agent (at most [`SWEEP_MAX`]).
async fn sweep(state: &AppState) {
    let Ok(agents) = state.runtime.sandboxes().await else {
        return;
    };
    for agent in agents.into_iter().take(SWEEP_MAX) {
        if state.shutdown.is_cancelled() {
            return;
        }
        if matches!(state.runtime.inspect(&agent).await, Ok(info) if info.state == SandboxState::Running) {
            check(state, &agent).await;
        }
    }
}

/// Until shutdown: check an agent when one of its execs or runs ends (each agent once per burst), and
/// sweep the running agents every [`SWEEP`].
pub(crate) async fn watch(state: AppState) {
    let mut ended = state.execs.subscribe_ended();
    let mut tick = tokio::time::interval(SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = state.shutdown.cancelled() => return,
            _ = tick.tick() => sweep(&state).await,
            got = ended.recv() => {
                let mut agents = HashSet::new();
                match got {
                    Ok(agent) => { agents.insert(agent); }
                    Err(RecvError::Lagged(_)) => { sweep(&state).await; continue; }
                    Err(RecvError::Closed) => return,
                }
                while let Ok(agent) = ended.try_recv() {
                    agents.insert(agent);
                }
                for agent in agents {
                    check(&state, &agent).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_written_files_hold_placeholders_only() {
        let ph = format!("{PLACEHOLDER_PREFIX}0123456789abcdef0123456789abcdef");
        let claude = format!(
            r#"{{"claudeAiOauth":{{"accessToken":"{ph}","refreshToken":"{ph}","expiresAt":1,"scopes":["user:inference"]}}}}"#
        );
        assert!(is_server_written(claude.as_bytes()));
        let codex = format!(
            r#"{{"OPENAI_API_KEY":null,"tokens":{{"id_token":"eyJ.x.y","access_token":"{ph}","refresh_token":"{ph}","account_id":"a"}},"last_refresh":"2026-12-01T00:00:00Z"}}"#
        );
        assert!(is_server_written(codex.as_bytes()));
        for real in [
            r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-real","refreshToken":"sk-ant-ort01-real"}}"#
                .to_owned(),
            format!(r#"{{"claudeAiOauth":{{"accessToken":"{ph}","refreshToken":"sk-ant-ort01-real"}}}}"#),
            r#"{"OPENAI_API_KEY":"sk-proj-real"}"#.to_owned(),
            "{}".to_owned(),
            "not json".to_owned(),
            ph,
        ] {
            assert!(!is_server_written(real.as_bytes()), "{real}");
            assert!(holds_credentials(Kind::CredentialFile, real.as_bytes()), "{real}");
        }
    }

    #[test]
    fn claude_settings_count_only_with_a_real_key() {
        assert!(!holds_credentials(
            Kind::ClaudeSettings,
            br#"{"numStartups":3,"oauthAccount":{"emailAddress":"a@b"}}"#
        ));
        assert!(!holds_credentials(Kind::ClaudeSettings, b"garbage"));
        assert!(holds_credentials(
            Kind::ClaudeSettings,
            br#"{"primaryApiKey":"sk-ant-api03-real"}"#
        ));
    }

    #[test]
    fn watched_paths_follow_the_environment() {
        let mut env = std::collections::BTreeMap::new();
        let base: Vec<String> = watched(&env).into_iter().map(|(p, _)| p).collect();
        assert!(base.contains(&"/workspace/.claude/.credentials.json".to_owned()));
        assert!(base.contains(&"/workspace/.codex/auth.json".to_owned()));
        assert!(base.contains(&"/root/.codex/auth.json".to_owned()));
        env.insert("CODEX_HOME".to_owned(), "/opt/cx/".to_owned());
        env.insert("CLAUDE_CONFIG_DIR".to_owned(), "/workspace/.claude".to_owned());
        let paths: Vec<String> = watched(&env).into_iter().map(|(p, _)| p).collect();
        assert!(paths.contains(&"/opt/cx/auth.json".to_owned()));
        assert_eq!(paths.len(), base.len() + 1, "{paths:?}");
    }
}
