//! Crash test: a child process (`crash_child`, this test binary run again) writes and acknowledges;
//! the parent kills it with SIGKILL at a random moment, reopens the store and checks that every
//! acknowledged record is present and intact, deleted ones absent, and the write in flight all or nothing.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{Opener, block_on, del, open_redb, put};

/// Set in the child's environment: `<backend>\t<seed>\t<round>\t<data dir>`.
const CHILD_ENV: &str = "AGENTHOLD_TEST_STORE_CRASH_CHILD";
/// Optional: the parent's random seed, to replay a failing run's choices.
const SEED_ENV: &str = "AGENTHOLD_TEST_STORE_CRASH_SEED";
/// Rounds (one child killed per round) on one store, per backend.
const ROUNDS: u32 = 100;
/// Rounds that kill a child while it creates a new store, per backend.
const CREATION_ROUNDS: u32 = 30;
/// The tables the child writes to (batches span both).
const TABLES: [&str; 2] = ["alpha", "beta-2"];
/// The child stops by itself after this long (so that it never outlives a failed parent).
const CHILD_MAX_SECONDS: u64 = 20;

/// splitmix64: a small deterministic generator, enough to vary delays and operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The value of `key` in `table` at `version`: version, a payload derived from (table, key, version)
/// of 0 to ~6 KiB (so that values span pages), and a checksum of all that.
fn crash_value(table: &str, key: &str, version: u32) -> Vec<u8> {
    let seed = fnv1a(&[table.as_bytes(), key.as_bytes(), &version.to_le_bytes()]);
    let mut rng = Rng(seed);
    let len = if seed.is_multiple_of(4) {
        rng.below(6000)
    } else {
        rng.below(400)
    } as usize;
    let mut value = version.to_le_bytes().to_vec();
    value.extend((0..len).map(|_| rng.next() as u8));
    let sum = fnv1a(&[table.as_bytes(), key.as_bytes(), &value]);
    value.extend_from_slice(&sum.to_le_bytes());
    value
}

/// The version of an intact value, or what is wrong with it.
fn check_crash_value(table: &str, key: &str, value: &[u8]) -> Result<u32, String> {
    if value.len() < 12 {
        return Err(format!(
            "{table}/{key}: value of {} bytes is too short",
            value.len()
        ));
    }
    let (body, sum) = value.split_at(value.len() - 8);
    if fnv1a(&[table.as_bytes(), key.as_bytes(), body]).to_le_bytes() != sum {
        return Err(format!(
            "{table}/{key}: checksum mismatch (corrupted value of {} bytes)",
            value.len()
        ));
    }
    let version = u32::from_le_bytes(body[..4].try_into().unwrap());
    if crash_value(table, key, version) != value {
        return Err(format!(
            "{table}/{key}: value is not the one written for version {version}"
        ));
    }
    Ok(version)
}

/// The state of one record: `Some(version)` present, `None` deleted.
type Record = Option<u32>;

/// Every record the parent knows of: `(table, key)` to its state.
type Model = BTreeMap<(String, String), Record>;

/// One operation as the child announces it: `(table, key, state after)`.
type Change = (String, String, Record);

fn format_changes(changes: &[Change]) -> String {
    let items: Vec<String> = changes
        .iter()
        .map(|(t, k, state)| match state {
            Some(v) => format!("p:{t}:{k}:{v}"),
            None => format!("d:{t}:{k}"),
        })
        .collect();
    items.join(",")
}

fn parse_changes(spec: &str) -> Vec<Change> {
    spec.split(',')
        .map(|item| {
            let parts: Vec<&str> = item.split(':').collect();
            match parts.as_slice() {
                ["p", t, k, v] => ((*t).to_owned(), (*k).to_owned(), Some(v.parse().unwrap())),
                ["d", t, k] => ((*t).to_owned(), (*k).to_owned(), None),
                _ => panic!("bad change {item:?}"),
            }
        })
        .collect()
}

