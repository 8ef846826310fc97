//! Active cancellation through a real daemon: control standing comes from the credential
//! (never from an argument), a cancel dead-letters queued wakes and leaves obligations open,
//! holds unresolved operations until an operator reconciles them, and stops a running worker
//! (one that ignores SIGTERM and leaves a `setsid` grandchild) through the two-phase stop
//! outbox, confirmed at zero processes. Break-glass stops everything the same way.

mod common;
use common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// alpha (coordinator), beta and gamma (members) and ops (operator) in `coord`; outsider
/// (operator) in no room.
fn crew(fx: &mut Fx) -> (String, String, String, String, String) {
    let a = fx.enroll("alpha", "coordinator");
    let b = fx.enroll("beta", "member");
    let g = fx.enroll("gamma", "member");
    let ops = fx.enroll("ops", "operator");
    let out = fx.enroll("outsider", "operator");
    fx.ok(
        None,
        "room_create",
        json!({"name": "coord", "members": ["alpha", "beta", "gamma", "ops"]}),
    );
    (a, b, g, ops, out)
}

fn route(fx: &Fx, mode: &str) {
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/agent.py");
    fx.write_config(&format!(
        "[routes.beta]\nadapter = \"command\"\ncommand = [\"/usr/bin/python3\", {:?}, {mode:?}]\ntimeout_ms = 120000\n",
        agent.to_str().unwrap()
    ));
}

