//! R2, what the command sees: an allowlist. System directories read-only, the working directory
//! writable, private `/tmp`, `/var/tmp`, `/dev/shm` and home, nothing else of the host; no path-based
//! Unix socket of the host reachable (a read-only mount does not stop `connect()`), SysV IPC and
//! inherited descriptors of the host out of reach too. Every place a test plants something on the host is
//! unique to the test and removed when it ends.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{
    CALLER, DummySocket, RemoveOnDrop, as_caller, assert_all_fail_inside, in_jail, parse_results, probe,
    probe_jail_only, probe_script, unique_name, writable_dir, write_mode,
};
use crate::support::{Env, PYTHON};

/// A shell command that connects to the Unix socket at `path` (exits 0 if it could).
fn connect(path: &str) -> String {
    format!("{PYTHON} -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' '{path}'")
}

/// Creates `dir` (and its parents) with mode 0755 for everyone to enter.
fn make_dir(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A listening socket at `path` that anybody may connect to (mode 0777), removed when dropped.
fn open_socket(path: &Path) -> DummySocket {
    make_dir(path.parent().unwrap());
    let socket = DummySocket::bind(path);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    socket
}

/// `chown -R uid:gid path`.
fn chown_tree(path: &Path, id: u32) {
    let status = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{id}:{id}"))
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

// covers: R2 (no path-based Unix socket of the host: /tmp like tmux and X11, the home like Docker Desktop,
// /run/user, /var/lib like LXD, /var, /var/tmp, /dev/shm, /opt, /etc, /srv, /mnt; the abstract namespace
// belongs to the network namespace)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn host_unix_sockets_are_unreachable() {
    let env = Env::new().await;
    let unique = unique_name(&env);
    let home = Path::new("/home").join(format!("{unique}-home"));
    let tops: Vec<PathBuf> = [
        "/tmp",
        "/var/tmp",
        "/var/lib",
        "/var",
        "/opt",
        "/etc",
        "/srv",
        "/mnt",
        "/run/user",
    ]
    .iter()
    .map(|d| Path::new(d).join(&unique))
    .chain([home.clone()])
    .collect();
    let _cleanup = RemoveOnDrop(tops.clone());
    let mut paths: Vec<PathBuf> = tops
        .iter()
        .filter(|t| *t != &home)
        .map(|t| t.join("s.sock"))
        .collect();
    paths.extend([
        Path::new("/tmp").join(&unique).join("tmux-0/default"),
        Path::new("/tmp").join(&unique).join(".X11-unix/X0"),
        home.join(".docker/run/docker.sock"),
        Path::new("/dev/shm").join(format!("{unique}.sock")),
    ]);
    let _sockets: Vec<DummySocket> = paths.iter().map(|p| open_socket(p)).collect();
    let _shm_cleanup = RemoveOnDrop(vec![Path::new("/dev/shm").join(format!("{unique}.sock"))]);
    // The abstract namespace: reachable from the host's network namespace (checked here), never from
    // the sandbox's.
    let abstract_name = format!("agenthold-it-{unique}");
    let addr = <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
        abstract_name.as_bytes(),
    )
    .unwrap();
    let _abstract = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    std::os::unix::net::UnixStream::connect_addr(&addr).expect("control: abstract socket from the host");

    let mut probes = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let p = path.display().to_string();
        probes.push(probe(format!("connect_{i}"), connect(&p)));
        probes.push(probe_jail_only(
            format!("via_pid1_root_{i}"),
            connect(&format!("/proc/1/root{p}")),
        ));
    }
    probes.push(probe_jail_only(
        "abstract",
        format!("{PYTHON} -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"\\0{abstract_name}\")'"),
    ));
    for caller in [false, true] {
        let run = env.run().env("HOME", &home.display().to_string());
        let run = if caller { as_caller(run) } else { run };
        assert_all_fail_inside(&env, run, &probes).await;
    }
}

