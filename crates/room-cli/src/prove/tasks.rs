//! The cards of the claims about tasks: delegation and completion (04-C11) and the runtime
//! invariants (04-C12).

use super::{Cast, Prover};
use serde_json::{Value, json};

/// The id of a task a call created (empty when it was refused: the step says so).
fn task_id(v: Option<Value>) -> String {
    v.and_then(|t| t["task"]["id"].as_str().map(String::from))
        .unwrap_or_default()
}

/// 04-C11: ancestry is bounded at 16 links, a child never widens its parent's scope, `done`
/// is a measurement, and the authority a claim pinned must be unchanged at `done`: an
/// amendment, a room reset and a raised evidence minimum are each refused with the key named.
pub(super) fn c11(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    let w = p.recruit("c11-worker", "member");
    // ancestry: 17 tasks make 16 links; one more is refused
    let mut parent = task_id(p.ok(
        "the root of a chain of delegations",
        Some(&a),
        "task_create",
        json!({"room": "lobby", "title": "level 0"}),
    ));
    for level in 1..=16 {
        let r = p.call(
            Some(&a),
            "task_create",
            json!({"room": "lobby", "title": format!("level {level}"), "parent": parent}),
        );
        parent = r
            .result
            .and_then(|t| t["task"]["id"].as_str().map(String::from))
            .unwrap_or_default();
    }
    p.record(
        "a chain of 16 delegation links is made",
        !parent.is_empty(),
        "17 tasks",
    );
    p.refused(
        "a 17th link is refused",
        Some(&a),
        "task_create",
        json!({"room": "lobby", "title": "too deep", "parent": parent}),
        "task_ancestry_invalid",
        Some("lobby"),
    );
    let scoped = task_id(p.ok(
        "a parent scoped to one directory and one api",
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "parser", "scopes": ["file:c11/src/parser", "api:lexer"]}),
    ));
    p.refused(
        "a child wider than its parent is refused",
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "wider", "parent": scoped, "scopes": ["file:c11/src"]}),
        "task_scope_widened",
        Some("build"),
    );
    p.ok(
        "a child within its parent's scope is made",
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "narrower", "parent": scoped,
            "scopes": ["file:c11/src/parser/a.rs", "api:lexer"]}),
    );
    measured(p, &a, &w);
    amended(p, &a, &w);
    reset(p, &a, &w);
    evidence_minimum(p, &a, &w);
    source_moved(p, &a, &w);
    vec![
        "owner, scope, active scope pin and project id: nothing can move them after a claim",
        "the file scope and project root pins: moving the root is refused first (project_root_redirected, 04-C01)",
        "delegation and lock: an amended ancestor or a lapsed lease is refused first (task_ancestry_invalid, task_state_invalid)",
    ]
}

/// A governed task's source changes under its worker, who had read it whole: `done` names the
/// `source` key, and the wake sealed for the task is refused at dispatch (its claim's source
/// is not the source now).
fn source_moved(p: &mut Prover, a: &str, w: &str) {
    let _ = std::fs::create_dir_all(p.project.join("c11"));
    let _ = std::fs::write(p.project.join("c11/brief.md"), "the brief, as claimed\n");
    let _ = std::fs::write(p.project.join("c11/report.md"), "report\n");
    let pid = p
        .call(None, "project_list", json!({}))
        .result
        .and_then(|v| v["projects"][0]["id"].as_str().map(String::from))
        .unwrap_or_default();
    p.ok(
        "the owner names the project's governing source",
        None,
        "project_source",
        json!({"project": pid, "parts": ["c11/brief.md"]}),
    );
    let t = task_id(p.ok(
        "a governed task for the worker",
        Some(a),
        "task_create",
        json!({"room": "build", "title": "brief", "to": "c11-worker", "governed": true,
            "accept": [{"kind": "file_exists", "path": "c11/report.md"}]}),
    ));
    p.catch_up(a, "build");
    let sent = p
        .ok(
            "alpha sends it to the worker (a permit is sealed)",
            Some(a),
            "send",
            json!({"room": "build", "to": ["c11-worker"], "task": t, "text": "@c11-worker the brief"}),
        )
        .and_then(|v| v["event"].as_str().map(String::from))
        .unwrap_or_default();
    p.ok(
        "the worker claims it",
        Some(w),
        "task_claim",
        json!({"task": t}),
    );
    p.call(
        Some(w),
        "source_read",
        json!({"task": t, "part": 0, "offset": 0}),
    );
    let _ = std::fs::write(p.project.join("c11/brief.md"), "the brief, changed since\n");
    p.catch_up(w, "build");
    let r = p.refused(
        "done after the source changed is refused, naming the source key",
        Some(w),
        "done",
        json!({"room": "build", "task": t}),
        "task_authority_changed",
        Some("build"),
    );
    let named = r.is_some_and(|r| r.detail["changed"] == json!(["source"]));
    p.record("the key named is the source", named, "changed [\"source\"]");
    p.call(None, "wakes_check", json!({}));
    let dead = p
        .call(None, "wakes_list", json!({"room": "build"}))
        .result
        .and_then(|v| {
            v["wakes"].as_array().and_then(|ws| {
                ws.iter()
                    .find(|w| w["source_event"] == sent.as_str())
                    .cloned()
            })
        })
        .unwrap_or_default();
    p.record(
        "the wake sealed for it is refused at dispatch: its claim's source is not the source now",
        dead["state"] == "dead" && dead["dead_letter"]["code"] == "wake_task_authority_changed",
        format!("permit {} {}", dead["state"], dead["dead_letter"]["code"]),
    );
}

