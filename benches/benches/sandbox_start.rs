//! Sandbox start: `Runtime::create_sandbox` until the first `exec(["true"])` returns, vs
//! `docker run --rm agenthold/dev:latest true`, side by side in one run (issue 5, item 11; issue 14).
//!
//! `cargo bench -p agenthold-benches --bench sandbox_start` (as root, Docker running). `agenthold/dev:latest`
//! is built first if it is missing or stale (`image::ensure_dev_image`). Two specs are timed: the plain
//! one (`SandboxSpec::default()`) and a full one ([`full_spec`]: an environment variable, a secret with its
//! placeholder variable, a label, and limits of its own). A warm-up of every kind, then `BENCH_ROUNDS`
//! (default 5) rounds, the kinds interleaved (their order rotates from round to round), in phases:
//!
//! - **cold**: each sandbox on a runtime built just before (untimed) on a fresh data directory: the first
//!   sandbox of a fresh runtime, whose gateway holder is still starting in the background.
//! - **idle**: one long-lived runtime with no other sandbox: its holder is up but serves nobody (it stays
//!   up between sandboxes), as for every sandbox of a one-at-a-time user.
//! - **warm**: a long-lived sandbox runs next to the one timed.
//!
//! Each round also runs `docker run --rm --pull never agenthold/dev:latest true` (the CLI, as an operator
//! would) and, in the idle and warm phases, the same through the engine API (bollard create + start + wait
//! + remove), the reference.
//!
//! Where the time goes comes from outside the sandbox crate: the engine's event stream (`docker events`,
//! nanosecond timestamps on the host clock) shows when each object was made, and timestamps around the
//! public calls close the timeline. Every sandbox is removed, and at the end nothing with a run's
//! instance label may be left (containers, networks, volumes, host nftables table, `DOCKER-USER` rules).
//!
//! Another part times single engine steps through bollard alone (no agenthold code): creating and
//! removing an internal network like an agent's, and starting the same container on the default bridge,
//! on such a user-defined network, and with no network, to say what of a sandbox start is Docker's own.
//!
//! The last part starts a runtime with `warm_pool(1)` (`sandbox.warm_pool`) once the first is shut down:
//! each round waits, untimed, until a sandbox is ready, then times `create_sandbox` + first exec (the
//! hand-out) for both specs, next to `docker run --rm` of the same round.
//!
//! `BENCH_ROUNDS`, `BENCH_JSON` (default `target/bench-sandbox-start.json`),
//! `BENCH_ONLY=cold,idle,warm,engine,pool`.
// A benchmark's output is its table on stdout.
#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agenthold_benches::docker_events::{self, Event, Recorder, Timeline};
use agenthold_benches::harness;
use agenthold_benches::report::median;
use agenthold_benches::table::{num, render};
use agenthold_core::{AgentId, SandboxSpec};
use agenthold_sandbox::Runtime;
use agenthold_sandbox::docker::engine::{LABEL_INSTANCE, LABEL_ROLE};
use agenthold_sandbox::docker::image::{DEV_IMAGE, DevImageOptions, ensure_dev_image};
use agenthold_sandbox::docker::network::AgentNetwork;
use anyhow::{Context, Result, bail};
use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, Ipam, IpamConfig, NetworkCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, ListNetworksOptionsBuilder,
    ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder, StartContainerOptions, WaitContainerOptions,
};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// The target: create-to-first-exec ≤ 1.0 × `docker run --rm … true`.
const TARGET_RATIO: f64 = 1.0;
/// The target for a warm-pool hand-out: ≤ 0.15 × `docker run --rm … true`.
const TARGET_POOL: f64 = 0.15;
/// Prefix of the reference containers' names (for the event timeline and the leak check).
const REFERENCE_PREFIX: &str = "ahbench-start";

/// What is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    /// `docker run --rm --pull never agenthold/dev:latest true` (the CLI).
    DockerRun,
    /// The same through the engine API: create, start, wait, remove.
    DockerApi,
    /// `create_sandbox` + first `exec(["true"])`.
    Sandbox,
    /// The same with [`full_spec`]: environment, a secret with its placeholder variable, labels, limits.
    SandboxFull,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::DockerRun, Kind::DockerApi, Kind::Sandbox, Kind::SandboxFull];
    /// The sandbox kinds, plain spec first.
    const OURS: [Kind; 2] = [Kind::Sandbox, Kind::SandboxFull];

    fn label(self) -> &'static str {
        match self {
            Kind::DockerRun => "docker run --rm IMAGE true (CLI)",
            Kind::DockerApi => "engine API: create + start + wait + remove",
            Kind::Sandbox => "create_sandbox(plain) + first exec([\"true\"])",
            Kind::SandboxFull => "create_sandbox(full spec) + first exec",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Kind::DockerRun => "docker_run_cli",
            Kind::DockerApi => "docker_api",
            Kind::Sandbox => "sandbox",
            Kind::SandboxFull => "sandbox_full_spec",
        }
    }

    fn is_ours(self) -> bool {
        Kind::OURS.contains(&self)
    }

    /// The spec a sandbox kind creates.
    fn spec(self) -> Result<SandboxSpec> {
        if self == Kind::SandboxFull {
            full_spec()
        } else {
            Ok(SandboxSpec::default())
        }
    }
}

