//! Command-line parsing: the argument grammar of the contract in the crate docs, by hand (no parser crate in a
//! binary that ships inside every sandbox).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use sandboxd::contract::command;
use sandboxd::contract::tunnel::Harness;

/// The synopsis printed with usage errors and `--help`.
pub(crate) const USAGE: &str = "sandboxd [--root DIR] hold
sandboxd [--root DIR] boot [--] [CMD ARG...]
sandboxd [--root DIR] run [--timeout-ms N] [--id ID] [--] ARGV...
sandboxd [--root DIR] run --id ID --request-stdin
sandboxd [--root DIR] kill --id ID
sandboxd [--root DIR] send [--harness claude|codex] [--] AGENT_NAME PROMPT|-
agenthold-send [--harness claude|codex] [--] AGENT_NAME PROMPT|-
sandboxd --version | --help";

/// A parsed command line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Invocation {
    /// `--root DIR` (tests): prefix of every absolute path; `/` when absent.
    pub(crate) root: PathBuf,
    /// The subcommand and its arguments.
    pub(crate) command: Command,
}

/// One subcommand with its arguments.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Command {
    /// `hold`: the gateway holder.
    Hold,
    /// `boot [--] [CMD ARG...]`: PID 1 of a sandbox; `argv` empty when there is no workload.
    Boot {
        /// The workload command line, possibly empty.
        argv: Vec<OsString>,
    },
    /// `run ... -- ARGV...`: the exec wrapper.
    Run(RunOptions),
    /// `kill --id ID`: cancel a running `run`.
    Kill {
        /// The exec id given to `run --id`.
        id: String,
    },
    /// `send [--harness H] AGENT PROMPT` (or the program called as `agenthold-send`): message another agent.
    Send(SendOptions),
    /// `--version`.
    Version,
    /// `--help`.
    Help,
}

/// Arguments of `run`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RunOptions {
    /// `--timeout-ms N`; `None` when absent or 0.
    pub(crate) timeout: Option<Duration>,
    /// `--id ID`, already validated with [`valid_id`].
    pub(crate) id: Option<String>,
    /// The command and its arguments; never empty unless `request_stdin`.
    pub(crate) argv: Vec<OsString>,
    /// `--request-stdin`: the command (and the timeout) come on standard input
    /// ([`sandboxd::contract::request`]); `argv` is empty then.
    pub(crate) request_stdin: bool,
}

/// Arguments of `send`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SendOptions {
    /// `--harness` (default `claude`).
    pub(crate) harness: Harness,
    /// The target agent's name, as it is in the workspace.
    pub(crate) name: String,
    /// The prompt, or `None` for `-` (read from stdin).
    pub(crate) prompt: Option<String>,
}

/// A usage error.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct UsageError {
    /// What was wrong, naming the offending argument.
    pub(crate) message: String,
    /// True when the error belongs to `run`, which reports its own failures as 125.
    pub(crate) run: bool,
}

impl UsageError {
    /// A usage error outside `run`.
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            run: false,
        }
    }
}

/// Whether `id` is acceptable as an exec id (see [`sandboxd::contract::valid_exec_id`]).
pub(crate) fn valid_id(id: &str) -> bool {
    sandboxd::contract::valid_exec_id(id)
}

/// Splits `--name=value` / `--name value` option syntax. Returns the option name and its inline value.
fn split_option(arg: &str) -> (&str, Option<&str>) {
    match arg.split_once('=') {
        Some((name, value)) if name.starts_with("--") => (name, Some(value)),
        _ => (arg, None),
    }
}

/// Takes the value of option `name`: the inline `=value` or the next argument.
fn option_value(
    name: &str,
    inline: Option<&str>,
    rest: &mut std::vec::IntoIter<OsString>,
) -> Result<String, String> {
    if let Some(value) = inline {
        return Ok(value.to_owned());
    }
    let value = rest.next().ok_or_else(|| format!("{name} needs a value"))?;
    value
        .into_string()
        .map_err(|v| format!("{name}: value {v:?} is not UTF-8"))
}

