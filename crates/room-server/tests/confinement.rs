//! Only the owner is the owner: acceptance checks and destination probes run as workers do,
//! each in an owned job of its own, confined where the machine allows (no state directory, no
//! owner socket, no other daemon's state directory or bootstrap, the project read-only unless
//! declared, no network unless declared), and ended at zero processes. The hostile programs
//! here are the suite's own: a check that starts a `setsid` sleeper and tries to enroll an
//! operator through the owner socket of its daemon and of a second daemon on the machine, and
//! a member's probe that does the same.

mod common;
use common::*;
use room_server::daemon::Background;
use serde_json::{Value, json};
use std::path::PathBuf;

/// What the hostile program does: lists what it can see, tries each socket as the owner (an
/// `agent_enroll` of an operator named after its marker), tries to write the project, counts
/// its network interfaces, and leaves a `setsid` sleeper carrying its marker behind.
const HOSTILE: &str = r#"
import json, os, socket, subprocess, sys
marker, paths, socks = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
for p in paths:
    try:
        seen = sorted(os.listdir(p))
    except Exception as e:
        seen = type(e).__name__
    print("SEE", p, json.dumps(seen))
for s in socks:
    try:
        c = socket.socket(socket.AF_UNIX)
        c.settimeout(5)
        c.connect(s)
        req = {"op": "agent_enroll", "args": {"name": "intruder" + marker[-6:], "max_tier": "operator", "host": "x"}}
        c.sendall(json.dumps(req).encode() + b"\n")
        print("ANSWER", s, c.recv(65536).decode(errors="replace").strip()[:200])
    except Exception as e:
        print("NOCONNECT", s, type(e).__name__)
try:
    open("written-by-check", "w").write("x")
    print("WROTE")
except Exception as e:
    print("NOWRITE", type(e).__name__)
with open("/proc/net/dev") as f:
    print("IFACES", sum(1 for l in f if ":" in l))
subprocess.Popen(["/bin/sh", "-c", "sleep 300; true", marker], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"#;

const PYTHON: &str = "/usr/bin/python3";

fn marker(what: &str) -> String {
    format!("room-test-{what}-{}-{}", std::process::id(), rand_hex())
}

fn rand_hex() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{nanos:08x}")
}

/// A second daemon on the same machine, registered in the same bootstrap.
fn second_daemon(fx: &Fx) -> (Background, PathBuf) {
    let bootstrap = fx.root.join("config/room/bootstrap.toml");
    let s = room_store::statedir::init(&fx.root.join("state-b"), &bootstrap, "test-b").unwrap();
    let d = Background::start(&s.root, &bootstrap).unwrap();
    (d, s.root)
}

/// The project room `build` with alpha (coordinator) and beta (member), and a task for beta
/// that beta has claimed and read to the tip.
fn assigned(fx: &mut Fx, accept: Value) -> (String, String, String, PathBuf) {
    let a = fx.enroll("alpha", "coordinator");
    let b = fx.enroll("beta", "member");
    let (dir, pid) = fx.open_project("p1");
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta"]}),
    );
    let t = fx.ok(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "build it", "to": "beta", "scopes": ["file:dist"],
            "accept": accept}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    fx.ok(Some(&b), "task_claim", json!({"task": t}));
    fx.sync_all(&b, "build");
    (a, b, t, dir)
}

/// Whether this run confines (the machine allows namespaces).
fn confined(detail: &Value) -> bool {
    let c = detail["confinement"].as_str().unwrap_or("");
    if std::env::var("ROOM_TEST_CONFINEMENT").as_deref() == Ok("required") {
        assert_eq!(c, "namespaces", "confinement is required here: {detail}");
    }
    c.starts_with("namespaces")
}

/// The owner can still enroll the name the hostile program tried: it never got in.
#[track_caller]
fn never_enrolled(fx: &mut Fx, m: &str) {
    let name = format!("intruder{}", &m[m.len() - 6..]);
    let v = fx.ok(
        None,
        "agent_enroll",
        json!({"name": name, "max_tier": "member", "host": "test"}),
    );
    assert!(v["token"].is_string(), "{name} was free: {v}");
}

#[track_caller]
fn no_survivor(m: &str) {
    // the stop is confirmed before the check's result comes back: nothing is left to wait for
    let left = marked(m);
    assert!(
        left.is_empty(),
        "processes of the check survived it: {left:?}"
    );
}