/// `done` refused until the artifact its check names exists, then passing.
fn measured(p: &mut Prover, a: &str, w: &str) {
    let t = task_id(p.ok(
        "a task whose acceptance is a file",
        Some(a),
        "task_create",
        json!({"room": "build", "title": "notes", "to": "c11-worker",
            "accept": [{"kind": "file_exists", "path": "c11/notes.md"}]}),
    ));
    p.ok(
        "the worker claims it",
        Some(w),
        "task_claim",
        json!({"task": t}),
    );
    p.catch_up(w, "build");
    p.refused(
        "done before the file exists is refused with the measurement",
        Some(w),
        "done",
        json!({"room": "build", "task": t}),
        "task_acceptance_failed",
        Some("build"),
    );
    let wrote = std::fs::create_dir_all(p.project.join("c11"))
        .and_then(|()| std::fs::write(p.project.join("c11/notes.md"), "# notes\n"));
    p.record("the worker writes the file", wrote.is_ok(), "c11/notes.md");
    p.catch_up(w, "build");
    p.ok(
        "done passes the measurement",
        Some(w),
        "done",
        json!({"room": "build", "task": t}),
    );
}

/// A claimed task whose file is there, for an authority key to move under.
fn claimed_with_file(p: &mut Prover, a: &str, w: &str, file: &str) -> String {
    let t = task_id(p.ok(
        "a claimed task whose artifact is there",
        Some(a),
        "task_create",
        json!({"room": "build", "title": file, "to": "c11-worker", "requirements": ["R1 the file"],
            "accept": [{"kind": "file_exists", "path": format!("c11/{file}")}]}),
    ));
    p.call(Some(w), "task_claim", json!({"task": t}));
    let _ = std::fs::write(p.project.join("c11").join(file), "x\n");
    t
}

/// The owner of the task amends its checks after the claim.
fn amended(p: &mut Prover, a: &str, w: &str) {
    let t = claimed_with_file(p, a, w, "out.txt");
    p.ok(
        "its owner amends the checks after the claim",
        Some(a),
        "task_amend",
        json!({"task": t, "accept": [{"kind": "file_exists", "path": "c11/out.txt"},
            {"kind": "file_exists", "path": "c11/more.txt"}]}),
    );
    p.catch_up(w, "build");
    p.refused(
        "done under the claim's old terms is refused (acceptance moved)",
        Some(w),
        "done",
        json!({"room": "build", "task": t}),
        "task_acceptance_changed_before_completion",
        Some("build"),
    );
}

/// The owner resets the room after the claim.
fn reset(p: &mut Prover, a: &str, w: &str) {
    let t = claimed_with_file(p, a, w, "reset.txt");
    p.ok(
        "the owner resets the room after the claim",
        None,
        "room_reset",
        json!({"room": "build"}),
    );
    p.catch_up(w, "build");
    p.refused(
        "done across the reset is refused (authority epoch moved)",
        Some(w),
        "done",
        json!({"room": "build", "task": t}),
        "task_authority_changed",
        Some("build"),
    );
    p.ok(
        "a fresh claim takes the current authority",
        Some(w),
        "task_claim",
        json!({"task": t}),
    );
    p.catch_up(w, "build");
    p.ok(
        "done then passes",
        Some(w),
        "done",
        json!({"room": "build", "task": t}),
    );
}

/// The owner raises the evidence minimum under a claim.
fn evidence_minimum(p: &mut Prover, a: &str, w: &str) {
    let t = task_id(p.ok(
        "a task whose acceptance is evidence",
        Some(a),
        "task_create",
        json!({"room": "lobby", "title": "research", "to": "c11-worker",
            "accept": [{"kind": "evidence_origins", "req": "R1"}]}),
    ));
    p.ok(
        "the worker claims it",
        Some(w),
        "task_claim",
        json!({"task": t}),
    );
    p.ok(
        "the worker registers one origin",
        Some(w),
        "evidence_register",
        json!({"room": "lobby", "task": t, "req": "R1", "origin": "url:https://a.example"}),
    );
    p.set_config("[acceptance]\nevidence_origins_min = 2\n");
    // the policy is re-read once the file's timestamp has settled
    std::thread::sleep(std::time::Duration::from_millis(2_100));
    p.catch_up(w, "lobby");
    p.refused(
        "done after the owner raised the minimum is refused (evidence manifest moved)",
        Some(w),
        "done",
        json!({"room": "lobby", "task": t}),
        "task_acceptance_changed_before_completion",
        Some("lobby"),
    );
    p.set_config("");
    std::thread::sleep(std::time::Duration::from_millis(2_100));
}

