//! The fake's own behaviour: state, files, scripts, failures, terminals.

use super::*;
use agenthold_core::sandbox::{EntryKind, SandboxSpec, TerminalEvent};

fn plain() -> ContainerSpec {
    SandboxSpec::default().split().unwrap().0
}

#[tokio::test]
async fn keeps_state_and_files_records_calls_and_fails_on_demand() {
    let fake = FakeSandbox::new();
    let a = AgentId::new("a").unwrap();
    assert_eq!(fake.inspect(&a).await.unwrap_err().kind(), ErrorKind::NotFound);
    fake.create(&a, &plain()).await.unwrap();
    assert_eq!(
        fake.create(&a, &plain()).await.unwrap_err().kind(),
        ErrorKind::BadInput
    );
    fake.write_file(&a, "/w/f", b"data").await.unwrap();
    assert_eq!(fake.read_file(&a, "/w/f").await.unwrap(), b"data");
    assert_eq!(
        fake.read_file(&a, "/w/none").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert!(fake.write_file(&a, "relative", b"").await.is_err());
    fake.stop(&a).await.unwrap();
    assert_eq!(fake.sandbox_state(&a), Some(SandboxState::Stopped));
    assert!(fake.exec(&a, ExecRequest::default()).await.is_err());
    fake.start(&a).await.unwrap();

    fake.push_output(ExecOutput {
        exit_code: 2,
        stdout: b"o".to_vec(),
        stderr: b"e".to_vec(),
    });
    let out = fake.exec(&a, ExecRequest::default()).await.unwrap();
    assert_eq!(
        (out.exit_code, &out.stdout[..], &out.stderr[..]),
        (2, &b"o"[..], &b"e"[..])
    );
    assert_eq!(fake.exec(&a, ExecRequest::default()).await.unwrap().exit_code, 0);

    fake.fail_once(Op::Inspect);
    assert_eq!(fake.inspect(&a).await.unwrap_err().kind(), ErrorKind::Upstream);
    assert!(fake.inspect(&a).await.is_ok());
    fake.fail(Op::Start);
    assert!(fake.start(&a).await.is_err());
    assert!(fake.start(&a).await.is_err());
    fake.heal(Op::Start);
    assert!(fake.start(&a).await.is_ok());

    let b = AgentId::new("b").unwrap();
    let report = fake.reconcile(&[a.clone(), b.clone()]).await.unwrap();
    assert_eq!((report.restored, report.missing), (vec![a.clone()], vec![b]));
    fake.remove(&a, false).await.unwrap();
    fake.remove(&a, false).await.unwrap();
    assert!(fake.agents().is_empty());
    assert_eq!(fake.calls_of(Op::Remove).len(), 2);
    assert!(matches!(&fake.calls()[1], Call::Create { agent, .. } if *agent == a));
}

// covers: S10 (the double resolves planted symlinks as the kernel would, so file checks test without Docker)
#[tokio::test]
async fn files_list_remove_and_resolve_through_symlinks() {
    let fake = FakeSandbox::new();
    let a = AgentId::new("a").unwrap();
    fake.create(&a, &plain()).await.unwrap();
    fake.write_file(&a, "/home/u/.claude/.credentials.json", b"{}")
        .await
        .unwrap();
    fake.write_file(&a, "/workspace/notes.txt", b"hello")
        .await
        .unwrap();
    fake.mkdir(&a, "/workspace/empty").unwrap();
    fake.symlink(&a, "/workspace/creds", "../home/u/.claude").unwrap();
    fake.symlink(&a, "/workspace/hop", "/workspace/creds").unwrap();
    fake.symlink(&a, "/workspace/loop", "/workspace/loop").unwrap();

    let names: Vec<(String, EntryKind)> = fake
        .list_dir(&a, "/workspace/")
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.kind))
        .collect();
    assert_eq!(
        names,
        [
            ("creds".to_owned(), EntryKind::Symlink),
            ("empty".to_owned(), EntryKind::Dir),
            ("hop".to_owned(), EntryKind::Symlink),
            ("loop".to_owned(), EntryKind::Symlink),
            ("notes.txt".to_owned(), EntryKind::File),
        ]
    );
    assert_eq!(fake.list_dir(&a, "/").await.unwrap().len(), 2);
    let via_link = fake.list_dir(&a, "/workspace/hop").await.unwrap();
    assert_eq!(via_link[0].name, ".credentials.json");
    assert_eq!(via_link[0].size, 2);
    assert_eq!(
        fake.list_dir(&a, "/workspace/notes.txt")
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::BadInput
    );
    assert_eq!(
        fake.list_dir(&a, "/nope").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );

    assert_eq!(
        fake.resolve_path(&a, "/workspace/hop/.credentials.json")
            .await
            .unwrap(),
        "/home/u/.claude/.credentials.json"
    );
    assert_eq!(
        fake.resolve_path(&a, "/workspace/hop/new/x").await.unwrap(),
        "/home/u/.claude/new/x"
    );
    assert_eq!(fake.resolve_path(&a, "/").await.unwrap(), "/");
    assert_eq!(
        fake.resolve_path(&a, "/workspace/loop").await.unwrap_err().kind(),
        ErrorKind::BadInput
    );
    for bad in ["workspace", "/workspace/../etc", "/a\0b"] {
        assert_eq!(
            fake.resolve_path(&a, bad).await.unwrap_err().kind(),
            ErrorKind::BadInput,
            "{bad:?}"
        );
        assert_eq!(
            fake.list_dir(&a, bad).await.unwrap_err().kind(),
            ErrorKind::BadInput,
            "{bad:?}"
        );
        assert_eq!(
            fake.remove_path(&a, bad).await.unwrap_err().kind(),
            ErrorKind::BadInput,
            "{bad:?}"
        );
    }

    // A symlink goes, not what it points to; a directory goes with everything in it.
    fake.remove_path(&a, "/workspace/hop").await.unwrap();
    assert!(
        fake.read_file(&a, "/home/u/.claude/.credentials.json")
            .await
            .is_ok()
    );
    fake.remove_path(&a, "/home").await.unwrap();
    assert_eq!(
        fake.read_file(&a, "/home/u/.claude/.credentials.json")
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        fake.remove_path(&a, "/home").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        fake.remove_path(&a, "/").await.unwrap_err().kind(),
        ErrorKind::BadInput
    );
    assert_eq!(fake.calls_of(Op::RemovePath).len(), 7);
}

