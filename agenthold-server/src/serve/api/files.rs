//! `/api/v1/workspaces/{ws}/agents/{agent}/files`: an agent's files (P1) — list a directory, read, write
//! and delete — by role (S10): viewers read, operators also write and delete, and a viewer is refused the
//! harness credential files and sandboxd's boot file. That check compares the path after
//! [`Runtime::resolve_path`](agenthold_sandbox::Runtime::resolve_path) resolved every symlink inside the
//! sandbox, and the read then uses the resolved path, so a symlink the agent planted does not lead past it.
//!
//! Limits: the check guards the files where harnesses keep them; an agent that copies a credential file
//! elsewhere can show the copy to anyone who may read its files (it owns its filesystem). Uploads are read
//! into memory up to their own cap of 64 MiB (the runtime writes whole files), not the 8 MiB JSON cap.
// enforces: P1, S9, S10

use agenthold_core::sandbox::{DirEntry, EntryKind, sandbox_path};
use agenthold_core::{Action, AgentId, AuthzDecision, Resource, WorkspaceId};
use agenthold_sandbox::Runtime;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::agents::agent_meta;
use super::{ApiError, ApiResult, Caller, Params, Problem};
use crate::serve::state::AppState;

/// Largest upload.
pub(crate) const UPLOAD_LIMIT: usize = 64 * 1024 * 1024;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    let content = OpenApiRouter::new()
        .routes(routes!(read_file, write_file))
        .layer(DefaultBodyLimit::max(UPLOAD_LIMIT));
    OpenApiRouter::new()
        .routes(routes!(list_files, delete_path))
        .merge(content)
}

/// `?path=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PathQuery {
    /// An absolute path in the sandbox, without `..` components.
    path: String,
}

/// One directory entry.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileEntry {
    /// Its name (not its path).
    name: String,
    /// `file`, `dir`, `symlink` or `other`.
    kind: String,
    /// Size in bytes (a symlink: the length of its target).
    size: u64,
    /// Permission bits (`0o755` is 493).
    mode: u32,
    /// Last modification, seconds since the Unix epoch.
    modified: i64,
}

impl From<DirEntry> for FileEntry {
    fn from(e: DirEntry) -> Self {
        let kind = match e.kind {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
            _ => "other",
        };
        Self {
            name: e.name,
            kind: kind.to_owned(),
            size: e.size,
            mode: e.mode,
            modified: e.modified,
        }
    }
}

/// A directory listing.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileList {
    /// Entries, by name.
    items: Vec<FileEntry>,
}

/// A written file.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Written {
    /// Its path.
    path: String,
    /// Bytes written.
    size: usize,
}

/// The environment variables that move harness credential files, as the agent was created with them.
#[derive(Debug, Default)]
struct HarnessDirs {
    /// `$CODEX_HOME`, `$CLAUDE_CONFIG_DIR`, `$GH_CONFIG_DIR` (normalised).
    dirs: Vec<(&'static str, String)>,
    /// The agent's environment could not be read: every `auth.json` and `hosts.yml` is protected.
    unknown: bool,
}

/// The agent's environment as the runtime keeps its spec; when it cannot be read, the check fails closed
/// ([`HarnessDirs::unknown`]).
async fn harness_dirs(runtime: &Runtime, agent: &AgentId) -> HarnessDirs {
    let Ok(spec) = runtime.spec(agent).await else {
        return HarnessDirs {
            dirs: Vec::new(),
            unknown: true,
        };
    };
    let mut dirs = Vec::new();
    for (var, file) in [
        ("CODEX_HOME", "auth.json"),
        ("CLAUDE_CONFIG_DIR", ".credentials.json"),
        ("GH_CONFIG_DIR", "hosts.yml"),
    ] {
        if let Some(dir) = spec.env.get(var)
            && let Ok(dir) = sandbox_path(dir)
        {
            dirs.push((file, dir));
        }
    }
    HarnessDirs { dirs, unknown: false }
}

/// Whether a viewer is refused the file at `path` (resolved, normal form): harness credentials and
/// sandboxd's own files (S10).
fn protected(path: &str, harness: &HarnessDirs) -> bool {
    let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
    // sandboxd's directory: the boot token file and the run records; the CA certificate is public.
    if path == sandboxd::contract::DIR
        || (path.starts_with(sandboxd::contract::DIR)
            && path[sandboxd::contract::DIR.len()..].starts_with('/')
            && path != sandboxd::contract::CA_FILE
            && path != sandboxd::contract::CA_BUNDLE)
    {
        return true;
    }
    // Claude Code: `~/.claude/.credentials.json` (or in `$CLAUDE_CONFIG_DIR`): the name is its own; and
    // `~/.claude.json`, where an API key login keeps `primaryApiKey`.
    if name == ".credentials.json" || name == ".claude.json" {
        return true;
    }
    // Codex: `~/.codex/auth.json` or `$CODEX_HOME/auth.json`; GitHub CLI: `~/.config/gh/hosts.yml`.
    if (name == "auth.json" && (parent.ends_with("/.codex") || harness.unknown))
        || (name == "hosts.yml" && (parent.ends_with("/.config/gh") || harness.unknown))
    {
        return true;
    }
    harness
        .dirs
        .iter()
        .any(|(file, dir)| name == *file && parent == dir.as_str())
}

/// Whether the caller may act as an operator on the agent (else they are a viewer).
async fn is_operator(
    state: &AppState,
    caller: &Caller,
    ws: &WorkspaceId,
    agent: &AgentId,
) -> ApiResult<bool> {
    let on = Resource::Agent {
        workspace: ws.clone(),
        agent: agent.clone(),
    };
    Ok(state.authz.check(&caller.principal, Action::Operate, &on).await? == AuthzDecision::Allow)
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/files", tag = "files",
    description = "List a directory of the running sandbox (a symlink to a directory lists the directory).",
    params(("ws" = String, Path), ("agent" = String, Path), PathQuery),
    responses((status = 200, body = FileList), (status = 400, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "the agent does not run")),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn list_files(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Params(q): Params<PathQuery>,
) -> ApiResult<Json<FileList>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::View).await?;
    let path = sandbox_path(&q.path)?;
    let items = state
        .runtime
        .list_dir(&agent, &path)
        .await?
        .into_iter()
        .map(FileEntry::from)
        .collect();
    Ok(Json(FileList { items }))
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/agents/{agent}/files/content", tag = "files",
    description = "Download a file (raw bytes). A viewer is refused (403) harness credential files and \
                   sandboxd's files, also through symlinks: the check resolves the path inside the sandbox.",
    params(("ws" = String, Path), ("agent" = String, Path), PathQuery),
    responses((status = 200, content_type = "application/octet-stream", description = "the file's bytes"),
        (status = 400, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "the agent does not run")),
    extensions(("x-agenthold-role" = json!("viewer"))))]