#[test]
fn a_check_sees_no_state_dir_reaches_no_owner_socket_and_ends_at_zero_processes() {
    let mut fx = Fx::new();
    fx.write_config(&format!("[acceptance]\ncommands = [\"{PYTHON}\"]\n"));
    let (b_daemon, b_state) = second_daemon(&fx);
    let m = marker("check");
    // a cgroup v1 freezer, where the machine has one: a confined process must not be able to
    // freeze anything out of reach of a stop
    let freezer = PathBuf::from("/sys/fs/cgroup/freezer");
    let paths = [
        fx.state.clone(),
        b_state.clone(),
        fx.root.join("config/room"),
        freezer.clone(),
    ]
    .map(|p| p.display().to_string())
    .join(",");
    let socks = [fx.daemon.socket.clone(), b_daemon.socket.clone()]
        .map(|p| p.display().to_string())
        .join(",");
    let (_, b, t, dir) = assigned(
        &mut fx,
        json!([{"kind": "command", "program": PYTHON,
            "args": ["-c", HOSTILE, m, paths, socks], "timeout_ms": 60000}]),
    );
    let ev = fx.ok(Some(&b), "task_check", json!({"task": t}));
    let d = &ev["acceptance_results"][0]["detail"];
    let out = d["stdout_tail"].as_str().unwrap_or_default().to_string();
    assert_eq!(d["exit_code"], 0, "{d}");
    no_survivor(&m);
    // whatever the machine allows, no socket took it for the owner
    for line in out.lines().filter(|l| l.starts_with("ANSWER")) {
        assert!(
            !line.contains("\"ok\":true"),
            "a check acted as the owner: {line}"
        );
    }
    never_enrolled(&mut fx, &m);
    if confined(d) {
        let state = fx.state.display().to_string();
        assert!(
            out.contains(&format!("SEE {state} [\"workers\"]")),
            "the check saw its daemon's state dir: {out}"
        );
        assert!(
            out.contains(&format!("SEE {} []", b_state.display())),
            "the check saw the other daemon's state dir: {out}"
        );
        assert!(
            out.contains(&format!("SEE {} []", fx.root.join("config/room").display())),
            "the check saw the bootstrap: {out}"
        );
        if freezer.join("freezer.state").exists() || freezer.join("tasks").exists() {
            assert!(
                out.contains("SEE /sys/fs/cgroup/freezer []"),
                "the check saw the cgroup v1 freezer: {out}"
            );
        }
        assert_eq!(out.matches("NOCONNECT").count(), 2, "{out}");
        assert!(out.contains("NOWRITE"), "the project was writable: {out}");
        assert!(!dir.join("written-by-check").exists());
        assert!(out.contains("IFACES 1"), "the check had a network: {out}");
    }
    drop(b_daemon);
}

/// The same program told it may write the project and reach the network does both; what it
/// left behind still ends with it.
#[test]
fn a_check_that_declares_a_write_and_the_network_gets_them_and_nothing_more() {
    let mut fx = Fx::new();
    fx.write_config(&format!("[acceptance]\ncommands = [\"{PYTHON}\"]\n"));
    let m = marker("write");
    let state = fx.state.display().to_string();
    let sock = fx.daemon.socket.display().to_string();
    let (_, b, t, dir) = assigned(
        &mut fx,
        json!([{"kind": "command", "program": PYTHON, "project_write": true, "network": true,
            "args": ["-c", HOSTILE, m, state, sock], "timeout_ms": 60000}]),
    );
    let ev = fx.ok(Some(&b), "task_check", json!({"task": t}));
    let d = &ev["acceptance_results"][0]["detail"];
    assert_eq!(d["project_write"], true, "{d}");
    assert_eq!(d["network"], true, "{d}");
    let out = d["stdout_tail"].as_str().unwrap_or_default().to_string();
    no_survivor(&m);
    assert!(out.contains("WROTE"), "{out}");
    assert!(dir.join("written-by-check").exists());
    never_enrolled(&mut fx, &m);
    if confined(d) {
        assert!(out.contains(&format!("SEE {state} [\"workers\"]")), "{out}");
    }
}

#[test]
fn a_check_flag_of_the_wrong_type_is_refused_by_field_and_creates_nothing() {
    let mut fx = Fx::new();
    fx.write_config(&format!("[acceptance]\ncommands = [\"{PYTHON}\"]\n"));
    let a = fx.enroll("alpha", "coordinator");
    fx.enroll("beta", "member");
    let (_, pid) = fx.open_project("p1");
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta"]}),
    );
    let r = fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "x", "to": "beta",
            "accept": [{"kind": "command", "program": PYTHON, "network": "yes"}]}),
        "invalid_argument",
    );
    assert!(r.message.contains("accept[0].network"), "{r}");
}