#[tokio::test]
async fn terminals_echo_resize_and_end_when_closed() {
    let fake = FakeSandbox::new();
    let a = AgentId::new("a").unwrap();
    fake.create(&a, &plain()).await.unwrap();
    let mut term = fake.open_terminal(&a, TerminalRequest::default()).await.unwrap();
    let id = term.id().to_owned();
    assert_eq!(fake.terminal_size(&id), Some((80, 24)));
    term.input().write("echo hi\n").await.unwrap();
    assert_eq!(
        term.next().await.unwrap().unwrap(),
        TerminalEvent::Output("echo hi\n".into())
    );
    term.resize(100, 40).await.unwrap();
    assert_eq!(fake.terminal_size(&id), Some((100, 40)));
    assert!(fake.exec_running(&a, &id).await.unwrap());
    let input = term.input();
    drop(term);
    assert!(!fake.exec_running(&a, &id).await.unwrap());
    assert_eq!(input.write("late").await.unwrap_err().kind(), ErrorKind::Conflict);

    // A scripted command without an exit runs until cancelled or the sandbox stops.
    fake.push_exec(vec![ExecChunk::Stdout(b"working".to_vec())]);
    let stream = fake.exec_stream(&a, ExecRequest::default()).await.unwrap();
    assert!(fake.exec_running(&a, stream.id()).await.unwrap());
    fake.cancel_exec(&a, stream.id()).await.unwrap();
    assert!(!fake.exec_running(&a, stream.id()).await.unwrap());
    fake.push_exec(vec![]);
    let stream = fake.exec_stream(&a, ExecRequest::default()).await.unwrap();
    fake.stop(&a).await.unwrap();
    assert!(!fake.exec_running(&a, stream.id()).await.unwrap());
    assert!(fake.open_terminal(&a, TerminalRequest::default()).await.is_err());
    let b = AgentId::new("b").unwrap();
    assert_eq!(
        fake.exec_running(&b, "x").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
}
