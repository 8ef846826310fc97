//! Crash tests of the proposal outbox: the real daemon aborts (as a kill -9 would stop it)
//! after a proposal's intention is durable but before it is applied, and after it is applied
//! but before its outcome is journaled. At the next start the live row decides: the first is
//! journaled `not_applied`, the second `applied`, each once and marked `recovered`, and the
//! outbox is empty.

use room_server::client::Client;
use room_server::wire::Request;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(state: &Path, config_home: &Path, fault: Option<&str>) -> Daemon {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_room"));
    cmd.args(["serve", "--state-dir"])
        .arg(state)
        .env("XDG_CONFIG_HOME", config_home)
        .env("ROOM_LOG", "error")
        .env_remove("ROOM_FAULT");
    if let Some(f) = fault {
        cmd.env("ROOM_FAULT", f);
    }
    let mut child = cmd.spawn().expect("room serve starts");
    for _ in 0..1000 {
        if let Ok(mut c) = Client::connect(&state.join("room.sock"))
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

fn ok(state: &Path, token: Option<&str>, op: &str, args: Value) -> Value {
    let r = Client::connect(&state.join("room.sock"))
        .unwrap()
        .call(&req(token, op, args.clone()))
        .unwrap();
    assert!(r.ok, "{op} {args}: {:?}", r.refusal);
    r.result.unwrap()
}

fn proposals(state: &Path) -> Vec<Value> {
    let log = ok(
        state,
        None,
        "room_log",
        json!({"room": "build", "limit": 1000}),
    );
    log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e.to_string().contains("\"proposal_"))
        .cloned()
        .collect()
}

const DATA: &[u8] = br#"[{"id":1,"v":1,"name":"a"},{"id":2,"v":1,"name":"b"}]"#;

/// Propose under a daemon that aborts at `fault`; restart; the recovered record comes back
/// with the live file.
/// Also the task's staging pin of the source afterwards.
fn crash_at(fault: &str) -> (Vec<Value>, Vec<u8>, Vec<std::fs::DirEntry>, Value) {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let (state, config_home) = (root.join("state"), root.join("config"));
    room_store::statedir::init(&state, &config_home.join("room/bootstrap.toml"), "p-crash")
        .unwrap();
    let project = root.join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("data.json"), DATA).unwrap();
    let mut d = spawn(&state, &config_home, Some(fault));
    let a = ok(
        &state,
        None,
        "agent_enroll",
        json!({"name": "alpha", "max_tier": "coordinator"}),
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    let b = ok(
        &state,
        None,
        "agent_enroll",
        json!({"name": "beta", "max_tier": "member"}),
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    let pid = ok(&state, None, "project_open", json!({"path": project}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    ok(
        &state,
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta"]}),
    );
    let stage = json!([{"path": "data.json", "sha256": room_core::sha256_hex(DATA),
        "project": {"format": "json", "key": "id", "version": "v", "columns": ["name"]}}]);
    let task = ok(
        &state,
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "rename", "to": "beta", "stage": stage}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    ok(&state, Some(&b), "task_claim", json!({"task": task}));
    // beta has read everything before it proposes
    let mut page = ok(&state, Some(&b), "sync", json!({"room": "build"}));
    while page["more"] == true || page["items"].as_array().is_some_and(|a| !a.is_empty()) {
        page = ok(
            &state,
            Some(&b),
            "sync",
            json!({"room": "build", "confirm": page["receipt"]}),
        );
    }
    // the daemon aborts inside this call: no answer comes back
    let answer = Client::connect(&state.join("room.sock")).unwrap().call(&req(
        Some(&b),
        "task_propose",
        json!({"task": task, "path": "data.json", "key": "2", "version": 1, "set": {"name": "z"}}),
    ));
    assert!(
        answer.is_err() || !answer.as_ref().unwrap().ok,
        "{answer:?}"
    );
    let start = Instant::now();
    while d.0.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the daemon never aborted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_dir(state.join("proposals"))
            .unwrap()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .count(),
        1,
        "the intention outlived the crash"
    );
    drop(d);
    let _d = spawn(&state, &config_home, None);
    let start = Instant::now();
    // the record is journaled before the intention is removed: wait for both, so a test
    // that reads the outbox between the two does not see a half-finished recovery
    let outbox = || -> Vec<_> {
        std::fs::read_dir(state.join("proposals"))
            .unwrap()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .collect()
    };
    let (recs, left) = loop {
        let recs = proposals(&state);
        let left = outbox();
        if !recs.is_empty() && (left.is_empty() || start.elapsed() > Duration::from_secs(30)) {
            break (recs, left);
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never recovered");
        std::thread::sleep(Duration::from_millis(50));
    };
    let pin =
        ok(&state, None, "owner_task_show", json!({"task": task}))["task"]["stage"][0]["sha256"]
            .clone();
    // the recovered record is the daemon's word, not beta's act: beta never saw it, and must
    // read it before it acts again
    assert_eq!(recs[0]["actor"], "room", "{}", recs[0]);
    assert_eq!(body(&recs[0])["worker"], "beta", "{}", recs[0]);
    let r = Client::connect(&state.join("room.sock"))
        .unwrap()
        .call(&req(
            Some(&b),
            "note",
            json!({"room": "build", "text": "did my change land?"}),
        ))
        .unwrap();
    assert_eq!(
        r.refusal.as_ref().map(|r| r.code.as_str()),
        Some("room_sync_required"),
        "{r:?}"
    );
    let unread = format!("unread events from seq {}", recs[0]["seq"]);
    assert!(
        r.refusal.unwrap().message.contains(&unread),
        "the record is what beta has not read"
    );
    (
        recs,
        std::fs::read(project.join("data.json")).unwrap(),
        left,
        pin,
    )
}

fn body(rec: &Value) -> &Value {
    &rec["event"]["proposal"]
}

#[test]
fn a_crash_after_the_apply_is_journaled_applied_at_the_next_start() {
    let (recs, live, left, pin) = crash_at("proposal_after_apply");
    assert_eq!(recs.len(), 1, "{recs:?}");
    let p = body(&recs[0]);
    assert_eq!(p["outcome"], "applied", "{}", recs[0]);
    assert_eq!(p["recovered"], true);
    assert_eq!(p["to_version"], 2);
    assert_eq!(p["after_sha256"], room_core::sha256_hex(&live));
    // the intention kept the digest before, so the recovery names it and moves the pin
    assert_eq!(p["before_sha256"], room_core::sha256_hex(DATA));
    assert_eq!(pin, p["after_sha256"], "the task's pin follows the change");
    let v: Value = serde_json::from_slice(&live).unwrap();
    assert_eq!(
        v,
        json!([{"id":1,"v":1,"name":"a"},{"id":2,"v":2,"name":"z"}])
    );
    assert!(left.is_empty(), "the outbox is empty");
}

#[test]
fn a_crash_before_the_apply_is_journaled_not_applied_and_the_file_is_untouched() {
    let (recs, live, left, pin) = crash_at("proposal_after_intent");
    assert_eq!(recs.len(), 1, "{recs:?}");
    let p = body(&recs[0]);
    assert_eq!(p["outcome"], "not_applied", "{}", recs[0]);
    assert_eq!(p["recovered"], true);
    assert_eq!(live, DATA);
    assert_eq!(
        pin,
        room_core::sha256_hex(DATA),
        "nothing applied, the pin stays"
    );
    assert!(left.is_empty(), "the outbox is empty");
}
