//! Crash tests of the two-phase stop outbox: the real daemon is made to abort (as a kill -9
//! would stop it) between writing phase 1 and phase 2 of a worker's stop, and between
//! writing phase 2 and committing it. At the next start each stop is replayed in causal
//! order: phase 1 committed before phase 2, each exactly once, phase 2 naming phase 1, and a
//! phase 2 only once zero processes were observed in the worker's job.

use room_server::client::Client;
use room_server::wire::{Request, Response};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(state: &Path, config_home: &Path, fault: Option<&str>, jobs: &str) -> Daemon {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_room"));
    cmd.args(["serve", "--state-dir"])
        .arg(state)
        .env("XDG_CONFIG_HOME", config_home)
        .env("ROOM_LOG", "error")
        .env("ROOM_JOB_KIND", jobs)
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

fn call(state: &Path, token: Option<&str>, op: &str, args: Value) -> Response {
    Client::connect(&state.join("room.sock"))
        .unwrap()
        .call(&req(token, op, args))
        .unwrap()
}

fn ok(state: &Path, token: Option<&str>, op: &str, args: Value) -> Value {
    let r = call(state, token, op, args.clone());
    assert!(r.ok, "{op} {args}: {:?}", r.refusal);
    r.result.unwrap()
}

fn poll(what: &str, mut f: impl FnMut() -> Option<Value>) -> Value {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn worker_stops(state: &Path) -> Vec<Value> {
    let log = ok(
        state,
        None,
        "room_log",
        json!({"room": "coord", "limit": 1000}),
    );
    log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "worker_stop")
        .cloned()
        .collect()
}

/// The machine's pids of the live processes whose command line holds `marker` (the worker
/// runs in a PID namespace of its own: the pids it reports are not the machine's).
fn marked(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == marker.as_bytes()))
        })
        .collect()
}

/// A daemon on a fresh state dir whose `beta` runs the stubborn test worker; alpha's token.
struct Setup {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    config_home: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let (state, config_home) = (root.join("state"), root.join("config"));
    room_store::statedir::init(
        &state,
        &config_home.join("room/bootstrap.toml"),
        "stop-crash",
    )
    .unwrap();
    let agent = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../room-server/tests/workers/agent.py")
        .canonicalize()
        .unwrap();
    std::fs::write(
        state.join("config.toml"),
        format!(
            "[routes.beta]\nadapter = \"command\"\ncommand = [\"/usr/bin/python3\", {:?}, \"stubborn\"]\ntimeout_ms = 120000\n",
            agent.to_str().unwrap()
        ),
    )
    .unwrap();
    Setup {
        _tmp: tmp,
        state,
        config_home,
    }
}

/// Enroll alpha and beta in `coord`, send beta work and wait for its stubborn worker to run;
/// the marker of the grandchild it leaves in a session of its own.
fn stubborn_worker(state: &Path) -> String {
    let a = ok(
        state,
        None,
        "agent_enroll",
        json!({"name": "alpha", "max_tier": "coordinator"}),
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    ok(state, None, "agent_enroll", json!({"name": "beta"}));
    ok(
        state,
        None,
        "room_create",
        json!({"name": "coord", "members": ["alpha", "beta"]}),
    );
    let page = ok(state, Some(&a), "sync", json!({"room": "coord"}));
    ok(
        state,
        Some(&a),
        "sync",
        json!({"room": "coord", "confirm": page["receipt"]}),
    );
    ok(
        state,
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["beta"], "text": "work"}),
    );
    poll("the worker never ran", || {
        let w = ok(state, None, "wakes_list", json!({}));
        (w["wakes"][0]["launches"][0]["state"] == "running").then_some(w)
    });
    let child = poll("no grandchild", || {
        std::fs::read_dir(state.join("workers"))
            .ok()?
            .flatten()
            .filter_map(|d| std::fs::read_to_string(d.path().join("stdout.log")).ok())
            .flat_map(|s| s.lines().map(String::from).collect::<Vec<_>>())
            .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
            .find_map(|v| v["marker"].as_str().map(Value::from))
    })
    .as_str()
    .unwrap()
    .to_string();
    assert!(!marked(&child).is_empty(), "no process marked {child}");
    child
}

