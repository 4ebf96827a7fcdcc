//! `agenthold-standin`: the provider stand-ins ([`agenthold_testsupport::standin`]) as a process, for
//! `make dev` and for trying a harness by hand without an account.
//!
//! ```text
//! agenthold-standin [--listen 127.0.0.1:0] [--ca-out FILE] [--plain] [--dump DIR]
//! ```
//! Serves HTTPS with a certificate from a fresh test CA for the providers' host names (written to
//! `--ca-out` as PEM: give it to `agenthold serve --dangerous-upstream-ca`), or plain HTTP with `--plain`.
//! Prints `listening <addr>` once bound, then one line per request (method, path, which credential header
//! arrived — never its value). `--dump DIR` also writes each request (headers and body) to `DIR/N.json`:
//! that file does hold credentials. Runs until killed.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agenthold_testsupport::TestCa;
use agenthold_testsupport::standin::{PROVIDER_HOSTS, Routes, Standin};

const USAGE: &str = "usage: agenthold-standin [--listen ADDR:PORT] [--ca-out FILE] [--plain] [--dump DIR]";

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut ca_out = None;
    let mut plain = false;
    let mut dump = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => match args.next().and_then(|a| a.parse().ok()) {
                Some(a) => listen = a,
                None => fail("--listen needs ADDR:PORT"),
            },
            "--ca-out" => ca_out = args.next(),
            "--plain" => plain = true,
            "--dump" => dump = args.next(),
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => fail(&format!("unknown argument {other:?}")),
        }
    }
    let ca = (!plain).then(|| Arc::new(TestCa::new()));
    if let (Some(ca), Some(path)) = (&ca, &ca_out)
        && let Err(e) = std::fs::write(path, ca.pem())
    {
        fail(&format!("write {path}: {e}"));
    }
    let standin = match Standin::start(listen, ca, PROVIDER_HOSTS, Routes::providers()).await {
        Ok(s) => s,
        Err(e) => fail(&format!("bind {listen}: {e}")),
    };
    println!("listening {}", standin.addr());
    let mut seen = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let requests = standin.requests();
        for r in &requests[seen.min(requests.len())..] {
            let credential = ["x-api-key", "authorization"]
                .iter()
                .find(|h| r.header(h).is_some())
                .map_or("no credential header", |h| *h);
            println!("{} {} {} ({credential})", r.method, r.host, r.path);
        }
        if let Some(dir) = &dump {
            for (i, r) in requests.iter().enumerate().skip(seen) {
                let _ = std::fs::write(format!("{dir}/{i}.json"), r.to_json().to_string());
            }
        }
        seen = requests.len();
    }
}

fn fail(message: &str) -> ! {
    eprintln!("agenthold-standin: {message}\n{USAGE}");
    std::process::exit(2)
}
