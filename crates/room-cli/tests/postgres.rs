//! `room serve --store postgres://…` and `room verify` on PostgreSQL, as a person runs them:
//! the daemon keeps its rooms in the database, and `room verify` reads their chains from
//! there (by `--store`, or by config.toml's `[store] url`). The server is private to the
//! test (room-store-pg's test server).

#[path = "../../room-store-pg/tests/server/mod.rs"]
#[allow(dead_code)]
mod server;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn room(state: &Path, root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_room"));
    c.args(args)
        .arg("--state-dir")
        .arg(state)
        .env("XDG_CONFIG_HOME", root.join("config"))
        .env("ROOM_LOG", "error")
        .env_remove("ROOM_TOKEN");
    c
}

fn run(state: &Path, root: &Path, args: &[&str]) -> Output {
    room(state, root, args).output().unwrap()
}

/// The test server's libpq words (`host=DIR port=N user=U dbname=D`) as a postgres:// url,
/// the socket directory percent-encoded as the host.
fn as_url(words: &str) -> String {
    let get = |k: &str| {
        words
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .to_string()
    };
    let host = get("host").replace('/', "%2F");
    format!(
        "postgres://{}@{host}:{}/{}",
        get("user"),
        get("port"),
        get("dbname")
    )
}

#[test]
fn a_daemon_on_postgres_keeps_its_rooms_there_and_verify_reads_them() {
    let server = server::Server::start();
    let url = as_url(&server.fresh_database());
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let state = root.join("state");
    assert!(run(&state, &root, &["init"]).status.success());
    let mut daemon = room(&state, &root, &["serve", "--store", &url])
        .spawn()
        .unwrap();
    let sock = state.join("room.sock");
    for _ in 0..200 {
        if sock.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let enrolled = run(&state, &root, &["agent", "enroll", "alice"]);
    assert!(enrolled.status.success(), "{enrolled:?}");
    let created = run(&state, &root, &["create", "demo", "--member", "alice"]);
    assert!(created.status.success(), "{created:?}");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(daemon.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(daemon.wait().unwrap().success());
    // the state dir holds no room: the database does
    assert!(
        std::fs::read_dir(state.join("rooms"))
            .map(|d| d.count())
            .unwrap_or(0)
            == 0
    );
    let verified = run(&state, &root, &["verify", "--store", &url]);
    let out = String::from_utf8_lossy(&verified.stdout);
    assert!(verified.status.success(), "{verified:?}");
    assert!(out.starts_with("ok   demo 1 records"), "{out}");
    // config.toml's [store] url is the default for verify (and serve)
    let config = state.join("config.toml");
    let kept = std::fs::read_to_string(&config).unwrap_or_default();
    std::fs::write(&config, format!("{kept}\n[store]\nurl = \"{url}\"\n")).unwrap();
    let verified = run(&state, &root, &["verify", "demo"]);
    assert!(verified.status.success(), "{verified:?}");
    assert!(String::from_utf8_lossy(&verified.stdout).starts_with("ok   demo 1 records"));
    let missing = run(&state, &root, &["verify", "nowhere"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no room named \"nowhere\""),
        "{missing:?}"
    );
}
