//! The daemon on PostgreSQL (`ServeConfig::store`): principals, rooms, turns, tasks and the
//! Work Gate work through the socket as on the embedded store, everything is in the database
//! (a daemon started again on it finds the room, its chain, the task and the agents), and a
//! stale turn is refused with nothing written. The server is private to the test
//! (room-store-pg's test server: Debian's PostgreSQL, or `ROOM_TEST_PG_URL`).

#[path = "../../room-store-pg/tests/server/mod.rs"]
#[allow(dead_code)]
mod server;

use room_server::client::Client;
use room_server::daemon::{Background, Limits, ServeConfig, engine_threads_default};
use room_server::wire::{Request, Response};
use room_store::backend::Backend;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn start(state: &Path, bootstrap: &Path, url: &str) -> Background {
    Background::start_with(ServeConfig {
        state_dir: state.to_path_buf(),
        bootstrap: bootstrap.to_path_buf(),
        listen: None,
        engine_threads: engine_threads_default(),
        limits: Limits::default(),
        room_exe: None,
        store: Some(url.to_string()),
    })
    .unwrap()
}

fn call(d: &Background, token: Option<&str>, op: &str, args: Value) -> Response {
    Client::connect(&d.socket)
        .unwrap()
        .call(&Request::new(op, args).with_token(token))
        .unwrap()
}

#[track_caller]
fn ok(d: &Background, token: Option<&str>, op: &str, args: Value) -> Value {
    let r = call(d, token, op, args);
    assert!(r.ok, "{op}: {:?}", r.refusal);
    r.result.unwrap()
}

/// Read the room through to its tip and confirm it.
fn read_through(d: &Background, token: &str, room: &str) {
    let mut confirm: Option<Value> = None;
    for _ in 0..16 {
        let mut args = json!({"room": room});
        if let Some(c) = &confirm {
            args["confirm"] = c.clone();
        }
        let page = ok(d, Some(token), "sync", args);
        let empty = page["items"].as_array().is_none_or(|a| a.is_empty());
        if confirm.is_some() && empty && page["more"] != true {
            return;
        }
        confirm = Some(page["receipt"].clone());
    }
    panic!("{room} did not settle");
}

#[test]
fn the_daemon_runs_on_postgres_and_finds_everything_again_after_a_restart() {
    let server = server::Server::start();
    let url = server.fresh_database();
    let tmp = tempfile::tempdir().unwrap();
    let root: PathBuf = std::fs::canonicalize(tmp.path()).unwrap();
    let bootstrap = root.join("config/room/bootstrap.toml");
    let state = room_store::statedir::init(&root.join("state"), &bootstrap, "test").unwrap();
    let d = start(&state.root, &bootstrap, &url);
    // a second daemon on the same database does not start (several are not built yet)
    let other_boot = root.join("other.toml");
    let other = room_store::statedir::init(&root.join("other"), &other_boot, "test").unwrap();
    let refused = Background::start_with(ServeConfig {
        state_dir: other.root.clone(),
        bootstrap: other_boot,
        listen: None,
        engine_threads: engine_threads_default(),
        limits: Limits::default(),
        room_exe: None,
        store: Some(url.clone()),
    })
    .err()
    .expect("a second daemon on one database was refused");
    assert!(
        refused
            .to_string()
            .contains("another daemon serves this database"),
        "{refused}"
    );
    let token = |name: &str| {
        ok(
            &d,
            None,
            "agent_enroll",
            json!({"name": name, "max_tier": "coordinator"}),
        )["token"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (a, b) = (token("alpha"), token("beta"));
    ok(
        &d,
        None,
        "room_create",
        json!({"name": "r", "members": ["alpha", "beta"]}),
    );
    read_through(&d, &a, "r");
    read_through(&d, &b, "r");
    ok(
        &d,
        Some(&a),
        "note",
        json!({"room": "r", "text": "plan: one file"}),
    );
    // the Work Gate on PostgreSQL: beta has not read alpha's note, and its turn is refused
    // with nothing written
    let tip = |d: &Background| {
        ok(d, None, "rooms", json!({}))["rooms"][0]["tip_seq"]
            .as_u64()
            .unwrap()
    };
    let before = tip(&d);
    let stale = call(&d, Some(&b), "note", json!({"room": "r", "text": "unread"}));
    assert_eq!(
        stale.refusal.as_ref().map(|r| r.code.as_str()),
        Some("room_sync_required"),
        "{stale:?}"
    );
    assert_eq!(tip(&d), before, "a refused turn wrote nothing");
    read_through(&d, &b, "r");
    let task = ok(
        &d,
        Some(&a),
        "task_create",
        json!({"room": "r", "title": "write it", "to": "beta"}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    read_through(&d, &a, "r");
    ok(
        &d,
        Some(&a),
        "send",
        json!({"room": "r", "to": ["beta"], "text": "yours", "task": task}),
    );
    ok(&d, Some(&b), "task_claim", json!({"task": task}));
    read_through(&d, &b, "r");
    ok(&d, Some(&b), "done", json!({"room": "r", "task": task}));
    let tip_before = tip(&d);
    d.stop().unwrap();

    // everything is in the database: a daemon started again finds it all
    let d = start(&state.root, &bootstrap, &url);
    assert_eq!(tip(&d), tip_before);
    let shown = ok(&d, None, "owner_task_show", json!({"task": task}));
    assert_eq!(shown["task"]["status"], "done", "{shown}");
    // the agents' credentials and read positions are there too: alpha reads what beta did
    read_through(&d, &a, "r");
    ok(&d, Some(&a), "note", json!({"room": "r", "text": "thanks"}));
    d.stop().unwrap();
    // and the chain verifies, read straight from the database
    let store = room_store_pg::PgBackend::connect(&url).unwrap();
    let graph = {
        let c = store.open_control().unwrap();
        c.room("r").unwrap().unwrap().graph_id
    };
    let report = store.verify_log(&graph).unwrap();
    assert_eq!(report.records, tip_before + 1);
}
