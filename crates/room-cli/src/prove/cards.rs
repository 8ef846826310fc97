//! The cards of the claims about principals, the gate, the verbs and wakes (04-C01, C02,
//! C05, C06, C07). Each card recruits the members it changes, so cards run in any order.

use super::{Cast, Prover};
use serde_json::{Value, json};
use std::time::Duration;

/// 04-C01: a copied state dir is refused at start; a project root replaced or redirected is
/// refused on the next project-scoped call, and the original restored works again.
pub(super) fn c01(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let copy = p.root.join("copied-state");
    let copied = std::fs::create_dir_all(&copy)
        .and_then(|()| {
            std::fs::copy(
                p.state.root.join("state_dir_id.json"),
                copy.join("state_dir_id.json"),
            )
        })
        .is_ok();
    let out = p.room_bin(&["serve"], &copy);
    let err = String::from_utf8_lossy(&out.stderr);
    p.record(
        "a state dir copied elsewhere is refused at start",
        copied && out.status.code() == Some(4) && err.contains("state_dir_split_brain"),
        format!(
            "exit {}: {}",
            out.status.code().map_or("none".into(), |c| c.to_string()),
            err.lines().next().unwrap_or("")
        ),
    );
    let a = cast.alpha.clone();
    p.catch_up(&a, "build");
    p.ok(
        "a call in the granted project works",
        Some(&a),
        "say",
        json!({"room": "build", "text": "in the project"}),
    );
    let aside = p.root.join("project-aside");
    let moved = std::fs::rename(&p.project, &aside).and_then(|()| std::fs::create_dir(&p.project));
    if moved.is_ok() {
        p.refused(
            "a project root replaced by another directory is refused",
            Some(&a),
            "say",
            json!({"room": "build", "text": "after the swap"}),
            "project_root_redirected",
            Some("build"),
        );
        let back = std::fs::remove_dir(&p.project)
            .and_then(|()| std::os::unix::fs::symlink(&aside, &p.project));
        if back.is_ok() {
            p.refused(
                "a project root made a symbolic link to the original is refused",
                Some(&a),
                "say",
                json!({"room": "build", "text": "through a link"}),
                "project_root_redirected",
                Some("build"),
            );
        }
        let restored =
            std::fs::remove_file(&p.project).and_then(|()| std::fs::rename(&aside, &p.project));
        p.record(
            "the original root restored",
            restored.is_ok(),
            "renamed back",
        );
        p.catch_up(&a, "build");
        p.ok(
            "the restored original works again",
            Some(&a),
            "say",
            json!({"room": "build", "text": "restored"}),
        );
    } else {
        p.record("move the project root aside", false, format!("{moved:?}"));
    }
    vec!["remote shares and a host administrator's changes below the file system"]
}

/// 04-C02: a call is its principal's: a tier below the verb's, a denied verb, a rotated or
/// revoked credential are refused on the very next call.
pub(super) fn c02(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let _ = cast;
    let b = p.recruit("c02-member", "member");
    let g = p.recruit("c02-rotated", "member");
    p.ok(
        "an enrolled agent's call is its own",
        Some(&b),
        "whoami",
        json!({}),
    );
    p.refused(
        "a member creating a task (a coordinator's verb) is refused",
        Some(&b),
        "task_create",
        json!({"room": "lobby", "title": "not mine to create"}),
        "tier_insufficient",
        Some("lobby"),
    );
    p.ok(
        "the owner denies the verb say",
        None,
        "agent_policy",
        json!({"name": "c02-rotated", "deny": ["say"]}),
    );
    p.catch_up(&g, "lobby");
    p.refused(
        "a denied verb is refused",
        Some(&g),
        "say",
        json!({"room": "lobby", "text": "denied"}),
        "verb_denied",
        Some("lobby"),
    );
    p.ok(
        "the owner allows it again",
        None,
        "agent_policy",
        json!({"name": "c02-rotated", "allow": ["say"]}),
    );
    let rotated = p.ok(
        "the owner rotates the credential",
        None,
        "agent_rotate",
        json!({"name": "c02-rotated"}),
    );
    p.refused(
        "the old credential is refused on its next call",
        Some(&g),
        "whoami",
        json!({}),
        "credential_revoked",
        None,
    );
    if let Some(new) = rotated.and_then(|r| r["token"].as_str().map(String::from)) {
        p.ok("the new credential works", Some(&new), "whoami", json!({}));
        p.ok(
            "the owner revokes it",
            None,
            "agent_revoke",
            json!({"name": "c02-rotated"}),
        );
        p.refused(
            "a revoked credential is refused on its next call",
            Some(&new),
            "whoami",
            json!({}),
            "credential_revoked",
            None,
        );
    }
    p.refused(
        "no credential is no principal",
        None,
        "say",
        json!({"room": "lobby", "text": "who?"}),
        "credential_invalid",
        Some("lobby"),
    );
    vec!["native conversation binding inside each MCP host (tests/mcp proves Room's side)"]
}

