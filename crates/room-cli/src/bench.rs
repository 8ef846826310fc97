//! `room bench`: throughput and latency of gated turns through the engine, as ratios to raw
//! SQLite single-row commits (WAL, synchronous=FULL) measured in the same run on the same disk,
//! so the numbers mean something on a noisy machine. Also the Work Gate's cost at 10 k and 1 M
//! events of history, and what sharing one room costs (the gate serializes a room by design).

use room_core::{Code, Tier, Verb};
use room_engine::principal::AgentCaller;
use room_engine::verbs::TurnArgs;
use room_engine::{Engine, EngineConfig};
use room_store::index::{Batch, CheckpointRow, EventRow, Index};
use room_store::{JournalSync, RoomIndex};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// What to measure: `core` (the engine against raw SQLite), `mcp` (tool calls over
    /// streamable HTTP against the same turns in-process) or `swarm` (10, 100 and 500 agents over
    /// streamable HTTP in rooms of 2 to 8, with a realistic mix of turns) or `acceptance`
    /// (`done` with sha256 checks against hashing the same bytes; a claim against 10,000
    /// live leases against an uncontended one) or `wakes` (send to worker claim at 1, 16 and 64
    /// recipients against spawning the worker binary; stopping a 50-process tree until zero
    /// processes are observed against killing one) or `collab` (a collaboration's per-phase
    /// overhead with instant agents against a raw SQLite commit, phases per second with 100
    /// collaborations in parallel, memory per live collaboration) or `search` (full-text
    /// query latency at 100,000 and 1,000,000 events, and the index's size per 100,000) or
    /// `dashboard` (64 writers committing while 50 dashboard event streams read: events
    /// delivered per second and the lag from commit to delivery, against the writers alone).
    #[arg(default_value = "core")]
    pub what: String,
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Directory on the disk to measure (default: the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Largest history for the gate-cost row.
    #[arg(long, default_value_t = 1_000_000)]
    pub history: u64,
    /// Skip the multi-writer rows above this many writers.
    #[arg(long, default_value_t = 256)]
    pub writers_max: usize,
    /// The swarm's MCP client: `lean` (a minimal streamable-HTTP client that sends what rmcp's
    /// does and parses only what the swarm reads, so that the load generator takes less of the
    /// cores it shares with the daemon) or `rmcp` (rmcp's own client).
    #[arg(long, value_enum, default_value = "lean")]
    pub client: ClientKind,
    /// The swarm's sizes (agents, 2 to 5,000 each), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100,500",
          value_parser = clap::value_parser!(u64).range(2..=5_000))]
    pub agents: Vec<u64>,
    /// The daemon's engine threads in `mcp` and `swarm` (default: as `room serve`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=512))]
    pub engine_threads: Option<u64>,
    /// After each swarm size, each tool's calls and latency (on stderr).
    #[arg(long)]
    pub by_tool: bool,
    /// `core` only: run just the rows whose name contains this text (the raw baseline and the
    /// one-writer row always run, since the ratios are to them).
    #[arg(long)]
    pub only: Option<String>,
    /// `core` only: a config.toml for the engines of the shared-room rows (to compare, say,
    /// `[gate]` settings in one run).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// `core` only: measure Room with its whole store on this PostgreSQL server
    /// (postgres://…) against pgbench's insert rate there, each row in a database made for it
    /// and dropped after (the user needs CREATEDB).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum ClientKind {
    Lean,
    Rmcp,
}

struct Row {
    name: String,
    per_s: f64,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    note: String,
}

