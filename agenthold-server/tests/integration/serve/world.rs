//! A server with loopback upstreams for egress tests: an HTTPS and an HTTP echo server for [`API`] and
//! [`OTHER`] (their request logs show what really arrived upstream; E19 scrubs echoed values), a `TestDns` as
//! the gateway's
//! DNS upstream, the server pointed at them with `--dangerous-connect-to` and `--dangerous-upstream-ca`.
//! Traffic is driven with `docker exec` into the agent's container (found by its `agenthold.agent` label),
//! and streams are read with a bare HTTP/1.0 client ([`Sse`]) that can really disconnect.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenthold_testsupport::{EchoRequest, EchoServer, TestCa, TestDns};
use serde_json::{Value, json};

use super::support::{Auth, TestServer};

/// A name mapped to the HTTPS echo server and allowed by the tests' policies.
pub(crate) const API: &str = "api.example.test";
/// A name mapped to the same echo server but not allowed unless a test approves it.
pub(crate) const OTHER: &str = "other.example.test";

/// One test's server, upstreams and first user with a workspace.
pub(crate) struct World {
    // Dropped first: the server stops (and its engine objects are swept) before the upstreams go.
    pub(crate) server: TestServer,
    pub(crate) https: EchoServer,
    pub(crate) http: EchoServer,
    _dns: TestDns,
    _ca_dir: tempfile::TempDir,
    /// The admin (owner of [`World::ws`]).
    pub(crate) alice: Auth,
    /// A workspace of alice's.
    pub(crate) ws: String,
    // Last: the upstreams' tasks run on it.
    _rt: tokio::runtime::Runtime,
}

impl World {
    /// Upstreams, a server pointed at them, user alice and her workspace.
    pub(crate) fn start() -> Self {
        Self::start_with("")
    }

    /// [`World::start`] with `extra_yaml` in the server's configuration.
    pub(crate) fn start_with(extra_yaml: &str) -> Self {
        Self::start_full(extra_yaml, None)
    }

    /// [`World::start`] with the server's state in the PostgreSQL database `store_url`.
    pub(crate) fn start_on_store(store_url: &str) -> Self {
        Self::start_full("", Some(store_url))
    }

    fn start_full(extra_yaml: &str, store_url: Option<&str>) -> Self {
        agenthold_testsupport::require_root();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (https, http, dns, ca) = rt.block_on(async {
            let ca = Arc::new(TestCa::new());
            let https = EchoServer::https_with_ca(Arc::clone(&ca), &[API, OTHER]).await;
            let http = EchoServer::http().await;
            let dns = TestDns::start(Vec::<(&str, Vec<IpAddr>)>::new(), 60).await;
            (https, http, dns, ca)
        });
        let ca_dir = tempfile::tempdir().unwrap();
        let ca_path = ca_dir.path().join("upstream-ca.pem");
        std::fs::write(&ca_path, ca.pem()).unwrap();
        let (up, plain) = (https.addr(), http.addr());
        let yaml = format!("egress:\n  dns_upstream: {}\n{extra_yaml}", dns.addr());
        let args = [
            "--dangerous-connect-to",
            &format!("{API}:443={up}"),
            "--dangerous-connect-to",
            &format!("{OTHER}:443={up}"),
            "--dangerous-connect-to",
            &format!("{API}:80={plain}"),
            "--dangerous-connect-to",
            &format!("{OTHER}:80={plain}"),
            "--dangerous-upstream-ca",
            ca_path.to_str().unwrap(),
        ];
        let server = match store_url {
            Some(url) => TestServer::start_on_store(url, &yaml, &args),
            None => TestServer::start_with(&yaml, &args),
        };
        let (_, token) = server.user("alice");
        let alice = Auth::Token(token);
        let ws = server.call("POST", "/api/v1/workspaces", &alice, Some(&json!({"name": "w"})));
        assert_eq!(ws.status, 201, "{:?}", ws.body);
        let ws = ws.body["id"].as_str().unwrap().to_owned();
        Self {
            server,
            https,
            http,
            _dns: dns,
            _ca_dir: ca_dir,
            alice,
            ws,
            _rt: rt,
        }
    }

    /// `/api/v1/workspaces/{ws}` + `rest`.
    pub(crate) fn path(&self, rest: &str) -> String {
        format!("/api/v1/workspaces/{}{rest}", self.ws)
    }

