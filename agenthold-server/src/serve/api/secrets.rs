//! `/api/v1/workspaces/{ws}/secrets`: a workspace's secrets (E10, E11, S15). Members list and read their
//! metadata (name, rules, dates); workspace admins create them, replace value or rules, and delete them.
//! A value is never returned, never logged, sealed by the vault as soon as it is read from the request, and
//! zeroized when dropped ([`SecretValue`]). A change reaches every agent the secret is attached to at once;
//! a deletion detaches it everywhere first.
// enforces: E10 E11 S15

use agenthold_core::secret::{Preset, RuleKind, SecretRule, SecretSpec, SecretValue};
use agenthold_core::{Action, SecretId, WorkspaceId};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, ApiResult, Body, Caller, Problem, created};
use crate::serve::secrets::{self as records, WorkspaceSecret};
use crate::serve::state::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_secrets, create_secret))
        .routes(routes!(get_secret, replace_secret, delete_secret))
}

/// Longest secret value accepted, in bytes (it must fit in an HTTP header).
const MAX_VALUE: usize = 16 * 1024;
/// Most hosts one rule may name.
const MAX_HOSTS: usize = 64;
/// Most secrets one workspace may hold.
const MAX_SECRETS: usize = 1000;
/// The template when none is given.
const DEFAULT_TEMPLATE: &str = "{{.Value}}";

/// A secret value in a request body: moved into a [`SecretValue`] as soon as it is parsed (no copy is
/// left behind by this code), redacted in `Debug`.
#[derive(Debug)]
pub(crate) struct Value(SecretValue);

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // `String::into_bytes` keeps the buffer: the only copy is the one SecretValue zeroizes.
        String::deserialize(d).map(|s| Self(SecretValue::from(s)))
    }
}

/// `POST …/secrets`: a value and where it may go — a `preset`, or `hosts` and `header` (and `template`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "openai", "value": "sk-…", "preset": "openai"}))]
pub(crate) struct CreateSecret {
    /// 1 to 64 characters of letters, digits, `_`, `-`, `.`; unique in the workspace.
    #[schema(example = "openai")]
    name: String,
    /// The value (at most 16 KiB, usable in an HTTP header). Never returned.
    #[schema(value_type = String, example = "sk-…")]
    value: Value,
    /// Hosts it may be sent to: exact names or `*.` wildcards, no addresses or ports.
    #[schema(example = json!(["api.example.com"]))]
    hosts: Option<Vec<String>>,
    /// The header the gateway sets on requests to those hosts.
    #[schema(example = "Authorization")]
    header: Option<String>,
    /// The header's value: `{{.Value}}` (default), `Bearer {{.Value}}`, `Basic {{base64 (print "u:" .Value)}}`.
    #[schema(example = "Bearer {{.Value}}")]
    template: Option<String>,
    /// Instead of hosts/header/template: `anthropic`, `openai`, `github`, `gitlab` or `openrouter`.
    #[schema(example = "openai")]
    preset: Option<String>,
}

/// `PUT …/secrets/{secret}`: a new value, new rules, or both. Rules are replaced as a whole: a `preset`,
/// or `hosts` and `header` (and `template`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"value": "sk-new…"}))]
pub(crate) struct ReplaceSecret {
    /// The new value.
    #[schema(value_type = Option<String>)]
    value: Option<Value>,
    /// New hosts (with `header`).
    hosts: Option<Vec<String>>,
    /// New header (with `hosts`).
    header: Option<String>,
    /// New template (with `hosts` and `header`; default `{{.Value}}`).
    template: Option<String>,
    /// A preset instead of hosts/header/template.
    preset: Option<String>,
}

/// A secret's metadata; never its value.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SecretView {
    /// Secret id.
    id: String,
    /// Its workspace.
    workspace: String,
    /// Its name (also its name in the agents it is attached to).
    name: String,
    /// The preset its rules came from.
    preset: Option<String>,
    /// Every host any of its rules covers.
    hosts: Vec<String>,
    /// The header, when it has exactly one header rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<String>,
    /// The template, when it has exactly one header rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    template: Option<String>,
    /// Its rules (`{kind, hosts, header, template}`).
    #[schema(value_type = Vec<Object>)]
    rules: Vec<SecretRule>,
    /// Counts changes of value or rules.
    revision: u64,
    /// Who created it.
    created_by: String,
    /// When (RFC 3339).
    created_at: String,
    /// When its value or rules last changed.
    updated_at: String,
}

impl From<&WorkspaceSecret> for SecretView {
    fn from(s: &WorkspaceSecret) -> Self {
        let mut hosts: Vec<String> = Vec::new();
        for rule in &s.rules {
            for h in serde_json::to_value(rule)
                .ok()
                .and_then(|v| v.get("hosts").cloned())
                .and_then(|v| serde_json::from_value::<Vec<String>>(v).ok())
                .unwrap_or_default()
            {
                if !hosts.contains(&h) {
                    hosts.push(h);
                }
            }
        }
        let (header, template) = match s.rules.as_slice() {
            [
                SecretRule {
                    kind: RuleKind::Header { header, template, .. },
                    ..
                },
            ] => (Some(header.clone()), Some(template.source().to_owned())),
            _ => (None, None),
        };
        Self {
            id: s.id.to_string(),
            workspace: s.workspace.to_string(),
            name: s.name.clone(),
            preset: s.preset.map(|p| p.name().to_owned()),
            hosts,
            header,
            template,
            rules: s.rules.clone(),
            revision: s.revision,
            created_by: s.created_by.to_string(),
            created_at: s.created_at.clone(),
            updated_at: s.updated_at.clone(),
        }
    }
}

