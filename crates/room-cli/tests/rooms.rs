//! Rooms past the descriptor limit, archived rooms, and room creation killed at any point: the
//! real daemon, through its socket and the `room` binary.

use room_server::client::Client;
use room_server::wire::{Request, Response};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

struct Dirs {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    config_home: PathBuf,
}

impl Dirs {
    fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let d = Dirs {
            state: root.join("state"),
            config_home: root.join("config"),
            _tmp: tmp,
        };
        assert!(d.room(&["init"]).status.success());
        d
    }

    fn room(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_room"))
            .args(args)
            .arg("--state-dir")
            .arg(&self.state)
            .env("XDG_CONFIG_HOME", &self.config_home)
            .env("ROOM_LOG", "error")
            .env_remove("ROOM_TOKEN")
            .output()
            .unwrap()
    }

    fn sock(&self) -> PathBuf {
        self.state.join("room.sock")
    }
}

/// Kills the daemon when the test ends, even by panic, so it never outlives the test.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `room serve`, under a descriptor limit (soft and hard) when one is given.
fn spawn(d: &Dirs, nofile: Option<u64>) -> Daemon {
    let mut cmd = match nofile {
        Some(n) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}"))
                .arg(env!("CARGO_BIN_EXE_room"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_room")),
    };
    let mut child = cmd
        .args(["serve", "--state-dir"])
        .arg(&d.state)
        .env("XDG_CONFIG_HOME", &d.config_home)
        .env("ROOM_LOG", "error")
        .spawn()
        .expect("room serve starts");
    // a start opens every room once (recovery), so a state dir of many rooms takes a while
    for _ in 0..12_000 {
        if let Ok(mut c) = Client::connect(&d.sock())
            && c.call(&req(None, "ping", json!({}))).is_ok()
        {
            return Daemon(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("daemon exited: {status}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("daemon did not come up");
}

fn req(token: Option<&str>, op: &str, args: Value) -> Request {
    Request::new(op, args).with_token(token)
}

fn call(sock: &Path, token: Option<&str>, op: &str, args: Value) -> Response {
    Client::connect(sock)
        .unwrap()
        .call(&req(token, op, args))
        .unwrap()
}

fn ok(r: Response) -> Value {
    assert!(r.ok, "{:?}", r.refusal);
    r.result.unwrap()
}

/// Read a room to its end, confirming each page.
fn catch_up(sock: &Path, token: &str, room: &str) -> Vec<Value> {
    let mut confirm: Option<String> = None;
    let mut events = Vec::new();
    loop {
        let page = ok(call(
            sock,
            Some(token),
            "sync",
            json!({"room": room, "confirm": confirm}),
        ));
        let items = page["items"].as_array().cloned().unwrap_or_default();
        if items.is_empty() && confirm.is_some() {
            return events;
        }
        events.extend(items);
        confirm = page["receipt"].as_str().map(String::from);
    }
}

fn enroll(sock: &Path, name: &str) -> String {
    ok(call(sock, None, "agent_enroll", json!({"name": name})))["token"]
        .as_str()
        .unwrap()
        .to_string()
}

/// More rooms than the daemon's descriptors could hold open at once: each room holds a log,
/// an index with its WAL and shared memory. Under a hard limit of 300 descriptors the daemon
/// keeps at most 4 rooms open; 120 rooms are created, written and read, before and after a
/// restart under the same limit, and every chain verifies.
#[test]
fn rooms_past_the_descriptor_limit_are_created_and_used() {
    // ROOM_TEST_ROOMS=100000 ROOM_TEST_NOFILE=1024 runs the full size by hand
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let rooms_n = env("ROOM_TEST_ROOMS", 120) as usize;
    let nofile = env("ROOM_TEST_NOFILE", 300);
    let open_max = ((nofile - 256) / 2 / 5).max(1);
    let d = Dirs::new();
    let sock = d.sock();
    let token = {
        let _daemon = spawn(&d, Some(nofile));
        let token = enroll(&sock, "alpha");
        for i in 0..rooms_n {
            ok(call(
                &sock,
                None,
                "room_create",
                json!({"name": format!("r{i}"), "members": ["alpha"]}),
            ));
        }
        for i in 0..rooms_n {
            let room = format!("r{i}");
            catch_up(&sock, &token, &room);
            ok(call(
                &sock,
                Some(&token),
                "note",
                json!({"room": room, "text": format!("note {i}")}),
            ));
        }
        let rooms = ok(call(&sock, None, "rooms", json!({})));
        assert_eq!(rooms["rooms"].as_array().unwrap().len(), rooms_n);
        assert_eq!(rooms["open_max"], open_max, "{}", rooms["open_max"]);
        assert!(rooms["open_now"].as_u64().unwrap() <= open_max);
        token
    };
    let _daemon = spawn(&d, Some(nofile));
    for i in (0..rooms_n).rev() {
        let room = format!("r{i}");
        ok(call(
            &sock,
            Some(&token),
            "note",
            json!({"room": room, "text": format!("again {i}")}),
        ));
        let log = ok(call(&sock, None, "room_log", json!({"room": room})));
        let texts: Vec<&str> = log["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["event"]["text"].as_str())
            .collect();
        assert_eq!(texts, [format!("note {i}"), format!("again {i}")], "{log}");
    }
    let verify = d.room(&["verify", "--json"]);
    let report: Value = serde_json::from_slice(&verify.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["rooms"].as_array().unwrap().len(), rooms_n);
}

/// An archived room refuses turns (`room_archived`, nothing written), still reads and verifies,
/// is archived once, and stays archived across a restart.
#[test]
fn an_archived_room_is_read_only_and_verifiable() {
    let d = Dirs::new();
    let sock = d.sock();
    let mut daemon = spawn(&d, None);
    let token = ok(call(
        &sock,
        None,
        "agent_enroll",
        json!({"name": "alpha", "max_tier": "coordinator"}),
    ))["token"]
        .as_str()
        .unwrap()
        .to_string();
    ok(call(
        &sock,
        None,
        "room_create",
        json!({"name": "old", "members": ["alpha"]}),
    ));
    catch_up(&sock, &token, "old");
    ok(call(
        &sock,
        Some(&token),
        "note",
        json!({"room": "old", "text": "last words"}),
    ));
    // a room with a claim under way is not archived: its lapse must stay recordable
    let task = ok(call(
        &sock,
        Some(&token),
        "task_create",
        json!({"room": "old", "title": "wrap up"}),
    ))["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    ok(call(
        &sock,
        Some(&token),
        "task_claim",
        json!({"task": task}),
    ));
    let tip_before = ok(call(&sock, None, "rooms", json!({})))["rooms"][0]["tip_seq"].clone();
    let refused = call(&sock, None, "room_archive", json!({"room": "old"}));
    assert_eq!(
        refused.refusal.unwrap().code.as_str(),
        "room_archive_refused"
    );
    let after = ok(call(&sock, None, "rooms", json!({})));
    assert_eq!(after["rooms"][0]["tip_seq"], tip_before, "nothing written");
    assert_eq!(after["rooms"][0]["archived"], false);
    ok(call(
        &sock,
        Some(&token),
        "blocked",
        json!({"room": "old", "task": task, "text": "parked"}),
    ));
    ok(call(
        &sock,
        Some(&token),
        "note",
        json!({"room": "old", "text": "last words"}),
    ));
    let archived = d.room(&["archive", "old"]);
    assert!(archived.status.success(), "{archived:?}");
    let tip = |sock: &Path| {
        ok(call(sock, None, "rooms", json!({})))["rooms"][0]["tip_seq"]
            .as_u64()
            .unwrap()
    };
    let before = tip(&sock);
    for round in 0..2 {
        let refused = call(
            &sock,
            Some(&token),
            "note",
            json!({"room": "old", "text": "more"}),
        );
        assert_eq!(
            refused.refusal.unwrap().code.as_str(),
            "room_archived",
            "round {round}"
        );
        assert_eq!(tip(&sock), before, "the refused turn wrote nothing");
        let again = call(&sock, None, "room_archive", json!({"room": "old"}));
        assert_eq!(again.refusal.unwrap().code.as_str(), "room_archived");
        let listed = ok(call(&sock, None, "rooms", json!({})));
        assert_eq!(listed["rooms"][0]["archived"], true);
        let log = ok(call(&sock, None, "room_log", json!({"room": "old"})));
        assert!(log.to_string().contains("last words"));
        // and across a restart
        let _ = daemon.0.kill();
        let _ = daemon.0.wait();
        let verify = d.room(&["verify", "old"]);
        assert!(verify.status.success(), "{verify:?}");
        daemon = spawn(&d, None);
    }
}

/// SIGKILL while rooms are being created, several times: after every restart each room the
/// daemon lists verifies, every acknowledged creation is there, and the room space holds
/// nothing but the shards of listed rooms (no half-made directory for `verify` to trip on).
#[test]
fn a_room_creation_killed_at_any_point_leaves_a_whole_room_or_none() {
    const ROUNDS: usize = 6;
    let d = Dirs::new();
    let sock = d.sock();
    let mut acked: Vec<String> = Vec::new();
    let mut n = 0;
    for round in 0..ROUNDS {
        let mut daemon = spawn(&d, None);
        let listed = ok(call(&sock, None, "rooms", json!({})));
        let names: Vec<String> = listed["rooms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["room"].as_str().unwrap().to_string())
            .collect();
        for a in &acked {
            assert!(
                names.contains(a),
                "round {round}: acknowledged room {a} is gone"
            );
        }
        let shards = room_store::shard::on_disk(&d.state.join("rooms")).unwrap();
        let entries = std::fs::read_dir(d.state.join("rooms")).unwrap().count();
        assert_eq!(
            entries,
            names.len(),
            "round {round}: stray entries in the room space"
        );
        assert_eq!(shards.len(), names.len());
        let verify = d.room(&["verify", "--json"]);
        assert!(verify.status.success(), "round {round}: {verify:?}");
        // create rooms from another thread and kill the daemon under it
        let creator = {
            let sock = sock.clone();
            let start = n;
            std::thread::spawn(move || {
                let mut made = Vec::new();
                for i in start..start + 400 {
                    let name = format!("c{i}");
                    let Ok(mut c) = Client::connect(&sock) else {
                        break;
                    };
                    match c.call(&req(None, "room_create", json!({"name": name}))) {
                        Ok(r) if r.ok => made.push(name),
                        _ => break,
                    }
                }
                made
            })
        };
        std::thread::sleep(Duration::from_millis(40 + 37 * round as u64));
        daemon.0.kill().unwrap(); // SIGKILL
        let _ = daemon.0.wait();
        let made = creator.join().unwrap();
        n += 400;
        acked.extend(made);
    }
    assert!(!acked.is_empty(), "some creations were acknowledged");
    let _daemon = spawn(&d, None);
    let listed = ok(call(&sock, None, "rooms", json!({})));
    assert!(listed["rooms"].as_array().unwrap().len() >= acked.len());
}