/// The child: write, announce, acknowledge, forever (until killed). Does nothing without `CHILD_ENV`.
// covers: C2
#[test]
fn crash_child() {
    let Some(spec) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let spec = spec.into_string().unwrap();
    let [backend, seed, round, dir] = spec.splitn(4, '\t').collect::<Vec<_>>()[..] else {
        panic!("bad {CHILD_ENV}: {spec:?}")
    };
    let open = opener(backend);
    let round: u32 = round.parse().unwrap();
    let mut rng = Rng(seed.parse().unwrap());
    let store = open(Path::new(dir)).unwrap();
    println!("CRASH open");
    let started = std::time::Instant::now();
    // Records of this round (the child never touches earlier rounds' keys): key -> (table, version).
    let mut live: Vec<(String, String, u32)> = Vec::new();
    let mut next_key = 0u32;
    let mut fresh = |rng: &mut Rng| {
        next_key += 1;
        let table = TABLES[rng.below(2) as usize].to_owned();
        (table, format!("r{round:03}-{next_key:06}"))
    };
    let mut seq = 0u64;
    while started.elapsed().as_secs() < CHILD_MAX_SECONDS {
        seq += 1;
        let pick = rng.below(10);
        let mut changes: Vec<Change> = Vec::new();
        if pick < 4 || live.is_empty() {
            let (t, k) = fresh(&mut rng);
            changes.push((t, k, Some(0)));
        } else if pick < 6 {
            let (t, k, v) = &live[rng.below(live.len() as u64) as usize];
            changes.push((t.clone(), k.clone(), Some(v + 1)));
        } else if pick < 8 {
            // A batch: fresh records in both tables, maybe an overwrite and a delete of live ones.
            for _ in 0..2 + rng.below(5) {
                let (t, k) = fresh(&mut rng);
                changes.push((t, k, Some(0)));
            }
            if live.len() >= 2 {
                let i = rng.below(live.len() as u64) as usize;
                let j = (i + 1 + rng.below(live.len() as u64 - 1) as usize) % live.len();
                let (t, k, v) = &live[i];
                changes.push((t.clone(), k.clone(), Some(v + 1)));
                let (t, k, _) = &live[j];
                changes.push((t.clone(), k.clone(), None));
            }
        } else {
            let (t, k, _) = &live[rng.below(live.len() as u64) as usize];
            changes.push((t.clone(), k.clone(), None));
        }
        println!("CRASH begin {seq} {}", format_changes(&changes));
        block_on(async {
            if let [(t, k, state)] = &changes[..] {
                match state {
                    Some(v) => store.put(t, k.as_bytes(), &crash_value(t, k, *v)).await.unwrap(),
                    None => assert!(
                        store.delete(t, k.as_bytes()).await.unwrap(),
                        "delete of a live key"
                    ),
                }
            } else {
                store.batch(batch_of(&changes)).await.unwrap();
            }
        });
        println!("CRASH ack {seq}");
        for (t, k, state) in changes {
            live.retain(|(_, lk, _)| *lk != k);
            if let Some(v) = state {
                live.push((t, k, v));
            }
        }
    }
}

/// The batch that makes `changes`.
fn batch_of(changes: &[Change]) -> Vec<agenthold_core::store::BatchOp> {
    changes
        .iter()
        .map(|(t, k, state)| match state {
            Some(v) => put(t, k.as_bytes(), &crash_value(t, k, *v)),
            None => del(t, k.as_bytes()),
        })
        .collect()
}

fn opener(backend: &str) -> Opener {
    match backend {
        "redb" => open_redb,
        #[cfg(feature = "sled")]
        "sled" => super::open_sled,
        #[cfg(feature = "postgres")]
        "postgres" => super::pg::open_pg,
        other => panic!("unknown backend {other}"),
    }
}

/// What the rounds saw, for the summary.
#[derive(Default)]
struct CrashStats {
    acked: usize,
    killed_before_open: u32,
    rounds_without_ack: u32,
    in_flight_applied: u32,
    in_flight_not_applied: u32,
}

/// When the parent kills the child.
#[derive(Clone, Copy)]
enum Kill {
    /// This long after the spawn: during start-up, the open and its recovery, or the first writes.
    AfterSpawn(Duration),
    /// This long after the child acknowledged this many writes.
    AfterAcks(usize, Duration),
}

