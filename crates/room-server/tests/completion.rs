//! Completion's authority through a real daemon: a claim pins the task's authority keys and
//! `done` refuses while any moved (an amendment, a room reset) until the claim is renewed; an
//! operator's override lets a requirement-bound task close without checks, on a recorded
//! reason; a verified successor's passing `done` resolves the superseded task's obligations.
//! Every refusal is asserted to have changed nothing.

mod common;
use common::*;
use serde_json::{Value, json};
use std::path::PathBuf;

/// A project room `build`: alpha and gamma coordinate, beta works.
struct Team {
    fx: Fx,
    a: String,
    b: String,
    g: String,
    dir: PathBuf,
}

fn team() -> Team {
    let mut fx = Fx::new();
    let a = fx.enroll("alpha", "coordinator");
    let b = fx.enroll("beta", "member");
    let g = fx.enroll("gamma", "coordinator");
    let (dir, pid) = fx.open_project("p1");
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta", "gamma"]}),
    );
    Team { fx, a, b, g, dir }
}

impl Team {
    /// alpha creates a task for beta (with `extra` fields), sends it, and beta claims it.
    fn assigned(&mut self, extra: Value) -> String {
        let t = self.created(extra);
        self.send_and_claim(&t);
        t
    }

    fn created(&mut self, extra: Value) -> String {
        let mut args = json!({"room": "build", "title": "produce out.txt", "to": "beta"});
        for (k, v) in extra.as_object().unwrap() {
            args[k] = v.clone();
        }
        let a = self.a.clone();
        let t = self.fx.ok(Some(&a), "task_create", args)["task"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        self.fx.tasks.push(t.clone());
        t
    }

    fn send_and_claim(&mut self, t: &str) {
        let Team { fx, a, b, .. } = self;
        fx.sync_all(a, "build");
        fx.ok(
            Some(a),
            "send",
            json!({"room": "build", "to": ["beta"], "text": "please", "task": t}),
        );
        fx.ok(Some(b), "task_claim", json!({"task": t}));
        fx.sync_all(b, "build");
    }

    fn open_obligations(&mut self) -> usize {
        let b = self.b.clone();
        let page = self.fx.ok(Some(&b), "sync", json!({"room": "build"}));
        page["open_items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["kind"] == "obligation")
            .count()
    }

    /// beta's `done` is refused with `code` and changes neither journal, task nor items.
    #[track_caller]
    fn done_refused(&mut self, t: &str, code: &str) -> Value {
        let b = self.b.clone();
        self.fx.sync_all(&b, "build");
        let before = (
            self.fx.journal_lines(),
            self.fx.task_status(t),
            self.open_obligations(),
        );
        let r = self
            .fx
            .call(Some(&b), "done", json!({"room": "build", "task": t}));
        let refusal = expect_code(r, code, "done");
        let after = (
            self.fx.journal_lines(),
            self.fx.task_status(t),
            self.open_obligations(),
        );
        assert_eq!(before, after, "a refused done changed state");
        refusal.detail
    }

    fn done_ok(&mut self, t: &str) -> Value {
        let b = self.b.clone();
        self.fx.sync_all(&b, "build");
        let v = self
            .fx
            .ok(Some(&b), "done", json!({"room": "build", "task": t}));
        assert_eq!(self.fx.task_status(t), "done");
        v
    }

    fn done_detail(&mut self, done: &Value) -> Value {
        let log = self
            .fx
            .ok(None, "room_log", json!({"room": "build", "limit": 1000}));
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == done["event"])
            .expect("the done record")["event"]["detail"]
            .clone()
    }

    fn write(&self, rel: &str) {
        let p = self.dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"made").unwrap();
    }
}

fn exists(path: &str) -> Value {
    json!({"kind": "file_exists", "path": path})
}

