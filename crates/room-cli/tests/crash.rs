//! Crash test: the real daemon under concurrent writers, killed with SIGKILL at random moments,
//! many times. After every restart each room's chain verifies, every acknowledged event is
//! present, and at most the one turn each writer had in flight appears without an ack.

use room_server::client::Client;
use room_server::wire::{Request, Response};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WRITERS: usize = 4;
const ROUNDS: usize = 8;

struct Dirs {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    config_home: PathBuf,
}

/// Kills the daemon when the test ends, even by panic, so it never outlives the test.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(d: &Dirs) -> Daemon {
    let mut child = Command::new(env!("CARGO_BIN_EXE_room"))
        .args(["serve", "--state-dir"])
        .arg(&d.state)
        .env("XDG_CONFIG_HOME", &d.config_home)
        .env("ROOM_LOG", "error")
        .spawn()
        .expect("room serve starts");
    for _ in 0..1000 {
        if let Ok(mut c) = Client::connect(&d.state.join("room.sock"))
            && c.call(&req(None, "ping", json!({}))).is_ok()
        {
            return Daemon(child);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("daemon did not come up");
}

fn req(token: Option<&str>, op: &str, args: Value) -> Request {
    Request {
        op: op.into(),
        token: token.map(String::from),
        conversation: None,
        tier: None,
        args,
        meta: None,
        page_bytes_max: None,
    }
}

fn call(sock: &Path, token: Option<&str>, op: &str, args: Value) -> Response {
    Client::connect(sock)
        .unwrap()
        .call(&req(token, op, args))
        .unwrap()
}

fn catch_up(c: &mut Client, token: &str, room: &str) -> Option<()> {
    let mut confirm: Option<String> = None;
    loop {
        let r = c
            .call(&req(
                Some(token),
                "sync",
                json!({"room": room, "confirm": confirm}),
            ))
            .ok()?;
        let page = r.result?;
        if page["items"].as_array().is_some_and(Vec::is_empty) {
            return Some(());
        }
        confirm = page["receipt"].as_str().map(String::from);
    }
}

/// Write until the daemon dies; return the event ids it acknowledged.
fn writer(
    sock: PathBuf,
    token: String,
    room: String,
    acked: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
) {
    let Ok(mut c) = Client::connect(&sock) else {
        return;
    };
    if catch_up(&mut c, &token, &room).is_none() {
        return;
    }
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        match c.call(&req(
            Some(&token),
            "say",
            json!({"room": room, "text": format!("turn {n}")}),
        )) {
            Ok(r) if r.ok => acked
                .lock()
                .unwrap()
                .push(r.result.unwrap()["event"].as_str().unwrap().to_string()),
            Ok(r) => panic!("unexpected refusal: {:?}", r.refusal),
            Err(_) => return,
        }
    }
}

fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn sigkill_under_load_loses_no_acknowledged_event() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let d = Dirs {
        state: root.join("state"),
        config_home: root.join("config"),
        _tmp: tmp,
    };
    room_store::statedir::init(
        &d.state,
        &d.config_home.join("room/bootstrap.toml"),
        "crash-test",
    )
    .unwrap();
    let sock = d.state.join("room.sock");
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("crash test seed {seed}");

    let mut child = spawn(&d);
    let mut agents = vec![];
    for i in 0..WRITERS {
        let name = format!("w{i}");
        let r = call(&sock, None, "agent_enroll", json!({"name": name}));
        let token = r.result.unwrap()["token"].as_str().unwrap().to_string();
        let room = format!("room{i}");
        assert!(
            call(
                &sock,
                None,
                "room_create",
                json!({"name": room, "members": [name]})
            )
            .ok
        );
        agents.push((token, room));
    }
    let acked: Vec<Arc<Mutex<Vec<String>>>> =
        (0..WRITERS).map(|_| Arc::new(Mutex::new(vec![]))).collect();
    for round in 0..ROUNDS {
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = agents
            .iter()
            .zip(&acked)
            .map(|((t, r), a)| {
                let (sock, t, r, a, stop) =
                    (sock.clone(), t.clone(), r.clone(), a.clone(), stop.clone());
                std::thread::spawn(move || writer(sock, t, r, a, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50 + next(&mut seed) % 250));
        child.0.kill().unwrap(); // SIGKILL
        child.0.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        child = spawn(&d);
        for (i, (_, room)) in agents.iter().enumerate() {
            let log = call(
                &sock,
                None,
                "room_log",
                json!({"room": room, "limit": 1000}),
            );
            let mut from = 1;
            let mut present: HashSet<String> = HashSet::new();
            let mut log = log.result.unwrap();
            loop {
                let events = log["events"].as_array().unwrap().clone();
                for e in &events {
                    if e["kind"] == "turn" {
                        present.insert(e["id"].as_str().unwrap().to_string());
                    }
                }
                if events.len() < 1000 {
                    break;
                }
                from += 1000;
                log = call(
                    &sock,
                    None,
                    "room_log",
                    json!({"room": room, "from": from, "limit": 1000}),
                )
                .result
                .unwrap();
            }
            let acked_here: HashSet<String> = acked[i].lock().unwrap().iter().cloned().collect();
            let missing: Vec<_> = acked_here.difference(&present).collect();
            assert!(
                missing.is_empty(),
                "round {round}, {room}: acknowledged events lost: {missing:?}"
            );
            let unacked = present.difference(&acked_here).count();
            assert!(
                unacked <= round + 1,
                "round {round}, {room}: {unacked} turns present without ack (at most one in flight per round)"
            );
        }
        let verify = Command::new(env!("CARGO_BIN_EXE_room"))
            .args(["verify", "--json", "--state-dir"])
            .arg(&d.state)
            .env("XDG_CONFIG_HOME", &d.config_home)
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "round {round}: verify failed: {}",
            String::from_utf8_lossy(&verify.stdout)
        );
    }
    let total: usize = acked.iter().map(|a| a.lock().unwrap().len()).sum();
    eprintln!("{total} acknowledged turns survived {ROUNDS} SIGKILLs");
    assert!(total > 0, "the writers made progress");
    drop(child);
}
