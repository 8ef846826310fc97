//! 04-C10's crash: a daemon that dies between its stop outbox's two phases. The card's own
//! daemon runs in this process, so this part starts a second one, a real `room serve` on a
//! scratch state dir of its own, told to abort right after a stop's phase 1
//! (`ROOM_FAULT=stop_after_phase1`, the crash `kill -9` would be), then starts it again and
//! checks that the stop is finished from its outbox: phase 2 written only once the job was
//! seen empty, each phase journaled exactly once, in order, and no process of the hostile
//! tree left.

use super::Prover;
use room_server::client::Client;
use room_server::wire::{Request, Response};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// How long the crashing daemon has to come up, run its worker, abort and replay.
const WAIT_MS: u64 = 60_000;

/// The processes named by a marker, killed when the card is done with them (a stop that
/// worked left none).
struct Tree(String);

impl Drop for Tree {
    fn drop(&mut self) {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        for pid in dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        {
            let named = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == self.0.as_bytes()));
            if let (true, Some(pid)) = (named, rustix::process::Pid::from_raw(pid)) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// A `room serve` child, killed if the card leaves it running.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The crash and its replay, recorded as the card's steps.
pub(super) fn between_the_phases(p: &mut Prover) {
    if let Err(e) = run(p) {
        p.record("a daemon that dies between a stop's phases", false, e);
    }
}

fn run(p: &mut Prover) -> Result<(), String> {
    let root = p.root.join("c10-crash");
    let config = root.join("config");
    let state = room_store::statedir::init(
        &root.join("state"),
        &config.join("room/bootstrap.toml"),
        "prove-crash",
    )
    .map_err(|e| format!("a scratch state dir: {e}"))?
    .root;
    std::fs::write(
        state.join("config.toml"),
        "[routes.beta]\nadapter = \"script\"\nsteps = [\"stubborn\"]\n",
    )
    .map_err(|e| e.to_string())?;
    let mut daemon = serve(&state, &config, Some("stop_after_phase1"))?;
    let marker = stubborn_worker(&state)?;
    // whatever goes wrong from here, the hostile tree does not outlive the card
    let _tree = Tree(marker.clone());
    p.record(
        "a second daemon (room serve, told to crash after a stop's phase 1) runs a stubborn worker",
        true,
        format!("{} processes named {marker}", super::wakes::marked(&marker)),
    );
    call(&state, None, "room_cancel", json!({"room": "coord"}))?;
    let died = wait(|| daemon.0.try_wait().ok().flatten().map(|s| s.to_string()));
    let stop = one_stop(&state)?;
    let has = |f: &str| stop.join(f).exists();
    p.record(
        "the cancel's stop dies after phase 1: on disk, neither committed nor followed",
        died.is_some()
            && has("phase-1.json")
            && !has("phase-1.committed.json")
            && !has("phase-2.json"),
        format!(
            "daemon {}; phase-1.json {}, committed {}, phase-2.json {}",
            died.as_deref().unwrap_or("still running"),
            has("phase-1.json"),
            has("phase-1.committed.json"),
            has("phase-2.json")
        ),
    );
    drop(daemon);
    let daemon = serve(&state, &config, None)?;
    let list = wait(|| {
        let l = call(&state, None, "stops_list", json!({})).ok()?;
        (l["stops"][0]["committed"] == json!({"phase_1": true, "phase_2": true})).then_some(l)
    })
    .ok_or("the restarted daemon did not finish the stop")?;
    let s = &list["stops"][0];
    let log = call(
        &state,
        None,
        "room_log",
        json!({"room": "coord", "limit": 1000}),
    )?;
    let recs: Vec<&Value> = log["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "worker_stop")
        .collect();
    let in_order = recs.len() == 2
        && recs[0]["id"] == s["phase_1"]["event_id"]
        && recs[1]["id"] == s["phase_2"]["event_id"]
        && recs[0]["event"]["termination_confirmed"] == false
        && recs[1]["event"]["termination_confirmed"] == true
        && recs[1]["event"]["predecessor"]["event_id"] == recs[0]["id"];
    p.record(
        "the restart finishes it: phase 2 after phase 1, each journaled once",
        in_order,
        format!(
            "worker_stop {} then {}",
            recs.first().map_or(&Value::Null, |r| &r["id"]),
            recs.get(1).map_or(&Value::Null, |r| &r["id"])
        ),
    );
    let observed = &s["phase_2"]["observed"];
    let left = super::wakes::marked(&marker);
    p.record(
        "phase 2 only at zero processes, and none of the tree left",
        observed["confirmed_empty"] == true && left == 0,
        format!(
            "{} job observed empty {} ({}); {left} processes named {marker}",
            observed["kind"].as_str().unwrap_or("?"),
            observed["confirmed_empty"],
            observed["at"].as_str().unwrap_or("before the crash")
        ),
    );
    drop(daemon);
    let chains = crate::cmd::verify_dir(&state, None)?;
    p.record(
        "every chain of the crashed daemon's state verifies",
        !chains.is_empty() && chains.iter().all(|c| c["ok"] == true),
        format!("{} rooms verified", chains.len()),
    );
    Ok(())
}

fn serve(state: &Path, config: &Path, fault: Option<&str>) -> Result<Serve, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(["serve", "--state-dir"])
        .arg(state)
        .env("XDG_CONFIG_HOME", config)
        .env("ROOM_LOG", "error")
        .env_remove("ROOM_FAULT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if let Some(f) = fault {
        cmd.env("ROOM_FAULT", f);
    }
    let child = Serve(cmd.spawn().map_err(|e| format!("room serve: {e}"))?);
    wait(|| call(state, None, "ping", json!({})).ok())
        .map(|_| child)
        .ok_or_else(|| "room serve did not come up".to_string())
}

/// Enroll alpha and beta in `coord`, send beta work and wait until its stubborn tree runs;
/// the marker its processes carry.
fn stubborn_worker(state: &Path) -> Result<String, String> {
    let a = call(
        state,
        None,
        "agent_enroll",
        json!({"name": "alpha", "max_tier": "coordinator"}),
    )?["token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    call(state, None, "agent_enroll", json!({"name": "beta"}))?;
    call(
        state,
        None,
        "room_create",
        json!({"name": "coord", "members": ["alpha", "beta"]}),
    )?;
    let page = call(state, Some(&a), "sync", json!({"room": "coord"}))?;
    call(
        state,
        Some(&a),
        "sync",
        json!({"room": "coord", "confirm": page["receipt"]}),
    )?;
    call(
        state,
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["beta"], "text": "@beta work"}),
    )?;
    let launch = wait(|| {
        let w = call(state, None, "wakes_list", json!({})).ok()?;
        (w["wakes"][0]["launches"][0]["state"] == "running")
            .then(|| {
                w["wakes"][0]["launches"][0]["launch"]
                    .as_str()
                    .map(String::from)
            })
            .flatten()
    })
    .ok_or("the stubborn worker never ran")?;
    let marker = format!("room-stubborn-{launch}");
    wait(|| (super::wakes::marked(&marker) >= 2).then_some(()))
        .ok_or_else(|| format!("no tree named {marker}"))?;
    Ok(marker)
}

fn one_stop(state: &Path) -> Result<PathBuf, String> {
    let stops: Vec<PathBuf> = std::fs::read_dir(state.join("stops"))
        .map_err(|e| format!("stops/: {e}"))?
        .flatten()
        .map(|d| d.path())
        .collect();
    match stops.as_slice() {
        [one] => Ok(one.clone()),
        other => Err(format!("{} stops in the outbox, not one", other.len())),
    }
}

fn call(state: &Path, token: Option<&str>, op: &str, args: Value) -> Result<Value, String> {
    let r: Response = Client::connect(&state.join("room.sock"))
        .map_err(|e| e.to_string())?
        .call(&Request::new(op, args).with_token(token))
        .map_err(|e| e.to_string())?;
    match (r.result, r.refusal) {
        (Some(v), _) if r.ok => Ok(v),
        (_, Some(refusal)) => Err(format!("{op}: {refusal}")),
        _ => Err(format!("{op}: an empty answer")),
    }
}

/// Poll `f` every 50 ms until it gives something, at most `WAIT_MS`.
fn wait<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(WAIT_MS) {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}