pub fn run(a: &BenchArgs) -> i32 {
    let result = match a.what.as_str() {
        "core" => match &a.store {
            Some(url) => crate::bench_pg::bench(a, url),
            None => bench(a),
        },
        "mcp" => crate::bench_mcp::bench(a),
        "swarm" => crate::bench_mcp::swarm(a),
        "acceptance" => crate::bench_accept::bench(a),
        "wakes" => crate::bench_wakes::bench(a),
        "collab" => crate::bench_collab::bench(a),
        "search" => crate::bench_search::bench(a),
        "dashboard" => crate::bench_dashboard::bench(a),
        other => {
            eprintln!(
                "error[invalid_argument]: what: {other:?} is not core, mcp, swarm, acceptance, wakes, collab, search or dashboard"
            );
            return crate::cmd::EXIT_REFUSED;
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: bench failed: {e:#}");
            crate::cmd::EXIT_IO
        }
    }
}

pub(crate) fn pct(lat: &mut [Duration], p: f64) -> Option<f64> {
    if lat.is_empty() {
        return None;
    }
    lat.sort_unstable();
    let i = ((lat.len() as f64 - 1.0) * p).round() as usize;
    Some(lat[i].as_secs_f64() * 1e6)
}

fn raw_sqlite(dir: &Path, secs: f64) -> anyhow::Result<Row> {
    let conn = rusqlite::Connection::open(dir.join("raw.db"))?;
    room_store::index::configure(&conn)?;
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")?;
    let body = vec![7u8; 256];
    let mut lat = vec![];
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        conn.execute("INSERT INTO t (body) VALUES (?1)", [&body])?;
        lat.push(t.elapsed());
    }
    let per_s = lat.len() as f64 / start.elapsed().as_secs_f64();
    Ok(Row {
        name: "raw SQLite single-row commits".into(),
        per_s,
        p50_us: pct(&mut lat, 0.5),
        p99_us: pct(&mut lat, 0.99),
        note: "baseline".into(),
    })
}

/// What a measured engine stores on.
#[derive(Clone)]
pub(crate) enum Store {
    /// The state dir's embedded store, its journals synced this way.
    Embedded(JournalSync),
    /// A PostgreSQL server (each world in a scratch database of its own).
    Postgres(String),
}

struct World {
    _tmp: tempfile::TempDir,
    engine: Arc<Engine>,
    store: Arc<dyn room_store::Backend>,
    /// Dropped last: the engine's connections go first.
    _db: Option<room_store_pg::ScratchDatabase>,
}

fn world(dir: &Path, store: &Store) -> anyhow::Result<World> {
    world_with(dir, None, store)
}

/// A world whose state directory holds `config` as its config.toml.
fn world_with(dir: &Path, config: Option<&Path>, choice: &Store) -> anyhow::Result<World> {
    let tmp = tempfile::tempdir_in(dir)?;
    let root = std::fs::canonicalize(tmp.path())?;
    let state = room_store::statedir::init(&root.join("state"), &root.join("boot.toml"), "bench")?;
    if let Some(c) = config {
        std::fs::copy(c, state.root.join("config.toml"))
            .map_err(|e| anyhow::anyhow!("--config {}: {e}", c.display()))?;
    }
    settle(&state.root.join("config.toml"))?;
    let (store, db): (Arc<dyn room_store::Backend>, _) = match choice {
        Store::Embedded(sync) => (
            Arc::new(room_store::SqliteBackend::new(
                &state,
                room_store::SqliteBackendConfig {
                    journal_sync: *sync,
                    ..Default::default()
                },
            )),
            None,
        ),
        Store::Postgres(url) => {
            let db = crate::bench_pg::scratch(url)?;
            let pg = room_store_pg::PgBackend::connect_config(&db.config)?;
            // as a daemon holds it
            pg.serve_alone()?;
            pg.start_serving()?;
            (Arc::new(pg), Some(db))
        }
    };
    // as many rooms open at once as a daemon would keep under this process's descriptor
    // limit (raised as `room serve` raises it): the multi-writer rows measure turns, not rooms
    // evicted and opened again for want of descriptors
    let nofile = room_server::daemon::raise_nofile_limit().unwrap_or(u64::from(u32::MAX));
    let engine = Engine::open(
        state,
        room_server::daemon::real_env(),
        store.clone(),
        EngineConfig {
            rooms_open_max: room_engine::rooms::open_max_for(nofile),
            ..EngineConfig::default()
        },
    )?;
    Ok(World {
        _tmp: tmp,
        engine: Arc::new(engine),
        store,
        _db: db,
    })
}

/// Wait until `config` is old enough that the engine trusts its stamp: a daemon's config.toml
/// is, and a fresh one is re-read at every call for its first two seconds.
fn settle(config: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(config)?;
    let changed = std::time::UNIX_EPOCH
        + Duration::new(
            m.ctime().max(0) as u64,
            m.ctime_nsec().clamp(0, 999_999_999) as u32,
        );
    let settled = changed + Duration::from_millis(2_100);
    if let Ok(wait) = settled.duration_since(std::time::SystemTime::now()) {
        std::thread::sleep(wait);
    }
    Ok(())
}

