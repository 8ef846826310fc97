//! Every refusal code reachable through the daemon API, reached through the daemon API: a real
//! daemon on a throw-away state dir, driven over its Unix socket. Each refusal is checked for its
//! exact code and for having changed nothing the owner can see: rooms and their journal tips,
//! the EVENTS.jsonl line counts, events and items of every room, the wake queue, projects,
//! agents and every task the test created.
//!
//! `room_sync_concurrent_arrival` is not reachable deterministically through the daemon (it
//! needs a foreign commit between a turn's prepare and commit phases); it is covered at engine
//! level.

mod common;
use common::*;
use room_server::client::Client;
use serde_json::{Value, json};
use std::path::PathBuf;

// ---------- principals ----------

#[test]
fn credential_invalid() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");
    for (op, args) in [
        ("sync", json!({"room": "coord"})),
        ("whoami", json!({})),
        ("say", json!({"room": "coord", "text": "hello"})),
        ("task_claim", json!({"task": UNKNOWN_TASK})),
        // an owner op with a bad token is refused for the token, not the op
        ("room_create", json!({"name": "x"})),
    ] {
        fx.refuse(Some(UNKNOWN_TOKEN), op, args.clone(), "credential_invalid");
        fx.refuse(Some("garbage"), op, args, "credential_invalid");
    }
    // The owner console presenting no token cannot act as an agent.
    fx.refuse(
        None,
        "say",
        json!({"room": "coord", "text": "hi"}),
        "credential_invalid",
    );
    fx.refuse(None, "sync", json!({"room": "coord"}), "credential_invalid");
    // The real token still works: the refusals were about the credential only.
    fx.ok(Some(&b), "say", json!({"room": "coord", "text": "hello"}));
}

#[test]
fn credential_revoked_and_rotated() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");

    fx.ok(None, "agent_revoke", json!({"name": "beta"}));
    for (op, args) in [
        ("sync", json!({"room": "coord"})),
        ("whoami", json!({})),
        ("say", json!({"room": "coord", "text": "still here?"})),
        ("rooms", json!({})),
    ] {
        fx.refuse(Some(&b), op, args, "credential_revoked");
    }

    // Rotation: the old token is retired at once, the new one works.
    fx.sync_all(&a, "coord");
    let new_a = fx.ok(None, "agent_rotate", json!({"name": "alpha"}))["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(new_a, a);
    for (op, args) in [
        ("sync", json!({"room": "coord"})),
        ("whoami", json!({})),
        ("say", json!({"room": "coord", "text": "old token"})),
    ] {
        fx.refuse(Some(&a), op, args, "credential_revoked");
    }
    fx.ok(Some(&new_a), "whoami", json!({}));

    // Rotating a revoked agent lifts the revocation for the new token only.
    let new_b = fx.ok(None, "agent_rotate", json!({"name": "beta"}))["token"]
        .as_str()
        .unwrap()
        .to_string();
    fx.refuse(Some(&b), "whoami", json!({}), "credential_revoked");
    fx.ok(Some(&new_b), "whoami", json!({}));
}

#[test]
fn tier_insufficient_owner_max() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");
    let r = fx.refuse(
        Some(&b),
        "task_create",
        json!({"room": "coord", "title": "mine", "to": "gamma"}),
        "tier_insufficient",
    );
    assert_eq!(r.detail["needed"], "coordinator");
    assert_eq!(r.detail["effective"], "member");
    assert_eq!(r.detail["owner_max"], "member");

    // An observer-max agent may read but not speak.
    let o = fx.enroll("watcher", "observer");
    fx.ok(
        None,
        "room_members_add",
        json!({"room": "coord", "agent": "watcher"}),
    );
    fx.sync_all(&o, "coord");
    fx.refuse(
        Some(&o),
        "say",
        json!({"room": "coord", "text": "hi"}),
        "tier_insufficient",
    );
}

#[test]
fn tier_insufficient_declared() {
    let mut fx = Fx::new();
    let (a, _b, _g) = fx.team("coord");
    fx.sync_all(&a, "coord");
    let mut req = request(Some(&a), "say", json!({"room": "coord", "text": "hi"}));
    req.tier = Some("observer".into());
    let r = fx.refuse_req(&req, "tier_insufficient");
    assert_eq!(r.detail["declared"], "observer");
    assert_eq!(r.detail["effective"], "observer");
    // A member declaration is too low for task_create even for a coordinator.
    let mut req = request(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "t", "to": "beta"}),
    );
    req.tier = Some("member".into());
    fx.refuse_req(&req, "tier_insufficient");
    // Reading is fine at observer.
    let mut req = request(Some(&a), "sync", json!({"room": "coord"}));
    req.tier = Some("observer".into());
    assert!(fx.send(&req).ok);
    // Undeclared, the same say goes through.
    fx.ok(Some(&a), "say", json!({"room": "coord", "text": "hi"}));
}

#[test]
fn tier_insufficient_fleet_ceiling() {
    let mut fx = Fx::new();
    let (a, _b, _g) = fx.team("coord");
    fx.sync_all(&a, "coord");
    fx.write_config("[fleet]\nceiling = \"observer\"\n");
    let r = fx.refuse(
        Some(&a),
        "say",
        json!({"room": "coord", "text": "hi"}),
        "tier_insufficient",
    );
    assert_eq!(r.detail["fleet_ceiling"], "observer");
    fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "t", "to": "beta"}),
        "tier_insufficient",
    );
    // config.toml is re-read per call: restoring it lifts the ceiling on the next call.
    fx.write_config(room_store::statedir::DEFAULT_CONFIG);
    fx.ok(Some(&a), "say", json!({"room": "coord", "text": "hi"}));
}

#[test]
fn verb_denied() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");
    fx.ok(
        None,
        "agent_policy",
        json!({"name": "beta", "deny": ["note"]}),
    );
    let r = fx.refuse(
        Some(&b),
        "note",
        json!({"room": "coord", "text": "a note"}),
        "verb_denied",
    );
    assert_eq!(r.detail["verb"], "note");
    // The multiplexer reaches the same verb under the same authorization.
    fx.refuse(
        Some(&b),
        "room",
        json!({"action": "note", "room": "coord", "text": "a note"}),
        "verb_denied",
    );
    // Other verbs are untouched, and allowing it again lets the note through.
    fx.ok(Some(&b), "say", json!({"room": "coord", "text": "a say"}));
    fx.ok(
        None,
        "agent_policy",
        json!({"name": "beta", "allow": ["note"]}),
    );
    fx.ok(Some(&b), "note", json!({"room": "coord", "text": "a note"}));
}

