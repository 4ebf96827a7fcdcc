//! The matrix's fixture: one workspace with one agent (a real sandbox), seven principals around them (each
//! with a browser session and a personal token), and the values path parameters take, by name: `{ws}`,
//! `{agent}`, `{user}` (a member with a grant, none of the principals), `{id}` after `/tokens/` (a spare
//! token of the caller), and any other `{x}` for which the document has a `POST` that makes one (its
//! collection, e.g. `POST …/secrets` for `{secret}`; attached where the document has a `PUT …/{x}` under
//! the agent). Destructive calls get fresh objects of the same kinds.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::doc::Operation;
use super::people::{Principal, Who, token_id};
use crate::serve::client::{self, Answer};
use crate::serve::support::{Auth, TestServer};

/// A workspace id and an agent id that exist nowhere (valid in form).
pub(crate) const NO_WS: &str = "nosuchworkspace0";
pub(crate) const NO_AGENT: &str = "nosuchagent00000";
/// Where the file fixtures live inside the agent's sandbox.
const FILES: &str = "/tmp/agenthold-matrix";

/// The fixture.
pub(crate) struct World<'a> {
    pub(crate) server: &'a TestServer,
    pub(crate) ops: &'a [Operation],
    pub(crate) ws: String,
    pub(crate) agent: String,
    /// A member with a viewer grant on the agent: the `{user}` that members and grants calls act on.
    pub(crate) subject: String,
    pub(crate) people: Vec<Principal>,
    made: HashMap<String, String>,
    serial: usize,
}

/// Fill the fields the server cannot take as placeholders: a command that runs, a harness that exists.
pub(crate) fn usable(body: &Value, name: Option<&str>) -> Value {
    let mut body = body.clone();
    if let Some(object) = body.as_object_mut() {
        // A custom harness runs the command it is given.
        if object.contains_key("harness") {
            object.entry("argv").or_insert(Value::Null);
        }
        for (key, value) in object.iter_mut() {
            match key.as_str() {
                "argv" => *value = json!(["true"]),
                "harness" => *value = json!("custom"),
                "prompt" => *value = json!("hello"),
                "name" if name.is_some() => *value = json!(name),
                _ => {}
            }
        }
    }
    body
}

impl<'a> World<'a> {
    /// Users, workspace, agent, memberships and grants.
    pub(crate) fn new(server: &'a TestServer, ops: &'a [Operation]) -> Self {
        let mut people = Vec::new();
        for who in Who::ALL {
            let (user, token) = server.user(&format!("{who:?}").to_lowercase());
            let session = server.session(&user);
            let spare_token = server.admin(&["token", "create", "--user", &user]);
            let spare_id = token_id(server, &spare_token);
            people.push(Principal {
                who,
                user,
                token,
                session,
                spare_token,
                spare_id,
            });
        }
        let mut world = Self {
            server,
            ops,
            ws: String::new(),
            agent: String::new(),
            subject: String::new(),
            people,
            made: HashMap::new(),
            serial: 0,
        };
        world.ws = world.new_workspace();
        world.agent = world.new_agent();
        world.subject = world.new_member(None);
        world
    }

    pub(crate) fn owner(&self) -> &Principal {
        self.people.last().unwrap()
    }

    fn owner_auth(&self) -> Auth {
        Auth::Token(self.owner().token.clone())
    }

    /// A call as the owner that must succeed; its body.
    fn must(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let answer = client::call(&self.server.base, method, path, &self.owner_auth(), body, &[]);
        assert!(
            (200..300).contains(&answer.status),
            "fixture: {method} {path} {body:?}: {} {:?}",
            answer.status,
            answer.body
        );
        answer.body
    }

    fn unique(&mut self, what: &str) -> String {
        self.serial += 1;
        format!("{what}-{}", self.serial)
    }

