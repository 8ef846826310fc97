//! A journal replaced behind the daemon's back by a shorter chain: it lacks acknowledged
//! records, so the room is quarantined (`room_quarantined`), a rebuild is refused
//! (`journal_loss_unaccepted`) until the owner accepts the loss, which is then recorded in the
//! journal (`journal_loss`), and a receipt whose tip the accepted journal no longer holds is
//! `room_sync_receipt_forked`.

use room_server::client::Client;
use room_server::daemon::Background;
use room_server::wire::{Request, Response};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn call(sock: &Path, token: Option<&str>, op: &str, args: Value) -> Response {
    let req = Request {
        op: op.into(),
        token: token.map(String::from),
        conversation: None,
        tier: None,
        args,
        meta: None,
        page_bytes_max: None,
    };
    Client::connect(sock).unwrap().call(&req).unwrap()
}

fn ok(sock: &Path, token: Option<&str>, op: &str, args: Value) -> Value {
    let r = call(sock, token, op, args);
    assert!(r.ok, "{op}: {:?}", r.refusal);
    r.result.unwrap()
}

fn code(r: &Response) -> &str {
    r.refusal
        .as_ref()
        .map(|r| r.code.as_str())
        .unwrap_or("none")
}

fn catch_up(sock: &Path, token: &str, room: &str) {
    let mut confirm: Option<String> = None;
    loop {
        let page = ok(
            sock,
            Some(token),
            "sync",
            json!({"room": room, "confirm": confirm}),
        );
        if page["items"].as_array().unwrap().is_empty() {
            return;
        }
        confirm = page["receipt"].as_str().map(String::from);
    }
}

fn journal_of(state: &Path) -> PathBuf {
    std::fs::read_dir(state.join("rooms"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("EVENTS.jsonl")
}

#[test]
fn a_shorter_replaced_journal_is_quarantined_until_its_loss_is_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let (state, boot) = (root.join("state"), root.join("boot.toml"));
    room_store::statedir::init(&state, &boot, "journal-test").unwrap();

    let d = Background::start(&state, &boot).unwrap();
    let sock = d.socket.clone();
    let token = ok(&sock, None, "agent_enroll", json!({"name": "alpha"}))["token"]
        .as_str()
        .unwrap()
        .to_string();
    let other = ok(&sock, None, "agent_enroll", json!({"name": "beta"}))["token"]
        .as_str()
        .unwrap()
        .to_string();
    ok(
        &sock,
        None,
        "room_create",
        json!({"name": "r", "members": ["alpha", "beta"]}),
    );
    catch_up(&sock, &token, "r");
    for i in 0..3 {
        ok(
            &sock,
            Some(&token),
            "note",
            json!({"room": "r", "text": format!("n{i}")}),
        );
    }
    // beta reads a page covering seq 1..4 and does not confirm it yet
    let page = ok(&sock, Some(&other), "sync", json!({"room": "r"}));
    assert_eq!(page["tip_seq"], 4);
    let stale_receipt = page["receipt"].as_str().unwrap().to_string();
    d.stop().unwrap();

    // Replace the journal by a shorter, still valid chain (its first record), as a new file.
    let journal = journal_of(&state);
    let text = std::fs::read_to_string(&journal).unwrap();
    let first = text.lines().next().unwrap().to_string() + "\n";
    let replacement = journal.with_file_name("replacement");
    std::fs::write(&replacement, &first).unwrap();
    std::fs::rename(&replacement, &journal).unwrap();

    let d = Background::start(&state, &boot).unwrap();
    let sock = d.socket.clone();
    let rooms = ok(&sock, None, "rooms", json!({}));
    assert!(rooms["rooms"][0]["read_only"].is_string(), "{rooms}");
    let r = call(
        &sock,
        Some(&token),
        "note",
        json!({"room": "r", "text": "after"}),
    );
    // the replacement lacks acknowledged records 2..=4: the room is quarantined
    assert_eq!(code(&r), "room_quarantined");
    let refusal = r.refusal.as_ref().unwrap();
    assert_eq!(
        refusal.detail["quarantine"]["missing"],
        json!([2, 4]),
        "{refusal:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&journal).unwrap(),
        first,
        "the refused note wrote nothing"
    );
    // a rebuild will not write over the loss without the owner's explicit acceptance
    let r = call(&sock, None, "index_rebuild", json!({"room": "r"}));
    assert_eq!(code(&r), "journal_loss_unaccepted");
    assert_eq!(
        std::fs::read_to_string(&journal).unwrap(),
        first,
        "the refused rebuild wrote nothing"
    );

    // The owner accepts the journal as it now is; receipts survive the rebuild, and the
    // acceptance is recorded as a `journal_loss` naming the missing range (seq 2), which
    // resets the view, in the accepted journal itself.
    let rebuilt = ok(
        &sock,
        None,
        "index_rebuild",
        json!({"room": "r", "accept_loss": true}),
    );
    assert_eq!(rebuilt["tip_seq"], 2);
    assert!(rebuilt["read_only"].is_null());
    assert_eq!(rebuilt["loss_accepted"]["missing_from"], 2);
    assert_eq!(rebuilt["loss_accepted"]["missing_to"], 4);
    let accepted = std::fs::read_to_string(&journal).unwrap();
    assert!(
        accepted.starts_with(&first)
            && accepted.contains("\"kind\":\"journal_loss\"")
            && accepted.contains("\"missing_from\":2")
            && accepted.contains("\"missing_to\":4")
    );
    let r = call(
        &sock,
        Some(&other),
        "sync",
        json!({"room": "r", "confirm": stale_receipt}),
    );
    assert_eq!(code(&r), "room_sync_receipt_forked");
    assert_eq!(
        std::fs::read_to_string(&journal).unwrap(),
        accepted,
        "the refused confirm wrote nothing"
    );

    // A checkpoint taken over the old chain does not carry over: the view was reset.
    let r = call(
        &sock,
        Some(&token),
        "note",
        json!({"room": "r", "text": "blind"}),
    );
    assert_eq!(code(&r), "room_sync_view_changed");
    // Work goes on from the accepted chain.
    catch_up(&sock, &other, "r");
    ok(
        &sock,
        Some(&other),
        "note",
        json!({"room": "r", "text": "carrying on"}),
    );
    d.stop().unwrap();
    let report = room_store::journal::verify(
        &journal,
        journal
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(report.records, 3);
}
