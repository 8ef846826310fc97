//! `room bench wakes`: how long a `send` takes to reach a running worker, through a real daemon
//! and Room's scripted agent (`room agent-script`), for 1, 16 and 64 recipients of one send;
//! and how long stopping a 50-process tree in an owned job takes until zero processes are
//! observed. Each is a ratio to a baseline measured in the same run: spawning and reaping the
//! same binary directly, and killing and reaping one process. Then `room cancel` of a room
//! whose worker runs a tree of 1, 10 and 100 processes that ignore SIGTERM, until the stop
//! outbox holds its committed phase 2.

use crate::bench::{BenchArgs, pct};
use room_server::client::Client;
use room_server::daemon::{Background, ServeConfig};
use room_server::wire::Request;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// Recipients of one send, per row.
const RECIPIENTS: [usize; 3] = [1, 16, 64];
/// Sends per row: each to fresh recipients, so no recipient's cooldown is measured.
const ROUNDS: [usize; 3] = [8, 2, 1];
/// Processes in the tree a stop must end.
const TREE: usize = 50;
const STOPS: usize = 10;

fn call(sock: &Path, req: Request) -> anyhow::Result<Value> {
    let op = req.op.clone();
    let r = Client::connect(sock)?.call(&req)?;
    r.result
        .ok_or_else(|| anyhow::anyhow!("{op} refused: {:?}", r.refusal))
}

fn owner(sock: &Path, op: &str, args: Value) -> anyhow::Result<Value> {
    call(sock, Request::new(op, args))
}

fn agent(sock: &Path, token: &str, op: &str, args: Value) -> anyhow::Result<Value> {
    call(sock, Request::new(op, args).with_token(Some(token)))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    eprintln!("measuring wakes in {} …", dir.display());
    let exe = std::env::current_exe()?;
    let spawn = spawn_baseline(&exe)?;
    println!(
        "{:<44} {:>9} {:>9} {:>12}  ratio p50",
        "row", "p50 ms", "p99 ms", "spawn ms"
    );
    let lat = send_to_claim(&dir, &exe)?;
    for (n, mut l) in RECIPIENTS.iter().zip(lat) {
        let (p50, p99) = (pct(&mut l, 0.5), pct(&mut l, 0.99));
        println!(
            "{:<44} {:>9.1} {:>9.1} {:>12.2}  {:.1}x",
            format!("send -> worker claim, {n} recipient(s)"),
            p50.unwrap_or(0.0) / 1e3,
            p99.unwrap_or(0.0) / 1e3,
            spawn * 1e3,
            p50.unwrap_or(0.0) / 1e6 / spawn.max(1e-9)
        );
    }
    stops()?;
    cancels(&dir, &exe)
}

/// Process trees a cancel must end, per row, and cancels per row.
const CANCEL_TREES: [usize; 3] = [1, 10, 100];
const CANCELS: usize = 5;

/// `room cancel` of a room whose worker runs a tree of N processes that ignore SIGTERM,
/// through a real daemon, until the stop outbox holds its committed phase 2 (zero processes
/// observed): the observer, the two fsynced phase files and both journal records included.
fn cancels(dir: &Path, exe: &Path) -> anyhow::Result<()> {
    let mut config = String::new();
    let mut workers = Vec::new();
    for (row, n) in CANCEL_TREES.iter().enumerate() {
        for i in 0..CANCELS {
            config.push_str(&format!(
                "[routes.c{row}x{i}]\nadapter = \"command\"\ncommand = [\"/bin/sh\", \"-c\", \
                 \"trap '' TERM; for i in $(seq {kids}); do /usr/bin/sleep 600 & done; echo ready; exec /usr/bin/sleep 600\"]\n\
                 timeout_ms = 120000\n\n",
                kids = n - 1
            ));
            workers.push(format!("c{row}x{i}"));
        }
    }
    let b = bench_daemon(dir, exe, "bench-cancel", &config, &workers)?;
    let (sock, state, boss) = (b.sock.clone(), b.state.clone(), b.boss.clone());
    // the baseline: one owner call that commits one record (a reset of another room)
    owner(
        &sock,
        "room_create",
        json!({"name": "base", "members": ["boss"]}),
    )?;
    let mut commit = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        owner(&sock, "room_reset", json!({"room": "base"}))?;
        commit.push(start.elapsed());
    }
    let commit = pct(&mut commit, 0.5).unwrap_or(0.0);
    let mut done = 0;
    for (row, n) in CANCEL_TREES.iter().enumerate() {
        let mut lat = Vec::new();
        for i in 0..CANCELS {
            catch_up(&sock, &boss)?;
            let to = format!("c{row}x{i}");
            agent(
                &sock,
                &boss,
                "send",
                json!({"room": "bench", "to": [to], "text": "go"}),
            )?;
            wait_ready(&sock, &state, &to)?;
            let start = Instant::now();
            owner(&sock, "room_cancel", json!({"room": "bench"}))?;
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let l = owner(&sock, "stops_list", json!({}))?;
                let settled = l["stops"].as_array().map_or(0, |s| {
                    s.iter()
                        .filter(|s| s["committed"]["phase_2"] == true)
                        .count()
                });
                if settled > done {
                    break;
                }
                anyhow::ensure!(Instant::now() < deadline, "a cancel was never confirmed");
                std::thread::sleep(Duration::from_millis(1));
            }
            lat.push(start.elapsed());
            done += 1;
            owner(&sock, "room_resume", json!({"room": "bench"}))?;
        }
        let (p50, p99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
        println!(
            "{:<44} {:>9.2} {:>9.2} {:>12.3}  {:.1}x",
            format!("room cancel -> zero processes, {n}-process tree"),
            p50.unwrap_or(0.0) / 1e3,
            p99.unwrap_or(0.0) / 1e3,
            commit / 1e3,
            p50.unwrap_or(0.0) / commit.max(1e-9)
        );
    }
    println!(
        "(cancel rows: through the daemon until the stop's phase 2 is committed; baseline: one owner call committing one record)"
    );
    drop(b.daemon);
    Ok(())
}

