//! Governing sources through a real daemon: the owner gives a project a source, a governed task
//! cannot close until its closer has read every part whole (same agent and conversation, since
//! its claim, at the parts' current digests: `complete_text_v1`), and a source that changes
//! under its worker moves the task's authority. Every refusal changes nothing.

mod common;
use common::*;
use serde_json::{Value, json};
use std::path::PathBuf;

const SPEC: &str = "# Spec\nThe renewal must keep the customer's price — €42 — until 2027.\n";
const ANNEX: &str = "Annex: every region is listed. 😀\n";

struct Gov {
    fx: Fx,
    a: String,
    b: String,
    gm: String,
    dir: PathBuf,
    pid: String,
}

fn governed_project() -> Gov {
    let mut fx = Fx::new();
    let a = fx.enroll("alpha", "coordinator");
    let b = fx.enroll("beta", "member");
    let gm = fx.enroll("gamma", "member");
    let (dir, pid) = fx.open_project("p1");
    std::fs::write(dir.join("spec.md"), SPEC).unwrap();
    std::fs::create_dir_all(dir.join("annex")).unwrap();
    std::fs::write(dir.join("annex/a.md"), ANNEX).unwrap();
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta", "gamma"]}),
    );
    Gov {
        fx,
        a,
        b,
        gm,
        dir,
        pid,
    }
}

impl Gov {
    fn set_source(&mut self) -> Value {
        let pid = self.pid.clone();
        self.fx.ok(
            None,
            "project_source",
            json!({"project": pid, "parts": ["spec.md", "annex/a.md"]}),
        )
    }

    /// alpha creates a governed task for beta (with a check on out.txt), sends it, and beta
    /// claims it and catches up.
    fn governed_task(&mut self) -> String {
        let Gov { fx, a, b, .. } = self;
        let t = fx.ok(
            Some(a),
            "task_create",
            json!({"room": "build", "title": "renewal", "to": "beta", "governed": true,
                "accept": [{"kind": "file_exists", "path": "out.txt"}]}),
        )["task"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        fx.tasks.push(t.clone());
        fx.sync_all(a, "build");
        fx.ok(
            Some(a),
            "send",
            json!({"room": "build", "to": ["beta"], "text": "renew", "task": t}),
        );
        fx.ok(Some(b), "task_claim", json!({"task": t}));
        fx.sync_all(b, "build");
        t
    }

    /// Read part `part` whole as `token` in `conversation`, `step` bytes at a time.
    fn read_whole(
        &mut self,
        token: &str,
        conversation: Option<&str>,
        t: &str,
        part: usize,
        step: u64,
    ) -> String {
        let mut text = String::new();
        let mut offset = 0u64;
        loop {
            let mut req = request(
                Some(token),
                "source_read",
                json!({"task": t, "part": part, "offset": offset, "length": step}),
            );
            req.conversation = conversation.map(String::from);
            let r = self.fx.send(&req);
            assert!(r.ok, "{:?}", r.refusal);
            let v = r.result.unwrap();
            text.push_str(v["text"].as_str().unwrap());
            match v["next_offset"].as_u64() {
                Some(n) => offset = n,
                None => return text,
            }
        }
    }

    fn done(&mut self, t: &str) -> Result<Value, room_core::Refusal> {
        let b = self.b.clone();
        self.fx.sync_all(&b, "build");
        let before = self.fx.journal_lines();
        let r = self
            .fx
            .call(Some(&b), "done", json!({"room": "build", "task": t}));
        if r.ok {
            return Ok(r.result.unwrap());
        }
        assert_eq!(before, self.fx.journal_lines(), "a refused done wrote");
        Err(r.refusal.unwrap())
    }
}

#[test]
fn a_governed_task_closes_only_after_its_closer_read_every_part_whole() {
    let mut g = governed_project();
    let set = g.set_source();
    assert_eq!(set["parts"][0]["bytes"], SPEC.len());
    assert_eq!(set["policy"], "complete_text_v1");
    let t = g.governed_task();
    std::fs::write(g.dir.join("out.txt"), "done").unwrap();
    let r = g.done(&t).unwrap_err();
    assert_eq!(r.code.as_str(), "source_coverage_incomplete");
    assert_eq!(r.detail["missing"].as_array().unwrap().len(), 2);
    assert_eq!(r.detail["missing"][0]["missing"], json!([[0, SPEC.len()]]));
    // beta reads the spec in small chunks (multi-byte characters straddle chunk ends)
    let b = g.b.clone();
    assert_eq!(g.read_whole(&b, None, &t, 0, 7), SPEC);
    let r = g.done(&t).unwrap_err();
    assert_eq!(r.code.as_str(), "source_coverage_incomplete");
    assert_eq!(r.detail["missing"].as_array().unwrap().len(), 1);
    assert_eq!(r.detail["missing"][0]["path"], "annex/a.md");
    // someone else's reading, or beta's in another conversation, proves nothing for beta here
    let gamma = g.gm.clone();
    g.read_whole(&gamma, None, &t, 1, 16 * 1024);
    g.read_whole(&b, Some("another-session"), &t, 1, 16 * 1024);
    assert_eq!(
        g.done(&t).unwrap_err().code.as_str(),
        "source_coverage_incomplete"
    );
    assert_eq!(g.read_whole(&b, None, &t, 1, 5), ANNEX);
    let v = g.done(&t).unwrap();
    assert_eq!(g.fx.task_status(&t), "done");
    let log =
        g.fx.ok(None, "room_log", json!({"room": "build", "limit": 1000}));
    let rec = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == v["event"])
        .unwrap()
        .clone();
    assert_eq!(rec["event"]["detail"]["source_coverage"]["covered"], true);
}

