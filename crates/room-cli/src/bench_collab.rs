//! `room bench collab`: what the collaboration floor costs around the work it schedules. The
//! engine and the daemon's scheduler run in this process; the role agents are instant (the
//! bench acts for them as soon as a task reaches them: claim, write the phase's artifact for
//! the task, done), so what is measured is Room's part of each phase:
//!
//! - per-phase overhead with one collaboration: `ready → dispatched` (an agent's `done`
//!   returned until the next phase's task exists: the scheduler's settle and dispatch) and
//!   `dispatched → done` (the instant agent's claim, artifact and `done` with its `artifact`
//!   acceptance), p50 and p99, each as a ratio to one raw SQLite commit on the same disk;
//! - phases per second with 100 collaborations in parallel on one engine;
//! - the resident memory each live collaboration adds;
//! - a panel's wall time, dispatch to barrier, with three instant reviewers (acting in parallel,
//!   as reviewers on distinct backends do) against one reviewer alone: Room's own part;
//! - the same panel in a daemon with scripted reviewers, each a real worker process launched
//!   by its wake, wall time and the CPU time a panel takes.

use crate::bench::{BenchArgs, owner, pct};
use room_engine::Engine;
use room_engine::principal::AgentCaller;
use room_engine::verbs::TurnArgs;
use room_server::collab::StartArgs;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// Collaborations run together in the throughput row.
const PARALLEL: usize = 100;
/// Rounds of the four-phase pack in the overhead row.
const ROUNDS: usize = 25;

/// Four agent phases in a chain, each on its own role, none waiting for approval.
const PACK: &str = r#"name = "bench"

[[phases]]
name = "p1"
kind = "agent"
role = "search"
writes = ["extra/p1"]
approve = false

[[phases]]
name = "p2"
kind = "agent"
role = "reasoning"
reads = ["extra/p1"]
writes = ["extra/p2"]
approve = false

[[phases]]
name = "p3"
kind = "agent"
role = "architecture"
reads = ["extra/p2"]
writes = ["extra/p3"]
approve = false

[[phases]]
name = "p4"
kind = "agent"
role = "review"
reads = ["extra/p3"]
writes = ["extra/p4"]
approve = false
"#;

const ROLES: [&str; 4] = ["search", "reasoning", "architecture", "review"];

/// Rounds of each panel size in the panel row.
const PANEL_ROUNDS: usize = 15;

/// One panel phase of `REVIEWERS` seats, no fix loop.
const PANEL_PACK: &str = r#"name = "panel"

[[phases]]
name = "review"
kind = "panel"
role = "review"
reviewers = REVIEWERS
writes = ["findings"]
approve = false
fix_loops_max = 0
"#;

/// A panel of `n` reviewers (each seat bound to another scripted backend: no worker runs,
/// the bench acts for them) and its seats' credentials.
fn start_panel(e: &Engine, n: usize) -> anyhow::Result<Collab> {
    let o = owner(e);
    let steps = ["read", "exit", "claim"];
    let v = ok(room_server::collab::start(
        e,
        &o,
        StartArgs {
            goal: "measure".into(),
            project: None,
            pack: Some(PANEL_PACK.replace("REVIEWERS", &n.to_string())),
            prompts: BTreeMap::new(),
            roles: (0..n)
                .map(|i| format!("review=script:{}", steps[i]))
                .collect(),
            usd_max: None,
        },
    ))?;
    let id = v["collab"].as_str().unwrap_or_default().to_string();
    let mut agents = BTreeMap::new();
    for (_, name) in v["agents"].as_object().into_iter().flatten() {
        let name = name.as_str().unwrap_or_default().to_string();
        let token = e.rotate(&o, &name).map_err(anyhow::Error::msg)?.token;
        agents.insert(name, caller(token));
    }
    Ok(Collab {
        id,
        agents,
        acted: Vec::new(),
    })
}

