//! The warm pool (`sandbox.warm_pool`): ready sandboxes are handed out to any spec of their image, have no
//! egress before, follow the caller's policy, environment, secrets and limits after, are not listed, and
//! go with the runtime.

use std::time::{Duration, Instant};

use agenthold_core::sandbox::ExecRequest;
use agenthold_core::{AgentId, SandboxSpec};
use agenthold_sandbox::Runtime;

use crate::support::*;

async fn wait_ready(runtime: &Runtime, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while runtime.warm_pool_ready() < want {
        assert!(Instant::now() < deadline, "the warm pool did not fill");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `curl` over plain HTTP through the transparent path: the HTTP status, 0 when refused before HTTP.
async fn http_status(runtime: &Runtime, agent: &AgentId, url: &str) -> u16 {
    let out = sh(
        runtime,
        agent,
        &format!("curl -s -m 5 --noproxy '*' -o /dev/null -w '%{{http_code}}' {url}"),
    )
    .await;
    out.stdout.trim().parse().unwrap_or(0)
}

// covers: P1, E8 (a pooled sandbox has no egress until handed out)
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_warm_pool_hands_out_ready_sandboxes() {
    let env = Env::start_with(|c| c.sandbox.warm_pool = 1).await;
    env.guard(async {
        let runtime = &env.runtime;
        wait_ready(runtime, 1).await;
        let pooled = sandboxes_of(&env.instance).await;
        assert_eq!(pooled.len(), 1, "one pooled sandbox: {pooled:?}");
        assert!(
            runtime.sandboxes().await.unwrap().is_empty(),
            "pooled sandboxes are not listed"
        );
        let url = format!("http://{ALLOWED}/pool");
        assert_eq!(
            http_status(runtime, &pooled[0], &url).await,
            0,
            "no egress before it is handed out"
        );

        // Handed out: the caller's policy applies at once.
        let started = Instant::now();
        let spec = SandboxSpec {
            policy: allowlist(),
            ..SandboxSpec::default()
        };
        let agent = runtime.create_sandbox(spec).await.expect("create from the pool");
        eprintln!("handed out in {:?}", started.elapsed());
        assert_eq!(agent, pooled[0], "the ready sandbox was handed out");
        assert_eq!(http_status(runtime, &agent, &url).await, 200);
        assert_eq!(
            http_status(runtime, &agent, &format!("http://{DENIED}/")).await,
            0,
            "denied name"
        );
        assert_eq!(runtime.sandboxes().await.unwrap(), std::slice::from_ref(&agent));

        // Another image cannot use a pooled container (the image and the runtime are fixed at creation).
        wait_ready(runtime, 1).await;
        let refill = sandboxes_of(&env.instance)
            .await
            .into_iter()
            .find(|a| *a != agent)
            .expect("the refill");
        let other_image = SandboxSpec {
            image: "agenthold-no-such-image:latest".into(),
            policy: allowlist(),
            ..SandboxSpec::default()
        };
        assert!(
            runtime.create_sandbox(other_image).await.is_err(),
            "a missing image fails"
        );
        assert_eq!(runtime.warm_pool_ready(), 1, "the pool was not touched");
        assert!(sandboxes_of(&env.instance).await.contains(&refill));

        // Shutdown removes what is still pooled; handed-out sandboxes are the caller's.
        runtime.remove(&agent).await.expect("remove");
        runtime.shutdown().await;
        assert!(
            sandboxes_of(&env.instance).await.is_empty(),
            "pooled sandboxes outlived the runtime"
        );
    })
    .await;
}

/// The limits a sandbox's cgroup shows from inside (cgroup v1 or v2): pids, memory, CPU quota per period.
const CGROUP_LIMITS: &str = "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max; \
     cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; \
     cat /sys/fs/cgroup/cpu.max 2>/dev/null || \
     echo $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)";

// covers: P1, E10 (placeholders only in the sandbox), S1 (the spec's limits hold after a hand-out)
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_pooled_sandbox_takes_any_spec_of_its_image() {
    let env = Env::start_with(|c| c.sandbox.warm_pool = 1).await;
    env.guard(Box::pin(async {
        let runtime = &env.runtime;
        let docker = docker().await;
        wait_ready(runtime, 1).await;
        let pooled = sandboxes_of(&env.instance).await;
        assert_eq!(pooled.len(), 1, "one pooled sandbox: {pooled:?}");
        let name = format!("agenthold-{}", pooled[0]);
        let before = docker.inspect_container(&name, None).await.expect("inspect");
        let engine_env = before.config.and_then(|c| c.env).unwrap_or_default().join("\n");
        assert!(
            !engine_env.contains("GREETING") && !engine_env.contains(SECRET_ENV),
            "a pooled container carries no spec's environment: {engine_env}"
        );

        // The full spec: environment, a secret with its placeholder variable, labels, limits.
        let mut full = spec();
        full.cpus = Some(0.5);
        full.env.insert("GREETING".into(), "hello world".into());
        full.env.insert("SHADOWED".into(), "from-spec".into());
        full.labels.insert("team".into(), "blue".into());
        let agent = runtime.create_sandbox(full).await.expect("hand-out");
        assert_eq!(agent, pooled[0], "the pooled sandbox was handed out");

        // The environment reaches every exec as if set at creation: placeholders only, never the value.
        let out = runtime.exec(&agent, &["env"]).await.expect("env");
        let vars = String::from_utf8_lossy(&out.stdout).into_owned();
        let placeholder = runtime.agent_secrets(&agent).await.expect("secrets")[0]
            .placeholder
            .clone();
        assert!(vars.lines().any(|l| l == "GREETING=hello world"), "{vars}");
        assert!(vars.lines().any(|l| l == format!("{SECRET_ENV}={placeholder}")), "{vars}");
        assert!(!vars.contains(SECRET_VALUE), "the secret's value reached the sandbox");
        assert!(vars.lines().any(|l| l.starts_with("HTTPS_PROXY=")), "the datapath's variables stay");
        // A command's own environment still wins.
        let own = ExecRequest {
            argv: vec!["sh".into(), "-c".into(), "echo $SHADOWED".into()],
            env: [("SHADOWED".to_owned(), "mine".to_owned())].into(),
            ..ExecRequest::default()
        };
        let out = runtime.exec_request(&agent, own).await.expect("exec");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "mine");
        // Also in a shell started later; no file in the sandbox holds the value.
        let script = format!("echo \"$GREETING\"; grep -rlsF '{SECRET_VALUE}' /.agenthold /workspace /etc /tmp; echo done");
        let out = sh(runtime, &agent, &script).await;
        assert_eq!(out.stdout.trim(), "hello world\ndone", "{out}");

        // The secret is injected for its host, from the placeholder.
        let args = format!(
            "curl -sS -m 10 -o /dev/null -w '%{{http_code}}' -H \"X-Key: ${SECRET_ENV}\" https://{ALLOWED}/pool-inject"
        );
        let out = sh(runtime, &agent, &args).await;
        assert_eq!(out.stdout.trim(), "200", "{out}");
        let seen = env
            .up
            .https
            .requests()
            .into_iter()
            .find(|r| r.path == "/pool-inject")
            .expect("the request reached the upstream");
        assert_eq!(seen.header("x-key"), Some(SECRET_VALUE));

        // Labels are the runtime's records; limits are on the running container before the hand-out returned.
        assert_eq!(runtime.spec(&agent).await.expect("spec").labels.get("team").map(String::as_str), Some("blue"));
        // In the cgroups before the hand-out returned (written there directly, or by the engine).
        let limits_hold = |out: Out| {
            let lines: Vec<&str> = out.stdout.lines().map(str::trim).collect();
            assert_eq!(lines.first().copied(), Some("128"), "{out}");
            assert_eq!(lines.get(1).copied(), Some("268435456"), "{out}");
            let cpu: Vec<u64> = lines
                .get(2)
                .map(|l| l.split_whitespace().filter_map(|n| n.parse().ok()).collect())
                .unwrap_or_default();
            assert!(cpu.len() == 2 && cpu[0] * 2 == cpu[1], "half a CPU: {out}");
        };
        limits_hold(sh(runtime, &agent, CGROUP_LIMITS).await);
        // The engine's record follows (in the background when the cgroups were written directly).
        let engine_limits = || async {
            let after = docker.inspect_container(&name, None).await.expect("inspect");
            let hc = after.host_config.expect("host config");
            (hc.memory, hc.memory_swap, hc.pids_limit, hc.nano_cpus)
        };
        let wanted = (Some(256 * 1024 * 1024), Some(256 * 1024 * 1024), Some(128), Some(500_000_000));
        let recorded = wait_for(Duration::from_secs(30), || async { engine_limits().await == wanted }).await;
        assert!(recorded.is_some(), "engine record: {:?}", engine_limits().await);
        // A restart recreates the cgroups from the engine's record: the limits are still the spec's.
        runtime.stop(&agent).await.expect("stop");
        runtime.start(&agent).await.expect("start");
        limits_hold(sh(runtime, &agent, CGROUP_LIMITS).await);

        runtime.remove(&agent).await.expect("remove");
        assert!(
            !sandboxes_of(&env.instance).await.contains(&agent),
            "removed with its sandbox"
        );
        runtime.shutdown().await;
    }))
    .await;
}

/// The exec ids of the `sandboxd run --request-stdin` waiting in `agent`'s container, with the engine's
/// exec ids.
async fn runs_started_ahead(docker: &bollard::Docker, agent: &AgentId) -> Vec<(String, String)> {
    let container = docker
        .inspect_container(&format!("agenthold-{agent}"), None)
        .await
        .expect("inspect");
    let mut found = Vec::new();
    for exec in container.exec_ids.unwrap_or_default() {
        let Ok(inspect) = docker.inspect_exec(&exec).await else {
            continue;
        };
        let args = inspect
            .process_config
            .and_then(|p| p.arguments)
            .unwrap_or_default();
        if inspect.running == Some(true) && args.iter().any(|a| a == "--request-stdin") {
            found.push((args[2].clone(), exec));
        }
    }
    found
}

/// Waits for the pool's sandbox and returns it with the one run waiting in it (exec id, engine exec id).
async fn pooled_with_a_run_ahead(env: &Env) -> (bollard::Docker, AgentId, (String, String)) {
    let docker = docker().await;
    wait_ready(&env.runtime, 1).await;
    let pooled = sandboxes_of(&env.instance).await;
    assert_eq!(pooled.len(), 1, "one pooled sandbox: {pooled:?}");
    let ahead = runs_started_ahead(&docker, &pooled[0]).await;
    assert_eq!(ahead.len(), 1, "one run waits in the pooled sandbox: {ahead:?}");
    let ahead = ahead[0].clone();
    (docker, pooled[0].clone(), ahead)
}

// covers: P1 (a command's environment, input, directory, exit code and cancel are the same through the run
// started ahead)
/// The first command after a hand-out is given to the `sandboxd run` the pool started ahead (no engine exec
/// on its path) and behaves as any exec: the spec's environment under its own, stdin, working directory,
/// exit code, `exec_running` and `cancel_exec` by its id. The next command is a new engine exec.
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn the_first_command_after_a_hand_out_skips_the_engines_exec() {
    let env = Env::start_with(|c| c.sandbox.warm_pool = 1).await;
    env.guard(Box::pin(async {
        let runtime = &env.runtime;
        let (docker, pooled, (ahead_id, _)) = pooled_with_a_run_ahead(&env).await;

        let mut full = spec();
        full.env.insert("AH_SPEC".into(), "from-spec".into());
        full.env.insert("AH_BOTH".into(), "spec".into());
        let agent = runtime.create_sandbox(full).await.expect("hand-out");
        assert_eq!(agent, pooled);
        let request = ExecRequest {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "printf '%s|%s|%s|%s|' \"$AH_SPEC\" \"$AH_BOTH\" \"$PWD\" \"$(id -u)\"; cat; sleep 1; exit 3"
                    .into(),
            ],
            env: [("AH_BOTH".to_owned(), "own".to_owned())].into(),
            cwd: Some("/tmp".into()),
            stdin: Some(b"input\x00\xff".to_vec()),
            ..ExecRequest::default()
        };
        let stream = runtime.exec_stream(&agent, request).await.expect("first exec");
        assert_eq!(
            stream.id(),
            ahead_id,
            "the first command went to the run started ahead"
        );
        assert!(runtime.exec_running(&agent, &ahead_id).await.expect("running"));
        let out = stream.collect().await.expect("output");
        let uid = runtime.exec(&agent, &["id", "-u"]).await.expect("uid");
        let mut expected = format!(
            "from-spec|own|/tmp|{}|input",
            String::from_utf8_lossy(&uid.stdout).trim()
        )
        .into_bytes();
        expected.extend_from_slice(b"\x00\xff");
        assert_eq!(out.stdout, expected, "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.exit_code, 3);
        assert!(!runtime.exec_running(&agent, &ahead_id).await.expect("running"));
        assert!(runs_started_ahead(&docker, &agent).await.is_empty(), "used once");

        // The next command is an engine exec with its own id.
        let next = runtime
            .exec_stream(
                &agent,
                ExecRequest {
                    argv: vec!["true".into()],
                    ..ExecRequest::default()
                },
            )
            .await
            .expect("second exec");
        assert_ne!(next.id(), ahead_id);
        assert_eq!(next.collect().await.expect("output").exit_code, 0);
        runtime.remove(&agent).await.expect("remove");

        // Cancel by id and timeouts hold for a command given ahead, on the refill.
        wait_ready(runtime, 1).await;
        let agent = runtime.create_sandbox(spec()).await.expect("hand-out");
        let long = ExecRequest {
            argv: vec!["sh".into(), "-c".into(), "sleep 60 & sleep 60".into()],
            ..ExecRequest::default()
        };
        let started = Instant::now();
        let stream = runtime.exec_stream(&agent, long).await.expect("first exec");
        let id = stream.id().to_owned();
        assert!(runtime.exec_running(&agent, &id).await.expect("running"));
        runtime.cancel_exec(&agent, &id).await.expect("cancel");
        let out = stream.collect().await.expect("output");
        assert_eq!(out.exit_code, 137, "killed by cancel");
        assert!(started.elapsed() < Duration::from_secs(30));
        runtime.remove(&agent).await.expect("remove");

        wait_ready(runtime, 1).await;
        let agent = runtime.create_sandbox(spec()).await.expect("hand-out");
        let timed = ExecRequest {
            argv: vec!["sleep".into(), "60".into()],
            timeout: Some(Duration::from_millis(500)),
            ..ExecRequest::default()
        };
        let out = runtime.exec_request(&agent, timed).await.expect("first exec");
        assert_eq!(out.exit_code, 124, "timed out");
        runtime.remove(&agent).await.expect("remove");
        runtime.shutdown().await;
    }))
    .await;
}

// covers: P1
/// When the run started ahead is gone (killed here from the host), the first command never ran there and
/// goes through a new engine exec, with the same result.
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn a_run_started_ahead_that_died_falls_back_to_an_engine_exec() {
    let env = Env::start_with(|c| c.sandbox.warm_pool = 1).await;
    env.guard(Box::pin(async {
        let runtime = &env.runtime;
        let (docker, pooled, (ahead_id, exec)) = pooled_with_a_run_ahead(&env).await;
        let pid = docker
            .inspect_exec(&exec)
            .await
            .expect("inspect")
            .pid
            .expect("pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill the run started ahead");
        let gone = wait_for(Duration::from_secs(10), || async {
            runs_started_ahead(&docker, &pooled).await.is_empty()
        })
        .await;
        assert!(gone.is_some(), "the run started ahead is still there");

        let agent = runtime.create_sandbox(spec()).await.expect("hand-out");
        assert_eq!(agent, pooled);
        let request = ExecRequest {
            argv: vec!["sh".into(), "-c".into(), "cat; exit 5".into()],
            stdin: Some(b"once".to_vec()),
            ..ExecRequest::default()
        };
        let stream = runtime.exec_stream(&agent, request).await.expect("first exec");
        assert_ne!(stream.id(), ahead_id, "a new engine exec");
        let out = stream.collect().await.expect("output");
        assert_eq!((out.stdout.as_slice(), out.exit_code), (&b"once"[..], 5));
        runtime.remove(&agent).await.expect("remove");
        runtime.shutdown().await;
    }))
    .await;
}
