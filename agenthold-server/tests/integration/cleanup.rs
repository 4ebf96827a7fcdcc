//! Cleanup (issue 3, item 7: "cleans up namespaces and rules even when the command fails or is
//! interrupted"): after every way a run can end, no `ahr-<pid>-*` namespace remains in `ip netns list`,
//! no veth of the run is on the host and no nftables table of agenthold's is on the host. A run killed
//! with SIGKILL cannot clean up: its namespaces stay until the next run removes them, and its command
//! dies with it (parent-death signal down the jail's two stages; when the jail's init, pid 1 of its PID
//! namespace, ends, the kernel kills whatever is left in that namespace, background processes included).
//!
//! The command runs in its own PID namespace, so the pids it prints (`$$`, `$!`) are the jail's: the
//! tests look its processes up in the host's /proc ([`crate::support::jail_process`]) and identify
//! them by host pid and start time ([`HostProcess`]), so that a reused pid is never taken for one of them.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{
    Env, HostProcess, HostSnapshot, jail_pid_namespace, jail_process_from_file, namespaces_of,
    processes_in_pid_namespace, sandbox_tag, wait_exit, wait_for_file,
};

/// Prints the sandbox's links (the veth's name carries the run's tag).
const SHOW_LINKS: &str = "ip -o link";

/// A command that records its links in `tag_file` and its pid (inside the jail) in `pid_file`, then
/// sleeps.
fn sleeper(env: &Env) -> (String, std::path::PathBuf, std::path::PathBuf) {
    let (tag_file, pid_file) = (env.path("links.txt"), env.path("cmd.pid"));
    let script = format!(
        "{SHOW_LINKS} > {}; echo $$ > {}; exec sleep 30",
        tag_file.display(),
        pid_file.display()
    );
    (script, tag_file, pid_file)
}

fn signal(pid: u32, signal: Signal) {
    kill(Pid::from_raw(i32::try_from(pid).unwrap()), signal).unwrap();
}

// covers: issue 3 item 7 (cleanup after a normal run)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn normal_run_leaves_nothing_behind() {
    let env = Env::new().await;
    let before = HostSnapshot::take();
    let out = env.run().sh(SHOW_LINKS).await;
    out.expect_code(0);
    let tag = sandbox_tag(&out.stdout).unwrap_or_else(|| panic!("no agenthold veth inside: {out:#?}"));
    before.assert_left_nothing(out.pid, Some(&tag));
}

// covers: issue 3 item 7 (cleanup when the command fails, cannot start, or is killed)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn failed_command_leaves_nothing_behind() {
    let env = Env::new().await;
    let before = HostSnapshot::take();
    for (script, code) in [
        (format!("{SHOW_LINKS}; exit 3"), 3),
        (format!("{SHOW_LINKS}; kill -KILL $$"), 137),
    ] {
        let out = env.run().sh(&script).await;
        out.expect_code(code);
        let tag = sandbox_tag(&out.stdout).unwrap_or_else(|| panic!("no agenthold veth inside: {out:#?}"));
        before.assert_left_nothing(out.pid, Some(&tag));
    }
    let out = env.run().output(&["/nonexistent/command"]).await;
    assert!(matches!(out.code, Some(c) if c != 0), "{out:#?}");
    before.assert_left_nothing(out.pid, None);
}

/// Sends `sig` to agenthold while the command sleeps: the command must end, agenthold must exit with
/// 128 + N (the command's end) and leave nothing behind.
async fn interrupted_run_cleans_up(sig: Signal) {
    let env = Env::new().await;
    let before = HostSnapshot::take();
    let (script, tag_file, pid_file) = sleeper(&env);
    let mut child = env.run().spawn(&["sh", "-c", &script]);
    let agenthold = child.id().unwrap();
    let command = jail_process_from_file(agenthold, &pid_file).await;
    let tag = sandbox_tag(&wait_for_file(&tag_file).await).expect("the run's tag");
    assert_eq!(
        namespaces_of(agenthold).len(),
        2,
        "the run's two namespaces while it runs"
    );
    // Past the command's start, agenthold is waiting for it with its handlers installed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = Instant::now();
    signal(agenthold, sig);
    let code = wait_exit(&mut child).await;
    assert_eq!(code, Some(128 + sig as i32), "agenthold's exit code after {sig}");
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "agenthold took {:?} to exit",
        sent.elapsed()
    );
    if !command.wait_gone(Duration::from_secs(2)).await {
        command.kill();
        panic!("the command survived {sig} to agenthold: {command:?}");
    }
    before.assert_left_nothing(agenthold, Some(&tag));
}

// covers: issue 3 item 7 (cleanup after Ctrl-C)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn sigint_to_agenthold_ends_the_command_and_cleans_up() {
    interrupted_run_cleans_up(Signal::SIGINT).await;
}

// covers: issue 3 item 7 (cleanup after SIGTERM)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn sigterm_to_agenthold_ends_the_command_and_cleans_up() {
    interrupted_run_cleans_up(Signal::SIGTERM).await;
}