/// A member's worker that records an operation with a probe of its own choosing: the probe
/// runs at `done` confined like a check, never as the owner, and ends at zero processes.
#[test]
fn a_member_s_probe_runs_confined_and_never_as_the_owner() {
    let mut fx = Fx::new();
    fx.write_config(&format!("[acceptance]\ncommands = [\"{PYTHON}\"]\n"));
    let m = marker("probe");
    let state = fx.state.display().to_string();
    let sock = fx.daemon.socket.display().to_string();
    let (_, b, t, _dir) = assigned(
        &mut fx,
        json!([{"kind": "destination", "destination": "file:dist"}]),
    );
    let op = fx.ok(
        Some(&b),
        "op_begin",
        json!({"room": "build", "task": t, "destination": "file:dist",
            "probe": {"program": PYTHON, "args": ["-c", HOSTILE, m, state, sock],
                "timeout_ms": 60000}}),
    )["op"]
        .as_str()
        .unwrap()
        .to_string();
    fx.ok(
        Some(&b),
        "op_resolve",
        json!({"room": "build", "op": op, "outcome": "succeeded"}),
    );
    fx.sync_all(&b, "build");
    let ev = fx.ok(Some(&b), "task_check", json!({"task": t}));
    let d = &ev["acceptance_results"][0]["detail"];
    // the probe exits 0 having tried everything: the effect is seen present
    assert_eq!(d["effect_present"], true, "{d}");
    no_survivor(&m);
    never_enrolled(&mut fx, &m);
    // a probe observes: a write of the project is refused where it is declared
    let r = fx.refuse(
        Some(&b),
        "op_begin",
        json!({"room": "build", "task": t, "destination": "file:dist",
            "probe": {"program": PYTHON, "project_write": true}}),
        "invalid_argument",
    );
    assert!(r.message.contains("probe.project_write"), "{r}");
}

/// A worker of one daemon never reaches another daemon on the machine: a routed worker (the
/// same hostile program) sees neither state directory nor the bootstrap, reaches neither
/// owner socket, and whatever the machine allows, no daemon took it for its owner.
#[test]
fn a_worker_of_one_daemon_never_reaches_another() {
    let mut fx = Fx::new();
    let (b_daemon, b_state) = second_daemon(&fx);
    let m = marker("worker");
    let paths = [
        fx.state.clone(),
        b_state.clone(),
        fx.root.join("config/room"),
    ]
    .map(|p| p.display().to_string())
    .join(",");
    let socks = [fx.daemon.socket.clone(), b_daemon.socket.clone()]
        .map(|p| p.display().to_string())
        .join(",");
    let script = format!("{HOSTILE}\nimport time\ntime.sleep(0.2)\n");
    let command = serde_json::to_string(&[PYTHON, "-c", &script, &m, &paths, &socks]).unwrap();
    fx.write_config(&format!(
        "[routes.beta]\nadapter = \"command\"\ncommand = {command}\ntimeout_ms = 60000\n"
    ));
    let (a, _b, _g) = fx.team("coord");
    fx.sync_all(&a, "coord");
    let src = fx.ok(
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["beta"], "text": "look around"}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string();
    // its launch ends (the program exits), and its log holds what it saw
    let start = std::time::Instant::now();
    let launch = loop {
        let all = fx.ok(None, "wakes_list", json!({}));
        let w = all["wakes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["source_event"] == src.as_str())
            .cloned()
            .unwrap_or(Value::Null);
        if w["launches"][0]["state"] == "ended" {
            break w["launches"][0].clone();
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the worker never ended: {w}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let log = fx
        .state
        .join("workers")
        .join(launch["launch"].as_str().unwrap())
        .join("stdout.log");
    let start = std::time::Instant::now();
    let out = loop {
        let t = std::fs::read_to_string(&log).unwrap_or_default();
        if t.contains("IFACES") {
            break t;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "no output: {t}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    for line in out.lines().filter(|l| l.starts_with("ANSWER")) {
        assert!(
            !line.contains("\"ok\":true"),
            "a worker acted as an owner: {line}"
        );
    }
    never_enrolled(&mut fx, &m);
    let mut on_b = room_server::client::Client::connect(&b_daemon.socket).unwrap();
    let name = format!("intruder{}", &m[m.len() - 6..]);
    let r = on_b
        .call(&request(
            None,
            "agent_enroll",
            json!({"name": name, "max_tier": "member", "host": "test"}),
        ))
        .unwrap();
    assert!(
        r.ok,
        "the other daemon enrolled the worker's intruder: {r:?}"
    );
    // the stop of a worker's job is confirmed before its launch ends: nothing it left runs
    let left = marked(&m);
    assert!(
        left.is_empty(),
        "processes of the worker survived it: {left:?}"
    );
    let confined_here = std::env::var("ROOM_TEST_CONFINEMENT").as_deref() == Ok("required");
    if confined_here {
        let state = fx.state.display().to_string();
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("SEE {state} ")) && !l.contains("control.db")),
            "{out}"
        );
        assert!(
            out.contains(&format!("SEE {} []", b_state.display())),
            "{out}"
        );
        assert!(
            out.contains(&format!("SEE {} []", fx.root.join("config/room").display())),
            "{out}"
        );
        assert!(
            out.contains(&format!("NOCONNECT {}", b_daemon.socket.display())),
            "{out}"
        );
    }
}
