//! The blackboard through the daemon: artifact versions are notes in the collaboration's room
//! (their content in a blob), written past the fence of the writer's scopes, the kind's schema,
//! the expected version and the room's limits, and read past the reader's scopes and each
//! version's audience. Every refusal leaves the journal, the tasks and the wakes as they were.

mod common;
use common::*;
use serde_json::{Value, json};

struct Board {
    fx: Fx,
    orch: String,
    writer: String,
    reviewer: String,
    reviewer2: String,
}

/// The orchestrator (session scopes only), a spec writer and two reviewers under it, all in
/// the room `collab`, each caught up.
fn board() -> Board {
    let mut fx = Fx::new();
    let mint = |fx: &mut Fx, parent: Option<&str>, name: &str, scopes: Value| {
        let v = fx.ok(
            None,
            "agent_delegate",
            json!({"parent": parent, "name": name, "scopes": scopes, "max_tier": "member"}),
        );
        v["token"].as_str().unwrap().to_string()
    };
    let orch = mint(
        &mut fx,
        None,
        "orch",
        json!(["session:dispatch", "session:read"]),
    );
    let writer = mint(
        &mut fx,
        Some("orch"),
        "writer",
        json!([
            "artifact:read:spec",
            "artifact:write:spec",
            "artifact:write:extra/notes"
        ]),
    );
    let reviewer = mint(
        &mut fx,
        Some("orch"),
        "reviewer",
        json!([
            "artifact:read:spec",
            "artifact:read:findings",
            "artifact:write:findings"
        ]),
    );
    let reviewer2 = mint(
        &mut fx,
        Some("orch"),
        "reviewer2",
        json!([
            "artifact:read:spec",
            "artifact:read:findings",
            "artifact:write:findings"
        ]),
    );
    fx.ok(
        None,
        "room_create",
        json!({"name": "collab", "members": ["orch", "writer", "reviewer", "reviewer2"]}),
    );
    for t in [&orch, &writer, &reviewer, &reviewer2] {
        fx.sync_all(t, "collab");
    }
    Board {
        fx,
        orch,
        writer,
        reviewer,
        reviewer2,
    }
}

fn spec(goal: &str) -> Value {
    json!({"title": "add a flag", "goal": goal, "requirements": ["--verbose prints each step"]})
}

fn put(kind: &str, content: Value, expected: u32) -> Value {
    json!({"room": "collab", "kind": kind, "content": content, "expected_version": expected})
}

