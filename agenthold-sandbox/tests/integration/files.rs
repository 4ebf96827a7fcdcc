//! Files in a real sandbox: a directory listed, a tree removed (a symlink in it, not its target), symlink
//! chains and planted links resolved by the engine as `realpath -m` does inside, and paths that climb or
//! are relative refused before anything runs.

use agenthold_core::ErrorKind;
use agenthold_core::sandbox::EntryKind;

use crate::support::*;

// covers: P1
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn list_a_directory_and_remove_a_tree() {
    let env = Env::start().await;
    env.guard(async {
        let agent = env.sandbox(None).await;
        let rt = &env.runtime;
        let etc = rt.list_dir(&agent, "/etc").await.unwrap();
        let entry = |name: &str| etc.iter().find(|e| e.name == name).cloned();
        let passwd = entry("passwd").expect("/etc/passwd is listed");
        assert_eq!((passwd.kind, passwd.mode), (EntryKind::File, 0o644));
        assert!(passwd.size > 0 && passwd.modified > 1_600_000_000, "{passwd:?}");
        assert_eq!(entry("apt").map(|e| e.kind), Some(EntryKind::Dir));
        assert!(etc.windows(2).all(|w| w[0].name < w[1].name), "sorted by name");
        assert!(entry(".").is_none() && entry("..").is_none());
        let count = env.sh(&agent, "ls -A /etc | wc -l").await.ok();
        assert_eq!(count.stdout.trim(), etc.len().to_string());
        let root = rt.list_dir(&agent, "/").await.unwrap();
        let lib = root.iter().find(|e| e.name == "lib").expect("/lib");
        assert_eq!(lib.kind, EntryKind::Symlink, "usrmerge: /lib -> usr/lib");
        assert_eq!(
            rt.list_dir(&agent, "/etc/passwd").await.unwrap_err().kind(),
            ErrorKind::BadInput
        );
        assert_eq!(
            rt.list_dir(&agent, "/no/such/dir").await.unwrap_err().kind(),
            ErrorKind::NotFound
        );

        env.sh(
            &agent,
            "mkdir -p '/workspace/tree/a b/c' && echo x > '/workspace/tree/a b/c/f' && \
             printf 'odd' > \"/workspace/tree/new\nline\" && ln -s /etc/hostname /workspace/tree/link",
        )
        .await
        .ok();
        let tree = rt.list_dir(&agent, "/workspace/tree/").await.unwrap();
        let names: Vec<_> = tree.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert_eq!(
            names,
            [
                ("a b", EntryKind::Dir),
                ("link", EntryKind::Symlink),
                ("new\nline", EntryKind::File)
            ]
        );
        rt.remove_path(&agent, "/workspace/tree/link").await.unwrap();
        rt.remove_path(&agent, "/workspace/tree").await.unwrap();
        let out = env
            .sh(
                &agent,
                "test -e /workspace/tree; echo $?; test -f /etc/hostname; echo $?",
            )
            .await;
        assert_eq!(out.stdout, "1\n0\n", "{out}");
        assert_eq!(
            rt.remove_path(&agent, "/workspace/tree")
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            rt.remove_path(&agent, "/").await.unwrap_err().kind(),
            ErrorKind::BadInput
        );
    })
    .await;
}

// covers: S10
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn symlinks_resolve_as_inside_and_climbing_paths_are_refused() {
    let env = Env::start().await;
    env.guard(async {
        let agent = env.sandbox(None).await;
        let rt = &env.runtime;
        env.sh(
            &agent,
            "mkdir -p /workspace/d /root/.claude && touch /workspace/d/f /root/.claude/.credentials.json && \
             ln -s /workspace/d /workspace/l1 && ln -s l1 /workspace/l2 && ln -s ../workspace/l2/x /tmp/l3 && \
             ln -s /root/.claude /workspace/innocent && ln -s /workspace/dangling-target /workspace/dangling && \
             ln -s /workspace/loop-b /workspace/loop-a && ln -s /workspace/loop-a /workspace/loop-b",
        )
        .await
        .ok();
        for (path, expected) in [
            ("/tmp/l3", "/workspace/d/x"),
            ("/workspace/l2/f", "/workspace/d/f"),
            ("/workspace/l2", "/workspace/d"),
            ("/workspace/innocent/.credentials.json", "/root/.claude/.credentials.json"),
            ("/workspace/dangling/more", "/workspace/dangling-target/more"),
            ("/lib/os-release", "/usr/lib/os-release"),
            ("/etc/passwd/x", "/etc/passwd/x"),
            ("/workspace//./d/", "/workspace/d"),
            ("/", "/"),
        ] {
            let resolved = rt.resolve_path(&agent, path).await.unwrap();
            assert_eq!(resolved, expected, "{path}");
            // What `realpath -m` says inside (the agent could lie there; the engine cannot be made to).
            let inside = env.sh(&agent, &format!("realpath -m -- '{path}'")).await.ok();
            assert_eq!(inside.stdout.trim(), resolved, "{path}: the engine and the sandbox disagree");
        }
        // A file read through the resolved path is the credential file, so a check on it refuses it.
        assert!(rt.read_file(&agent, "/root/.claude/.credentials.json").await.is_ok());
        assert!(
            rt.resolve_path(&agent, "/workspace/loop-a/x").await.is_err(),
            "a symlink loop does not resolve"
        );
        for bad in ["workspace/d", "/workspace/../root/.claude", "/workspace/d/..", "/a\0b", ""] {
            for err in [
                rt.resolve_path(&agent, bad).await.unwrap_err(),
                rt.list_dir(&agent, bad).await.unwrap_err(),
                rt.remove_path(&agent, bad).await.unwrap_err(),
            ] {
                assert_eq!(err.kind(), ErrorKind::BadInput, "{bad:?}: {err}");
            }
        }
        // The engine resolves a stopped sandbox too.
        rt.stop(&agent).await.unwrap();
        assert_eq!(rt.resolve_path(&agent, "/tmp/l3").await.unwrap(), "/workspace/d/x");
        let ghost = env.next_agent();
        assert_eq!(
            rt.resolve_path(&ghost, "/etc").await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
    })
    .await;
}
