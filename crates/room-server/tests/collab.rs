//! A collaboration's owner operations through the daemon: the approval queue bound to the
//! digest of what it shows (`approval_stale`), decided once, each refusal changing nothing;
//! rejection ends the run; cancellation revokes the collaboration's identities; agents have
//! no standing here.

mod common;
use common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const PACK: &str = r#"name = "one"

[[phases]]
name = "spec"
kind = "agent"
role = "reasoning"
writes = ["spec"]
prompt = "p.md"
approve = true
"#;

fn start(fx: &mut Fx) -> String {
    let v = fx.ok(
        None,
        "collab_start",
        json!({"goal": "add a flag", "pack": PACK, "prompts": {"p.md": "write the spec"},
            "roles": ["reasoning=script:read"]}),
    );
    v["collab"].as_str().unwrap().to_string()
}

#[track_caller]
fn until(fx: &mut Fx, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let s = fx.ok(None, "collab_status", json!({"id": id}));
        if pred(&s) {
            return s;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never: {s:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pending(s: &Value) -> Option<Value> {
    s["approvals"]
        .as_array()?
        .iter()
        .find(|a| a["state"] == "pending")
        .cloned()
}

#[test]
fn a_decision_binds_the_digest_shown_and_is_made_once() {
    let mut fx = Fx::new();
    let id = start(&mut fx);
    let s = until(&mut fx, &id, |s| pending(s).is_some());
    let ask = pending(&s).unwrap();
    let (approval, digest) = (
        ask["approval"].as_str().unwrap().to_string(),
        ask["digest"].as_str().unwrap().to_string(),
    );
    // the digest is of exactly what is shown
    let shown = room_core::canonical_bytes(&ask["input"]);
    assert_eq!(digest, room_core::sha256_hex(&shown));
    let decide = |verdict: &str, digest: &str| json!({"approval": approval, "digest": digest, "verdict": verdict});
    for (args, code) in [
        (decide("approve", &"0".repeat(64)), "approval_stale"),
        (
            json!({"approval": "apr_00000000deadbeef", "digest": digest, "verdict": "approve"}),
            "not_found",
        ),
        (decide("maybe", &digest), "invalid_argument"),
        (decide("revise", &digest), "invalid_argument"),
        (
            json!({"approval": approval, "digest": digest, "verdict": "approve", "prompt": "x"}),
            "invalid_argument",
        ),
    ] {
        fx.refuse(None, "collab_decide", args, code);
        let now = fx.ok(None, "collab_status", json!({"id": id}));
        assert_eq!(
            now["approvals"], s["approvals"],
            "a refused decision decides nothing"
        );
        assert_eq!(now["runs"], s["runs"]);
    }
    // an agent has no standing here, whatever it holds
    let orch = fx.enroll("outsider", "operator");
    fx.refuse(
        Some(&orch),
        "collab_decide",
        decide("approve", &digest),
        "owner_required",
    );
    // with an agent's credential, collab_status is an orchestrator's tool: one that does not
    // steer this collaboration is refused it
    fx.refuse(
        Some(&orch),
        "collab_status",
        json!({"id": id}),
        "tier_insufficient",
    );
    // rejected: the run ends; decided once
    let r = fx.ok(None, "collab_decide", decide("reject", &digest));
    assert_eq!(r["state"], "rejected");
    let s = until(&mut fx, &id, |s| s["runs"][0]["state"] == "rejected");
    fx.refuse(
        None,
        "collab_decide",
        decide("approve", &digest),
        "approval_stale",
    );
    assert_eq!(
        fx.ok(None, "collab_status", json!({"id": id}))["runs"],
        s["runs"]
    );
    // the person asks for another take: the phase runs again, into a new request
    fx.refuse(
        None,
        "collab_rerun",
        json!({"id": id, "phase": "nope"}),
        "invalid_argument",
    );
    let r = fx.ok(None, "collab_rerun", json!({"id": id, "phase": "spec"}));
    assert_eq!(
        (r["run"].as_u64(), r["state"].as_str()),
        (Some(2), Some("rerun"))
    );
    let s = until(&mut fx, &id, |s| pending(s).is_some());
    let again = pending(&s).unwrap();
    assert_ne!(again["approval"], approval, "{s:#}");
    assert_eq!(again["run"], 3);
    // not while it waits
    let r = fx.refuse(
        None,
        "collab_rerun",
        json!({"id": id, "phase": "spec"}),
        "task_state_invalid",
    );
    assert_eq!(r.detail["state"], "approval", "{r}");
}

#[test]
fn a_cancel_ends_the_collaboration_and_revokes_its_identities() {
    let mut fx = Fx::new();
    let id = start(&mut fx);
    until(&mut fx, &id, |s| pending(s).is_some());
    // a node the owner adds inside the tree, and its revocation, are journaled there too
    fx.ok(
        None,
        "agent_delegate",
        json!({"name": "helper", "parent": format!("{id}-reasoning"),
            "scopes": ["artifact:read:spec"]}),
    );
    fx.ok(None, "agent_revoke", json!({"name": "helper"}));
    // a node outside any collaboration's tree has no room: nothing is journaled here
    fx.ok(
        None,
        "agent_delegate",
        json!({"name": "outsider", "scopes": ["session:read"]}),
    );
    let v = fx.ok(None, "collab_cancel", json!({"id": id}));
    assert_eq!(v["state"], "cancelled");
    let revoked: Vec<String> = serde_json::from_value(v["revoked"].clone()).unwrap();
    assert!(revoked.contains(&format!("{id}-orch")), "{v}");
    assert!(revoked.contains(&format!("{id}-reasoning")), "{v}");
    let s = fx.ok(None, "collab_status", json!({"id": id}));
    assert_eq!(s["state"], "cancelled");
    // the tree's changes are journaled in its room, in order: each identity minted under its
    // parent with its scopes, the owner's helper minted and revoked, then the revocation
    // with the whole subtree
    let log = fx.ok(None, "room_log", json!({"room": id, "limit": 1000}));
    let tree: Vec<&Value> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "identity")
        .map(|e| &e["event"])
        .collect();
    assert_eq!(tree.len(), 5, "{log}");
    assert_eq!(
        (
            tree[0]["action"].clone(),
            tree[0]["principal"].clone(),
            tree[0]["parent"].clone()
        ),
        (json!("minted"), json!(format!("{id}-orch")), Value::Null)
    );
    assert_eq!(
        tree[0]["scopes"],
        json!(["session:dispatch", "session:read"])
    );
    assert_eq!(tree[1]["principal"], format!("{id}-reasoning"));
    assert_eq!(tree[1]["parent"], format!("{id}-orch"));
    assert!(
        tree[1]["scopes"]
            .as_array()
            .unwrap()
            .contains(&json!("artifact:write:spec")),
        "{}",
        tree[1]
    );
    assert_eq!(
        (&tree[2]["action"], &tree[2]["actor"], &tree[2]["principal"]),
        (&json!("minted"), &json!("owner"), &json!("helper"))
    );
    assert_eq!(tree[2]["parent"], format!("{id}-reasoning"));
    assert_eq!(tree[2]["scopes"], json!(["artifact:read:spec"]));
    assert_eq!(
        (
            &tree[3]["action"],
            &tree[3]["principal"],
            &tree[3]["subtree"]
        ),
        (&json!("revoked"), &json!("helper"), &json!(["helper"]))
    );
    assert_eq!(tree[4]["action"], "revoked");
    let mut subtree: Vec<String> = serde_json::from_value(tree[4]["subtree"].clone()).unwrap();
    subtree.sort();
    assert_eq!(subtree, [format!("{id}-orch"), format!("{id}-reasoning")]);
    fx.refuse(None, "collab_cancel", json!({"id": id}), "invalid_argument");
    fx.refuse(
        None,
        "collab_rerun",
        json!({"id": id, "phase": "spec"}),
        "invalid_argument",
    );
    fx.refuse(
        None,
        "collab_status",
        json!({"id": "c00000000"}),
        "not_found",
    );
    let listed = fx.ok(None, "collab_list", json!({}));
    assert_eq!(listed["collabs"][0]["state"], "cancelled");
}

#[test]
fn a_start_refuses_what_it_cannot_run_and_writes_nothing() {
    let mut fx = Fx::new();
    let before = fx.snapshot();
    for (args, code, field) in [
        (json!({"goal": " "}), "invalid_argument", "goal"),
        (
            json!({"goal": "g", "pack": PACK, "prompts": {}, "roles": ["reasoning=script:read"]}),
            "pack_invalid",
            "phases[0].prompt",
        ),
        (
            json!({"goal": "g", "pack": PACK, "prompts": {"p.md": "x"}, "roles": ["reasoning"]}),
            "invalid_argument",
            "roles",
        ),
        (
            json!({"goal": "g", "pack": PACK, "prompts": {"p.md": "x"}, "roles": []}),
            "profile_invalid",
            "adapter",
        ),
        (
            json!({"goal": "g", "pack": "name = \"x\"", "prompts": {}, "roles": []}),
            "pack_invalid",
            "phases",
        ),
        (
            json!({"goal": "g", "pack": PACK, "prompts": {"p.md": "x"},
                "roles": ["reasoning=script:read"], "extra": 1}),
            "invalid_argument",
            "args",
        ),
    ] {
        let r = fx.refuse(None, "collab_start", args.clone(), code);
        if field != "args" {
            assert_eq!(r.detail["field"], field, "{args}: {r}");
        }
    }
    assert_eq!(fx.snapshot(), before);
    assert_eq!(fx.ok(None, "collab_list", json!({}))["collabs"], json!([]));
}

/// The test model server (tests/workers/openai_server.py) in `collab` mode, ended with the test.
struct ApiServer {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ApiServer {
    fn start(fx: &Fx) -> ApiServer {
        ApiServer::start_mode(fx, "collab")
    }

    fn start_mode(fx: &Fx, mode: &str) -> ApiServer {
        use std::io::BufRead;
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/openai_server.py");
        let log = fx.root.join("openai-collab.jsonl");
        let mut child = std::process::Command::new("/usr/bin/python3")
            .arg(script)
            .arg(mode)
            .arg(&log)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        ApiServer {
            port: line.trim().parse().expect("the server prints its port"),
            child,
            log,
        }
    }

    fn requests(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .count()
    }
}

/// A role on an OpenAI-compatible backend (the owner's `[backends.openai]`) writes its phase's
/// artifact through the blackboard's tools, listed to it by its scopes; the collaboration's
/// cost equals the model server's usage records token for token, priced by `[prices]`.
#[test]
fn an_api_role_writes_its_artifact_and_its_usage_is_the_cost() {
    let mut fx = Fx::new();
    let server = ApiServer::start(&fx);
    fx.write_config(&format!(
        "[backends.openai]\nbase_url = \"http://127.0.0.1:{}/v1\"\ntimeout_ms = 20000\n\n[prices.\"test-model\"]\nusd_per_million_input_tokens = 3.0\nusd_per_million_output_tokens = 15.0\n",
        server.port
    ));
    let pack = PACK.replace("approve = true", "approve = false");
    let v = fx.ok(
        None,
        "collab_start",
        json!({"goal": "add a flag", "pack": pack, "prompts": {"p.md": "write the spec"},
            "roles": ["reasoning=openai:test-model"]}),
    );
    let id = v["collab"].as_str().unwrap().to_string();
    let s = until(&mut fx, &id, |s| s["state"] != "running");
    assert_eq!(s["state"], "done", "{s:#}");
    let spec = fx.ok(None, "collab_artifact", json!({"room": id, "kind": "spec"}));
    assert_eq!(spec["producer"], format!("{id}-reasoning"));
    assert_eq!(spec["content"]["goal"], "g");
    // every completion reported 100 tokens in and 7 out
    let calls = server.requests() as u64;
    assert!(calls >= 6, "the role's whole flow ran: {calls} completions");
    let cost = &s["cost"];
    assert_eq!(cost["tokens_in"], 100 * calls, "{cost:#}");
    assert_eq!(cost["tokens_out"], 7 * calls);
    assert_eq!(cost["launches_without_usage"], 0);
    let usd = (100.0 * calls as f64 * 3.0 + 7.0 * calls as f64 * 15.0) / 1e6;
    assert!(
        (cost["usd"].as_f64().unwrap() - usd).abs() < 1e-12,
        "{cost:#}"
    );
    assert_eq!(cost["by_agent_and_model"][0]["model"], "test-model");
}

#[test]
fn an_api_role_without_a_backend_endpoint_is_refused_at_start() {
    let mut fx = Fx::new();
    let before = fx.snapshot();
    let r = fx.refuse(
        None,
        "collab_start",
        json!({"goal": "g", "pack": PACK, "prompts": {"p.md": "x"},
            "roles": ["reasoning=openai:test-model"]}),
        "profile_invalid",
    );
    assert_eq!(r.detail["role"], "reasoning", "{r}");
    assert!(
        r.hint
            .as_deref()
            .unwrap_or("")
            .contains("[backends.openai]"),
        "{r}"
    );
    assert_eq!(fx.snapshot(), before);
}

/// In a collaboration, each reviewer writes findings under its own key only: one writing
/// another seat's key is refused (`artifact_write_denied`, naming the key) and nothing is
/// written; its own key is taken, addressed to the orchestrator alone.
#[test]
fn a_reviewer_writes_only_its_own_findings_key() {
    let mut fx = Fx::new();
    let pack = r#"name = "panel"

[[phases]]
name = "review"
kind = "panel"
role = "review"
reviewers = 2
writes = ["findings"]
prompt = "p.md"
approve = true
"#;
    let v = fx.ok(
        None,
        "collab_start",
        json!({"goal": "review", "pack": pack, "prompts": {"p.md": "review it"},
            "roles": ["review=script:read", "review=script:exit"]}),
    );
    let id = v["collab"].as_str().unwrap().to_string();
    let token = fx.ok(
        None,
        "agent_rotate",
        json!({"name": format!("{id}-review")}),
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    fx.sync_all(&token, &id);
    let put = |key: &str| {
        json!({"room": id, "kind": "findings", "key": key, "expected_version": 0,
            "content": {"blocking": [], "non_blocking": [], "suggestions": []}})
    };
    let before = fx.snapshot();
    let r = fx.refuse(
        Some(&token),
        "artifact_put",
        put("review-2"),
        "artifact_write_denied",
    );
    assert_eq!(
        (r.detail["key"].as_str(), r.detail["own"].as_str()),
        (Some("review-2"), Some("review")),
        "{r}"
    );
    assert_eq!(fx.snapshot(), before);
    fx.ok(Some(&token), "artifact_put", put("review"));
    let index = fx.ok(None, "collab_artifacts", json!({"room": id}));
    assert_eq!(
        index["artifacts"][0]["audience"],
        json!([format!("{id}-orch"), format!("{id}-review")]),
        "{index}"
    );
}

/// `collab_ask`'s refusals through the daemon, each leaving the journal, the tasks, the wakes
/// and the approval queue as they were: an agent of the room that is no role of the
/// collaboration, an empty question, a room that is no collaboration; a role's question waits
/// in the queue as `ask@ROLE`.
#[test]
fn a_question_is_asked_only_by_a_role_and_refused_otherwise() {
    let mut fx = Fx::new();
    let id = start(&mut fx);
    let role = fx.ok(
        None,
        "agent_rotate",
        json!({"name": format!("{id}-reasoning")}),
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    let outsider = fx.enroll("outsider", "member");
    fx.ok(
        None,
        "room_members_add",
        json!({"room": id, "agent": "outsider"}),
    );
    let queue = |fx: &mut Fx| fx.ok(None, "collab_status", json!({"id": id}))["approvals"].clone();
    let before = (fx.snapshot(), queue(&mut fx));
    let ask = |q: &str| json!({"room": id, "question": q});
    fx.refuse(
        Some(&outsider),
        "collab_ask",
        ask("may I?"),
        "tier_insufficient",
    );
    let r = fx.refuse(Some(&role), "collab_ask", ask("  "), "invalid_argument");
    assert_eq!(r.detail["field"], "question", "{r}");
    fx.ok(
        None,
        "room_create",
        json!({"name": "plain", "members": ["outsider"]}),
    );
    let snap = (fx.snapshot(), queue(&mut fx));
    fx.refuse(
        Some(&outsider),
        "collab_ask",
        json!({"room": "plain", "question": "q"}),
        "not_found",
    );
    assert_eq!((fx.snapshot(), queue(&mut fx)), snap);
    assert_eq!(before.1, queue(&mut fx));
    let v = fx.ok(Some(&role), "collab_ask", ask("which flag name?"));
    assert_eq!(v["phase"], "ask@reasoning", "{v}");
    let asked = fx.ok(None, "collab_status", json!({"id": id}));
    let a = asked["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["phase"] == "ask@reasoning")
        .unwrap()
        .clone();
    assert_eq!(a["input"]["question"], "which flag name?");
    assert_eq!(a["state"], "pending");
}

const STEERED: &str = r#"name = "steered"

[orchestrator]
prompt = "o.md"

[[phases]]
name = "spec"
kind = "agent"
role = "reasoning"
writes = ["spec"]
prompt = "p.md"
approve = false

[[phases]]
name = "research"
kind = "agent"
role = "search"
reads = ["spec"]
writes = ["research"]
prompt = "p.md"
approve = false
"#;

/// Until two snapshots a moment apart agree (the orchestrator's first wake told and
/// answered): what a refusal is then checked against.
fn settled(fx: &mut Fx, id: &str) {
    until(fx, id, |s| {
        s["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["phase"] == "tell@orchestrator" && r["state"] == "told")
    });
    let start = Instant::now();
    let mut last = fx.snapshot();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = fx.snapshot();
        if now == last {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never settled");
        last = now;
    }
}

/// An agent orchestrator (its role bound) steers with the collaboration tools, authorized by
/// its scopes in the engine: each refusal (a role child without `session:read` or
/// `session:dispatch`, a phase not ready, a phase or purpose the pack lacks, a close with
/// phases open, an unknown collaboration) changes nothing; the scheduler itself dispatches
/// nothing; a dispatch by purpose tag starts the one ready phase it selects.
#[test]
fn an_agent_orchestrator_steers_with_its_tools_and_each_refusal_changes_nothing() {
    let mut fx = Fx::new();
    let v = fx.ok(
        None,
        "collab_start",
        json!({"goal": "add a flag", "pack": STEERED,
            "prompts": {"p.md": "do it", "o.md": "you orchestrate"},
            "roles": ["orchestrator=script:read,reply:noted", "reasoning=script:read",
                "search=script:read"]}),
    );
    let id = v["collab"].as_str().unwrap().to_string();
    assert_eq!(v["agents"]["orchestrator"], format!("{id}-orchestrator"));
    settled(&mut fx, &id);
    let s = fx.ok(None, "collab_status", json!({"id": id}));
    assert_eq!(
        s["orchestrated_by"]["agent"],
        format!("{id}-orchestrator"),
        "{s:#}"
    );
    // the scheduler told the orchestrator; it dispatched nothing itself
    assert_eq!(phase_state(&s, "spec"), "waiting", "{s:#}");
    let token = |fx: &mut Fx, who: &str| {
        fx.ok(None, "agent_rotate", json!({"name": format!("{id}-{who}")}))["token"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let orch = token(&mut fx, "orchestrator");
    let child = token(&mut fx, "reasoning");
    let mine = fx.ok(Some(&orch), "collab_status", json!({"id": id}));
    assert_eq!(mine["ready"], json!(["spec"]), "{mine:#}");
    assert_eq!(mine["all_done"], false);
    let r = fx.refuse(
        Some(&child),
        "collab_dispatch",
        json!({"id": id, "phase": "spec"}),
        "tier_insufficient",
    );
    assert_eq!(r.detail["needed"], "session:dispatch", "{r}");
    let r = fx.refuse(
        Some(&child),
        "collab_status",
        json!({"id": id}),
        "tier_insufficient",
    );
    assert_eq!(r.detail["needed"], "session:read", "{r}");
    let r = fx.refuse(
        Some(&orch),
        "collab_dispatch",
        json!({"id": id, "phase": "research"}),
        "phase_not_ready",
    );
    assert_eq!(r.detail["ready"], json!(["spec"]), "{r}");
    for (args, field) in [
        (json!({"id": id, "phase": "deploy"}), "phase"),
        (json!({"id": id, "purpose": "juggle"}), "purpose"),
        (json!({"id": id}), "phase"),
    ] {
        let r = fx.refuse(Some(&orch), "collab_dispatch", args, "invalid_argument");
        assert_eq!(r.detail["field"], field, "{r}");
    }
    let r = fx.refuse(
        Some(&orch),
        "collab_close",
        json!({"id": id}),
        "collab_phases_open",
    );
    assert_eq!(r.detail["open"].as_array().unwrap().len(), 2, "{r}");
    fx.refuse(
        Some(&orch),
        "collab_request_approval",
        json!({"id": "col_nope", "phase": "spec"}),
        "not_found",
    );
    // a purpose tag selects the role serving it, and so its one ready phase
    let d = fx.ok(
        Some(&orch),
        "collab_dispatch",
        json!({"id": id, "purpose": "implement"}),
    );
    assert_eq!(
        (d["phase"].as_str(), d["run"].as_u64()),
        (Some("spec"), Some(1)),
        "{d}"
    );
    let s = fx.ok(None, "collab_status", json!({"id": id}));
    assert!(s["phases"][0]["task"].is_string(), "{s:#}");
    // what is ready moved on: spec runs, nothing else is ready
    let mine = fx.ok(Some(&orch), "collab_status", json!({"id": id}));
    assert_eq!(mine["ready"], json!([]), "{mine:#}");
}

#[test]
fn a_bound_orchestrator_without_its_prompt_file_is_refused_at_start() {
    let mut fx = Fx::new();
    let before = fx.snapshot();
    let r = fx.refuse(
        None,
        "collab_start",
        json!({"goal": "g", "pack": PACK.replace("approve = true", ""), "prompts": {"p.md": "x"},
            "roles": ["orchestrator=script:read", "reasoning=script:read"]}),
        "pack_invalid",
    );
    assert_eq!(r.detail["field"], "orchestrator.prompt", "{r}");
    assert_eq!(fx.snapshot(), before);
}

fn phase_state<'a>(s: &'a Value, name: &str) -> &'a str {
    s["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == name)
        .and_then(|p| p["state"].as_str())
        .unwrap_or("")
}

fn start_api_steered(fx: &mut Fx, server: &ApiServer) -> String {
    fx.write_config(&format!(
        "[backends.openai]\nbase_url = \"http://127.0.0.1:{}/v1\"\ntimeout_ms = 20000\n",
        server.port
    ));
    let v = fx.ok(
        None,
        "collab_start",
        json!({"goal": "add a flag", "pack": STEERED,
            "prompts": {"p.md": "do it", "o.md": "You orchestrate."},
            "roles": ["orchestrator=openai:test-model", "reasoning=openai:test-model",
                "search=openai:test-model"]}),
    );
    v["collab"].as_str().unwrap().to_string()
}

/// The orchestrator and the roles on an OpenAI-compatible backend (the suite's local model
/// server, its tool calls scripted): woken when something is new, the orchestrator model
/// reads the collaboration's status and dispatches what is ready through its tools, then
/// closes it; what it said matches what it did (no flag), and its usage is in the cost.
#[test]
fn an_api_orchestrator_dispatches_through_its_tools_to_the_end() {
    let mut fx = Fx::new();
    let server = ApiServer::start_mode(&fx, "steer");
    let id = start_api_steered(&mut fx, &server);
    let s = until(&mut fx, &id, |s| s["state"] != "running");
    assert_eq!(s["state"], "done", "{s:#}");
    assert_eq!(s["flags"], json!([]), "{s:#}");
    assert_eq!(phase_state(&s, "research"), "done");
    let orch = format!("{id}-orchestrator");
    let used = s["cost"]["by_agent_and_model"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["agent"] == orch.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("the orchestrator's usage is in the cost: {s:#}"));
    assert!(used["tokens_in"].as_u64().unwrap() >= 100, "{used}");
    // the model dispatched: its completions asked for collab_dispatch of spec, then research
    let log = std::fs::read_to_string(&server.log).unwrap();
    for phase in ["spec", "research"] {
        assert!(
            log.contains(&format!(
                "{{\\\"id\\\": \\\"{id}\\\", \\\"phase\\\": \\\"{phase}\\\"}}"
            )),
            "no dispatch of {phase} in the model's calls"
        );
    }
}

/// An API orchestrator whose own words end its turn announcing a dispatch it never made is
/// flagged `dispatch_announced_not_made`, and nothing was dispatched for it.
#[test]
fn an_api_orchestrator_announcing_a_dispatch_it_did_not_make_is_flagged() {
    let mut fx = Fx::new();
    let server = ApiServer::start_mode(&fx, "steer_announce");
    let id = start_api_steered(&mut fx, &server);
    let s = until(&mut fx, &id, |s| {
        s["flags"].as_array().is_some_and(|f| !f.is_empty())
    });
    let flag = &s["flags"][0];
    assert_eq!(flag["code"], "dispatch_announced_not_made", "{s:#}");
    assert_eq!(flag["detail"]["announced"], json!(["spec"]));
    assert!(
        flag["detail"]["said"]
            .as_str()
            .unwrap()
            .contains("Dispatching spec to reasoning now."),
        "{flag}"
    );
    assert_eq!(phase_state(&s, "spec"), "waiting", "{s:#}");
}

/// A phase that plans first plans first however the orchestrator begins it: asked for the
/// person's approval, it starts its plan run (`plan@PHASE`), not the phase itself.
#[test]
fn a_planned_phase_begins_with_its_plan_even_through_an_approval_request() {
    let mut fx = Fx::new();
    let pack = STEERED.replacen("approve = false\n", "approve = false\nplan = true\n", 1);
    let v = fx.ok(
        None,
        "collab_start",
        json!({"goal": "add a flag", "pack": pack,
            "prompts": {"p.md": "do it", "o.md": "you orchestrate"},
            "roles": ["orchestrator=script:read,reply:noted", "reasoning=script:read",
                "search=script:read"]}),
    );
    let id = v["collab"].as_str().unwrap().to_string();
    settled(&mut fx, &id);
    let orch = fx.ok(
        None,
        "agent_rotate",
        json!({"name": format!("{id}-orchestrator")}),
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    let d = fx.ok(
        Some(&orch),
        "collab_request_approval",
        json!({"id": id, "phase": "spec"}),
    );
    assert_eq!(d["phase"], "spec", "{d}");
    let s = fx.ok(None, "collab_status", json!({"id": id}));
    let runs = s["runs"].as_array().unwrap();
    assert!(
        runs.iter().any(|r| r["phase"] == "plan@spec"),
        "the plan run began: {s:#}"
    );
    assert!(
        !runs.iter().any(|r| r["phase"] == "spec"),
        "the phase itself waits for its plan: {s:#}"
    );
    assert!(
        !s["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["phase"] == "spec"),
        "no approval of the phase before its plan: {s:#}"
    );
}