/// Every seat whose task reached it claims, writes its findings and closes, each seat on a
/// thread of its own (reviewers on distinct backends work at once).
fn act_panel(e: &Engine, c: &mut Collab) -> anyhow::Result<usize> {
    let (_, runs, _) = e
        .collab_show(&owner(e), &c.id)
        .map_err(anyhow::Error::msg)?;
    let todo: Vec<(String, String)> = runs
        .iter()
        .filter(|r| r.state == "running")
        .filter_map(|r| {
            let seat = r.phase.split_once('@')?.1.to_string();
            let task = r.task.clone()?;
            (!c.acted.contains(&task)).then_some((seat, task))
        })
        .collect();
    let done: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = todo
            .iter()
            .map(|(seat, task)| {
                let a = &c.agents[&format!("{}-{seat}", c.id)];
                let room = &c.id;
                s.spawn(move || -> anyhow::Result<()> {
                    ok(e.task_claim(a, task, None))?;
                    for _ in 0..64 {
                        catch_up(e, a, room)?;
                        let put = e.turn(
                            a,
                            room_core::Verb::Note,
                            TurnArgs {
                                room: room.clone(),
                                task: Some(task.clone()),
                                artifact: Some(room_engine::blackboard::ArtifactDraft {
                                    kind: "findings".into(),
                                    key: Some(seat.clone()),
                                    content: json!({"blocking": [], "non_blocking": [], "suggestions": []}),
                                    expected_version: 0,
                                }),
                                ..TurnArgs::default()
                            },
                        );
                        match put {
                            Ok(_) => break,
                            Err(r)
                                if matches!(
                                    r.code,
                                    room_core::Code::RoomSyncRequired
                                        | room_core::Code::RoomSyncConcurrentArrival
                                ) =>
                            {
                                continue;
                            }
                            Err(r) => anyhow::bail!("{r}"),
                        }
                    }
                    for _ in 0..64 {
                        catch_up(e, a, room)?;
                        let done = e.turn(
                            a,
                            room_core::Verb::Done,
                            TurnArgs {
                                room: room.clone(),
                                task: Some(task.clone()),
                                ..TurnArgs::default()
                            },
                        );
                        match done {
                            Ok(_) => return Ok(()),
                            Err(r)
                                if matches!(
                                    r.code,
                                    room_core::Code::RoomSyncRequired
                                        | room_core::Code::RoomSyncConcurrentArrival
                                ) =>
                            {
                                continue;
                            }
                            Err(r) => anyhow::bail!("{r}"),
                        }
                    }
                    anyhow::bail!("{room} kept moving")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a seat panicked")))
            })
            .collect()
    });
    for r in done {
        r?;
    }
    c.acted.extend(todo.into_iter().map(|(_, t)| t));
    Ok(c.acted.len())
}

/// A panel's wall time from its dispatch to its barrier (the collaboration's set-up, which
/// mints one child per seat, is not the panel's), p50 over `PANEL_ROUNDS`.
fn panel_wall_us(e: &Engine, n: usize) -> anyhow::Result<f64> {
    let sched = room_collab::scheduler::Scheduler::new(std::sync::Arc::new(
        room_collab::scheduler::InlineHost,
    ));
    let mut walls = Vec::new();
    for _ in 0..PANEL_ROUNDS {
        let mut c = start_panel(e, n)?;
        let t = Instant::now();
        loop {
            sched.tick(e);
            if state(e, &c.id)? != "running" {
                break;
            }
            act_panel(e, &mut c)?;
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(60),
                "the panel did not finish"
            );
        }
        walls.push(t.elapsed());
    }
    pct(&mut walls, 0.5).ok_or_else(|| anyhow::anyhow!("no panel measured"))
}

/// Rounds of each panel size in the daemon's panel row.
const DAEMON_PANEL_ROUNDS: usize = 7;

/// CPU time this process and its reaped children have used (the daemon runs in this
/// process; its workers are its children), from `/proc/self/stat` in clock ticks of 10 ms.
fn cpu_ms() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // the fields after the command name's closing parenthesis: utime, stime, cutime and
    // cstime are the 14th to 17th of the whole line
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    ticks * 10
}