    /// A workspace of the owner's where every other principal but the non-member has its role.
    fn new_workspace(&mut self) -> String {
        let name = self.unique("ws");
        let ws = self.must("POST", "/api/v1/workspaces", Some(&json!({ "name": name })))["id"]
            .as_str()
            .unwrap()
            .to_owned();
        for p in self.people.clone() {
            if let Some(role) = p.who.membership() {
                let path = format!("/api/v1/workspaces/{ws}/members/{}", p.user);
                self.must("PUT", &path, Some(&json!({ "role": role })));
            }
        }
        ws
    }

    /// An agent in the workspace with the viewer, operator and agent admin grants.
    fn new_agent(&mut self) -> String {
        let name = self.unique("agent");
        let path = format!("/api/v1/workspaces/{}/agents", self.ws);
        let agent = self.must("POST", &path, Some(&json!({ "name": name })))["id"]
            .as_str()
            .unwrap()
            .to_owned();
        for p in self.people.clone() {
            if let Some(role) = p.who.grant() {
                let path = format!("/api/v1/workspaces/{}/agents/{agent}/grants/{}", self.ws, p.user);
                self.must("PUT", &path, Some(&json!({ "role": role })));
            }
        }
        agent
    }

    /// A new user who is a member of the workspace, with a viewer grant on `agent` when given.
    fn new_member(&mut self, agent: Option<&str>) -> String {
        let name = self.unique("subject");
        let user = self.server.admin(&["user", "create", "--name", &name]);
        let path = format!("/api/v1/workspaces/{}/members/{user}", self.ws);
        self.must("PUT", &path, Some(&json!({ "role": "member" })));
        let agent = agent.unwrap_or(&self.agent).to_owned();
        let path = format!("/api/v1/workspaces/{}/agents/{agent}/grants/{user}", self.ws);
        self.must("PUT", &path, Some(&json!({ "role": "viewer" })));
        user
    }

    /// A pending provider login of `caller`'s (started from their browser session: a token cannot).
    fn provider_login(&self, caller: &Principal) -> Result<String, String> {
        let answer = client::call(
            &self.server.base,
            "POST",
            "/api/v1/me/provider-logins",
            &Auth::Session(caller.session.clone()),
            Some(&json!({"provider": "claude"})),
            &[],
        );
        match answer.body["id"].as_str() {
            Some(id) if answer.status == 201 => Ok(id.to_owned()),
            _ => Err(format!(
                "fixture provider login: {} {:?}",
                answer.status, answer.body
            )),
        }
    }

    /// The value of `{name}` in `op` for `caller`.
    pub(crate) fn fixture(
        &mut self,
        op: &Operation,
        name: &str,
        caller: &Principal,
    ) -> Result<String, String> {
        match name {
            "ws" => Ok(self.ws.clone()),
            "agent" => Ok(self.agent.clone()),
            "user" => Ok(self.subject.clone()),
            "id" if op.path.contains("/tokens/{id}") => Ok(caller.spare_id.clone()),
            "id" if op.path.contains("/provider-logins/{id}") => {
                let key = format!("provider-login/{}", caller.user);
                if let Some(v) = self.made.get(&key) {
                    return Ok(v.clone());
                }
                let v = self.provider_login(caller)?;
                self.made.insert(key, v.clone());
                Ok(v)
            }
            _ => {
                if let Some(v) = self.made.get(name) {
                    return Ok(v.clone());
                }
                let v = self.make(op, name)?;
                self.made.insert(name.to_owned(), v.clone());
                Ok(v)
            }
        }
    }

    /// A fresh `{name}` for one destructive call by `caller` (who keeps the role the fixture gives them).
    pub(crate) fn fresh(&mut self, op: &Operation, name: &str, caller: &Principal) -> Result<String, String> {
        match name {
            "ws" => Ok(self.new_workspace()),
            "agent" => Ok(self.new_agent()),
            "user" => Ok(self.new_member(None)),
            "id" if op.path.contains("/tokens/{id}") => {
                let token = self.server.admin(&["token", "create", "--user", &caller.user]);
                Ok(token_id(self.server, &token))
            }
            "id" if op.path.contains("/provider-logins/{id}") => self.provider_login(caller),
            _ => self.make(op, name),
        }
    }