#[test]
fn versions_are_written_against_the_one_expected_and_read_back_whole() {
    let mut b = board();
    let fx = &mut b.fx;
    let v1 = fx.ok(
        Some(&b.writer),
        "artifact_put",
        put("spec", spec("first"), 0),
    );
    assert_eq!(v1["verb"], "note", "{v1}");
    let first = v1["event"].as_str().unwrap().to_string();
    // a second writer of version 1 lost the race: told where the key is, nothing written
    let r = fx.refuse(
        Some(&b.writer),
        "artifact_put",
        put("spec", spec("again"), 0),
        "artifact_version_conflict",
    );
    assert_eq!(r.detail["current_version"], 1, "{r}");
    assert_eq!(r.detail["expected_version"], 0);
    let mut second = put("spec", spec("second"), 1);
    second["parents"] = json!([first]);
    fx.ok(Some(&b.writer), "artifact_put", second);
    // the reader gets the newest, or the version it names, with what it was made from
    let got = fx.ok(
        Some(&b.reviewer),
        "artifact_get",
        json!({"room": "collab", "kind": "spec"}),
    );
    assert_eq!(got["version"], 2);
    assert_eq!(got["content"]["goal"], "second");
    assert_eq!(got["producer"], "writer");
    assert_eq!(got["parents"], json!([first]));
    let bytes = room_core::canonical_bytes(&got["content"]);
    assert_eq!(got["sha256"], room_core::sha256_hex(&bytes));
    assert_eq!(got["bytes"], bytes.len());
    let old = fx.ok(
        Some(&b.reviewer),
        "artifact_get",
        json!({"room": "collab", "kind": "spec", "version": 1}),
    );
    assert_eq!(old["content"]["goal"], "first");
    // the orchestrator holds the index, not the contents
    let index = fx.ok(Some(&b.orch), "artifact_index", json!({"room": "collab"}));
    let entries = index["artifacts"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{index}");
    assert_eq!(entries[0]["kind"], "spec");
    assert_eq!(entries[0]["version"], 2);
    assert!(entries[0].get("content").is_none());
    fx.refuse(
        Some(&b.orch),
        "artifact_get",
        json!({"room": "collab", "kind": "spec"}),
        "artifact_read_denied",
    );
    // the index is a projection of the journal: a rebuild brings back every version
    fx.ok(None, "index_rebuild", json!({"room": "collab"}));
    let again = fx.ok(
        None,
        "collab_artifact",
        json!({"room": "collab", "kind": "spec", "version": 1}),
    );
    assert_eq!(again["content"], old["content"]);
    assert_eq!(again["event"], first);
}

#[test]
fn the_fence_refuses_a_write_or_read_the_scopes_do_not_hold() {
    let mut b = board();
    let fx = &mut b.fx;
    // a reviewer writes findings only; the orchestrator writes nothing
    let r = fx.refuse(
        Some(&b.reviewer),
        "artifact_put",
        put("spec", spec("mine"), 0),
        "artifact_write_denied",
    );
    assert_eq!(r.detail["scope"], "artifact:write:spec", "{r}");
    fx.refuse(
        Some(&b.orch),
        "artifact_put",
        put("extra/notes", json!({"any": "thing"}), 0),
        "artifact_write_denied",
    );
    // the writer reads only what it holds a read scope for
    fx.ok(
        Some(&b.writer),
        "artifact_put",
        put("extra/notes", json!({"any": "thing"}), 0),
    );
    let r = fx.refuse(
        Some(&b.writer),
        "artifact_get",
        json!({"room": "collab", "kind": "extra/notes"}),
        "artifact_read_denied",
    );
    assert_eq!(r.detail["scope"], "artifact:read:extra/notes");
    // a scope names its kind exactly: reading findings does not open extra/notes
    fx.refuse(
        Some(&b.reviewer),
        "artifact_get",
        json!({"room": "collab", "kind": "extra/notes"}),
        "artifact_read_denied",
    );
    // the schema names the field; an unknown kind or a bad key names the argument
    let r = fx.refuse(
        Some(&b.writer),
        "artifact_put",
        put("spec", json!({"title": "t", "goal": "g"}), 0),
        "artifact_schema_invalid",
    );
    assert_eq!(r.detail["field"], "requirements", "{r}");
    let r = fx.refuse(
        Some(&b.writer),
        "artifact_put",
        put("memo", json!({}), 0),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "kind", "{r}");
    let mut bad_key = put("spec", spec("g"), 0);
    bad_key["key"] = json!("../etc");
    let r = fx.refuse(Some(&b.writer), "artifact_put", bad_key, "invalid_argument");
    assert_eq!(r.detail["field"], "key", "{r}");
    // a member of another room, and a version that does not exist
    fx.refuse(
        Some(&b.reviewer),
        "artifact_get",
        json!({"room": "collab", "kind": "spec", "version": 9}),
        "not_found",
    );
}

#[test]
fn findings_addressed_before_the_barrier_are_withheld_from_the_other_reviewer() {
    let mut b = board();
    let fx = &mut b.fx;
    let mut findings = put(
        "findings",
        json!({"blocking": [{"title": "no test for --verbose", "file": "src/main.rs", "line": 3}],
            "non_blocking": [], "suggestions": []}),
        0,
    );
    findings["key"] = json!("reviewer");
    findings["audience"] = json!(["orch"]);
    fx.ok(Some(&b.reviewer), "artifact_put", findings);
    // the other reviewer neither lists nor reads it: to it, it does not exist
    let index = fx.ok(
        Some(&b.reviewer2),
        "artifact_index",
        json!({"room": "collab"}),
    );
    assert_eq!(index["artifacts"], json!([]), "{index}");
    fx.refuse(
        Some(&b.reviewer2),
        "artifact_get",
        json!({"room": "collab", "kind": "findings", "key": "reviewer"}),
        "not_found",
    );
    // the orchestrator lists it (and cannot read it: it holds no read scope); the owner reads
    let index = fx.ok(Some(&b.orch), "artifact_index", json!({"room": "collab"}));
    assert_eq!(index["artifacts"][0]["key"], "reviewer", "{index}");
    assert_eq!(
        index["artifacts"][0]["audience"],
        json!(["orch", "reviewer"])
    );
    let got = fx.ok(
        None,
        "collab_artifact",
        json!({"room": "collab", "kind": "findings", "key": "reviewer"}),
    );
    assert_eq!(got["content"]["blocking"][0]["line"], 3);
    // the reviewer's own findings stay its own to read
    fx.ok(
        Some(&b.reviewer),
        "artifact_get",
        json!({"room": "collab", "kind": "findings", "key": "reviewer"}),
    );
}

#[test]
fn a_write_passes_the_work_gate_like_any_contribution() {
    let mut b = board();
    let fx = &mut b.fx;
    fx.ok(
        Some(&b.reviewer),
        "note",
        json!({"room": "collab", "text": "starting"}),
    );
    // the writer has not read the reviewer's note: refused, nothing written
    let r = fx.refuse(
        Some(&b.writer),
        "artifact_put",
        put("spec", spec("g"), 0),
        "room_sync_required",
    );
    let receipt = r.detail["next_page"]["receipt"]
        .as_str()
        .unwrap()
        .to_string();
    let mut retry = put("spec", spec("g"), 0);
    retry["read_through"] = json!(receipt);
    let v = fx.ok(Some(&b.writer), "artifact_put", retry);
    assert_eq!(v["verb"], "note");
}

#[test]
fn the_blackboard_limits_come_from_config_and_refuse_past_them() {
    let mut b = board();
    let fx = &mut b.fx;
    fx.write_config(
        "[blackboard]\nartifact_bytes_max = 200\nversions_per_key_max = 2\nkeys_per_collaboration_max = 2\n",
    );
    let r = fx.refuse(
        Some(&b.writer),
        "artifact_put",
        put("spec", spec(&"x".repeat(300)), 0),
        "payload_too_large",
    );
    assert_eq!(r.detail["field"], "content", "{r}");
    assert_eq!(r.detail["limit_bytes"], 200);
    fx.ok(Some(&b.writer), "artifact_put", put("spec", spec("a"), 0));
    fx.ok(Some(&b.writer), "artifact_put", put("spec", spec("b"), 1));
    let r = fx.refuse(
        Some(&b.writer),
        "artifact_put",
        put("spec", spec("c"), 2),
        "quota_exceeded",
    );
    assert_eq!(r.detail["limit"], 2, "{r}");
    fx.ok(
        Some(&b.writer),
        "artifact_put",
        put("extra/notes", json!({"n": 1}), 0),
    );
    let mut third = put("spec", spec("d"), 0);
    third["key"] = json!("other");
    let r = fx.refuse(Some(&b.writer), "artifact_put", third, "quota_exceeded");
    assert_eq!(r.detail["field"], "key", "{r}");
    // a limit out of its bounds is a config the daemon refuses to load (it fails closed)
    fx.write_config("[blackboard]\nartifact_bytes_max = 0\n");
    fx.refuse(
        Some(&b.writer),
        "artifact_put",
        put("extra/notes", json!({"n": 2}), 1),
        "tool_result_withheld",
    );
}

#[test]
fn revoking_the_orchestrator_ends_its_children_s_blackboard_calls() {
    let mut b = board();
    let fx = &mut b.fx;
    fx.ok(Some(&b.writer), "artifact_put", put("spec", spec("a"), 0));
    fx.ok(None, "agent_revoke", json!({"name": "orch"}));
    let r = fx.refuse(
        Some(&b.reviewer),
        "artifact_get",
        json!({"room": "collab", "kind": "spec"}),
        "credential_revoked",
    );
    assert_eq!(r.detail["revoked_by"], "orch", "{r}");
    fx.refuse(
        Some(&b.writer),
        "artifact_put",
        put("spec", spec("b"), 1),
        "credential_revoked",
    );
}

/// Two writers who both expect version 0, at once and many times over: each round exactly one
/// lands; the other is refused (a conflict, or the gate's concurrent arrival) and writes nothing.
#[test]
fn racing_writers_of_one_version_never_both_land() {
    let mut b = board();
    let second = b.fx.ok(
        None,
        "agent_delegate",
        json!({"parent": "orch", "name": "writer2", "max_tier": "member",
            "scopes": ["artifact:read:spec", "artifact:write:spec"]}),
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    b.fx.ok(
        None,
        "room_members_add",
        json!({"room": "collab", "agent": "writer2"}),
    );
    let socket = b.fx.daemon.socket.clone();
    let rounds = 8;
    for round in 0..rounds {
        let mut key = put("spec", spec(&format!("round {round}")), 0);
        key["key"] = json!(format!("k{round}"));
        let results: Vec<(bool, Option<String>)> = [b.writer.clone(), second.clone()]
            .into_iter()
            .map(|token| {
                let socket = socket.clone();
                let args = key.clone();
                std::thread::spawn(move || {
                    let mut c = room_server::client::Client::connect(&socket).unwrap();
                    // each catches up first, then both write
                    let mut page = c
                        .call(&request(Some(&token), "sync", json!({"room": "collab"})))
                        .unwrap();
                    loop {
                        let r = page.result.clone().unwrap();
                        let next = c
                            .call(&request(
                                Some(&token),
                                "sync",
                                json!({"room": "collab", "confirm": r["receipt"]}),
                            ))
                            .unwrap();
                        let n = next.result.clone().unwrap();
                        if n["more"] == false && n["items"].as_array().is_some_and(|a| a.is_empty())
                        {
                            break;
                        }
                        page = next;
                    }
                    let r = c
                        .call(&request(Some(&token), "artifact_put", args))
                        .unwrap();
                    (r.ok, r.refusal.map(|r| r.code.as_str().to_string()))
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let landed = results.iter().filter(|(ok, _)| *ok).count();
        assert!(landed <= 1, "round {round}: {results:?}");
        for (ok, code) in &results {
            if !ok {
                assert!(
                    matches!(
                        code.as_deref(),
                        Some(
                            "artifact_version_conflict"
                                | "room_sync_concurrent_arrival"
                                | "room_sync_required"
                        )
                    ),
                    "round {round}: {results:?}"
                );
            }
        }
        let got = b.fx.ok(
            None,
            "collab_artifact",
            json!({"room": "collab", "kind": "spec", "key": format!("k{round}")}),
        );
        assert_eq!(got["version"], 1, "round {round}");
        if landed == 0 {
            panic!("round {round}: neither landed: {results:?}");
        }
    }
}

/// A phase run is a task whose acceptance is that its writes exist: `done` is refused until the
/// holder has written the artifact for the task, and a version someone else wrote for it, or
/// one written for no task, does not count.
#[test]
fn an_artifact_check_closes_a_task_only_on_the_holder_s_version() {
    let mut b = board();
    let fx = &mut b.fx;
    let alpha = fx.enroll("alpha", "coordinator");
    fx.ok(
        None,
        "room_members_add",
        json!({"room": "collab", "agent": "alpha"}),
    );
    fx.sync_all(&alpha, "collab");
    // a malformed check names its field
    let r = fx.refuse(
        Some(&alpha),
        "task_create",
        json!({"room": "collab", "title": "spec", "to": "writer",
            "accept": [{"kind": "artifact", "artifact": "memo"}]}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "accept[0].artifact", "{r}");
    let t = fx.ok(
        Some(&alpha),
        "task_create",
        json!({"room": "collab", "title": "write the spec", "to": "writer",
            "accept": [{"kind": "artifact", "artifact": "spec"}]}),
    );
    let task = t["task"]["id"].as_str().unwrap().to_string();
    fx.tasks.push(task.clone());
    fx.sync_all(&b.writer, "collab");
    fx.ok(Some(&b.writer), "task_claim", json!({"task": task}));
    fx.sync_all(&b.writer, "collab");
    // nothing written yet, then a version written for no task: refused, nothing changes
    fx.ok(
        Some(&b.writer),
        "artifact_put",
        put("spec", spec("loose"), 0),
    );
    // refused: the journal and the task stand (the failed evaluation is kept as the newest)
    let lines = fx.journal_lines();
    let r = expect_code(
        fx.call(
            Some(&b.writer),
            "done",
            json!({"room": "collab", "task": task}),
        ),
        "task_acceptance_failed",
        "done without the artifact",
    );
    assert_eq!(fx.journal_lines(), lines);
    assert_eq!(fx.task_status(&task), "claimed");
    let results = r.detail["acceptance_results"].as_array().unwrap();
    assert_eq!(results[0]["kind"], "artifact", "{r}");
    assert_eq!(results[0]["pass"], false);
    // a root bounded by its tier alone may write it, but it is not the holder's work
    fx.sync_all(&alpha, "collab");
    let mut theirs = put("spec", spec("by someone else"), 1);
    theirs["task"] = json!(task);
    fx.ok(Some(&alpha), "artifact_put", theirs);
    fx.sync_all(&b.writer, "collab");
    let r = expect_code(
        fx.call(
            Some(&b.writer),
            "done",
            json!({"room": "collab", "task": task}),
        ),
        "task_acceptance_failed",
        "done on another's version",
    );
    assert_eq!(
        r.detail["acceptance_results"][0]["detail"]["producer"], "alpha",
        "{r}"
    );
    let mut written = put("spec", spec("for the task"), 2);
    written["task"] = json!(task);
    fx.ok(Some(&b.writer), "artifact_put", written);
    let done = fx.ok(
        Some(&b.writer),
        "done",
        json!({"room": "collab", "task": task}),
    );
    assert_eq!(done["detail"]["acceptance"], "passed", "{done}");
    assert_eq!(fx.task_status(&task), "done");
}

/// In a project room a `diff` must apply to the project as it stands (`git apply --check`,
/// run confined): one that does not is refused `artifact_diff_does_not_apply`, naming why,
/// and nothing is written.
#[test]
fn a_diff_that_does_not_apply_to_the_project_is_refused() {
    let mut fx = Fx::new();
    let (dir, project) = fx.open_project("sample");
    std::fs::write(dir.join("greet.sh"), "#!/bin/sh\necho \"hello\"\n").unwrap();
    let writer = fx.ok(
        None,
        "agent_delegate",
        json!({"name": "impl", "max_tier": "member", "scopes": ["artifact:write:diff"]}),
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    fx.ok(
        None,
        "room_create",
        json!({"name": "work", "project": project, "members": ["impl"]}),
    );
    fx.sync_all(&writer, "work");
    let diff = |old: &str| {
        json!({"room": "work", "kind": "diff", "expected_version": 0, "content": {
            "base": "sample@1",
            "patch": format!("--- a/greet.sh\n+++ b/greet.sh\n@@ -1,2 +1,3 @@\n #!/bin/sh\n+# greets\n {old}\n"),
        }})
    };
    let r = fx.refuse(
        Some(&writer),
        "artifact_put",
        diff("echo \"goodbye\""),
        "artifact_diff_does_not_apply",
    );
    assert_eq!(r.detail["field"], "patch", "{r}");
    assert!(
        r.detail["stderr"].as_str().unwrap().contains("greet.sh"),
        "{r}"
    );
    fx.ok(Some(&writer), "artifact_put", diff("echo \"hello\""));
    // the check reads the project and changes nothing in it
    assert_eq!(
        std::fs::read_to_string(dir.join("greet.sh")).unwrap(),
        "#!/bin/sh\necho \"hello\"\n"
    );
}

/// Issue 42, item 2: a finding's file and line point into the diff under review (the room's
/// newest `diff`): a file it does not change, or a line outside its hunks, is refused naming
/// the finding, and nothing is written; a finding without them, or inside a hunk, is taken.
#[test]
fn a_finding_s_evidence_must_point_into_the_diff_under_review() {
    let mut b = board();
    let fx = &mut b.fx;
    let differ = fx.ok(
        None,
        "agent_delegate",
        json!({"parent": "orch", "name": "differ", "scopes": ["artifact:write:diff"], "max_tier": "member"}),
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    fx.ok(
        None,
        "room_members_add",
        json!({"room": "collab", "agent": "differ"}),
    );
    fx.sync_all(&differ, "collab");
    let patch = "--- a/src/main.rs\n+++ b/src/main.rs\n@@ -10,2 +10,3 @@\n fn main() {\n+    verbose();\n }\n";
    fx.ok(
        Some(&differ),
        "artifact_put",
        put("diff", json!({"base": "b1", "patch": patch}), 0),
    );
    fx.sync_all(&b.reviewer, "collab");
    let findings = |file: &str, line: u64| {
        let mut f = put(
            "findings",
            json!({"blocking": [{"title": "t", "file": file, "line": line}],
                "non_blocking": [], "suggestions": []}),
            0,
        );
        f["key"] = json!("reviewer");
        f
    };
    let before = fx.snapshot();
    let r = fx.refuse(
        Some(&b.reviewer),
        "artifact_put",
        findings("src/lib.rs", 10),
        "artifact_schema_invalid",
    );
    assert_eq!(r.detail["field"], "blocking[0].file", "{r}");
    let r = fx.refuse(
        Some(&b.reviewer),
        "artifact_put",
        findings("src/main.rs", 40),
        "artifact_schema_invalid",
    );
    assert_eq!(r.detail["field"], "blocking[0].line", "{r}");
    assert_eq!(fx.snapshot(), before);
    fx.ok(
        Some(&b.reviewer),
        "artifact_put",
        findings("src/main.rs", 11),
    );
}
