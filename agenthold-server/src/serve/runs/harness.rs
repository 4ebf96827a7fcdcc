//! How the server starts each harness inside a sandbox (P1): the argv prefix that drops to the image's
//! non-root user `agent`, the environment (`HOME` on the agent's volume), and the harness's own command
//! line. The prompt never appears here: it always goes to the process's standard input, so no prompt can
//! become an argument or a shell word. Helper `harness` (which owns the harness image) may refine this file.
//!
//! What each binary needs inside a sandbox (checked against `agenthold/harness:latest`, claude 2.1.332 and
//! codex 0.171.0, through the gateway):
//! - Both reach the real host names (`api.anthropic.com`, `api.openai.com`); the gateway maps them, so no
//!   base URL is set. Both go through the sandbox's `HTTPS_PROXY` like everything else.
//! - Trust: claude (a Bun executable) adds `NODE_EXTRA_CA_CERTS`, which every sandbox has; codex (Rust,
//!   static musl) reads `SSL_CERT_FILE` (every sandbox has it) and its own `CODEX_CA_CERTIFICATE`, set here
//!   to the same bundle.
//! - Keys: an agent secret attached with a variable (`ANTHROPIC_API_KEY` with preset `anthropic`,
//!   `OPENAI_API_KEY` with preset `openai`) puts a placeholder in the run's environment; the gateway
//!   swaps it for the value in the one header the preset names (`x-api-key`, `authorization`).
//! - `CODEX_HOME` is not set: codex refuses a `CODEX_HOME` that does not exist yet, and creates its
//!   default, `$HOME/.codex` = `/workspace/.codex` (where its `auth.json` lives), itself.
//! - claude refuses `--dangerously-skip-permissions` as root: runs drop to `agent` ([`AS_AGENT`]).
//! - codex's own sandbox (bubblewrap, landlock) cannot nest in the container, which is the sandbox:
//!   `--dangerously-bypass-approvals-and-sandbox`. Its built-in OpenAI provider first tries the Responses
//!   API over a WebSocket and retries five times before falling back to HTTPS streaming; the run names a
//!   provider for the same endpoint with `supports_websockets=false` ([`CODEX_PROVIDER`]), so every call is
//!   one HTTPS request the gateway sees whole. With a ChatGPT-account login attached to the agent, the run
//!   keeps the built-in provider instead: it reads the account from `auth.json` (placeholders) and calls
//!   `chatgpt.com/backend-api/codex/`, where the gateway injects the account's token.
// enforces: P1

use std::collections::BTreeMap;

use super::Harness;

/// The agent's volume, home of the `agent` user.
pub(crate) const HOME: &str = "/workspace";

/// The prefix that runs the rest of the argv as the image's non-root user `agent` (Claude Code refuses
/// its bypass-permission mode as root).
pub(crate) const AS_AGENT: [&str; 5] = ["setpriv", "--reuid=agent", "--regid=agent", "--init-groups", "--"];

/// The Codex model provider a run uses: the OpenAI Responses API at its real address, key from
/// `OPENAI_API_KEY`, streamed over HTTPS only (no WebSocket attempts); and no analytics or metrics export.
pub(crate) const CODEX_PROVIDER: [&str; 8] = [
    "-c",
    "model_provider=\"agenthold_openai\"",
    "-c",
    "model_providers.agenthold_openai={name=\"OpenAI\",base_url=\"https://api.openai.com/v1\",\
     env_key=\"OPENAI_API_KEY\",wire_api=\"responses\",supports_websockets=false}",
    // Its usage analytics and metrics export go to chatgpt.com hosts the gateway refuses; waiting for them
    // kept a finished `codex exec` alive for about 40 s.
    "-c",
    "analytics.enabled=false",
    "-c",
    "otel.metrics_exporter=\"none\"",
];

/// What a run asks of its harness besides the prompt.
#[derive(Debug, Clone, Default)]
pub(crate) struct HarnessArgs<'a> {
    /// A session to continue (`--resume` / `codex exec resume`).
    pub(crate) resume: Option<&'a str>,
    /// The model to use.
    pub(crate) model: Option<&'a str>,
    /// The caller's argv (`custom` only).
    pub(crate) custom: Option<&'a [String]>,
    /// A ChatGPT account login is attached: `codex` keeps its built-in OpenAI provider (the account in
    /// `auth.json`, requests to `chatgpt.com/backend-api/codex/`) instead of the API-key provider.
    pub(crate) chatgpt_login: bool,
}

