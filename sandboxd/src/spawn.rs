//! Starting commands with a clean signal state. sandboxd blocks the signals it reads from a signalfd, and a
//! blocked mask is inherited across `execve`; `std::process::Command` does not reset it (checked: a child
//! spawned with it had SIGTERM blocked and survived `kill -TERM`). `posix_spawnp` with an explicit empty mask
//! and SIGPIPE back to its default action (Rust ignores it in its own process) does, without `unsafe` here.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt as _;

use nix::errno::Errno;
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags, posix_spawnp};
use nix::sys::signal::{SigSet, Signal};
use nix::unistd::Pid;

/// Exit status when the command cannot be executed.
pub(crate) const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit status when the command is not found.
pub(crate) const EXIT_NOT_FOUND: i32 = 127;

/// Where the child goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    /// Stay in sandboxd's process group (the workload of `boot`).
    Inherit,
    /// A new process group led by the child (`run`: kill the whole tree at once).
    New,
}

/// The C string of an argument or environment entry (they cannot contain NUL bytes; one that did would be cut
/// by the kernel anyway).
fn c_string(bytes: &[u8]) -> CString {
    CString::new(bytes.split(|&b| b == 0).next().unwrap_or_default()).unwrap_or_default()
}

/// Spawns `argv` (`argv[0]` looked up in `PATH`), inheriting stdio, environment and working directory, with an
/// empty signal mask and default SIGPIPE. Returns the child's pid (= its process group id with [`Group::New`]).
pub(crate) fn spawn(argv: &[OsString], group: Group) -> Result<Pid, Errno> {
    spawn_with_env(argv, group, &[])
}

/// [`spawn`] with `overrides` set in the child's environment on top of ours (a name given twice: the
/// last wins).
pub(crate) fn spawn_with_env(
    argv: &[OsString],
    group: Group,
    overrides: &[(OsString, OsString)],
) -> Result<Pid, Errno> {
    let Some(program) = argv.first() else {
        return Err(Errno::ENOENT);
    };
    // `posix_spawnp` searches our own `PATH`; a command whose environment sets another is looked up in
    // that one, as the engine's exec does.
    let path = overrides.iter().rev().find(|(name, _)| name == "PATH");
    let program = match path {
        Some((_, dirs)) if !program.as_bytes().contains(&b'/') => look_up(program, dirs)?,
        _ => c_string(program.as_bytes()),
    };
    let args: Vec<CString> = argv.iter().map(|a| c_string(a.as_bytes())).collect();
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (name, value) in overrides {
        vars.retain(|(existing, _)| existing != name);
        vars.push((name.clone(), value.clone()));
    }
    let env: Vec<CString> = vars
        .into_iter()
        .map(|(key, value)| {
            let mut entry = key.as_bytes().to_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            c_string(&entry)
        })
        .collect();

    let mut attr = PosixSpawnAttr::init()?;
    let mut flags = PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF;
    attr.set_sigmask(&SigSet::empty())?;
    let mut defaults = SigSet::empty();
    defaults.add(Signal::SIGPIPE);
    attr.set_sigdefault(&defaults)?;
    if group == Group::New {
        attr.set_pgroup(Pid::from_raw(0))?;
        flags |= PosixSpawnFlags::POSIX_SPAWN_SETPGROUP;
    }
    attr.set_flags(flags)?;
    posix_spawnp(&program, &PosixSpawnFileActions::init()?, &attr, &args, &env)
}

/// The first executable file called `program` in the `:`-separated `dirs` (an empty entry is the current
/// directory), as a path.
fn look_up(program: &OsString, dirs: &OsString) -> Result<CString, Errno> {
    use std::os::unix::fs::PermissionsExt as _;
    for dir in dirs.as_bytes().split(|&b| b == b':') {
        let dir = if dir.is_empty() { &b"."[..] } else { dir };
        let candidate = std::path::Path::new(std::ffi::OsStr::from_bytes(dir)).join(program);
        let executable =
            std::fs::metadata(&candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        if executable {
            return Ok(c_string(candidate.as_os_str().as_bytes()));
        }
    }
    Err(Errno::ENOENT)
}

/// The exit status for a failed spawn: 127 when the program is not found, 126 otherwise (not executable, a
/// directory, a bad format).
pub(crate) fn error_code(err: Errno) -> i32 {
    if err == Errno::ENOENT {
        EXIT_NOT_FOUND
    } else {
        EXIT_CANNOT_EXECUTE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::wait::{WaitStatus, waitpid};

    fn run(argv: &[&str], group: Group) -> Result<WaitStatus, Errno> {
        let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
        let pid = spawn(&argv, group)?;
        waitpid(pid, None)
    }

    #[test]
    fn exit_status_and_path_lookup() {
        assert!(matches!(
            run(&["sh", "-c", "exit 3"], Group::Inherit),
            Ok(WaitStatus::Exited(_, 3))
        ));
        assert_eq!(
            run(&["agenthold-no-such-program"], Group::Inherit).map(|_| ()),
            Err(Errno::ENOENT)
        );
        assert_eq!(error_code(Errno::ENOENT), 127);
        assert_eq!(error_code(Errno::EACCES), 126);
    }

    #[test]
    fn overrides_are_on_top_of_the_environment() {
        let argv: Vec<OsString> = [
            "sh",
            "-c",
            r#"test "$PATH" = /bin:/usr/bin && test "$AH_X" = two"#,
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let overrides = [
            ("PATH".into(), "/bin:/usr/bin".into()),
            ("AH_X".into(), "one".into()),
            ("AH_X".into(), "two".into()),
        ];
        let pid = spawn_with_env(&argv, Group::Inherit, &overrides).expect("spawned");
        assert!(matches!(waitpid(pid, None), Ok(WaitStatus::Exited(_, 0))));
        // The program is looked up in the command's PATH, not ours.
        let nowhere = [("PATH".into(), "/nonexistent".into())];
        assert_eq!(
            spawn_with_env(&argv, Group::Inherit, &nowhere).map(|_| ()),
            Err(Errno::ENOENT)
        );
    }

    #[test]
    fn new_group_and_clean_signal_state() {
        // Block a signal here (this test thread only) and ignore-by-Rust SIGPIPE is in effect: the child must
        // see neither, and must lead its own process group.
        let mut set = SigSet::empty();
        set.add(Signal::SIGUSR2);
        set.thread_block().expect("block");
        // `exec` so that grep reads the state sh passed on (dash blocks every signal while it forks).
        let checks = [
            r#"test "$(cut -d' ' -f5 /proc/$$/stat)" = "$$""#,
            r#"exec grep -q '^SigBlk:[[:space:]]*0000000000000000$' /proc/self/status"#,
            r#"exec grep -Eq '^SigIgn:[[:space:]]*[0-9a-f]{12}[02468ace]' /proc/self/status"#,
        ];
        for check in checks {
            let status = run(&["sh", "-c", check], Group::New);
            assert!(
                matches!(status, Ok(WaitStatus::Exited(_, 0))),
                "{check}: {status:?}"
            );
        }
    }
}
