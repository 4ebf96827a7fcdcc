//! The file API against a real sandbox: upload, list, download, delete; paths that climb are refused; the
//! upload cap (64 MiB, not the 8 MiB JSON cap); and S10: a viewer never reads harness credentials or
//! sandboxd's files, also through symlinks the agent planted, while an operator can.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;

use super::fixture::Fixture;

// covers: P1
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn files_upload_list_download_and_delete() {
    let f = Fixture::new();
    let content = f.path("/files/content?path=/workspace/dir/a.bin");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(9 * 1024 * 1024 + 3).collect();
    let put = f.server.raw(
        "PUT",
        &content,
        &f.auth,
        Some(&bytes),
        "application/octet-stream",
        &[],
    );
    assert_eq!(put.status, 200, "{:?}", put.body);
    assert_eq!(put.body["size"], bytes.len());
    let list = f
        .server
        .call("GET", &f.path("/files?path=/workspace/dir"), &f.auth, None);
    assert_eq!(list.status, 200, "{:?}", list.body);
    let items = list.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["name"], "a.bin");
    assert_eq!(items[0]["kind"], "file");
    assert_eq!(items[0]["size"], bytes.len());
    let got = f.server.call("GET", &content, &f.auth, None);
    assert_eq!(got.status, 200);
    assert_eq!(got.content_type, "application/octet-stream");
    assert!(got.raw == bytes, "the download differs from the upload");
    let gone = f
        .server
        .call("DELETE", &f.path("/files?path=/workspace/dir"), &f.auth, None);
    assert_eq!(gone.status, 204, "{:?}", gone.body);
    assert_eq!(f.server.call("GET", &content, &f.auth, None).status, 404);
    assert_eq!(
        f.server
            .call("GET", &f.path("/files?path=/workspace/dir"), &f.auth, None)
            .status,
        404
    );

    // Paths must be absolute, without `..` or NUL.
    for bad in ["/workspace/../etc/passwd", "etc/passwd", "/etc/%00passwd", ""] {
        let r = f.server.call(
            "GET",
            &f.path(&format!("/files/content?path={bad}")),
            &f.auth,
            None,
        );
        assert_eq!(r.status, 400, "{bad}: {:?}", r.body);
        let r = f
            .server
            .call("DELETE", &f.path(&format!("/files?path={bad}")), &f.auth, None);
        assert_eq!(r.status, 400, "{bad}: {:?}", r.body);
    }
}