    /// A new user who is a `role` member of the workspace; their token.
    pub(crate) fn member(&self, name: &str, role: &str) -> (String, Auth) {
        let (id, token) = self.server.user(name);
        let r = self.server.call(
            "PUT",
            &self.path(&format!("/members/{id}")),
            &self.alice,
            Some(&json!({"role": role})),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
        (id, Auth::Token(token))
    }

    /// A running agent of alice's with `policy`; its id.
    ///
    /// Several servers (tests) on one engine can pick the same free /24 at once; the engine then refuses
    /// the later network ("Pool overlaps"), and the refused creation leaves nothing behind: try again.
    pub(crate) fn agent(&self, name: &str, policy: &Value) -> String {
        for _ in 0..5 {
            let r = self.server.call(
                "POST",
                &self.path("/agents"),
                &self.alice,
                Some(&json!({"name": name, "policy": policy})),
            );
            if r.status == 502
                && r.body["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("Pool overlaps"))
            {
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
            assert_eq!(r.status, 201, "{:?}\n{}", r.body, self.server.log());
            return r.body["id"].as_str().unwrap().to_owned();
        }
        panic!(
            "the engine kept refusing the agent's network: {}",
            self.server.log()
        );
    }

    /// `sh -c script` in the agent's container (`docker exec`, bounded): exit code and stdout.
    pub(crate) fn sh(&self, agent: &str, script: &str) -> (i32, String) {
        let out = Command::new("docker")
            .args(["ps", "-q", "--filter", &format!("label=agenthold.agent={agent}")])
            .output()
            .unwrap();
        let ids = String::from_utf8_lossy(&out.stdout);
        let container = ids.split_whitespace().next().expect("the agent's container runs");
        let out = Command::new("timeout")
            .args(["30", "docker", "exec", container, "sh", "-c", script])
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// `curl -k https://{host}{path}` from inside the agent; the HTTP status (0: no answer).
    pub(crate) fn curl(&self, agent: &str, host: &str, path: &str) -> u16 {
        let (_, out) = self.sh(
            agent,
            &format!("curl -sk -m 10 -o /dev/null -w '%{{http_code}}' https://{host}{path}"),
        );
        out.trim().parse().unwrap_or(0)
    }

    /// `curl http://{host}{path}` from inside the agent (plain HTTP: logged with its path); the status.
    pub(crate) fn curl_http(&self, agent: &str, host: &str, path: &str) -> u16 {
        let (_, out) = self.sh(
            agent,
            &format!("curl -s -m 10 -o /dev/null -w '%{{http_code}}' http://{host}{path}"),
        );
        out.trim().parse().unwrap_or(0)
    }

    /// The request the HTTPS upstream received for `path`, if any.
    pub(crate) fn upstream(&self, path: &str) -> Option<EchoRequest> {
        self.https.requests().into_iter().find(|r| r.path == path)
    }
}

/// One server-sent event.
#[derive(Debug, Clone, Default)]
pub(crate) struct Event {
    pub(crate) id: String,
    pub(crate) event: String,
    pub(crate) data: Value,
}

/// A server-sent event stream over a bare HTTP/1.0 connection (the body is the stream, unchunked).
pub(crate) struct Sse {
    pub(crate) status: u16,
    reader: BufReader<TcpStream>,
}

impl Sse {
    /// `GET path` with `Accept: text/event-stream` and `headers`.
    pub(crate) fn open(server: &TestServer, path: &str, auth: &Auth, headers: &[(&str, &str)]) -> Self {
        let addr = server.base.trim_start_matches("http://");
        let mut stream = TcpStream::connect(addr).unwrap();
        let mut req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
        if let Auth::Token(t) = auth {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        stream.write_all(req.as_bytes()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line.trim().is_empty() {
                break;
            }
        }
        Self { status, reader }
    }

    /// The next event within `within` (keep-alive comments skipped); `None` on timeout or end of stream.
    pub(crate) fn next(&mut self, within: Duration) -> Option<Event> {
        let deadline = Instant::now() + within;
        let mut event = Event::default();
        let mut seen = false;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            self.reader
                .get_ref()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .ok()?;
            let mut line = String::new();
            match self.reader.read_line(&mut line) {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if seen {
                    return Some(event);
                }
                continue;
            }
            if let Some((field, value)) = line.split_once(':') {
                let value = value.strip_prefix(' ').unwrap_or(value);
                seen |= !field.is_empty();
                match field {
                    "id" => event.id = value.to_owned(),
                    "event" => event.event = value.to_owned(),
                    "data" => event.data = serde_json::from_str(value).unwrap_or(Value::Null),
                    _ => {}
                }
            }
        }
    }

    /// The body of a refused stream (a problem+json).
    pub(crate) fn body(mut self) -> String {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut self.reader, &mut out);
        out
    }
}