#[test]
fn actor_mismatch() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");
    let integrity = fx.state.join("integrity.jsonl");
    let lines = |p: &PathBuf| std::fs::read(p).map(|b| bytecount(&b)).unwrap_or(0);
    let before = lines(&integrity);
    let r = fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "hi", "actor": "someone-else"}),
        "actor_mismatch",
    );
    assert_eq!(r.detail["claimed"], "someone-else");
    assert_eq!(r.detail["principal"], "beta");
    assert_eq!(lines(&integrity), before + 1);
    let last: Value = serde_json::from_str(
        std::fs::read_to_string(&integrity)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(last["kind"], "actor_mismatch");
    assert_eq!(last["principal"], "beta");
    assert_eq!(last["claimed"], "someone-else");
    // Through the multiplexer too.
    fx.refuse(
        Some(&b),
        "room",
        json!({"action": "note", "room": "coord", "text": "n", "actor": "alpha"}),
        "actor_mismatch",
    );
    assert_eq!(lines(&integrity), before + 2);
    // Naming oneself is fine.
    fx.ok(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "hi", "actor": "beta"}),
    );
}

#[test]
fn owner_required() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    for (op, args) in [
        ("room_create", json!({"name": "mine"})),
        (
            "agent_enroll",
            json!({"name": "intruder", "max_tier": "operator"}),
        ),
        (
            "agent_policy",
            json!({"name": "beta", "max_tier": "operator"}),
        ),
        ("rooms", json!({})),
        ("wakes_list", json!({})),
        ("wakes_obligations", json!({"room": "coord"})),
    ] {
        fx.refuse(Some(&b), op, args.clone(), "owner_required");
        fx.refuse(Some(&a), op, args, "owner_required");
    }
}

// ---------- rooms ----------

#[test]
fn room_not_member_and_not_found() {
    let mut fx = Fx::new();
    let (a, _b, g) = fx.team("coord");
    fx.ok(
        None,
        "room_create",
        json!({"name": "private", "members": ["alpha", "beta"]}),
    );
    fx.sync_all(&a, "coord");
    fx.refuse(
        Some(&g),
        "sync",
        json!({"room": "private"}),
        "room_not_member",
    );
    fx.refuse(
        Some(&g),
        "say",
        json!({"room": "private", "text": "let me in"}),
        "room_not_member",
    );
    let mut req = request(
        Some(&g),
        "room",
        json!({"action": "sync", "room": "private"}),
    );
    req.conversation = Some("another".into());
    fx.refuse_req(&req, "room_not_member");
    // A coordinator outside the room cannot create tasks in it.
    let o = fx.enroll("outsider", "coordinator");
    fx.refuse(
        Some(&o),
        "task_create",
        json!({"room": "coord", "title": "t"}),
        "room_not_member",
    );

    fx.refuse(Some(&g), "sync", json!({"room": "nope"}), "room_not_found");
    fx.refuse(
        Some(&g),
        "say",
        json!({"room": "nope", "text": "hi"}),
        "room_not_found",
    );
    fx.refuse(None, "room_log", json!({"room": "nope"}), "room_not_found");
    fx.refuse(
        None,
        "room_reset",
        json!({"room": "nope"}),
        "room_not_found",
    );
    fx.refuse(
        None,
        "wakes_list",
        json!({"room": "nope"}),
        "room_not_found",
    );
    fx.refuse(
        None,
        "room_members_add",
        json!({"room": "nope", "agent": "gamma"}),
        "room_not_found",
    );
}

#[test]
fn graph_project_rebind_refused() {
    let mut fx = Fx::new();
    fx.team("coord");
    let (_d, pid) = fx.open_project("p1");
    let (_d2, pid2) = fx.open_project("p2");
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha"]}),
    );
    // coordination -> project
    fx.refuse(
        None,
        "room_create",
        json!({"name": "coord", "project": pid}),
        "graph_project_rebind_refused",
    );
    // project -> coordination
    fx.refuse(
        None,
        "room_create",
        json!({"name": "build"}),
        "graph_project_rebind_refused",
    );
    // project -> another project
    fx.refuse(
        None,
        "room_create",
        json!({"name": "build", "project": pid2}),
        "graph_project_rebind_refused",
    );
    // The same binding again is merely already_exists.
    fx.refuse(
        None,
        "room_create",
        json!({"name": "build", "project": pid}),
        "already_exists",
    );
}

// ---------- territory ----------

#[test]
fn project_territory_refused() {
    let mut fx = Fx::new();
    let (p1, _pid) = fx.open_project("p1");
    let file = fx.root.join("work").join("file.txt");
    std::fs::write(&file, b"not a dir").unwrap();
    let inside = p1.join("sub");
    std::fs::create_dir_all(&inside).unwrap();
    let parent = fx.root.join("work");
    let state = fx.state.clone();
    let in_state = fx.state.join("rooms");
    let missing = fx.root.join("work").join("missing");

    let cases: Vec<(PathBuf, &str)> = vec![
        (file, "not a directory"),
        (PathBuf::from("/"), "the filesystem root"),
        (state, "overlaps the room state"),
        (in_state, "overlaps the room state"),
        (inside, "overlap"),
        (parent, "overlap"),
        (missing, "cannot resolve"),
    ];
    for (path, reason) in cases {
        let r = fx.refuse(
            None,
            "project_open",
            json!({"path": path.to_str().unwrap()}),
            "project_territory_refused",
        );
        let got = r.detail["reason"].as_str().unwrap_or_default();
        assert!(
            got.starts_with(reason),
            "{}: reason {got:?}, wanted {reason:?}",
            path.display()
        );
    }
    // The same directory twice overlaps itself.
    let r = fx.refuse(
        None,
        "project_open",
        json!({"path": p1.to_str().unwrap()}),
        "project_territory_refused",
    );
    assert_eq!(r.detail["reason"], "overlap");
    // A sibling is fine.
    fx.open_project("p2");
}

struct Redirect {
    dir: PathBuf,
    project: String,
    alpha: String,
    beta: String,
    task: String,
}

/// A project room `build` with a task for beta, both agents caught up, the root still intact.
fn redirect_setup(fx: &mut Fx, dir: &str) -> Redirect {
    let alpha = fx.enroll("alpha", "coordinator");
    let beta = fx.enroll("beta", "member");
    let (dir, project) = fx.open_project(dir);
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": project, "members": ["alpha", "beta"]}),
    );
    fx.sync_all(&alpha, "build");
    let task = fx.task(&alpha, "build", Some("beta"));
    fx.sync_all(&beta, "build");
    fx.ok(
        Some(&beta),
        "note",
        json!({"room": "build", "text": "intact"}),
    );
    Redirect {
        dir,
        project,
        alpha,
        beta,
        task,
    }
}

fn assert_redirected_everywhere(fx: &mut Fx, r: &Redirect) {
    let (pid, a, b, task) = (
        r.project.as_str(),
        r.alpha.as_str(),
        r.beta.as_str(),
        r.task.as_str(),
    );
    fx.refuse(
        Some(b),
        "sync",
        json!({"room": "build"}),
        "project_root_redirected",
    );
    fx.refuse(
        Some(b),
        "note",
        json!({"room": "build", "text": "writing into the new dir"}),
        "project_root_redirected",
    );
    fx.refuse(
        Some(b),
        "task_claim",
        json!({"task": task}),
        "project_root_redirected",
    );
    fx.refuse(
        Some(a),
        "task_create",
        json!({"room": "build", "title": "t2", "to": "beta"}),
        "project_root_redirected",
    );
    fx.refuse(
        Some(a),
        "send",
        json!({"room": "build", "task": task, "to": ["beta"], "text": "go"}),
        "project_root_redirected",
    );
    fx.refuse(
        None,
        "room_create",
        json!({"name": "build2", "project": pid}),
        "project_root_redirected",
    );
    assert_eq!(fx.task_status(task), "open");
}