#[test]
fn a_source_that_changes_under_its_worker_must_be_read_again() {
    let mut g = governed_project();
    g.set_source();
    let t = g.governed_task();
    std::fs::write(g.dir.join("out.txt"), "done").unwrap();
    let b = g.b.clone();
    g.read_whole(&b, None, &t, 0, 1024);
    g.read_whole(&b, None, &t, 1, 1024);
    std::fs::write(
        g.dir.join("spec.md"),
        format!("{SPEC}Amended: also in euros.\n"),
    )
    .unwrap();
    let r = g.done(&t).unwrap_err();
    assert_eq!(r.code.as_str(), "task_authority_changed");
    assert_eq!(r.detail["changed"], json!(["source"]));
    g.fx.ok(Some(&b), "task_claim", json!({"task": t}));
    let r = g.done(&t).unwrap_err();
    assert_eq!(r.code.as_str(), "source_coverage_incomplete");
    assert_eq!(
        r.detail["missing"].as_array().unwrap().len(),
        2,
        "read again, since the new claim"
    );
    g.read_whole(&b, None, &t, 0, 1024);
    g.read_whole(&b, None, &t, 1, 1024);
    g.done(&t).unwrap();
}

#[test]
fn governed_tasks_need_a_source_and_checks() {
    let mut g = governed_project();
    let a = g.a.clone();
    g.fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "t", "governed": true}),
        "invalid_argument",
    );
    g.fx.ok(
        None,
        "room_create",
        json!({"name": "chat", "members": ["alpha"]}),
    );
    g.fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "chat", "title": "t", "governed": true}),
        "invalid_argument",
    );
    g.set_source();
    let t = g.fx.ok(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "t", "to": "beta", "governed": true}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    // a subtask keeps its parent's source
    let child = g.fx.ok(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "c", "parent": t}),
    );
    assert_eq!(child["task"]["governed"], true);
    let b = g.b.clone();
    g.fx.ok(Some(&b), "task_claim", json!({"task": t}));
    g.read_whole(&b, None, &t, 0, 1024);
    g.read_whole(&b, None, &t, 1, 1024);
    let r = g.done(&t).unwrap_err();
    assert_eq!(r.code.as_str(), "task_acceptance_required");
}

#[test]
fn project_source_refusals_change_nothing() {
    let mut g = governed_project();
    let pid = g.pid.clone();
    std::fs::write(g.dir.join("latin1.txt"), b"caf\xe9").unwrap();
    std::os::unix::fs::symlink("/etc/hostname", g.dir.join("out-link")).unwrap();
    let too_many: Vec<String> = (0..17).map(|i| format!("p{i}.md")).collect();
    for (parts, code) in [
        (json!(["../outside.md"]), "invalid_argument"),
        (json!(["/etc/passwd"]), "invalid_argument"),
        (json!(["spec.md", "spec.md"]), "invalid_argument"),
        (json!(too_many), "invalid_argument"),
        (json!(["missing.md"]), "source_part_unreadable"),
        (json!(["latin1.txt"]), "source_part_unreadable"),
        (json!(["out-link"]), "source_part_unreadable"),
        (json!(["annex"]), "source_part_unreadable"),
    ] {
        g.fx.refuse(
            None,
            "project_source",
            json!({"project": pid, "parts": parts}),
            code,
        );
    }
    g.fx.refuse(
        None,
        "project_source",
        json!({"project": "prj_00000000deadbeef", "parts": ["spec.md"]}),
        "not_found",
    );
}