/// Run one child writing into `data_dir`, kill it with SIGKILL as `kill` says, and return the complete
/// `CRASH …` lines it printed.
fn run_child(backend: &str, child_seed: u64, round: u32, data_dir: &Path, kill: Kill) -> Vec<String> {
    let mut command = Command::new(std::env::current_exe().unwrap());
    #[cfg(feature = "postgres")]
    if backend == "postgres" {
        command.env(super::pg::SERVER_ENV, super::pg::base_url());
    }
    let mut child = command
        .args(["--exact", "crash::crash_child", "--nocapture", "--test-threads=1"])
        .env(
            CHILD_ENV,
            format!("{backend}\t{child_seed}\t{round}\t{}", data_dir.display()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        // Only complete lines count: a line cut by the kill has no newline and is dropped. The first one
        // follows the harness's "test crash::crash_child ... " on the same line.
        let mut reader = std::io::BufReader::new(stdout);
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            if let (true, Some(start)) = (line.ends_with('\n'), line.find("CRASH ")) {
                let _ = tx.send(line[start..].trim_end().to_owned());
            }
            line.clear();
        }
    });
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });

    let mut lines: Vec<String> = Vec::new();
    let delay = match kill {
        Kill::AfterSpawn(delay) => delay,
        Kill::AfterAcks(acks, delay) => {
            let deadline = Instant::now() + Duration::from_secs(10);
            while lines.iter().filter(|l| l.starts_with("CRASH ack")).count() < acks {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: no acknowledgement within 10 s"
                );
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(line) => lines.push(line),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => break, // reported below
                }
            }
            delay
        }
    };
    std::thread::sleep(delay);
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    let stderr_text = stderr_reader.join().unwrap();
    #[cfg(feature = "postgres")]
    if backend == "postgres" {
        super::pg::wait_for_children_gone();
    }
    assert_eq!(
        status.signal(),
        Some(9),
        "round {round}: the child was not killed: {status:?}\n{stderr_text}"
    );
    lines
}

/// Apply what the child acknowledged to `model`; return the number of acknowledged writes and the
/// change in flight when it died.
fn read_acks(lines: &[String], model: &mut Model, round: u32) -> (usize, Option<Vec<Change>>) {
    let mut in_flight: Option<Vec<Change>> = None;
    let mut acked = 0;
    for line in lines {
        let mut words = line.splitn(4, ' ').skip(1);
        match (words.next(), words.next(), words.next()) {
            (Some("begin"), Some(_), Some(spec)) => in_flight = Some(parse_changes(spec)),
            (Some("ack"), Some(_), None) => {
                for (t, k, state) in in_flight.take().expect("ack without begin") {
                    model.insert((t, k), state);
                }
                acked += 1;
            }
            (Some("open"), None, None) => {}
            _ => panic!("round {round}: unexpected line {line:?}"),
        }
    }
    (acked, in_flight)
}

/// Reopen the store and compare it with `model`: every acknowledged record present with its last
/// acknowledged version and intact, deleted ones absent, nothing else, and the change in flight applied
/// whole or not at all (then recorded in `model` if applied). Returns whether it was applied.
fn check_store(
    open: Opener,
    data_dir: &Path,
    model: &mut Model,
    in_flight: Option<&[Change]>,
    round: u32,
) -> Option<bool> {
    let store = open(data_dir).unwrap_or_else(|e| panic!("round {round}: reopen failed: {e}"));
    let on_disk = read_records(&*store, round);
    let applied = in_flight.map(|changes| {
        let applied = in_flight_applied(&on_disk, changes, round);
        if applied {
            for (t, k, state) in changes {
                model.insert((t.clone(), k.clone()), *state);
            }
        }
        applied
    });
    let expected: BTreeMap<(String, String), u32> = model
        .iter()
        .filter_map(|(key, state)| state.map(|v| (key.clone(), v)))
        .collect();
    for (key, version) in &expected {
        match on_disk.get(key) {
            Some(found) => assert_eq!(
                found, version,
                "round {round}: {key:?} has an older or newer version"
            ),
            None => panic!("round {round}: acknowledged record {key:?} (version {version}) is lost"),
        }
    }
    for key in on_disk.keys() {
        assert!(
            expected.contains_key(key),
            "round {round}: {key:?} is present but was deleted or never acknowledged"
        );
    }
    // Point reads agree with the scan.
    for ((t, k), version) in expected.iter().rev().take(20) {
        let value = block_on(store.get(t, k.as_bytes())).unwrap().unwrap();
        assert_eq!(check_crash_value(t, k, &value), Ok(*version));
    }
    applied
}