/// The full argv of a run of `harness`.
pub(crate) fn argv(harness: Harness, args: &HarnessArgs<'_>) -> Vec<String> {
    let mut argv: Vec<String> = Vec::new();
    match harness {
        Harness::Claude => {
            argv.extend(AS_AGENT.iter().map(|s| (*s).to_owned()));
            argv.extend(
                [
                    "claude",
                    "-p",
                    "--output-format",
                    "stream-json",
                    "--verbose",
                    "--dangerously-skip-permissions",
                ]
                .map(str::to_owned),
            );
            if let Some(id) = args.resume {
                argv.extend(["--resume".to_owned(), id.to_owned()]);
            }
            if let Some(m) = args.model {
                argv.extend(["--model".to_owned(), m.to_owned()]);
            }
        }
        Harness::Codex => {
            argv.extend(AS_AGENT.iter().map(|s| (*s).to_owned()));
            argv.extend(
                [
                    "codex",
                    "exec",
                    "--json",
                    "--skip-git-repo-check",
                    "--dangerously-bypass-approvals-and-sandbox",
                ]
                .map(str::to_owned),
            );
            if args.chatgpt_login {
                // Only the switches that keep codex from calling hosts the gateway refuses.
                argv.extend(CODEX_PROVIDER[4..].iter().map(|s| (*s).to_owned()));
            } else {
                argv.extend(CODEX_PROVIDER.iter().map(|s| (*s).to_owned()));
            }
            if let Some(m) = args.model {
                argv.extend(["--model".to_owned(), m.to_owned()]);
            }
            if let Some(id) = args.resume {
                argv.extend(["resume".to_owned(), id.to_owned()]);
            }
            // `-`: read the prompt from standard input.
            argv.push("-".to_owned());
        }
        Harness::Custom => {
            // The operator's own command, run as an exec would be (an operator may exec anything anyway).
            argv.extend(args.custom.unwrap_or_default().iter().cloned());
        }
    }
    argv
}

/// The environment of a run of `harness`.
pub(crate) fn env(harness: Harness) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    if harness == Harness::Custom {
        return env;
    }
    for (k, v) in [
        ("HOME", HOME),
        ("USER", "agent"),
        ("LOGNAME", "agent"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_ERROR_REPORTING", "1"),
        ("CODEX_CA_CERTIFICATE", sandboxd::contract::CA_BUNDLE),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    env
}

/// The working directory of a run of `harness` (`None`: the image's default).
pub(crate) fn cwd(harness: Harness) -> Option<String> {
    (harness != Harness::Custom).then(|| HOME.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_is_never_in_the_argv_and_options_are_separate_items() {
        let args = HarnessArgs {
            resume: Some("abc; rm -rf /"),
            model: Some("m"),
            custom: None,
            chatgpt_login: false,
        };
        let claude = argv(Harness::Claude, &args);
        assert_eq!(&claude[..5], AS_AGENT.map(str::to_owned).as_slice());
        assert!(claude.windows(2).any(|w| w == ["--resume", "abc; rm -rf /"]));
        let codex = argv(Harness::Codex, &args);
        assert_eq!(codex.last().map(String::as_str), Some("-"));
        assert!(codex.windows(2).any(|w| w == ["resume", "abc; rm -rf /"]));
        let custom = vec!["cat".to_owned()];
        let own = argv(
            Harness::Custom,
            &HarnessArgs {
                custom: Some(&custom),
                ..HarnessArgs::default()
            },
        );
        assert_eq!(own, custom);
        assert_eq!(env(Harness::Claude).get("HOME").map(String::as_str), Some(HOME));
        assert!(env(Harness::Custom).is_empty());
    }

    #[test]
    fn codex_on_a_chatgpt_login_keeps_its_own_provider() {
        let codex = argv(
            Harness::Codex,
            &HarnessArgs {
                chatgpt_login: true,
                ..HarnessArgs::default()
            },
        );
        assert!(
            !codex.iter().any(|a| a.starts_with("model_provider")),
            "{codex:?}"
        );
        assert!(codex.iter().any(|a| a == "analytics.enabled=false"), "{codex:?}");
        assert!(
            codex.iter().any(|a| a == "otel.metrics_exporter=\"none\""),
            "{codex:?}"
        );
        assert_eq!(codex.last().map(String::as_str), Some("-"));
        let api_key = argv(Harness::Codex, &HarnessArgs::default());
        assert!(
            api_key.iter().any(|a| a.starts_with("model_provider=")),
            "{api_key:?}"
        );
    }

    #[test]
    fn codex_streams_over_https_only_and_trusts_the_sandbox_bundle() {
        let codex = argv(Harness::Codex, &HarnessArgs::default());
        assert!(
            codex
                .iter()
                .any(|a| a == "--dangerously-bypass-approvals-and-sandbox")
        );
        let provider = codex
            .windows(2)
            .find(|w| w[0] == "-c" && w[1].starts_with("model_providers."))
            .map(|w| w[1].clone())
            .unwrap_or_default();
        assert!(provider.contains("supports_websockets=false"), "{provider}");
        assert!(
            provider.contains("base_url=\"https://api.openai.com/v1\""),
            "{provider}"
        );
        assert!(provider.contains("env_key=\"OPENAI_API_KEY\""), "{provider}");
        let env = env(Harness::Codex);
        assert_eq!(
            env.get("CODEX_CA_CERTIFICATE").map(String::as_str),
            Some(sandboxd::contract::CA_BUNDLE)
        );
        // codex refuses a CODEX_HOME that does not exist yet; its default is $HOME/.codex.
        assert!(!env.contains_key("CODEX_HOME"));
        assert_eq!(env.get("USER").map(String::as_str), Some("agent"));
    }
}
