//! What the exec, file and terminal tests share: a server with one user, a workspace and a running agent;
//! a second user to grant roles to; a blocking SSE client that can disconnect and reattach.

use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::support::{Auth, Reply, TestServer};

/// A server, its first user (the agent's admin), a workspace and a running agent.
pub(crate) struct Fixture {
    pub(crate) server: TestServer,
    pub(crate) auth: Auth,
    pub(crate) token: String,
    pub(crate) ws: String,
    pub(crate) agent: String,
}

impl Fixture {
    pub(crate) fn new() -> Self {
        let server = TestServer::start();
        let (_, token) = server.user("alice");
        let auth = Auth::Token(token.clone());
        let ws = server.call("POST", "/api/v1/workspaces", &auth, Some(&json!({"name": "w"})));
        assert_eq!(ws.status, 201, "{:?}", ws.body);
        let ws = ws.body["id"].as_str().unwrap().to_owned();
        // Servers of tests running at once pick their subnets independently, so the engine may refuse one
        // as overlapping another created at the same moment: try again (the runtime picks afresh).
        let mut tries = 0;
        let agent = loop {
            let agent = server.call(
                "POST",
                &format!("/api/v1/workspaces/{ws}/agents"),
                &auth,
                Some(&json!({"name": "a"})),
            );
            tries += 1;
            let overlap = agent.status == 502
                && agent.body["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("overlaps"));
            if !overlap || tries == 5 {
                break agent;
            }
            std::thread::sleep(Duration::from_millis(300 * tries));
        };
        assert_eq!(agent.status, 201, "{:?}", agent.body);
        let agent = agent.body["id"].as_str().unwrap().to_owned();
        Self {
            server,
            auth,
            token,
            ws,
            agent,
        }
    }

    /// `/api/v1/workspaces/{ws}/agents/{agent}{rest}`.
    pub(crate) fn path(&self, rest: &str) -> String {
        format!("/api/v1/workspaces/{}/agents/{}{rest}", self.ws, self.agent)
    }

    /// A new user, member of the workspace, with `role` on the agent; their token.
    pub(crate) fn grant(&self, name: &str, role: &str) -> Auth {
        let (id, token) = self.server.user(name);
        let member = self.server.call(
            "PUT",
            &format!("/api/v1/workspaces/{}/members/{id}", self.ws),
            &self.auth,
            Some(&json!({"role": "member"})),
        );
        assert!(member.status == 200 || member.status == 201, "{:?}", member.body);
        let grant = self.server.call(
            "PUT",
            &self.path(&format!("/grants/{id}")),
            &self.auth,
            Some(&json!({"role": role})),
        );
        assert!(grant.status == 200 || grant.status == 201, "{:?}", grant.body);
        Auth::Token(token)
    }

    /// Run a command and wait for its JSON answer.
    pub(crate) fn exec(&self, body: &Value) -> Reply {
        self.server
            .call("POST", &self.path("/execs"), &self.auth, Some(body))
    }

    /// `sh -c SCRIPT`, expected to succeed; its stdout.
    pub(crate) fn sh(&self, script: &str) -> String {
        let r = self.exec(&json!({"argv": ["sh", "-c", script]}));
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body["exit_code"], 0, "{script}: {:?}", r.body);
        r.body["stdout"].as_str().unwrap().to_owned()
    }

    /// How many processes in the sandbox have exactly `needle` (arguments joined by spaces) as their
    /// command line.
    pub(crate) fn processes_with(&self, needle: &str) -> usize {
        // No ps in every image: read /proc. `[s]leep` matches `sleep` but not grep itself.
        let (head, tail) = needle.split_at(1);
        let script = format!(
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^[{head}]{tail} $' || true"
        );
        self.sh(&script).trim().parse().unwrap()
    }

    /// Wait (up to `limit`) until `check` holds.
    pub(crate) fn eventually(&self, limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !check() {
            assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Open an SSE stream: `GET path` (or `POST` with `body`), with an optional `Last-Event-ID`.
    pub(crate) fn sse(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        last_id: Option<&str>,
    ) -> SseClient {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_recv_body(Some(Duration::from_secs(30)))
            .build()
            .new_agent();
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.server.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .header("Accept", "text/event-stream");
        if let Some(id) = last_id {
            req = req.header("Last-Event-ID", id);
        }
        let response = match body {
            Some(b) => agent.run(
                req.header("Content-Type", "application/json")
                    .body(serde_json::to_vec(b).unwrap())
                    .unwrap(),
            ),
            None => agent.run(req.body(()).unwrap()),
        }
        .unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let reader: Box<dyn Read + Send> = Box::new(response.into_body().into_reader());
        SseClient {
            status,
            content_type,
            lines: BufReader::new(reader),
        }
    }
}

/// One server-sent event.
#[derive(Debug, Clone)]
pub(crate) struct SseEvent {
    pub(crate) id: String,
    pub(crate) event: String,
    pub(crate) data: Value,
}

impl SseEvent {
    /// The number of the event (`<stream>.<n>`).
    pub(crate) fn n(&self) -> u64 {
        self.id.rsplit_once('.').unwrap().1.parse().unwrap()
    }
}

/// A blocking reader of an event stream; dropping it closes the connection.
pub(crate) struct SseClient {
    pub(crate) status: u16,
    pub(crate) content_type: String,
    lines: BufReader<Box<dyn Read + Send>>,
}

impl SseClient {
    /// The next event; `None` when the stream ends.
    pub(crate) fn next(&mut self) -> Option<SseEvent> {
        let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
        loop {
            let mut line = String::new();
            if self.lines.read_line(&mut line).unwrap() == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if data.is_empty() {
                    continue;
                }
                return Some(SseEvent {
                    id,
                    event,
                    data: serde_json::from_str(&data).unwrap(),
                });
            }
            if let Some(v) = line.strip_prefix("id:") {
                v.trim().clone_into(&mut id);
            } else if let Some(v) = line.strip_prefix("event:") {
                v.trim().clone_into(&mut event);
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
    }

    /// Every event up to the end of the stream.
    pub(crate) fn rest(&mut self) -> Vec<SseEvent> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

/// The concatenated `data` of the `stdout` events.
pub(crate) fn stdout_of(events: &[SseEvent]) -> String {
    events
        .iter()
        .filter(|e| e.event == "stdout")
        .map(|e| e.data["data"].as_str().unwrap())
        .collect()
}
