//! How the server starts each harness inside a sandbox (P1): the argv prefix that drops to the image's
//! non-root user `agent`, the environment (`HOME` on the agent's volume), and the harness's own command
//! line. The prompt never appears here: it always goes to the process's standard input, so no prompt can
//! become an argument or a shell word. Helper `harness` (which owns the harness image) may refine this file.
// enforces: P1

use std::collections::BTreeMap;

use super::Harness;

/// The agent's volume, home of the `agent` user.
pub(crate) const HOME: &str = "/workspace";

/// The prefix that runs the rest of the argv as the image's non-root user `agent` (Claude Code refuses
/// its bypass-permission mode as root).
pub(crate) const AS_AGENT: [&str; 5] = ["setpriv", "--reuid=agent", "--regid=agent", "--init-groups", "--"];

/// What a run asks of its harness besides the prompt.
#[derive(Debug, Clone, Default)]
pub(crate) struct HarnessArgs<'a> {
    /// A session to continue (`--resume` / `codex exec resume`).
    pub(crate) resume: Option<&'a str>,
    /// The model to use.
    pub(crate) model: Option<&'a str>,
    /// The caller's argv (`custom` only).
    pub(crate) custom: Option<&'a [String]>,
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
            argv.extend(["codex", "exec", "--json", "--skip-git-repo-check"].map(str::to_owned));
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
        ("CODEX_HOME", "/workspace/.codex"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
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
}
