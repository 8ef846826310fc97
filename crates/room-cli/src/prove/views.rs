//! The cards of the claims about what a reader sees: immutable scope bindings and the
//! withholding closure (04-C03), and checkpoints bound to conversation and view (04-C04).

use super::{Cast, Prover};
use serde_json::{Value, json};

/// Every item `token` reads in `room` from its checkpoint on, confirming page by page.
fn read_all(p: &mut Prover, token: &str, room: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut confirm: Option<String> = None;
    for _ in 0..1_000 {
        let page = p
            .call(
                Some(token),
                "sync",
                json!({"room": room, "confirm": confirm}),
            )
            .result
            .unwrap_or_default();
        let got = page["items"].as_array().cloned().unwrap_or_default();
        let empty = got.is_empty();
        items.extend(got);
        if confirm.is_some() && page["more"] != true && empty {
            break;
        }
        confirm = page["receipt"].as_str().map(String::from);
        if confirm.is_none() {
            break;
        }
    }
    items
}

fn event_of(v: Option<Value>) -> String {
    v.and_then(|v| v["event"].as_str().map(String::from))
        .unwrap_or_default()
}

/// 04-C03: a room's binding never changes; an event for an audience is withheld from every
/// other reader, and so is everything that cites it; a withheld event cannot be named or
/// addressed past; a composition reads as its reader does and confers no authority.
pub(super) fn c03(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    let b = p.recruit("c03-insider", "member");
    let d = p.recruit("c03-outsider", "member");
    rebinds(p);
    p.ok(
        "a coordination room of its own",
        None,
        "room_create",
        json!({"name": "shards", "members": ["alpha", "c03-insider", "c03-outsider"]}),
    );
    for t in [&a, &b, &d] {
        p.catch_up(t, "shards");
    }
    let secret = event_of(p.ok(
        "alpha says something for the insider only",
        Some(&a),
        "say",
        json!({"room": "shards", "text": "only for the insider", "audience": ["c03-insider"]}),
    ));
    p.ok(
        "a withheld event holds no one at the gate",
        Some(&d),
        "note",
        json!({"room": "shards", "text": "working"}),
    );
    p.catch_up(&b, "shards");
    let answer = event_of(p.ok(
        "the insider answers it (the answer inherits its audience)",
        Some(&b),
        "say",
        json!({"room": "shards", "text": "ack", "reply_to": secret}),
    ));
    p.catch_up(&a, "shards");
    p.ok(
        "alpha writes for all",
        Some(&a),
        "note",
        json!({"room": "shards", "text": "for everyone"}),
    );
    let seen = read_all(p, &d, "shards");
    let text = serde_json::to_string(&seen).unwrap_or_default();
    let leaked = [
        secret.as_str(),
        answer.as_str(),
        "only for the insider",
        "ack\"",
    ]
    .iter()
    .filter(|s| text.contains(*s))
    .count();
    p.record(
        "the outsider reads neither the event nor its descendant",
        leaked == 0 && text.contains("for everyone"),
        format!("{} items read, {leaked} withheld things seen", seen.len()),
    );
    p.refused(
        "naming a withheld event is refused as naming nothing",
        Some(&d),
        "say",
        json!({"room": "shards", "text": "me too", "reply_to": secret}),
        "invalid_argument",
        Some("shards"),
    );
    p.catch_up(&a, "shards");
    p.refused(
        "a turn cannot address anyone outside its audience",
        Some(&a),
        "send",
        json!({"room": "shards", "text": "do it", "to": ["c03-outsider"], "audience": ["c03-insider"]}),
        "audience_excludes_recipient",
        Some("shards"),
    );
    p.refused(
        "a composition across a project room and a coordination room is refused",
        Some(&b),
        "room_compose",
        json!({"rooms": ["build", "lobby"]}),
        "incomplete_source_set",
        None,
    );
    grants(p, &b);
    vec!["exports: Room has no export beyond a composition's pages"]
}

/// Several rooms are read composed only under the owner's grant, which a revocation ends at
/// the next page; a composition still reads as the reader does (the outsider's view above).
fn grants(p: &mut Prover, b: &str) {
    p.ok(
        "a second coordination room the insider reads",
        None,
        "room_create",
        json!({"name": "shards2", "members": ["alpha", "c03-insider"]}),
    );
    let both = json!({"rooms": ["shards", "shards2"], "limit": 1});
    p.refused(
        "reading two rooms composed without the owner's grant is refused",
        Some(b),
        "room_compose",
        both.clone(),
        "composition_not_granted",
        None,
    );
    let id = p
        .ok(
            "the owner grants the insider the two rooms composed",
            None,
            "compose_grant",
            json!({"agent": "c03-insider", "rooms": ["shards", "shards2"]}),
        )
        .and_then(|g| g["id"].as_str().map(str::to_string))
        .unwrap_or_default();
    let first = p.ok(
        "the insider reads them composed, a page at a time",
        Some(b),
        "room_compose",
        both.clone(),
    );
    p.ok(
        "the owner revokes the grant",
        None,
        "compose_revoke",
        json!({"id": id}),
    );
    let mut next = both;
    next["cursor"] = first.map(|f| f["next"].clone()).unwrap_or_default();
    p.refused(
        "the next page after the revocation is refused",
        Some(b),
        "room_compose",
        next,
        "composition_not_granted",
        None,
    );
}