/// Parses the arguments after the program name.
pub(crate) fn parse(args: Vec<OsString>) -> Result<Invocation, UsageError> {
    let mut rest = args.into_iter();
    let mut root = PathBuf::from("/");
    loop {
        let Some(arg) = rest.next() else {
            return Err(UsageError::new("missing subcommand"));
        };
        let Some(text) = arg.to_str() else {
            return Err(UsageError::new(format!("unknown subcommand {arg:?}")));
        };
        let (name, inline) = split_option(text);
        let command = match name {
            "--root" => {
                root = PathBuf::from(option_value(name, inline, &mut rest).map_err(UsageError::new)?);
                if !root.is_absolute() {
                    return Err(UsageError::new(format!(
                        "--root {}: must be an absolute path",
                        root.display()
                    )));
                }
                continue;
            }
            "--version" | "-V" => Command::Version,
            "--help" | "-h" => Command::Help,
            command::HOLD => {
                if let Some(extra) = rest.next() {
                    return Err(UsageError::new(format!("hold: unexpected argument {extra:?}")));
                }
                Command::Hold
            }
            command::BOOT => {
                let mut argv: Vec<OsString> = rest.by_ref().collect();
                if argv.first().is_some_and(|a| a == "--") {
                    argv.remove(0);
                } else if let Some(first) = argv
                    .first()
                    .and_then(|a| a.to_str())
                    .filter(|a| a.starts_with('-'))
                {
                    return Err(UsageError::new(format!(
                        "boot: unknown option {first} (use -- before CMD)"
                    )));
                }
                Command::Boot { argv }
            }
            command::RUN => {
                Command::Run(parse_run(&mut rest).map_err(|message| UsageError { message, run: true })?)
            }
            command::KILL => Command::Kill {
                id: parse_kill(&mut rest).map_err(UsageError::new)?,
            },
            command::SEND => Command::Send(parse_send(&mut rest).map_err(UsageError::new)?),
            other => return Err(UsageError::new(format!("unknown subcommand {other:?}"))),
        };
        return Ok(Invocation { root, command });
    }
}

/// Parses `run`'s options and command line.
fn parse_run(rest: &mut std::vec::IntoIter<OsString>) -> Result<RunOptions, String> {
    let mut opts = RunOptions {
        timeout: None,
        id: None,
        argv: Vec::new(),
        request_stdin: false,
    };
    while let Some(arg) = rest.next() {
        let text = arg.to_str().unwrap_or_default();
        let (name, inline) = split_option(text);
        match name {
            "--" => break,
            command::OPT_TIMEOUT_MS => {
                let value = option_value(name, inline, rest)?;
                let ms: u64 = value
                    .parse()
                    .map_err(|_| format!("run: --timeout-ms {value:?}: not a number"))?;
                opts.timeout = (ms > 0).then(|| Duration::from_millis(ms));
            }
            command::OPT_ID => {
                let value = option_value(name, inline, rest)?;
                if !valid_id(&value) {
                    return Err(format!(
                        "run: --id {value:?}: expected [A-Za-z0-9_.-]{{1,128}}, not starting with ."
                    ));
                }
                opts.id = Some(value);
            }
            command::OPT_REQUEST_STDIN if inline.is_none() => opts.request_stdin = true,
            _ if text.starts_with('-') => return Err(format!("run: unknown option {text}")),
            _ => {
                opts.argv.push(arg);
                break;
            }
        }
    }
    opts.argv.extend(rest.by_ref());
    match (opts.request_stdin, opts.argv.is_empty()) {
        (false, true) => Err("run: missing command".to_owned()),
        (true, false) => Err(format!(
            "run: {}: the command comes on stdin, not as arguments",
            command::OPT_REQUEST_STDIN
        )),
        (true, true) if opts.timeout.is_some() => Err(format!(
            "run: {}: the timeout comes on stdin, not as --timeout-ms",
            command::OPT_REQUEST_STDIN
        )),
        _ => Ok(opts),
    }
}

/// Parses the arguments of `send` (also the whole command line of `agenthold-send`).
pub(crate) fn parse_send(rest: &mut std::vec::IntoIter<OsString>) -> Result<SendOptions, String> {
    let mut harness = Harness::Claude;
    let mut positional: Vec<String> = Vec::new();
    let mut options_done = false;
    while let Some(arg) = rest.next() {
        let text = arg
            .into_string()
            .map_err(|a| format!("send: argument {a:?} is not UTF-8"))?;
        if options_done || positional.len() == 1 || text == "-" || !text.starts_with('-') {
            positional.push(text);
            continue;
        }
        match split_option(&text) {
            ("--", None) => options_done = true,
            (command::OPT_HARNESS, inline) => {
                let value = option_value(command::OPT_HARNESS, inline, rest)?;
                harness = Harness::parse(&value)
                    .ok_or_else(|| format!("send: --harness {value:?}: expected claude or codex"))?;
            }
            _ => return Err(format!("send: unknown option {text}")),
        }
    }
    let mut positional = positional.into_iter();
    let (Some(name), Some(prompt), None) = (positional.next(), positional.next(), positional.next()) else {
        return Err("send: expected AGENT_NAME and PROMPT (- reads the prompt from stdin)".to_owned());
    };
    Ok(SendOptions {
        harness,
        name,
        prompt: (prompt != "-").then_some(prompt),
    })
}