/// The secrets of a workspace.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SecretList {
    /// By name.
    items: Vec<SecretView>,
    /// Always absent: a workspace's secrets fit one page.
    next_cursor: Option<String>,
}

/// The rules a body asks for: a preset's, or one header rule. `None` when it names none.
fn rules_of(
    preset: Option<&str>,
    hosts: Option<&[String]>,
    header: Option<&str>,
    template: Option<&str>,
) -> ApiResult<Option<(Option<Preset>, Vec<SecretRule>)>> {
    if let Some(name) = preset {
        if hosts.is_some() || header.is_some() || template.is_some() {
            return Err(ApiError::bad_request(
                "give either preset, or hosts and header (and template), not both",
            ));
        }
        let preset = Preset::from_name(name).map_err(|_| {
            ApiError::bad_request(format!(
                "unknown preset {name:?}; known presets: {}",
                Preset::ALL.map(Preset::name).join(", ")
            ))
        })?;
        return Ok(Some((Some(preset), preset.rules())));
    }
    if hosts.is_none() && header.is_none() && template.is_none() {
        return Ok(None);
    }
    let (Some(hosts), Some(header)) = (hosts, header) else {
        return Err(ApiError::bad_request(
            "a rule needs hosts and header (template defaults to {{.Value}}), or a preset",
        ));
    };
    if hosts.len() > MAX_HOSTS {
        return Err(ApiError::bad_request(format!(
            "a rule names at most {MAX_HOSTS} hosts"
        )));
    }
    let rule =
        SecretRule::header(hosts, header, template.unwrap_or(DEFAULT_TEMPLATE)).map_err(|e| match e {
            agenthold_core::Error::Secret { problem, .. } => {
                ApiError::bad_request(format!("invalid rule: {problem}"))
            }
            other => ApiError::bad_request(format!("invalid rule: {other}")),
        })?;
    Ok(Some((None, vec![rule])))
}

/// Check a name and value with the rules they will be used with (core's checks: name characters, the value
/// usable in a header).
fn check_secret(name: &str, value: &SecretValue, rules: &[SecretRule]) -> ApiResult<()> {
    if value.expose().len() > MAX_VALUE {
        return Err(ApiError::bad_request(format!(
            "a secret value is at most {MAX_VALUE} bytes"
        )));
    }
    SecretSpec::new(name, value.clone(), None, rules.to_vec())
        .map(drop)
        .map_err(|e| match e {
            agenthold_core::Error::Secret { problem, .. } => {
                ApiError::bad_request(format!("invalid secret {name:?}: {problem}"))
            }
            other => other.into(),
        })
}

/// The secret `id` of workspace `ws`, or 404.
async fn find(state: &AppState, ws: &WorkspaceId, id: &str) -> ApiResult<WorkspaceSecret> {
    let id = SecretId::new(id).map_err(|_| ApiError::not_found())?;
    records::load(state.store.as_ref(), ws, &id)
        .await?
        .ok_or_else(ApiError::not_found)
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/secrets", tag = "secrets",
    params(("ws" = String, Path)),
    responses((status = 200, body = SecretList), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("member"))))]
async fn list_secrets(
    State(state): State<AppState>,
    caller: Caller,
    Path(ws): Path<String>,
) -> ApiResult<Json<SecretList>> {
    let ws = caller.workspace(&state, &ws, Action::View).await?;
    let items = records::list(state.store.as_ref(), &ws)
        .await?
        .iter()
        .map(SecretView::from)
        .collect();
    Ok(Json(SecretList {
        items,
        next_cursor: None,
    }))
}

#[utoipa::path(post, path = "/api/v1/workspaces/{ws}/secrets", tag = "secrets", request_body = CreateSecret,
    params(("ws" = String, Path)),
    responses((status = 201, body = SecretView), (status = 400, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem, description = "the name is taken in this workspace")),
    extensions(("x-agenthold-role" = json!("workspace_admin"))))]
