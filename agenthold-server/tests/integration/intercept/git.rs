//! git over HTTPS with the `github` preset: `git clone` and `git push` inside the jail against a local
//! smart-HTTP server for github.com (`git http-backend` behind Basic auth, as GitHub does for tokens:
//! `Basic base64(x-access-token:TOKEN)`, 401 otherwise).

use std::path::Path;

use super::{Upstream, World, assert_placeholder, base64, printed, secret_value};
use crate::support::{entries_for, read_log};

const GITHUB: &str = "github.com";

/// Runs host git in `dir` with a fixed identity and no user configuration.
fn host_git(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args([
            "-c",
            "user.name=test",
            "-c",
            "user.email=test@example.test",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The subject of `rev` in the bare repository `repo`.
fn subject(repo: &Path, rev: &str) -> String {
    let out = std::process::Command::new("git")
        .args([
            "--git-dir",
            &repo.display().to_string(),
            "log",
            "-1",
            "--format=%s",
            rev,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A bare `org/repo.git` with one commit on main, under the (jail-hidden) data dir, and a github.com
/// server for it that accepts `token`.
async fn github(world: &World, token: &str) -> (Upstream, std::path::PathBuf) {
    let root = world.path("data").join(format!("git-{}", super::random_hex(4)));
    let repo = root.join("org/repo.git");
    std::fs::create_dir_all(&repo).unwrap();
    host_git(&repo, &["init", "--bare", "--quiet"]);
    let seed = root.join("seed");
    std::fs::create_dir_all(&seed).unwrap();
    host_git(&seed, &["init", "--quiet"]);
    std::fs::write(seed.join("README"), "hello from the host\n").unwrap();
    host_git(&seed, &["add", "README"]);
    host_git(&seed, &["commit", "--quiet", "-m", "initial commit"]);
    host_git(
        &seed,
        &[
            "push",
            "--quiet",
            &repo.display().to_string(),
            "HEAD:refs/heads/main",
        ],
    );
    let config = serde_json::json!({"git_root": root, "git_user": "x-access-token", "git_token": token});
    (world.upstream(&[GITHUB], None, config).await, repo)
}

/// Clone, commit and push from inside the jail; prints CLONE/PUSH exit codes and what the clone saw.
fn clone_and_push(work: &Path, extra_env: &str) -> String {
    format!(
        "export GIT_TERMINAL_PROMPT=0 GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null {extra_env}\n\
         echo \"GH=$GH_TOKEN\"\n\
         cd {work}\n\
         git clone --quiet https://{GITHUB}/org/repo.git clone; echo \"CLONE=$?\"\n\
         [ -d clone ] || git init --quiet -b main clone\n\
         cd clone\n\
         echo \"README=$(cat README 2>/dev/null)\"\n\
         echo pushed > pushed.txt && git add pushed.txt\n\
         git -c user.name=agent -c user.email=agent@example.test commit --quiet -m 'from the sandbox'\n\
         git push --quiet https://{GITHUB}/org/repo.git HEAD:refs/heads/from-sandbox; echo \"PUSH=$?\"\n",
        work = work.display()
    )
}

// covers: E11 E13 (git clone and git push over HTTPS with the github preset: Basic x-access-token on
// github.com, injected into every request of the smart-HTTP exchange)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn git_clone_and_push_work_with_the_github_preset() {
    let world = World::new().await;
    let token = secret_value("ghp");
    let (server, repo) = github(&world, &token).await;
    let work = world.path("work");
    std::fs::create_dir_all(&work).unwrap();
    let log = world.path("log.jsonl");
    let out = world
        .run()
        .secrets("- name: gh\n  preset: github\n  value_env: GH_SOURCE\n  env: GH_TOKEN\n")
        .env("GH_SOURCE", &token)
        .map(GITHUB, 443, server.addr)
        .log(&log)
        .sh(&clone_and_push(&work, ""))
        .await;
    out.expect_code(0);
    let vars = printed(&out.stdout);
    assert_placeholder(&vars["GH"]);
    assert_eq!(
        (vars["CLONE"].as_str(), vars["PUSH"].as_str()),
        ("0", "0"),
        "{out:#?}\n{:#?}",
        server.records()
    );
    assert_eq!(vars["README"], "hello from the host");
    assert_eq!(subject(&repo, "from-sandbox"), "from the sandbox");
    let requests = server.requests("/org/");
    let expected = format!("Basic {}", base64(format!("x-access-token:{token}").as_bytes()));
    assert!(requests.len() >= 4, "{requests:#?}");
    for r in &requests {
        assert_eq!(r["authorized"], true, "{r}");
        assert_eq!(super::record_header(r, "authorization"), Some(expected.as_str()));
    }
    let posts: Vec<&str> = requests
        .iter()
        .filter(|r| r["method"] == "POST")
        .filter_map(|r| r["path"].as_str())
        .collect();
    assert!(posts.iter().any(|p| p.ends_with("git-upload-pack")), "{posts:?}");
    assert!(posts.iter().any(|p| p.ends_with("git-receive-pack")), "{posts:?}");
    let log = read_log(&log);
    let http: Vec<_> = entries_for(&log, GITHUB)
        .into_iter()
        .filter(|e| e["kind"] == "http")
        .collect();
    assert_eq!(http.len(), requests.len(), "{log:#?}");
    assert!(
        http.iter()
            .all(|e| e["secret_injected"] == true && e["secret"] == "gh"),
        "{log:#?}"
    );
    assert!(!out.stdout.contains(&token) && !out.stderr.contains(&token));
}

// covers: E11 E13 (without the secret, the same clone and push get 401: once with no secret at all (the
// connection is then spliced, so the client has to trust the server's own CA to get that far), once with
// a wrong token injected)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn git_without_the_secret_gets_401() {
    let world = World::new().await;
    let token = secret_value("ghp");
    let (server, repo) = github(&world, &token).await;
    for (case, secrets) in [
        ("none", None),
        (
            "wrong",
            Some("- name: gh\n  preset: github\n  value: ghp-wrong-token\n  env: GH_TOKEN\n"),
        ),
    ] {
        let work = world.path(&format!("work-{case}"));
        std::fs::create_dir_all(&work).unwrap();
        let trust = if secrets.is_none() {
            format!("GIT_SSL_CAINFO={}", world.upstream_ca())
        } else {
            String::new()
        };
        let before = server.requests("/org/").len();
        let mut run = world.run().map(GITHUB, 443, server.addr);
        if let Some(s) = secrets {
            run = run.secrets(s);
        }
        let out = run.sh(&clone_and_push(&work, &trust)).await;
        out.expect_code(0);
        let vars = printed(&out.stdout);
        assert_ne!(vars["CLONE"], "0", "{case}: {out:#?}");
        assert_ne!(vars["PUSH"], "0", "{case}: {out:#?}");
        let requests = server.requests("/org/");
        let ours = &requests[before..];
        assert!(ours.len() >= 2, "{case}: the server was not reached: {out:#?}");
        assert!(ours.iter().all(|r| r["authorized"] == false), "{case}: {ours:#?}");
        let sent: Vec<Option<&str>> = ours
            .iter()
            .map(|r| super::record_header(r, "authorization"))
            .collect();
        match case {
            "none" => assert!(sent.iter().all(Option::is_none), "{sent:?}"),
            _ => {
                let wrong = format!("Basic {}", base64(b"x-access-token:ghp-wrong-token"));
                assert!(sent.iter().all(|s| *s == Some(wrong.as_str())), "{sent:?}");
            }
        }
        assert!(
            out.stderr.contains("could not read Username") || out.stderr.contains("401"),
            "{case}: {out:#?}"
        );
    }
    assert_eq!(subject(&repo, "from-sandbox"), "", "a push got through");
}
