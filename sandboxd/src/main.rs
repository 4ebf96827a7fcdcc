//! `sandboxd`: the small static helper agenthold runs inside every sandbox and as the gateway holder.
//!
//! One binary, built statically (`RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -p sandboxd
//! --target x86_64-unknown-linux-gnu`), so it runs in `FROM scratch` images and inside any user image. The
//! runtime (`agenthold-sandbox`) bind-mounts it read-only at `/.agenthold/bin/sandboxd` in every sandbox.
//! It depends on std and `nix` only and never resolves a name (addresses are parsed, not looked up).
//!
//! # Command-line contract (shared with the runtime in `agenthold-sandbox`)
//!
//! ```text
//! sandboxd [--root DIR] hold
//! sandboxd [--root DIR] boot [--] [CMD ARG...]
//! sandboxd [--root DIR] run [--timeout-ms N] [--id ID] [--] ARGV...
//! sandboxd [--root DIR] run --id ID --request-stdin
//! sandboxd [--root DIR] kill --id ID
//! sandboxd [--root DIR] send [--harness claude|codex] [--] AGENT_NAME PROMPT|-
//! agenthold-send [--harness claude|codex] [--] AGENT_NAME PROMPT|-      (the same binary by that name)
//! sandboxd --version | --help
//! ```
//!
//! Options take their value as the next argument or after `=` (`--id=abc`). `--root DIR` (for tests) prefixes
//! every absolute path sandboxd touches (`/.agenthold/...`, `/etc/ssl/...`, `/usr/local/share/...`) with `DIR`.
//!
//! ## `hold`: the gateway holder
//! PID 1 of a scratch container whose network namespace is the gateway namespace. Sleeps in a blocking read
//! (no CPU), reaps any child that exits, and exits 0 on SIGTERM or SIGINT.
//!
//! ## `boot`: PID 1 of every sandbox
//! 1. Waits up to 30 s (polling every 100 ms) for `/.agenthold/boot.d/token`: exactly 64 lowercase hex
//!    characters (a 256-bit token; one trailing newline is tolerated), written by the runtime before every
//!    start (`/.agenthold/boot.d` is a directory the runtime bind-mounts from the host). The file is deleted
//!    as soon as it has been read; the token then lives only in sandboxd's memory, and the process is
//!    made non-dumpable so `/proc/1/mem` is closed to the sandbox (S2, S10). Missing or malformed: exit 1.
//! 2. CA (E14), never fatal (failures are logged to stderr): reads `/.agenthold/ca.crt` (PEM) and writes
//!    `/.agenthold/ca-bundle.pem` = the image's system bundle (first existing of
//!    `/etc/ssl/certs/ca-certificates.crt`, `/etc/pki/tls/certs/ca-bundle.crt`, `/etc/ssl/cert.pem`; none is
//!    fine) + the CA. The CA is appended to that system bundle when it is not already in it and the file is
//!    writable (inside a `# agenthold CA` marker block, replaced if the CA changes, so boots never append
//!    twice), and copied to `/usr/local/share/ca-certificates/agenthold.crt` when that directory exists.
//! 3. Tunnel client (S2) on a background thread, started after the CA step (so "tunnel up" implies "CA
//!    installed"): see below. Skipped, with a message, when `AGENTHOLD_TUNNEL` is unset.
//!    Then the agent-message relay: a Unix socket at `/.agenthold/send.sock` (mode 0666, replaced at every
//!    boot) served by a background thread, also without a tunnel (requests are then refused); see `send`.
//! 4. Stale `/.agenthold/run/*` records of the previous start are removed.
//! 5. Workload: with `CMD` (looked up in `PATH`), spawns it (inheriting stdio, environment and process group, with
//!    an empty signal mask), forwards SIGTERM, SIGINT and SIGHUP to it, and exits with its exit code, or 128+N
//!    when signal N killed it; 127/126 when it cannot be executed. Without `CMD`, waits for SIGTERM or SIGINT
//!    (SIGHUP is ignored) and exits 0. Every zombie in the container is reaped (`waitpid(-1, WNOHANG)` loop on
//!    each SIGCHLD), including orphans of `docker exec` commands; `boot` is also a child subreaper, so this
//!    holds when it is not PID 1 (`docker run --init`, tests).
//!
//! ## Tunnel protocol, version 1 (client side)
//! Lines end with `\n`; each line is at most 256 bytes. Before its first connect the client waits (up to 10 s)
//! for the sandbox's network: the runtime plugs it in just after the start, and until then it has loopback
//! only. The client connects to `$AGENTHOLD_TUNNEL` (`IP:PORT`,
//! IPv6 as `[IP]:PORT`) and sends `AGENTHOLD-TUNNEL 1 <agent-id> <token>\n` (`<agent-id>` from
//! `$AGENTHOLD_AGENT`, a non-empty printable string without spaces). The server answers `OK\n`, or
//! `ERR <reason>\n` (the client closes and retries later). Then, every 10 s of silence, the client sends
//! `PING\n` and expects `PONG\n` within 10 s. Anything else from the server, a closed connection or a timeout
//! ends the session; the client reconnects with backoff (1 s doubling to 10 s, reset after an `OK`) forever,
//! re-sending the same token, so a restarted runtime can accept it again (S12). Connect, writes and every read
//! have a 10 s timeout. The token is never logged.
//!
//! ## `run`: the wrapper of every `docker exec`
//! Runs `ARGV` (looked up in `PATH`, empty signal mask) in a new process group, so a timeout or a cancel kills
//! the whole tree (processes that leave the group with `setsid` are not followed);
//! stdin, stdout and stderr are inherited unchanged (binary-safe). When stdin is the controlling terminal and
//! sandboxd is in its foreground group, the command's group is made the foreground group (`docker exec -t`).
//! With `--id ID` (`[A-Za-z0-9_.-]{1,128}`, not starting with `.`; unique per exec) the process group id is
//! recorded in `/.agenthold/run/<ID>.pid` (directory created 0700) and the file is removed when the command
//! ends. SIGTERM, SIGINT and SIGHUP sent to sandboxd are forwarded to the group. `--timeout-ms N` (N > 0; 0
//! means none) SIGKILLs the whole group after N ms. Exit status:
//! - the command's exit code, or 128+N when signal N killed it (137 when cancelled by `kill`);
//! - 124 on timeout; 125 when sandboxd itself fails (bad arguments);
//! - 126 when `ARGV[0]` exists but cannot be executed, 127 when it is not found (message on stderr).
//!
//! If the record cannot be written (e.g. the exec user cannot write `/.agenthold/run`), a warning is printed
//! and the command still runs (it just cannot be cancelled by id).
//!
//! With `--request-stdin` (and no ARGV, no `--timeout-ms`) `run` is started ahead of its command: it waits
//! for one request on stdin (`sandboxd::contract::request`: the command, environment entries set on top of
//! its own, a working directory and a timeout), writes the byte 0x06 on stdout once the request is valid,
//! and then runs it as above; the rest of stdin is the command's. A malformed request: nothing on stdout, a
//! message on stderr, exit 125, nothing started. A working directory that cannot be entered: exit 126. The
//! runtime keeps one such `run` in every warm-pool sandbox for its first command.
//!
//! ## `kill`: cancel a running `run`
//! `sandboxd kill --id ID` SIGKILLs the process group recorded for `ID` and exits 0, also when it is already
//! gone. If `run --id ID` has not recorded its group yet, `kill` leaves a cancel marker
//! (`/.agenthold/run/<ID>.cancel`) that `run` honours (it kills the command, or does not start it: exit 137).
//! Exit 1 when the record is not a valid process group or the signal is refused; 2 on bad arguments.
//!
//! ## `send` / `agenthold-send`: message another agent (P3)
//! The runtime bind-mounts this binary read-only at `/usr/local/bin/agenthold-send` too; called by that name
//! (`argv[0]`'s file name) it parses its arguments as `send` does (no `--root`). It asks for a run of
//! `AGENT_NAME` (an agent of the same workspace) with `PROMPT` (`-`: read from stdin, at most 256 KiB, the
//! end of stdin within 60 s) on the harness `--harness` (default `claude`). It writes one request to
//! `/.agenthold/send.sock`: `SEND <harness> <name-bytes> <prompt-bytes>\n<name><prompt>`, and reads one
//! line: `STARTED <run-id>` (printed on stdout, exit 0) or `ERR <reason>` (printed on stderr, exit 1; also
//! when PID 1 cannot be reached or does not answer within 90 s). Exit 2 on usage errors (bad option, bad
//! name). The sender holds no secret and names no sender: `boot` (PID 1, which alone has the boot token)
//! checks the request, opens a fresh tunnel connection, sends the hello, then the request, and relays the
//! runtime's answer line (waiting at most 60 s). At most 4 requests are relayed at once (`ERR busy` beyond);
//! the request line and body must arrive within 30 s. The runtime knows the sender by the tunnel the
//! request arrives on. The grammar is `sandboxd::contract::tunnel::parse_send`.
//!
//! ## `--version`
//! Prints `sandboxd <version>` on stdout and exits 0.
//!
//! # Exit status of sandboxd's own failures
//! `boot`: 1 when the boot token is missing after the wait or malformed; `hold` and `boot`: 1 when signals
//! cannot be set up; `run`: 125; usage errors of the other subcommands: 2.
//!
//! # Environment
//! - `AGENTHOLD_TUNNEL` (`IP:PORT`) and `AGENTHOLD_AGENT` (agent id): set by the runtime, read by `boot`.
//! - Test-only knobs (production uses the defaults): `AGENTHOLD_BOOT_WAIT_MS` (30000),
//!   `AGENTHOLD_TUNNEL_PING_MS` (10000), `AGENTHOLD_TUNNEL_TIMEOUT_MS` (10000), `AGENTHOLD_TUNNEL_BACKOFF_MS`
//!   (1000), `AGENTHOLD_TUNNEL_BACKOFF_MAX_MS` (10000). Values are clamped to at least 10 ms.
#![forbid(unsafe_code)]

