//! The contract between the runtime (`agenthold-sandbox`) and sandboxd inside a sandbox, written once for both
//! sides: where files live inside a sandbox, the environment variables the runtime sets for sandboxd, the
//! command lines the runtime starts sandboxd with, and the tunnel's wire format.
//!
//! Plain std on purpose: sandboxd is a static binary that must not pull an async runtime, and the runtime
//! depends on this library only for these definitions.
//!
//! Every path here is absolute as the sandbox sees it; [`relative`] gives the form archive entries use.

use std::time::Duration;

/// Writes the path `/.agenthold/<rest>` once, so no path below spells the directory again.
macro_rules! in_dir {
    ($rest:literal) => {
        concat!("/.agenthold/", $rest)
    };
}

/// The directory agenthold owns inside every sandbox.
pub const DIR: &str = "/.agenthold";
/// The sandboxd binary inside a sandbox (bind-mounted read-only by the runtime).
pub const SANDBOXD: &str = in_dir!("bin/sandboxd");
/// The directory the runtime bind-mounts (read-write, mode 0700, owned by root) from the host for the boot
/// token: the runtime writes the token there before every start without an engine call, and `boot`'s
/// delete reaches the host.
pub const BOOT_DIR: &str = in_dir!("boot.d");
/// The boot token file in [`BOOT_DIR`], written by the runtime before every start, deleted by `boot` once
/// read.
pub const BOOT_FILE: &str = in_dir!("boot.d/token");
/// Where sandboxd read the boot token before [`BOOT_DIR`] existed. Sandboxes made then still mount the
/// sandboxd of their version, which reads it here; the runtime uploads their token to this path.
pub const LEGACY_BOOT_FILE: &str = in_dir!("boot");
/// Mode of [`BOOT_FILE`]: readable by its owner only.
pub const BOOT_FILE_MODE: u32 = 0o400;
/// The installation's CA certificate (PEM): one file on the host, bind-mounted read-only into every
/// sandbox (uploaded with the token into sandboxes made before [`BOOT_DIR`]).
pub const CA_FILE: &str = in_dir!("ca.crt");
/// Mode of [`CA_FILE`]: a certificate is public.
pub const CA_FILE_MODE: u32 = 0o444;
/// The bundle `boot` builds from the image's system roots and [`CA_FILE`] (the runtime points the
/// trust-store variables here).
pub const CA_BUNDLE: &str = in_dir!("ca-bundle.pem");
/// Records of running `run --id` commands.
pub const RUN_DIR: &str = in_dir!("run");
/// The Unix socket `boot` listens on for agent messages ([`tunnel::SEND`] requests from
/// [`SEND_COMMAND`]); any user of the sandbox may connect (the harness runs as a non-root user that cannot
/// read the boot token, which never leaves PID 1).
pub const SEND_SOCKET: &str = in_dir!("send.sock");
/// Mode of [`SEND_SOCKET`]: every user of the sandbox may connect.
pub const SEND_SOCKET_MODE: u32 = 0o666;
/// Where the runtime bind-mounts the sandboxd binary a second time (read-only) so that
/// `agenthold-send AGENT PROMPT` is on the usual `PATH` of every image; sandboxd dispatches on its
/// `argv[0]` (see [`command::SEND_NAME`]).
pub const SEND_COMMAND: &str = "/usr/local/bin/agenthold-send";

/// `IP:PORT` of the runtime's tunnel listener for this sandbox (no names: sandboxd never resolves).
pub const ENV_TUNNEL: &str = "AGENTHOLD_TUNNEL";
/// The sandbox's agent id, sent in the tunnel hello.
pub const ENV_AGENT: &str = "AGENTHOLD_AGENT";
/// Every variable the runtime sets for sandboxd (a sandbox's own configuration may not set them).
pub const ENV: [&str; 2] = [ENV_AGENT, ENV_TUNNEL];

/// `path` without its leading `/`, as tar entries name files (`.agenthold/boot`).
#[must_use]
pub fn relative(path: &str) -> &str {
    path.trim_start_matches('/')
}

/// The environment the runtime gives sandboxd: the agent id and, when the deployment runs a tunnel, where
/// it listens.
#[must_use]
pub fn env(agent: &str, tunnel: Option<std::net::SocketAddr>) -> Vec<(&'static str, String)> {
    let mut vars = vec![(ENV_AGENT, agent.to_owned())];
    if let Some(addr) = tunnel {
        vars.push((ENV_TUNNEL, addr.to_string()));
    }
    vars
}

