//! `agenthold`: the command-line entry point.
//!
//! - `agenthold run [--allow ENTRY]… -- COMMAND…` runs a command in a network jail behind an embedded
//!   egress gateway ([`run`]).
//! - `agenthold serve [--config FILE]` runs the reference server: users, workspaces, agents, the HTTP
//!   API ([`serve_cli`]).
//! - `agenthold admin …` is the host operator's tool for a running server ([`admin_cli`]).
//! - `agenthold image build-dev` builds the `agenthold/dev:latest` image without a registry ([`image`]).
//! - `agenthold __jail …` and `__jail-init …` are the jail's own re-executions ([`jail`]), not meant to be
//!   called by hand.
#![forbid(unsafe_code)]

mod admin_cli;
mod image;
mod image_fetch;
mod jail;
mod log_file;
mod run;
mod secrets_file;
mod serve_cli;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: the gateway allocates per request (hyper's heads and bodies, the
/// log entry), and glibc's allocator was ≈ 10 % of its CPU per intercepted request (docs/benchmarks.md,
/// issue 14). Only the binary chooses: the libraries never set a global allocator, so an embedder keeps
/// its own.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Run the reference server (HTTP API, users, workspaces, agents).
    Serve(serve_cli::ServeArgs),
    /// The host operator's tools for a running server (users, tokens, the local admin link).
    Admin(admin_cli::AdminArgs),
    /// Local images, built without a registry (`image build-dev`).
    Image(image::ImageArgs),
    /// Internal: the jail's first stage (namespaces and mounts).
    #[command(name = "__jail", hide = true)]
    Jail(jail::JailArgs),
    /// Internal: the jail's second stage (PID 1: privileges dropped, runs the command).
    #[command(name = "__jail-init", hide = true)]
    JailInit(jail::JailArgs),
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
        Command::Serve(args) => serve_cli::run(&args),
        Command::Admin(args) => admin_cli::run(args),
        Command::Image(args) => image::run(&args),
        Command::Jail(args) => jail_stage(jail::stage_one(&args)),
        Command::JailInit(args) => jail_stage(jail::stage_two(&args)),
    };
    std::process::exit(code);
}

/// The exit code of a jail stage: the command's own, or 127 (like a shell) when the jail could not start it.
fn jail_stage(result: anyhow::Result<i32>) -> i32 {
    result.unwrap_or_else(|e| {
        eprintln!("agenthold: {e:#}");
        127
    })
}

/// Logs go to standard error; `AGENTHOLD_LOG` (an `EnvFilter` directive, default `warn`) sets the level.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AGENTHOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