/// Wait until `agent`'s worker has started its whole tree (it says `ready`).
fn wait_ready(sock: &Path, state: &Path, agent: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let w = owner(sock, "wakes_list", json!({"room": "bench"}))?;
        // claimed (running), so that the cancel meets a running worker, not an unclaimed one
        let launch = w["wakes"].as_array().and_then(|ws| {
            ws.iter()
                .filter(|w| w["agent"] == agent && w["launches"][0]["state"] == "running")
                .find_map(|w| w["launches"][0]["launch"].as_str().map(String::from))
        });
        if let Some(l) = launch {
            let out = state.join("workers").join(&l).join("stdout.log");
            if std::fs::read_to_string(out).is_ok_and(|s| s.contains("ready")) {
                return Ok(());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "{agent}'s tree never started");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Seconds to spawn `room agent-script --steps ''` and reap it (the median of 20).
fn spawn_baseline(exe: &Path) -> anyhow::Result<f64> {
    let mut t = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        std::process::Command::new(exe)
            .args(["agent-script", "--steps", ""])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?;
        t.push(start.elapsed());
    }
    Ok(pct(&mut t, 0.5).unwrap_or(0.0) / 1e6)
}

/// A daemon on a throw-away state dir under `dir` with `config`, the coordinator `boss`
/// enrolled, and `workers` enrolled beside it in room `bench`: the daemon (with its directory,
/// which goes with it), its state dir and socket, and boss's token.
struct BenchDaemon {
    daemon: Background,
    state: std::path::PathBuf,
    sock: std::path::PathBuf,
    boss: String,
    _tmp: tempfile::TempDir,
}

fn bench_daemon(
    dir: &Path,
    exe: &Path,
    instance: &str,
    config: &str,
    workers: &[String],
) -> anyhow::Result<BenchDaemon> {
    let tmp = tempfile::tempdir_in(dir)?;
    let root = std::fs::canonicalize(tmp.path())?;
    let (state, boot) = (root.join("state"), root.join("boot.toml"));
    room_store::statedir::init(&state, &boot, instance)?;
    std::fs::write(state.join("config.toml"), config)?;
    let daemon = Background::start_with(ServeConfig {
        state_dir: state.clone(),
        bootstrap: boot,
        listen: None,
        engine_threads: room_server::daemon::engine_threads_default(),
        limits: Default::default(),
        room_exe: Some(exe.to_path_buf()),
        store: None,
    })?;
    let sock = daemon.socket.clone();
    let boss = owner(
        &sock,
        "agent_enroll",
        json!({"name": "boss", "max_tier": "coordinator"}),
    )?["token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut members = vec!["boss".to_string()];
    for w in workers {
        owner(&sock, "agent_enroll", json!({"name": w}))?;
        members.push(w.clone());
    }
    owner(
        &sock,
        "room_create",
        json!({"name": "bench", "members": members}),
    )?;
    Ok(BenchDaemon {
        daemon,
        state,
        sock,
        boss,
        _tmp: tmp,
    })
}

/// Per row, the latency from each send's answer to each of its launches' claim.
fn send_to_claim(dir: &Path, exe: &Path) -> anyhow::Result<Vec<Vec<Duration>>> {
    let total: usize = RECIPIENTS.iter().zip(ROUNDS).map(|(n, r)| n * r).sum();
    let mut config = String::from("[dispatch]\nworkers_max = 64\n\n");
    for i in 0..total {
        config.push_str(&format!(
            "[routes.w{i}]\nadapter = \"script\"\nsteps = [\"read\"]\n\n"
        ));
    }
    let workers: Vec<String> = (0..total).map(|i| format!("w{i}")).collect();
    let b = bench_daemon(dir, exe, "bench-wakes", &config, &workers)?;
    let (sock, boss) = (b.sock.clone(), b.boss.clone());
    let mut next = 0;
    let mut rows = Vec::new();
    for (n, rounds) in RECIPIENTS.iter().zip(ROUNDS) {
        let mut lat = Vec::new();
        for _ in 0..rounds {
            let to: Vec<String> = (next..next + n).map(|i| format!("w{i}")).collect();
            next += n;
            catch_up(&sock, &boss)?;
            let sent = agent(
                &sock,
                &boss,
                "send",
                json!({"room": "bench", "to": to, "text": "go"}),
            )?;
            let at = now_ms();
            let source = sent["event"].as_str().unwrap_or_default().to_string();
            for started in claims(&sock, &source, *n)? {
                lat.push(Duration::from_millis(started.saturating_sub(at)));
            }
        }
        rows.push(lat);
    }
    drop(b.daemon);
    Ok(rows)
}

fn catch_up(sock: &Path, token: &str) -> anyhow::Result<()> {
    let mut page = agent(sock, token, "sync", json!({"room": "bench"}))?;
    for _ in 0..1_000 {
        // confirming answers with the next page: caught up once that one is empty
        if page["items"].as_array().is_some_and(Vec::is_empty) {
            return Ok(());
        }
        let receipt = page["receipt"].clone();
        page = agent(
            sock,
            token,
            "sync",
            json!({"room": "bench", "confirm": receipt}),
        )?;
    }
    anyhow::bail!("never caught up")
}

/// When each of `n` launches of `source`'s permits was claimed (its worker running), waiting
/// at most 60 s.
fn claims(sock: &Path, source: &str, n: usize) -> anyhow::Result<Vec<u64>> {
    let start = Instant::now();
    loop {
        let all = owner(sock, "wakes_list", json!({"room": "bench"}))?;
        let started: Vec<u64> = all["wakes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|w| w["source_event"] == source)
            .filter_map(|w| w["launches"][0]["started_ms"].as_u64())
            .collect();
        if started.len() >= n {
            return Ok(started);
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(60),
            "only {} of {n} workers were claimed",
            started.len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Stop a tree of `TREE` processes in an owned job until zero are observed, against killing
/// and reaping one process.
fn stops() -> anyhow::Result<()> {
    let jobs = room_exec::job::Jobs::detect(&format!("bench{}", std::process::id()));
    let cgroup = jobs.base().is_some();
    stops_in(&jobs)?;
    if cgroup {
        // what a machine without cgroup delegation gets
        stops_in(&room_exec::job::Jobs::subreapers("measured too"))?;
    }
    println!("(baseline of the stop rows: kill and reap one process)");
    Ok(())
}

fn stops_in(jobs: &room_exec::job::Jobs) -> anyhow::Result<()> {
    let (mut tree, mut one) = (Vec::new(), Vec::new());
    for i in 0..STOPS {
        let mut job = jobs.create(&format!("stop{i}"))?;
        let mut cmd = std::process::Command::new("/bin/sh");
        // a tree: the shell and TREE - 1 sleepers, half of them in sessions of their own
        cmd.arg("-c").arg(format!(
            "for i in $(seq {half}); do /usr/bin/sleep 600 & /usr/bin/setsid /usr/bin/sleep 600 & done; \
             /usr/bin/sleep 600 & wait",
            half = (TREE - 1) / 2
        ));
        job.prepare(&mut cmd);
        let mut child = cmd.spawn()?;
        job.started(child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while job.members().len() < TREE {
            anyhow::ensure!(Instant::now() < deadline, "the tree never grew");
            std::thread::sleep(Duration::from_millis(5));
        }
        let start = Instant::now();
        let s = job.stop(10_000);
        tree.push(start.elapsed());
        anyhow::ensure!(s.confirmed_empty, "a stop was not seen empty: {s:?}");
        let _ = child.wait();

        let mut single = std::process::Command::new("/usr/bin/sleep")
            .arg("600")
            .spawn()?;
        let start = Instant::now();
        single.kill()?;
        single.wait()?;
        one.push(start.elapsed());
    }
    if let Some(base) = jobs.base() {
        let _ = std::fs::remove_dir(base);
    }
    let (p50, p99, base) = (
        pct(&mut tree, 0.5),
        pct(&mut tree, 0.99),
        pct(&mut one, 0.5),
    );
    println!(
        "{:<44} {:>9.2} {:>9.2} {:>12.3}  {:.1}x",
        format!(
            "stop -> zero processes, {TREE}-process tree ({})",
            jobs.kind().as_str()
        ),
        p50.unwrap_or(0.0) / 1e3,
        p99.unwrap_or(0.0) / 1e3,
        base.unwrap_or(0.0) / 1e3,
        p50.unwrap_or(0.0) / base.unwrap_or(1.0).max(1e-9)
    );
    Ok(())
}