// covers: issue 3 item 7 (a killed run: the command dies with it, the next run removes what it left)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn sigkill_leaves_namespaces_that_the_next_run_removes() {
    // Exclusive: any run removes the stale namespaces of killed runs, so no other test may start one
    // between the kill and the checks below (nor another copy of this binary: `Env` also takes a file
    // lock).
    let env = Env::exclusive().await;
    let before = HostSnapshot::take();
    let (script, tag_file, pid_file) = sleeper(&env);
    let mut child = env.run().spawn(&["sh", "-c", &script]);
    let agenthold = child.id().unwrap();
    let command = jail_process_from_file(agenthold, &pid_file).await;
    let tag = sandbox_tag(&wait_for_file(&tag_file).await).expect("the run's tag");
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(agenthold, Signal::SIGKILL);
    assert_eq!(wait_exit(&mut child).await, None, "agenthold was killed");
    if !command.wait_gone(Duration::from_secs(3)).await {
        command.kill();
        panic!("the command outlived a killed agenthold: {command:?}");
    }
    let stale = namespaces_of(agenthold);
    assert_eq!(
        stale.len(),
        2,
        "a killed run cannot clean up: its namespaces should still be there: {stale:?}"
    );

    let out = env.run().sh(SHOW_LINKS).await;
    out.expect_code(0);
    before.assert_left_nothing(agenthold, Some(&tag));
    let next_tag = sandbox_tag(&out.stdout).expect("the next run's tag");
    before.assert_left_nothing(out.pid, Some(&next_tag));
}

// covers: issue 3 item 7 (cleanup when interrupted at any moment, setup included)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn signal_during_setup_still_cleans_up() {
    let env = Env::new().await;
    let mut leaks = Vec::new();
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let mut child = env.run().spawn(&["true"]);
        let agenthold = child.id().unwrap();
        // Signal as soon as the first namespace exists: agenthold is setting up.
        let deadline = Instant::now() + Duration::from_secs(10);
        while namespaces_of(agenthold).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        signal(agenthold, sig);
        let code = wait_exit(&mut child).await;
        let left = namespaces_of(agenthold);
        if !left.is_empty() {
            leaks.push(format!("{sig}: exit {code:?}, namespaces left: {left:?}"));
        }
    }
    // Any later run removes them; make sure this test leaves nothing either way.
    env.run().output(&["true"]).await.expect_code(0);
    assert!(leaks.is_empty(), "{}", leaks.join("\n"));
}

/// Waits (at most 2 s: it may not have exec'd yet) until `process` runs `sleep 30`.
async fn runs_sleep_30(process: &HostProcess) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while process.cmdline() != ["sleep", "30"] {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// How a run with background processes ends.
#[derive(Debug, Clone, Copy)]
enum End {
    /// The command exits 0 while its background processes still run.
    CommandExits,
    /// agenthold gets this signal.
    Signal(Signal),
}

// covers: issue 3 item 7 (nothing of the command keeps running once the run is over)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn background_processes_do_not_outlive_the_run() {
    let env = Env::new().await;
    let mut survivors = Vec::new();
    for end in [
        End::CommandExits,
        End::Signal(Signal::SIGTERM),
        End::Signal(Signal::SIGINT),
        End::Signal(Signal::SIGKILL),
    ] {
        let (bg, orphan, ready, go) = (
            env.path("bg.pid"),
            env.path("orphan.pid"),
            env.path("ready"),
            env.path("go"),
        );
        for file in [&bg, &orphan, &ready, &go] {
            let _ = std::fs::remove_file(file);
        }
        // A plain background job, and an orphan in its own session that ignores the polite signals (its
        // parent subshell exits at once, so the jail's init adopts it). Then the command waits for the
        // test to have found them on the host, and exits or sleeps until agenthold is signalled.
        let tail = match end {
            End::CommandExits => format!("while [ ! -e {} ]; do sleep 0.02; done; exit 0", go.display()),
            End::Signal(_) => "exec sleep 30".to_owned(),
        };
        let script = format!(
            "sleep 30 </dev/null >/dev/null 2>&1 & echo $! > {bg}; \
             (trap '' TERM INT HUP; setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $! > {orphan}); \
             echo $$ > {ready}; {tail}",
            bg = bg.display(),
            orphan = orphan.display(),
            ready = ready.display(),
        );
        let mut child = env.run().spawn(&["sh", "-c", &script]);
        let agenthold = child.id().unwrap();
        let background = jail_process_from_file(agenthold, &bg).await;
        let adopted = jail_process_from_file(agenthold, &orphan).await;
        jail_process_from_file(agenthold, &ready).await;
        // Everything in the jail now (its init, the shell, both sleeps...), not only what the test asked for.
        let ns = jail_pid_namespace(agenthold).expect("the jail's PID namespace");
        let everything: Vec<HostProcess> = processes_in_pid_namespace(&ns)
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        for (what, process) in [("background job", background), ("orphan", adopted)] {
            assert!(
                runs_sleep_30(&process).await,
                "{end:?}: the {what} found on the host: {process:?} {:?}",
                process.cmdline()
            );
            assert!(
                everything.contains(&process),
                "{end:?}: the {what} is not in the jail's namespace"
            );
        }
        match end {
            End::CommandExits => std::fs::write(&go, "").unwrap(),
            End::Signal(sig) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                signal(agenthold, sig);
            }
        }
        let code = wait_exit(&mut child).await;
        let expected = match end {
            End::CommandExits => Some(0),
            End::Signal(Signal::SIGKILL) => None,
            End::Signal(sig) => Some(128 + sig as i32),
        };
        assert_eq!(code, expected, "{end:?}: agenthold's exit code");
        for process in &everything {
            if !process.wait_gone(Duration::from_secs(2)).await {
                survivors.push(format!("{end:?}: {process:?} {:?} still runs", process.cmdline()));
                process.kill();
            }
        }
    }
    // The SIGKILL case left its namespaces: any run removes them.
    env.run().output(&["true"]).await.expect_code(0);
    assert!(survivors.is_empty(), "{}", survivors.join("\n"));
}