#[test]
fn project_root_redirected_by_replacement() {
    let mut fx = Fx::new();
    let r = redirect_setup(&mut fx, "p1");
    std::fs::rename(&r.dir, fx.root.join("work").join("p1-moved")).unwrap();
    std::fs::create_dir(&r.dir).unwrap();
    assert_redirected_everywhere(&mut fx, &r);
}

#[test]
fn project_root_redirected_by_symlink() {
    let mut fx = Fx::new();
    let r = redirect_setup(&mut fx, "p1");
    let elsewhere = fx.root.join("work").join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::rename(&r.dir, fx.root.join("work").join("p1-moved")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &r.dir).unwrap();
    assert_redirected_everywhere(&mut fx, &r);
}

// ---------- sync and the Work Gate ----------

#[test]
fn room_sync_required() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    for (op, args) in [
        ("say", json!({"room": "coord", "text": "blind"})),
        ("note", json!({"room": "coord", "text": "blind"})),
        (
            "send",
            json!({"room": "coord", "to": ["gamma"], "text": "blind"}),
        ),
        (
            "room",
            json!({"action": "say", "room": "coord", "text": "blind"}),
        ),
    ] {
        let r = fx.refuse(Some(&b), op, args, "room_sync_required");
        assert!(
            r.detail["next_page"]["receipt"]
                .as_str()
                .is_some_and(|s| s.starts_with("rcpt_")),
            "the gate hands over the next page: {}",
            r.detail
        );
    }
    fx.sync_all(&b, "coord");
    fx.ok(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "now I read"}),
    );
    // A foreign event after the checkpoint closes the gate again.
    fx.sync_all(&a, "coord");
    fx.ok(Some(&a), "say", json!({"room": "coord", "text": "news"}));
    fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "blind again"}),
        "room_sync_required",
    );
    // ...but one's own events never do.
    fx.ok(
        Some(&a),
        "say",
        json!({"room": "coord", "text": "more news"}),
    );
}

#[test]
fn room_sync_view_changed_after_reset() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    let old = fx.ok(Some(&b), "sync", json!({"room": "coord"}))["receipt"]
        .as_str()
        .unwrap()
        .to_string();
    fx.sync_all(&b, "coord");
    fx.ok(None, "room_reset", json!({"room": "coord"}));
    fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "after reset"}),
        "room_sync_view_changed",
    );
    fx.refuse(
        Some(&b),
        "sync",
        json!({"room": "coord", "confirm": old}),
        "room_sync_view_changed",
    );
    fx.sync_all(&b, "coord");
    fx.ok(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "after reset"}),
    );
}

#[test]
fn room_sync_view_changed_after_rotate() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    let old = fx.ok(Some(&b), "sync", json!({"room": "coord"}))["receipt"]
        .as_str()
        .unwrap()
        .to_string();
    fx.sync_all(&b, "coord");
    let nb = fx.ok(None, "agent_rotate", json!({"name": "beta"}))["token"]
        .as_str()
        .unwrap()
        .to_string();
    // The checkpoint was bound to the old registration: the new credential's view differs.
    fx.refuse(
        Some(&nb),
        "say",
        json!({"room": "coord", "text": "new token"}),
        "room_sync_view_changed",
    );
    fx.refuse(
        Some(&nb),
        "sync",
        json!({"room": "coord", "confirm": old}),
        "room_sync_view_changed",
    );
    fx.sync_all(&nb, "coord");
    fx.ok(
        Some(&nb),
        "say",
        json!({"room": "coord", "text": "new token"}),
    );
}

#[test]
fn room_sync_delivery_policy_changed() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    fx.sync_all(&a, "coord");
    fx.ok(
        Some(&a),
        "say",
        json!({"room": "coord", "text": "the code is secret-123"}),
    );
    let page = fx.ok(Some(&b), "sync", json!({"room": "coord"}));
    assert!(page["items"].to_string().contains("secret-123"));
    let receipt = page["receipt"].as_str().unwrap().to_string();
    fx.write_config("[redaction]\npatterns = [\"secret-[0-9]+\"]\n");
    fx.refuse(
        Some(&b),
        "sync",
        json!({"room": "coord", "confirm": receipt}),
        "room_sync_delivery_policy_changed",
    );
    // The checkpoint did not move: the gate is still closed.
    let r = fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "hm"}),
        "room_sync_required",
    );
    // the page the refusal hands over (its items kept as text until they are written out) is
    // rendered under the new policy: redacted, like every page
    let items = r.detail["next_page"]["items"].to_string();
    assert!(
        items.contains("the code is") && !items.contains("secret-123"),
        "{items}"
    );
    // A fresh page is redacted and confirms.
    let page = fx.ok(Some(&b), "sync", json!({"room": "coord"}));
    assert!(!page["items"].to_string().contains("secret-123"));
    fx.sync_all(&b, "coord");
    fx.ok(Some(&b), "say", json!({"room": "coord", "text": "got it"}));
}

#[test]
fn receipt_unknown() {
    let mut fx = Fx::new();
    let (_a, b, g) = fx.team("coord");
    fx.refuse(
        Some(&b),
        "sync",
        json!({"room": "coord", "confirm": UNKNOWN_RECEIPT}),
        "receipt_unknown",
    );
    // Another agent's receipt is not one of yours.
    let theirs = fx.ok(Some(&g), "sync", json!({"room": "coord"}))["receipt"]
        .as_str()
        .unwrap()
        .to_string();
    fx.refuse(
        Some(&b),
        "sync",
        json!({"room": "coord", "confirm": theirs}),
        "receipt_unknown",
    );
    // Your own receipt from another conversation is not this conversation's.
    let mine = fx.ok(Some(&b), "sync", json!({"room": "coord"}))["receipt"]
        .as_str()
        .unwrap()
        .to_string();
    let mut req = request(
        Some(&b),
        "sync",
        json!({"room": "coord", "confirm": mine.clone()}),
    );
    req.conversation = Some("other-conversation".into());
    fx.refuse_req(&req, "receipt_unknown");
    // In its own conversation it confirms.
    fx.ok(Some(&b), "sync", json!({"room": "coord", "confirm": mine}));
}

// ---------- egress ----------

#[test]
fn tool_result_withheld_on_reads() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    let receipt = fx.ok(Some(&b), "sync", json!({"room": "coord"}))["receipt"]
        .as_str()
        .unwrap()
        .to_string();
    fx.write_config("[redaction]\npatterns = [\"(\"]\n");
    fx.refuse(Some(&b), "whoami", json!({}), "tool_result_withheld");
    fx.refuse(Some(&b), "list", json!({}), "tool_result_withheld");
    fx.refuse(
        Some(&b),
        "sync",
        json!({"room": "coord"}),
        "tool_result_withheld",
    );
    fx.refuse(
        Some(&b),
        "sync",
        json!({"room": "coord", "confirm": receipt}),
        "tool_result_withheld",
    );
    // A refusal toward an agent passes the redactor too.
    fx.refuse(
        Some(&b),
        "sync",
        json!({"room": "nope"}),
        "tool_result_withheld",
    );
    // The owner console has no egress redaction and keeps working.
    fx.ok(None, "rooms", json!({}));
    fx.write_config(room_store::statedir::DEFAULT_CONFIG);
    fx.ok(Some(&b), "whoami", json!({}));
    // The receipt was not confirmed while withheld.
    fx.sync_all(&b, "coord");
}

