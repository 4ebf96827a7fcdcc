//! The `--secrets FILE` format of `agenthold run` (E11, E12, E15): a YAML list of secrets.
//!
//! ```yaml
//! - name: api                     # header rule
//!   value_env: API_TOKEN          # or `value: …` (prefer value_env: files get copied)
//!   env: API_KEY                  # the sandbox sees the placeholder in $API_KEY
//!   hosts: [api.example.com]
//!   header: Authorization
//!   template: "Bearer {{.Value}}"
//!   also_in:                      # optional: further places the placeholder is replaced in
//!     headers: [x-goog-api-key]   # (raw); any other place a placeholder appears is refused (403)
//!     query: [key]                # (percent-encoded); never the path
//! - name: gh                      # preset rule
//!   preset: github                # anthropic | openai | github | gitlab | openrouter
//!   value_env: GH_TOKEN
//!   env: GH_TOKEN
//! - name: chatgpt                 # account login: replaced only inside `header`, never added
//!   value_env: CHATGPT_TOKEN
//!   env: CHATGPT_TOKEN
//!   hosts: [chatgpt.com]
//!   header: Authorization
//!   login: true
//!   paths: [/backend-api/]
//! - name: chatgpt-refresh         # token refresh: the gateway answers POST token_path itself
//!   value_env: CHATGPT_REFRESH
//!   env: CHATGPT_REFRESH
//!   hosts: [auth.openai.com]
//!   token_path: /oauth/token
//!   access_secret: chatgpt        # the secret whose value a refresh renews
//! ```

use std::path::Path;

use agenthold_core::secret::{AlsoIn, Preset, SecretRule, SecretSpec, SecretValue};
use anyhow::{Context, Result, bail};

/// One entry of the file, as written.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    value: Option<String>,
    value_env: Option<String>,
    env: Option<String>,
    preset: Option<String>,
    hosts: Option<Vec<String>>,
    header: Option<String>,
    template: Option<String>,
    #[serde(default)]
    login: bool,
    #[serde(default)]
    paths: Vec<String>,
    token_path: Option<String>,
    access_secret: Option<String>,
    also_in: Option<AlsoInEntry>,
}

/// `also_in:` as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AlsoInEntry {
    #[serde(default)]
    headers: Vec<String>,
    #[serde(default)]
    query: Vec<String>,
}

/// Read and validate a secrets file; values come from the file or from the named environment variables of
/// this process.
pub(crate) fn load(path: &Path) -> Result<Vec<SecretSpec>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    parse(&text, |k| std::env::var(k).ok()).with_context(|| format!("{}", path.display()))
}

fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Vec<SecretSpec>> {
    let entries: Vec<Entry> = serde_saphyr::from_str(text).context("not a YAML list of secrets")?;
    entries.into_iter().map(|e| spec(e, &env)).collect()
}