/// A spec that is not plain: an environment variable, a secret whose placeholder is in `API_KEY` (injected
/// for a host the bench never calls), a label, and limits of its own (all three).
fn full_spec() -> Result<SandboxSpec> {
    let rule = agenthold_core::SecretRule::header(&["api.bench.test"], "authorization", "Bearer {{.Value}}")?;
    let secret = agenthold_core::secret::SecretSpec::new(
        "bench-key",
        "sk-bench-not-a-real-key".into(),
        Some("API_KEY"),
        vec![rule],
    )?;
    Ok(SandboxSpec {
        env: [("GREETING".to_owned(), "hello".to_owned())].into(),
        secrets: vec![secret],
        labels: [("team".to_owned(), "bench".to_owned())].into(),
        cpus: Some(1.0),
        memory_bytes: Some(512 * 1024 * 1024),
        pids: Some(256),
        ..SandboxSpec::default()
    })
}

/// One timed start.
#[derive(Debug, Clone)]
struct Sample {
    kind: Kind,
    /// The timed part (for a sandbox: call to first exec's return).
    total: Duration,
    /// Instants from the call on; the engine events are added at the end of the run.
    timeline: Timeline,
    /// For a sandbox: its agent, the second exec and the remove.
    agent: Option<AgentId>,
    second_exec: Option<Duration>,
    remove: Option<Duration>,
    /// Reference containers: the name they were created with.
    name: Option<String>,
    /// The window of engine events that belong to this sample.
    window: (i64, i64),
    /// The instance label of the runtime that made it, when not the main runtime's.
    instance: Option<String>,
}

/// Samples of one phase (cold or warm), per kind.
#[derive(Debug, Default)]
struct Phase {
    samples: Vec<Sample>,
}

impl Phase {
    /// Keep `sample`, and say it on stderr as the run goes.
    fn record(&mut self, sample: Sample) {
        eprintln!(
            "  {:<44} {:>7.1} ms",
            sample.kind.label(),
            sample.total.as_secs_f64() * 1e3
        );
        self.samples.push(sample);
    }

    fn of(&self, kind: Kind) -> impl Iterator<Item = &Sample> {
        self.samples.iter().filter(move |s| s.kind == kind)
    }

    fn totals_ms(&self, kind: Kind) -> Vec<f64> {
        self.of(kind).map(|s| s.total.as_secs_f64() * 1e3).collect()
    }

    /// Median over rounds of (plain sandbox / `base`) of the same round.
    fn ratio(&self, base: Kind) -> Option<f64> {
        self.ratio_of(Kind::Sandbox, base)
    }

    /// Median over rounds of (`ours` / `base`) of the same round.
    fn ratio_of(&self, ours: Kind, base: Kind) -> Option<f64> {
        let ours = self.totals_ms(ours);
        let theirs = self.totals_ms(base);
        if ours.len() != theirs.len() || ours.is_empty() {
            return Some(median(&ours)? / median(&theirs)?);
        }
        median(&ours.iter().zip(&theirs).map(|(a, b)| a / b).collect::<Vec<_>>())
    }
}

fn main() -> ExitCode {
    harness::main("sandbox_start", run)
}

struct Settings {
    rounds: usize,
    only: Option<Vec<String>>,
}

impl Settings {
    fn wants(&self, key: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|k| k == key))
    }
}

fn run() -> Result<()> {
    let var = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
    let settings = Settings {
        rounds: var("BENCH_ROUNDS")
            .map_or(Ok(5), |v| v.parse())
            .context("BENCH_ROUNDS")?
            .max(1),
        only: var("BENCH_ONLY").map(|v| v.split(',').map(|s| s.trim().to_owned()).collect()),
    };
    harness::init_tracing();
    harness::runtime("bench", 2)?.block_on(bench(&settings))
}

