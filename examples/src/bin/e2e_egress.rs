//! The driver of the end-to-end egress check (E18, `scripts/e2e/egress.sh`): one sandbox on the dev stack
//! (the embedded runtime, Docker, the `agenthold/dev` image that `make dev` builds), and from inside it the
//! checks the seeds name: an allowed name, a denied name, the metadata address refused even when allowed,
//! NXDOMAIN for an unlisted name, a secret injected upstream but never visible inside.
//!
//! Usage: `e2e_egress OUT_DIR`. Prints one `ok`/`FAIL` line per check and exits 1 if any failed. Writes
//! `OUT_DIR/log.jsonl` (the sandbox's request log) and `OUT_DIR/upstream.jsonl` (what the upstream received)
//! for the script to check on its own.
//!
//! The upstream is an HTTPS echo server on this machine's loopback standing in for `api.e2e.test`; the
//! gateway refuses loopback, so the name is mapped to it with the test-only `dangerous` option. No packet
//! leaves the machine: the metadata address is refused before any dial.
#![allow(clippy::print_stdout, clippy::print_stderr)] // printing is what a check does

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use agenthold_core::secret::{SecretRule, SecretSpec};
use agenthold_core::{NetworkPolicy, PolicyMode, SandboxSpec};
use agenthold_egress::Dangerous;
use agenthold_sandbox::Runtime;
use agenthold_testsupport::{EchoServer, TestCa, UPSTREAM_MARKER};

const ALLOWED: &str = "api.e2e.test";
const DENIED: &str = "denied.e2e.test";
const UNLISTED: &str = "unlisted.e2e.test";
const METADATA: &str = "169.254.169.254";
const SECRET_VALUE: &str = "sk-e2e-secret-value-7f3a";

/// A DNS query for `UNLISTED` sent to the sandbox's resolver over UDP; prints the response code.
const DNS_QUERY: &str = r#"
import random, socket, struct
ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
qid = random.randrange(65536)
q = struct.pack('>HHHHHH', qid, 0x0100, 1, 0, 0, 0)
q += b''.join(bytes([len(p)]) + p.encode() for p in 'NAME'.split('.')) + b'\0' + struct.pack('>HH', 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); s.sendto(q, (ns, 53))
r = s.recv(4096)
assert struct.unpack('>H', r[:2])[0] == qid
print('rcode', r[3] & 0x0f)
"#;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("warn").init();
    let out_dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or_else(|| anyhow::anyhow!("usage: e2e_egress OUT_DIR"))?,
    );
    std::fs::create_dir_all(&out_dir)?;

    let ca = Arc::new(TestCa::new());
    let upstream = EchoServer::https_with_ca(Arc::clone(&ca), &[ALLOWED]).await;
    let runtime = Runtime::builder()
        .data_dir(out_dir.join("data"))
        .dangerous(Dangerous {
            connect_to: vec![(ALLOWED.into(), 443, upstream.addr())],
            upstream_ca_pem: Some(ca.pem().into_bytes()),
        })
        .build()
        .await?;
    let secret = SecretSpec::new(
        "e2e-key",
        SECRET_VALUE.into(),
        Some("API_KEY"),
        vec![SecretRule::header(
            &[ALLOWED],
            "Authorization",
            "Bearer {{.Value}}",
        )?],
    )?;
    let spec = SandboxSpec {
        // The metadata address is on the allowlist on purpose: the address guard refuses it anyway (E6).
        policy: NetworkPolicy::parse(PolicyMode::Allowlist, &[ALLOWED, METADATA])?,
        secrets: vec![secret],
        ..SandboxSpec::default()
    };
    let agent = runtime.create_sandbox(spec).await?;

    let mut failed = 0;
    let mut check = |name: &str, ok: bool, detail: &str| {
        if ok {
            println!("ok    {name}");
        } else {
            failed += 1;
            println!("FAIL  {name}: {detail}");
        }
    };
    let sh = |script: String| {
        let runtime = &runtime;
        let agent = &agent;
        async move {
            match runtime.exec(agent, &["sh", "-c", &script]).await {
                Ok(out) => (
                    out.exit_code,
                    format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ),
                ),
                Err(e) => (-1, format!("exec failed: {e}")),
            }
        }
    };

    let (code, out) = sh(format!("curl -sS -m 10 https://{ALLOWED}/explicit")).await;
    check(
        "allowed name through the explicit proxy",
        code == 0 && out.contains(UPSTREAM_MARKER),
        &out,
    );
    let (code, out) = sh(format!(
        "curl -sS -m 10 --noproxy '*' https://{ALLOWED}/transparent"
    ))
    .await;
    check(
        "allowed name through the transparent path",
        code == 0 && out.contains(UPSTREAM_MARKER),
        &out,
    );
    let (code, out) = sh(format!(
        "curl -sS -m 10 -o /dev/null -w '%{{http_code}}' https://{DENIED}/"
    ))
    .await;
    check("denied name refused", code != 0 || !out.starts_with('2'), &out);
    let (code, out) = sh(format!(
        "curl -sS -m 10 --noproxy '*' http://{METADATA}/latest/meta-data/"
    ))
    .await;
    check(
        "metadata address refused although allowed",
        code != 0 || !out.contains("meta"),
        &out,
    );
    let query = DNS_QUERY.replace("NAME", UNLISTED);
    let out = match runtime.exec(&agent, &["python3", "-c", &query]).await {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        Err(e) => format!("exec failed: {e}"),
    };
    check("NXDOMAIN for an unlisted name", out.trim() == "rcode 3", &out);

    let (code, out) = sh(format!(
        "echo \"env=$API_KEY\"; env | grep -c -- '{SECRET_VALUE}'; \
         curl -sS -m 10 -H \"Authorization: Bearer $API_KEY\" https://{ALLOWED}/secret"
    ))
    .await;
    check(
        "secret: a placeholder inside, the value never",
        code == 0 && out.contains("env=agenthold-placeholder-") && !out.contains(SECRET_VALUE),
        &out,
    );
    let injected = upstream
        .requests()
        .iter()
        .any(|r| r.path == "/secret" && r.header("authorization") == Some(&format!("Bearer {SECRET_VALUE}")));
    check(
        "secret: the upstream received the value",
        injected,
        "no request to /secret carried it",
    );

    let mut log = std::fs::File::create(out_dir.join("log.jsonl"))?;
    for entry in runtime.request_log(&agent) {
        writeln!(log, "{}", entry.to_json_line())?;
    }
    let mut seen = std::fs::File::create(out_dir.join("upstream.jsonl"))?;
    for request in upstream.requests() {
        writeln!(seen, "{}", request.to_json())?;
    }
    runtime.remove(&agent).await?;
    runtime.shutdown().await;
    if failed > 0 {
        eprintln!("e2e_egress: {failed} check(s) failed");
        std::process::exit(1);
    }
    Ok(())
}
