//! `agenthold admin …`: the host operator's tools. They talk to the running server over its Unix socket in
//! the data directory (`agenthold_server::admin_call`); they are not API clients. Each prints one line.

use anyhow::Result;

use crate::serve_cli::ConfigArgs;
use agenthold_server::{AdminRequest, admin_call};

/// `agenthold admin`.
#[derive(Debug, clap::Args)]
pub(crate) struct AdminArgs {
    #[command(subcommand)]
    command: AdminCommand,
    #[command(flatten)]
    config: ConfigArgs,
}

#[derive(Debug, clap::Subcommand)]
enum AdminCommand {
    /// Users.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Personal tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Print a new one-time local admin link (valid 15 minutes by default, once).
    LoginLink,
    /// Browser sessions.
    Session {
        #[command(subcommand)]
        command: SessionCommand,
    },
}

#[derive(Debug, clap::Subcommand)]
enum UserCommand {
    /// Create a user; prints its id.
    Create {
        /// Display name.
        #[arg(long)]
        name: String,
        /// Email address.
        #[arg(long)]
        email: Option<String>,
    },
}

#[derive(Debug, clap::Subcommand)]
enum TokenCommand {
    /// Create a personal token for a user; prints the token (shown once).
    Create {
        /// The user's id.
        #[arg(long)]
        user: String,
        /// Seconds until the token expires (default: never).
        #[arg(long, value_name = "SECONDS")]
        expires_in: Option<u64>,
        /// A name to recognise the token by.
        #[arg(long)]
        name: Option<String>,
    },
}

#[derive(Debug, clap::Subcommand)]
enum SessionCommand {
    /// Create a browser session for a user; prints the session cookie's value (for scripts and tests).
    Create {
        /// The user's id.
        #[arg(long)]
        user: String,
    },
}

/// Run an admin command; the exit code.
pub(crate) fn run(args: AdminArgs) -> i32 {
    match call(args) {
        Ok(line) => {
            print_line(&line);
            0
        }
        Err(e) => {
            eprintln!("agenthold admin: {e:#}");
            1
        }
    }
}

fn call(args: AdminArgs) -> Result<String> {
    let config = args.config.load()?;
    let data_dir = config.data_dir()?;
    let request = match args.command {
        AdminCommand::User {
            command: UserCommand::Create { name, email },
        } => AdminRequest::UserCreate { name, email },
        AdminCommand::Token {
            command:
                TokenCommand::Create {
                    user,
                    expires_in,
                    name,
                },
        } => AdminRequest::TokenCreate {
            user,
            expires_in,
            name,
        },
        AdminCommand::LoginLink => AdminRequest::LoginLink,
        AdminCommand::Session {
            command: SessionCommand::Create { user },
        } => AdminRequest::SessionCreate { user },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(admin_call(&data_dir, &request))
}

#[allow(clippy::print_stdout, reason = "the one line is the command's output")]
fn print_line(line: &str) {
    println!("{line}");
}