async fn bench(settings: &Settings) -> Result<()> {
    let docker = Docker::connect_with_local_defaults()
        .context("docker socket")?
        .negotiate_version()
        .await
        .context("docker engine (is dockerd running?)")?;
    let started = Instant::now();
    // The integration tests' work directory: its lock file serialises a build with theirs.
    let work = std::env::temp_dir().join("agenthold-image-tests");
    let image = ensure_dev_image(&docker, &work, &DevImageOptions::default()).await?;
    eprintln!(
        "bench sandbox_start: {} ({}) ready in {:.1?}",
        image.name,
        &image.id[..19.min(image.id.len())],
        started.elapsed()
    );

    let data_dir = tempfile::tempdir().context("data directory")?;
    let built = Instant::now();
    let runtime = Runtime::builder().data_dir(data_dir.path()).build().await?;
    let build_time = built.elapsed();
    let recorder = Recorder::start(&docker).await;
    let mut made: Vec<AgentId> = Vec::new();
    let result = measure(settings, &runtime, &docker, &mut made).await;
    let fresh = if settings.wants("cold") && result.is_ok() {
        eprintln!(
            "bench sandbox_start: cold phase, a fresh runtime per sandbox ({} rounds) …",
            settings.rounds
        );
        Some(fresh_phase(settings.rounds, &runtime, &docker, &mut made).await)
    } else {
        None
    };
    let engine = if settings.wants("engine") {
        eprintln!("bench sandbox_start: engine steps ({} rounds) …", settings.rounds);
        let pool = runtime.config().sandbox.subnet_pool;
        Some(engine_steps(&docker, pool, settings.rounds).await)
    } else {
        None
    };
    // Whatever happened: remove what is left (the sandboxes the runtime still knows).
    for agent in runtime.sandboxes().await.unwrap_or_default() {
        if let Err(e) = runtime.remove(&agent).await {
            eprintln!("bench sandbox_start: removing {agent} failed: {e}");
        }
    }
    runtime.shutdown().await;
    // Let the last events arrive.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (mut idle, mut warm) = result?;
    let fresh = fresh.transpose()?;
    let (mut cold, mut leaks) = fresh.map_or_else(|| (Phase::default(), Vec::new()), |f| (f.phase, f.leaks));
    let engine = engine.transpose()?;
    let instance = instance_of(&recorder, &made).context("no event carried this run's instance label")?;
    for phase in [&mut cold, &mut idle, &mut warm] {
        for sample in &mut phase.samples {
            let own = sample.instance.clone().unwrap_or_else(|| instance.clone());
            add_events(sample, &recorder, &own);
        }
    }
    leaks.extend(leaks_after_shutdown(&docker, &instance, &made).await?);
    drop(runtime);
    let pooled = if settings.wants("pool") {
        eprintln!("bench sandbox_start: warm pool ({} rounds) …", settings.rounds);
        let pooled = pool_phase(settings.rounds, &docker).await?;
        leaks.extend(pooled.leaks.iter().cloned());
        Some(pooled)
    } else {
        None
    };

    println!();
    let no_pool = Phase::default();
    println!(
        "{}",
        summary_table(&cold, &idle, &warm, pooled.as_ref().map(|p| &p.phase), build_time)
    );
    for (name, phase) in [
        ("cold (a fresh runtime's first sandbox)", &cold),
        ("idle (no other sandbox; the holder idle but up)", &idle),
        ("warm (another sandbox running)", &warm),
        (
            "warm pool (1): hand-out",
            pooled.as_ref().map_or(&no_pool, |p| &p.phase),
        ),
    ] {
        for kind in Kind::OURS {
            if phase.of(kind).next().is_none() {
                continue;
            }
            println!(
                "where the time goes, {name}, {}: median ms per phase",
                kind.label()
            );
            println!("{}", phase_table(phase, kind));
        }
    }
    let reference = if idle.samples.is_empty() { &warm } else { &idle };
    println!("where the time goes, docker run --rm (CLI), median ms per phase");
    println!("{}", phase_table(reference, Kind::DockerRun));
    if let Some(engine) = &engine {
        println!("engine steps alone (bollard, no agenthold code), median ms");
        println!("{}", engine_table(engine));
    }
    println!("engine events recorded: {}", recorder.len());
    if leaks.is_empty() {
        println!(
            "left behind: nothing (containers, networks, volumes with instance label {instance}, host table, DOCKER-USER rules)"
        );
    } else {
        println!("LEFT BEHIND: {}", leaks.join("; "));
    }
    let noisy = harness::noisy_starts();
    if noisy > 0 {
        println!(
            "{noisy} starts began while other work kept >= {} CPUs busy: expect noise",
            harness::QUIET_BELOW
        );
    }

    let json = json!({
        "settings": {
            "cpus": std::thread::available_parallelism().map(usize::from).ok(),
            "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_owned()),
            "rounds": settings.rounds,
            "image": image.name,
            "image_id": image.id,
            "docker": docker.version().await.ok().and_then(|v| v.version),
            "runtime_build_ms": build_time.as_secs_f64() * 1e3,
            "instance": instance,
            "starts_on_busy_machine": noisy,
            "left_behind": leaks,
        },
        "engine_steps_ms": engine.as_ref().map(|e| e.iter().map(|(k, v)| (k.clone(), json!({"median": median(v), "runs": v}))).collect::<serde_json::Map<_, _>>()),
        "cold": phase_json(&cold),
        "idle": phase_json(&idle),
        "warm": phase_json(&warm),
        "warm_pool": pooled.as_ref().map(|p| phase_json(&p.phase)),
        "target_ratio": TARGET_RATIO,
        "target_ratio_warm_pool": TARGET_POOL,
    });
    let path = std::env::var_os("BENCH_JSON").map_or_else(
        || harness::target_dir().join("bench-sandbox-start.json"),
        PathBuf::from,
    );
    std::fs::write(&path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("write {}", path.display()))?;
    println!("written: {}", path.display());
    if !leaks.is_empty() {
        bail!("objects left behind: {}", leaks.join("; "));
    }
    Ok(())
}

/// The warm-pool part: its samples and what its runtime left behind.
struct PoolPhase {
    phase: Phase,
    leaks: Vec<String>,
}

/// How long a round waits for the pool to refill before giving up.
const POOL_PATIENCE: Duration = Duration::from_secs(120);

