//! Evidence handles through the daemon API: registered with a first-hand origin or a lineage,
//! counted by `evidence_origins` after collapsing lineage (and against the owner's minimum),
//! cited in a send of their own room only.

mod common;
use common::*;
use serde_json::{Value, json};

struct Team {
    fx: Fx,
    a: String,
    b: String,
    task: String,
}

fn team(accept: Value) -> Team {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    let task = fx.ok(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "research the market", "to": "beta", "accept": accept}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    fx.tasks.push(task.clone());
    fx.ok(Some(&b), "task_claim", json!({"task": task}));
    Team { fx, a, b, task }
}

impl Team {
    fn register(&mut self, extra: Value) -> String {
        let mut args = json!({"room": "coord", "task": self.task, "req": "R1"});
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let b = self.b.clone();
        self.fx.ok(Some(&b), "evidence_register", args)["evidence"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn check(&mut self) -> Value {
        let b = self.b.clone();
        let task = self.task.clone();
        self.fx.ok(Some(&b), "task_check", json!({"task": task}))["acceptance_results"][0].clone()
    }
}

#[test]
fn evidence_origins_counts_first_hand_origins_after_collapsing_lineage() {
    let mut tm = team(json!([{"kind": "evidence_origins", "req": "R1", "min": 2}]));
    let first = tm.register(json!({"origin": "url:https://example.com/report"}));
    let r = tm.check();
    assert_eq!(
        (
            r["pass"].as_bool(),
            r["detail"]["distinct_origins"].as_u64()
        ),
        (Some(false), Some(1))
    );
    // a summary of the same report is not a second origin
    tm.register(json!({"lineage": [first], "summary": "the report, summarized"}));
    let r = tm.check();
    assert_eq!(r["detail"]["distinct_origins"], 1, "{r}");
    assert_eq!(r["detail"]["evidence"], 2);
    // evidence for another requirement does not count here
    tm.register(json!({"req": "R2", "origin": "url:https://example.com/other"}));
    assert_eq!(tm.check()["detail"]["distinct_origins"], 1);
    tm.register(json!({"origin": "agent:gamma/interview-1"}));
    let r = tm.check();
    assert_eq!(r["pass"], true, "{r}");
    assert_eq!(r["detail"]["basis"], "task_acceptance");
    let b = tm.b.clone();
    tm.fx.sync_all(&b, "coord");
    let done = tm
        .fx
        .ok(Some(&b), "done", json!({"room": "coord", "task": tm.task}));
    assert_eq!(done["detail"]["acceptance"], "passed");
}

#[test]
fn the_owner_wide_minimum_raises_every_check() {
    let mut tm = team(json!([{"kind": "evidence_origins", "req": "R1"}]));
    tm.register(json!({"origin": "url:https://a.example"}));
    assert_eq!(tm.check()["pass"], true);
    tm.fx
        .write_config("[acceptance]\nevidence_origins_min = 2\n");
    // config.toml edits bite once their timestamps settle
    std::thread::sleep(std::time::Duration::from_millis(2_100));
    let r = tm.check();
    assert_eq!(
        (r["pass"].as_bool(), r["detail"]["min"].as_u64()),
        (Some(false), Some(2))
    );
}

#[test]
fn evidence_of_another_room_is_refused_wherever_it_is_cited() {
    let mut tm = team(json!([]));
    let ev = tm.register(json!({"origin": "url:https://a.example"}));
    let a = tm.a.clone();
    tm.fx.ok(
        None,
        "room_create",
        json!({"name": "other", "members": ["alpha", "beta"]}),
    );
    tm.fx.sync_all(&a, "other");
    let r = tm.fx.refuse(
        Some(&a),
        "send",
        json!({"room": "other", "to": ["beta"], "text": "see this", "evidence": [ev]}),
        "cross_room_evidence_refused",
    );
    assert_eq!(r.detail["evidence"], ev.as_str());
    let b = tm.b.clone();
    let r = tm.fx.refuse(
        Some(&b),
        "evidence_register",
        json!({"room": "other", "lineage": [ev]}),
        "cross_room_evidence_refused",
    );
    assert_eq!(r.detail["field"], "lineage");
    // in its own room it is cited like an event, and becomes a causal parent of the send
    tm.fx.sync_all(&a, "coord");
    let sent = tm.fx.ok(
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["beta"], "text": "see this", "evidence": [ev]}),
    );
    assert!(sent["event"].is_string());
}

#[test]
fn malformed_evidence_names_its_field_and_registers_nothing() {
    let mut tm = team(json!([]));
    let b = tm.b.clone();
    let task = tm.task.clone();
    for (args, field) in [
        (json!({"room": "coord"}), "origin"),
        (
            json!({"room": "coord", "origin": "url:x", "lineage": ["ev_00000000000000000000000000000000"]}),
            "origin",
        ),
        (json!({"room": "coord", "origin": "no-namespace"}), "origin"),
        (
            json!({"room": "coord", "origin": "url:x", "req": "R1"}),
            "task",
        ),
        (
            json!({"room": "coord", "task": task, "origin": "url:x", "req": "R 1"}),
            "req",
        ),
        (
            json!({"room": "coord", "lineage": ["ev_00000000000000000000000000000000"]}),
            "lineage",
        ),
        (json!({"room": "coord", "lineage": ["evt_nope"]}), "lineage"),
    ] {
        let r = tm.fx.refuse(
            Some(&b),
            "evidence_register",
            args.clone(),
            "invalid_argument",
        );
        assert_eq!(r.detail["field"], field, "{args}: {r}");
    }
    let a = tm.a.clone();
    for (accept, field) in [
        (json!([{"kind": "evidence_origins"}]), "accept[0].req"),
        (
            json!([{"kind": "evidence_origins", "req": "R1", "min": 17}]),
            "accept[0].min",
        ),
        (
            json!([{"kind": "evidence_origins", "req": "R1", "min": 0}]),
            "accept[0].min",
        ),
    ] {
        let r = tm.fx.refuse(
            Some(&a),
            "task_create",
            json!({"room": "coord", "title": "t", "accept": accept}),
            "invalid_argument",
        );
        assert_eq!(r.detail["field"], field);
    }
}

#[test]
fn an_owner_wide_minimum_raised_under_a_claim_moves_its_evidence_manifest() {
    let mut tm = team(json!([{"kind": "evidence_origins", "req": "R1"}]));
    tm.register(json!({"origin": "url:https://a.example"}));
    assert_eq!(tm.check()["pass"], true);
    // the claim pinned the evidence manifest (the task's origin checks and the owner's minimum)
    tm.fx
        .write_config("[acceptance]\nevidence_origins_min = 2\n");
    std::thread::sleep(std::time::Duration::from_millis(2_100));
    let b = tm.b.clone();
    tm.fx.sync_all(&b, "coord");
    let r = tm.fx.refuse(
        Some(&b),
        "done",
        json!({"room": "coord", "task": tm.task}),
        "task_acceptance_changed_before_completion",
    );
    assert_eq!(r.detail["changed"], json!(["evidence_manifest"]), "{r}");
    // a fresh claim takes the new terms, and they are measured: one origin is not enough
    let task = tm.task.clone();
    tm.fx.ok(Some(&b), "task_claim", json!({"task": task}));
    let r = tm.check();
    assert_eq!(
        (r["pass"].as_bool(), r["detail"]["min"].as_u64()),
        (Some(false), Some(2)),
        "{r}"
    );
}