/// 04-C05: each of the nine participant verbs, called blind, is refused with the unread
/// page and writes nothing; read and confirmed, the same call goes through.
pub(super) fn c05(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    let b = p.recruit("c05-reader", "member");
    p.recruit("c05-other", "member");
    // a task for beta and an obligation on it, then news beta has not read
    p.catch_up(&a, "build");
    let task = p
        .ok(
            "alpha creates a task for the reader",
            Some(&a),
            "task_create",
            json!({"room": "build", "title": "the gate's task", "to": "c05-reader"}),
        )
        .and_then(|t| t["task"]["id"].as_str().map(String::from))
        .unwrap_or_default();
    p.catch_up(&a, "build");
    let sent = p
        .ok(
            "alpha sends it to the reader",
            Some(&a),
            "send",
            json!({"room": "build", "to": ["c05-reader"], "task": task, "text": "@c05-reader the gate's task"}),
        )
        .unwrap_or_default();
    let source = sent["event"].as_str().unwrap_or_default().to_string();
    let obligation = sent["obligations"][0]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let blind: [(&str, Value); 9] = [
        ("say", json!({"room": "build", "text": "blind"})),
        ("note", json!({"room": "build", "text": "blind"})),
        (
            "reply",
            json!({"room": "build", "reply_to": source, "text": "blind"}),
        ),
        (
            "send",
            json!({"room": "build", "to": ["alpha"], "task": task, "text": "@alpha blind"}),
        ),
        (
            "handoff",
            json!({"room": "build", "task": task, "to": ["c05-other"]}),
        ),
        ("done", json!({"room": "build", "task": task})),
        (
            "blocked",
            json!({"room": "build", "task": task, "text": "blind"}),
        ),
        (
            "decline",
            json!({"room": "build", "task": task, "text": "blind"}),
        ),
        ("circle", json!({"room": "build", "obligation": obligation})),
    ];
    for (verb, args) in blind {
        let r = p.refused(
            &format!("{verb}, called blind, is refused with the unread page"),
            Some(&b),
            verb,
            args,
            "room_sync_required",
            Some("build"),
        );
        if let Some(r) = r
            && r.detail["next_page"]["receipt"].as_str().is_none()
        {
            p.record(
                format!("{verb}'s refusal carries the page to read"),
                false,
                "no next_page",
            );
        }
    }
    p.catch_up(&b, "build");
    p.ok(
        "read and confirmed, the reply goes through",
        Some(&b),
        "reply",
        json!({"room": "build", "reply_to": source, "text": "read it, on it"}),
    );
    vec!["recursive causal-parent confirmation of each cited parent across rooms"]
}