pub(crate) fn owner(e: &Engine) -> room_engine::Owner {
    e.owner(&room_engine::Caller::Local(
        room_engine::Evidence::UnixPeer {
            uid: e.config().owner_uid,
            pid: std::process::id(),
        },
    ))
    .expect("the bench is the owner")
}

/// The name of the row of `writers` writers, each in its own room.
fn own_row(writers: usize, sync: JournalSync) -> String {
    match sync {
        JournalSync::Pipeline => format!("gated turns, {writers} writer(s) each in its own room"),
        JournalSync::PerAppend => {
            format!("gated turns, {writers} writer(s) each in its own room, fsync per turn")
        }
    }
}

fn caller(e: &Engine, name: &str) -> anyhow::Result<AgentCaller> {
    let t = e
        .enroll(&owner(e), name, Tier::Member, "bench")
        .map_err(anyhow::Error::msg)?;
    Ok(AgentCaller {
        token: t.token,
        conversation: "bench".into(),
        declared_tier: None,
        page_bytes_max: None,
    })
}

fn catch_up(e: &Engine, a: &AgentCaller, room: &str) -> Result<(), room_core::Refusal> {
    let mut confirm: Option<String> = None;
    loop {
        let page = e.sync(a, room, confirm.as_deref())?;
        if page["items"].as_array().is_some_and(Vec::is_empty) {
            return Ok(());
        }
        confirm = page["receipt"].as_str().map(String::from);
    }
}

fn note(room: &str, i: u64) -> TurnArgs {
    TurnArgs {
        room: room.into(),
        text: Some(format!("status {i}: {}", "x".repeat(200))),
        ..Default::default()
    }
}

/// What a run of writers in their own rooms measured.
pub(crate) struct Own {
    pub per_s: f64,
    pub lat: Vec<Duration>,
    /// Journal appends per fdatasync of the commit log in the window, and the share of the
    /// window its leaders spent writing and syncing (pipeline only).
    pub appends_per_sync: Option<(f64, f64)>,
    /// CPU time of the whole process (every thread, kernel included) per turn in the window:
    /// what the turn costs apart from waiting on the disk, which drifts more than CPU does.
    pub cpu_us_per_turn: f64,
}

