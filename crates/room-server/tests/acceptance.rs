//! Completion is a measurement: a real daemon evaluates each task's acceptance checks against
//! live files and processes, refuses `done` while one fails (changing nothing but the task's
//! newest evaluation), and resolves obligations only when every check passes. One test per
//! acceptance kind, passing and failing, and per refusal code the feature adds.

mod common;
use common::*;
use serde_json::{Value, json};
use std::path::PathBuf;

/// A project room `build` with alpha (coordinator, the owner of tasks) and beta (member).
struct Team {
    fx: Fx,
    a: String,
    b: String,
    dir: PathBuf,
}

fn team() -> Team {
    let mut fx = Fx::new();
    let a = fx.enroll("alpha", "coordinator");
    let b = fx.enroll("beta", "member");
    let (dir, pid) = fx.open_project("p1");
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta"]}),
    );
    Team { fx, a, b, dir }
}

impl Team {
    /// alpha creates a task for beta with `accept`, sends it (an obligation on beta), and
    /// beta claims it and reads the room.
    fn assigned(&mut self, accept: Value, requirements: Value) -> String {
        let Team { fx, a, b, .. } = self;
        let t = fx.ok(
            Some(a),
            "task_create",
            json!({"room": "build", "title": "produce out.txt", "to": "beta",
                "accept": accept, "requirements": requirements}),
        )["task"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        fx.sync_all(a, "build");
        fx.ok(
            Some(a),
            "send",
            json!({"room": "build", "to": ["beta"], "text": "please produce out.txt", "task": t}),
        );
        fx.ok(Some(b), "task_claim", json!({"task": t}));
        fx.sync_all(b, "build");
        t
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

    /// `done` by beta must be refused with `code`, leaving the journal, the task's status and
    /// beta's obligations as they were; returns the refusal's detail.
    #[track_caller]
    fn done_refused(&mut self, t: &str, code: &str) -> Value {
        let before = (
            self.fx.journal_lines(),
            self.fx.task_status(t),
            self.open_obligations(),
        );
        let b = self.b.clone();
        let r = self
            .fx
            .call(Some(&b), "done", json!({"room": "build", "task": t}));
        assert!(!r.ok, "done was accepted: {:?}", r.result);
        let refusal = r.refusal.unwrap();
        assert_eq!(refusal.code.as_str(), code, "{refusal}");
        let after = (
            self.fx.journal_lines(),
            self.fx.task_status(t),
            self.open_obligations(),
        );
        assert_eq!(
            before, after,
            "a refused done changed the journal, task or items"
        );
        refusal.detail
    }

    fn done_ok(&mut self, t: &str) -> Value {
        let b = self.b.clone();
        let v = self
            .fx
            .ok(Some(&b), "done", json!({"room": "build", "task": t}));
        assert_eq!(self.fx.task_status(t), "done");
        v
    }

    fn write(&self, rel: &str, bytes: &[u8]) {
        let p = self.dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
}

fn sha256_hex(b: &[u8]) -> String {
    room_core::sha256_hex(b)
}

fn result(detail: &Value, i: usize) -> &Value {
    &detail["acceptance_results"][i]
}

#[test]
fn file_exists_refuses_done_until_the_artifact_is_there() {
    let mut tm = team();
    let t = tm.assigned(
        json!([{"kind": "file_exists", "path": "out/result.txt"}]),
        json!([]),
    );
    assert_eq!(tm.open_obligations(), 1);
    let d = tm.done_refused(&t, "task_acceptance_failed");
    assert_eq!(d["acceptance_pass"], false);
    assert_eq!(result(&d, 0)["kind"], "file_exists");
    assert_eq!(result(&d, 0)["pass"], false);
    assert_eq!(result(&d, 0)["detail"]["observation"], "absent");
    assert_eq!(result(&d, 0)["detail"]["path"], "project:/out/result.txt");
    tm.write("out/result.txt", b"done");
    let v = tm.done_ok(&t);
    let event = v["event"].as_str().unwrap().to_string();
    assert_eq!(
        tm.open_obligations(),
        0,
        "a passing done resolves the obligation"
    );
    let log = tm
        .fx
        .ok(None, "room_log", json!({"room": "build", "limit": 1000}));
    let rec = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == event.as_str())
        .unwrap()
        .clone();
    assert_eq!(rec["event"]["detail"]["acceptance"], "passed", "{rec}");
    assert_eq!(
        rec["event"]["detail"]["acceptance_results"][0]["pass"],
        true
    );
}

#[test]
fn sha256_measures_the_live_digest() {
    let mut tm = team();
    let want = b"the expected artifact\n";
    let t = tm.assigned(
        json!([{"kind": "sha256", "path": "artifact.json", "expected": sha256_hex(want)}]),
        json!([]),
    );
    let d = tm.done_refused(&t, "task_acceptance_failed");
    assert_eq!(result(&d, 0)["detail"]["observation"], "absent");
    tm.write("artifact.json", b"something else\n");
    let d = tm.done_refused(&t, "task_acceptance_failed");
    let r = result(&d, 0);
    assert_eq!(r["pass"], false);
    assert_eq!(r["detail"]["actual"], sha256_hex(b"something else\n"));
    assert_eq!(r["detail"]["expected"], sha256_hex(want));
    tm.write("artifact.json", want);
    let v = tm.done_ok(&t);
    assert!(v["event"].is_string());
}

#[test]
fn file_absent_passes_on_absence_and_fails_on_presence() {
    let mut tm = team();
    tm.write("stale.lock", b"x");
    let t = tm.assigned(
        json!([{"kind": "file_absent", "path": "stale.lock"}]),
        json!([]),
    );
    let d = tm.done_refused(&t, "task_acceptance_failed");
    assert_eq!(result(&d, 0)["detail"]["observation"], "present");
    std::fs::remove_file(tm.dir.join("stale.lock")).unwrap();
    tm.done_ok(&t);
}

/// The seed's Exhibit 5: an observation error is `unconfirmed` and fails, for `file_absent`
/// as for `file_exists`; it is never read as absence.
#[test]
fn observation_errors_are_unconfirmed_never_absence() {
    let mut tm = team();
    // a path through a regular file: stat fails with ENOTDIR, which is not "not found"
    tm.write("blocker", b"a file, not a directory");
    // a symlink loop: stat fails with ELOOP
    std::os::unix::fs::symlink("loop", tm.dir.join("loop")).unwrap();
    let t = tm.assigned(
        json!([
            {"kind": "file_absent", "path": "blocker/result.json"},
            {"kind": "file_absent", "path": "loop"},
            {"kind": "file_exists", "path": "loop"},
        ]),
        json!([]),
    );
    let d = tm.done_refused(&t, "task_acceptance_failed");
    for i in 0..3 {
        let r = result(&d, i);
        assert_eq!(r["pass"], false, "{r}");
        assert_eq!(r["detail"]["observation"], "unconfirmed", "{r}");
        assert!(r["detail"]["error"].is_string(), "{r}");
    }
    assert_eq!(result(&d, 0)["detail"]["error_kind"], "NotADirectory");
    assert_eq!(result(&d, 1)["detail"]["error_kind"], "FilesystemLoop");
}

#[test]
fn a_symlink_out_of_the_project_is_not_measured() {
    let mut tm = team();
    let outside = tm.fx.root.join("outside.txt");
    std::fs::write(&outside, b"secret").unwrap();
    std::os::unix::fs::symlink(&outside, tm.dir.join("escape.txt")).unwrap();
    std::os::unix::fs::symlink(tm.fx.root.join("elsewhere"), tm.dir.join("away")).unwrap();
    std::fs::create_dir_all(tm.fx.root.join("elsewhere")).unwrap();
    let t = tm.assigned(
        json!([
            {"kind": "sha256", "path": "escape.txt", "expected": sha256_hex(b"secret")},
            {"kind": "file_absent", "path": "away/nothing-here"},
        ]),
        json!([]),
    );
    let d = tm.done_refused(&t, "task_acceptance_failed");
    for i in 0..2 {
        assert_eq!(result(&d, i)["detail"]["error_kind"], "OutsideTerritory");
        assert_eq!(result(&d, i)["detail"]["observation"], "unconfirmed");
    }
    assert!(
        result(&d, 0)["detail"].get("actual").is_none(),
        "no digest of a file outside the project is reported"
    );
}

#[test]
fn command_checks_run_the_allowlisted_program_with_its_exact_arguments() {
    let mut tm = team();
    tm.fx
        .write_config("[acceptance]\ncommands = [\"/usr/bin/test\", \"/bin/sleep\"]\n");
    let t = tm.assigned(
        json!([{"kind": "command", "program": "/usr/bin/test", "args": ["-s", "build/app"],
            "timeout_ms": 10000}]),
        json!([]),
    );
    let d = tm.done_refused(&t, "task_acceptance_failed");
    let r = result(&d, 0);
    assert_eq!(r["detail"]["exit_code"], 1, "{r}");
    assert_eq!(r["detail"]["timed_out"], false);
    // it runs in the project root: a relative path there decides
    tm.write("build/app", b"binary");
    tm.done_ok(&t);
}

#[test]
fn a_command_that_outlives_its_timeout_fails() {
    let mut tm = team();
    tm.fx
        .write_config("[acceptance]\ncommands = [\"/bin/sleep\"]\n");
    let t = tm.assigned(
        json!([{"kind": "command", "program": "/bin/sleep", "args": ["30"], "timeout_ms": 300}]),
        json!([]),
    );
    let d = tm.done_refused(&t, "task_acceptance_failed");
    let r = result(&d, 0);
    assert_eq!(r["pass"], false);
    assert_eq!(r["detail"]["timed_out"], true, "{r}");
    assert!(r["detail"]["exit_code"].is_null());
}

#[test]
fn a_program_dropped_from_the_allowlist_no_longer_runs() {
    let mut tm = team();
    tm.fx
        .write_config("[acceptance]\ncommands = [\"/bin/true\"]\n");
    let t = tm.assigned(
        json!([{"kind": "command", "program": "/bin/true"}]),
        json!([]),
    );
    // the owner withdraws it after the task was created: the check fails, refused
    tm.fx.write_config("[acceptance]\ncommands = []\n");
    // config.toml changes are picked up once their timestamps settle; wait them out
    std::thread::sleep(std::time::Duration::from_millis(2_100));
    let d = tm.done_refused(&t, "task_acceptance_failed");
    assert_eq!(result(&d, 0)["detail"]["observation"], "refused");
}

#[test]
fn acceptance_command_not_allowed() {
    let mut tm = team();
    let Team { fx, a, .. } = &mut tm;
    fx.sync_all(a, "build");
    let r = fx.refuse(
        Some(a),
        "task_create",
        json!({"room": "build", "title": "t",
            "accept": [{"kind": "command", "program": "/bin/true"}]}),
        "acceptance_command_not_allowed",
    );
    assert_eq!(r.detail["field"], "accept[0].program");
    assert!(r.hint.unwrap().contains("[acceptance]"));
}

#[test]
fn a_worker_receipt_of_the_wrong_shape_is_refused_by_field_and_creates_nothing() {
    let mut tm = team();
    let Team { fx, a, .. } = &mut tm;
    for (check, field) in [
        (json!({"kind": "worker_receipt"}), "accept[1].profile"),
        (
            json!({"kind": "worker_receipt", "profile": "strict", "worker": "beta",
                "target": {"path": "data.json", "key": "2"}, "fields": ["name"], "min": 1}),
            "accept[1].min",
        ),
        (
            json!({"kind": "worker_receipt", "profile": "successor", "proposals": "successor",
                "worker": "beta", "proposal_id": "prp_0123456789abcdef"}),
            "accept[1].proposal_sha256",
        ),
    ] {
        let r = fx.refuse(
            Some(a),
            "task_create",
            json!({"room": "build", "title": "t",
                "accept": [{"kind": "file_exists", "path": "a"}, check]}),
            "invalid_argument",
        );
        assert_eq!(r.detail["field"], field, "{r}");
    }
}

#[test]
fn malformed_checks_name_their_field_and_create_nothing() {
    let mut fx = Fx::new();
    let (a, _b, _g) = fx.team("coord");
    let mut tm = team();
    let cases = [
        (
            json!([{"kind": "file_exists", "path": "../escape"}]),
            "accept[0].path",
        ),
        (
            json!([{"kind": "file_exists", "path": "a", "mode": 1}]),
            "accept[0].mode",
        ),
        (
            json!([{"kind": "sha256", "path": "a", "expected": "nothex"}]),
            "accept[0].expected",
        ),
        (json!(["file_exists"]), "accept[0]"),
    ];
    for (accept, field) in cases {
        let args = json!({"room": "build", "title": "t", "accept": accept});
        let a2 = tm.a.clone();
        let r = tm
            .fx
            .refuse(Some(&a2), "task_create", args, "invalid_argument");
        assert_eq!(r.detail["field"], field);
    }
    // a coordination room has no project root to measure files in
    let r = fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "t", "accept": [{"kind": "file_exists", "path": "a"}]}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "accept[0]");
    // a sha256 reads an in-scope file when the task names file scopes
    let a2 = tm.a.clone();
    let r = tm.fx.refuse(
        Some(&a2),
        "task_create",
        json!({"room": "build", "title": "t", "scopes": ["file:src"],
            "accept": [{"kind": "sha256", "path": "docs/a.md", "expected": sha256_hex(b"")}]}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "accept[0].path");
    // the CLI's and MCP's bad JSON for the field itself
    let r = tm.fx.refuse(
        Some(&a2),
        "task_create",
        json!({"room": "build", "title": "t", "accept": "file_exists"}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "accept", "{}", r.message);
}

#[test]
fn task_acceptance_required_for_a_task_with_requirements_and_no_checks() {
    let mut tm = team();
    let t = tm.assigned(json!([]), json!(["the report covers every region"]));
    let d = tm.done_refused(&t, "task_acceptance_required");
    assert_eq!(d["requirements"][0], "the report covers every region");
}

#[test]
fn a_task_without_checks_closes_on_its_word_and_resolves_nothing() {
    let mut tm = team();
    let t = tm.assigned(json!([]), json!([]));
    assert_eq!(tm.open_obligations(), 1);
    let v = tm.done_ok(&t);
    let event = v["event"].as_str().unwrap().to_string();
    assert_eq!(
        tm.open_obligations(),
        1,
        "done proves nothing here, so the obligation stays open"
    );
    let log = tm
        .fx
        .ok(None, "room_log", json!({"room": "build", "limit": 1000}));
    let rec = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == event.as_str())
        .unwrap()
        .clone();
    assert_eq!(rec["event"]["detail"]["acceptance"], "none_declared");
    assert_eq!(rec["event"]["detail"]["obligations_resolved"], false);
}

#[test]
fn task_check_is_a_dry_run_and_task_show_carries_lineage_lease_and_results() {
    let mut tm = team();
    let Team { fx, a, .. } = &mut tm;
    let g = fx.enroll("gamma", "member");
    fx.ok(
        None,
        "room_members_add",
        json!({"room": "build", "agent": "gamma"}),
    );
    let parent = fx.ok(
        Some(a),
        "task_create",
        json!({"room": "build", "title": "parent", "to": "beta"}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let t = fx.ok(
        Some(a),
        "task_create",
        json!({"room": "build", "title": "child", "to": "beta", "parent": parent,
            "scopes": ["file:out"], "accept": [{"kind": "file_exists", "path": "out/x"}]}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = tm.b.clone();
    tm.fx.ok(Some(&b), "task_claim", json!({"task": t}));
    let lines = tm.fx.journal_lines();
    let ev = tm.fx.ok(Some(&b), "task_check", json!({"task": t}));
    assert_eq!(ev["acceptance_pass"], false);
    assert_eq!(ev["task"], t.as_str());
    tm.write("out/x", b"1");
    let owner_ev = tm.fx.ok(None, "owner_task_check", json!({"task": t}));
    assert_eq!(owner_ev["acceptance_pass"], true);
    assert_eq!(
        tm.fx.journal_lines(),
        lines,
        "a dry run writes no journal record"
    );
    assert_eq!(tm.fx.task_status(&t), "claimed");
    let shown = tm.fx.ok(Some(&b), "task_show", json!({"task": t}));
    assert_eq!(shown["task"]["acceptance"][0]["kind"], "file_exists");
    assert_eq!(shown["lineage"]["ancestors"][0]["id"], parent.as_str());
    assert_eq!(shown["lease"]["holder"], "beta");
    assert_eq!(shown["lease"]["scopes"][0], "file:out");
    assert_eq!(shown["last_acceptance"]["acceptance_pass"], true);
    assert!(shown["last_acceptance"]["at_ms"].is_u64());
    let p = tm.fx.ok(None, "owner_task_show", json!({"task": parent}));
    assert_eq!(p["lineage"]["children"][0]["id"], t.as_str());
    // neither its owner nor its recipient: refused, and nothing changes
    let r = tm
        .fx
        .refuse(Some(&g), "task_check", json!({"task": t}), "task_not_held");
    assert!(r.message.contains("gamma"));
}

/// A FIFO (or anything but a regular file) is not read: the check is unconfirmed at once
/// instead of holding the room while `open` waits for a writer.
#[test]
fn a_sha256_of_a_fifo_is_unconfirmed_not_a_hang() {
    let mut tm = team();
    let fifo = tm.dir.join("out.pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let t = tm.assigned(
        json!([{"kind": "sha256", "path": "out.pipe", "expected": sha256_hex(b"")}]),
        json!([]),
    );
    let d = tm.done_refused(&t, "task_acceptance_failed");
    let r = result(&d, 0);
    assert_eq!(r["detail"]["observation"], "unconfirmed", "{r}");
    assert_eq!(r["detail"]["error_kind"], "InvalidInput", "{r}");
}

/// A name that exists is not absent: a symlink whose target is missing fails `file_absent`
/// (and `file_exists`: there is no file), and one whose target would be outside the project
/// is unconfirmed.
#[test]
fn a_dangling_symlink_is_never_absent_and_one_leading_out_is_unconfirmed() {
    let mut tm = team();
    std::os::unix::fs::symlink("missing-target", tm.dir.join("dangling")).unwrap();
    std::os::unix::fs::symlink(tm.fx.root.join("nowhere/else"), tm.dir.join("dangling-out"))
        .unwrap();
    std::os::unix::fs::symlink("../../climbs/out", tm.dir.join("dangling-up")).unwrap();
    let t = tm.assigned(
        json!([
            {"kind": "file_absent", "path": "dangling"},
            {"kind": "file_exists", "path": "dangling"},
            {"kind": "file_absent", "path": "dangling-out"},
            {"kind": "file_absent", "path": "dangling-up"},
        ]),
        json!([]),
    );
    let d = tm.done_refused(&t, "task_acceptance_failed");
    for i in 0..2 {
        assert_eq!(result(&d, i)["pass"], false);
        assert_eq!(
            result(&d, i)["detail"]["observation"],
            "dangling_link",
            "{d}"
        );
    }
    for i in 2..4 {
        assert_eq!(result(&d, i)["pass"], false);
        assert_eq!(result(&d, i)["detail"]["observation"], "unconfirmed", "{d}");
        assert_eq!(result(&d, i)["detail"]["error_kind"], "OutsideTerritory");
    }
}

/// Scopes are leased as what they name in the project: a task on `srclink/a.rs` (srclink a
/// symlink to src) conflicts with a lease on `src/a.rs`, and a scope that resolves outside
/// the project is refused, writing nothing.
#[test]
fn scopes_see_through_symlinked_directories() {
    let mut tm = team();
    let g = tm.fx.enroll("gamma", "member");
    tm.fx.ok(
        None,
        "room_members_add",
        json!({"room": "build", "agent": "gamma"}),
    );
    std::fs::create_dir_all(tm.dir.join("src")).unwrap();
    std::fs::write(tm.dir.join("src/a.rs"), b"fn main() {}").unwrap();
    std::os::unix::fs::symlink("src", tm.dir.join("srclink")).unwrap();
    std::os::unix::fs::symlink(tm.fx.root.join("work"), tm.dir.join("outlink")).unwrap();
    let a = tm.a.clone();
    let b = tm.b.clone();
    let create = |fx: &mut Fx, to: &str, scope: &str| {
        fx.ok(
            Some(&a),
            "task_create",
            json!({"room": "build", "title": "edit a.rs", "to": to, "scopes": [scope]}),
        )
    };
    let first = create(&mut tm.fx, "beta", "file:src/a.rs");
    let second = create(&mut tm.fx, "gamma", "file:srclink/a.rs");
    assert_eq!(second["task"]["scopes"][0], "file:src/a.rs", "{second}");
    let (t1, t2) = (
        first["task"]["id"].as_str().unwrap().to_string(),
        second["task"]["id"].as_str().unwrap().to_string(),
    );
    tm.fx.ok(Some(&b), "task_claim", json!({"task": t1}));
    tm.fx
        .refuse_violation(&g, "task_claim", json!({"task": t2}), "build", "exclusive");
    let r = tm.fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "escape", "to": "beta", "scopes": ["file:outlink/x"]}),
        "invalid_argument",
    );
    assert!(r.message.contains("outside the project"), "{r}");
    assert_eq!(r.detail["field"], "scopes[0]", "{r}");
}

/// An evaluation's commands share the owner's time budget: each runs within what is left,
/// and those left when it is spent are unconfirmed, never run.
#[test]
fn an_evaluation_s_commands_share_one_time_budget() {
    let mut tm = team();
    tm.fx
        .write_config("[acceptance]\ncommands = [\"/bin/sleep\"]\nevaluation_ms_max = 1500\n");
    let sleep = json!({"kind": "command", "program": "/bin/sleep", "args": ["1"],
        "timeout_ms": 10000});
    let t = tm.assigned(json!([sleep, sleep, sleep]), json!([]));
    let d = tm.done_refused(&t, "task_acceptance_failed");
    assert_eq!(result(&d, 0)["pass"], true, "{d}");
    // the second had what was left (about half a second), not its own ten
    assert_eq!(result(&d, 1)["detail"]["timed_out"], true, "{d}");
    assert!(result(&d, 1)["detail"]["elapsed_ms"].as_u64().unwrap() < 5_000);
    let third = &result(&d, 2)["detail"];
    assert_eq!(third["observation"], "unconfirmed", "{d}");
    assert!(third["why"].as_str().unwrap().contains("evaluation_ms_max"));
    assert!(third.get("exit_code").is_none(), "it never ran: {third}");
}

/// One evaluation of a task at a time, and at most four in the daemon: another is refused
/// `acceptance_evaluation_busy`, writing nothing.
#[test]
fn evaluations_run_one_per_task_and_four_in_the_daemon() {
    let mut tm = team();
    tm.fx
        .write_config("[acceptance]\ncommands = [\"/bin/sleep\"]\n");
    let slow = json!([{"kind": "command", "program": "/bin/sleep", "args": ["4"],
        "timeout_ms": 10000}]);
    let tasks: Vec<String> = (0..5)
        .map(|_| tm.assigned(slow.clone(), json!([])))
        .collect();
    let socket = tm.fx.daemon.socket.clone();
    let b = tm.b.clone();
    let check = |task: String| {
        let (socket, b) = (socket.clone(), b.clone());
        std::thread::spawn(move || {
            let mut c = room_server::client::Client::connect(&socket).unwrap();
            c.call(&request(Some(&b), "task_check", json!({"task": task})))
                .unwrap()
        })
    };
    let running: Vec<_> = tasks[..4].iter().cloned().map(check).collect();
    // give the four time to enter their evaluations (each runs four seconds)
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    let lines = tm.fx.journal_lines();
    let same = tm
        .fx
        .call(Some(&b), "task_check", json!({"task": tasks[0]}));
    let r = expect_code(same, "acceptance_evaluation_busy", "the same task again");
    assert_eq!(r.detail["reason"], "task_evaluating", "{r}");
    let fifth = tm
        .fx
        .call(Some(&b), "task_check", json!({"task": tasks[4]}));
    let r = expect_code(fifth, "acceptance_evaluation_busy", "a fifth evaluation");
    assert_eq!(r.detail["reason"], "daemon_busy", "{r}");
    assert_eq!(
        tm.fx.journal_lines(),
        lines,
        "a refused evaluation writes nothing"
    );
    for h in running {
        assert!(h.join().unwrap().ok);
    }
    // once they end, the fifth runs
    tm.fx.ok(Some(&b), "task_check", json!({"task": tasks[4]}));
}