#[test]
fn an_amendment_after_the_claim_refuses_done_until_the_claim_is_renewed() {
    let mut tm = team();
    let t = tm.assigned(json!({"accept": [exists("out.txt")], "requirements": ["R1 out"]}));
    tm.write("out.txt");
    let a = tm.a.clone();
    let v = tm.fx.ok(
        Some(&a),
        "task_amend",
        json!({"task": t, "accept": [exists("out.txt"), exists("more.txt")]}),
    );
    assert_eq!(v["revision"], 1);
    let d = tm.done_refused(&t, "task_acceptance_changed_before_completion");
    let changed: Vec<&str> = d["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(changed.contains(&"acceptance"), "{d}");
    assert!(changed.contains(&"authority_revision"), "{d}");
    assert_eq!(d["revision_at_claim"], "0");
    // the holder renews its claim and takes the new terms: now the new check is measured
    let b = tm.b.clone();
    tm.fx.ok(Some(&b), "task_claim", json!({"task": t}));
    let d = tm.done_refused(&t, "task_acceptance_failed");
    assert_eq!(d["acceptance_results"][1]["pass"], false);
    tm.write("more.txt");
    tm.done_ok(&t);
}

#[test]
fn task_amend_refusals_change_nothing() {
    let mut tm = team();
    let t = tm.assigned(json!({"accept": [exists("out.txt")]}));
    let (a, b, g) = (tm.a.clone(), tm.b.clone(), tm.g.clone());
    let fx = &mut tm.fx;
    let r = fx.refuse(
        Some(&g),
        "task_amend",
        json!({"task": t, "requirements": ["R2"]}),
        "task_not_held",
    );
    assert!(r.message.contains("only its owner"), "{r}");
    fx.refuse(
        Some(&b),
        "task_amend",
        json!({"task": t, "requirements": ["R2"]}),
        "tier_insufficient",
    );
    fx.refuse(
        Some(&a),
        "task_amend",
        json!({"task": t}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&a),
        "task_amend",
        json!({"task": t, "accept": [exists("out.txt")]}),
        "invalid_argument",
    );
    let r = fx.refuse(
        Some(&a),
        "task_amend",
        json!({"task": t, "accept": [{"kind": "file_exists"}]}),
        "invalid_argument",
    );
    assert!(
        r.detail["field"].as_str().unwrap().starts_with("accept"),
        "{r}"
    );
    fx.refuse(
        Some(&a),
        "task_amend",
        json!({"task": t, "accept": [{"kind": "worker_receipt", "profile": "basic", "min": 0}]}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&a),
        "task_amend",
        json!({"task": UNKNOWN_TASK, "requirements": ["R2"]}),
        "task_not_found",
    );
    tm.write("out.txt");
    tm.done_ok(&t);
    tm.fx.refuse(
        Some(&a),
        "task_amend",
        json!({"task": t, "requirements": ["R2"]}),
        "task_state_invalid",
    );
}

#[test]
fn a_room_reset_after_the_claim_is_task_authority_changed() {
    let mut tm = team();
    let t = tm.assigned(json!({"accept": [exists("out.txt")]}));
    tm.write("out.txt");
    tm.fx.ok(None, "room_reset", json!({"room": "build"}));
    let d = tm.done_refused(&t, "task_authority_changed");
    assert_eq!(d["changed"], json!(["authority_epoch"]));
    let b = tm.b.clone();
    tm.fx.ok(Some(&b), "task_claim", json!({"task": t}));
    tm.done_ok(&t);
}

#[test]
fn an_operator_override_lets_a_requirement_bound_task_close_on_its_reason() {
    let mut tm = team();
    let t = tm.assigned(json!({"requirements": ["R1 the vendor confirmed by phone"]}));
    tm.done_refused(&t, "task_acceptance_required");
    let fx = &mut tm.fx;
    for reason in ["", "   ", "tab\tinside"] {
        fx.refuse(
            None,
            "owner_task_override",
            json!({"task": t, "reason": reason}),
            "invalid_argument",
        );
    }
    fx.refuse(
        None,
        "owner_task_override",
        json!({"task": t, "reason": "x".repeat(1025)}),
        "invalid_argument",
    );
    fx.refuse(
        None,
        "owner_task_override",
        json!({"task": UNKNOWN_TASK, "reason": "r"}),
        "task_not_found",
    );
    let checked = tm.created(json!({"requirements": ["R1"], "accept": [exists("x")]}));
    let plain = tm.created(json!({}));
    for other in [&checked, &plain] {
        tm.fx.refuse(
            None,
            "owner_task_override",
            json!({"task": other, "reason": "r"}),
            "invalid_argument",
        );
    }
    tm.fx.ok(
        None,
        "owner_task_override",
        json!({"task": t, "reason": "confirmed by phone with the vendor, ticket 4411"}),
    );
    let shown = tm.fx.ok(None, "owner_task_show", json!({"task": t}));
    assert_eq!(
        shown["task"]["acceptance_override"],
        "confirmed by phone with the vendor, ticket 4411"
    );
    assert_eq!(tm.open_obligations(), 1);
    let v = tm.done_ok(&t);
    let d = tm.done_detail(&v);
    assert_eq!(d["acceptance"], "operator_override");
    assert_eq!(d["obligations_resolved"], true);
    assert_eq!(
        tm.open_obligations(),
        0,
        "an override resolves as a proof does"
    );
    tm.fx.refuse(
        None,
        "owner_task_override",
        json!({"task": t, "reason": "again"}),
        "task_state_invalid",
    );
}

#[test]
fn a_verified_successor_carries_the_superseded_tasks_obligations() {
    let mut tm = team();
    let old = tm.assigned(json!({"requirements": ["R1 out"], "scopes": ["file:src"],
        "accept": [exists("src/old.txt")]}));
    assert_eq!(tm.open_obligations(), 1);
    let (a, g) = (tm.a.clone(), tm.g.clone());
    // each way a replacement can be weaker, refused with what failed
    let cases = [
        (
            json!({"requirements": ["R1 out"], "scopes": ["file:docs"], "accept": [exists("src/a")]}),
            "scope",
        ),
        (
            json!({"requirements": ["R1 out"], "scopes": ["file:src/a"]}),
            "acceptance",
        ),
        (
            json!({"requirements": ["R2"], "scopes": ["file:src/a"], "accept": [exists("src/a")]}),
            "requirements",
        ),
    ];
    for (spec, failed) in cases {
        let weaker = tm.created(spec);
        let r = tm.fx.refuse(
            Some(&a),
            "task_supersede",
            json!({"task": old, "successor": weaker}),
            "task_successor_unverified",
        );
        assert!(
            r.detail["failed"]
                .as_array()
                .unwrap()
                .contains(&json!(failed)),
            "{r}"
        );
    }
    let next = tm.created(
        json!({"requirements": ["R1 out"], "scopes": ["file:src/new"],
        "accept": [exists("src/new/out.txt")]}),
    );
    tm.fx.refuse(
        Some(&g),
        "task_supersede",
        json!({"task": old, "successor": next}),
        "task_not_held",
    );
    tm.fx.refuse(
        Some(&a),
        "task_supersede",
        json!({"task": old, "successor": "nope"}),
        "invalid_argument",
    );
    tm.fx.refuse(
        Some(&a),
        "task_supersede",
        json!({"task": old, "successor": old}),
        "task_successor_unverified",
    );
    tm.fx.ok(
        Some(&a),
        "task_supersede",
        json!({"task": old, "successor": next}),
    );
    assert_eq!(tm.fx.task_status(&old), "superseded");
    tm.fx.refuse(
        Some(&a),
        "task_supersede",
        json!({"task": old, "successor": next}),
        "task_state_invalid",
    );
    // the old obligation stays open until the successor is proven done
    tm.send_and_claim(&next);
    assert_eq!(tm.open_obligations(), 2);
    tm.done_refused(&next, "task_acceptance_failed");
    tm.write("src/new/out.txt");
    let v = tm.done_ok(&next);
    let d = tm.done_detail(&v);
    assert_eq!(d["verified_successor_of"], json!([old]));
    assert_eq!(tm.open_obligations(), 0);
}

#[test]
fn amending_a_parent_invalidates_the_children_delegated_before() {
    let mut tm = team();
    let parent = tm.created(json!({"requirements": ["R1"], "accept": [exists("a.txt")]}));
    let child = tm.created(json!({"parent": parent}));
    let a = tm.a.clone();
    tm.fx.ok(
        Some(&a),
        "task_amend",
        json!({"task": parent, "requirements": ["R1", "R2"]}),
    );
    let b = tm.b.clone();
    let r = tm.fx.refuse(
        Some(&b),
        "task_claim",
        json!({"task": child}),
        "task_ancestry_invalid",
    );
    assert!(r.message.contains("amended"), "{r}");
    // a child delegated under the new revision stands
    let fresh = tm.created(json!({"parent": parent}));
    tm.fx.ok(Some(&b), "task_claim", json!({"task": fresh}));
}

#[test]
fn evidence_whose_file_changed_is_quarantined_until_registered_again() {
    let mut tm = team();
    let t = tm.assigned(json!({"requirements": ["R1 the report"],
        "accept": [{"kind": "evidence_origins", "req": "R1", "min": 1}]}));
    tm.write("docs/report.md");
    let b = tm.b.clone();
    let reg = |tm: &mut Team| {
        tm.fx.ok(
            Some(&b),
            "evidence_register",
            json!({"room": "build", "task": t, "req": "R1", "origin": "file:docs/report.md"}),
        )
    };
    let first = reg(&mut tm);
    assert_eq!(
        first["sha256"].as_str().unwrap(),
        room_core::sha256_hex(b"made")
    );
    std::fs::write(
        tm.dir.join("docs/report.md"),
        b"rewritten after the evidence",
    )
    .unwrap();
    let d = tm.done_refused(&t, "content_mismatch");
    assert_eq!(d["quarantined"][0]["evidence"], first["evidence"]);
    let check = tm.fx.ok(Some(&b), "task_check", json!({"task": t}));
    assert_eq!(check["acceptance_results"][0]["pass"], false, "{check}");
    // evidence registered again for the current content replaces it
    reg(&mut tm);
    tm.done_ok(&t);
}

#[test]
fn cancelling_a_successor_settles_what_it_carried_for_the_task_it_superseded() {
    let mut tm = team();
    let old = tm.assigned(json!({"requirements": ["R1 out"], "scopes": ["file:src"],
        "accept": [exists("src/old.txt")]}));
    let next = tm.created(
        json!({"requirements": ["R1 out"], "scopes": ["file:src/new"],
        "accept": [exists("src/new/out.txt")]}),
    );
    let a = tm.a.clone();
    tm.fx.ok(
        Some(&a),
        "task_supersede",
        json!({"task": old, "successor": next}),
    );
    tm.send_and_claim(&next);
    assert_eq!(
        tm.open_obligations(),
        2,
        "the old task's and the successor's"
    );
    let c = tm.fx.ok(
        Some(&a),
        "task_cancel",
        json!({"task": next, "reason": "no longer needed"}),
    );
    assert_eq!(tm.fx.task_status(&next), "cancelled");
    // the superseded task can never be done now: its obligation is settled with its successor
    assert_eq!(tm.open_obligations(), 0, "{c}");
    let resolved = c["resolved"].as_array().unwrap();
    assert!(resolved.iter().all(|r| r["status"] == "cancelled"), "{c}");
}