/// A config.toml that cannot be parsed fails closed: the ceiling drops to observer, so a write
/// is refused before it commits, and the answer is withheld.
#[test]
fn tool_result_withheld_unparseable_config_fails_closed() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    fx.sync_all(&a, "coord");
    let t = fx.task(&a, "coord", Some("beta"));
    fx.sync_all(&b, "coord");
    fx.write_config("this is [[[ not toml");
    fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "is this written?"}),
        "tool_result_withheld",
    );
    fx.refuse(
        Some(&b),
        "task_claim",
        json!({"task": t}),
        "tool_result_withheld",
    );
    fx.refuse(Some(&b), "whoami", json!({}), "tool_result_withheld");
    assert_eq!(fx.task_status(&t), "open");
    fx.write_config(room_store::statedir::DEFAULT_CONFIG);
    fx.ok(Some(&b), "task_claim", json!({"task": t}));
}

/// A write while the redaction policy cannot load must not commit behind a refusal.
#[test]
fn tool_result_withheld_on_writes_commits_nothing() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");
    fx.sync_all(&a, "coord");
    let t = fx.task(&a, "coord", Some("beta"));
    fx.sync_all(&b, "coord");
    fx.write_config("[redaction]\npatterns = [\"(\"]\n");
    fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "is this written?"}),
        "tool_result_withheld",
    );
    fx.refuse(
        Some(&b),
        "task_claim",
        json!({"task": t}),
        "tool_result_withheld",
    );
    assert_eq!(fx.task_status(&t), "open");
}

// ---------- verbs ----------

#[test]
fn note_mentions_refused() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");
    let r = fx.refuse(
        Some(&b),
        "note",
        json!({"room": "coord", "text": "@gamma have a look"}),
        "note_mentions_refused",
    );
    assert!(r.message.contains("gamma"));
    fx.refuse(
        Some(&b),
        "room",
        json!({"action": "note", "room": "coord", "text": "cc @alpha."}),
        "note_mentions_refused",
    );
    // A note addressing someone explicitly is a bad argument.
    fx.refuse(
        Some(&b),
        "note",
        json!({"room": "coord", "text": "for you", "to": ["gamma"]}),
        "invalid_argument",
    );
    // A non-member @name, or oneself, is not a mention.
    fx.ok(
        Some(&b),
        "note",
        json!({"room": "coord", "text": "mail me at x@beta or @nobody"}),
    );
}

#[test]
fn reply_target_not_addressed() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    fx.sync_all(&a, "coord");
    let ev = fx.ok(
        Some(&a),
        "say",
        json!({"room": "coord", "text": "status update"}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string();
    fx.sync_all(&b, "coord");
    fx.refuse(
        Some(&b),
        "reply",
        json!({"room": "coord", "reply_to": ev, "text": "noted"}),
        "reply_target_not_addressed",
    );
    // Addressed to gamma, not beta: still nothing of beta's.
    fx.sync_all(&a, "coord");
    let ev2 = fx.ok(
        Some(&a),
        "say",
        json!({"room": "coord", "text": "@gamma over to you"}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string();
    fx.sync_all(&b, "coord");
    fx.refuse(
        Some(&b),
        "reply",
        json!({"room": "coord", "reply_to": ev2, "text": "me too"}),
        "reply_target_not_addressed",
    );
}

#[test]
fn say_task_refused() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    let t = fx.task(&a, "coord", Some("beta"));
    fx.sync_all(&b, "coord");
    fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "working on it", "task": t}),
        "say_task_refused",
    );
    fx.refuse(
        Some(&b),
        "room",
        json!({"action": "say", "room": "coord", "text": "x", "task": t}),
        "say_task_refused",
    );
    assert_eq!(fx.task_status(&t), "open");
}

#[test]
fn say_reply_target_ambiguous() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("coord");
    fx.sync_all(&a, "coord");
    fx.ok(
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["gamma"], "text": "first question"}),
    );
    fx.sync_all(&b, "coord");
    fx.ok(
        Some(&b),
        "send",
        json!({"room": "coord", "to": ["gamma"], "text": "second question"}),
    );
    assert_eq!(
        fx.ok(None, "wakes_list", json!({"room": "coord"}))["wakes"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    fx.sync_all(&g, "coord");
    let r = fx.refuse(
        Some(&g),
        "say",
        json!({"room": "coord", "text": "yes"}),
        "say_reply_target_ambiguous",
    );
    assert_eq!(r.detail["sources"].as_array().unwrap().len(), 2);
    // Naming the target resolves the ambiguity.
    let first = fx
        .event_ids("coord")
        .into_iter()
        .find(|(_, actor)| actor == "alpha")
        .unwrap()
        .0;
    fx.ok(
        Some(&g),
        "say",
        json!({"room": "coord", "text": "yes", "reply_to": first}),
    );
}

#[test]
fn send_task_required() {
    let mut fx = Fx::new();
    let a = fx.enroll("alpha", "coordinator");
    fx.enroll("beta", "member");
    let (_d, pid) = fx.open_project("p1");
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta"]}),
    );
    fx.sync_all(&a, "build");
    let r = fx.refuse(
        Some(&a),
        "send",
        json!({"room": "build", "to": ["beta"], "text": "please do it"}),
        "send_task_required",
    );
    assert_eq!(r.detail["field"], "task");
    let t = fx.task(&a, "build", Some("beta"));
    fx.ok(
        Some(&a),
        "send",
        json!({"room": "build", "to": ["beta"], "text": "please do it", "task": t}),
    );
}

#[test]
fn cross_room_evidence_refused() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    fx.ok(
        None,
        "room_create",
        json!({"name": "side", "members": ["alpha"]}),
    );
    let foreign = fx.event_ids("side")[0].0.clone();
    let local = fx.event_ids("coord")[0].0.clone();
    fx.sync_all(&b, "coord");
    let r = fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "see that", "evidence": [foreign]}),
        "cross_room_evidence_refused",
    );
    assert_eq!(r.detail["evidence"], foreign.as_str());
    // Mixed with a local one it is still refused.
    fx.refuse(
        Some(&b),
        "note",
        json!({"room": "coord", "text": "see", "evidence": [local, foreign]}),
        "cross_room_evidence_refused",
    );
    // An event id of no room is a bad argument, not a cross-room one.
    fx.refuse(
        Some(&b),
        "note",
        json!({"room": "coord", "text": "see", "evidence": ["evt_00000000deadbeef_00000000"]}),
        "invalid_argument",
    );
    fx.ok(
        Some(&b),
        "note",
        json!({"room": "coord", "text": "see", "evidence": [local]}),
    );
}