/// A room's binding is fixed at creation: creating it again under another binding is refused.
fn rebinds(p: &mut Prover) {
    let other = p.root.join("project2");
    let _ = std::fs::create_dir_all(&other);
    let pid2 = p
        .ok(
            "the owner opens a second project",
            None,
            "project_open",
            json!({"path": other.to_string_lossy(), "name": "prove2"}),
        )
        .and_then(|v| v["id"].as_str().map(String::from))
        .unwrap_or_default();
    p.refused(
        "a coordination room cannot be bound to a project",
        None,
        "room_create",
        json!({"name": "lobby", "project": pid2}),
        "graph_project_rebind_refused",
        Some("lobby"),
    );
    p.refused(
        "a project room cannot become a coordination room",
        None,
        "room_create",
        json!({"name": "build"}),
        "graph_project_rebind_refused",
        Some("build"),
    );
    p.refused(
        "a project room cannot move to another project",
        None,
        "room_create",
        json!({"name": "build", "project": pid2}),
        "graph_project_rebind_refused",
        Some("build"),
    );
}

/// 04-C04: a receipt is its reader's, in its conversation and view: a reset, a new
/// credential and a changed delivery policy each make an earlier reading stale, and a receipt
/// of another reader or conversation is unknown.
pub(super) fn c04(p: &mut Prover, cast: &Cast) -> Vec<&'static str> {
    let a = cast.alpha.clone();
    let b = p.recruit("c04-reader", "member");
    let e = p.recruit("c04-other", "member");
    p.ok(
        "a room of its own",
        None,
        "room_create",
        json!({"name": "sync4", "members": ["alpha", "c04-reader", "c04-other"]}),
    );
    let old = receipt(p, &b);
    p.catch_up(&b, "sync4");
    p.ok(
        "the owner resets the room's view",
        None,
        "room_reset",
        json!({"room": "sync4"}),
    );
    p.refused(
        "a turn on the view before the reset is refused",
        Some(&b),
        "say",
        json!({"room": "sync4", "text": "after reset"}),
        "room_sync_view_changed",
        Some("sync4"),
    );
    p.refused(
        "a receipt of the view before the reset is refused",
        Some(&b),
        "sync",
        json!({"room": "sync4", "confirm": old}),
        "room_sync_view_changed",
        None,
    );
    p.catch_up(&b, "sync4");
    p.ok(
        "read again, the turn goes through",
        Some(&b),
        "say",
        json!({"room": "sync4", "text": "read it again"}),
    );
    let theirs = receipt(p, &e);
    p.refused(
        "another reader's receipt is unknown to this one",
        Some(&b),
        "sync",
        json!({"room": "sync4", "confirm": theirs}),
        "receipt_unknown",
        None,
    );
    let mine = receipt(p, &b);
    let other = p.call_in(
        Some(&b),
        Some("another-conversation"),
        "sync",
        json!({"room": "sync4", "confirm": mine}),
    );
    let code = other.refusal.map(|r| r.code.as_str().to_string());
    p.record(
        "its own receipt confirmed from another conversation is unknown",
        code.as_deref() == Some("receipt_unknown"),
        format!("{code:?}"),
    );
    let before = receipt(p, &e);
    p.catch_up(&e, "sync4");
    let rotated = p
        .ok(
            "the owner rotates a reader's credential",
            None,
            "agent_rotate",
            json!({"name": "c04-other"}),
        )
        .and_then(|v| v["token"].as_str().map(String::from))
        .unwrap_or_default();
    p.refused(
        "under its new credential, its old reading is stale",
        Some(&rotated),
        "sync",
        json!({"room": "sync4", "confirm": before}),
        "room_sync_view_changed",
        None,
    );
    policy(p, &a, &b);
    rotation(p, &a);
    fork(p, &a, &b);
    vec!["a fork the daemon meets while it runs (a journal is checked when it is opened)"]
}

/// A room of `members` with three turns by alpha; its graph id.
fn room_with_turns(p: &mut Prover, a: &str, name: &str, members: &[&str]) -> String {
    let g = p
        .ok(
            &format!("a room {name} with three turns"),
            None,
            "room_create",
            json!({"name": name, "members": members}),
        )
        .and_then(|v| v["graph_id"].as_str().map(String::from))
        .unwrap_or_default();
    for i in 0..3 {
        p.catch_up(a, name);
        p.call(
            Some(a),
            "note",
            json!({"room": name, "text": format!("turn {i}")}),
        );
    }
    g
}

