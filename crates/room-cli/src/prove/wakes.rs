//! The cards of the claims about delivery and stopping: native delivery and reply as
//! distinct proof states (04-C09), and cancellation confirmed only at zero processes (04-C10).
//! Both run real `room agent-script` worker processes.

use super::{Cast, Prover};
use serde_json::{Value, json};
use std::time::Duration;

/// A permit's row in the owner's wake listing (null when it is not listed).
fn wake_of(p: &mut Prover, source: &str) -> Value {
    let all = p
        .call(None, "wakes_list", json!({}))
        .result
        .unwrap_or_default();
    all["wakes"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["source_event"] == source))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Poll `source`'s permit until `done` holds of it (at most 30 s); the last row seen.
fn wait_for(p: &mut Prover, source: &str, done: impl Fn(&Value) -> bool) -> Value {
    let mut w = Value::Null;
    for _ in 0..600 {
        w = wake_of(p, source);
        if done(&w) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    w
}

/// Route `agent` to Room's scripted agent with `steps`.
fn route(p: &mut Prover, agent: &str, steps: &[&str]) {
    p.ok(
        &format!(
            "the owner routes {agent} to a scripted worker ({})",
            steps.join(", ")
        ),
        None,
        "route_set",
        json!({"agent": agent, "route": {"adapter": "script", "steps": steps}}),
    );
}

/// `from` asks `to` in `room`; the send's event.
fn ask(p: &mut Prover, from: &str, room: &str, to: &str, text: &str) -> String {
    p.catch_up(from, room);
    p.ok(
        &format!("alpha asks {to}"),
        Some(from),
        "send",
        json!({"room": room, "to": [to], "text": format!("@{to} {text}")}),
    )
    .and_then(|v| v["event"].as_str().map(String::from))
    .unwrap_or_default()
}

/// Whether `token`'s reader has an obligation open in `room`.
fn obligation_open(p: &mut Prover, token: &str, room: &str) -> bool {
    let page = p
        .call(Some(token), "sync", json!({"room": room}))
        .result
        .unwrap_or_default();
    page["open_items"]
        .as_array()
        .is_some_and(|items| items.iter().any(|i| i["kind"] == "obligation"))
}

/// 04-C09: a worker that replies is `replied`; one that only exits is `process_exit_only`
/// with its obligation left open; one that fails is `failed`, also left open.
pub(super) fn c09(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    let w = p.recruit("c09_worker", "member");
    let cases: [(&[&str], &str, &str, bool); 3] = [
        (&["read", "reply"], "replied", "replied", false),
        (&["exit"], "pending_reply", "process_exit_only", true),
        (&["fail"], "failed", "failed", true),
    ];
    for (steps, state, outcome, left_open) in cases {
        route(p, "c09_worker", steps);
        let source = ask(p, &a, "lobby", "c09_worker", "are you there?");
        let row = wait_for(p, &source, |w| {
            !matches!(w["state"].as_str(), Some("queued" | "dispatched") | None)
        });
        let launch = &row["launches"][0];
        p.record(
            format!(
                "a worker whose steps are {} ends {outcome}",
                steps.join(", ")
            ),
            row["state"] == state && launch["outcome"] == outcome,
            format!(
                "permit {}, launch {} (proof {})",
                row["state"], launch["outcome"], launch["proof"]
            ),
        );
        let open = obligation_open(p, &w, "lobby");
        p.record(
            if left_open {
                "its exit alone resolved nothing: the obligation is open"
            } else {
                "its reply resolved the obligation"
            },
            open == left_open,
            format!("obligation open: {open}"),
        );
        // what stays open is answered, so the next case starts from none
        if open {
            p.catch_up(&w, "lobby");
            let page = p
                .call(Some(&w), "sync", json!({"room": "lobby"}))
                .result
                .unwrap_or_default();
            if let Some(id) = page["open_items"][0]["id"].as_str() {
                let id = id.to_string();
                p.call(
                    Some(&w),
                    "reply",
                    json!({"room": "lobby", "reply_to": id, "text": "answered by hand"}),
                );
            }
        }
    }
    p.call(None, "route_remove", json!({"name": "c09_worker"}));
    vec![
        "body_visible_pending_reply and wrong_body_rejected: they need an ACP agent (tests/acp proves them)",
    ]
}

/// 04-C10: the owner's cancel holds an operation in flight, dead-letters a queued permit,
/// stops a running worker in two journaled phases that end at zero processes, and leaves
/// obligations open; the hold is reconciled with evidence, and the room resumes.
pub(super) fn c10(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    let holder = p.recruit("c10-holder", "member");
    let worker = p.recruit("c10_worker", "member");
    p.ok(
        "a room of its own",
        None,
        "room_create",
        json!({"name": "halt", "members": ["alpha", "c10-holder", "c10_worker"]}),
    );
    let t = p
        .ok(
            "a scoped task for the holder",
            Some(&a),
            "task_create",
            json!({"room": "halt", "title": "deploy", "to": "c10-holder", "scopes": ["api:deploy"]}),
        )
        .and_then(|v| v["task"]["id"].as_str().map(String::from))
        .unwrap_or_default();
    p.ok(
        "the holder claims it",
        Some(&holder),
        "task_claim",
        json!({"task": t}),
    );
    let op = p
        .ok(
            "the holder begins an external operation",
            Some(&holder),
            "op_begin",
            json!({"room": "halt", "task": t, "destination": "api:deploy"}),
        )
        .and_then(|v| v["op"].as_str().map(String::from))
        .unwrap_or_default();
    route(p, "c10_worker", &["hang"]);
    let running = ask(p, &a, "halt", "c10_worker", "work until stopped");
    let row = wait_for(p, &running, |w| w["launches"][0]["state"] == "running");
    p.record(
        "a worker process runs",
        row["launches"][0]["state"] == "running",
        format!("launch {}", row["launches"][0]["launch"]),
    );
    let queued = ask(p, &a, "halt", "c10_worker", "and this after");
    p.refused(
        "an agent without control standing cannot cancel",
        Some(&a),
        "room_cancel",
        json!({"room": "halt"}),
        "control_standing_required",
        Some("halt"),
    );
    p.refused(
        "a room with a running worker is not archived",
        None,
        "room_archive",
        json!({"room": "halt"}),
        "room_archive_refused",
        Some("halt"),
    );
    let cancel = p
        .ok(
            "the owner cancels the room",
            None,
            "room_cancel",
            json!({"room": "halt"}),
        )
        .unwrap_or_default();
    let held: Vec<&Value> = cancel["held"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| h["item"] == op.as_str() && h["held_until_reconciled"] == true)
        .collect();
    p.record(
        "the operation in flight is held until reconciled",
        held.len() == 1,
        format!("held {}", cancel["held"]),
    );
    let hold = held
        .first()
        .and_then(|h| h["hold"].as_str())
        .unwrap_or_default()
        .to_string();
    let q = wait_for(p, &queued, |w| w["state"] == "dead");
    p.record(
        "the queued permit is dead-lettered",
        q["dead_letter"]["code"] == "room_cancelled",
        format!("dead letter {}", q["dead_letter"]["code"]),
    );
    let r = wait_for(p, &running, |w| w["state"] == "dead");
    p.record(
        "the running worker is stopped",
        r["launches"][0]["outcome"] == "stopped",
        format!("launch outcome {}", r["launches"][0]["outcome"]),
    );
    stopped_at_zero(p, &r["launches"][0]["launch"]);
    let open = obligation_open(p, &worker, "halt");
    p.record(
        "the stopped worker's obligations stay open",
        open,
        format!("obligation open: {open}"),
    );
    p.ok(
        "the owner reconciles the hold with evidence",
        None,
        "room_reconcile",
        json!({"room": "halt", "hold": hold, "outcome": "not_accepted",
            "evidence": "the deploy api shows no release"}),
    );
    p.call(None, "route_remove", json!({"name": "c10_worker"}));
    p.ok(
        "the owner resumes the room",
        None,
        "room_resume",
        json!({"room": "halt"}),
    );
    vec![
        "a worker that ignores SIGTERM or leaves a grandchild (the cancel suite's stubborn agent proves it)",
        "a crash between the stop outbox's phases (room-cli's stop_crash test proves it)",
    ]
}

/// The stop outbox's record of `launch`: both phases committed, the second confirming an
/// empty job.
fn stopped_at_zero(p: &mut Prover, launch: &Value) {
    let mut stop = Value::Null;
    for _ in 0..200 {
        let all = p
            .call(None, "stops_list", json!({}))
            .result
            .unwrap_or_default();
        stop = all["stops"]
            .as_array()
            .and_then(|s| s.iter().find(|s| &s["launch"] == launch))
            .cloned()
            .unwrap_or(Value::Null);
        if stop["committed"]["phase_2"] == true {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let observed = &stop["phase_2"]["observed"];
    p.record(
        "its stop is confirmed in two committed phases, at zero processes",
        stop["committed"]["phase_1"] == true
            && stop["committed"]["phase_2"] == true
            && stop["termination_confirmed"] == true
            && observed["confirmed_empty"] == true
            && observed["remaining"].as_array().is_some_and(Vec::is_empty),
        format!(
            "phase 1 {}, phase 2 {}, observed {observed}",
            stop["phase_1"]["event_id"], stop["phase_2"]["event_id"]
        ),
    );
}