#[test]
fn task_required() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    fx.task(&a, "coord", Some("beta"));
    fx.sync_all(&b, "coord");
    for (op, args) in [
        ("done", json!({"room": "coord"})),
        ("handoff", json!({"room": "coord", "to": ["gamma"]})),
        ("blocked", json!({"room": "coord", "text": "stuck"})),
        ("decline", json!({"room": "coord"})),
        ("room", json!({"action": "done", "room": "coord"})),
    ] {
        let r = fx.refuse(Some(&b), op, args, "task_required");
        assert_eq!(r.detail["field"], "task");
    }
}

#[test]
fn task_not_found() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");
    fx.refuse(
        Some(&b),
        "done",
        json!({"room": "coord", "task": UNKNOWN_TASK}),
        "task_not_found",
    );
    fx.refuse(
        Some(&b),
        "task_claim",
        json!({"task": UNKNOWN_TASK}),
        "task_not_found",
    );
    fx.refuse(
        Some(&b),
        "task_show",
        json!({"task": UNKNOWN_TASK}),
        "task_not_found",
    );
    fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "child", "parent": UNKNOWN_TASK}),
        "task_not_found",
    );
    fx.refuse(
        None,
        "owner_task_show",
        json!({"task": UNKNOWN_TASK}),
        "task_not_found",
    );
}

#[test]
fn task_state_invalid() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("coord");
    let t = fx.task(&a, "coord", Some("beta"));
    fx.sync_all(&b, "coord");
    // done before claim
    fx.refuse(
        Some(&b),
        "done",
        json!({"room": "coord", "task": t}),
        "task_state_invalid",
    );
    assert_eq!(fx.task_status(&t), "open");
    // only the recipient may claim
    fx.refuse(
        Some(&g),
        "task_claim",
        json!({"task": t}),
        "task_state_invalid",
    );
    fx.ok(Some(&b), "task_claim", json!({"task": t}));
    assert_eq!(fx.task_status(&t), "claimed");
    // a second claim
    fx.refuse(
        Some(&b),
        "task_claim",
        json!({"task": t}),
        "task_state_invalid",
    );
    fx.ok(Some(&b), "done", json!({"room": "coord", "task": t}));
    assert_eq!(fx.task_status(&t), "done");
    // nothing moves a done task
    fx.refuse(
        Some(&b),
        "done",
        json!({"room": "coord", "task": t}),
        "task_state_invalid",
    );
    fx.refuse(
        Some(&b),
        "decline",
        json!({"room": "coord", "task": t}),
        "task_state_invalid",
    );
    fx.refuse(
        Some(&b),
        "blocked",
        json!({"room": "coord", "task": t, "text": "stuck"}),
        "task_state_invalid",
    );
    fx.sync_all(&a, "coord");
    fx.refuse(
        Some(&a),
        "send",
        json!({"room": "coord", "task": t, "to": ["beta"], "text": "again"}),
        "task_state_invalid",
    );
    fx.refuse(
        Some(&a),
        "handoff",
        json!({"room": "coord", "task": t, "to": ["gamma"]}),
        "task_state_invalid",
    );
    assert_eq!(fx.task_status(&t), "done");
}

#[test]
fn task_not_held() {
    let mut fx = Fx::new();
    let (a, _b, g) = fx.team("coord");
    let t = fx.task(&a, "coord", Some("beta"));
    fx.sync_all(&g, "coord");
    for (op, args) in [
        ("done", json!({"room": "coord", "task": t})),
        (
            "handoff",
            json!({"room": "coord", "task": t, "to": ["alpha"]}),
        ),
        (
            "blocked",
            json!({"room": "coord", "task": t, "text": "stuck"}),
        ),
        ("decline", json!({"room": "coord", "task": t})),
    ] {
        fx.refuse(Some(&g), op, args, "task_not_held");
    }
    assert_eq!(fx.task_status(&t), "open");
}

#[test]
fn obligation_not_found() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("coord");
    fx.sync_all(&a, "coord");
    let sent = fx.ok(
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["gamma"], "text": "please review"}),
    );
    let obl = sent["obligations"][0]["id"].as_str().unwrap().to_string();
    // Not raised by beta, nor by gamma (gamma owes it; it did not raise it).
    fx.sync_all(&b, "coord");
    fx.refuse(
        Some(&b),
        "circle",
        json!({"room": "coord", "obligation": obl}),
        "obligation_not_found",
    );
    fx.sync_all(&g, "coord");
    fx.refuse(
        Some(&g),
        "circle",
        json!({"room": "coord", "obligation": obl}),
        "obligation_not_found",
    );
    // Well-formed but nobody's.
    fx.sync_all(&a, "coord");
    fx.refuse(
        Some(&a),
        "circle",
        json!({"room": "coord", "obligation": UNKNOWN_OBLIGATION}),
        "obligation_not_found",
    );
    // Its raiser may circle it.
    fx.ok(
        Some(&a),
        "circle",
        json!({"room": "coord", "obligation": obl}),
    );
}

// ---------- bad arguments and sizes ----------

