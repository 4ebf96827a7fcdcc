//! R3, what stays out of the command's reach: every agenthold data directory (the one given with
//! `--data-dir`, the installation's, found through the configuration's `AGENTHOLD_*` variables), the CA
//! key, the master key file and the `--log` file, which agenthold writes append-only and which the command
//! can neither read, truncate, replace, rename, unlink nor redirect through a symlink, even when it lies in
//! the writable working directory.

use std::path::Path;

use super::{RemoveOnDrop, parse_results, probe_jail_only, probe_script, unique_name, write_mode};
use crate::support::{API, Env, entries_for, read_log};

// covers: R3 (the --log file in the working directory: out of reach, appended to, every entry lands)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn log_file_is_out_of_reach_and_append_only() {
    let env = Env::new().await;
    let logs = env.path("logs");
    std::fs::create_dir(&logs).unwrap();
    let log = logs.join("run.jsonl");
    let previous = "{\"previous\":\"run\"}\n";
    write_mode(&log, previous, 0o644);
    write_mode(&env.path("fake.jsonl"), "{\"fake\":\"entry\"}\n", 0o644);
    let probes = [
        probe_jail_only("read", "test -s logs/run.jsonl"),
        probe_jail_only("truncate", ": > logs/run.jsonl"),
        probe_jail_only("append", "echo '{\"fake\":\"append\"}' >> logs/run.jsonl"),
        probe_jail_only("unlink", "rm -f logs/run.jsonl && test ! -e logs/run.jsonl"),
        probe_jail_only("rename", "mv logs/run.jsonl logs/moved.jsonl"),
        probe_jail_only(
            "replace",
            "cp fake.jsonl logs/new && mv -f logs/new logs/run.jsonl",
        ),
        probe_jail_only(
            "symlink",
            "ln -sf /dev/null logs/run.jsonl.tmp && mv -f logs/run.jsonl.tmp logs/run.jsonl",
        ),
        probe_jail_only("rename_dir", "mv logs logs.moved"),
        probe_jail_only(
            "replace_dir",
            "mkdir -p other && cp fake.jsonl other/run.jsonl && mv -T other logs",
        ),
    ];
    let script = env.path("log-probes.sh");
    std::fs::write(&script, probe_script(&probes)).unwrap();
    let out = env
        .run()
        .allow(API)
        .log(&log)
        .sh(&format!(
            "sh {}; curl -sS -m 10 --noproxy '*' http://{API}/after-attempts",
            script.display()
        ))
        .await;
    let _cleanup = RemoveOnDrop(vec![env.path("logs.moved")]);
    out.expect_code(0);
    assert!(out.stdout.contains("upstream-ok"), "{out:#?}");
    let results = parse_results(&out.stdout);
    let worked: Vec<_> = results.iter().filter(|(_, (rc, _))| *rc == 0).collect();
    assert!(worked.is_empty(), "the command reached the log: {worked:?}");
    assert!(
        log.symlink_metadata().unwrap().is_file(),
        "the log is no longer a regular file"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.starts_with(previous), "not appended to:\n{text}");
    assert!(!text.contains("fake"), "the command wrote to the log:\n{text}");
    let entries = read_log(&log);
    assert!(
        entries_for(&entries, API)
            .iter()
            .any(|e| e["path"] == "/after-attempts"),
        "the entry did not land in the log:\n{text}"
    );
}

// covers: R3 (agenthold, as root, never follows a symlink the command could have planted in the working
// directory to write its log elsewhere, e.g. into ~/.bashrc, nor waits on a FIFO planted there)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn log_path_through_a_planted_symlink_or_fifo_is_refused() {
    let env = Env::new().await;
    let unique = unique_name(&env);
    let outside = Path::new("/var/lib").join(&unique);
    let _cleanup = RemoveOnDrop(vec![outside.clone()]);
    std::fs::create_dir(&outside).unwrap();
    let victim = outside.join("victim");
    write_mode(&victim, "original\n", 0o644);
    std::os::unix::fs::symlink(&outside, env.path("planted-dir")).unwrap();
    std::os::unix::fs::symlink(&victim, env.path("planted-file")).unwrap();
    nix::unistd::mkfifo(
        &env.path("planted-fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    for log in ["planted-dir/log.jsonl", "planted-file", "planted-fifo"] {
        let out = env.run().log(Path::new(log)).output(&["true"]).await;
        assert_eq!(out.code, Some(2), "--log {log}: {out:#?}");
        assert!(out.stderr.contains("--log"), "{out:#?}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original\n");
    assert!(!outside.join("log.jsonl").exists());
}

// covers: R3 (the installation's data dir, found through AGENTHOLD_DATA_DIR, is hidden as well as
// --data-dir: its CA key and master key)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn the_installations_data_dir_is_hidden_too() {
    let env = Env::new().await;
    let unique = unique_name(&env);
    let install = env.path("installation");
    std::fs::create_dir_all(install.join("egress")).unwrap();
    let ca_key = install.join("egress/ca.key");
    let master = install.join("master.key");
    write_mode(&ca_key, &format!("INSTALL-CA-{unique}\n"), 0o600);
    write_mode(&master, &format!("INSTALL-MASTER-{unique}\n"), 0o600);
    let (k, m, d) = (ca_key.display(), master.display(), install.display());
    let script = format!("cat {k} {m}; ls -A {d}; ls -A {d}/egress; echo done");
    for caller in [false, true] {
        let run = env.run().env("AGENTHOLD_DATA_DIR", &d.to_string());
        let run = if caller { super::as_caller(run) } else { run };
        let out = run.sh(&script).await;
        assert!(!out.stdout.contains("INSTALL-"), "{out:#?}");
        assert!(out.stdout.ends_with("done\n"), "{out:#?}");
        assert!(
            !out.stdout.contains("ca.key") && !out.stdout.contains("master.key"),
            "{out:#?}"
        );
    }
}

// covers: R3 (a key file the command could create before the server does is refused: the command would
// choose the installation's master key)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and nftables: run with make test"]
async fn a_missing_master_key_file_in_the_working_directory_is_refused() {
    let env = Env::new().await;
    let key = env.path("keys/master.key");
    let out = env
        .run()
        .env("AGENTHOLD_SECRETS_MASTER_KEY_FILE", &key.display().to_string())
        .sh("mkdir -p keys && echo chosen-by-the-command > keys/master.key")
        .await;
    assert_eq!(out.code, Some(2), "{out:#?}");
    assert!(!key.exists(), "the command created the master key file");
}
