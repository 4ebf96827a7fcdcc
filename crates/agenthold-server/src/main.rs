//! `agenthold`: the command-line entry point.
//!
//! - `agenthold run [--allow ENTRY]… -- COMMAND…` runs a command in a network jail behind an embedded
//!   egress gateway ([`run`]).
//! - `agenthold __jail …` is the jail's own re-execution ([`jail`]), not meant to be called by hand.
#![forbid(unsafe_code)]

mod jail;
mod run;
mod secrets_file;

use clap::{Parser, Subcommand};

/// agenthold: run untrusted agents behind an egress gateway you control.
#[derive(Debug, Parser)]
#[command(name = "agenthold", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run COMMAND in a fresh network namespace whose only way out is an embedded egress gateway.
    Run(run::RunArgs),
    /// Internal: the jail's second stage.
    #[command(name = "__jail", hide = true)]
    Jail(jail::JailArgs),
}

fn main() {
    init_tracing();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run(args) => match run::run(&args) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("agenthold run: {e:#}");
                // 125 like `docker run`: agenthold itself failed, not the command.
                125
            }
        },
        Command::Jail(args) => match jail::exec(&args) {
            Ok(never) => match never {},
            Err(e) => {
                eprintln!("agenthold: {e:#}");
                // 127 like a shell: the command could not be started.
                127
            }
        },
    };
    std::process::exit(code);
}

/// Logs go to standard error; `AGENTHOLD_LOG` (an `EnvFilter` directive, default `warn`) sets the level.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AGENTHOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}