    /// The value of every path and required query parameter of `op` for `caller`: fresh for `fresh` (the
    /// object a destructive call destroys), `replace` = (name, value) overriding one.
    pub(crate) fn values(
        &mut self,
        op: &Operation,
        caller: &Principal,
        fresh: Option<&str>,
        replace: Option<(&str, &str)>,
    ) -> Result<HashMap<String, String>, String> {
        let mut values = HashMap::new();
        for name in &op.params {
            let value = match replace {
                Some((n, v)) if n == name => v.to_owned(),
                _ if fresh == Some(name.as_str()) => self.fresh(op, name, caller)?,
                _ => self.fixture(op, name, caller)?,
            };
            values.insert(name.clone(), value);
        }
        for (name, default) in &op.query {
            let value = if fresh == Some(name.as_str()) {
                self.fresh_query(op, name)?
            } else {
                self.query_fixture(op, name, default)?
            };
            values.insert(name.clone(), value);
        }
        Ok(values)
    }

    /// A required query parameter: `path` (the file API) names a file the owner wrote for `…/content`
    /// operations and its directory for the others; anything else takes the document's example.
    fn query_fixture(&mut self, op: &Operation, name: &str, default: &str) -> Result<String, String> {
        if name != "path" {
            return Ok(default.to_owned());
        }
        if !self.made.contains_key("?path") {
            let file = format!("{FILES}/fixture.txt");
            self.write_file(op, &file)?;
            self.made.insert("?path".to_owned(), file);
        }
        if op.path.ends_with("/content") {
            Ok(self.made["?path"].clone())
        } else {
            Ok(FILES.to_owned())
        }
    }

    /// A fresh object named by a query parameter: a new file for `path`.
    fn fresh_query(&mut self, op: &Operation, name: &str) -> Result<String, String> {
        if name != "path" {
            return Err(format!(
                "{}: query parameter {name} names what it destroys, and has no fixture: add one to \
                 World::fresh_query in agenthold-server/tests/integration/serve/matrix/world.rs",
                op.name()
            ));
        }
        let file = format!("{FILES}/{}", self.unique("fresh"));
        self.write_file(op, &file)?;
        Ok(file)
    }

    /// Write a small file into the fixture agent through the operation that writes files (a `PUT` with a
    /// `path` query).
    fn write_file(&self, op: &Operation, file: &str) -> Result<(), String> {
        let Some(writer) = self
            .ops
            .iter()
            .find(|o| o.method == "PUT" && o.query.iter().any(|(q, _)| q == "path"))
        else {
            return Err(format!(
                "{}: no PUT …?path= in the document to make a file with",
                op.name()
            ));
        };
        let url = writer.url(|p| match p {
            "ws" => self.ws.clone(),
            "agent" => self.agent.clone(),
            _ => file.to_owned(),
        });
        let answer = client::call(
            &self.server.base,
            "PUT",
            &url,
            &self.owner_auth(),
            Some(&json!("matrix")),
            &[],
        );
        if (200..300).contains(&answer.status) {
            Ok(())
        } else {
            Err(format!(
                "fixture file: PUT {url}: {} {:?}",
                answer.status, answer.body
            ))
        }
    }

    /// The path-parameter names this fixture cannot fill, with the operations that use them.
    pub(crate) fn unknown_params(&self) -> Vec<String> {
        let mut out = Vec::new();
        for op in self.ops {
            for name in &op.params {
                let known = matches!(name.as_str(), "ws" | "agent" | "user")
                    || (name == "id" && op.path.contains("/tokens/{id}"))
                    || (name == "id" && op.path.contains("/provider-logins/{id}"))
                    || self.collection(name).is_some();
                if !known {
                    out.push(format!(
                        "{}: path parameter {{{name}}} has no fixture: add one to \
                         agenthold-server/tests/integration/serve/matrix/world.rs (World::fixture and \
                         World::fresh), or give the document a POST …/{name}s-style collection that makes one",
                        op.name()
                    ));
                }
            }
        }
        out
    }