/// A panel's wall time in the daemon, from the start's answer until the collaboration has
/// finished, with `n` scripted reviewers: each seat's child a real `room agent-script`
/// process launched by its sealed wake in an owned job (confined where the machine can),
/// which reads, claims, writes its canned findings and closes its task at once. p50 over
/// `DAEMON_PANEL_ROUNDS`, and the CPU time a panel takes (the daemon's and its workers').
fn panel_daemon_wall_us(dir: &Path, n: usize) -> anyhow::Result<(f64, f64)> {
    use room_server::client::Client;
    use room_server::daemon::{Background, ServeConfig};
    use room_server::wire::Request;
    let tmp = tempfile::tempdir_in(dir)?;
    let root = std::fs::canonicalize(tmp.path())?;
    let (state_dir, boot) = (root.join("state"), root.join("boot.toml"));
    room_store::statedir::init(&state_dir, &boot, "bench-panel")?;
    let daemon = Background::start_with(ServeConfig {
        state_dir,
        bootstrap: boot,
        listen: None,
        engine_threads: room_server::daemon::engine_threads_default(),
        limits: Default::default(),
        room_exe: Some(std::env::current_exe()?),
        store: None,
    })?;
    let call = |op: &str, args: Value| -> anyhow::Result<Value> {
        let r = Client::connect(&daemon.socket)?.call(&Request::new(op, args))?;
        r.result
            .ok_or_else(|| anyhow::anyhow!("{op} refused: {:?}", r.refusal))
    };
    let findings = root.join("findings.json");
    std::fs::write(
        &findings,
        json!({"blocking": [], "non_blocking": [], "suggestions": []}).to_string(),
    )?;
    let roles: Vec<String> = (0..n)
        .map(|i| {
            let seat = if i == 0 {
                "review".to_string()
            } else {
                format!("review-{}", i + 1)
            };
            format!(
                "review=script:read,claim,put:findings@{seat}={},done",
                findings.display()
            )
        })
        .collect();
    let mut walls = Vec::new();
    // the first launch stages the bridge (Room's binary copied and hashed once per daemon)
    let mut cpu_before = None;
    for _ in 0..=DAEMON_PANEL_ROUNDS {
        let started = call(
            "collab_start",
            json!({"goal": "measure", "pack": PANEL_PACK.replace("REVIEWERS", &n.to_string()),
                "roles": roles}),
        )?;
        let t = Instant::now();
        let id = started["collab"].as_str().unwrap_or_default().to_string();
        loop {
            let st = call("collab_status", json!({"id": id}))?;
            match st["state"].as_str() {
                Some("running") => {}
                Some("done") => break,
                other => anyhow::bail!("the panel ended {other:?}: {st}"),
            }
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(60),
                "the panel did not finish"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        match cpu_before {
            None => cpu_before = Some(cpu_ms()),
            Some(_) => walls.push(t.elapsed()),
        }
    }
    let cpu = cpu_ms().saturating_sub(cpu_before.unwrap_or(0)) as f64 / walls.len() as f64;
    daemon.stop()?;
    let wall = pct(&mut walls, 0.5).ok_or_else(|| anyhow::anyhow!("no panel measured"))?;
    Ok((wall, cpu * 1000.0))
}

fn ok(r: Result<Value, room_core::Refusal>) -> anyhow::Result<Value> {
    r.map_err(|e| anyhow::anyhow!("{e}"))
}

fn caller(token: String) -> AgentCaller {
    AgentCaller {
        token,
        conversation: "bench".into(),
        declared_tier: None,
        page_bytes_max: None,
    }
}

fn engine(dir: &Path) -> anyhow::Result<(tempfile::TempDir, Engine)> {
    let tmp = tempfile::tempdir_in(dir)?;
    let root = std::fs::canonicalize(tmp.path())?;
    let state = room_store::statedir::init(&root.join("state"), &root.join("boot.toml"), "bench")?;
    std::fs::write(
        state.root.join("config.toml"),
        "[quotas]\ntasks_open = 100000\n",
    )?;
    let store = room_server::daemon::embedded_store(&state);
    let e = Engine::open(
        state,
        room_server::daemon::real_env(),
        store,
        Default::default(),
    )?;
    Ok((tmp, e))
}

/// One started collaboration and its role agents' credentials.
struct Collab {
    id: String,
    agents: BTreeMap<String, AgentCaller>,
    /// Tasks already acted on.
    acted: Vec<String>,
}

fn start(e: &Engine) -> anyhow::Result<Collab> {
    let o = owner(e);
    let v = ok(room_server::collab::start(
        e,
        &o,
        StartArgs {
            goal: "measure".into(),
            project: None,
            pack: Some(PACK.into()),
            prompts: BTreeMap::new(),
            roles: ROLES.iter().map(|r| format!("{r}=script:read")).collect(),
            usd_max: None,
        },
    ))?;
    let id = v["collab"].as_str().unwrap_or_default().to_string();
    let mut agents = BTreeMap::new();
    for (_, name) in v["agents"].as_object().into_iter().flatten() {
        let name = name.as_str().unwrap_or_default().to_string();
        let token = e.rotate(&o, &name).map_err(anyhow::Error::msg)?.token;
        agents.insert(name, caller(token));
    }
    Ok(Collab {
        id,
        agents,
        acted: Vec::new(),
    })
}

fn catch_up(e: &Engine, a: &AgentCaller, room: &str) -> anyhow::Result<()> {
    let mut confirm: Option<String> = None;
    for _ in 0..10_000 {
        let page = ok(e.sync(a, room, confirm.as_deref()))?;
        if page["more"] != true && confirm.is_some() {
            return Ok(());
        }
        confirm = page["receipt"].as_str().map(String::from);
    }
    anyhow::bail!("{room} did not settle")
}

/// Act, instantly, on every task of `c` that reached one of its agents: claim, write the
/// phase's artifact for it, done. Returns how many were closed.
fn act(e: &Engine, c: &mut Collab) -> anyhow::Result<usize> {
    let o = owner(e);
    let (_, runs, _) = e.collab_show(&o, &c.id).map_err(anyhow::Error::msg)?;
    let mut closed = 0;
    for r in runs.iter().filter(|r| r.state == "running") {
        let Some(task) = &r.task else { continue };
        if c.acted.contains(task) {
            continue;
        }
        let role = match r.phase.as_str() {
            "p1" => "search",
            "p2" => "reasoning",
            "p3" => "architecture",
            _ => "review",
        };
        let a = &c.agents[&format!("{}-{role}", c.id)];
        ok(e.task_claim(a, task, None))?;
        catch_up(e, a, &c.id)?;
        let kind = format!("extra/{}", r.phase);
        let current = e
            .artifact_index_owner(&o, &c.id, None, 16)
            .map_err(anyhow::Error::msg)?["artifacts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["kind"] == kind.as_str())
            .and_then(|x| x["version"].as_u64())
            .unwrap_or(0) as u32;
        ok(e.turn(
            a,
            room_core::Verb::Note,
            TurnArgs {
                room: c.id.clone(),
                task: Some(task.clone()),
                artifact: Some(room_engine::blackboard::ArtifactDraft {
                    kind,
                    key: None,
                    content: json!({"phase": r.phase, "run": r.run}),
                    expected_version: current,
                }),
                ..TurnArgs::default()
            },
        ))?;
        ok(e.turn(
            a,
            room_core::Verb::Done,
            TurnArgs {
                room: c.id.clone(),
                task: Some(task.clone()),
                ..TurnArgs::default()
            },
        ))?;
        c.acted.push(task.clone());
        closed += 1;
    }
    Ok(closed)
}

fn state(e: &Engine, id: &str) -> anyhow::Result<String> {
    let (c, _, _) = e.collab_show(&owner(e), id).map_err(anyhow::Error::msg)?;
    Ok(c.state)
}

/// Resident bytes of this process.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn raw_commit_us(dir: &Path) -> anyhow::Result<f64> {
    let tmp = tempfile::tempdir_in(dir)?;
    let conn = rusqlite::Connection::open(tmp.path().join("raw.db"))?;
    room_store::index::configure(&conn)?;
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")?;
    let body = vec![7u8; 256];
    let mut lat = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        let t = Instant::now();
        conn.execute("INSERT INTO t (body) VALUES (?1)", [&body])?;
        lat.push(t.elapsed());
    }
    pct(&mut lat, 0.5).ok_or_else(|| anyhow::anyhow!("no commits measured"))
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    eprintln!("measuring collaborations in {} …", dir.display());
    let raw = raw_commit_us(&dir)?;
    // per-phase overhead, one collaboration at a time
    let (_tmp, e) = engine(&dir)?;
    let sched = room_collab::scheduler::Scheduler::new(std::sync::Arc::new(
        room_collab::scheduler::InlineHost,
    ));
    let (mut ready, mut work) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let mut c = start(&e)?;
        let mut t = Instant::now();
        loop {
            sched.tick(&e);
            let dispatched = Instant::now();
            if state(&e, &c.id)? != "running" {
                break;
            }
            ready.push(dispatched - t);
            let closed = act(&e, &mut c)?;
            anyhow::ensure!(closed > 0, "a pass dispatched nothing for {}", c.id);
            t = Instant::now();
            work.push(t - dispatched);
        }
    }
    println!(
        "{:<52} {:>10} {:>10}  ratio to one raw SQLite commit (p50 {raw:.0} us)",
        "row", "p50 us", "p99 us"
    );
    for (name, lat) in [
        ("phase overhead: ready -> dispatched", &mut ready),
        (
            "phase overhead: dispatched -> done (instant agent)",
            &mut work,
        ),
    ] {
        let (p50, p99) = (pct(lat, 0.5).unwrap_or(0.0), pct(lat, 0.99).unwrap_or(0.0));
        println!(
            "{name:<52} {p50:>10.0} {p99:>10.0}  {:.1}x / {:.1}x",
            p50 / raw,
            p99 / raw
        );
    }
    drop(e);
    // throughput and memory, PARALLEL collaborations on one engine
    let (_tmp2, e) = engine(&dir)?;
    let sched = room_collab::scheduler::Scheduler::new(std::sync::Arc::new(
        room_collab::scheduler::InlineHost,
    ));
    let before = rss_bytes();
    let mut all = Vec::new();
    for _ in 0..PARALLEL {
        all.push(start(&e)?);
    }
    sched.tick(&e);
    let live = rss_bytes().saturating_sub(before);
    let t = Instant::now();
    let mut phases = 0;
    loop {
        for c in all.iter_mut() {
            phases += act(&e, c)?;
        }
        sched.tick(&e);
        if e.collabs_running().map_err(anyhow::Error::msg)?.is_empty() {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(600),
            "the collaborations did not finish"
        );
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{:<52} {:>10.1} phases/s ({phases} phases, {PARALLEL} collaborations, {secs:.1} s)",
        "phases per second, 100 collaborations in parallel",
        phases as f64 / secs
    );
    println!(
        "{:<52} {:>10.0} KiB each (resident growth over {PARALLEL} live collaborations)",
        "memory per live collaboration",
        live as f64 / PARALLEL as f64 / 1024.0
    );
    drop(e);
    // a panel of three against one reviewer alone, start to barrier
    let (_tmp3, e) = engine(&dir)?;
    let one = panel_wall_us(&e, 1)?;
    let three = panel_wall_us(&e, 3)?;
    println!(
        "{:<52} {:>10.0} us p50 (one reviewer {one:.0} us): {:.2}x",
        "panel of 3 instant reviewers, dispatch to barrier",
        three,
        three / one
    );
    let (one, one_cpu) = panel_daemon_wall_us(&dir, 1)?;
    let (three, three_cpu) = panel_daemon_wall_us(&dir, 3)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{:<52} {:>10.0} us p50 (one reviewer {one:.0} us): {:.2}x; CPU per panel {:.0} ms (one reviewer {:.0} ms) on {cores} cores",
        "panel of 3 scripted reviewers in the daemon",
        three,
        three / one,
        three_cpu / 1000.0,
        one_cpu / 1000.0,
    );
    Ok(())
}