/// Parses `kill --id ID`.
fn parse_kill(rest: &mut std::vec::IntoIter<OsString>) -> Result<String, String> {
    let mut id = None;
    while let Some(arg) = rest.next() {
        let text = arg.to_str().unwrap_or_default().to_owned();
        match split_option(&text) {
            (command::OPT_ID, inline) => {
                let value = option_value(command::OPT_ID, inline, rest)?;
                if !valid_id(&value) {
                    return Err(format!(
                        "kill: --id {value:?}: expected [A-Za-z0-9_.-]{{1,128}}, not starting with ."
                    ));
                }
                id = Some(value);
            }
            _ => return Err(format!("kill: unexpected argument {arg:?}")),
        }
    }
    id.ok_or_else(|| "kill: missing --id".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    fn command(list: &[&str]) -> Command {
        parse(args(list)).expect("parses").command
    }

    #[test]
    fn subcommands_parse() {
        assert_eq!(command(&["hold"]), Command::Hold);
        assert_eq!(command(&["--version"]), Command::Version);
        assert_eq!(command(&["boot"]), Command::Boot { argv: vec![] });
        assert_eq!(
            command(&["boot", "--", "sh", "-c", "x"]),
            Command::Boot {
                argv: args(&["sh", "-c", "x"])
            }
        );
        assert_eq!(
            command(&["boot", "sleep", "1"]),
            Command::Boot {
                argv: args(&["sleep", "1"])
            }
        );
        assert_eq!(
            command(&["kill", "--id", "abc"]),
            Command::Kill { id: "abc".into() }
        );
        assert_eq!(command(&["kill", "--id=abc"]), Command::Kill { id: "abc".into() });
    }

    #[test]
    fn run_options_and_argv() {
        let Command::Run(opts) =
            command(&["run", "--timeout-ms", "500", "--id=x1", "--", "ls", "--id", "-l"])
        else {
            panic!("not run");
        };
        assert_eq!(opts.timeout, Some(Duration::from_millis(500)));
        assert_eq!(opts.id.as_deref(), Some("x1"));
        assert_eq!(opts.argv, args(&["ls", "--id", "-l"]));
        let Command::Run(opts) = command(&["run", "--timeout-ms=0", "true", "-x"]) else {
            panic!("not run")
        };
        assert_eq!(opts.timeout, None);
        assert_eq!(opts.argv, args(&["true", "-x"]));
        assert!(!opts.request_stdin);
        let Command::Run(opts) = command(&["run", "--id", "x2", "--request-stdin"]) else {
            panic!("not run")
        };
        assert!(opts.request_stdin);
        assert_eq!(opts.id.as_deref(), Some("x2"));
        assert!(opts.argv.is_empty());
    }

    #[test]
    fn root_is_global_and_absolute() {
        let inv = parse(args(&["--root", "/tmp/x", "hold"])).expect("parses");
        assert_eq!(inv.root, PathBuf::from("/tmp/x"));
        assert!(parse(args(&["--root", "rel", "hold"])).is_err());
    }

    #[test]
    fn errors_are_reported() {
        for bad in [
            &[][..],
            &["nope"],
            &["hold", "x"],
            &["kill"],
            &["kill", "--id", "../x"],
            &["boot", "--weird"],
            &["--root"],
        ] {
            let err = parse(args(bad)).expect_err("rejected");
            assert!(!err.run, "{bad:?}");
        }
        for bad in [
            &["run"][..],
            &["run", "--"],
            &["run", "--timeout-ms", "x", "--", "a"],
            &["run", "--bogus", "a"],
            &["run", "--request-stdin", "--", "a"],
            &["run", "--request-stdin", "--timeout-ms", "5"],
            &["run", "--request-stdin=x"],
        ] {
            assert!(parse(args(bad)).expect_err("rejected").run, "{bad:?}");
        }
    }

    #[test]
    fn send_arguments() {
        let Command::Send(opts) = command(&["send", "--harness=codex", "b", "-"]) else {
            panic!("not send");
        };
        assert_eq!(
            opts,
            SendOptions {
                harness: Harness::Codex,
                name: "b".into(),
                prompt: None
            }
        );
        // After the name, everything is the prompt, even what looks like an option.
        let Command::Send(opts) = command(&["send", "my agent", "--harness"]) else {
            panic!("not send");
        };
        assert_eq!(opts.harness, Harness::Claude);
        assert_eq!(opts.name, "my agent");
        assert_eq!(opts.prompt.as_deref(), Some("--harness"));
        let Command::Send(opts) = command(&["send", "--", "-n", "p"]) else {
            panic!("not send");
        };
        assert_eq!(opts.name, "-n");
        for bad in [
            &["send"][..],
            &["send", "b"],
            &["send", "b", "p", "q"],
            &["send", "--harness", "custom", "b", "p"],
            &["send", "--bogus", "b", "p"],
        ] {
            assert!(!parse(args(bad)).expect_err("rejected").run, "{bad:?}");
        }
    }

    #[test]
    fn ids_are_file_name_safe() {
        assert!(valid_id("exec-01_A.b"));
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", "x\n", &"a".repeat(129)] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }
}