async fn read_file(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Params(q): Params<PathQuery>,
) -> ApiResult<Response> {
    let (ws, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::View).await?;
    let path = sandbox_path(&q.path)?;
    // Read the resolved path (a symlink reads as what it points to), and check that one (S10): never the
    // path as given.
    let resolved = sandbox_path(&state.runtime.resolve_path(&agent, &path).await?)?;
    if !is_operator(&state, &caller, &ws, &agent).await? {
        // enforces: S10
        let harness = harness_dirs(&state.runtime, &agent).await;
        if protected(&resolved, &harness) {
            return Err(ApiError::forbidden(
                "viewers may not read harness credential files or sandboxd's files (S10)",
            ));
        }
    }
    let bytes = state.runtime.read_file(&agent, &resolved).await?;
    let mut response = bytes.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

#[utoipa::path(put, path = "/api/v1/workspaces/{ws}/agents/{agent}/files/content", tag = "files",
    description = "Upload a file: the raw request body (at most 64 MiB, read into memory) replaces the file, \
                   parent directories are created.",
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    params(("ws" = String, Path), ("agent" = String, Path), PathQuery),
    responses((status = 200, body = Written), (status = 400, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem, description = "the agent does not run"),
        (status = 413, body = Problem)),
    extensions(("x-agenthold-role" = json!("operator"))))]
async fn write_file(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Params(q): Params<PathQuery>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Written>> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Operate).await?;
    let path = sandbox_path(&q.path)?;
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large("an upload is at most 64 MiB")
        } else {
            ApiError::bad_request(e.body_text())
        }
    })?;
    state.runtime.write_file(&agent, &path, &body).await?;
    Ok(Json(Written {
        path,
        size: body.len(),
    }))
}

#[utoipa::path(delete, path = "/api/v1/workspaces/{ws}/agents/{agent}/files", tag = "files",
    description = "Delete a file, a symlink (not its target) or a directory with everything in it.",
    params(("ws" = String, Path), ("agent" = String, Path), PathQuery),
    responses((status = 204), (status = 400, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "the agent does not run")),
    extensions(("x-agenthold-role" = json!("operator"))))]
async fn delete_path(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, agent)): Path<(String, String)>,
    Params(q): Params<PathQuery>,
) -> ApiResult<Response> {
    let (_, agent, _) = agent_meta(&state, &caller, &ws, &agent, Action::Operate).await?;
    let path = sandbox_path(&q.path)?;
    state.runtime.remove_path(&agent, &path).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn viewers_are_refused_credential_files_and_sandboxd_files() {
        let none = HarnessDirs::default();
        for path in [
            "/root/.claude/.credentials.json",
            "/home/dev/.claude/.credentials.json",
            "/srv/claude/.credentials.json",
            "/workspace/.claude/.credentials.json",
            "/workspace/.codex/auth.json",
            "/workspace/.claude.json",
            "/root/.codex/auth.json",
            "/home/dev/.codex/auth.json",
            "/root/.config/gh/hosts.yml",
            "/.agenthold/boot",
            "/.agenthold/boot.d/token",
            "/.agenthold/run/x.pid",
            "/.agenthold",
        ] {
            assert!(protected(path, &none), "{path}");
        }
        for path in [
            "/root/.claude/settings.json",
            "/workspace/auth.json",
            "/workspace/hosts.yml",
            "/.agenthold/ca.crt",
            "/.agenthold/ca-bundle.pem",
            "/.agentholdx/boot",
            "/root/.codex/config.toml",
        ] {
            assert!(!protected(path, &none), "{path}");
        }
        let codex = HarnessDirs {
            dirs: vec![("auth.json", "/opt/codex".into())],
            unknown: false,
        };
        assert!(protected("/opt/codex/auth.json", &codex));
        assert!(!protected("/opt/other/auth.json", &codex));
        let unknown = HarnessDirs {
            dirs: Vec::new(),
            unknown: true,
        };
        assert!(protected("/workspace/auth.json", &unknown));
        assert!(!protected("/workspace/notes.txt", &unknown));
    }
}
