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
            answer_by_hand(p, &w);
        }
    }
    acp_rungs(p, &a, &w);
    p.call(None, "route_remove", json!({"name": "c09_worker"}));
    vec![
        "a loaded session's replay counted apart, and a third party's agent (the ACP Python SDK agent and the published bridges: room-cli's acp tests)",
    ]
}

/// The rungs only a native session can show, with Room's scripted ACP agent (`room
/// agent-acp`) behind an `acp` route: a reply in its session, a turn ended without one, an
/// update from another session, and a turn that never ends until `session/cancel`.
fn acp_rungs(p: &mut Prover, a: &str, w: &str) {
    let exe = std::env::current_exe().map_or_else(|_| "room".into(), |e| e.display().to_string());
    // (mode, permit state, outcome, proof, obligation left open)
    let cases = [
        ("reply", "replied", "replied", "replied", false),
        (
            "silent",
            "pending_reply",
            "body_visible_pending_reply",
            "body_visible_pending_reply",
            true,
        ),
        (
            "wrong_body",
            "failed",
            "wrong_body_rejected",
            "wrong_body_rejected",
            true,
        ),
        ("hang", "failed", "timed_out", "delivered_to_body", true),
    ];
    for (mode, state, outcome, proof, left_open) in cases {
        p.ok(
            &format!("the owner routes c09_worker to an ACP agent (room agent-acp --mode {mode})"),
            None,
            "route_set",
            // only the hanging agent is meant to meet its deadline; the others get room to
            // start, catch up and answer on a loaded machine
            json!({"agent": "c09_worker", "route": {"adapter": "acp",
                "command": [exe, "agent-acp", "--mode", mode],
                "timeout_ms": if mode == "hang" { 4_000 } else { 30_000 }}}),
        );
        let source = ask(p, a, "lobby", "c09_worker", "are you there?");
        let row = wait_for(p, &source, |w| {
            !matches!(w["state"].as_str(), Some("queued" | "dispatched") | None)
        });
        let launch = &row["launches"][0];
        p.record(
            format!("an ACP agent in mode {mode} ends {outcome}, proof {proof}"),
            row["state"] == state && launch["outcome"] == outcome && launch["proof"] == proof,
            format!(
                "permit {}, launch {} (proof {}, session {})",
                row["state"], launch["outcome"], launch["proof"], launch["adapter"]["session"]
            ),
        );
        let open = obligation_open(p, w, "lobby");
        p.record(
            if left_open {
                "no reply in its session: the obligation is open"
            } else {
                "its reply resolved the obligation"
            },
            open == left_open,
            format!("obligation open: {open}"),
        );
        if open {
            answer_by_hand(p, w);
        }
    }
}

/// Answer every obligation `w` has open in the lobby (reading through whenever the room
/// moved), so that the next case starts from none.
fn answer_by_hand(p: &mut Prover, w: &str) {
    for _ in 0..16 {
        p.catch_up(w, "lobby");
        let page = p
            .call(Some(w), "sync", json!({"room": "lobby"}))
            .result
            .unwrap_or_default();
        let open = page["open_items"]
            .as_array()
            .and_then(|items| items.iter().find(|i| i["kind"] == "obligation"))
            .and_then(|i| i["id"].as_str().map(String::from));
        let Some(id) = open else { return };
        p.call(
            Some(w),
            "reply",
            json!({"room": "lobby", "reply_to": id, "text": "answered by hand"}),
        );
    }
}