/// A journal replaced by a copy of itself while the daemon was stopped is a rotation: the
/// room is read-only until the owner rebuilds, after which every reader reads again.
fn rotation(p: &mut Prover, a: &str) {
    let g = room_with_turns(p, a, "rotated", &["alpha"]);
    let journal = p.state.shard(&g).journal();
    let swapped = p.restart(|| {
        // the copy is written beside the original first, so it cannot reuse its inode
        let copy = journal.with_extension("copy");
        std::fs::write(&copy, std::fs::read(&journal)?)?;
        std::fs::rename(&copy, &journal)
    });
    p.record(
        "the daemon restarts over a journal replaced by a copy of itself",
        swapped.is_ok(),
        format!("{swapped:?}"),
    );
    p.catch_up(a, "rotated");
    p.refused(
        "a write to the rotated journal is refused",
        Some(a),
        "note",
        json!({"room": "rotated", "text": "after the swap"}),
        "room_sync_journal_rotated",
        Some("rotated"),
    );
    p.ok(
        "the owner rebuilds the room's index from the journal",
        None,
        "index_rebuild",
        json!({"room": "rotated"}),
    );
    p.refused(
        "a reading from before the rebuild is stale",
        Some(a),
        "note",
        json!({"room": "rotated", "text": "stale"}),
        "room_sync_view_changed",
        Some("rotated"),
    );
    p.catch_up(a, "rotated");
    p.ok(
        "read again, the write goes through",
        Some(a),
        "note",
        json!({"room": "rotated", "text": "read again"}),
    );
}

/// A journal cut back to its first record while the daemon was stopped is a fork: the room is
/// quarantined until the owner accepts the loss, and a receipt of the lost tip is refused.
fn fork(p: &mut Prover, a: &str, b: &str) {
    let g = room_with_turns(p, a, "forked", &["alpha", "c04-reader"]);
    let stale = p
        .call(Some(b), "sync", json!({"room": "forked"}))
        .result
        .and_then(|v| v["receipt"].as_str().map(String::from))
        .unwrap_or_default();
    let journal = p.state.shard(&g).journal();
    let cut = p.restart(|| {
        let bytes = std::fs::read(&journal)?;
        let first = bytes.iter().position(|&c| c == b'\n').map_or(0, |i| i + 1);
        let side = journal.with_extension("cut");
        std::fs::write(&side, &bytes[..first])?;
        std::fs::rename(&side, &journal)
    });
    p.record(
        "the daemon restarts over a journal cut back to its first record",
        cut.is_ok(),
        format!("{cut:?}"),
    );
    p.refused(
        "a write to a room whose acknowledged records are missing is refused",
        Some(a),
        "note",
        json!({"room": "forked", "text": "after the cut"}),
        "room_quarantined",
        Some("forked"),
    );
    p.refused(
        "a rebuild that would write over the loss is refused",
        None,
        "index_rebuild",
        json!({"room": "forked"}),
        "journal_loss_unaccepted",
        Some("forked"),
    );
    p.ok(
        "the owner accepts the loss",
        None,
        "index_rebuild",
        json!({"room": "forked", "accept_loss": true}),
    );
    p.refused(
        "a receipt of the lost tip is refused as a fork",
        Some(b),
        "sync",
        json!({"room": "forked", "confirm": stale}),
        "room_sync_receipt_forked",
        None,
    );
    p.catch_up(b, "forked");
    p.ok(
        "read again, the reader writes",
        Some(b),
        "note",
        json!({"room": "forked", "text": "read again"}),
    );
}

/// A fresh receipt of `token`'s next page in `sync4` (not confirmed).
fn receipt(p: &mut Prover, token: &str) -> String {
    p.call(Some(token), "sync", json!({"room": "sync4"}))
        .result
        .and_then(|v| v["receipt"].as_str().map(String::from))
        .unwrap_or_default()
}

/// A page delivered under one redaction policy cannot be confirmed under another.
fn policy(p: &mut Prover, a: &str, b: &str) {
    p.catch_up(a, "sync4");
    p.catch_up(b, "sync4");
    p.ok(
        "alpha says a code",
        Some(a),
        "say",
        json!({"room": "sync4", "text": "the code is secret-123"}),
    );
    let read = receipt(p, b);
    p.set_config("[redaction]\npatterns = [\"secret-[0-9]+\"]\n");
    std::thread::sleep(std::time::Duration::from_millis(2_100));
    p.refused(
        "a page read before the owner's redaction changed is refused",
        Some(b),
        "sync",
        json!({"room": "sync4", "confirm": read}),
        "room_sync_delivery_policy_changed",
        None,
    );
    p.set_config("");
    std::thread::sleep(std::time::Duration::from_millis(2_100));
}
