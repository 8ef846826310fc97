//! `room bench`: throughput and latency of gated turns through the engine, as ratios to raw
//! SQLite single-row commits (WAL, synchronous=FULL) measured in the same run on the same disk,
//! so the numbers mean something on a noisy machine. Also the Work Gate's cost at 10 k and 1 M
//! events of history, and what sharing one room costs (the gate serializes a room by design).

use room_core::{Code, Tier, Verb};
use room_engine::principal::AgentCaller;
use room_engine::verbs::TurnArgs;
use room_engine::{Engine, EngineConfig};
use room_store::RoomIndex;
use room_store::index::{Batch, CheckpointRow, EventRow, Index};
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
    /// processes are observed against killing one).
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
        "core" => bench(a),
        "mcp" => crate::bench_mcp::bench(a),
        "swarm" => crate::bench_mcp::swarm(a),
        "acceptance" => crate::bench_accept::bench(a),
        "wakes" => crate::bench_wakes::bench(a),
        other => {
            eprintln!(
                "error[invalid_argument]: what: {other:?} is not core, mcp, swarm, acceptance or wakes"
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

struct World {
    _tmp: tempfile::TempDir,
    engine: Arc<Engine>,
}

fn world(dir: &Path) -> anyhow::Result<World> {
    let tmp = tempfile::tempdir_in(dir)?;
    let root = std::fs::canonicalize(tmp.path())?;
    let state = room_store::statedir::init(&root.join("state"), &root.join("boot.toml"), "bench")?;
    let store = room_server::daemon::embedded_store(&state);
    let engine = Engine::open(
        state,
        room_server::daemon::real_env(),
        store,
        EngineConfig::default(),
    )?;
    Ok(World {
        _tmp: tmp,
        engine: Arc::new(engine),
    })
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

fn caller(e: &Engine, name: &str) -> anyhow::Result<AgentCaller> {
    let t = e
        .enroll(&owner(e), name, Tier::Member, "bench")
        .map_err(anyhow::Error::msg)?;
    Ok(AgentCaller {
        token: t.token,
        conversation: "bench".into(),
        declared_tier: None,
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

/// `writers` agents, each alone in its own room, writing notes for `secs`.
pub(crate) fn own_rooms(
    dir: &Path,
    writers: usize,
    secs: f64,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    let w = world(dir)?;
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
    Ok((all.len() as f64 / start.elapsed().as_secs_f64(), all))
}

/// `writers` agents sharing one room: each reads, then writes; count what the gate refuses.
fn shared_room(dir: &Path, writers: usize, secs: f64) -> anyhow::Result<(f64, u64, u64, u64)> {
    let w = world(dir)?;
    let names: Vec<String> = (0..writers).map(|i| format!("w{i}")).collect();
    let mut callers = vec![];
    for n in &names {
        callers.push(caller(&w.engine, n)?);
    }
    w.engine
        .room_create(&owner(&w.engine), "shared", None, &names)
        .map_err(anyhow::Error::msg)?;
    let start = Instant::now();
    let threads: Vec<_> = callers
        .into_iter()
        .map(|a| {
            let e = w.engine.clone();
            std::thread::spawn(move || {
                let (mut ok, mut required, mut arrival, mut i) = (0u64, 0u64, 0u64, 0u64);
                while start.elapsed().as_secs_f64() < secs {
                    i += 1;
                    if catch_up(&e, &a, "shared").is_err() {
                        continue;
                    }
                    match e.turn(&a, Verb::Note, note("shared", i)) {
                        Ok(_) => ok += 1,
                        Err(r) if r.code == Code::RoomSyncRequired => required += 1,
                        Err(r) if r.code == Code::RoomSyncConcurrentArrival => arrival += 1,
                        Err(r) => panic!("unexpected refusal {r}"),
                    }
                }
                (ok, required, arrival)
            })
        })
        .collect();
    let (mut ok, mut req, mut arr) = (0, 0, 0);
    for t in threads {
        let (a, b, c) = t.join().map_err(|_| anyhow::anyhow!("writer panicked"))?;
        ok += a;
        req += b;
        arr += c;
    }
    Ok((ok as f64 / start.elapsed().as_secs_f64(), ok, req, arr))
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

fn bench(a: &BenchArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let secs = a.seconds;
    eprintln!("measuring in {} for {secs} s per row …", dir.display());
    let tmp = tempfile::tempdir_in(&dir)?;
    let raw = raw_sqlite(tmp.path(), secs)?;
    let base = raw.per_s;
    let mut rows = vec![raw];
    for writers in [1usize, 8, 64, 256]
        .into_iter()
        .filter(|w| *w <= a.writers_max)
    {
        eprintln!("  {writers} writer(s), own rooms …");
        let (per_s, mut lat) = own_rooms(&dir, writers, secs)?;
        rows.push(Row {
            name: format!("gated turns, {writers} writer(s) each in its own room"),
            per_s,
            p50_us: pct(&mut lat, 0.5),
            p99_us: pct(&mut lat, 0.99),
            note: format!("{:.2}x raw", per_s / base),
        });
    }
    for writers in [8usize, 64].into_iter().filter(|w| *w <= a.writers_max) {
        eprintln!("  {writers} writers sharing one room …");
        let (per_s, ok, req, arr) = shared_room(&dir, writers, secs)?;
        let tried = (ok + req + arr).max(1) as f64;
        rows.push(Row {
            name: format!("accepted turns, {writers} writers sharing one room"),
            per_s,
            p50_us: None,
            p99_us: None,
            note: format!(
                "{:.2}x raw; refused {:.0}% room_sync_required, {:.0}% room_sync_concurrent_arrival",
                per_s / base,
                req as f64 * 100.0 / tried,
                arr as f64 * 100.0 / tried
            ),
        });
    }
    eprintln!("  gate cost at 10 k and {} events …", a.history);
    let small = gate_cost(&dir, 10_000)?;
    let large = gate_cost(&dir, a.history)?;
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
    Ok(())
}