/// 04-C06: each verb does one thing; a call that would blur two is refused naming which.
pub(super) fn c06(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    let b = p.recruit("c06-reader", "member");
    p.catch_up(&a, "build");
    let task = p
        .ok(
            "a task to speak about",
            Some(&a),
            "task_create",
            json!({"room": "build", "title": "the verbs' task", "to": "c06-reader"}),
        )
        .and_then(|t| t["task"]["id"].as_str().map(String::from))
        .unwrap_or_default();
    p.catch_up(&a, "build");
    p.refused(
        "a note (status) may not mention anyone",
        Some(&a),
        "note",
        json!({"room": "build", "text": "@c06-reader look"}),
        "note_mentions_refused",
        Some("build"),
    );
    p.refused(
        "a say (conversation) does not carry a task",
        Some(&a),
        "say",
        json!({"room": "build", "text": "about it", "task": task}),
        "say_task_refused",
        Some("build"),
    );
    p.refused(
        "a send (assignment) in a project room names its task",
        Some(&a),
        "send",
        json!({"room": "build", "to": ["c06-reader"], "text": "@c06-reader do something"}),
        "send_task_required",
        Some("build"),
    );
    let said = p
        .ok(
            "alpha says something to nobody in particular",
            Some(&a),
            "say",
            json!({"room": "build", "text": "a plain remark"}),
        )
        .and_then(|v| v["event"].as_str().map(String::from))
        .unwrap_or_default();
    p.catch_up(&b, "build");
    p.refused(
        "a reply (response) answers only what was addressed to its author",
        Some(&b),
        "reply",
        json!({"room": "build", "reply_to": said, "text": "not asked"}),
        "reply_target_not_addressed",
        Some("build"),
    );
    p.ok(
        "a note (status) writes without waking anyone",
        Some(&a),
        "note",
        json!({"room": "build", "text": "status: fine"}),
    );
    vec![
        "successor tasks and their acknowledgments",
        "cross-room evidence (`cross_room_evidence_refused`)",
    ]
}

/// 04-C07: a permit sealed at send is checked again at dispatch: a routed worker is woken and
/// replies; a rotated recipient, a passed deadline, a closed admission and a finished task
/// are each refused at dispatch with their code, and the obligation stays open.
pub(super) fn c07(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    p.recruit("c07_worker", "member");
    p.catch_up(&a, "lobby");
    let task = p
        .ok(
            "a task for the worker in the coordination room",
            Some(&a),
            "task_create",
            json!({"room": "lobby", "title": "answer alpha", "to": "c07_worker"}),
        )
        .and_then(|t| t["task"]["id"].as_str().map(String::from))
        .unwrap_or_default();
    let ask = |p: &mut Prover, text: &str| -> String {
        p.catch_up(&a, "lobby");
        p.ok(
            "alpha asks the worker (a sealed permit)",
            Some(&a),
            "send",
            json!({"room": "lobby", "to": ["c07_worker"], "task": task, "text": format!("@c07_worker {text}")}),
        )
        .and_then(|v| v["event"].as_str().map(String::from))
        .unwrap_or_default()
    };
    p.set_config("[routes.c07_worker]\nadapter = \"script\"\nsteps = [\"read\", \"reply\"]\n");
    let source = ask(p, "which file first?");
    let w = p.wake_settled(&source);
    p.record(
        "a routed worker process is woken, revalidated, and replies",
        w["state"] == "replied",
        format!(
            "wake {} -> {}",
            w["path"].as_str().unwrap_or("?"),
            w["state"]
        ),
    );
    p.set_config("");
    let dead = |p: &mut Prover, what: &str, code: &str, source: &str| {
        let w = p.wake_settled(source);
        let got = w["dead_letter"]["code"]
            .as_str()
            .unwrap_or("none")
            .to_string();
        p.record(
            what,
            got == code,
            format!(
                "dead letter {got}: {}",
                w["dead_letter"]["reason"].as_str().unwrap_or("")
            ),
        );
    };
    let source = ask(p, "and the lexer?");
    p.ok(
        "the owner rotates the worker",
        None,
        "agent_rotate",
        json!({"name": "c07_worker"}),
    );
    dead(
        p,
        "a permit sealed before the recipient's rotation is refused at dispatch",
        "wake_recipient_registration_changed",
        &source,
    );
    p.set_config("[dispatch]\ntasked_deadline_ms = 1500\n");
    let source = ask(p, "still there?");
    std::thread::sleep(Duration::from_millis(1_600));
    dead(
        p,
        "a permit past its original deadline is refused (queue time counts)",
        "wake_job_expired",
        &source,
    );
    p.set_config("");
    let source = ask(p, "one more?");
    p.ok(
        "the owner closes the room's admission",
        None,
        "room_admission",
        json!({"room": "lobby", "open": false}),
    );
    dead(
        p,
        "a permit in a room whose admission closed is refused",
        "wake_admission_closed",
        &source,
    );
    p.ok(
        "the owner opens it again",
        None,
        "room_admission",
        json!({"room": "lobby", "open": true}),
    );
    let source = ask(p, "after a newcomer?");
    p.recruit("c07-newcomer", "member");
    dead(
        p,
        "a permit sealed before the roster changed is refused",
        "wake_room_authority_changed",
        &source,
    );
    // the task: a permit sealed for a task its owner then cancelled
    let t2 = p
        .ok(
            "a second task for the worker",
            Some(&a),
            "task_create",
            json!({"room": "lobby", "title": "answer beta", "to": "c07_worker"}),
        )
        .and_then(|t| t["task"]["id"].as_str().map(String::from))
        .unwrap_or_default();
    p.catch_up(&a, "lobby");
    let source = p
        .ok(
            "alpha asks the worker under the second task (a sealed permit)",
            Some(&a),
            "send",
            json!({"room": "lobby", "to": ["c07_worker"], "task": t2, "text": "@c07_worker and beta?"}),
        )
        .and_then(|v| v["event"].as_str().map(String::from))
        .unwrap_or_default();
    p.ok(
        "alpha cancels the second task",
        Some(&a),
        "task_cancel",
        json!({"task": t2}),
    );
    dead(
        p,
        "a permit whose task was cancelled is refused",
        "wake_task_authority_changed",
        &source,
    );
    tampered_permits(p, &ask, &dead);
    leaked_credential(p, &a);
    vec![
        "the split lock's own race (a permit changed between the claim's two reads): timing Room cannot force from outside",
        "a program other than the pinned ones inside the job (crates/room-server/tests/workers.rs covers it)",
        "a member removed (Room has no removal; the roster only grows)",
    ]
}

