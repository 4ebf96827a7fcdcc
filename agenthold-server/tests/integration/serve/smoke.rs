//! The first round trip: admin commands, a workspace, an agent in a real sandbox, its deletion, and a
//! clean stop that leaves no engine object behind.

use serde_json::json;

use super::support::{Auth, TestServer, engine_objects};

// covers: C3, S7
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn create_and_delete_an_agent() {
    let mut server = TestServer::start();
    let (user, token) = server.user("alice");
    let auth = Auth::Token(token);
    let me = server.call("GET", "/api/v1/me", &auth, None);
    assert_eq!(me.status, 200, "{:?}", me.body);
    assert_eq!(me.body["id"], user.as_str());
    let ws = server.call("POST", "/api/v1/workspaces", &auth, Some(&json!({"name": "w"})));
    assert_eq!(ws.status, 201, "{:?}", ws.body);
    let ws = ws.body["id"].as_str().unwrap().to_owned();
    let agent = server.call(
        "POST",
        &format!("/api/v1/workspaces/{ws}/agents"),
        &auth,
        Some(&json!({"name": "a", "pids": 256})),
    );
    assert_eq!(agent.status, 201, "{:?}", agent.body);
    assert_eq!(agent.body["state"], "running");
    let id = agent.body["id"].as_str().unwrap().to_owned();
    assert_eq!(agent.body["role"], "admin", "the creator administers the agent");
    assert_eq!(agent.body["limits"]["pids"], 256, "{:?}", agent.body);
    // Lists carry the caller's role too (the web UI shows only the actions it allows).
    let list = server.call("GET", &format!("/api/v1/workspaces/{ws}/agents"), &auth, None);
    assert_eq!(list.status, 200, "{:?}", list.body);
    assert_eq!(list.body["items"][0]["role"], "admin", "{:?}", list.body);
    assert!(!engine_objects(&server.data_dir()).is_empty());
    // A token cannot mint a token (S7).
    let minted = server.call("POST", "/api/v1/me/tokens", &auth, Some(&json!({"name": "x"})));
    assert_eq!(minted.status, 403);
    assert_eq!(minted.content_type, "application/problem+json");
    let gone = server.call(
        "DELETE",
        &format!("/api/v1/workspaces/{ws}/agents/{id}"),
        &auth,
        None,
    );
    assert_eq!(gone.status, 204, "{:?}", gone.body);
    assert_eq!(server.stop(), Some(0), "{}", server.log());
    assert_eq!(engine_objects(&server.data_dir()), Vec::<String>::new());
}
