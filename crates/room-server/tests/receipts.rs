//! `worker_receipt` acceptance through the daemon API: the three profiles measured on the
//! journaled submissions of a task (its proposal records), each failing until what it needs
//! is true and passing once it is; refusals change nothing.

mod common;

use common::*;
use room_core::Refusal;
use serde_json::{Value, json};

/// alpha (coordinator) owns, beta works, in the project room `build` over `data.json`.
fn setup(fx: &mut Fx) -> (String, String) {
    let a = fx.enroll("alpha", "coordinator");
    let b = fx.enroll("beta", "member");
    let (dir, pid) = fx.open_project("p1");
    std::fs::write(
        dir.join("data.json"),
        br#"[{"id":1,"v":1,"name":"a"},{"id":2,"v":1,"name":"b"}]"#,
    )
    .unwrap();
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta"]}),
    );
    (a, b)
}

/// A task for beta projecting row 2's `name` of `data.json`, with `accept`.
fn task(fx: &mut Fx, a: &str, accept: Value) -> String {
    let dir = fx.root.join("work").join("p1");
    let sha = room_core::sha256_hex(&std::fs::read(dir.join("data.json")).unwrap());
    let stage = json!([{"path": "data.json", "sha256": sha,
        "project": {"format": "json", "key": "id", "version": "v", "columns": ["name"], "rows": ["2"]}}]);
    let t = fx.ok(
        Some(a),
        "task_create",
        json!({"room": "build", "title": "rename", "to": "beta", "stage": stage, "accept": accept}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    fx.tasks.push(t.clone());
    t
}

fn propose(fx: &mut Fx, b: &str, task: &str, version: i64, name: &str) -> Value {
    let out = fx.ok(
        Some(b),
        "task_propose",
        json!({"task": task, "path": "data.json", "key": "2", "version": version,
            "set": {"name": name}}),
    );
    assert_eq!(out["outcome"], "applied", "{out}");
    out
}

fn check(fx: &mut Fx, tok: &str, task: &str) -> Value {
    fx.ok(Some(tok), "task_check", json!({"task": task}))
}

/// Call as beta in another session (conversation) than the default one.
fn other_session(fx: &mut Fx, b: &str, op: &str, args: Value) -> Value {
    let mut req = request(Some(b), op, args);
    req.conversation = Some("beta-second-session".into());
    let r = fx.send(&req);
    assert!(r.ok, "{op}: {:?}", r.refusal);
    r.result.expect("an ok response carries a result")
}

fn sync_other(fx: &mut Fx, b: &str) {
    let mut page = other_session(fx, b, "sync", json!({"room": "build"}));
    for _ in 0..100 {
        let next = other_session(
            fx,
            b,
            "sync",
            json!({"room": "build", "confirm": page["receipt"]}),
        );
        if next["more"] == false && next["items"].as_array().is_some_and(|a| a.is_empty()) {
            return;
        }
        page = next;
    }
    panic!("the second session never caught up");
}

/// `done` refused with `task_acceptance_failed`: the journal and the task are as they were
/// (the evaluation is kept as the task's newest observation, by design).
fn done_refused(fx: &mut Fx, b: &str, task: &str) -> Refusal {
    let before = (fx.journal_lines(), fx.task_status(task));
    let r = fx.call(Some(b), "done", json!({"room": "build", "task": task}));
    let refusal = expect_code(r, "task_acceptance_failed", "done");
    assert_eq!(before, (fx.journal_lines(), fx.task_status(task)));
    refusal
}

fn result(ev: &Value, i: usize) -> &Value {
    &ev["acceptance_results"][i]
}

#[test]
fn basic_and_strict_receipts_need_a_read_result_and_the_proposing_sessions_return() {
    let mut fx = Fx::new();
    let (a, b) = setup(&mut fx);
    let t = task(
        &mut fx,
        &a,
        json!([{"kind": "worker_receipt", "profile": "basic"},
            {"kind": "worker_receipt", "profile": "strict", "worker": "beta",
             "target": {"path": "data.json", "key": "2"}, "fields": ["name"]}]),
    );
    fx.ok(Some(&b), "task_claim", json!({"task": t}));
    // nothing submitted: neither proves anything, and done is refused with nothing changed
    let ev = check(&mut fx, &b, &t);
    assert_eq!(ev["acceptance_pass"], false, "{ev}");
    assert_eq!(result(&ev, 0)["detail"]["terminal"], 0, "{ev}");
    assert_eq!(result(&ev, 1)["detail"]["candidates"], 0, "{ev}");
    fx.sync_all(&b, "build");
    let r = done_refused(&mut fx, &b, &t);
    assert_eq!(
        r.detail["acceptance_results"][0]["kind"], "worker_receipt",
        "{r}"
    );
    // submitted: its result is unread until the proposing session goes on past it
    let out = propose(&mut fx, &b, &t, 1, "z");
    let (prp, rec) = (out["proposal"].clone(), out["event"].clone());
    assert_eq!(out["worker"], "beta", "{out}");
    let ev = check(&mut fx, &b, &t);
    assert_eq!(
        result(&ev, 0)["detail"]["worker_unread"],
        json!([prp]),
        "{ev}"
    );
    assert_eq!(result(&ev, 1)["detail"]["proposal"], prp, "{ev}");
    assert_eq!(result(&ev, 1)["detail"]["result_read"], false, "{ev}");
    // another session of the same agent reads and cites it: not the original session
    sync_other(&mut fx, &b);
    other_session(
        &mut fx,
        &b,
        "note",
        json!({"room": "build", "text": "seen elsewhere", "parents": [rec]}),
    );
    let ev = check(&mut fx, &b, &t);
    assert_eq!(ev["acceptance_pass"], false, "{ev}");
    assert_eq!(
        result(&ev, 0)["detail"]["worker_unread"],
        json!([prp]),
        "{ev}"
    );
    assert!(result(&ev, 1)["detail"].get("proof").is_none(), "{ev}");
    // the proposing session reads on and answers the result citing its record
    fx.sync_all(&b, "build");
    let ev = check(&mut fx, &b, &t);
    assert_eq!(result(&ev, 0)["pass"], true, "{ev}");
    assert_eq!(
        result(&ev, 1)["pass"],
        false,
        "read, not yet answered: {ev}"
    );
    assert_eq!(result(&ev, 1)["detail"]["result_read"], true, "{ev}");
    let note = fx.ok(
        Some(&b),
        "note",
        json!({"room": "build", "text": "applied, version 2", "parents": [rec]}),
    );
    let ev = check(&mut fx, &b, &t);
    assert_eq!(ev["acceptance_pass"], true, "{ev}");
    assert_eq!(
        result(&ev, 0)["detail"]["proof"],
        "terminal-submissions-read"
    );
    let strict = &result(&ev, 1)["detail"];
    assert_eq!(
        (
            strict["profile"].as_str(),
            strict["proposals"].as_str(),
            strict["worker"].as_str(),
            strict["proof"].as_str()
        ),
        (
            Some("strict"),
            Some("task"),
            Some("beta"),
            Some("original-session-return-verified")
        ),
        "the seed's Exhibit 4 shape: {ev}"
    );
    assert_eq!(strict["returned_by"], note["event"], "{ev} {note}");
    assert_eq!(
        (
            strict["from_version"].as_i64(),
            strict["to_version"].as_i64()
        ),
        (Some(1), Some(2))
    );
    // task show lists the submission with the digests a successor pins
    let shown = fx.ok(Some(&a), "task_show", json!({"task": t}));
    let sub = &shown["submissions"][0];
    assert_eq!(
        (sub["proposal"].clone(), sub["result_read"].clone()),
        (prp, json!(true))
    );
    for d in ["proposal_sha256", "record_sha256", "outcome_sha256"] {
        assert_eq!(sub[d].as_str().map(str::len), Some(64), "{d}: {shown}");
    }
    fx.sync_all(&b, "build");
    fx.ok(Some(&b), "done", json!({"room": "build", "task": t}));
    assert_eq!(fx.task_status(&t), "done");
}

#[test]
fn a_strict_receipt_proves_one_submission_exactly() {
    let mut fx = Fx::new();
    let (a, b) = setup(&mut fx);
    let strict = |fields: Value| {
        json!({"kind": "worker_receipt", "profile": "strict", "worker": "beta",
            "target": {"path": "data.json", "key": "2"}, "fields": fields})
    };
    let t = task(&mut fx, &a, json!([strict(json!(["name", "v"]))]));
    fx.ok(Some(&b), "task_claim", json!({"task": t}));
    let first = propose(&mut fx, &b, &t, 1, "y");
    fx.sync_all(&b, "build");
    fx.ok(
        Some(&b),
        "note",
        json!({"room": "build", "text": "done", "parents": [first["event"]]}),
    );
    // the fields it set are not the fields the check names
    let ev = check(&mut fx, &b, &t);
    assert_eq!(result(&ev, 0)["detail"]["candidates"], 0, "{ev}");
    // two submissions fit: ambiguous until one is pinned
    fx.ok(
        Some(&a),
        "task_amend",
        json!({"task": t, "accept": [strict(json!(["name"]))]}),
    );
    fx.ok(Some(&b), "task_claim", json!({"task": t}));
    propose(&mut fx, &b, &t, 2, "x");
    let ev = check(&mut fx, &b, &t);
    assert_eq!(result(&ev, 0)["detail"]["candidates"], 2, "{ev}");
    assert!(
        result(&ev, 0)["detail"]["error"]
            .as_str()
            .unwrap()
            .contains("proposal_id"),
        "{ev}"
    );
    let mut pinned = strict(json!(["name"]));
    pinned["proposal_id"] = first["proposal"].clone();
    fx.ok(
        Some(&a),
        "task_amend",
        json!({"task": t, "accept": [pinned]}),
    );
    fx.ok(Some(&b), "task_claim", json!({"task": t}));
    let ev = check(&mut fx, &b, &t);
    assert_eq!(result(&ev, 0)["pass"], true, "{ev}");
    assert_eq!(result(&ev, 0)["detail"]["proposal"], first["proposal"]);
}

#[test]
fn a_pending_intention_holds_a_basic_receipt_until_it_is_recorded() {
    let mut fx = Fx::new();
    let (a, b) = setup(&mut fx);
    let t = task(
        &mut fx,
        &a,
        json!([{"kind": "worker_receipt", "profile": "basic"}]),
    );
    fx.ok(Some(&b), "task_claim", json!({"task": t}));
    propose(&mut fx, &b, &t, 1, "z");
    fx.sync_all(&b, "build");
    assert_eq!(check(&mut fx, &b, &t)["acceptance_pass"], true);
    // what a crash between an intention and its record leaves in the outbox
    let outbox = fx.state.join("proposals");
    std::fs::create_dir_all(&outbox).unwrap();
    std::fs::write(
        outbox.join("prp_00000000000000aa.json"),
        serde_json::to_vec(&json!({"id": "prp_00000000000000aa", "task": t})).unwrap(),
    )
    .unwrap();
    let ev = check(&mut fx, &b, &t);
    assert_eq!(ev["acceptance_pass"], false, "{ev}");
    assert_eq!(
        result(&ev, 0)["detail"]["recording_pending"],
        json!(["prp_00000000000000aa"]),
        "{ev}"
    );
    done_refused(&mut fx, &b, &t);
    // an intention that cannot be read is not read as absent
    std::fs::write(outbox.join("prp_00000000000000aa.json"), b"{torn").unwrap();
    let ev = check(&mut fx, &b, &t);
    assert_eq!(
        result(&ev, 0)["detail"]["observation"],
        "unconfirmed",
        "{ev}"
    );
    std::fs::remove_file(outbox.join("prp_00000000000000aa.json")).unwrap();
    fx.ok(Some(&b), "done", json!({"room": "build", "task": t}));
}

#[test]
fn a_successor_acknowledges_a_historical_result_without_standing_for_the_original_return() {
    let mut fx = Fx::new();
    let (a, b) = setup(&mut fx);
    let old = task(
        &mut fx,
        &a,
        json!([{"kind": "worker_receipt", "profile": "basic"}]),
    );
    fx.ok(Some(&b), "task_claim", json!({"task": old}));
    let out = propose(&mut fx, &b, &old, 1, "z");
    // the owner asks for the result on the old task: an obligation of beta's on it
    fx.sync_all(&a, "build");
    let asked = fx.ok(
        Some(&a),
        "send",
        json!({"room": "build", "to": ["beta"], "task": old, "text": "@beta report the rename"}),
    );
    assert_eq!(
        asked["obligations"].as_array().map(Vec::len),
        Some(1),
        "{asked}"
    );
    let shown = fx.ok(Some(&a), "task_show", json!({"task": old}));
    let sub = shown["submissions"][0].clone();
    let pins = |outcome_sha256: &Value| {
        json!([{"kind": "worker_receipt", "profile": "successor", "proposals": "successor",
            "worker": "beta", "proposal_id": sub["proposal"], "proposal_sha256": sub["proposal_sha256"],
            "record_sha256": sub["record_sha256"], "outcome_sha256": outcome_sha256,
            "outcome": "applied"}])
    };
    let new = task(&mut fx, &a, pins(&json!("0".repeat(64))));
    fx.ok(
        Some(&a),
        "task_supersede",
        json!({"task": old, "successor": new}),
    );
    let ev = check(&mut fx, &a, &new);
    assert_eq!(
        result(&ev, 0)["detail"]["pins_mismatched"],
        json!(["outcome_sha256"]),
        "{ev}"
    );
    fx.ok(
        Some(&a),
        "task_amend",
        json!({"task": new, "accept": pins(&sub["outcome_sha256"])}),
    );
    fx.ok(Some(&b), "task_claim", json!({"task": new}));
    let ev = check(&mut fx, &b, &new);
    assert_eq!(result(&ev, 0)["pass"], false, "not yet acknowledged: {ev}");
    // a message about the old task is not an acknowledgment on this one
    fx.sync_all(&b, "build");
    fx.ok(
        Some(&b),
        "note",
        json!({"room": "build", "text": "old news", "parents": [out["event"]]}),
    );
    assert_eq!(check(&mut fx, &b, &new)["acceptance_pass"], false);
    let ack = fx.ok(
        Some(&b),
        "note",
        json!({"room": "build", "task": new, "text": "the rename is in", "parents": [out["event"]]}),
    );
    let ev = check(&mut fx, &b, &new);
    let d = &result(&ev, 0)["detail"];
    assert_eq!(d["proof"], "successor-acknowledgment-verified", "{ev}");
    assert_eq!(d["acknowledged_by"], ack["event"]);
    assert_eq!(d["predecessor"], json!(old));
    assert_eq!(
        (
            d["satisfies_original_return"].clone(),
            d["resolves_original_obligation"].clone()
        ),
        (json!(false), json!(false))
    );
    // done closes the successor and leaves the original task's obligations open
    let done = fx.ok(Some(&b), "done", json!({"room": "build", "task": new}));
    assert_eq!(fx.task_status(&new), "done");
    assert_eq!(
        done["detail"]["verified_successor_of"],
        json!([old]),
        "{done}"
    );
    assert_eq!(done["resolved"], json!([]), "{done}");
    assert_eq!(done["detail"]["original_obligations_kept"], 1, "{done}");
}

#[test]
fn the_journals_authors_are_not_agent_names() {
    let mut fx = Fx::new();
    for name in ["room", "owner"] {
        let r = fx.refuse(
            None,
            "agent_enroll",
            json!({"name": name, "max_tier": "member", "host": "test"}),
            "invalid_argument",
        );
        assert_eq!(r.detail["field"], "agent", "{r}");
    }
}