/// A runtime with `warm_pool(1)` on its own data directory: per round, once a sandbox is ready, the
/// hand-out (`create_sandbox` + first exec) and `docker run --rm`, in rotating order.
async fn pool_phase(rounds: usize, docker: &Docker) -> Result<PoolPhase> {
    let data_dir = tempfile::tempdir().context("data directory")?;
    let instance = agenthold_sandbox::docker::engine::instance_label(data_dir.path());
    let runtime = Runtime::builder()
        .data_dir(data_dir.path())
        .warm_pool(1)
        .build()
        .await?;
    let mut phase = Phase::default();
    let mut made = Vec::new();
    // Numbered apart from the first part's reference containers.
    let mut counter = 1_000_000usize;
    let outcome = async {
        for round in 0..=rounds {
            let kinds = [Kind::Sandbox, Kind::SandboxFull, Kind::DockerRun];
            for k in 0..kinds.len() {
                let kind = kinds[(round + k) % kinds.len()];
                let waited = Instant::now();
                while runtime.warm_pool_ready() == 0 {
                    if waited.elapsed() > POOL_PATIENCE {
                        bail!("the warm pool did not refill in {POOL_PATIENCE:?}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                harness::settle("sandbox_start");
                let sample = one(kind, &runtime, docker, &mut counter, &mut made).await?;
                // Round 0 is the warm-up.
                if round > 0 {
                    phase.record(sample);
                }
            }
        }
        Ok(())
    }
    .await;
    for agent in runtime.sandboxes().await.unwrap_or_default() {
        if let Err(e) = runtime.remove(&agent).await {
            eprintln!("bench sandbox_start: removing {agent} failed: {e}");
        }
    }
    runtime.shutdown().await;
    outcome?;
    let leaks = leaks_after_shutdown(docker, &instance, &made).await?;
    Ok(PoolPhase { phase, leaks })
}

/// The cold part: per round (the first a warm-up), `docker run --rm` and, each on a runtime built just
/// before on its own data directory (untimed), a plain and a full-spec sandbox: the first sandbox of a
/// fresh runtime, whose holder is starting in the background since the build. Each runtime is shut down
/// after its sample; what it left is collected.
async fn fresh_phase(
    rounds: usize,
    main: &Runtime,
    docker: &Docker,
    made: &mut Vec<AgentId>,
) -> Result<PoolPhase> {
    let mut phase = Phase::default();
    let mut leaks_found = Vec::new();
    let mut counter = 2_000_000usize;
    for round in 0..=rounds {
        let kinds = [Kind::DockerRun, Kind::Sandbox, Kind::SandboxFull];
        for k in 0..kinds.len() {
            let kind = kinds[(round + k) % kinds.len()];
            let sample = if kind.is_ours() {
                let data_dir = tempfile::tempdir().context("data directory")?;
                let instance = agenthold_sandbox::docker::engine::instance_label(data_dir.path());
                let runtime = Runtime::builder().data_dir(data_dir.path()).build().await?;
                let mut own = Vec::new();
                harness::settle("sandbox_start");
                let sample = one(kind, &runtime, docker, &mut counter, &mut own).await;
                for agent in runtime.sandboxes().await.unwrap_or_default() {
                    let _ = runtime.remove(&agent).await;
                }
                runtime.shutdown().await;
                leaks_found.extend(leaks_after_shutdown(docker, &instance, &own).await?);
                made.extend(own);
                let mut sample = sample?;
                sample.instance = Some(instance);
                sample
            } else {
                harness::settle("sandbox_start");
                one(kind, main, docker, &mut counter, made).await?
            };
            // Round 0 is the warm-up.
            if round > 0 {
                phase.record(sample);
            }
        }
    }
    Ok(PoolPhase {
        phase,
        leaks: leaks_found,
    })
}

/// [`leaks`] once the runtime's shutdown had time to remove its idle gateway holder (it goes in the
/// background, at most a few seconds).
async fn leaks_after_shutdown(docker: &Docker, instance: &str, made: &[AgentId]) -> Result<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = leaks(docker, instance, made).await?;
        if left.is_empty() || Instant::now() > deadline {
            return Ok(left);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Warm-up, then the cold and warm phases.
async fn measure(
    settings: &Settings,
    runtime: &Runtime,
    docker: &Docker,
    made: &mut Vec<AgentId>,
) -> Result<(Phase, Phase)> {
    let mut counter = 0usize;
    eprintln!("bench sandbox_start: warm-up …");
    for kind in Kind::ALL {
        one(kind, runtime, docker, &mut counter, made).await?;
    }
    let mut idle = Phase::default();
    if settings.wants("idle") {
        eprintln!("bench sandbox_start: idle phase ({} rounds) …", settings.rounds);
        rounds(settings.rounds, &mut idle, runtime, docker, &mut counter, made).await?;
    }
    let mut warm = Phase::default();
    if settings.wants("warm") {
        eprintln!("bench sandbox_start: warm phase ({} rounds) …", settings.rounds);
        let keeper = runtime
            .create_sandbox(SandboxSpec::default())
            .await
            .context("create the sandbox that keeps the holder up")?;
        made.push(keeper.clone());
        let measured = rounds(settings.rounds, &mut warm, runtime, docker, &mut counter, made).await;
        runtime
            .remove(&keeper)
            .await
            .context("remove the keeper sandbox")?;
        measured?;
    }
    Ok((idle, warm))
}

async fn rounds(
    count: usize,
    phase: &mut Phase,
    runtime: &Runtime,
    docker: &Docker,
    counter: &mut usize,
    made: &mut Vec<AgentId>,
) -> Result<()> {
    for round in 0..count {
        // Rotate the order so no kind always follows another.
        for k in 0..Kind::ALL.len() {
            let kind = Kind::ALL[(round + k) % Kind::ALL.len()];
            harness::settle("sandbox_start");
            phase.record(one(kind, runtime, docker, counter, made).await?);
        }
    }
    Ok(())
}

/// Times one start of `kind` (and cleans up after it).
async fn one(
    kind: Kind,
    runtime: &Runtime,
    docker: &Docker,
    counter: &mut usize,
    made: &mut Vec<AgentId>,
) -> Result<Sample> {
    *counter += 1;
    let name = format!("{REFERENCE_PREFIX}-{}-{counter}", std::process::id());
    let mut timeline = Timeline::default();
    let t0 = docker_events::now();
    let clock = Instant::now();
    timeline.mark("call", t0);
    let mut sample = Sample {
        kind,
        total: Duration::ZERO,
        timeline: Timeline::default(),
        agent: None,
        second_exec: None,
        remove: None,
        name: None,
        window: (t0, t0),
        instance: None,
    };
    match kind {
        Kind::DockerRun => {
            let out = tokio::process::Command::new("docker")
                .args([
                    "run", "--rm", "--pull", "never", "--name", &name, DEV_IMAGE, "true",
                ])
                .output()
                .await
                .context("run the docker CLI")?;
            sample.total = clock.elapsed();
            if !out.status.success() {
                bail!(
                    "docker run failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            timeline.mark("docker run returns", docker_events::now());
            sample.name = Some(name);
        }
        Kind::DockerApi => {
            let options = CreateContainerOptionsBuilder::default().name(&name).build();
            let body = ContainerCreateBody {
                image: Some(DEV_IMAGE.to_owned()),
                cmd: Some(vec!["true".to_owned()]),
                ..Default::default()
            };
            docker.create_container(Some(options), body).await?;
            let outcome = async {
                docker
                    .start_container(&name, None::<StartContainerOptions>)
                    .await?;
                let mut wait = docker.wait_container(&name, None::<WaitContainerOptions>);
                while let Some(status) = wait.next().await {
                    let status = status?;
                    if status.status_code != 0 {
                        bail!("`true` exited {}", status.status_code);
                    }
                }
                Ok(())
            }
            .await;
            let remove = RemoveContainerOptionsBuilder::default().force(true).build();
            docker.remove_container(&name, Some(remove)).await?;
            sample.total = clock.elapsed();
            outcome?;
            timeline.mark("remove returns", docker_events::now());
            sample.name = Some(name);
        }
        Kind::Sandbox | Kind::SandboxFull => {
            let agent = runtime.create_sandbox(kind.spec()?).await?;
            made.push(agent.clone());
            timeline.mark("create_sandbox returns", docker_events::now());
            let out = runtime.exec(&agent, &["true"]).await?;
            sample.total = clock.elapsed();
            timeline.mark("first exec returns", docker_events::now());
            if out.exit_code != 0 {
                bail!(
                    "`true` in the sandbox exited {}: {}",
                    out.exit_code,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let second = Instant::now();
            runtime.exec(&agent, &["true"]).await?;
            sample.second_exec = Some(second.elapsed());
            let removing = Instant::now();
            runtime.remove(&agent).await?;
            sample.remove = Some(removing.elapsed());
            sample.agent = Some(agent);
        }
    }
    sample.window = (t0, docker_events::now());
    sample.timeline = timeline;
    Ok(sample)
}

/// The instance label of this runtime, read from the events of a sandbox it made.
fn instance_of(recorder: &Recorder, made: &[AgentId]) -> Option<String> {
    let names: Vec<String> = made.iter().map(|a| format!("agenthold-{a}")).collect();
    recorder
        .between(0, i64::MAX)
        .into_iter()
        .filter(|e| e.kind == "container" && names.iter().any(|n| n == e.name()))
        .find_map(|e| e.attributes.get(LABEL_INSTANCE).cloned())
}

/// Adds the engine events of `sample` to its timeline (only the ones that belong to it).
fn add_events(sample: &mut Sample, recorder: &Recorder, instance: &str) {
    let (from, to) = sample.window;
    let events = recorder.between(from, to);
    let end = sample
        .timeline
        .marks
        .iter()
        .map(|(_, at)| *at)
        .max()
        .unwrap_or(to);
    // Only what happened up to the end of the timed part.
    let events: Vec<Event> = events.into_iter().filter(|e| e.at <= end).collect();
    let t = &mut sample.timeline;
    match (sample.kind, &sample.agent, &sample.name) {
        (Kind::Sandbox | Kind::SandboxFull, Some(agent), _) => {
            let own = format!("agenthold-{agent}");
            let is_holder = |e: &Event| {
                e.kind == "container"
                    && e.attributes.get(LABEL_ROLE).map(String::as_str) == Some("gateway")
                    && e.attributes.get(LABEL_INSTANCE).map(String::as_str) == Some(instance)
            };
            t.mark_first("network created", &events, |e| {
                e.is("network", "create") && e.name() == own
            });
            t.mark_first("holder container created", &events, |e| {
                is_holder(e) && e.is("container", "create")
            });
            t.mark_first("holder container started", &events, |e| {
                is_holder(e) && e.is("container", "start")
            });
            // The holder and the sandbox join with the runtime's own veth pairs: no engine event.
            t.mark_first("volume created", &events, |e| {
                e.is("volume", "create") && e.id == own
            });
            t.mark_first("container created", &events, |e| {
                e.is("container", "create") && e.name() == own
            });
            t.mark_first("container started", &events, |e| {
                e.is("container", "start") && e.name() == own
            });
            t.mark_first("exec created", &events, |e| {
                e.is("container", "exec_create") && e.name() == own
            });
            t.mark_first("exec started", &events, |e| {
                e.is("container", "exec_start") && e.name() == own
            });
            t.mark_first("exec process exited", &events, |e| {
                e.is("container", "exec_die") && e.name() == own
            });
        }
        (_, _, Some(name)) => {
            let id = events
                .iter()
                .find(|e| e.is("container", "create") && e.name() == name)
                .map(|e| e.id.clone())
                .unwrap_or_default();
            let own = |e: &Event| e.kind == "container" && e.name() == name;
            t.mark_first("container created", &events, |e| {
                own(e) && e.is("container", "create")
            });
            t.mark_first("network connected", &events, |e| {
                e.is("network", "connect") && e.attributes.get("container") == Some(&id)
            });
            t.mark_first("container started", &events, |e| {
                own(e) && e.is("container", "start")
            });
            t.mark_first("container died", &events, |e| own(e) && e.is("container", "die"));
            t.mark_first("network disconnected", &events, |e| {
                e.is("network", "disconnect") && e.attributes.get("container") == Some(&id)
            });
            t.mark_first("container destroyed", &events, |e| {
                own(e) && e.is("container", "destroy")
            });
        }
        _ => {}
    }
}

/// Everything of this run's instance still in the engine or the host firewall.
async fn leaks(docker: &Docker, instance: &str, made: &[AgentId]) -> Result<Vec<String>> {
    let label = HashMap::from([("label".to_owned(), vec![format!("{LABEL_INSTANCE}={instance}")])]);
    let mut left = Vec::new();
    let containers = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&label)
                .build(),
        ))
        .await?;
    left.extend(containers.iter().map(|c| format!("container {:?}", c.names)));
    let networks = docker
        .list_networks(Some(
            ListNetworksOptionsBuilder::default().filters(&label).build(),
        ))
        .await?;
    left.extend(networks.iter().map(|n| format!("network {:?}", n.name)));
    let volumes = docker
        .list_volumes(Some(ListVolumesOptionsBuilder::default().filters(&label).build()))
        .await?;
    left.extend(
        volumes
            .volumes
            .unwrap_or_default()
            .iter()
            .map(|v| format!("volume {}", v.name)),
    );
    let prefix = HashMap::from([("name".to_owned(), vec![REFERENCE_PREFIX.to_owned()])]);
    let reference = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&prefix)
                .build(),
        ))
        .await?;
    left.extend(
        reference
            .iter()
            .map(|c| format!("reference container {:?}", c.names)),
    );
    if agenthold_sandbox::docker::hostfw::host_table_exists(instance) {
        left.push(format!(
            "host nftables table {}",
            agenthold_sandbox::docker::hostfw::host_table(instance)
        ));
    }
    for agent in made {
        // The bridge name depends on the agent only.
        let net = AgentNetwork::for_agent(agent, "10.0.0.0/24".parse()?);
        if agenthold_sandbox::docker::hostfw::bridge_allowed(&net.bridge) {
            left.push(format!("DOCKER-USER rules for {}", net.bridge));
        }
    }
    Ok(left)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Milliseconds for a table cell, one decimal.
fn ms_cell(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

fn summary_table(
    cold: &Phase,
    idle: &Phase,
    warm: &Phase,
    pooled: Option<&Phase>,
    build_time: Duration,
) -> String {
    let mut rows = Vec::new();
    let none = Phase::default();
    for (name, phase, target) in [
        ("cold: a fresh runtime's first sandbox", cold, TARGET_RATIO),
        ("idle: no other sandbox (holder up)", idle, TARGET_RATIO),
        ("warm: another sandbox running", warm, TARGET_RATIO),
        ("warm pool (1): hand-out", pooled.unwrap_or(&none), TARGET_POOL),
    ] {
        for kind in Kind::OURS {
            if phase.of(kind).next().is_none() {
                continue;
            }
            let ratio = phase.ratio_of(kind, Kind::DockerRun);
            let verdict = match ratio {
                Some(r) if r <= target => format!("<= {target} ok"),
                Some(_) => format!("<= {target} MISSED"),
                None => "-".to_owned(),
            };
            let extra = |f: fn(&Sample) -> Option<Duration>| {
                median(&phase.of(kind).filter_map(f).map(ms).collect::<Vec<_>>())
            };
            let spec = if kind == Kind::Sandbox { "plain" } else { "full" };
            rows.push(vec![
                name.to_owned(),
                spec.to_owned(),
                ms_cell(median(&phase.totals_ms(Kind::DockerRun))),
                ms_cell(median(&phase.totals_ms(Kind::DockerApi))),
                ms_cell(median(&phase.totals_ms(kind))),
                num(ratio),
                num(phase.ratio_of(kind, Kind::DockerApi)),
                verdict,
                ms_cell(extra(|s| s.second_exec)),
                ms_cell(extra(|s| s.remove)),
                format!("{}", phase.of(kind).count()),
            ]);
        }
    }
    let mut out = render(
        &[
            "phase",
            "spec",
            "docker run --rm (CLI) ms",
            "engine API create+start+wait+rm ms",
            "create_sandbox + 1st exec ms",
            "ours/docker run",
            "ours/API",
            "target",
            "2nd exec ms",
            "remove ms",
            "rounds",
        ],
        &rows,
        &[2, 3, 4, 5, 6, 8, 9, 10],
    );
    out.push_str(&format!(
        "  medians; ratios are medians of per-round ratios; the main Runtime::build took {:.0} ms (not counted; \
         the cold phase builds one per sandbox, untimed)\n",
        ms(build_time)
    ));
    out
}

/// Median duration per phase (named by the instant that ends it), in the order they happen.
fn phase_stats(phase: &Phase, kind: Kind) -> Vec<(String, f64, f64, usize)> {
    let mut durations: HashMap<String, Vec<f64>> = HashMap::new();
    let mut offsets: HashMap<String, Vec<f64>> = HashMap::new();
    for sample in phase.of(kind) {
        let start = sample.timeline.marks.iter().map(|(_, at)| *at).min().unwrap_or(0);
        for (name, d) in sample.timeline.phases() {
            durations.entry(name.clone()).or_default().push(ms(d));
        }
        for (name, at) in &sample.timeline.marks {
            offsets
                .entry(name.clone())
                .or_default()
                .push(ms(docker_events::nanos(at - start)));
        }
    }
    let mut stats: Vec<(String, f64, f64, usize)> = durations
        .into_iter()
        .map(|(name, d)| {
            let at = median(offsets.get(&name).map_or(&[][..], Vec::as_slice)).unwrap_or(0.0);
            let n = d.len();
            (name, median(&d).unwrap_or(0.0), at, n)
        })
        .collect();
    stats.sort_by(|a, b| a.2.total_cmp(&b.2));
    stats
}

/// What each phase covers (the calls between the instant before it and the one that ends it), from the code.
fn covers(kind: Kind, name: &str) -> &'static str {
    if !kind.is_ours() {
        return match name {
            "container created" => "CLI start, create request",
            "network connected" => "bridge endpoint allocated",
            "container started" => "start (veth, iptables, runc)",
            "container died" => "`true` runs",
            "network disconnected" | "container destroyed" => "--rm: endpoint removed, container removed",
            "docker run returns" | "remove returns" => "the client sees the removal",
            _ => "",
        };
    }
    match name {
        "network created" => {
            "beside the volume, container and start: require_image, list networks (at most every 10 s), \
             inspect + create network"
        }
        "holder container created" => {
            "record saved; iptables DOCKER-USER (4 calls), nft host table; holder inspect + create"
        }
        "holder container started" => "holder start",
        "volume created" => {
            "inspect + create volume (beside it: the network, then record, nft host set, holder veth pair, \
             nft set elements, listeners)"
        }
        "container created" => "create container",
        "container started" => {
            "boot token written on the host (before the create); start container on network none (runc)"
        }
        "create_sandbox returns" => {
            "start request returns; gateway side done; plug: inspect, veth pair and address (2 `ip` runs)"
        }
        "exec created" => "create exec",
        "exec started" => "start exec (attach)",
        "exec process exited" => "sandboxd run -- true (runc exec)",
        "first exec returns" => {
            "output drained, inspect exec (a hand-out: the command given to the run started ahead, no engine exec)"
        }
        _ => "",
    }
}

fn phase_table(phase: &Phase, kind: Kind) -> String {
    let stats = phase_stats(phase, kind);
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|(name, d, at, n)| {
            vec![
                format!("… {name}"),
                format!("{d:.1}"),
                format!("{at:.1}"),
                n.to_string(),
                covers(kind, name).to_owned(),
            ]
        })
        .collect();
    render(
        &["phase ends when", "median ms", "at ms", "n", "covers"],
        &rows,
        &[1, 2, 3],
    )
}

fn phase_json(phase: &Phase) -> Value {
    let mut kinds = serde_json::Map::new();
    for kind in Kind::ALL {
        let samples: Vec<Value> = phase
            .of(kind)
            .map(|s| {
                json!({
                    "total_ms": ms(s.total),
                    "second_exec_ms": s.second_exec.map(ms),
                    "remove_ms": s.remove.map(ms),
                    "phases_ms": s.timeline.phases().into_iter().map(|(n, d)| json!([n, ms(d)])).collect::<Vec<_>>(),
                })
            })
            .collect();
        if samples.is_empty() {
            continue;
        }
        kinds.insert(
            kind.key().to_owned(),
            json!({
                "label": kind.label(),
                "median_ms": median(&phase.totals_ms(kind)),
                "samples": samples,
                "phases_median_ms": phase_stats(phase, kind).into_iter().map(|(n, d, at, count)| json!({"ends_when": n, "median_ms": d, "at_ms": at, "n": count})).collect::<Vec<_>>(),
            }),
        );
    }
    json!({
        "kinds": kinds,
        "ratio_sandbox_vs_docker_run": phase.ratio(Kind::DockerRun),
        "ratio_sandbox_vs_docker_api": phase.ratio(Kind::DockerApi),
        "ratio_full_spec_vs_docker_run": phase.ratio_of(Kind::SandboxFull, Kind::DockerRun),
        "ratio_full_spec_vs_docker_api": phase.ratio_of(Kind::SandboxFull, Kind::DockerApi),
    })
}

/// Engine steps alone, through bollard: `(step, every run in ms)`, in table order.
type EngineSteps = Vec<(String, Vec<f64>)>;

const STEP_NET_CREATE: &str = "create an internal network (inhibit_ipv4, bridge name, .2 gateway)";
const STEP_NET_REMOVE: &str = "remove that network";
const STEP_START_BRIDGE: &str = "start a container on the default bridge";
const STEP_START_USER: &str = "start a container on that internal user-defined network";
const STEP_START_NONE: &str = "start a container with network none";

/// Times network create/remove and container starts on three kinds of network, `rounds` times,
/// interleaved; removes everything it made (reference names, see [`REFERENCE_PREFIX`]).
async fn engine_steps(docker: &Docker, pool: ipnet::Ipv4Net, rounds: usize) -> Result<EngineSteps> {
    let mut steps: EngineSteps = [
        STEP_NET_CREATE,
        STEP_NET_REMOVE,
        STEP_START_BRIDGE,
        STEP_START_USER,
        STEP_START_NONE,
    ]
    .iter()
    .map(|s| ((*s).to_owned(), Vec::new()))
    .collect();
    let push = |steps: &mut EngineSteps, name: &str, d: Duration| {
        if let Some((_, runs)) = steps.iter_mut().find(|(n, _)| n == name) {
            runs.push(ms(d));
        }
    };
    let pid = std::process::id();
    for round in 0..rounds {
        let subnet = agenthold_sandbox::docker::network::allocate_subnet(
            docker,
            pool,
            agenthold_core::config::DEFAULT_SUBNET_PREFIX,
            &Default::default(),
        )
        .await?;
        let network = format!("{REFERENCE_PREFIX}-net-{pid}-{round}");
        let gateway = agenthold_egress::datapath::gateway_addr(subnet);
        let request = NetworkCreateRequest {
            name: network.clone(),
            driver: Some("bridge".to_owned()),
            internal: Some(true),
            ipam: Some(Ipam {
                driver: Some("default".to_owned()),
                config: Some(vec![IpamConfig {
                    subnet: Some(subnet.to_string()),
                    gateway: Some(gateway.to_string()),
                    ..Default::default()
                }]),
                options: None,
            }),
            options: Some(HashMap::from([
                (
                    "com.docker.network.bridge.name".to_owned(),
                    format!("ahb{:x}", (pid << 4) ^ round as u32),
                ),
                (
                    "com.docker.network.bridge.inhibit_ipv4".to_owned(),
                    "true".to_owned(),
                ),
            ])),
            ..Default::default()
        };
        harness::settle("sandbox_start");
        let clock = Instant::now();
        docker
            .create_network(request)
            .await
            .context("create the experiment's network")?;
        push(&mut steps, STEP_NET_CREATE, clock.elapsed());
        let starts = async {
            let modes = [
                (STEP_START_BRIDGE, "bridge"),
                (STEP_START_USER, network.as_str()),
                (STEP_START_NONE, "none"),
            ];
            for k in 0..modes.len() {
                let (step, mode) = modes[(round + k) % modes.len()];
                let name = format!("{REFERENCE_PREFIX}-{pid}-{round}-{k}");
                let body = ContainerCreateBody {
                    image: Some(DEV_IMAGE.to_owned()),
                    cmd: Some(vec!["true".to_owned()]),
                    host_config: Some(HostConfig {
                        network_mode: Some(mode.to_owned()),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                docker
                    .create_container(
                        Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                        body,
                    )
                    .await?;
                harness::settle("sandbox_start");
                let clock = Instant::now();
                let started = docker.start_container(&name, None::<StartContainerOptions>).await;
                let took = clock.elapsed();
                let mut wait = docker.wait_container(&name, None::<WaitContainerOptions>);
                while wait.next().await.is_some() {}
                let remove = RemoveContainerOptionsBuilder::default().force(true).build();
                docker.remove_container(&name, Some(remove)).await?;
                started?;
                push(&mut steps, step, took);
            }
            anyhow::Ok(())
        }
        .await;
        let clock = Instant::now();
        let removed = docker.remove_network(&network).await;
        push(&mut steps, STEP_NET_REMOVE, clock.elapsed());
        starts?;
        removed?;
    }
    Ok(steps)
}

fn engine_table(steps: &EngineSteps) -> String {
    let rows: Vec<Vec<String>> = steps
        .iter()
        .map(|(name, runs)| vec![name.clone(), ms_cell(median(runs)), runs.len().to_string()])
        .collect();
    render(&["engine step (bollard)", "median ms", "n"], &rows, &[1, 2])
}