fn send(fx: &mut Fx, a: &str, text: &str) -> String {
    fx.sync_all(a, "coord");
    fx.ok(
        Some(a),
        "send",
        json!({"room": "coord", "to": ["beta"], "text": text}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string()
}

fn wake(fx: &mut Fx, source: &str) -> Value {
    let all = fx.ok(None, "wakes_list", json!({}));
    all["wakes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["source_event"] == source)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Wait (at most 60 s) until `pred` holds for the permit of `source`.
fn wait_for(fx: &mut Fx, source: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let w = wake(fx, source);
        if pred(&w) {
            return w;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{what}: {w}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn open_obligations(fx: &mut Fx, b: &str) -> usize {
    fx.ok(Some(b), "sync", json!({"room": "coord"}))["open_items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "obligation")
        .count()
}

fn events_of(fx: &mut Fx, kind: &str) -> Vec<Value> {
    let log = fx.ok(None, "room_log", json!({"room": "coord", "limit": 1000}));
    log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == kind)
        .cloned()
        .collect()
}

fn gone(marker: &str) -> bool {
    common::marked(marker).is_empty()
}

/// End what a failed test left behind (by its marker: the worker's pids are its namespace's).
fn end_marked(marker: &str) {
    for pid in common::marked(marker) {
        let _ = std::process::Command::new("/bin/kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
}

#[test]
fn control_standing_comes_from_the_credential_never_from_an_argument() {
    let mut fx = Fx::new();
    let (a, b, _g, ops, out) = crew(&mut fx);
    let calls = [
        ("room_cancel", json!({"room": "coord", "by": "operator"})),
        ("room_resume", json!({"room": "coord"})),
        ("room_reset", json!({"room": "coord"})),
        ("room_admission", json!({"room": "coord", "open": false})),
        ("room_reconcile", json!({"room": "coord"})),
        ("break_glass", json!({"engage": true})),
    ];
    for (op, args) in &calls {
        // a member and a coordinator saying they act for the operator get nothing
        fx.refuse(Some(&b), op, args.clone(), "control_standing_required");
        fx.refuse(Some(&a), op, args.clone(), "control_standing_required");
        // an operator that declares a lower tier for this connection acts at that tier
        let mut r = request(Some(&ops), op, args.clone());
        r.tier = Some("coordinator".into());
        fx.refuse_req(&r, "control_standing_required");
    }
    // an operator outside the room has no standing over it
    fx.refuse(
        Some(&out),
        "room_cancel",
        json!({"room": "coord"}),
        "room_not_member",
    );
    fx.refuse(
        Some(&ops),
        "room_cancel",
        json!({"room": "nowhere"}),
        "room_not_found",
    );
    fx.refuse(
        Some(&ops),
        "room_cancel",
        json!({"room": "coord", "by": ""}),
        "invalid_argument",
    );
    // the operator's standing is real: its reset is journaled under its own name
    fx.ok(Some(&ops), "room_reset", json!({"room": "coord"}));
    let reset = events_of(&mut fx, "room_reset");
    assert_eq!(reset[0]["actor"], "ops", "{reset:?}");
    // an operator's cancel records what `by` said, and confers nothing by it
    let c = fx.ok(
        Some(&ops),
        "room_cancel",
        json!({"room": "coord", "by": "the release manager"}),
    );
    assert_eq!(
        (c["actor"].as_str(), c["by"].as_str()),
        (Some("ops"), Some("the release manager"))
    );
    fx.ok(Some(&ops), "room_resume", json!({"room": "coord"}));
}

#[test]
fn a_cancel_dead_letters_queued_wakes_leaves_obligations_open_and_holds_operations() {
    let mut fx = Fx::new();
    let (a, b, g, _ops, _) = crew(&mut fx);
    // an operation beta began under its claim and has not resolved
    let task = fx.ok(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "deploy", "to": "beta", "scopes": ["api:deploy"]}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    fx.tasks.push(task.clone());
    fx.ok(Some(&b), "task_claim", json!({"task": task}));
    let op = fx.ok(
        Some(&b),
        "op_begin",
        json!({"room": "coord", "task": task, "destination": "api:deploy"}),
    )["op"]
        .as_str()
        .unwrap()
        .to_string();
    // beta has no route: its wake stays queued
    let src = send(&mut fx, &a, "ship it");
    assert_eq!(wake(&mut fx, &src)["state"], "queued");
    assert_eq!(open_obligations(&mut fx, &b), 1);
    fx.refuse(
        None,
        "room_resume",
        json!({"room": "coord"}),
        "invalid_argument",
    );

    fx.sync_all(&g, "coord");
    let c = fx.ok(None, "room_cancel", json!({"room": "coord"}));
    assert_eq!(c["dead_lettered"], 1, "{c}");
    // the cancel moved the room's view: a reader caught up before reads it again
    fx.refuse(
        Some(&g),
        "say",
        json!({"room": "coord", "text": "still here"}),
        "room_sync_view_changed",
    );
    let held = c["held"].as_array().unwrap();
    assert_eq!(held.len(), 1, "{c}");
    assert_eq!(
        (held[0]["kind"].as_str(), held[0]["item"].as_str()),
        (Some("destination_operation"), Some(op.as_str()))
    );
    assert_eq!(held[0]["held_until_reconciled"], true);
    let w = wake(&mut fx, &src);
    assert_eq!(w["state"], "dead", "{w}");
    assert_eq!(w["dead_letter"]["code"], "room_cancelled", "{w}");
    assert!(
        w["dead_letter"]["reason"]
            .as_str()
            .unwrap()
            .contains("retry_allowed: false")
    );
    assert_eq!(open_obligations(&mut fx, &b), 1, "obligations stay open");
    // the operation is held, not rewritten: the ledger still says what beta recorded
    let shown = fx.ok(None, "owner_task_show", json!({"task": task}));
    assert_eq!(shown["task"]["status"], "claimed", "{shown}");
    fx.refuse(
        None,
        "room_cancel",
        json!({"room": "coord"}),
        "invalid_argument",
    );

    // a send after the cancel is sealed, and dies at dispatch: the room dispatches nothing
    let later = send(&mut fx, &a, "and this");
    fx.ok(None, "wakes_check", json!({}));
    let w = wake(&mut fx, &later);
    assert_eq!(
        (w["state"].as_str(), w["dead_letter"]["code"].as_str()),
        (Some("dead"), Some("wake_admission_closed")),
        "{w}"
    );

    // reconciliation: listed, then resolved with evidence, once
    let holds = fx.ok(None, "room_reconcile", json!({"room": "coord"}));
    assert_eq!(holds["unresolved"], 1, "{holds}");
    let hold = holds["holds"][0]["hold"].as_str().unwrap().to_string();
    for (args, code) in [
        (
            json!({"room": "coord", "hold": hold, "outcome": "fine", "evidence": "x"}),
            "invalid_argument",
        ),
        (
            json!({"room": "coord", "hold": hold, "outcome": "accepted", "evidence": " "}),
            "invalid_argument",
        ),
        (
            json!({"room": "coord", "hold": hold, "outcome": "accepted"}),
            "invalid_argument",
        ),
        (
            json!({"room": "coord", "hold": "hld_0000000000000000", "outcome": "accepted", "evidence": "x"}),
            "not_found",
        ),
    ] {
        fx.refuse(None, "room_reconcile", args, code);
    }
    let done = fx.ok(
        None,
        "room_reconcile",
        json!({"room": "coord", "hold": hold, "outcome": "not_accepted",
            "evidence": "the deploy API shows no release 42"}),
    );
    assert_eq!(done["hold"]["held_until_reconciled"], false, "{done}");
    assert_eq!(done["hold"]["reconciled"]["outcome"], "not_accepted");
    fx.refuse(
        None,
        "room_reconcile",
        json!({"room": "coord", "hold": hold, "outcome": "accepted", "evidence": "x"}),
        "invalid_argument",
    );
    assert_eq!(events_of(&mut fx, "reconciled").len(), 1);

    // resumed, the room dispatches again; the dead letters stay dead
    fx.ok(None, "room_resume", json!({"room": "coord"}));
    let after = send(&mut fx, &a, "now");
    fx.ok(None, "wakes_check", json!({}));
    assert_eq!(wake(&mut fx, &after)["state"], "queued");
    assert_eq!(wake(&mut fx, &src)["state"], "dead");
}

/// A running worker, once its launch is running; the marker of its stubborn grandchild.
fn running_worker(fx: &mut Fx, a: &str) -> (String, String) {
    route(fx, "stubborn");
    let src = send(fx, a, "work until stopped");
    wait_for(fx, &src, "the launch never ran", |w| {
        w["launches"][0]["state"] == "running"
    });
    let start = Instant::now();
    let child = loop {
        let dir = fx.state.join("workers");
        let out = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter_map(|d| std::fs::read_to_string(d.path().join("stdout.log")).ok())
            .flat_map(|s| s.lines().map(String::from).collect::<Vec<_>>())
            .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
            .find_map(|v| v["marker"].as_str().map(String::from));
        if let Some(c) = out {
            // found by its marker while it runs: the checks that it is gone can fail
            assert!(!common::marked(&c).is_empty(), "no process marked {c}");
            break c;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no grandchild");
        std::thread::sleep(Duration::from_millis(50));
    };
    (src, child)
}

/// The stop of the one launch: both phases written and committed, in order, phase 2 naming
/// phase 1 exactly; the journal holds both records, phase 1 first.
fn assert_stopped_in_two_phases(fx: &mut Fx, reason: &str) {
    let stops = fx.ok(None, "stops_list", json!({}));
    let s = &stops["stops"][0];
    assert_eq!(s["reason"], reason, "{stops}");
    assert_eq!(
        s["committed"],
        json!({"phase_1": true, "phase_2": true}),
        "{s}"
    );
    assert_eq!(s["phase_1"]["termination_confirmed"], false);
    assert!(
        s["phase_1"]["pending"]
            .as_str()
            .is_some_and(|p| p.len() <= 256)
    );
    assert_eq!(s["phase_2"]["termination_confirmed"], true);
    assert_eq!(s["phase_2"]["observed"]["confirmed_empty"], true, "{s}");
    assert_eq!(
        s["phase_2"]["predecessor"]["event_id"], s["phase_1"]["event_id"],
        "{s}"
    );
    let recs = events_of(fx, "worker_stop");
    assert_eq!(recs.len(), 2, "{recs:?}");
    assert_eq!(recs[0]["id"], s["phase_1"]["event_id"]);
    assert_eq!(recs[1]["id"], s["phase_2"]["event_id"]);
    assert_eq!(recs[0]["event"]["phase"], 1);
    assert_eq!(recs[1]["event"]["predecessor"]["event_id"], recs[0]["id"]);
}

#[test]
fn a_cancel_stops_a_running_worker_that_ignores_sigterm_through_the_two_phase_outbox() {
    let mut fx = Fx::new();
    let (a, b, _g, ops, _) = crew(&mut fx);
    let (src, child) = running_worker(&mut fx, &a);
    fx.ok(Some(&ops), "room_cancel", json!({"room": "coord"}));
    let w = wait_for(&mut fx, &src, "the worker was not stopped", |w| {
        w["state"] == "dead"
    });
    let l = &w["launches"][0];
    assert_eq!(l["outcome"], "stopped", "{w}");
    assert_stopped_in_two_phases(&mut fx, "room_cancelled");
    let job = &fx.ok(None, "stops_list", json!({}))["stops"][0]["phase_2"]["observed"];
    println!("observed: {job}");
    if job["kind"] == "cgroup" {
        assert!(gone(&child), "the setsid grandchild outlived its job");
    } else {
        // `child` is the grandchild's marker, not a pid: end it by its marker
        end_marked(&child);
    }
    assert_eq!(
        open_obligations(&mut fx, &b),
        1,
        "the obligation stays open"
    );
}

#[test]
fn break_glass_stops_every_worker_and_dispatches_nothing_until_released() {
    let mut fx = Fx::new();
    let (a, _b, _g, ops, _) = crew(&mut fx);
    let (src, child) = running_worker(&mut fx, &a);
    let on = fx.ok(Some(&ops), "break_glass", json!({"engage": true}));
    let epoch = on["control_epoch"].as_u64().unwrap();
    let w = wait_for(&mut fx, &src, "the worker was not stopped", |w| {
        w["state"] == "dead"
    });
    fx.refuse(
        None,
        "break_glass",
        json!({"engage": true}),
        "invalid_argument",
    );
    assert_eq!(w["launches"][0]["outcome"], "stopped", "{w}");
    assert_stopped_in_two_phases(&mut fx, "break_glass");
    end_marked(&child);
    // nothing is dispatched while it is engaged
    let queued = send(&mut fx, &a, "while the glass is broken");
    fx.ok(None, "wakes_check", json!({}));
    let w = wake(&mut fx, &queued);
    assert_eq!(w["dead_letter"]["code"], "wake_admission_closed", "{w}");
    let off = fx.ok(None, "break_glass", json!({"engage": false}));
    assert_eq!(off["control_epoch"].as_u64(), Some(epoch + 1));
    fx.refuse(
        None,
        "break_glass",
        json!({"engage": false}),
        "invalid_argument",
    );
}

#[test]
fn the_observer_stops_a_worker_whose_room_closes_admission_or_whose_agent_is_revoked() {
    for (op, args, reason) in [
        (
            "room_admission",
            json!({"room": "coord", "open": false}),
            "admission_closed",
        ),
        (
            "agent_revoke",
            json!({"name": "beta"}),
            "worker_authority_changed",
        ),
    ] {
        let mut fx = Fx::new();
        let (a, _b, _g, _ops, _) = crew(&mut fx);
        let (src, child) = running_worker(&mut fx, &a);
        fx.ok(None, op, args);
        let w = wait_for(&mut fx, &src, "the worker was not stopped", |w| {
            w["launches"][0]["state"] != "running"
        });
        assert_eq!(w["launches"][0]["outcome"], "stopped", "{op}: {w}");
        assert_stopped_in_two_phases(&mut fx, reason);
        let job = &fx.ok(None, "stops_list", json!({}))["stops"][0]["phase_2"]["observed"];
        if job["kind"] == "cgroup" {
            assert!(gone(&child), "{op}: the setsid grandchild outlived its job");
        } else {
            end_marked(&child);
        }
    }
}

#[test]
fn a_room_with_a_running_worker_is_not_archived_until_its_worker_is_stopped() {
    let mut fx = Fx::new();
    let (a, _b, _g, ops, _) = crew(&mut fx);
    let (src, child) = running_worker(&mut fx, &a);
    // its stop must be recordable in the room: an archived room takes no record
    let r = fx.refuse(
        None,
        "room_archive",
        json!({"room": "coord"}),
        "room_archive_refused",
    );
    assert!(r.to_string().contains("room cancel"), "{r}");
    fx.ok(Some(&ops), "room_cancel", json!({"room": "coord"}));
    wait_for(&mut fx, &src, "the worker was not stopped", |w| {
        w["state"] == "dead"
    });
    assert_stopped_in_two_phases(&mut fx, "room_cancelled");
    fx.ok(None, "room_archive", json!({"room": "coord"}));
    end_marked(&child);
}

#[test]
fn a_break_glass_moves_every_view_so_what_was_read_before_it_is_read_again() {
    let mut fx = Fx::new();
    let (a, _b, g, ops, _) = crew(&mut fx);
    fx.sync_all(&g, "coord");
    fx.sync_all(&a, "coord");
    // a page read under the first epoch, not yet confirmed
    let page = fx.ok(Some(&g), "sync", json!({"room": "coord"}));
    fx.ok(Some(&ops), "break_glass", json!({"engage": true}));
    // a reader caught up before the break-glass reads again, with a turn or a confirmation
    fx.refuse(
        Some(&a),
        "note",
        json!({"room": "coord", "text": "still here"}),
        "room_sync_view_changed",
    );
    fx.refuse(
        Some(&g),
        "sync",
        json!({"room": "coord", "confirm": page["receipt"]}),
        "room_sync_view_changed",
    );
    // released, the epoch moves again: read under the engaged one, read again once more
    fx.sync_all(&a, "coord");
    fx.ok(None, "break_glass", json!({"engage": false}));
    fx.refuse(
        Some(&a),
        "note",
        json!({"room": "coord", "text": "and now"}),
        "room_sync_view_changed",
    );
    fx.sync_all(&a, "coord");
    fx.ok(
        Some(&a),
        "note",
        json!({"room": "coord", "text": "read again"}),
    );
}

/// The first line a worker of `tests/workers/agent.py` prints carries its one-launch token.
fn worker_token(fx: &Fx) -> String {
    let start = Instant::now();
    loop {
        let found = std::fs::read_dir(fx.state.join("workers"))
            .unwrap()
            .flatten()
            .filter_map(|d| std::fs::read_to_string(d.path().join("stdout.log")).ok())
            .flat_map(|s| s.lines().map(String::from).collect::<Vec<_>>())
            .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
            .find_map(|v| v["token"].as_str().map(String::from));
        if let Some(t) = found {
            return t;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no worker token");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `task_cancel` withdraws the work, not only the task row: the running worker of a subtask
/// of the cancelled task (it ignores SIGTERM and leaves a `setsid` grandchild) is stopped
/// through the two-phase outbox at zero processes, its credential acts no more from the
/// cancel on, and its permit is dead.
#[test]
fn a_task_cancel_stops_the_running_work_of_the_task_and_its_subtasks() {
    let mut fx = Fx::new();
    let (a, b, _g, _ops, _) = crew(&mut fx);
    route(&fx, "stubborn");
    let create = |fx: &mut Fx, args: Value| {
        fx.ok(Some(&a), "task_create", args)["task"]["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let parent = create(
        &mut fx,
        json!({"room": "coord", "title": "the release", "to": "beta"}),
    );
    let sub = create(
        &mut fx,
        json!({"room": "coord", "title": "build it", "to": "beta", "parent": parent}),
    );
    fx.tasks.push(sub.clone());
    fx.sync_all(&a, "coord");
    let src = fx.ok(
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["beta"], "text": "build it", "task": sub}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string();
    let w = wait_for(&mut fx, &src, "the launch never ran", |w| {
        w["launches"][0]["state"] == "running"
    });
    let marker = format!(
        "room-test-stubborn-{}",
        w["launches"][0]["launch"]
            .as_str()
            .expect("the launch's id")
    );
    let start = Instant::now();
    while gone(&marker) {
        assert!(start.elapsed() < Duration::from_secs(30), "no grandchild");
        std::thread::sleep(Duration::from_millis(50));
    }
    let token = worker_token(&fx);
    // carried out of its job, the live credential works nowhere but its broker
    fx.refuse(
        Some(&token),
        "whoami",
        json!({}),
        "launch_credential_outside_broker",
    );
    let c = fx.ok(Some(&a), "task_cancel", json!({"task": parent}));
    assert_eq!(c["status"], "cancelled", "{c}");
    // from the cancel on, the worker's credential acts no more (before the observer's trip)
    let r = fx.call(
        Some(&token),
        "note",
        json!({"room": "coord", "text": "still here"}),
    );
    let refusal = expect_code(r, "credential_revoked", "a call after the task's cancel");
    assert_eq!(refusal.detail["reason"], "task_cancelled", "{refusal}");
    assert_eq!(refusal.detail["task"], parent.as_str(), "{refusal}");
    let w = wait_for(&mut fx, &src, "the worker was not stopped", |w| {
        w["state"] == "dead"
    });
    assert_eq!(w["launches"][0]["outcome"], "stopped", "{w}");
    assert_stopped_in_two_phases(&mut fx, "task_cancelled");
    let job = &fx.ok(None, "stops_list", json!({}))["stops"][0]["phase_2"]["observed"];
    if job["kind"] == "cgroup" {
        assert!(gone(&marker), "the setsid grandchild outlived its job");
    } else {
        end_marked(&marker);
    }
    // the subtask itself stays as it was (it can no longer close: its ancestry is not live)
    assert_eq!(fx.task_status(&sub), "open");
    let _ = b;
}
