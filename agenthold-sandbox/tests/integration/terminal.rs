//! Terminals and exec liveness in a real sandbox: a shell on a pseudo-terminal that echoes, resizes, ends
//! with its exit code and dies with everything it started in the foreground when dropped; whether a
//! streamed command whose stream was lost still runs, before and after a restart of the sandbox.

use std::time::Duration;

use agenthold_core::sandbox::{ExecRequest, Terminal, TerminalEvent, TerminalRequest};
use agenthold_core::{AgentId, ErrorKind};

use crate::support::*;

/// Read `term` into `seen` until `done(seen)` or `limit` passes; whether it was done. The exit code when
/// the terminal ended meanwhile.
async fn read_until(
    term: &mut Terminal,
    seen: &mut String,
    limit: Duration,
    done: impl Fn(&str) -> bool,
) -> (bool, Option<Option<i64>>) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done(seen) {
        match tokio::time::timeout_at(deadline, term.next()).await {
            Err(_) | Ok(None) => return (false, None),
            Ok(Some(event)) => match event.expect("terminal output") {
                TerminalEvent::Output(bytes) => seen.push_str(&String::from_utf8_lossy(&bytes)),
                TerminalEvent::Exit(code) => return (done(seen), Some(code)),
            },
        }
    }
    (true, None)
}

/// Whether some line of `text`, as a terminal shows it, is exactly `line`: escape sequences (bracketed
/// paste mode, colours) dropped, and what a carriage return went back over replaced.
fn has_line(text: &str, line: &str) -> bool {
    let mut plain = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, then one final byte in @..~.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
            continue;
        }
        plain.push(c);
    }
    plain
        .split('\n')
        .any(|l| l.trim_end_matches('\r').rsplit('\r').next() == Some(line))
}

/// Processes in `agent` whose command line contains `needle` (looked up by a second exec, in `/proc`).
async fn processes(env: &Env, agent: &AgentId, needle: &str) -> Vec<String> {
    let script = "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); \
                  [ -n \"$c\" ] && echo \"${p#/proc/} $c\"; done";
    let out = env.sh(agent, script).await.ok();
    out.stdout
        .lines()
        .filter(|l| l.contains(needle) && !l.contains("/proc/[0-9]"))
        .map(str::to_owned)
        .collect()
}