// covers: R2 (nothing outside the working directory is written on the host: /, /mnt, /media, /srv, /opt,
// /etc, /usr/local, /var, a /var/www-like tree, /var/lib, /var/spool, /home, /boot, /root, the caller's
// own directories, ~/.bashrc, ~/.config/systemd/user, ~/.ssh; nor through a symlink, `..`, a hard link or a
// renamed working directory)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn writes_outside_the_working_directory_never_reach_the_host() {
    let env = Env::new().await;
    let unique = unique_name(&env);
    let www = Path::new("/var").join(format!("{unique}-www"));
    make_dir(&www);
    let victim = Path::new("/tmp").join(format!("{unique}-victim"));
    write_mode(&victim, "original\n", 0o644);
    let moved = PathBuf::from(format!("{}.moved", env.dir.path().display()));
    let mut planted: Vec<PathBuf> = [
        "/",
        "/mnt",
        "/media",
        "/srv",
        "/opt",
        "/etc",
        "/usr/local",
        "/var",
        "/var/lib",
        "/var/spool",
        "/home",
        "/boot",
        "/root",
        "/tmp",
        "/var/tmp",
        "/dev/shm",
    ]
    .iter()
    .map(Path::new)
    .filter(|d| d.is_dir())
    .map(|d| d.join(&unique))
    .chain([www.join("index.html")])
    .collect();
    planted.push(Path::new("/tmp").join(format!("{unique}-sibling")));
    let mut cleanup = planted.clone();
    cleanup.extend([www.clone(), victim.clone(), moved.clone()]);
    // A home of the run's user with the files persistence goes through, and (for the caller) a
    // directory of its own outside the working directory.
    let home_of = |caller: bool| Path::new("/home").join(format!("{unique}-home-{}", u8::from(caller)));
    let own_of = |caller: bool| Path::new("/home").join(format!("{unique}-own-{}", u8::from(caller)));
    for caller in [false, true] {
        cleanup.extend([home_of(caller), own_of(caller)]);
    }
    let _cleanup = RemoveOnDrop(cleanup);
    for caller in [false, true] {
        let (home, own) = (home_of(caller), own_of(caller));
        make_dir(&home.join(".ssh"));
        make_dir(&own);
        write_mode(&home.join(".bashrc"), "original\n", 0o644);
        write_mode(&home.join(".ssh/authorized_keys"), "original\n", 0o644);
        if caller {
            chown_tree(&home, CALLER.parse().unwrap());
            chown_tree(&own, CALLER.parse().unwrap());
        }
        let (h, o) = (home.display(), own.display());
        let mut probes: Vec<_> = planted
            .iter()
            .enumerate()
            .map(|(i, f)| probe_jail_only(format!("write_{i}"), format!("echo planted > {}", f.display())))
            .collect();
        probes.extend([
            probe_jail_only("own_dir", format!("echo planted > {o}/{unique}")),
            probe_jail_only("bashrc", format!("echo evil >> {h}/.bashrc")),
            probe_jail_only(
                "systemd_user",
                format!("mkdir -p {h}/.config/systemd/user && echo '[Service]' > {h}/.config/systemd/user/evil.service"),
            ),
            probe_jail_only("authorized_keys", format!("echo evil >> {h}/.ssh/authorized_keys")),
            probe_jail_only(
                "symlink_to_root",
                format!("ln -sfn / rootlink && echo planted > rootlink/var/{unique}-www/index.html"),
            ),
            probe_jail_only("dotdot", format!("echo planted > ../{unique}-sibling")),
            probe_jail_only("cd_dotdot", format!("cd .. && echo planted > {unique}-sibling")),
            probe_jail_only(
                "hard_link",
                format!("ln {} hardlink && echo evil >> hardlink", victim.display()),
            ),
            probe_jail_only("rename_cwd", "mv \"$PWD\" \"$PWD.moved\""),
        ]);
        // The caller works in a directory it may write; root in the test's directory.
        let cwd = if caller {
            writable_dir(&env)
        } else {
            env.dir.path().to_owned()
        };
        let script = cwd.join("writes.sh");
        std::fs::write(&script, probe_script(&probes)).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let run = env.run().env("HOME", &h.to_string());
        let run = if caller { as_caller(run) } else { run };
        let out = run.output_in(&cwd, &["sh", &script.display().to_string()]).await;
        let who = if caller { "sudo caller" } else { "root" };
        let extra = [
            own.join(&unique),
            home.join(".config/systemd/user/evil.service"),
            moved.clone(),
        ];
        let reached: Vec<_> = planted
            .iter()
            .chain(&extra)
            .filter(|p| p.symlink_metadata().is_ok())
            .collect();
        assert!(
            reached.is_empty(),
            "{who}: written on the host: {reached:?}\n{out:#?}"
        );
        for file in [
            home.join(".bashrc"),
            home.join(".ssh/authorized_keys"),
            victim.clone(),
        ] {
            assert_eq!(
                std::fs::read_to_string(&file).unwrap(),
                "original\n",
                "{who}: {} changed\n{out:#?}",
                file.display()
            );
        }
        out.expect_code(0);
        let results = parse_results(&out.stdout);
        assert_eq!(results.len(), probes.len(), "{out:#?}");
        for name in ["hard_link", "rename_cwd"] {
            assert_ne!(results[name].0, 0, "{who}: {name} worked: {:?}", results[name]);
        }
    }
}