/// CPU time this process (all its threads) has used.
pub(crate) fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `writers` agents, each alone in its own room, writing notes for `secs`.
pub(crate) fn own_rooms(
    dir: &Path,
    writers: usize,
    secs: f64,
    store: &Store,
) -> anyhow::Result<Own> {
    let w = world(dir, store)?;
    let mut callers = vec![];
    for i in 0..writers {
        let a = caller(&w.engine, &format!("w{i}"))?;
        let room = format!("r{i}");
        w.engine
            .room_create(&owner(&w.engine), &room, None, &[format!("w{i}")])
            .map_err(anyhow::Error::msg)?;
        catch_up(&w.engine, &a, &room).map_err(anyhow::Error::msg)?;
        callers.push((a, room));
    }
    let before = w.store.commit_stats();
    let cpu_before = process_cpu();
    let start = Instant::now();
    let threads: Vec<_> = callers
        .into_iter()
        .map(|(a, room)| {
            let e = w.engine.clone();
            std::thread::spawn(move || {
                let mut lat = vec![];
                let mut i = 0;
                while start.elapsed().as_secs_f64() < secs {
                    i += 1;
                    let t = Instant::now();
                    // one call's scope, as the daemon opens for each request
                    let _call = e.one_call();
                    e.turn(&a, Verb::Note, note(&room, i))
                        .expect("a writer alone in its room is never refused");
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all = vec![];
    for t in threads {
        all.extend(t.join().map_err(|_| anyhow::anyhow!("writer panicked"))?);
    }
    let per_s = all.len() as f64 / start.elapsed().as_secs_f64();
    let cpu_us_per_turn =
        process_cpu().saturating_sub(cpu_before).as_secs_f64() * 1e6 / all.len().max(1) as f64;
    let window_us = start.elapsed().as_secs_f64() * 1e6;
    let appends_per_sync = before.zip(w.store.commit_stats()).and_then(|(b, a)| {
        let batches = a.batches.saturating_sub(b.batches);
        (batches > 0).then(|| {
            (
                a.entries.saturating_sub(b.entries) as f64 / batches as f64,
                a.busy_us.saturating_sub(b.busy_us) as f64 / window_us,
            )
        })
    });
    Ok(Own {
        per_s,
        lat: all,
        appends_per_sync,
        cpu_us_per_turn,
    })
}

/// How agents sharing one room read and act.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loop {
    /// Read a page, confirm it (a call), then act (another call); a refusal's page is confirmed
    /// before the next try.
    ConfirmThenAct,
    /// Read a page, act with `read_through` its receipt (one call); a refusal's delta page is
    /// presented with the next try.
    ReadThrough,
}

/// What agents sharing one room achieved.
pub(crate) struct Shared {
    pub(crate) per_s: f64,
    /// Refusals each accepted turn met before it landed (a count, kept as microseconds so
    /// that `pct` ranks it).
    pub(crate) refusals: Vec<Duration>,
    /// Bytes of pages handed back by refusals, in total.
    reread_bytes: u64,
    accepted: u64,
    /// Accepted turns per agent.
    per_agent: Vec<u64>,
    /// Turns the turnstile refused (queue full or waited too long).
    queue_refused: u64,
}

/// `writers` agents in one room, each looping: read its inbox (`sync`), then act on it; a
/// refusal hands back the next page, read before the next try. Every turn goes through the
/// room's turnstile, as the daemon's calls do.
pub(crate) fn shared_room(
    dir: &Path,
    config: Option<&Path>,
    writers: usize,
    secs: f64,
    how: Loop,
    store: &Store,
) -> anyhow::Result<Shared> {
    let w = world_with(dir, config, store)?;
    let names: Vec<String> = (0..writers).map(|i| format!("w{i}")).collect();
    let mut callers = vec![];
    for n in &names {
        callers.push(caller(&w.engine, n)?);
    }
    w.engine
        .room_create(&owner(&w.engine), "shared", None, &names)
        .map_err(anyhow::Error::msg)?;
    // everyone starts caught up: the room's opening records are not the contention measured
    for a in &callers {
        catch_up(&w.engine, a, "shared").map_err(anyhow::Error::msg)?;
    }
    let start = Instant::now();
    let threads: Vec<_> = callers
        .into_iter()
        .map(|a| {
            let e = w.engine.clone();
            std::thread::spawn(move || shared_agent(&e, &a, start, secs, how))
        })
        .collect();
    let mut out = Shared {
        per_s: 0.0,
        refusals: vec![],
        reread_bytes: 0,
        accepted: 0,
        per_agent: vec![],
        queue_refused: 0,
    };
    for t in threads {
        let r = t
            .join()
            .map_err(|_| anyhow::anyhow!("writer panicked"))?
            .map_err(anyhow::Error::msg)?;
        out.accepted += r.accepted;
        out.per_agent.push(r.accepted);
        out.refusals.extend(r.refusals);
        out.reread_bytes += r.reread_bytes;
        out.queue_refused += r.queue_refused;
    }
    out.per_s = out.accepted as f64 / secs;
    Ok(out)
}

fn shared_agent(
    e: &Engine,
    a: &AgentCaller,
    start: Instant,
    secs: f64,
    how: Loop,
) -> Result<Shared, room_core::Refusal> {
    let mut me = Shared {
        per_s: 0.0,
        refusals: vec![],
        reread_bytes: 0,
        accepted: 0,
        per_agent: vec![],
        queue_refused: 0,
    };
    let mut i = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        // read the inbox
        // one owner policy per call, as the daemon's calls have
        let page = {
            let _call = e.one_call();
            e.sync(a, "shared", None)?
        };
        let mut receipt = page["receipt"].as_str().map(String::from);
        let mut refused = 0u64;
        // measured once the turn has landed: the count is the bench's, not the loop's, and
        // must not hold the room's slot
        let mut reread = Vec::new();
        loop {
            i += 1;
            let mut args = note("shared", i);
            match how {
                Loop::ConfirmThenAct => {
                    if let Some(r) = receipt.take() {
                        let _call = e.one_call();
                        e.sync(a, "shared", Some(&r))?;
                    }
                }
                Loop::ReadThrough => args.read_through = receipt.take(),
            }
            let out = {
                let _call = e.one_call();
                e.turn_waiting(a, Verb::Note, args)
            };
            match out {
                Ok(_) => break,
                Err(r)
                    if matches!(
                        r.code,
                        Code::RoomSyncRequired
                            | Code::RoomSyncConcurrentArrival
                            | Code::RoomSyncViewChanged
                    ) =>
                {
                    refused += 1;
                    receipt = r.detail["next_page"]["receipt"].as_str().map(String::from);
                    reread.push(r);
                }
                Err(r) if r.code == Code::RoomTurnQueueExceeded => {
                    me.queue_refused += 1;
                    break;
                }
                Err(r) => return Err(r),
            }
            // past the window the agent still retries (a refused author holds the room's
            // slot until it does), but stops after its next turn
        }
        me.reread_bytes += reread
            .iter()
            .filter_map(room_core::Refusal::next_page_view)
            .map(|p| json_bytes(&p))
            .sum::<u64>();
        // only turns that landed inside the window count
        if start.elapsed().as_secs_f64() < secs {
            me.accepted += 1;
            me.refusals.push(Duration::from_micros(refused));
        }
    }
    Ok(me)
}

/// The length of `v`'s compact JSON, counted as it is written.
fn json_bytes(v: &impl serde::Serialize) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    serde_json::to_writer(&mut c, v).expect("a page serializes into a counter");
    c.0
}

/// The gate's queries (checkpoint lookup + first foreign event after it + one parent) over an
/// index holding `n` events, in microseconds per check.
fn gate_cost(dir: &Path, n: u64) -> anyhow::Result<f64> {
    let tmp = tempfile::tempdir_in(dir)?;
    let mut idx = Index::open(&tmp.path().join("i.db"))?;
    let body = json!({"kind": "turn", "text": "x".repeat(100)}).to_string();
    let mut seq = 0u64;
    while seq < n {
        let mut b = Batch::default();
        for _ in 0..10_000.min(n - seq) {
            seq += 1;
            b.events.push(EventRow {
                seq,
                id: format!("evt_{seq:016x}_00000000"),
                kind: "turn".into(),
                actor: format!("a{}", seq % 8),
                hlc_ms: seq,
                hlc_c: 0,
                hash: "h".into(),
                task: None,
                body: body.clone(),
            });
        }
        idx.apply(&b)?;
    }
    idx.put_checkpoint(&CheckpointRow {
        actor: "a1".into(),
        conversation: "c".into(),
        conversation_key: "k".into(),
        view_gen: "v".into(),
        confirmed_seq: n,
        chunk_seq: None,
        chunk_offset: 0,
        updated_ms: 0,
    })?;
    let parent = format!("evt_{:016x}_00000000", n / 2);
    let rounds = 20_000;
    let start = Instant::now();
    for _ in 0..rounds {
        let cp = idx.checkpoint("a1", "c")?.expect("checkpoint stored");
        let foreign = idx.first_foreign_after(cp.confirmed_seq, "a1")?;
        let p = idx.event_by_id(&parent)?;
        assert!(foreign.is_none() && p.is_some());
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / rounds as f64)
}

/// The row of one shared-room run: accepted turns/s, as a ratio to one writer alone (gated,
/// in its own room, `single` turns/s measured right before) and to raw commits, refusals per
/// accepted turn (p50/p99 in the latency columns), the bytes of pages handed back per
/// accepted turn and the spread per agent.
fn shared_row(writers: usize, label: &str, mut sh: Shared, single: f64, base: f64) -> Row {
    let (p50, p99) = (pct(&mut sh.refusals, 0.5), pct(&mut sh.refusals, 0.99));

    sh.per_agent.sort_unstable();
    let n = sh.per_agent.len().max(1) as f64;
    let mean = sh.accepted as f64 / n;
    let var = sh
        .per_agent
        .iter()
        .map(|x| (*x as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    let ratio = format!(
        "{:.2}x one writer ({single:.0}/s, measured right before), {:.2}x raw",
        sh.per_s / single,
        sh.per_s / base
    );
    Row {
        name: format!("{writers} agents in one room, {label}"),
        per_s: sh.per_s,
        p50_us: p50,
        p99_us: p99,
        note: format!(
            "{ratio}; refusals per turn in the p50/p99 columns; {:.0} B re-read per turn; per agent min {} max {} (cv {:.2}){}",
            sh.reread_bytes as f64 / sh.accepted.max(1) as f64,
            sh.per_agent.first().copied().unwrap_or(0),
            sh.per_agent.last().copied().unwrap_or(0),
            if mean > 0.0 { var.sqrt() / mean } else { 0.0 },
            if sh.queue_refused > 0 {
                format!("; {} refused by the turnstile", sh.queue_refused)
            } else {
                String::new()
            }
        ),
    }
}

fn bench(a: &BenchArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let secs = a.seconds;
    eprintln!("measuring in {} for {secs} s per row …", dir.display());
    let tmp = tempfile::tempdir_in(&dir)?;
    let raw = raw_sqlite(tmp.path(), secs)?;
    let base = raw.per_s;
    let mut rows = vec![raw];
    let wanted = |name: &str| a.only.as_deref().is_none_or(|o| name.contains(o));
    // the pipeline's rows, then (for comparison) each turn syncing its own journal
    let sizes = [1usize, 8, 64, 256].map(|w| (w, JournalSync::Pipeline));
    let per_append = [1usize, 64].map(|w| (w, JournalSync::PerAppend));
    for (writers, sync) in sizes
        .into_iter()
        .chain(per_append)
        .filter(|(w, _)| *w <= a.writers_max)
        .filter(|(w, s)| (*w == 1 && *s == JournalSync::Pipeline) || wanted(&own_row(*w, *s)))
    {
        eprintln!("  {}", own_row(writers, sync));
        let Own {
            per_s,
            mut lat,
            appends_per_sync,
            cpu_us_per_turn,
        } = own_rooms(&dir, writers, secs, &Store::Embedded(sync))?;
        let batching = appends_per_sync
            .map(|(n, busy)| {
                format!(
                    "; {n:.1} appends per fdatasync; log busy {:.0} %",
                    busy * 100.0
                )
            })
            .unwrap_or_default();
        let batching = format!("{batching}; {cpu_us_per_turn:.0} µs CPU per turn");
        rows.push(Row {
            name: own_row(writers, sync),
            per_s,
            p50_us: pct(&mut lat, 0.5),
            p99_us: pct(&mut lat, 0.99),
            note: format!("{:.2}x raw{batching}", per_s / base),
        });
    }
    for writers in [10usize, 100].into_iter().filter(|w| *w <= a.writers_max) {
        for (how, label) in [
            (Loop::ConfirmThenAct, "confirm, then act"),
            (Loop::ReadThrough, "read_through"),
        ] {
            if !wanted(&format!("{writers} agents in one room, {label}")) {
                continue;
            }
            // the one-writer rate again, right before: this disk drifts by a third within
            // minutes, and the ratio is to the rate under the same conditions
            let pipeline = Store::Embedded(JournalSync::Pipeline);
            let single = own_rooms(&dir, 1, secs, &pipeline)?.per_s;
            eprintln!("  {writers} agents in one room ({label}) …");
            let sh = shared_room(&dir, a.config.as_deref(), writers, secs, how, &pipeline)?;
            rows.push(shared_row(writers, label, sh, single, base));
        }
    }
    let gate = if wanted("gate check") {
        eprintln!("  gate cost at 10 k and {} events …", a.history);
        Some((gate_cost(&dir, 10_000)?, gate_cost(&dir, a.history)?))
    } else {
        None
    };
    println!(
        "{:<58} {:>12} {:>10} {:>10}  note",
        "row", "per second", "p50 µs", "p99 µs"
    );
    for r in &rows {
        let f = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into());
        println!(
            "{:<58} {:>12.0} {:>10} {:>10}  {}",
            r.name,
            r.per_s,
            f(r.p50_us),
            f(r.p99_us),
            r.note
        );
    }
    if let Some((small, large)) = gate {
        println!(
            "{:<58} {:>12} {:>10.1} {:>10}  µs per check",
            "gate check, 10 k events of history", "-", small, "-"
        );
        println!(
            "{:<58} {:>12} {:>10.1} {:>10}  {:.2}x the 10 k cost",
            format!("gate check, {} events of history", a.history),
            "-",
            large,
            "-",
            large / small
        );
    }
    Ok(())
}