/// Every record of the crash tables, checked intact: `(table, key)` to its version.
fn read_records(store: &dyn agenthold_core::store::Store, round: u32) -> BTreeMap<(String, String), u32> {
    let mut on_disk = BTreeMap::new();
    for table in TABLES {
        for (k, v) in block_on(store.scan_prefix(table, b"")).unwrap() {
            let key = String::from_utf8(k).unwrap();
            let version = check_crash_value(table, &key, &v).unwrap_or_else(|e| panic!("round {round}: {e}"));
            on_disk.insert((table.to_owned(), key), version);
        }
    }
    on_disk
}

/// Whether the change in flight when the writer died is in `on_disk`: wholly (true) or not at all (false);
/// half of it fails the test.
fn in_flight_applied(on_disk: &BTreeMap<(String, String), u32>, changes: &[Change], round: u32) -> bool {
    let applied: Vec<bool> = changes
        .iter()
        .map(|(t, k, state)| on_disk.get(&(t.clone(), k.clone())).copied() == *state)
        .collect();
    assert!(
        applied.iter().all(|a| *a) || applied.iter().all(|a| !*a),
        "round {round}: in-flight change half applied: {changes:?} applied {applied:?}"
    );
    applied[0]
}

fn crash_rounds(backend: &str) {
    let started = Instant::now();
    let seed = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("crash test {backend}: seed {seed} (set {SEED_ENV} to replay the choices)");
    let mut rng = Rng(seed);
    let open = opener(backend);
    let root = tempfile::tempdir().unwrap();
    let mut stats = CrashStats::default();

    // Crashes while a new store is being created: the store opens afterwards (this found redb leaving a
    // half-initialised file behind).
    for round in 0..CREATION_ROUNDS {
        let data_dir = root.path().join(format!("new-{round}"));
        let delay = Duration::from_micros(rng.below(20_000));
        let lines = run_child(backend, rng.next(), round, &data_dir, Kill::AfterSpawn(delay));
        let mut model = Model::new();
        let (_, in_flight) = read_acks(&lines, &mut model, round);
        check_store(open, &data_dir, &mut model, in_flight.as_deref(), round);
    }

    // Rounds on one growing store, each child killed at a different moment.
    let data_dir = root.path().join("data");
    // What is on disk, as far as the parent knows: every acknowledged change of every round.
    let mut model = Model::new();
    for round in 0..ROUNDS {
        // Every fifth round early, counted from the spawn; the others after 0-5 acknowledgements plus
        // 0-40 ms (occasionally 0-150 ms).
        let kill = if round % 5 == 0 {
            Kill::AfterSpawn(Duration::from_micros(rng.below(15_000)))
        } else {
            let max = if rng.below(8) == 0 { 150_000 } else { 40_000 };
            Kill::AfterAcks(rng.below(6) as usize, Duration::from_micros(rng.below(max)))
        };
        let lines = run_child(backend, rng.next(), round, &data_dir, kill);
        let (acked, in_flight) = read_acks(&lines, &mut model, round);
        stats.acked += acked;
        if acked == 0 {
            stats.rounds_without_ack += 1;
        }
        if !lines.iter().any(|l| l == "CRASH open") {
            stats.killed_before_open += 1;
        }
        match check_store(open, &data_dir, &mut model, in_flight.as_deref(), round) {
            Some(true) => stats.in_flight_applied += 1,
            Some(false) => stats.in_flight_not_applied += 1,
            None => {}
        }
    }

    println!(
        "crash test {backend}: {CREATION_ROUNDS} rounds creating a store, then {ROUNDS} rounds on one store, in \
         {:.1} s: {} acknowledged writes checked; killed before the store was open {} times, before any \
         acknowledgement {} times; in-flight change found applied {} / not applied {} times; {} records live",
        started.elapsed().as_secs_f64(),
        stats.acked,
        stats.killed_before_open,
        stats.rounds_without_ack,
        stats.in_flight_applied,
        stats.in_flight_not_applied,
        model.values().filter(|s| s.is_some()).count(),
    );
    assert!(
        stats.acked >= ROUNDS as usize,
        "too few writes acknowledged to mean anything: {}",
        stats.acked
    );
}

// covers: C2
#[test]
fn crash_redb() {
    crash_rounds("redb");
}

// covers: C2
#[cfg(feature = "sled")]
#[test]
fn crash_sled() {
    crash_rounds("sled");
}

// covers: C2
#[cfg(feature = "postgres")]
#[test]
#[ignore = "needs PostgreSQL (Debian postgresql): run with make test"]
fn crash_postgres() {
    crash_rounds("postgres");
}