#[test]
fn source_read_refusals_change_nothing() {
    let mut g = governed_project();
    g.set_source();
    let t = g.governed_task();
    let (a, b) = (g.a.clone(), g.b.clone());
    let plain = g.fx.task(&a, "build", Some("beta"));
    for (args, code) in [
        (json!({"task": plain}), "invalid_argument"),
        (json!({"task": t, "part": 2}), "invalid_argument"),
        (json!({"task": t, "offset": 100_000}), "invalid_argument"),
        (json!({"task": t, "length": 0}), "invalid_argument"),
        (json!({"task": t, "length": 16_385}), "invalid_argument"),
        (json!({"task": UNKNOWN_TASK}), "task_not_found"),
        (json!({"task": t, "part": -1}), "invalid_argument"),
    ] {
        g.fx.refuse(Some(&b), "source_read", args, code);
    }
    std::fs::remove_file(g.dir.join("annex/a.md")).unwrap();
    g.fx.refuse(
        Some(&b),
        "source_read",
        json!({"task": t, "part": 1}),
        "source_part_unreadable",
    );
}

/// The permit sealed for `source_event`, as the owner lists it after a revalidation pass.
fn permit_after_check(fx: &mut Fx, source_event: &str) -> Value {
    fx.ok(None, "wakes_check", json!({}));
    let all = fx.ok(None, "wakes_list", json!({}));
    all["wakes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["source_event"] == source_event)
        .unwrap_or_else(|| panic!("no permit for {source_event}: {all}"))
        .clone()
}

/// The newest send's event in `room` (what its permit is keyed by).
fn last_send(fx: &mut Fx, room: &str) -> String {
    let log = fx.ok(None, "room_log", json!({"room": room, "limit": 1000}));
    log["events"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| e["event"]["verb"] == "send")
        .and_then(|e| e["id"].as_str())
        .unwrap_or_else(|| panic!("no send in {log}"))
        .to_string()
}

/// Dispatch's third centre pins a governed task's source: a permit sealed for it stays queued
/// while the source stands, and is dead-lettered `wake_task_authority_changed` once the source
/// its claim pinned changed, or once the project has no source at all.
#[test]
fn a_wake_for_a_governed_task_is_refused_once_its_source_moved() {
    let mut g = governed_project();
    g.set_source();
    g.governed_task();
    let ev = last_send(&mut g.fx, "build");
    let p = permit_after_check(&mut g.fx, &ev);
    assert_eq!(p["state"], "queued", "{p}");
    std::fs::write(g.dir.join("spec.md"), format!("{SPEC}amended\n")).unwrap();
    let p = permit_after_check(&mut g.fx, &ev);
    assert_eq!(p["state"], "dead", "{p}");
    assert_eq!(
        p["dead_letter"]["code"], "wake_task_authority_changed",
        "{p}"
    );
    let why = p["dead_letter"]["reason"].to_string() + &p["dead_letter"].to_string();
    assert!(
        why.contains("governing source changed since its claim"),
        "{p}"
    );
    // a second governed task, its permit sealed, then the owner clears the source
    let t2 = g.governed_task();
    let ev2 = last_send(&mut g.fx, "build");
    assert_eq!(permit_after_check(&mut g.fx, &ev2)["state"], "queued");
    let pid = g.pid.clone();
    g.fx.ok(None, "project_source", json!({"project": pid, "parts": []}));
    let p = permit_after_check(&mut g.fx, &ev2);
    assert_eq!(
        p["dead_letter"]["code"], "wake_task_authority_changed",
        "{p}"
    );
    assert!(
        p["dead_letter"]
            .to_string()
            .contains("governing source is gone"),
        "{p}"
    );
    let _ = t2;
}