async fn create_secret(
    State(state): State<AppState>,
    caller: Caller,
    Path(ws): Path<String>,
    Body(body): Body<CreateSecret>,
) -> ApiResult<Response> {
    let ws = caller.workspace(&state, &ws, Action::Administer).await?;
    let Some((preset, rules)) = rules_of(
        body.preset.as_deref(),
        body.hosts.as_deref(),
        body.header.as_deref(),
        body.template.as_deref(),
    )?
    else {
        return Err(ApiError::bad_request(
            "a secret needs a preset, or hosts and header (and template)",
        ));
    };
    let value = body.value.0;
    check_secret(&body.name, &value, &rules)?;
    // The agent secrets of provider logins are named so (S3): a workspace secret must not clash with them.
    if body.name.starts_with("provider-login.") {
        return Err(ApiError::bad_request(
            "names starting with \"provider-login.\" are reserved for provider logins",
        ));
    }
    let _edits = state.edits.lock().await;
    let existing = records::list(state.store.as_ref(), &ws).await?;
    if existing.iter().any(|s| s.name == body.name) {
        return Err(ApiError::conflict(format!(
            "a secret named {:?} exists in this workspace",
            body.name
        )));
    }
    if existing.len() >= MAX_SECRETS {
        return Err(ApiError::conflict(format!(
            "a workspace holds at most {MAX_SECRETS} secrets"
        )));
    }
    let secret = WorkspaceSecret::new(
        &state.vault,
        ws,
        body.name,
        preset,
        rules,
        &value,
        caller.user().clone(),
    )?;
    drop(value);
    records::save(state.store.as_ref(), &secret).await?;
    tracing::info!(workspace = %secret.workspace, secret = %secret.id, name = %secret.name, "secret created");
    Ok(created(SecretView::from(&secret)))
}

#[utoipa::path(get, path = "/api/v1/workspaces/{ws}/secrets/{secret}", tag = "secrets",
    params(("ws" = String, Path), ("secret" = String, Path)),
    responses((status = 200, body = SecretView), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("member"))))]
async fn get_secret(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, secret)): Path<(String, String)>,
) -> ApiResult<Json<SecretView>> {
    let ws = caller.workspace(&state, &ws, Action::View).await?;
    Ok(Json(SecretView::from(&find(&state, &ws, &secret).await?)))
}

#[utoipa::path(put, path = "/api/v1/workspaces/{ws}/secrets/{secret}", tag = "secrets", request_body = ReplaceSecret,
    params(("ws" = String, Path), ("secret" = String, Path)),
    responses((status = 200, body = SecretView, description = "replaced, and applied to every agent it is attached to"),
        (status = 400, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("workspace_admin"))))]
async fn replace_secret(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, secret)): Path<(String, String)>,
    Body(body): Body<ReplaceSecret>,
) -> ApiResult<Json<SecretView>> {
    let ws = caller.workspace(&state, &ws, Action::Administer).await?;
    let new_rules = rules_of(
        body.preset.as_deref(),
        body.hosts.as_deref(),
        body.header.as_deref(),
        body.template.as_deref(),
    )?;
    if new_rules.is_none() && body.value.is_none() {
        return Err(ApiError::bad_request(
            "nothing to change: give a value, rules (preset, or hosts and header), or both",
        ));
    }
    let _edits = state.edits.lock().await;
    let mut secret = find(&state, &ws, &secret).await?;
    let value = match body.value {
        Some(v) => v.0,
        None => secret.open(&state.vault)?,
    };
    if let Some((preset, rules)) = new_rules {
        secret.preset = preset;
        secret.rules = rules;
    }
    check_secret(&secret.name, &value, &secret.rules)?;
    // Sealed again under the (possibly new) rules: the AAD binds them (S15).
    secret.seal(&state.vault, &value)?;
    drop(value);
    secret.revision += 1;
    secret.updated_at = crate::serve::records::now_rfc3339();
    records::save(state.store.as_ref(), &secret).await?;
    for (agent, atts) in records::attached_to(&state, &ws, &secret.id).await? {
        if let Err(e) = records::apply(&state, &agent, atts).await {
            // The next start applies it again (the attachment's revision is behind).
            tracing::warn!(agent = %agent, secret = %secret.id, error = %e, "could not apply a changed secret");
        }
    }
    tracing::info!(workspace = %ws, secret = %secret.id, revision = secret.revision, "secret replaced");
    Ok(Json(SecretView::from(&secret)))
}

#[utoipa::path(delete, path = "/api/v1/workspaces/{ws}/secrets/{secret}", tag = "secrets",
    params(("ws" = String, Path), ("secret" = String, Path)),
    responses((status = 204, description = "detached from every agent, then deleted"), (status = 403, body = Problem), (status = 404, body = Problem)),
    extensions(("x-agenthold-role" = json!("workspace_admin"))))]
async fn delete_secret(
    State(state): State<AppState>,
    caller: Caller,
    Path((ws, secret)): Path<(String, String)>,
) -> ApiResult<Response> {
    let ws = caller.workspace(&state, &ws, Action::Administer).await?;
    let _edits = state.edits.lock().await;
    let secret = find(&state, &ws, &secret).await?;
    for (agent, mut atts) in records::attached_to(&state, &ws, &secret.id).await? {
        atts.items.retain(|a| a.secret != secret.id);
        match records::apply(&state, &agent, atts).await {
            Ok(_) => {}
            // The agent has no sandbox record any more: nothing holds the value there.
            Err(e) if e.status() == StatusCode::NOT_FOUND => {}
            // Stop with the secret still there: deleting again finishes the job.
            Err(e) => return Err(e),
        }
    }
    records::delete(state.store.as_ref(), &ws, &secret.id).await?;
    tracing::info!(workspace = %ws, secret = %secret.id, "secret deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}