#[test]
fn invalid_argument() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");
    // unknown fields
    let r = fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "x", "bogus": 1}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "bogus");
    fx.refuse(
        None,
        "room_create",
        json!({"name": "r", "colour": "red"}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&b),
        "sync",
        json!({"room": "coord", "confirm_all": true}),
        "invalid_argument",
    );
    fx.refuse(Some(&b), "whoami", json!({"x": 1}), "invalid_argument");
    // names with a path separator, "..", NUL, upper case
    for bad in ["a/b", "..", "a..b", "../etc", "nul\0name", "Upper", ""] {
        fx.refuse(
            None,
            "agent_enroll",
            json!({"name": bad}),
            "invalid_argument",
        );
        fx.refuse(
            None,
            "room_create",
            json!({"name": bad}),
            "invalid_argument",
        );
        fx.refuse(Some(&b), "sync", json!({"room": bad}), "invalid_argument");
        fx.refuse(
            Some(&b),
            "say",
            json!({"room": "coord", "text": "x", "to": [bad]}),
            "invalid_argument",
        );
    }
    fx.refuse(
        None,
        "agent_enroll",
        json!({"name": "ok", "host": "bad/host"}),
        "invalid_argument",
    );
    let p = fx.root.join("work").join("p1");
    std::fs::create_dir_all(&p).unwrap();
    fx.refuse(
        None,
        "project_open",
        json!({"path": p.to_str().unwrap(), "name": "x/y"}),
        "invalid_argument",
    );
    fx.refuse(
        None,
        "project_open",
        json!({"path": "relative/dir"}),
        "invalid_argument",
    );
    fx.refuse(
        None,
        "project_open",
        json!({"path": "/tmp/a\0b"}),
        "invalid_argument",
    );
    fx.refuse(
        None,
        "room_create",
        json!({"name": "r", "project": "not-a-project"}),
        "invalid_argument",
    );
    // NUL in text
    fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "a\0b"}),
        "invalid_argument",
    );
    // wrong types
    for args in [
        json!({"room": "coord", "text": 5}),
        json!({"room": "coord", "text": "x", "to": "gamma"}),
        json!({"room": 7, "text": "x"}),
        json!({"room": "coord", "text": "x", "evidence": "evt"}),
        json!("a string"),
        json!([1, 2]),
    ] {
        fx.refuse(Some(&b), "say", args, "invalid_argument");
    }
    fx.refuse(
        Some(&b),
        "sync",
        json!({"room": "coord", "confirm": 12}),
        "invalid_argument",
    );
    fx.refuse(
        None,
        "room_log",
        json!({"room": "coord", "from": "one"}),
        "invalid_argument",
    );
    // bad enum values and ids
    fx.refuse(
        None,
        "agent_enroll",
        json!({"name": "god", "max_tier": "root"}),
        "invalid_argument",
    );
    fx.refuse(
        None,
        "agent_policy",
        json!({"name": "beta", "deny": ["fly"]}),
        "invalid_argument",
    );
    let mut req = request(Some(&b), "whoami", json!({}));
    req.tier = Some("root".into());
    fx.refuse_req(&req, "invalid_argument");
    let mut req = request(Some(&b), "whoami", json!({}));
    req.conversation = Some("bad\nconversation".into());
    fx.refuse_req(&req, "invalid_argument");
    fx.refuse(
        Some(&b),
        "sync",
        json!({"room": "coord", "confirm": "rcpt_nothex"}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&b),
        "task_claim",
        json!({"task": "task-1"}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&b),
        "circle",
        json!({"room": "coord", "obligation": "obl_x"}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&b),
        "reply",
        json!({"room": "coord", "text": "x"}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "   "}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "to me", "to": ["beta"]}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "bad\ttitle"}),
        "invalid_argument",
    );
    // unknown operations and multiplexer actions
    fx.refuse(Some(&b), "frobnicate", json!({}), "invalid_argument");
    fx.refuse(None, "frobnicate", json!({}), "invalid_argument");
    fx.refuse(
        Some(&b),
        "room",
        json!({"room": "coord", "text": "x"}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&b),
        "room",
        json!({"action": "fly", "room": "coord"}),
        "invalid_argument",
    );
    // The daemon still serves the same connection.
    fx.ok(Some(&b), "say", json!({"room": "coord", "text": "fine"}));
}

#[test]
fn payload_too_large_text() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");
    let over = "a".repeat((1 << 20) + 1);
    let r = fx.refuse(
        Some(&b),
        "say",
        json!({"room": "coord", "text": over}),
        "payload_too_large",
    );
    assert_eq!(r.detail["limit_bytes"], 1 << 20);
    assert_eq!(r.detail["field"], "text");
    // Exactly at the limit is accepted (spilled to a blob).
    let at = "a".repeat(1 << 20);
    let tip = fx.tip("coord");
    fx.ok(Some(&b), "note", json!({"room": "coord", "text": at}));
    assert_eq!(fx.tip("coord"), tip + 1);
}

#[test]
fn payload_too_large_request_line() {
    let mut fx = Fx::new();
    let (_a, _b, _g) = fx.team("coord");
    let before = fx.snapshot();
    let mut raw = Client::connect(&fx.daemon.socket).unwrap();
    let limit = room_server::wire::REQUEST_BYTES_MAX;
    assert_eq!(limit, 2 << 20);
    let mut line = br#"{"op":"ping","args":{"pad":""#.to_vec();
    line.resize(limit + 16, b'a');
    line.extend_from_slice(b"\"}}\n");
    let r = expect_code(
        raw.raw(&line).expect("the daemon answers before closing"),
        "payload_too_large",
        "oversized line",
    );
    assert_eq!(r.detail["limit_bytes"], limit);
    // The connection is closed after the refusal...
    assert!(
        raw.call(&request(None, "ping", json!({}))).is_err(),
        "the daemon closes a connection after an oversized line"
    );
    // ...and the daemon keeps serving others.
    assert!(fx.call(None, "ping", json!({})).ok);
    let mut fresh = Client::connect(&fx.daemon.socket).unwrap();
    assert!(fresh.call(&request(None, "ping", json!({}))).unwrap().ok);
    assert_eq!(before, fx.snapshot());
}

#[test]
fn bad_input_lines() {
    let mut fx = Fx::new();
    fx.team("coord");
    let before = fx.snapshot();
    let cases: [&[u8]; 7] = [
        b"{not json\n",
        b"\xff\xfe\xfd\n",
        b"{\"op\":\"ping\",\"bogus\":1}\n",
        b"{\"op\":\"rooms\",\"args\":{},\"extra\":null}\n",
        b"\n",
        b"42\n",
        b"{\"op\":5}\n",
    ];
    for bytes in cases {
        let r = fx.client.raw(bytes).expect("the daemon answers");
        expect_code(r, "invalid_argument", &String::from_utf8_lossy(bytes));
        // The same connection keeps serving.
        assert!(fx.call(None, "ping", json!({})).ok);
    }
    // A request without op is malformed too.
    let r = fx.client.raw(b"{\"args\":{}}\n").unwrap();
    expect_code(r, "invalid_argument", "no op");
    assert_eq!(before, fx.snapshot());
}

/// The wire is one JSON object per line with named fields; a positional array is not a request.
#[test]
fn array_shaped_request_is_refused() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    let before = fx.snapshot();
    let r = fx.client.raw(b"[\"ping\"]\n").expect("the daemon answers");
    expect_code(r, "invalid_argument", "array request");
    let line = format!("{}\n", json!({"op": "sync", "token": b, "args": ["coord"]}));
    let r = fx.client.raw(line.as_bytes()).expect("the daemon answers");
    expect_code(r, "invalid_argument", "array args");
    assert_eq!(before, fx.snapshot());
}

// ---------- the five runtime invariants ----------

#[test]
fn invariant_exactly_once_refuses_a_repeated_key() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");
    let say = json!({"room": "coord", "text": "deploy started", "idempotency_key": "deploy-7"});
    let first = fx.ok(Some(&b), "say", say.clone());
    fx.sync_all(&a, "coord");
    // the retry of a call whose answer was lost is refused and names the first event
    let r = fx.refuse_violation(&b, "say", say, "coord", "exactly_once");
    assert_eq!(r.detail["original_event"], first["event"]);
    assert_eq!(r.detail["key"], "deploy-7");
    // the violation record is evidence, not an act: it holds no room-mate at the gate, and
    // the key is per actor: another agent may use the same one
    fx.ok(
        Some(&a),
        "say",
        json!({"room": "coord", "text": "ok", "idempotency_key": "deploy-7"}),
    );
    // task creation too, through the multiplexer
    fx.sync_all(&a, "coord");
    let create = json!({"action": "task_create", "room": "coord", "title": "ship", "idempotency_key": "ship-1"});
    let t = fx.ok(Some(&a), "room", create.clone());
    fx.tasks.push(t["task"]["id"].as_str().unwrap().to_string());
    let r = fx.refuse_violation(&a, "room", create, "coord", "exactly_once");
    assert_eq!(r.detail["original_task"], t["task"]["id"]);
    // a malformed key is an argument error that writes nothing
    for bad in ["", "has space", &"k".repeat(129)] {
        let r = fx.refuse(
            Some(&b),
            "say",
            json!({"room": "coord", "text": "x", "idempotency_key": bad}),
            "invalid_argument",
        );
        assert_eq!(r.detail["field"], "idempotency_key");
    }
}

