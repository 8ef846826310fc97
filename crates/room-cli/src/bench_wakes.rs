//! `room bench wakes`: how long a `send` takes to reach a running worker, through a real daemon
//! and Room's scripted agent (`room agent-script`), for 1, 16 and 64 recipients of one send;
//! and how long stopping a 50-process tree in an owned job takes until zero processes are
//! observed. Each is a ratio to a baseline measured in the same run: spawning and reaping the
//! same binary directly, and killing and reaping one process.

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
    stops()
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

/// Per row, the latency from each send's answer to each of its launches' claim.
fn send_to_claim(dir: &Path, exe: &Path) -> anyhow::Result<Vec<Vec<Duration>>> {
    let total: usize = RECIPIENTS.iter().zip(ROUNDS).map(|(n, r)| n * r).sum();
    let tmp = tempfile::tempdir_in(dir)?;
    let root = std::fs::canonicalize(tmp.path())?;
    let (state, boot) = (root.join("state"), root.join("boot.toml"));
    room_store::statedir::init(&state, &boot, "bench-wakes")?;
    let mut config = String::from("[dispatch]\nworkers_max = 64\n\n");
    for i in 0..total {
        config.push_str(&format!(
            "[routes.w{i}]\nadapter = \"script\"\nsteps = [\"read\"]\n\n"
        ));
    }
    std::fs::write(state.join("config.toml"), config)?;
    let daemon = Background::start_with(ServeConfig {
        state_dir: state.clone(),
        bootstrap: boot,
        listen: None,
        engine_threads: room_server::daemon::engine_threads_default(),
        limits: Default::default(),
        room_exe: Some(exe.to_path_buf()),
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
    for i in 0..total {
        owner(&sock, "agent_enroll", json!({"name": format!("w{i}")}))?;
        members.push(format!("w{i}"));
    }
    owner(
        &sock,
        "room_create",
        json!({"name": "bench", "members": members}),
    )?;
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
    drop(daemon);
    Ok(rows)
}

fn catch_up(sock: &Path, token: &str) -> anyhow::Result<()> {
    let mut confirm: Option<String> = None;
    for _ in 0..1_000 {
        let mut args = json!({"room": "bench"});
        if let Some(c) = &confirm {
            args["confirm"] = json!(c);
        }
        let page = agent(sock, token, "sync", args)?;
        if page["more"] != true && confirm.is_some() {
            return Ok(());
        }
        confirm = page["receipt"].as_str().map(String::from);
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
    let (mut tree, mut one) = (Vec::new(), Vec::new());
    for i in 0..STOPS {
        let mut job = jobs.create(&format!("stop{i}"))?;
        let mut cmd = std::process::Command::new("/bin/sh");
        // a tree: the shell and TREE - 1 sleepers; in a cgroup job half of them in sessions of
        // their own (a process group job cannot see those, so there none leave it)
        let escape = if jobs.base().is_some() {
            "/usr/bin/setsid "
        } else {
            ""
        };
        cmd.arg("-c").arg(format!(
            "for i in $(seq {half}); do /usr/bin/sleep 600 & {escape}/usr/bin/sleep 600 & done; \
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
    println!("(baseline of the stop row: kill and reap one process)");
    Ok(())
}