/// 04-C10: the owner's cancel holds an operation in flight, dead-letters a queued permit,
/// stops a running worker in two journaled phases that end at zero processes, and leaves
/// obligations open; the hold is reconciled with evidence, and the room resumes.
pub(super) fn c10(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    let holder = p.recruit("c10-holder", "member");
    let worker = p.recruit("c10_worker", "member");
    p.recruit("c10_stubborn", "member");
    p.ok(
        "a room of its own",
        None,
        "room_create",
        json!({"name": "halt", "members": ["alpha", "c10-holder", "c10_worker", "c10_stubborn"]}),
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
    // a hostile tree: the worker and a grandchild in a session of its own, both ignoring SIGTERM
    route(p, "c10_stubborn", &["stubborn"]);
    let hostile = ask(p, &a, "halt", "c10_stubborn", "work and do not stop");
    let srow = wait_for(p, &hostile, |w| w["launches"][0]["state"] == "running");
    let marker = format!(
        "room-stubborn-{}",
        srow["launches"][0]["launch"].as_str().unwrap_or("none")
    );
    let mut tree = 0;
    for _ in 0..200 {
        tree = marked(&marker);
        if tree >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    p.record(
        "a stubborn worker runs with a grandchild in a session of its own, both ignoring SIGTERM",
        tree >= 2,
        format!("{tree} processes named {marker}"),
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
    let h = wait_for(p, &hostile, |w| w["state"] == "dead");
    p.record(
        "the stubborn worker is stopped too",
        h["launches"][0]["outcome"] == "stopped",
        format!("launch outcome {}", h["launches"][0]["outcome"]),
    );
    stopped_at_zero(p, &h["launches"][0]["launch"]);
    let left = marked(&marker);
    p.record(
        "no process of the hostile tree is left, as /proc sees it",
        left == 0,
        format!("{left} processes named {marker}"),
    );
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
    p.call(None, "route_remove", json!({"name": "c10_stubborn"}));
    p.ok(
        "the owner resumes the room",
        None,
        "room_resume",
        json!({"room": "halt"}),
    );
    super::crash::between_the_phases(p);
    vec![
        "a crash between phase 2 and its commit, and the subreaper jobs' crash (room-cli's stop_crash test proves both)",
    ]
}

/// Processes whose command line names `marker`, as this machine's /proc shows them.
pub(super) fn marked(marker: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| c.split(|b| *b == 0).any(|arg| arg == marker.as_bytes()))
        .count()
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

/// 04-C08: the evidence a wake cites is measured again when it is delivered, for that
/// recipient (a file changed since it was registered is withheld, not served); a governed
/// task closes only once its closer has read every part of its source whole since the claim.
pub(super) fn c08(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    let r = p.recruit("c08-reader", "member");
    let _ = std::fs::create_dir_all(p.project.join("c08"));
    let _ = std::fs::write(p.project.join("c08/spec.md"), "the spec, as registered\n");
    let t = p
        .ok(
            "a task for the reader",
            Some(&a),
            "task_create",
            json!({"room": "build", "title": "review", "to": "c08-reader"}),
        )
        .and_then(|v| v["task"]["id"].as_str().map(String::from))
        .unwrap_or_default();
    let register = |p: &mut Prover, origin: &str| -> String {
        p.ok(
            &format!("alpha registers evidence {origin}"),
            Some(&a),
            "evidence_register",
            json!({"room": "build", "task": t, "origin": origin, "summary": origin}),
        )
        .and_then(|v| v["evidence"].as_str().map(String::from))
        .unwrap_or_default()
    };
    let web = register(p, "url:https://example.test/spec");
    let file = register(p, "file:c08/spec.md");
    p.catch_up(&a, "build");
    let source = p
        .ok(
            "alpha sends the task citing both",
            Some(&a),
            "send",
            json!({"room": "build", "to": ["c08-reader"], "task": t,
                "text": "@c08-reader review against these", "evidence": [web, file]}),
        )
        .and_then(|v| v["event"].as_str().map(String::from))
        .unwrap_or_default();
    let _ = std::fs::write(p.project.join("c08/spec.md"), "the spec, changed since\n");
    let taken = p
        .ok(
            "the reader's own session takes the wake",
            Some(&r),
            "wake_take",
            json!({"room": "build", "source_event": source}),
        )
        .unwrap_or_default();
    let ev = &taken["taken"]["evidence"];
    let served = ev["served"].as_array().cloned().unwrap_or_default();
    let withheld = ev["withheld"].as_array().cloned().unwrap_or_default();
    p.record(
        "the receipt is the recipient's, measured at delivery",
        ev["recipient"] == "c08-reader" && ev["tool"] == "wake_delivery",
        format!("receipt {} for {}", ev["id"], ev["recipient"]),
    );
    p.record(
        "the unchanged origin is served, the file changed since registration is withheld",
        served.iter().any(|s| s["evidence"] == web.as_str())
            && withheld
                .iter()
                .any(|w| w["evidence"] == file.as_str() && w["reason"] == "content_mismatch"),
        format!("served {}, withheld {}", served.len(), json!(withheld)),
    );
    if let Some(ob) = taken["taken"]["obligation_ids"][0].as_str() {
        let ob = ob.to_string();
        p.catch_up(&r, "build");
        p.call(
            Some(&r),
            "reply",
            json!({"room": "build", "reply_to": ob, "text": "reviewed"}),
        );
    }
    coverage(p, &a);
    vec![
        "the seed's upper bound of a reading window (reads count from the claim on)",
        "evidence withheld from a recipient by its audience is refused when the send is sealed, not at delivery",
    ]
}

/// A governed task's `done` waits for every byte of its source to be read by its closer.
fn coverage(p: &mut Prover, a: &str) {
    let c = p.recruit("c08-closer", "member");
    let _ = std::fs::write(
        p.project.join("spec.md"),
        "0123456789abcdefghijklmnopqrstuvwxyzABCD",
    );
    let _ = std::fs::write(p.project.join("annex.md"), "annex\n");
    let pid = p
        .call(None, "project_list", json!({}))
        .result
        .and_then(|v| v["projects"][0]["id"].as_str().map(String::from))
        .unwrap_or_default();
    p.ok(
        "the owner names the project's governing source",
        None,
        "project_source",
        json!({"project": pid, "parts": ["spec.md", "annex.md"]}),
    );
    let t = p
        .ok(
            "a governed task for the closer",
            Some(a),
            "task_create",
            json!({"room": "build", "title": "renewal", "to": "c08-closer", "governed": true,
                "accept": [{"kind": "file_exists", "path": "c08/out.txt"}]}),
        )
        .and_then(|v| v["task"]["id"].as_str().map(String::from))
        .unwrap_or_default();
    p.ok(
        "the closer claims it",
        Some(&c),
        "task_claim",
        json!({"task": t}),
    );
    let _ = std::fs::write(p.project.join("c08/out.txt"), "done\n");
    p.catch_up(&c, "build");
    p.refused(
        "done before reading the source is refused, naming what is unread",
        Some(&c),
        "done",
        json!({"room": "build", "task": t}),
        "source_coverage_incomplete",
        Some("build"),
    );
    for (part, offset, length) in [(0, 0, Some(10)), (0, 20, None)] {
        p.call(
            Some(&c),
            "source_read",
            json!({"task": t, "part": part, "offset": offset, "length": length}),
        );
    }
    let gap = p.call(Some(&c), "done", json!({"room": "build", "task": t}));
    let missing = gap
        .refusal
        .as_ref()
        .map(|r| r.detail["missing"][0]["missing"].clone())
        .unwrap_or_default();
    p.record(
        "a gap in the reading is named to the byte",
        missing == json!([[10, 20]]),
        format!("missing {missing}"),
    );
    for (part, offset) in [(0, 10), (1, 0)] {
        p.call(
            Some(&c),
            "source_read",
            json!({"task": t, "part": part, "offset": offset}),
        );
    }
    p.catch_up(&c, "build");
    p.ok(
        "read whole, done passes",
        Some(&c),
        "done",
        json!({"room": "build", "task": t}),
    );
    p.call(None, "project_source", json!({"project": pid, "parts": []}));
}