// covers: R2 (private /tmp, /var/tmp, /dev/shm and home: writable inside, never on the host, and the
// host's own files there are out of sight)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn tmp_and_home_are_private() {
    let env = Env::new().await;
    let unique = unique_name(&env);
    let home = Path::new("/home").join(format!("{unique}-home"));
    let host_files: Vec<PathBuf> = ["/tmp", "/var/tmp", "/dev/shm"]
        .iter()
        .map(|d| Path::new(d).join(format!("{unique}-host")))
        .chain([home.join("host-file")])
        .collect();
    let inside: Vec<PathBuf> = ["/tmp", "/var/tmp", "/dev/shm"]
        .iter()
        .map(|d| Path::new(d).join(format!("{unique}-jail")))
        .collect();
    // The home the command uses ($HOME: root's is the one it was given, the sudo caller's is its own
    // from the user database).
    let in_home = format!("{unique}-jail-home");
    let mut cleanup = host_files.clone();
    cleanup.extend(inside.clone());
    cleanup.push(home.clone());
    let _cleanup = RemoveOnDrop(cleanup);
    make_dir(&home);
    for file in &host_files {
        write_mode(file, "host\n", 0o644);
    }
    for caller in [false, true] {
        if caller {
            chown_tree(&home, CALLER.parse().unwrap());
        }
        let mut probes = Vec::new();
        for (i, file) in host_files.iter().enumerate() {
            probes.push(probe_jail_only(
                format!("sees_host_{i}"),
                format!("test -e {}", file.display()),
            ));
        }
        let mut writes = Vec::new();
        let targets = inside
            .iter()
            .map(|f| f.display().to_string())
            .chain([format!("\"$HOME/{in_home}\"")]);
        for (i, file) in targets.enumerate() {
            writes.push(format!("write_{i}"));
            probes.push(probe_jail_only(
                format!("write_{i}"),
                format!("echo jail > {file} && test \"$(cat {file})\" = jail"),
            ));
        }
        let run = env.run().env("HOME", &home.display().to_string());
        let run = if caller { as_caller(run) } else { run };
        let who = if caller { "sudo caller" } else { "root" };
        let results = in_jail(&env, run, &probes).await;
        for (name, (rc, out)) in &results {
            if writes.contains(name) {
                assert_eq!(*rc, 0, "{who}: {name} is not writable inside: {out}");
            } else {
                assert_ne!(*rc, 0, "{who}: {name}: the host's file is visible");
            }
        }
        let caller_home = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(CALLER.parse().unwrap()))
            .unwrap()
            .map(|u| u.dir);
        let homes = [Some(home.clone()), caller_home, Some(PathBuf::from("/root"))];
        let reached: Vec<PathBuf> = inside
            .iter()
            .cloned()
            .chain(homes.iter().flatten().map(|h| h.join(&in_home)))
            .filter(|p| p.exists())
            .collect();
        assert!(
            reached.is_empty(),
            "{who}: private files reached the host: {reached:?}"
        );
    }
}

// covers: R2 (--share-home: the home is seen through a private layer: readable, writes and sockets stay
// inside, agenthold's data dir in it hidden; the working directory below it stays writable on the host)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn share_home_shows_the_home_and_keeps_it_unchanged() {
    let env = Env::new().await;
    let unique = unique_name(&env);
    let home = Path::new("/home").join(format!("{unique}-home"));
    let _cleanup = RemoveOnDrop(vec![home.clone()]);
    let project = home.join("project");
    make_dir(&project);
    write_mode(&home.join(".gitconfig"), "[user]\n\tname = host-user\n", 0o644);
    write_mode(&home.join(".bashrc"), "original\n", 0o644);
    let key = home.join(".local/share/agenthold/egress/ca.key");
    make_dir(key.parent().unwrap());
    write_mode(&key, &format!("KEY-{unique}\n"), 0o600);
    let _socket = open_socket(&home.join(".docker/run/docker.sock"));
    let h = home.display();
    let probes = [
        probe_jail_only("reads_gitconfig", format!("grep -q host-user {h}/.gitconfig")),
        probe_jail_only(
            "writes_privately",
            format!("echo evil >> {h}/.bashrc && grep -q evil {h}/.bashrc"),
        ),
        probe_jail_only("work", "echo work > result"),
        probe_jail_only("reads_data_dir_key", format!("test -s {}", key.display())),
        probe_jail_only("docker_socket", connect(&format!("{h}/.docker/run/docker.sock"))),
    ];
    let script = project.join("probes.sh");
    std::fs::write(&script, probe_script(&probes)).unwrap();
    let run = || env.run().env("HOME", &h.to_string());
    let out = run()
        .share_home()
        .output_in(&project, &["sh", &script.display().to_string()])
        .await;
    out.expect_code(0);
    let results = parse_results(&out.stdout);
    for (name, expect_ok) in [
        ("reads_gitconfig", true),
        ("writes_privately", true),
        ("work", true),
        ("reads_data_dir_key", false),
        ("docker_socket", false),
    ] {
        assert_eq!(
            results[name].0 == 0,
            expect_ok,
            "{name}: {:?}\n{out:#?}",
            results[name]
        );
    }
    assert_eq!(
        std::fs::read_to_string(home.join(".bashrc")).unwrap(),
        "original\n"
    );
    assert_eq!(std::fs::read_to_string(project.join("result")).unwrap(), "work\n");
    // Without --share-home the home is an empty private directory; the working directory is still there.
    std::fs::remove_file(project.join("result")).unwrap();
    let out = run()
        .output_in(
            &project,
            &[
                "sh",
                "-c",
                &format!("test -e {h}/.gitconfig; echo seen=$?; echo work > result"),
            ],
        )
        .await;
    out.expect_code(0);
    assert_eq!(out.stdout, "seen=1\n", "{out:#?}");
    assert_eq!(std::fs::read_to_string(project.join("result")).unwrap(), "work\n");
}

