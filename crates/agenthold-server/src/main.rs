//! `agenthold`: the command-line entry point and, later, the reference server (HTTP API, config file,
//! reconcile loop).
#![forbid(unsafe_code)]

fn main() {
    eprintln!("agenthold: nothing here yet");
    std::process::exit(2);
}
