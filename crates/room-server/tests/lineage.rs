//! Delegation cannot outlive or widen its ancestry, through the daemon API: each refusal with
//! its code and nothing changed, and a parent that closes or loses its people invalidating the
//! subtasks below it at their next stage.

mod common;
use common::*;
use serde_json::{Value, json};

fn create(fx: &mut Fx, token: &str, args: Value) -> String {
    let id = fx.ok(Some(token), "task_create", args)["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    fx.tasks.push(id.clone());
    id
}

#[test]
fn task_ancestry_invalid_past_sixteen_links() {
    let mut fx = Fx::new();
    let (a, _b, _g) = fx.team("coord");
    let mut parent = create(&mut fx, &a, json!({"room": "coord", "title": "root"}));
    // the root and 16 descendants: the deepest has 16 ancestors
    for i in 1..=16 {
        parent = create(
            &mut fx,
            &a,
            json!({"room": "coord", "title": format!("level {i}"), "parent": parent}),
        );
    }
    let r = fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "too deep", "parent": parent}),
        "task_ancestry_invalid",
    );
    assert!(r.message.contains("16"), "{}", r.message);
}

#[test]
fn task_ancestry_invalid_when_a_parent_settles_or_loses_its_people() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("coord");
    let parent = create(
        &mut fx,
        &a,
        json!({"room": "coord", "title": "parent", "to": "beta"}),
    );
    let child = create(
        &mut fx,
        &a,
        json!({"room": "coord", "title": "child", "to": "gamma", "parent": parent}),
    );
    // the parent's recipient is revoked: the child can no longer be claimed
    let other = create(
        &mut fx,
        &a,
        json!({"room": "coord", "title": "child two", "to": "gamma", "parent": parent}),
    );
    fx.sync_all(&b, "coord");
    fx.ok(Some(&b), "task_claim", json!({"task": parent}));
    fx.ok(Some(&b), "done", json!({"room": "coord", "task": parent}));
    // the parent is done: a new subtask under it, and a claim of an existing one, are refused
    let r = fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "late", "parent": parent}),
        "task_ancestry_invalid",
    );
    assert_eq!(r.detail["ancestor"], parent.as_str());
    fx.refuse(
        Some(&g),
        "task_claim",
        json!({"task": child}),
        "task_ancestry_invalid",
    );
    // a second chain whose parent's recipient is revoked
    let p2 = create(
        &mut fx,
        &a,
        json!({"room": "coord", "title": "p2", "to": "beta"}),
    );
    let c2 = create(
        &mut fx,
        &a,
        json!({"room": "coord", "title": "c2", "to": "gamma", "parent": p2}),
    );
    fx.ok(None, "agent_revoke", json!({"name": "beta"}));
    let r = fx.refuse(
        Some(&g),
        "task_claim",
        json!({"task": c2}),
        "task_ancestry_invalid",
    );
    assert!(r.message.contains("beta"), "{}", r.message);
    assert_eq!(fx.task_status(&other), "open");
}

#[test]
fn task_ancestry_invalid_at_done_once_the_parent_settled() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("coord");
    let parent = create(
        &mut fx,
        &a,
        json!({"room": "coord", "title": "parent", "to": "beta"}),
    );
    let child = create(
        &mut fx,
        &a,
        json!({"room": "coord", "title": "child", "to": "gamma", "parent": parent}),
    );
    fx.ok(Some(&g), "task_claim", json!({"task": child}));
    fx.sync_all(&b, "coord");
    fx.ok(Some(&b), "task_claim", json!({"task": parent}));
    fx.ok(Some(&b), "done", json!({"room": "coord", "task": parent}));
    fx.sync_all(&g, "coord");
    fx.refuse(
        Some(&g),
        "done",
        json!({"room": "coord", "task": child}),
        "task_ancestry_invalid",
    );
    assert_eq!(fx.task_status(&child), "claimed");
}

#[test]
fn task_scope_widened() {
    let mut fx = Fx::new();
    let a = fx.enroll("alpha", "coordinator");
    fx.enroll("beta", "member");
    let (_d, pid) = fx.open_project("p1");
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta"]}),
    );
    let parent = create(
        &mut fx,
        &a,
        json!({"room": "build", "title": "parser", "scopes": ["file:src/parser", "api:lexer"]}),
    );
    for scopes in [
        json!(["file:src"]),
        json!(["file:docs"]),
        json!(["api:lexer2"]),
        json!(["file:src/parser/a.rs", "file:tests"]),
    ] {
        let r = fx.refuse(
            Some(&a),
            "task_create",
            json!({"room": "build", "title": "sub", "parent": parent, "scopes": scopes}),
            "task_scope_widened",
        );
        assert_eq!(r.detail["parent"], parent.as_str());
    }
    // narrowing is delegation
    create(
        &mut fx,
        &a,
        json!({"room": "build", "title": "sub", "parent": parent,
            "scopes": ["file:src/parser/a.rs", "api:lexer"]}),
    );
    // a coordination-only parent has no mutating child
    let coord = create(
        &mut fx,
        &a,
        json!({"room": "build", "title": "plan", "coordination_only": true}),
    );
    for args in [
        json!({"room": "build", "title": "x", "parent": coord, "scopes": ["file:src"]}),
        json!({"room": "build", "title": "x", "parent": coord}),
    ] {
        fx.refuse(Some(&a), "task_create", args, "task_scope_widened");
    }
    create(
        &mut fx,
        &a,
        json!({"room": "build", "title": "x", "parent": coord, "coordination_only": true}),
    );
    // and a coordination-only task names no scope itself
    let r = fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "x", "scopes": ["file:a"], "coordination_only": true}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "scopes");
}