// covers: P1
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_terminal_echoes_resizes_exits_and_dies_with_its_handle() {
    let env = Env::start().await;
    env.guard(async {
        let agent = env.sandbox(None).await;
        let rt = &env.runtime;
        let mut term = rt
            .open_terminal(&agent, TerminalRequest::default())
            .await
            .unwrap();
        let mut seen = String::new();
        term.write("echo hi\n").await.unwrap();
        let (ok, _) = read_until(&mut term, &mut seen, Duration::from_secs(20), |s| {
            has_line(s, "hi")
        })
        .await;
        assert!(ok, "no `hi` line in the terminal:\n{seen:?}");
        // The placeholder variables and TERM are there; it is bash (the image has it).
        seen.clear();
        term.write("echo \"$TERM ${BASH_VERSION:+bash} ${API_KEY%%-*}\"\n")
            .await
            .unwrap();
        let expected = "xterm-256color bash agenthold";
        let (ok, _) = read_until(&mut term, &mut seen, Duration::from_secs(20), |s| {
            has_line(s, expected)
        })
        .await;
        assert!(ok, "{seen:?}");

        term.resize(100, 40).await.unwrap();
        seen.clear();
        term.input().write("stty size\n").await.unwrap();
        let (ok, _) = read_until(&mut term, &mut seen, Duration::from_secs(20), |s| {
            has_line(s, "40 100")
        })
        .await;
        assert!(ok, "stty size after a resize to 100x40:\n{seen:?}");

        // Dropping kills the shell and its foreground job; a second exec finds nothing of them.
        let id = term.id().to_owned();
        assert!(rt.exec_running(&agent, &id).await.unwrap());
        term.write("sleep 4242\n").await.unwrap();
        let started = wait_for(Duration::from_secs(20), || async {
            !processes(&env, &agent, "sleep 4242").await.is_empty()
        });
        assert!(started.await.is_some(), "the sleep never started");
        assert!(
            !processes(&env, &agent, &id).await.is_empty(),
            "sandboxd run --id {id}"
        );
        drop(term);
        let gone = wait_for(Duration::from_secs(20), || async {
            processes(&env, &agent, "sleep 4242").await.is_empty()
                && processes(&env, &agent, &id).await.is_empty()
        });
        assert!(
            gone.await.is_some(),
            "left behind: {:?} {:?}",
            processes(&env, &agent, "sleep 4242").await,
            processes(&env, &agent, &id).await
        );
        assert!(!rt.exec_running(&agent, &id).await.unwrap());

        // `exit 3` ends the stream with code 3.
        let mut term = rt
            .open_terminal(&agent, TerminalRequest::default())
            .await
            .unwrap();
        term.write("exit 3\n").await.unwrap();
        let mut seen = String::new();
        let (_, code) = read_until(&mut term, &mut seen, Duration::from_secs(20), |_| false).await;
        assert_eq!(code, Some(Some(3)), "{seen:?}");
        assert!(term.next().await.is_none());
        assert_eq!(
            term.write("late\n").await.unwrap_err().kind(),
            ErrorKind::Conflict
        );

        // A program of one's own, with its working directory and environment.
        let request = TerminalRequest {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "pwd; echo $GREETING; exit 7".into(),
            ],
            env: [("GREETING".to_owned(), "hello there".to_owned())].into(),
            cwd: Some("/etc".into()),
            ..TerminalRequest::default()
        };
        let mut term = rt.open_terminal(&agent, request).await.unwrap();
        let mut seen = String::new();
        let (_, code) = read_until(&mut term, &mut seen, Duration::from_secs(20), |_| false).await;
        assert_eq!(code, Some(Some(7)), "{seen:?}");
        assert!(
            has_line(&seen, "/etc") && has_line(&seen, "hello there"),
            "{seen:?}"
        );

        // Control bytes in the output stay output.
        let mut term = rt
            .open_terminal(&agent, TerminalRequest::default())
            .await
            .unwrap();
        term.write("sleep 0.5; printf '\\001\\002\\000ctl-ok\\n'\n")
            .await
            .unwrap();
        let mut seen = String::new();
        let (ok, _) = read_until(&mut term, &mut seen, Duration::from_secs(20), |s| {
            s.contains("ctl-ok\r\n")
        })
        .await;
        assert!(ok, "{seen:?}");
        assert!(seen.contains("\u{1}\u{2}\u{0}ctl-ok"), "{seen:?}");
    })
    .await;
}

// covers: P1
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_lost_command_is_known_running_until_cancelled_or_the_sandbox_restarts() {
    let env = Env::start().await;
    env.guard(async {
        let agent = env.sandbox(None).await;
        let rt = &env.runtime;
        let long = || ExecRequest {
            argv: vec!["sleep".into(), "600".into()],
            ..ExecRequest::default()
        };
        // The stream is dropped, as a restarted server loses it; the command runs on.
        let id = rt.exec_stream(&agent, long()).await.unwrap().id().to_owned();
        assert!(rt.exec_running(&agent, &id).await.unwrap());
        rt.cancel_exec(&agent, &id).await.unwrap();
        let ended = wait_for(Duration::from_secs(10), || async {
            !rt.exec_running(&agent, &id).await.unwrap()
        });
        assert!(ended.await.is_some(), "still running after cancel_exec");
        assert!(processes(&env, &agent, "sleep 600").await.is_empty());

        // A finished command, an id never used: not running. A malformed id: refused.
        let done = rt.exec_stream(
            &agent,
            ExecRequest {
                argv: vec!["true".into()],
                ..ExecRequest::default()
            },
        );
        let done = done.await.unwrap();
        let done_id = done.id().to_owned();
        assert_eq!(done.collect().await.unwrap().exit_code, 0);
        assert!(!rt.exec_running(&agent, &done_id).await.unwrap());
        assert!(!rt.exec_running(&agent, "never-started").await.unwrap());
        assert_eq!(
            rt.exec_running(&agent, "../x").await.unwrap_err().kind(),
            ErrorKind::BadInput
        );

        // A restart of the sandbox ends every command.
        let id = rt.exec_stream(&agent, long()).await.unwrap().id().to_owned();
        assert!(rt.exec_running(&agent, &id).await.unwrap());
        rt.stop(&agent).await.unwrap();
        assert!(!rt.exec_running(&agent, &id).await.unwrap());
        rt.start(&agent).await.unwrap();
        assert!(!rt.exec_running(&agent, &id).await.unwrap());
        let ghost = env.next_agent();
        assert_eq!(
            rt.exec_running(&ghost, &id).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
    })
    .await;
}