/// End what a failed test left behind, by its marker.
fn end_marked(marker: &str) {
    for pid in marked(marker) {
        let _ = Command::new("/bin/kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
}

/// Start a daemon that aborts at `fault`, get a stubborn worker running, cancel its room and
/// wait for the abort; then restart and check the replay. Returns the stop's files after it.
fn crash_at(fault: &str, jobs: &str) -> (Vec<Value>, Value) {
    let su = setup();
    let (state, config_home) = (su.state.clone(), su.config_home.clone());
    let mut daemon = spawn(&state, &config_home, Some(fault), jobs);
    let child = stubborn_worker(&state);
    ok(&state, None, "room_cancel", json!({"room": "coord"}));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = daemon.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no abort at {fault}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "the daemon aborted at {fault}");
    drop(daemon);
    let stops: Vec<PathBuf> = std::fs::read_dir(state.join("stops"))
        .unwrap()
        .flatten()
        .map(|d| d.path())
        .collect();
    assert_eq!(stops.len(), 1, "one stop");
    let dir = stops[0].clone();
    let has = |f: &str| dir.join(f).exists();
    let before = [
        has("phase-1.json"),
        has("phase-1.committed.json"),
        has("phase-2.json"),
        has("phase-2.committed.json"),
    ];

    let _daemon = spawn(&state, &config_home, None, jobs);
    let list = poll("the stop was not replayed", || {
        let l = ok(&state, None, "stops_list", json!({}));
        (l["stops"][0]["committed"] == json!({"phase_1": true, "phase_2": true})).then_some(l)
    });
    let recs = worker_stops(&state);
    let s = &list["stops"][0];
    assert_eq!(recs.len(), 2, "each phase committed exactly once: {recs:?}");
    assert_eq!(recs[0]["id"], s["phase_1"]["event_id"]);
    assert_eq!(recs[1]["id"], s["phase_2"]["event_id"]);
    assert_eq!(recs[0]["event"]["termination_confirmed"], false);
    assert_eq!(recs[1]["event"]["termination_confirmed"], true);
    assert_eq!(recs[1]["event"]["predecessor"]["event_id"], recs[0]["id"]);
    assert!(recs[0]["seq"].as_u64() < recs[1]["seq"].as_u64());
    let observed = &s["phase_2"]["observed"];
    assert_eq!(observed["confirmed_empty"], true, "{s}");
    if jobs != "auto" {
        assert_eq!(observed["kind"], jobs, "{s}");
    }
    let left = marked(&child);
    end_marked(&child);
    assert!(
        left.is_empty(),
        "the grandchild outlived the restart's reap: {left:?}"
    );
    (before.iter().map(|b| json!(b)).collect(), observed.clone())
}

#[test]
fn a_crash_between_phase_1_and_phase_2_is_finished_at_the_next_start_once_the_job_is_empty() {
    let (before, observed) = crash_at("stop_after_phase1", "auto");
    // phase 1 was on disk, nothing committed, no phase 2
    assert_eq!(
        before,
        [json!(true), json!(false), json!(false), json!(false)]
    );
    // phase 2 was written at the restart, after the reaped job was seen empty
    assert_eq!(observed["at"], "restart", "{observed}");
}

#[test]
fn a_crash_between_phase_2_and_its_commit_commits_it_after_phase_1_at_the_next_start() {
    let (before, observed) = crash_at("stop_after_phase2", "auto");
    assert_eq!(
        before,
        [json!(true), json!(true), json!(true), json!(false)]
    );
    // the zero-process observation is the one made before the crash
    assert!(observed.get("at").is_none(), "{observed}");
}

/// Subreaper jobs (a machine without cgroup delegation): a crash between the phases leaves the
/// shim and its tree running; the next start finds the shim by its record, ends its tree and
/// only then writes phase 2.
#[test]
fn a_crash_between_the_phases_of_a_subreaper_stop_ends_the_tree_at_the_next_start() {
    let (before, observed) = crash_at("stop_after_phase1", "subreaper");
    assert_eq!(
        before,
        [json!(true), json!(false), json!(false), json!(false)]
    );
    assert_eq!(observed["at"], "restart", "{observed}");
}

/// kill -9 of a daemon whose subreaper job runs: the tree outlives it (a shim is nobody's
/// child then); the next start ends it before it records the launch as interrupted.
#[test]
fn a_daemon_killed_under_a_running_subreaper_job_ends_the_tree_at_the_next_start() {
    let su = setup();
    let (state, config_home) = (su.state.clone(), su.config_home.clone());
    let mut daemon = spawn(&state, &config_home, None, "subreaper");
    let child = stubborn_worker(&state);
    daemon.0.kill().unwrap();
    daemon.0.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let survived = marked(&child);
    assert!(
        !survived.is_empty(),
        "the tree outlives its daemon until the next start (else this test proves nothing)"
    );
    let _daemon = spawn(&state, &config_home, None, "subreaper");
    let launch = poll("the launch was not ended", || {
        let w = ok(&state, None, "wakes_list", json!({}));
        let l = w["wakes"][0]["launches"][0].clone();
        (l["state"] == "ended").then_some(l)
    });
    let left = marked(&child);
    end_marked(&child);
    assert!(
        left.is_empty(),
        "the launch was recorded {launch} while its tree ran: {left:?}"
    );
    assert_eq!(launch["outcome"], "interrupted", "{launch}");
}
