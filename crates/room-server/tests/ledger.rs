//! The destination ledger through the daemon API: an external operation recorded Begin →
//! Effect → Resolve inside a claim, a `destination` acceptance check that needs the folded
//! status `succeeded` and a fresh probe that sees the effect, and each invariant's verdict on
//! an operation that breaks the order (recorded, nothing else changed).

mod common;
use common::*;
use serde_json::{Value, json};
use std::path::PathBuf;

struct Team {
    fx: Fx,
    a: String,
    b: String,
    g: String,
    dir: PathBuf,
    task: String,
}

/// alpha creates a task for beta leasing `file:dist` whose acceptance is `accept`; beta claims
/// it and reads the room. `/usr/bin/test` is on the allowlist (for probes).
fn team(accept: Value) -> Team {
    let mut fx = Fx::new();
    fx.write_config("[acceptance]\ncommands = [\"/usr/bin/test\"]\n");
    let a = fx.enroll("alpha", "coordinator");
    let b = fx.enroll("beta", "member");
    let g = fx.enroll("gamma", "member");
    let (dir, pid) = fx.open_project("p1");
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta", "gamma"]}),
    );
    let task = fx.ok(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "publish the app", "to": "beta",
            "scopes": ["file:dist"], "accept": accept}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    fx.tasks.push(task.clone());
    fx.ok(Some(&b), "task_claim", json!({"task": task}));
    Team {
        fx,
        a,
        b,
        g,
        dir,
        task,
    }
}

const PROBE: &str =
    r#"{"program": "/usr/bin/test", "args": ["-f", "dist/app"], "timeout_ms": 5000}"#;

impl Team {
    fn begin(&mut self, extra: Value) -> Value {
        let mut args = json!({"room": "build", "task": self.task, "destination": "file:dist",
            "probe": serde_json::from_str::<Value>(PROBE).unwrap()});
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let b = self.b.clone();
        self.fx.ok(Some(&b), "op_begin", args)
    }

    fn done(&mut self) -> Result<Value, room_core::Refusal> {
        let b = self.b.clone();
        self.fx.sync_all(&b, "build");
        let r = self.fx.call(
            Some(&b),
            "done",
            json!({"room": "build", "task": self.task}),
        );
        match r.refusal {
            Some(refusal) => Err(refusal),
            None => Ok(r.result.unwrap()),
        }
    }
}

#[test]
fn a_destination_check_needs_a_succeeded_operation_whose_effect_a_fresh_probe_sees() {
    let mut tm = team(json!([{"kind": "destination", "destination": "file:dist"}]));
    let r = tm.done().unwrap_err();
    assert_eq!(r.code.as_str(), "task_acceptance_failed");
    assert_eq!(
        r.detail["acceptance_results"][0]["detail"]["observation"],
        "no_operation"
    );
    let op = tm.begin(json!({}))["op"].as_str().unwrap().to_string();
    let b = tm.b.clone();
    tm.fx.ok(
        Some(&b),
        "op_effect",
        json!({"room": "build", "op": op, "note": "uploaded"}),
    );
    let r = tm.done().unwrap_err();
    let d = &r.detail["acceptance_results"][0]["detail"];
    assert_eq!(d["status"], "effected", "{d}");
    tm.fx.ok(
        Some(&b),
        "op_resolve",
        json!({"room": "build", "op": op, "outcome": "succeeded"}),
    );
    // resolved, but the probe does not see the artifact: not done
    let r = tm.done().unwrap_err();
    let d = &r.detail["acceptance_results"][0]["detail"];
    assert_eq!(
        (d["status"].as_str(), d["effect_present"].as_bool()),
        (Some("resolved"), Some(false)),
        "{d}"
    );
    std::fs::create_dir_all(tm.dir.join("dist")).unwrap();
    std::fs::write(tm.dir.join("dist/app"), b"binary").unwrap();
    let v = tm.done().unwrap();
    assert_eq!(v["detail"]["acceptance"], "passed");
    let d = &v["detail"]["acceptance_results"][0]["detail"];
    assert_eq!(d["operation_id"], op.as_str());
    assert_eq!(d["effect_present"], true);
}

#[test]
fn a_failed_outcome_never_passes() {
    let mut tm = team(json!([{"kind": "destination"}]));
    std::fs::create_dir_all(tm.dir.join("dist")).unwrap();
    std::fs::write(tm.dir.join("dist/app"), b"binary").unwrap();
    let op = tm.begin(json!({}))["op"].as_str().unwrap().to_string();
    let b = tm.b.clone();
    tm.fx.ok(
        Some(&b),
        "op_resolve",
        json!({"room": "build", "op": op, "outcome": "failed"}),
    );
    let r = tm.done().unwrap_err();
    assert_eq!(r.code.as_str(), "task_acceptance_failed");
}

#[test]
fn well_formed_rejects_operations_out_of_order() {
    let mut tm = team(json!([]));
    let b = tm.b.clone();
    // an effect or resolution cannot invent its own operation
    tm.fx.refuse_violation(
        &b,
        "op_effect",
        json!({"room": "build", "op": "op_00000000deadbeef"}),
        "build",
        "well_formed",
    );
    let op = tm.begin(json!({}))["op"].as_str().unwrap().to_string();
    // only its own agent records its phases
    let g = tm.fx.enroll("delta", "member");
    tm.fx.ok(
        None,
        "room_members_add",
        json!({"room": "build", "agent": "delta"}),
    );
    tm.fx.refuse_violation(
        &g,
        "op_resolve",
        json!({"room": "build", "op": op, "outcome": "succeeded"}),
        "build",
        "well_formed",
    );
    tm.fx.ok(
        Some(&b),
        "op_resolve",
        json!({"room": "build", "op": op, "outcome": "succeeded"}),
    );
    // nothing after the resolution
    tm.fx.refuse_violation(
        &b,
        "op_effect",
        json!({"room": "build", "op": op}),
        "build",
        "well_formed",
    );
    // claim before act: alpha holds no claim of the task
    let a = tm.a.clone();
    let task = tm.task.clone();
    tm.fx.refuse_violation(
        &a,
        "op_begin",
        json!({"room": "build", "task": task, "destination": "file:dist"}),
        "build",
        "well_formed",
    );
}