#[test]
fn invariant_rejections_in_a_loop_stop_filling_the_journal() {
    let mut fx = Fx::new();
    let (_a, b, _g) = fx.team("coord");
    fx.sync_all(&b, "coord");
    let say = json!({"room": "coord", "text": "retry me", "idempotency_key": "loop-1"});
    fx.ok(Some(&b), "say", say.clone());
    // the first rejections within the window are recorded, one record each
    for _ in 0..16 {
        let r = fx.refuse_violation(&b, "say", say.clone(), "coord", "exactly_once");
        assert!(r.detail["violation_event"].is_string(), "{r}");
    }
    // after that the same refusal, with nothing written (refuse checks the state is unchanged)
    for _ in 0..3 {
        let r = fx.refuse(Some(&b), "say", say.clone(), "invariant_violation");
        assert_eq!(r.detail["invariant"], "exactly_once");
        assert_eq!(r.detail["violation_recorded"], "rate_limited", "{r}");
        assert!(r.hint.as_deref().unwrap_or_default().contains("not"), "{r}");
    }
}

#[test]
fn invariant_well_formed_refuses_an_effect_outside_a_claim() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    let t = fx.task(&a, "coord", Some("beta"));
    fx.sync_all(&b, "coord");
    // beta acts on its task before claiming it
    fx.refuse_violation(
        &b,
        "note",
        json!({"room": "coord", "task": t, "text": "started"}),
        "coord",
        "well_formed",
    );
    fx.refuse_violation(
        &b,
        "send",
        json!({"room": "coord", "task": t, "to": ["alpha"], "text": "question"}),
        "coord",
        "well_formed",
    );
    assert_eq!(fx.task_status(&t), "open");
    fx.ok(Some(&b), "task_claim", json!({"task": t}));
    fx.ok(
        Some(&b),
        "note",
        json!({"room": "coord", "task": t, "text": "started"}),
    );
    fx.ok(Some(&b), "done", json!({"room": "coord", "task": t}));
    // after the lifecycle resolved, no more effects on it
    fx.refuse_violation(
        &b,
        "note",
        json!({"room": "coord", "task": t, "text": "one more thing"}),
        "coord",
        "well_formed",
    );
}

#[test]
fn a_handoff_moves_the_task_and_not_its_lease() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("coord");
    fx.sync_all(&a, "coord");
    let t = fx.ok(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "edit", "to": "beta", "scopes": ["file:src"]}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    fx.tasks.push(t.clone());
    let first = fx.ok(Some(&b), "task_claim", json!({"task": t}));
    fx.sync_all(&b, "coord");
    let h = fx.ok(
        Some(&b),
        "handoff",
        json!({"room": "coord", "task": t, "to": ["gamma"]}),
    );
    assert_eq!(
        (
            h["detail"]["lease_transferred"].clone(),
            h["detail"]["fresh_claim_required"].clone()
        ),
        (json!(false), json!(true)),
        "{h}"
    );
    let shown = fx.ok(None, "owner_task_show", json!({"task": t}));
    assert_eq!(
        (
            shown["task"]["status"].as_str(),
            shown["task"]["recipient"].as_str()
        ),
        (Some("open"), Some("gamma")),
        "{shown}"
    );
    assert!(shown["lease"].is_null(), "no lease moved: {shown}");
    // the new recipient claims afresh, under a higher fencing generation
    let second = fx.ok(Some(&g), "task_claim", json!({"task": t}));
    assert!(
        second["lease"]["generation"].as_u64() > first["lease"]["generation"].as_u64(),
        "{first} {second}"
    );
}

#[test]
fn invariant_exclusive_refuses_an_overlapping_lease() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("coord");
    let create = |fx: &mut Fx, to: &str, scopes: Value| {
        fx.sync_all(&a, "coord");
        let t = fx.ok(
            Some(&a),
            "task_create",
            json!({"room": "coord", "title": "edit", "to": to, "scopes": scopes}),
        );
        let id = t["task"]["id"].as_str().unwrap().to_string();
        fx.tasks.push(id.clone());
        id
    };
    let t1 = create(&mut fx, "beta", json!(["file:src"]));
    let t2 = create(&mut fx, "gamma", json!(["file:src/lib.rs", "api:stripe"]));
    let t3 = create(&mut fx, "gamma", json!(["file:docs", "api:github"]));
    fx.ok(Some(&b), "task_claim", json!({"task": t1}));
    let r = fx.refuse_violation(&g, "task_claim", json!({"task": t2}), "coord", "exclusive");
    let c = &r.detail["conflicts"][0];
    assert_eq!(
        (
            c["scope"].as_str(),
            c["held_scope"].as_str(),
            c["holder"].as_str()
        ),
        (Some("file:src/lib.rs"), Some("file:src"), Some("beta"))
    );
    assert!(r.message.contains("beta's live lease on file:src"), "{r}");
    assert_eq!(fx.task_status(&t2), "open");
    // disjoint scopes are no conflict
    fx.ok(Some(&g), "task_claim", json!({"task": t3}));
    // the lease ends with the lifecycle
    fx.sync_all(&b, "coord");
    fx.ok(Some(&b), "done", json!({"room": "coord", "task": t1}));
    fx.ok(Some(&g), "task_claim", json!({"task": t2}));
    // malformed scopes never reach a lease
    for bad in ["src", "file:/etc", "file:a/../b", "file:a//b"] {
        let r = fx.refuse(
            Some(&a),
            "task_create",
            json!({"room": "coord", "title": "x", "scopes": [bad]}),
            "invalid_argument",
        );
        assert_eq!(r.detail["field"], "scopes");
    }
    let r = fx.refuse(
        Some(&g),
        "task_claim",
        json!({"task": t2, "ttl_ms": 5}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "ttl_ms");
}

#[test]
fn children_open_flags_done_over_unresolved_children() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    let parent = fx.task(&a, "coord", Some("beta"));
    fx.sync_all(&a, "coord");
    let child = fx.ok(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "sub", "to": "gamma", "parent": parent}),
    );
    fx.tasks
        .push(child["task"]["id"].as_str().unwrap().to_string());
    fx.sync_all(&b, "coord");
    fx.ok(Some(&b), "task_claim", json!({"task": parent}));
    let done = fx.ok(Some(&b), "done", json!({"room": "coord", "task": parent}));
    // a flag, not a rejection: the act lands and the condition stands beside it
    assert_eq!(done["flags"][0]["invariant"], "children_open");
    assert_eq!(
        done["flags"][0]["detail"]["unresolved_children"][0]["task"],
        child["task"]["id"]
    );
    assert_eq!(fx.task_status(&parent), "done");
    let log = fx.ok(None, "room_log", json!({"room": "coord", "limit": 1000}));
    let events = log["events"].as_array().unwrap();
    let n = events.len();
    assert_eq!(events[n - 2]["id"], done["event"]);
    let flag = &events[n - 1]["event"];
    assert_eq!(
        (
            flag["kind"].as_str(),
            flag["invariant"].as_str(),
            flag["severity"].as_str()
        ),
        (
            Some("invariant_violation"),
            Some("children_open"),
            Some("flag")
        )
    );
    assert_eq!(flag["event"], done["event"]);
    // a subtask lives in its parent's room
    fx.ok(
        None,
        "room_create",
        json!({"name": "other", "members": ["alpha"]}),
    );
    let r = fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "other", "title": "sub", "parent": parent}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "parent");
}