/// Whether `id` is acceptable as an exec id: `[A-Za-z0-9_.-]{1,128}`, not starting with `.` (it becomes a
/// file name under [`RUN_DIR`], so no separators and no `..`).
#[must_use]
pub fn valid_exec_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The command lines the runtime starts sandboxd with (the grammar is in sandboxd's crate docs).
pub mod command {
    use super::SANDBOXD;

    /// `boot`: the entrypoint of every sandbox.
    pub const BOOT: &str = "boot";
    /// `hold`: the gateway holder's command.
    pub const HOLD: &str = "hold";
    /// `run`: the wrapper of every exec.
    pub const RUN: &str = "run";
    /// `kill`: cancel a running `run`.
    pub const KILL: &str = "kill";
    /// `--id ID` of `run` and `kill`.
    pub const OPT_ID: &str = "--id";
    /// `--timeout-ms N` of `run`.
    pub const OPT_TIMEOUT_MS: &str = "--timeout-ms";
    /// `send`: `sandboxd send [--harness claude|codex] AGENT PROMPT`, the same as `agenthold-send`.
    pub const SEND: &str = "send";
    /// The program name sandboxd answers as `send` when called by it (`argv[0]`'s file name).
    pub const SEND_NAME: &str = "agenthold-send";
    /// `--harness claude|codex` of `send`.
    pub const OPT_HARNESS: &str = "--harness";
    /// `--request-stdin` of `run`: the command comes on standard input as a [`super::request`], not as ARGV.
    pub const OPT_REQUEST_STDIN: &str = "--request-stdin";

    /// `SANDBOXD boot`: a sandbox's entrypoint.
    #[must_use]
    pub fn boot() -> Vec<String> {
        vec![SANDBOXD.to_owned(), BOOT.to_owned()]
    }

    /// `SANDBOXD run --id ID [--timeout-ms N] -- ARGV...`: `argv` in its own process group, known by `id`.
    /// A zero timeout would mean none: the smallest timeout is 1 ms.
    #[must_use]
    pub fn run(id: &str, timeout_ms: Option<u128>, argv: Vec<String>) -> Vec<String> {
        let mut cmd = vec![
            SANDBOXD.to_owned(),
            RUN.to_owned(),
            OPT_ID.to_owned(),
            id.to_owned(),
        ];
        if let Some(ms) = timeout_ms {
            cmd.push(OPT_TIMEOUT_MS.to_owned());
            cmd.push(ms.max(1).to_string());
        }
        cmd.push("--".to_owned());
        cmd.extend(argv);
        cmd
    }

    /// `SANDBOXD run --id ID --request-stdin`: a `run` started ahead of its command, which it reads from
    /// standard input ([`super::request`]) and acknowledges before it starts it.
    #[must_use]
    pub fn run_ahead(id: &str) -> Vec<String> {
        vec![
            SANDBOXD.to_owned(),
            RUN.to_owned(),
            OPT_ID.to_owned(),
            id.to_owned(),
            OPT_REQUEST_STDIN.to_owned(),
        ]
    }

    /// `SANDBOXD kill --id ID`: kill the process group `run --id ID` recorded.
    #[must_use]
    pub fn kill(id: &str) -> Vec<String> {
        vec![
            SANDBOXD.to_owned(),
            KILL.to_owned(),
            OPT_ID.to_owned(),
            id.to_owned(),
        ]
    }
}

pub mod request;

/// The boot token the runtime writes to [`BOOT_FILE`] and sandboxd presents in the tunnel hello.
pub mod token {
    /// Bytes of randomness in a token (256 bits).
    pub const BYTES: usize = 32;
    /// Length of a token as written: lower-case hex.
    pub const HEX_LEN: usize = 2 * BYTES;

    /// Whether `token` is a well-formed token: exactly [`HEX_LEN`] lower-case hex characters.
    #[must_use]
    pub fn is_valid(token: &[u8]) -> bool {
        token.len() == HEX_LEN && token.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }
}

/// The tunnel protocol, version 1 (S2). Lines end with `\n` and are at most [`tunnel::MAX_LINE`] bytes.
///
/// The client sends [`tunnel::hello`]; the server answers [`tunnel::OK`] or [`tunnel::err`]; then the client
/// sends [`tunnel::PING`] after [`tunnel::PING_EVERY`] of silence and expects [`tunnel::PONG`] within
/// [`tunnel::REPLY_TIMEOUT`].
///
/// Or, on a fresh connection, the first thing after the `OK` is one agent message request
/// ([`tunnel::SEND`], see [`tunnel::parse_send`]) answered by [`tunnel::started`] or [`tunnel::err`], and the
/// connection ends: a request connection is not the sandbox's keep-alive tunnel and does not replace it.
pub mod tunnel {
    use super::Duration;

    mod send;
    pub use send::*;

    /// First word of the hello.
    pub const MAGIC: &str = "AGENTHOLD-TUNNEL";
    /// The protocol version this side speaks.
    pub const VERSION: &str = "1";
    /// Longest line either side may send, newline included.
    pub const MAX_LINE: usize = 256;
    /// Longest agent id a hello may carry.
    pub const MAX_AGENT: usize = 128;
    /// The server's answer to an accepted hello (without the newline).
    pub const OK: &str = "OK";
    /// Prefix of the server's refusal (`ERR <reason>`).
    pub const ERR: &str = "ERR ";
    /// The client's keep-alive.
    pub const PING: &str = "PING";
    /// The server's answer to [`PING`].
    pub const PONG: &str = "PONG";
    /// Silence after which the client sends [`PING`].
    pub const PING_EVERY: Duration = Duration::from_secs(10);
    /// How long the client waits for `OK` and each `PONG` (and for connects and writes).
    pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

    /// Whether `agent` can go into a hello: non-empty, printable ASCII without spaces, at most
    /// [`MAX_AGENT`] bytes.
    #[must_use]
    pub fn valid_agent(agent: &str) -> bool {
        !agent.is_empty() && agent.len() <= MAX_AGENT && agent.bytes().all(|b| b.is_ascii_graphic())
    }

    /// The hello line, newline included. It contains the token: write it to the socket only.
    #[must_use]
    pub fn hello(agent: &str, token: &str) -> String {
        format!("{MAGIC} {VERSION} {agent} {token}\n")
    }

    /// A refusal line, newline included.
    #[must_use]
    pub fn err(reason: &str) -> String {
        format!("{ERR}{reason}\n")
    }

    /// A line with its newline, as sent on the wire.
    #[must_use]
    pub fn line(word: &str) -> String {
        format!("{word}\n")
    }

    /// A hello as the server reads it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Hello<'a> {
        /// The agent id the client claims (the server checks it against the listener's agent).
        pub agent: &'a str,
        /// The token as presented (its form is not checked here: the server compares hashes).
        pub token: &'a str,
    }

    /// Why a line is not a hello.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum HelloError {
        /// Not `MAGIC VERSION AGENT TOKEN`, or another version.
        Malformed,
    }

    impl std::fmt::Display for HelloError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Self::Malformed => f.write_str("not a version 1 tunnel hello"),
            }
        }
    }

    impl std::error::Error for HelloError {}

    /// Parses a hello line (without its newline; surrounding whitespace is ignored). Exactly four words; the
    /// agent as [`valid_agent`], the token printable ASCII.
    ///
    /// # Errors
    /// [`HelloError::Malformed`] when the line is not a version 1 hello.
    pub fn parse_hello(line: &str) -> Result<Hello<'_>, HelloError> {
        let mut words = line.split_ascii_whitespace();
        if words.next() != Some(MAGIC) || words.next() != Some(VERSION) {
            return Err(HelloError::Malformed);
        }
        let (Some(agent), Some(token), None) = (words.next(), words.next(), words.next()) else {
            return Err(HelloError::Malformed);
        };
        // ASCII whitespace (what splits the words) leaves out control bytes such as vertical tab: only
        // printable words are an agent or a token (found by the `tunnel_hello` fuzz target).
        if !valid_agent(agent) || token.len() > MAX_LINE || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(HelloError::Malformed);
        }
        Ok(Hello { agent, token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_live_under_the_agenthold_directory() {
        for path in [
            SANDBOXD,
            BOOT_DIR,
            BOOT_FILE,
            LEGACY_BOOT_FILE,
            CA_FILE,
            CA_BUNDLE,
            RUN_DIR,
            SEND_SOCKET,
        ] {
            assert!(
                path.starts_with(DIR) && path[DIR.len()..].starts_with('/'),
                "{path}"
            );
        }
        assert_eq!(BOOT_FILE, "/.agenthold/boot.d/token");
        assert!(BOOT_FILE.starts_with(&format!("{BOOT_DIR}/")));
        // What sandboxd of earlier versions reads: fixed for good.
        assert_eq!(LEGACY_BOOT_FILE, "/.agenthold/boot");
        assert_eq!(CA_FILE, "/.agenthold/ca.crt");
        assert_eq!(CA_BUNDLE, "/.agenthold/ca-bundle.pem");
        assert_eq!(SANDBOXD, "/.agenthold/bin/sandboxd");
        assert_eq!(relative(BOOT_FILE), ".agenthold/boot.d/token");
    }

    #[test]
    fn the_environment_names_the_agent_and_the_tunnel() {
        let addr = "10.213.4.2:15003".parse().ok();
        assert_eq!(
            env("a1", addr),
            vec![
                ("AGENTHOLD_AGENT", "a1".to_owned()),
                ("AGENTHOLD_TUNNEL", "10.213.4.2:15003".to_owned())
            ]
        );
        assert_eq!(env("a1", None), vec![("AGENTHOLD_AGENT", "a1".to_owned())]);
        assert!(ENV.contains(&ENV_AGENT) && ENV.contains(&ENV_TUNNEL));
    }

    #[test]
    fn command_lines() {
        assert_eq!(command::boot(), [SANDBOXD, "boot"]);
        assert_eq!(command::kill("x1"), [SANDBOXD, "kill", "--id", "x1"]);
        assert_eq!(
            command::run("x1", Some(0), vec!["ls".into(), "--id".into()]),
            [
                SANDBOXD,
                "run",
                "--id",
                "x1",
                "--timeout-ms",
                "1",
                "--",
                "ls",
                "--id"
            ]
        );
        assert_eq!(
            command::run("x1", None, vec!["true".into()]),
            [SANDBOXD, "run", "--id", "x1", "--", "true"]
        );
    }

    #[test]
    fn exec_ids() {
        assert!(valid_exec_id("a-1_b.c"));
        assert!(valid_exec_id(&"x".repeat(128)));
        for bad in ["", ".x", "..", "a/b", "a b", &"x".repeat(129)] {
            assert!(!valid_exec_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn tokens() {
        assert!(token::is_valid("0a".repeat(32).as_bytes()));
        assert!(!token::is_valid("0A".repeat(32).as_bytes()));
        assert!(!token::is_valid("0a".repeat(31).as_bytes()));
        assert!(!token::is_valid(b""));
    }

    #[test]
    fn hello_round_trips() {
        let token = "ab".repeat(32);
        let line = tunnel::hello("agent-1", &token);
        assert_eq!(line, format!("AGENTHOLD-TUNNEL 1 agent-1 {token}\n"));
        assert!(line.len() <= tunnel::MAX_LINE);
        let longest = tunnel::hello(&"a".repeat(tunnel::MAX_AGENT), &token);
        assert!(
            longest.len() <= tunnel::MAX_LINE,
            "a valid hello always fits a line"
        );
        assert_eq!(
            tunnel::parse_hello(line.trim_end()),
            Ok(tunnel::Hello {
                agent: "agent-1",
                token: &token
            })
        );
    }

    #[test]
    fn malformed_hellos_are_refused() {
        for bad in [
            "",
            "AGENTHOLD-TUNNEL",
            "AGENTHOLD-TUNNEL 1 a",
            "AGENTHOLD-TUNNEL 2 a t",
            "HELLO 1 a t",
            "AGENTHOLD-TUNNEL 1 a t extra",
            // Vertical tab and other control bytes are not ASCII whitespace: they must not pass as a token.
            "AGENTHOLD-TUNNEL 1 a \u{b}",
            "AGENTHOLD-TUNNEL 1 a\u{7f} t",
        ] {
            assert_eq!(
                tunnel::parse_hello(bad),
                Err(tunnel::HelloError::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn agent_ids_in_hellos() {
        assert!(tunnel::valid_agent("ag_1-x.y"));
        for bad in ["", "a b", "a\nb", "é", &"a".repeat(129)] {
            assert!(!tunnel::valid_agent(bad), "{bad:?}");
        }
    }

    #[test]
    fn answers() {
        assert_eq!(tunnel::err("bad token"), "ERR bad token\n");
        assert_eq!(tunnel::line(tunnel::OK), "OK\n");
        assert_eq!(tunnel::line(tunnel::PING), "PING\n");
        assert_eq!(tunnel::line(tunnel::PONG), "PONG\n");
    }
}
