//! A busy room through the daemon: `read_through` (read and act in one call), the delta page a
//! refusal carries, and the turnstile's bounded waits, each refusal checked to change nothing.

mod common;

use common::*;
use room_server::client::Client;
use serde_json::json;

#[test]
fn a_read_through_say_lands_in_one_call_and_its_refusal_carries_the_delta() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    let page = fx.ok(Some(&a), "sync", json!({"room": "coord"}));
    let before = fx.tip("coord");
    fx.ok(
        Some(&a),
        "say",
        json!({"room": "coord", "text": "hello", "read_through": page["receipt"]}),
    );
    assert_eq!(fx.tip("coord"), before + 1, "one call, one turn");
    // beta reads and speaks; alpha's read is stale now
    let bp = fx.ok(Some(&b), "sync", json!({"room": "coord"}));
    let read = fx.ok(Some(&a), "sync", json!({"room": "coord"}));
    fx.ok(
        Some(&b),
        "say",
        json!({"room": "coord", "text": "news", "read_through": bp["receipt"]}),
    );
    let r = fx.refuse(
        Some(&a),
        "say",
        json!({"room": "coord", "text": "reply", "read_through": read["receipt"]}),
        "room_sync_required",
    );
    let delta = &r.detail["next_page"];
    assert_eq!(delta["continues"], read["receipt"]);
    assert_eq!(delta["items"].as_array().unwrap().len(), 1, "only the news");
    assert!(r.hint.as_deref().unwrap_or("").contains("read_through"));
    fx.ok(
        Some(&a),
        "say",
        json!({"room": "coord", "text": "reply", "read_through": delta["receipt"]}),
    );
    // through the multiplexer too, with a receipt that is not the caller's
    let theirs = fx.ok(Some(&b), "sync", json!({"room": "coord"}));
    fx.refuse(
        Some(&a),
        "room",
        json!({"action": "say", "room": "coord", "text": "x", "read_through": theirs["receipt"]}),
        "receipt_unknown",
    );
}

#[test]
fn a_full_turnstile_and_a_wait_past_its_bound_are_refused_and_change_nothing() {
    let mut fx = Fx::new();
    let (a, b, c) = fx.team("coord");
    fx.write_config("[gate]\nturn_queue_max = 1\nturn_slot_ms = 60000\nturn_wait_ms_max = 1000\n");
    // alpha acts without reading: sent back, and the room's next slot is held for its retry
    fx.refuse(
        Some(&a),
        "say",
        json!({"room": "coord", "text": "unread"}),
        "room_sync_required",
    );
    let before = fx.snapshot();
    let socket = fx.daemon.socket.clone();
    let waiter = std::thread::spawn(move || {
        let mut client = Client::connect(&socket).unwrap();
        let started = std::time::Instant::now();
        let r = client
            .call(&request(
                Some(&b),
                "say",
                json!({"room": "coord", "text": "waits"}),
            ))
            .unwrap();
        (r, started.elapsed())
    });
    // beta now waits in the queue (of one): gamma finds it full
    std::thread::sleep(std::time::Duration::from_millis(300));
    let full = fx.refuse(
        Some(&c),
        "say",
        json!({"room": "coord", "text": "no room"}),
        "room_turn_queue_exceeded",
    );
    assert_eq!(full.detail["reason"], "queue_full");
    let (r, waited) = waiter.join().unwrap();
    let refusal = expect_code(r, "room_turn_queue_exceeded", "beta's wait");
    assert_eq!(refusal.detail["reason"], "waited");
    assert!(
        waited >= std::time::Duration::from_millis(1000),
        "it waited its bound"
    );
    assert_eq!(fx.snapshot(), before, "neither refusal changed anything");
}