    /// The `POST` that makes a `{name}`: on a path `P` such that some operation's path is `P/{name}`;
    /// the one with the fewest parameters (the workspace's collection before an agent's).
    fn collection(&self, name: &str) -> Option<&'a Operation> {
        let suffix = format!("/{{{name}}}");
        let parents: Vec<&str> = self
            .ops
            .iter()
            .filter_map(|o| o.path.strip_suffix(&suffix))
            .collect();
        self.ops
            .iter()
            .filter(|o| o.method == "POST" && parents.contains(&o.path.as_str()))
            .min_by_key(|o| o.params.len())
    }

    /// Make a `{name}` through its collection as the owner, and attach it to the fixture agent where the
    /// document has a `PUT …/{agent}/…/{name}`.
    fn make(&mut self, op: &Operation, name: &str) -> Result<String, String> {
        let Some(collection) = self.collection(name) else {
            return Err(format!(
                "{}: path parameter {{{name}}} has no fixture and no collection makes one",
                op.name()
            ));
        };
        let unique = self.unique(name);
        let body = collection.body.as_ref().map(|b| usable(b, Some(&unique)));
        let path = collection.url(|p| match p {
            "ws" => self.ws.clone(),
            "agent" => self.agent.clone(),
            _ => self.made.get(p).cloned().unwrap_or_default(),
        });
        let answer = client::call(
            &self.server.base,
            "POST",
            &path,
            &self.owner_auth(),
            body.as_ref(),
            &[],
        );
        let id = answer.body["id"].as_str().map(str::to_owned).ok_or_else(|| {
            format!(
                "fixture {{{name}}}: POST {path} with {body:?} answered {} {:?}; give the request schema an \
                 example that makes one",
                answer.status, answer.body
            )
        })?;
        let suffix = format!("/{{{name}}}");
        for attach in self.ops.iter().filter(|o| {
            o.method == "PUT"
                && o.has("agent")
                && o.path.ends_with(&suffix)
                && o.path != format!("{}{suffix}", collection.path)
        }) {
            let path = attach.url(|p| match p {
                "ws" => self.ws.clone(),
                "agent" => self.agent.clone(),
                p if p == name => id.clone(),
                _ => self
                    .made
                    .get(p)
                    .cloned()
                    .or_else(|| attach.query_default(p))
                    .unwrap_or_default(),
            });
            let body = attach.body.as_ref().map(|b| usable(b, None));
            let answer = client::call(
                &self.server.base,
                "PUT",
                &path,
                &self.owner_auth(),
                body.as_ref(),
                &[],
            );
            if !(200..300).contains(&answer.status) {
                return Err(format!(
                    "fixture {{{name}}}: attaching with PUT {path} {body:?} answered {} {:?}",
                    answer.status, answer.body
                ));
            }
        }
        Ok(id)
    }

    /// Send `op` to `url` the way its kind needs (WebSocket handshake, SSE up to the headers, JSON).
    pub(crate) fn send(&self, op: &Operation, url: &str, auth: &Auth) -> Answer {
        if op.websocket {
            return client::websocket(&self.server.base, url, auth);
        }
        let accept = if op.stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let body = op.body.as_ref().map(|b| usable(b, None));
        client::call(
            &self.server.base,
            &op.method,
            url,
            auth,
            body.as_ref(),
            &[("Accept", accept)],
        )
    }

    /// After an allowed stop or restart, the agent runs again (for the checks after it).
    pub(crate) fn restore(&self, op: &Operation) -> Result<(), String> {
        let Some(start) = op.path.rsplit_once('/').map(|(p, _)| format!("{p}/start")) else {
            return Ok(());
        };
        let url = start.replace("{ws}", &self.ws).replace("{agent}", &self.agent);
        let answer = client::call(&self.server.base, "POST", &url, &self.owner_auth(), None, &[]);
        if (200..300).contains(&answer.status) {
            Ok(())
        } else {
            Err(format!(
                "restoring after {}: POST {url}: {} {:?}",
                op.name(),
                answer.status,
                answer.body
            ))
        }
    }
}