mod boot;
mod ca;
mod cli;
mod layout;
mod relay;
mod run;
mod send;
mod signals;
mod spawn;
mod token;
mod tunnel;

use std::io::Write as _;

use cli::Command;
use layout::Layout;
use sandboxd::contract::command;

/// Writes one line to stderr, prefixed with `sandboxd: `. Write errors are ignored: a closed stderr must not
/// take PID 1 (or a running exec) down.
macro_rules! log {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "sandboxd: {}", format_args!($($arg)*));
    }};
}
pub(crate) use log;

/// Exit status for usage errors of every subcommand except `run`.
const EXIT_USAGE: i32 = 2;

fn main() {
    let mut args = std::env::args_os();
    let program = args.next().unwrap_or_default();
    let args: Vec<std::ffi::OsString> = args.collect();
    // Multi-call: the same binary is `agenthold-send` when called by that name.
    if std::path::Path::new(&program).file_name() == Some(std::ffi::OsStr::new(command::SEND_NAME)) {
        let code = match cli::parse_send(&mut args.into_iter()) {
            Ok(opts) => send::send(&Layout::new("/".into()), opts),
            Err(err) => {
                let _ = writeln!(std::io::stderr().lock(), "agenthold-send: {err}");
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "usage: agenthold-send [--harness claude|codex] [--] AGENT_NAME PROMPT|-"
                );
                send::EXIT_USAGE
            }
        };
        std::process::exit(code);
    }
    let code = match cli::parse(args) {
        Ok(cli::Invocation { root, command }) => dispatch(&Layout::new(root), command),
        Err(err) => {
            log!("{}", err.message);
            log!("usage: {}", cli::USAGE.replace('\n', "\n       "));
            if err.run { run::EXIT_SANDBOXD } else { EXIT_USAGE }
        }
    };
    std::process::exit(code);
}

/// Runs one parsed subcommand and returns the process exit status.
fn dispatch(layout: &Layout, command: Command) -> i32 {
    match command {
        Command::Version => {
            let _ = writeln!(std::io::stdout().lock(), "sandboxd {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Command::Help => {
            let _ = writeln!(
                std::io::stdout().lock(),
                "usage: {}",
                cli::USAGE.replace('\n', "\n       ")
            );
            0
        }
        Command::Hold => boot::hold(),
        Command::Boot { argv } => boot::boot(layout, &argv),
        Command::Run(opts) => run::run(layout, &opts),
        Command::Kill { id } => run::kill(layout, &id),
        Command::Send(opts) => send::send(layout, opts),
    }
}