/// The binding and the path: with the daemon stopped, one permit's sealed fields are
/// rewritten in place, and two others are swapped, each then filed under the other's key
/// (the seed's queue path, which in Room is the permit's row key). At the restart each is
/// refused at dispatch (`wake_job_binding_changed`), whatever it says of itself.
fn tampered_permits(
    p: &mut Prover,
    ask: &dyn Fn(&mut Prover, &str) -> String,
    dead: &dyn Fn(&mut Prover, &str, &str, &str),
) {
    let rewritten = ask(p, "rewrite me?");
    let (first, second) = (ask(p, "swap me?"), ask(p, "and me?"));
    let db = p.state.control_db();
    let changed = p.restart(|| {
        let c = rusqlite::Connection::open(&db).map_err(std::io::Error::other)?;
        // each statement must change exactly one permit, or the card says so
        let one = |n: usize| {
            (n == 1)
                .then_some(())
                .ok_or_else(|| std::io::Error::other(format!("{n} permits changed, not one")))
        };
        one(c
            .execute(
                "UPDATE wakes SET permit = json_set(permit, '$.prompt', 'do something else') WHERE source_event = ?1",
                [&rewritten],
            )
            .map_err(std::io::Error::other)?)?;
        let permit = |e: &str| -> rusqlite::Result<String> {
            c.query_row("SELECT permit FROM wakes WHERE source_event = ?1", [e], |r| r.get(0))
        };
        let (a, b) = (
            permit(&first).map_err(std::io::Error::other)?,
            permit(&second).map_err(std::io::Error::other)?,
        );
        for (e, pm) in [(&first, &b), (&second, &a)] {
            one(c
                .execute("UPDATE wakes SET permit = ?1 WHERE source_event = ?2", [pm, e])
                .map_err(std::io::Error::other)?)?;
        }
        Ok(())
    });
    p.record(
        "with the daemon stopped, one permit's prompt is rewritten and two permits swapped",
        changed.is_ok(),
        changed.map_or_else(|e| e.to_string(), |()| "control.db changed".into()),
    );
    dead(
        p,
        "a permit whose sealed fields were rewritten is refused (binding)",
        "wake_job_binding_changed",
        &rewritten,
    );
    dead(
        p,
        "a permit filed under another permit's key is refused (path)",
        "wake_job_binding_changed",
        &first,
    );
    dead(
        p,
        "and so is the other one",
        "wake_job_binding_changed",
        &second,
    );
}