fn spec(e: Entry, env: &impl Fn(&str) -> Option<String>) -> Result<SecretSpec> {
    let name = e.name.clone();
    let value = match (&e.value, &e.value_env) {
        (Some(v), None) => v.clone(),
        (None, Some(var)) => env(var).with_context(|| format!("secret {name:?}: ${var} is not set"))?,
        _ => bail!("secret {name:?}: give exactly one of `value` and `value_env`"),
    };
    let value = SecretValue::from(value);
    let spec = if let Some(preset) = &e.preset {
        if e.hosts.is_some()
            || e.header.is_some()
            || e.template.is_some()
            || e.login
            || !e.paths.is_empty()
            || e.also_in.is_some()
        {
            bail!("secret {name:?}: a preset takes only name, value or value_env, and env");
        }
        SecretSpec::preset(&name, Preset::from_name(preset)?, value, e.env.as_deref())?
    } else {
        let hosts = e
            .hosts
            .with_context(|| format!("secret {name:?}: `hosts` is required without a preset"))?;
        if let Some(path) = &e.token_path {
            let access = e
                .access_secret
                .as_deref()
                .with_context(|| format!("secret {name:?}: `token_path` needs `access_secret`"))?;
            if e.header.is_some()
                || e.template.is_some()
                || e.login
                || !e.paths.is_empty()
                || e.also_in.is_some()
            {
                bail!("secret {name:?}: a token refresh takes hosts, token_path and access_secret only");
            }
            let rule = SecretRule::token_refresh(&hosts, path, access)
                .with_context(|| format!("secret {name:?}"))?;
            return Ok(SecretSpec::new(&name, value, e.env.as_deref(), vec![rule])?);
        }
        let header = e
            .header
            .with_context(|| format!("secret {name:?}: `header` is required without a preset"))?;
        let rule = if e.login {
            if e.also_in.is_some() {
                bail!("secret {name:?}: a login rule replaces the placeholder in its one header only (no also_in)");
            }
            if e.template.is_some() {
                bail!(
                    "secret {name:?}: a login rule replaces the placeholder in place and takes no template"
                );
            }
            SecretRule::login(&hosts, &header, &e.paths)
        } else {
            if !e.paths.is_empty() {
                bail!("secret {name:?}: `paths` is only for login rules");
            }
            let template = e.template.as_deref().unwrap_or("{{.Value}}");
            let rule = SecretRule::header(&hosts, &header, template);
            match e.also_in {
                Some(a) => rule.and_then(|r| r.with_also_in(AlsoIn::new(&a.headers, &a.query)?)),
                None => rule,
            }
        }
        .with_context(|| format!("secret {name:?}"))?;
        SecretSpec::new(&name, value, e.env.as_deref(), vec![rule])?
    };
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        (k == "TOKEN").then(|| "from-env".to_owned())
    }

    // covers: E11, E12
    #[test]
    fn parses_rules_presets_and_logins() {
        let text = r#"
- name: api
  value_env: TOKEN
  env: API_KEY
  hosts: [api.example.test]
  header: Authorization
  template: "Bearer {{.Value}}"
- name: gh
  preset: github
  value: ghp_x
- name: login
  value: t
  hosts: [chatgpt.com]
  header: authorization
  login: true
  paths: [/backend-api/]
- name: refresh
  value: r
  hosts: [auth.openai.com]
  token_path: /oauth/token
  access_secret: login
"#;
        let specs = parse(text, env).unwrap();
        assert_eq!(specs.len(), 4);
        assert_eq!(specs[0].value.expose(), b"from-env");
        assert_eq!(specs[0].env.as_deref(), Some("API_KEY"));
        assert!(specs[1].covers("github.com") && specs[1].covers("api.github.com"));
        assert!(specs[2].covers("chatgpt.com"));
    }

    // covers: E13
    #[test]
    fn also_in_names_further_places_and_is_validated() {
        let text = "- name: g\n  value: v\n  hosts: [x.test]\n  header: x-goog-api-key\n  \
                    also_in: {headers: [X-Other], query: [key]}\n";
        let specs = parse(text, env).unwrap();
        match &specs[0].rules[0].kind {
            agenthold_core::secret::RuleKind::Header { also_in, .. } => {
                assert_eq!(also_in.headers, ["x-other"]);
                assert_eq!(also_in.query, ["key"]);
            }
            other => panic!("{other:?}"),
        }
        for (text, needle) in [
            (
                "- name: g\n  value: v\n  hosts: [x.test]\n  header: h\n  also_in: {path: [x]}\n",
                "path",
            ),
            (
                "- name: g\n  value: v\n  hosts: [x.test]\n  header: h\n  also_in: {headers: [h]}\n",
                "sets anyway",
            ),
            (
                "- name: g\n  value: v\n  preset: openai\n  also_in: {query: [k]}\n",
                "preset takes only",
            ),
            (
                "- name: g\n  value: v\n  hosts: [x.test]\n  header: h\n  login: true\n  also_in: {query: [k]}\n",
                "no also_in",
            ),
        ] {
            let err = format!("{:#}", parse(text, env).unwrap_err());
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        for (text, needle) in [
            ("- name: a\n  hosts: [x.test]\n  header: h\n", "exactly one"),
            (
                "- name: a\n  value: v\n  value_env: TOKEN\n  hosts: [x.test]\n  header: h\n",
                "exactly one",
            ),
            (
                "- name: a\n  value_env: NOPE\n  hosts: [x.test]\n  header: h\n",
                "NOPE",
            ),
            ("- name: a\n  value: v\n  header: h\n", "hosts"),
            ("- name: a\n  value: v\n  preset: nope\n", "known presets"),
            (
                "- name: a\n  value: v\n  preset: github\n  hosts: [x.test]\n",
                "preset takes only",
            ),
            (
                "- name: a\n  value: v\n  hosts: [x.test]\n  header: h\n  template: \"{{.Nope}}\"\n",
                "template",
            ),
            (
                "- name: a\n  value: v\n  hosts: [x.test]\n  header: h\n  color: red\n",
                "color",
            ),
            ("name: a\n", "list"),
        ] {
            let err = format!("{:#}", parse(text, env).unwrap_err());
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}