// covers: S10
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn a_viewer_cannot_read_credentials_even_through_planted_symlinks() {
    let f = Fixture::new();
    let secret = b"{\"claudeAiOauth\":{\"accessToken\":\"sk-ant-oat01-x\"}}";
    for path in [
        "/root/.claude/.credentials.json",
        "/root/.codex/auth.json",
        "/home/dev/.claude/.credentials.json",
    ] {
        let r = f.server.raw(
            "PUT",
            &f.path(&format!("/files/content?path={path}")),
            &f.auth,
            Some(secret),
            "application/octet-stream",
            &[],
        );
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
    }
    f.sh(
        "ln -s /root/.claude/.credentials.json /tmp/notes.txt && ln -s /root/.claude /tmp/cfg \
          && ln -s /tmp/notes.txt /tmp/chain && ln -s /root/.codex/auth.json /workspace/readme \
          && echo hello > /tmp/plain.txt",
    );
    let viewer = f.grant("bob", "viewer");
    let read = |auth, path: &str| {
        f.server
            .call("GET", &f.path(&format!("/files/content?path={path}")), auth, None)
    };
    for path in [
        "/root/.claude/.credentials.json",
        "/root/.codex/auth.json",
        "/home/dev/.claude/.credentials.json",
        "/tmp/notes.txt",
        "/tmp/cfg/.credentials.json",
        "/tmp/chain",
        "/workspace/readme",
        "/root//.claude/./.credentials.json",
        "/.agenthold/boot",
    ] {
        let r = read(&viewer, path);
        assert_eq!(r.status, 403, "viewer read {path}: {:?}", r.body);
        assert_eq!(r.content_type, "application/problem+json");
    }
    // What is not a credential stays readable, and listing the directory is fine.
    let plain = read(&viewer, "/tmp/plain.txt");
    assert_eq!(plain.status, 200);
    assert_eq!(plain.raw, b"hello\n");
    let listed = f
        .server
        .call("GET", &f.path("/files?path=/root/.claude"), &viewer, None);
    assert_eq!(listed.status, 200, "{:?}", listed.body);
    assert_eq!(listed.body["items"][0]["name"], ".credentials.json");
    // A viewer writes nothing; an operator reads everything.
    let put = f.server.raw(
        "PUT",
        &f.path("/files/content?path=/tmp/x"),
        &viewer,
        Some(b"x"),
        "application/octet-stream",
        &[],
    );
    assert_eq!(put.status, 403);
    assert_eq!(
        f.server
            .call("DELETE", &f.path("/files?path=/tmp/plain.txt"), &viewer, None)
            .status,
        403
    );
    let operator = f.grant("carol", "operator");
    for path in [
        "/root/.claude/.credentials.json",
        "/tmp/notes.txt",
        "/tmp/cfg/.credentials.json",
    ] {
        let r = read(&operator, path);
        assert_eq!(r.status, 200, "operator read {path}: {:?}", r.body);
        assert_eq!(r.raw, secret);
    }
    assert_eq!(read(&f.auth, "/workspace/readme").status, 200);

    // An agent created with CODEX_HOME: its auth.json there is protected, other auth.json files are not.
    let other = f.server.call(
        "POST",
        &format!("/api/v1/workspaces/{}/agents", f.ws),
        &f.auth,
        Some(&json!({"name": "codex", "env": {"CODEX_HOME": "/opt/cx"}})),
    );
    assert_eq!(other.status, 201, "{:?}", other.body);
    let base = format!(
        "/api/v1/workspaces/{}/agents/{}",
        f.ws,
        other.body["id"].as_str().unwrap()
    );
    for path in ["/opt/cx/auth.json", "/workspace/auth.json"] {
        let put = f.server.raw(
            "PUT",
            &format!("{base}/files/content?path={path}"),
            &f.auth,
            Some(secret),
            "application/octet-stream",
            &[],
        );
        assert_eq!(put.status, 200, "{:?}", put.body);
    }
    let bob = f.server.call(
        "GET",
        &format!("/api/v1/workspaces/{}/members", f.ws),
        &f.auth,
        None,
    );
    let bob = bob.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "bob")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let granted = f.server.call(
        "PUT",
        &format!("{base}/grants/{bob}"),
        &f.auth,
        Some(&json!({"role": "viewer"})),
    );
    assert!(
        granted.status == 200 || granted.status == 201,
        "{:?}",
        granted.body
    );
    let get = |path: &str| {
        f.server
            .call("GET", &format!("{base}/files/content?path={path}"), &viewer, None)
            .status
    };
    assert_eq!(get("/opt/cx/auth.json"), 403);
    assert_eq!(get("/workspace/auth.json"), 200);
}

// covers: S9
#[test]
#[ignore = "needs root and Docker; make test runs it"]
fn an_upload_over_64_mib_is_413() {
    let f = Fixture::new();
    let addr = f.server.base.trim_start_matches("http://").to_owned();
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let length = 64 * 1024 * 1024 + 1;
    let head = format!(
        "PUT {} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {length}\r\nConnection: close\r\n\r\n",
        f.path("/files/content?path=/tmp/big"),
        f.token
    );
    stream.write_all(head.as_bytes()).unwrap();
    // Send the body from another thread; the server may answer (and stop reading) before it is all sent.
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let chunk = vec![b'a'; 1024 * 1024];
        let mut left = length;
        while left > 0 {
            let n = left.min(chunk.len());
            if writer.write_all(&chunk[..n]).is_err() {
                return;
            }
            left -= n;
        }
    });
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 413"),
        "{}",
        &answer[..answer.len().min(300)]
    );
    assert!(answer.contains("application/problem+json"), "{answer}");
    let _ = sender.join();
    let listed = f.server.call("GET", &f.path("/files?path=/tmp"), &f.auth, None);
    assert!(
        !listed.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["name"] == "big"),
        "{:?}",
        listed.body
    );
}