// covers: R2 (SysV IPC of the host, e.g. a database's shared memory, is out of reach: own IPC namespace)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn host_sysv_ipc_is_out_of_reach() {
    let env = Env::new().await;
    let out = std::process::Command::new("ipcmk")
        .args(["-M", "4096", "-p", "0666"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let id: String = text
        .split_whitespace()
        .last()
        .expect("ipcmk prints the id")
        .to_owned();
    struct Segment(String);
    impl Drop for Segment {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ipcrm").args(["-m", &self.0]).status();
        }
    }
    let _segment = Segment(id.clone());
    // `ipcs -i` exits 0 also for an unknown id: look for it in the list.
    let probes = [probe(
        "shm_segment",
        format!("ipcs -m | awk '{{print $2}}' | grep -qx {id}"),
    )];
    assert_all_fail_inside(&env, env.run(), &probes).await;
    assert_all_fail_inside(&env, as_caller(env.run()), &probes).await;
}

// covers: R2 (a descriptor agenthold inherited beyond stdin, stdout and stderr does not reach the command)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn inherited_descriptors_do_not_reach_the_command() {
    let env = Env::new().await;
    let unique = unique_name(&env);
    let secret_dir = Path::new("/var/lib").join(&unique);
    let _cleanup = RemoveOnDrop(vec![secret_dir.clone()]);
    make_dir(&secret_dir);
    write_mode(
        &secret_dir.join("secret"),
        &format!("fd-secret-{unique}\n"),
        0o600,
    );
    let opener = format!("exec 3<{}/secret; exec \"$0\" \"$@\"", secret_dir.display());
    let run = env.run();
    // Nor through the jail's init, which holds it too.
    let mut cmd = run.wrapped(
        &["sh", "-c", &opener],
        &[
            "sh",
            "-c",
            "cat <&3; cat /proc/1/fd/3; ls -l /proc/1/fd/; echo done",
        ],
    );
    let out = crate::support::finish(cmd.spawn().unwrap()).await;
    assert!(!out.stdout.contains("fd-secret-"), "{out:#?}");
    assert!(out.stdout.ends_with("done\n"), "{out:#?}");
    out.expect_code(0);
}

// covers: R2 (the working directory is shared writable, so agenthold refuses one that would share what the
// jail hides: /, /tmp, /var, /home, the home itself, a directory inside the data dir)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn working_directories_that_would_expose_hidden_places_are_refused() {
    let env = Env::new().await;
    let unique = unique_name(&env);
    let home = Path::new("/home").join(format!("{unique}-home"));
    let _cleanup = RemoveOnDrop(vec![home.clone()]);
    make_dir(&home);
    let inside_data = env.path("data").join("inside");
    make_dir(&inside_data);
    for dir in [
        Path::new("/"),
        Path::new("/tmp"),
        Path::new("/var"),
        Path::new("/home"),
        home.as_path(),
        inside_data.as_path(),
    ] {
        let out = env
            .run()
            .env("HOME", &home.display().to_string())
            .output_in(dir, &["true"])
            .await;
        assert_eq!(out.code, Some(2), "{}: {out:#?}", dir.display());
        assert!(out.stderr.contains("working directory"), "{out:#?}");
    }
}