#[test]
fn exactly_once_and_causal_on_operations() {
    let mut tm = team(json!([]));
    let first = tm.begin(json!({"idempotency_key": "deploy-1"}));
    let b = tm.b.clone();
    let task = tm.task.clone();
    let r = tm.fx.refuse_violation(
        &b,
        "op_begin",
        json!({"room": "build", "task": task, "destination": "file:dist", "idempotency_key": "deploy-1"}),
        "build",
        "exactly_once",
    );
    assert_eq!(r.detail["original_event"], first["event"]);
    // a Begin on an unresolved parent is committed with a causal flag beside it
    let parent = first["op"].as_str().unwrap();
    let child = tm.begin(json!({"parent": parent}));
    assert_eq!(child["flags"][0]["invariant"], "causal", "{child}");
    let log = tm
        .fx
        .ok(None, "room_log", json!({"room": "build", "limit": 1000}));
    let last = log["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["event"]["invariant"], "causal");
    assert_eq!(last["event"]["severity"], "flag");
    assert_eq!(last["event"]["event"], child["event"]);
    // once the parent resolves, a dependent Begin is not flagged
    tm.fx.ok(
        Some(&b),
        "op_resolve",
        json!({"room": "build", "op": parent, "outcome": "succeeded"}),
    );
    let third = tm.begin(json!({"parent": parent}));
    assert!(third["flags"].as_array().unwrap().is_empty(), "{third}");
}

#[test]
fn operation_refusals_name_their_field_and_change_nothing() {
    let mut tm = team(json!([]));
    let b = tm.b.clone();
    let task = tm.task.clone();
    let base = json!({"room": "build", "task": task, "destination": "file:dist"});
    let with = |extra: Value| {
        let mut v = base.clone();
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    let r = tm.fx.refuse(
        Some(&b),
        "op_begin",
        with(json!({"destination": "file:src"})),
        "task_scope_widened",
    );
    assert_eq!(r.detail["destination"], "file:src");
    let r = tm.fx.refuse(
        Some(&b),
        "op_begin",
        with(json!({"probe": {"program": "/bin/true"}})),
        "acceptance_command_not_allowed",
    );
    assert_eq!(r.detail["field"], "probe.program");
    for (extra, field) in [
        (json!({"destination": "nonsense"}), "destination"),
        (json!({"parent": "op_x"}), "parent"),
        (json!({"parent": "op_00000000deadbeef"}), "parent"),
        (json!({"probe": {"program": "test"}}), "probe.program"),
        (json!({"ttl_ms": 1}), "ttl_ms"),
    ] {
        let r = tm.fx.refuse(
            Some(&b),
            "op_begin",
            with(extra.clone()),
            "invalid_argument",
        );
        assert_eq!(r.detail["field"], field, "{extra}: {r}");
    }
    let op = tm.begin(json!({}))["op"].as_str().unwrap().to_string();
    for (args, field) in [
        (
            json!({"room": "build", "op": op, "outcome": "maybe"}),
            "outcome",
        ),
        (json!({"room": "build", "op": op}), "outcome"),
        (
            json!({"room": "build", "op": "nonsense", "outcome": "failed"}),
            "op",
        ),
    ] {
        let r = tm
            .fx
            .refuse(Some(&b), "op_resolve", args, "invalid_argument");
        assert_eq!(r.detail["field"], field);
    }
    let r = tm.fx.refuse(
        Some(&b),
        "op_effect",
        json!({"room": "build", "op": op, "outcome": "succeeded"}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "outcome");
}

/// A destination check reads the operations of the task's current holder: an operation an
/// earlier holder recorded (before a handoff) is not this claim's work.
#[test]
fn a_destination_check_counts_only_the_current_holder_s_operations() {
    let mut tm = team(json!([{"kind": "destination", "destination": "file:dist"}]));
    std::fs::create_dir_all(tm.dir.join("dist")).unwrap();
    std::fs::write(tm.dir.join("dist/app"), b"binary").unwrap();
    let op = tm.begin(json!({}))["op"].as_str().unwrap().to_string();
    let b = tm.b.clone();
    tm.fx.ok(
        Some(&b),
        "op_resolve",
        json!({"room": "build", "op": op, "outcome": "succeeded"}),
    );
    // beta hands the task to gamma, which claims it afresh
    tm.fx.sync_all(&b, "build");
    tm.fx.ok(
        Some(&b),
        "handoff",
        json!({"room": "build", "task": tm.task, "to": ["gamma"]}),
    );
    let g = tm.g.clone();
    tm.fx.ok(Some(&g), "task_claim", json!({"task": tm.task}));
    tm.fx.sync_all(&g, "build");
    let r = tm
        .fx
        .call(Some(&g), "done", json!({"room": "build", "task": tm.task}));
    let r = expect_code(
        r,
        "task_acceptance_failed",
        "gamma's done on beta's operation",
    );
    let d = &r.detail["acceptance_results"][0]["detail"];
    assert_eq!(d["observation"], "no_operation", "{d}");
}