/// The claim's worker binding: a running launch's one-launch credential, carried out of its
/// job by a hostile worker (`leak`), is refused on the owner's socket and by the launch's own
/// broker (the peer is no process of the job), changing nothing; once the launch is
/// stopped it is revoked.
fn leaked_credential(p: &mut Prover, a: &str) {
    p.recruit("c07_leaker", "member");
    p.ok(
        "the owner opens a room for a hostile worker",
        None,
        "room_create",
        json!({"name": "c07-leak", "members": ["alpha", "c07_leaker"]}),
    );
    p.ok(
        "the owner routes c07_leaker to a scripted worker that leaks its credential (leak, hang)",
        None,
        "route_set",
        json!({"agent": "c07_leaker", "route": {"adapter": "script", "steps": ["leak", "hang"]}}),
    );
    p.catch_up(a, "c07-leak");
    let source = p
        .ok(
            "alpha asks the leaking worker",
            Some(a),
            "send",
            json!({"room": "c07-leak", "to": ["c07_leaker"], "text": "@c07_leaker work"}),
        )
        .and_then(|v| v["event"].as_str().map(String::from))
        .unwrap_or_default();
    let workers = p.state.root.join("workers");
    let mut found = None;
    for _ in 0..600 {
        let w = p
            .call(None, "wakes_list", json!({"room": "c07-leak"}))
            .result
            .unwrap_or_default();
        let launch = w["wakes"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["source_event"] == source.as_str()))
            .filter(|w| w["launches"][0]["state"] == "running")
            .and_then(|w| w["launches"][0]["launch"].as_str().map(String::from));
        if let Some(l) = launch
            && let Ok(t) =
                std::fs::read_to_string(workers.join(&l).join(crate::agent_script::LEAKED))
            && t.starts_with("room_wrk_")
        {
            found = Some((l, t));
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let Some((launch, token)) = found else {
        p.record(
            "the leaking worker runs and leaves its credential",
            false,
            "no running launch left a credential in 30 s",
        );
        p.call(None, "room_cancel", json!({"room": "c07-leak"}));
        return;
    };
    p.record(
        "the leaking worker runs and leaves its credential",
        true,
        format!("launch {launch}"),
    );
    p.refused(
        "its credential on the owner's socket, while its launch runs",
        Some(&token),
        "note",
        json!({"room": "c07-leak", "text": "from outside the job"}),
        "launch_credential_outside_broker",
        Some("c07-leak"),
    );
    let before = p.tip("c07-leak");
    let seen = broker_call(&workers.join(&launch).join("broker.sock"), &token);
    let after = p.tip("c07-leak");
    p.record(
        "its credential on its own broker, from a process outside the job",
        seen["refusal"]["code"] == "broker_peer_refused"
            && seen["refusal"]["detail"]["reason"] == "outside_job"
            && before == after,
        format!(
            "{} ({}), journal still at seq {after}",
            seen["refusal"]["code"].as_str().unwrap_or("not refused"),
            seen["refusal"]["detail"]["reason"].as_str().unwrap_or("?")
        ),
    );
    p.ok(
        "the owner cancels the room (its worker is stopped)",
        None,
        "room_cancel",
        json!({"room": "c07-leak"}),
    );
    for _ in 0..600 {
        let w = p
            .call(None, "wakes_list", json!({"room": "c07-leak"}))
            .result
            .unwrap_or_default();
        if w["wakes"][0]["launches"][0]["state"] == "ended" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    p.refused(
        "once its launch ended, the credential is revoked",
        Some(&token),
        "whoami",
        json!({}),
        "credential_revoked",
        Some("c07-leak"),
    );
}

/// One request on a launch's broker socket from this process (outside the launch's job).
fn broker_call(socket: &std::path::Path, token: &str) -> Value {
    use std::io::{BufRead, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return json!({"refusal": {"code": "no broker socket"}});
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let req = json!({"op": "whoami", "token": token, "args": {}});
    let _ = s.write_all(format!("{req}\n").as_bytes());
    let mut line = String::new();
    let _ = std::io::BufReader::new(&s).read_line(&mut line);
    serde_json::from_str(&line).unwrap_or(json!({"refusal": {"code": "no answer"}}))
}