/// Kill the PostgreSQL server (all its processes, SIGKILL) while a writer is in the middle of puts,
/// deletes and batches, restart it, and check with the same store (never reopened): every acknowledged
/// write present and intact, deleted ones absent, the write in flight all or nothing.
// covers: C2
#[cfg(feature = "postgres")]
#[test]
#[ignore = "needs PostgreSQL (Debian postgresql): run with make test"]
fn crash_postgres_server() {
    use agenthold_core::ErrorKind;
    use agenthold_core::store::{PgOptions, PgStore, Store};
    use std::sync::Arc;

    const SERVER_ROUNDS: u32 = 12;
    let started = Instant::now();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("crash test postgres server: seed {seed}");
    let mut rng = Rng(seed);
    let pg = agenthold_testsupport::TestPostgres::start();
    pg.create_database("crash");
    let mut options = PgOptions::new(pg.url("crash"));
    options.password = Some(agenthold_testsupport::PG_PASSWORD.to_owned());
    options.read_retry = Duration::from_secs(20);
    let store: Arc<PgStore> = Arc::new(block_on(PgStore::connect(options)).unwrap());
    let mut model = Model::new();
    let (mut acked_total, mut applied, mut not_applied) = (0usize, 0u32, 0u32);
    for round in 0..SERVER_ROUNDS {
        // The writer: acknowledged changes and the one in flight when the database went away.
        let writer = {
            let store = Arc::clone(&store);
            let mut rng = Rng(rng.next());
            let live: Vec<(String, String, u32)> = model
                .iter()
                .filter_map(|((t, k), s)| s.map(|v| (t.clone(), k.clone(), v)))
                .collect();
            std::thread::spawn(move || {
                let mut live = live;
                let mut acked: Vec<Vec<Change>> = Vec::new();
                let mut next = 0u32;
                loop {
                    let mut changes: Vec<Change> = Vec::new();
                    for _ in 0..1 + rng.below(6) {
                        next += 1;
                        let table = TABLES[rng.below(2) as usize].to_owned();
                        changes.push((table, format!("s{round:03}-{next:06}"), Some(0)));
                    }
                    if live.len() >= 2 && rng.below(2) == 0 {
                        let i = rng.below(live.len() as u64) as usize;
                        let (t, k, v) = live.remove(i);
                        changes.push((t, k, Some(v + 1)));
                        let j = rng.below(live.len() as u64) as usize;
                        let (t, k, _) = live.remove(j);
                        changes.push((t, k, None));
                    }
                    let result = if changes.len() == 1 {
                        let (t, k, _) = &changes[0];
                        block_on(store.put(t, k.as_bytes(), &crash_value(t, k, 0)))
                    } else {
                        block_on(store.batch(batch_of(&changes)))
                    };
                    match result {
                        Ok(()) => {
                            for (t, k, state) in &changes {
                                if let Some(v) = state {
                                    live.push((t.clone(), k.clone(), *v));
                                }
                            }
                            acked.push(changes);
                        }
                        Err(e) => {
                            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
                            return (acked, changes);
                        }
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_micros(20_000 + rng.below(200_000)));
        pg.kill();
        let (acked, in_flight) = writer.join().unwrap();
        acked_total += acked.len();
        for changes in acked {
            for (t, k, state) in changes {
                model.insert((t, k), state);
            }
        }
        pg.start_again();
        // The same store, never reopened: its reads retry until the server has recovered.
        let on_disk = read_records(&*store, round);
        let applied_now = in_flight_applied(&on_disk, &in_flight, round);
        if applied_now {
            applied += 1;
            for (t, k, state) in in_flight {
                model.insert((t, k), state);
            }
        } else {
            not_applied += 1;
        }
        let expected: BTreeMap<(String, String), u32> = model
            .iter()
            .filter_map(|(key, state)| state.map(|v| (key.clone(), v)))
            .collect();
        assert_eq!(
            on_disk, expected,
            "round {round}: the database differs from what was acknowledged"
        );
    }
    println!(
        "crash test postgres server: {SERVER_ROUNDS} server kills in {:.1} s: {acked_total} acknowledged \
         writes checked; in-flight change applied {applied} / not applied {not_applied} times",
        started.elapsed().as_secs_f64()
    );
    assert!(
        acked_total >= SERVER_ROUNDS as usize,
        "too few writes acknowledged: {acked_total}"
    );
}