/// 04-C12: the invariants that reject (exactly_once, well_formed, exclusive) refuse the act
/// and journal one violation record naming it; causal flags the act it lets through.
pub(super) fn c12(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    let w = p.recruit("c12-worker", "member");
    p.catch_up(&w, "lobby");
    let say = json!({"room": "lobby", "text": "deploy started", "idempotency_key": "c12-1"});
    p.ok(
        "a turn with an idempotency key",
        Some(&w),
        "say",
        say.clone(),
    );
    p.violated(
        "the same key again is rejected, with a violation record",
        Some(&w),
        "say",
        say,
        ("lobby", "exactly_once", "invariant_violation"),
    );
    p.violated(
        "an effect on an operation never begun is rejected",
        Some(&w),
        "op_effect",
        json!({"room": "build", "op": "op_00000000deadbeef"}),
        ("build", "well_formed", "invariant_violation"),
    );
    let held = task_id(p.ok(
        "a scoped task for the worker",
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "e1", "to": "c12-worker", "scopes": ["file:c12/src"]}),
    ));
    let inner = task_id(p.ok(
        "an overlapping task for alpha",
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "e2", "to": "alpha", "scopes": ["file:c12/src/lib.rs"]}),
    ));
    p.ok(
        "the worker claims the outer scope",
        Some(&w),
        "task_claim",
        json!({"task": held}),
    );
    p.violated(
        "a second lease over the same files is rejected",
        Some(&a),
        "task_claim",
        json!({"task": inner}),
        ("build", "exclusive", "lease_conflict"),
    );
    let dist = task_id(p.ok(
        "a task with a destination",
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "ship", "to": "c12-worker", "scopes": ["file:c12/dist"]}),
    ));
    p.ok(
        "the worker claims it",
        Some(&w),
        "task_claim",
        json!({"task": dist}),
    );
    let op = p
        .ok(
            "the worker begins an operation",
            Some(&w),
            "op_begin",
            json!({"room": "build", "task": dist, "destination": "file:c12/dist"}),
        )
        .and_then(|v| v["op"].as_str().map(String::from))
        .unwrap_or_default();
    let child = p.call(
        Some(&w),
        "op_begin",
        json!({"room": "build", "task": dist, "destination": "file:c12/dist", "parent": op}),
    );
    let flags = child.result.map(|v| v["flags"].clone()).unwrap_or_default();
    p.record(
        "an operation under one still unresolved goes through, flagged causal",
        flags[0]["invariant"] == "causal",
        format!("flags {flags}"),
    );
    lapse(p, &a, &w);
    Vec::new()
}

/// `resolution`: a claim left unresolved past its ttl is recorded in doubt by the daemon's
/// sweep (once a second), and its lease released.
fn lapse(p: &mut Prover, a: &str, w: &str) {
    let t = task_id(p.ok(
        "a scoped task for the worker",
        Some(a),
        "task_create",
        json!({"room": "build", "title": "lapse", "to": "c12-worker", "scopes": ["file:c12/lapse"]}),
    ));
    p.ok(
        "the worker claims it for one second and does nothing",
        Some(w),
        "task_claim",
        json!({"task": t, "ttl_ms": 1_000}),
    );
    // the room's tip now: the record lands after it
    let from = p
        .call(None, "room_log", json!({"room": "build", "limit": 1}))
        .result
        .and_then(|v| v["tip_seq"].as_u64())
        .unwrap_or(1);
    let mut found = Value::Null;
    // the sweep runs once a second: the record lands within a few
    for _ in 0..100 {
        let log = p
            .call(
                None,
                "room_log",
                json!({"room": "build", "from": from, "limit": 1_000}),
            )
            .result
            .unwrap_or_default();
        if let Some(v) = log["events"].as_array().and_then(|es| {
            es.iter()
                .find(|e| {
                    e["kind"] == "invariant_violation"
                        && e["event"]["invariant"] == "resolution"
                        && e["event"]["task"] == t.as_str()
                })
                .cloned()
        }) {
            found = v;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let body = &found["event"];
    p.record(
        "the claim past its ttl is recorded in doubt, its lease released",
        body["severity"] == "in_doubt"
            && body["detail"]["observation"] == "unresolved"
            && body["detail"]["lease_released"] == true,
        format!(
            "{} {} {} after {} ms",
            found["id"], body["invariant"], body["severity"], body["detail"]["elapsed_ms"]
        ),
    );
}