/// The daemon protects what runs it: a project that contains the running binary may be
/// worked on, but no task may lease the binary (here the test binary, which is what runs the
/// in-process daemon).
#[test]
fn no_scope_may_cover_the_binary_that_runs_room() {
    let mut fx = Fx::new();
    let a = fx.enroll("alpha", "coordinator");
    let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    let dir = exe.parent().unwrap();
    let p = fx.ok(None, "project_open", json!({"path": dir.to_str().unwrap()}));
    let pid = p["id"].as_str().unwrap();
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha"]}),
    );
    let name = exe.file_name().unwrap().to_str().unwrap();
    let r = fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "x", "scopes": ["file:notes", format!("file:{name}")]}),
        "invalid_argument",
    );
    assert!(r.detail["field"].as_str().unwrap().starts_with("scopes["));
    assert!(r.message.contains(name), "{}", r.message);
    create(
        &mut fx,
        &a,
        json!({"room": "build", "title": "x", "scopes": [format!("file:{name}.notes")]}),
    );
}

#[test]
fn an_owner_cancels_a_live_task_and_its_lease_items_and_subtasks_follow() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("coord");
    let task = create(
        &mut fx,
        &a,
        json!({"room": "coord", "title": "edit", "to": "beta", "scopes": ["file:src"]}),
    );
    let child = create(
        &mut fx,
        &a,
        json!({"room": "coord", "title": "part", "to": "gamma", "parent": task,
            "scopes": ["file:src/a.rs"]}),
    );
    let rival = create(
        &mut fx,
        &a,
        json!({"room": "coord", "title": "rival", "to": "gamma", "scopes": ["file:src"]}),
    );
    fx.sync_all(&a, "coord");
    fx.ok(
        Some(&a),
        "send",
        json!({"room": "coord", "text": "please", "to": ["beta"], "task": task}),
    );
    fx.ok(Some(&b), "task_claim", json!({"task": task}));
    fx.refuse_violation(
        &g,
        "task_claim",
        json!({"task": rival}),
        "coord",
        "exclusive",
    );

    // only a coordinator that owns it may cancel it, with a sensible reason
    fx.refuse(
        Some(&b),
        "task_cancel",
        json!({"task": task}),
        "tier_insufficient",
    );
    let d = fx.enroll("delta", "coordinator");
    fx.ok(
        None,
        "room_members_add",
        json!({"room": "coord", "agent": "delta"}),
    );
    fx.refuse(
        Some(&d),
        "task_cancel",
        json!({"task": task}),
        "task_not_held",
    );
    for reason in ["", "a\nb"] {
        let r = fx.refuse(
            Some(&a),
            "task_cancel",
            json!({"task": task, "reason": reason}),
            "invalid_argument",
        );
        assert_eq!(r.detail["field"], "reason", "{r}");
    }
    fx.refuse(
        Some(&a),
        "task_cancel",
        json!({"task": "tsk_0000000000000000"}),
        "task_not_found",
    );

    let c = fx.ok(
        Some(&a),
        "task_cancel",
        json!({"task": task, "reason": "plans changed"}),
    );
    assert_eq!(
        (c["status"].as_str(), c["from"].as_str()),
        (Some("cancelled"), Some("claimed")),
        "{c}"
    );
    assert_eq!(c["lease_released"], true);
    assert_eq!(
        c["resolved"].as_array().unwrap().len(),
        2,
        "beta's mention and obligation: {c}"
    );
    assert_eq!(fx.task_status(&task), "cancelled");
    let shown = fx.ok(None, "owner_task_show", json!({"task": task}));
    assert!(shown["lease"].is_null(), "{shown}");
    // beta owes nothing any more, and cannot close what was withdrawn
    let page = fx.ok(Some(&b), "sync", json!({"room": "coord"}));
    assert_eq!(page["open_items_total"], 0, "{page}");
    fx.sync_all(&b, "coord");
    fx.refuse(
        Some(&b),
        "done",
        json!({"room": "coord", "task": task}),
        "task_state_invalid",
    );
    // settled is settled
    fx.refuse(
        Some(&a),
        "task_cancel",
        json!({"task": task}),
        "task_state_invalid",
    );
    // the lease is free, and the subtask lost its live ancestor
    fx.ok(Some(&g), "task_claim", json!({"task": rival}));
    fx.refuse(
        Some(&g),
        "task_claim",
        json!({"task": child}),
        "task_ancestry_invalid",
    );
}