#[test]
fn invariant_exclusive_spans_the_rooms_of_a_project_without_describing_them() {
    let mut fx = Fx::new();
    let a = fx.enroll("alpha", "coordinator");
    let b = fx.enroll("beta", "member");
    let g = fx.enroll("gamma", "member");
    let (_, pid) = fx.open_project("app");
    fx.ok(
        None,
        "room_create",
        json!({"name": "p1", "project": pid, "members": ["alpha", "beta"]}),
    );
    fx.ok(
        None,
        "room_create",
        json!({"name": "p2", "project": pid, "members": ["alpha", "gamma"]}),
    );
    let create = |fx: &mut Fx, room: &str, to: &str| {
        fx.sync_all(&a, room);
        let t = fx.ok(
            Some(&a),
            "task_create",
            json!({"room": room, "title": "edit", "to": to, "scopes": ["file:src/lib.rs"]}),
        );
        let id = t["task"]["id"].as_str().unwrap().to_string();
        fx.tasks.push(id.clone());
        id
    };
    let t1 = create(&mut fx, "p1", "beta");
    let t2 = create(&mut fx, "p2", "gamma");
    fx.ok(Some(&b), "task_claim", json!({"task": t1}));
    let r = fx.refuse_violation(&g, "task_claim", json!({"task": t2}), "p2", "exclusive");
    let c = &r.detail["conflicts"][0];
    assert_eq!(c["elsewhere"], "another room of this project", "{r}");
    assert!(
        c["task"].is_null() && c["holder"].is_null() && c["held_scope"].is_null(),
        "{r}"
    );
    assert!(!r.message.contains("beta"), "nor does the message: {r}");
}

#[test]
fn invariant_resolution_records_a_claim_past_its_ttl_in_doubt() {
    let mut fx = Fx::new();
    let (a, b, _g) = fx.team("coord");
    let t = fx.task(&a, "coord", Some("beta"));
    let claim = fx.ok(Some(&b), "task_claim", json!({"task": t, "ttl_ms": 1000}));
    // the daemon sweeps every second; wait for its record (no time is asserted)
    let mut found = None;
    for _ in 0..300 {
        let log = fx.ok(None, "room_log", json!({"room": "coord", "limit": 1000}));
        found = log["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "invariant_violation")
            .cloned();
        if found.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let v = found.expect("a lapsed claim is recorded within the sweep period")["event"].clone();
    assert_eq!(v["invariant"], "resolution");
    assert_eq!(v["severity"], "in_doubt");
    assert_eq!(v["actor"], "beta");
    assert_eq!(v["task"], t);
    assert_eq!(v["event"], claim["event"]);
    assert!(v["detail"]["elapsed_ms"].as_u64().unwrap() >= 1000);
    // in doubt is not failure: the task stays claimed and recorded once
    assert_eq!(fx.task_status(&t), "claimed");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let log = fx.ok(None, "room_log", json!({"room": "coord", "limit": 1000}));
    let lapses = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "invariant_violation")
        .count();
    assert_eq!(lapses, 1);
    fx.sync_all(&b, "coord");
    fx.ok(Some(&b), "done", json!({"room": "coord", "task": t}));
}

#[test]
fn a_lapsed_scoped_claim_releases_its_lease_and_its_holder_must_claim_afresh() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("coord");
    let create = |fx: &mut Fx, to: &str| {
        fx.sync_all(&a, "coord");
        let t = fx.ok(
            Some(&a),
            "task_create",
            json!({"room": "coord", "title": "edit", "to": to, "scopes": ["file:src"]}),
        );
        let id = t["task"]["id"].as_str().unwrap().to_string();
        fx.tasks.push(id.clone());
        id
    };
    let (tb, tg) = (create(&mut fx, "beta"), create(&mut fx, "gamma"));
    let claim = fx.ok(Some(&b), "task_claim", json!({"task": tb, "ttl_ms": 1000}));
    let first = claim["lease"]["generation"].as_u64().unwrap();
    // the daemon's sweep (every second) records the lapse and releases the lease by generation
    let mut released = false;
    for _ in 0..300 {
        if fx.ok(None, "owner_task_show", json!({"task": tb}))["lease"].is_null() {
            released = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        released,
        "a lapsed claim's lease is released within the sweep period"
    );
    assert_eq!(fx.task_status(&tb), "claimed", "in doubt, not failed");
    // the scope is free for a rival, whose lease is a later generation
    let rival = fx.ok(Some(&g), "task_claim", json!({"task": tg}));
    assert!(
        rival["lease"]["generation"].as_u64().unwrap() > first,
        "{rival}"
    );
    // the lapsed holder cannot close on the lease it lost; its fresh claim meets the rival
    fx.sync_all(&b, "coord");
    let r = fx.refuse(
        Some(&b),
        "done",
        json!({"room": "coord", "task": tb}),
        "task_state_invalid",
    );
    assert_eq!(r.detail["fresh_claim_required"], true, "{r}");
    fx.refuse_violation(&b, "task_claim", json!({"task": tb}), "coord", "exclusive");
}

/// A recipient list is bounded before its entries are looked at: 200,000 copies of one
/// recipient are refused (not folded into one), a repeated name is refused by its index, and
/// neither writes anything.
#[test]
fn recipient_lists_are_bounded_and_name_each_recipient_once() {
    let mut fx = Fx::new();
    let (a, _b, _g) = fx.team("coord");
    fx.sync_all(&a, "coord");
    let many = vec!["beta"; 200_000];
    let r = fx.refuse(
        Some(&a),
        "send",
        json!({"room": "coord", "to": many, "text": "hi"}),
        "invalid_argument",
    );
    assert!(r.message.contains("200000 given"), "{r}");
    let r = fx.refuse(
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["beta", "gamma", "beta"], "text": "hi"}),
        "invalid_argument",
    );
    assert!(r.message.contains("to[2]"), "{r}");
    fx.ok(
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["beta", "gamma"], "text": "hi"}),
    );
}

/// A transport's page ceiling below the smallest page is refused, not raised to it.
#[test]
fn a_page_ceiling_below_the_smallest_page_is_refused() {
    let mut fx = Fx::new();
    let (a, _b, _g) = fx.team("coord");
    for b in [0u32, 4_095] {
        let mut req = request(Some(&a), "sync", json!({"room": "coord"}));
        req.page_bytes_max = Some(b);
        let r = fx.refuse_req(&req, "invalid_argument");
        assert!(r.message.contains("page_bytes_max"), "{r}");
    }
    let mut req = request(Some(&a), "sync", json!({"room": "coord"}));
    req.page_bytes_max = Some(4_096);
    assert!(fx.send(&req).ok);
}
