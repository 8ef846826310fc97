//! Dispatch revalidation through a real daemon: a queued permit is checked again against the
//! five authority centres, and one that fails is dead-lettered with its code (never retried)
//! while its obligation stays open. Also the permit's own shape: `not_after` is exactly
//! creation plus the deadline, and a `circle` binds the obligation it re-raises.

mod common;
use common::*;
use serde_json::{Value, json};

/// alpha sends to beta in `coord`; the permit of that send, from the queue.
fn sent(fx: &mut Fx, a: &str, extra: Value) -> Value {
    fx.sync_all(a, "coord");
    let mut args = json!({"room": "coord", "to": ["beta"], "text": "please look"});
    for (k, v) in extra.as_object().unwrap() {
        args[k] = v.clone();
    }
    let ev = fx.ok(Some(a), "send", args)["event"]
        .as_str()
        .unwrap()
        .to_string();
    permit(fx, &ev)
}

fn permit(fx: &mut Fx, source: &str) -> Value {
    let all = fx.ok(None, "wakes_list", json!({}));
    all["wakes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["source_event"] == source)
        .unwrap_or_else(|| panic!("no permit for {source}: {all}"))
        .clone()
}

/// Run a revalidation pass; the permit's state afterwards.
fn check(fx: &mut Fx, p: &Value) -> Value {
    fx.ok(None, "wakes_check", json!({}));
    permit(fx, p["source_event"].as_str().unwrap())
}

#[track_caller]
fn dead(fx: &mut Fx, p: &Value, code: &str) {
    let after = check(fx, p);
    assert_eq!(after["state"], "dead", "{after}");
    assert_eq!(after["dead_letter"]["code"], code, "{after}");
    assert_eq!(after["dead_letter"]["retry_allowed"], false);
}

fn beta_obligations(fx: &mut Fx, b: &str) -> usize {
    let page = fx.ok(Some(b), "sync", json!({"room": "coord"}));
    page["open_items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "obligation")
        .count()
}

#[test]
fn a_valid_permit_stays_queued_and_its_shape_is_exact() {
    let mut fx = Fx::new();
    let (a, _b, _) = fx.team("coord");
    let p = sent(&mut fx, &a, json!({}));
    assert_eq!(check(&mut fx, &p)["state"], "queued");
    let created = p["created_at"].as_str().unwrap();
    let deadline = p["deadline_ms"].as_u64().unwrap();
    assert_eq!(deadline, 60_000, "untasked");
    // the time of day of an RFC 3339 UTC text, in ms
    let ms = |s: &str| -> u64 {
        let t = &s[11..23];
        let (h, m, sec) = (&t[0..2], &t[3..5], &t[6..12]);
        let secs: f64 = sec.parse().unwrap();
        h.parse::<u64>().unwrap() * 3_600_000
            + m.parse::<u64>().unwrap() * 60_000
            + (secs * 1000.0).round() as u64
    };
    let after = ms(p["not_after"].as_str().unwrap());
    assert_eq!(
        (after + 86_400_000 - ms(created)) % 86_400_000,
        deadline,
        "not_after is created_at plus the deadline"
    );
    let grant = p["room_authority"]["owner_grant"].as_str().unwrap();
    assert!(grant.starts_with("coordination:"), "{grant}");
}

#[test]
fn wakes_show_prints_one_permit_by_its_path_and_refuses_a_path_that_names_none() {
    let mut fx = Fx::new();
    let (a, _b, _) = fx.team("coord");
    let p = sent(&mut fx, &a, json!({}));
    let path = p["path"].as_str().unwrap().to_string();
    assert!(path.starts_with("wakes/coord/beta/"), "{path}");
    let shown = fx.ok(None, "wakes_show", json!({"wake": path}))["wake"].clone();
    assert_eq!(shown, permit(&mut fx, p["source_event"].as_str().unwrap()));
    assert_eq!(shown["intact"], true);
    for bad in [
        "coord/beta/x.json",
        "wakes/coord/beta.json",
        "wakes/coord/beta/x/y.json",
        "wakes/../beta/x.json",
    ] {
        let r = fx.refuse(None, "wakes_show", json!({"wake": bad}), "invalid_argument");
        assert_eq!(r.detail["field"], "wake", "{bad}: {r}");
    }
    let gone = path.replace("/beta/", "/gamma/");
    fx.refuse(None, "wakes_show", json!({"wake": gone}), "not_found");
    fx.refuse(
        None,
        "wakes_show",
        json!({"wake": "wakes/nowhere/beta/x.json"}),
        "room_not_found",
    );
    fx.refuse(
        None,
        "wakes_show",
        json!({"path": path}),
        "invalid_argument",
    );
    // the owner's: an agent's credential is not the owner console
    fx.refuse(
        Some(&a),
        "wakes_show",
        json!({"wake": path}),
        "owner_required",
    );
}

#[test]
fn a_recipient_re_registered_after_sealing_is_dead_lettered_and_its_obligation_stays_open() {
    // the seed's Exhibit 2
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    let p = sent(&mut fx, &a, json!({}));
    let rotated = fx.ok(None, "agent_rotate", json!({"name": "beta"}));
    let b2 = rotated["token"].as_str().unwrap().to_string();
    dead(&mut fx, &p, "wake_recipient_registration_changed");
    let _ = b;
    assert_eq!(
        beta_obligations(&mut fx, &b2),
        1,
        "a dead wake answers nothing"
    );
    // a dead letter stays dead
    assert_eq!(check(&mut fx, &p)["state"], "dead");
}

#[test]
fn a_closed_admission_dead_letters_queued_permits() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    let p = sent(&mut fx, &a, json!({}));
    fx.ok(
        None,
        "room_admission",
        json!({"room": "coord", "open": false}),
    );
    // grant, session and reset are as sealed: it is centre 4 that refuses
    dead(&mut fx, &p, "wake_admission_closed");
}

#[test]
fn a_task_that_closed_after_sealing_is_wake_task_authority_changed() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    let t = fx.task(&a, "coord", Some("beta"));
    let p = sent(&mut fx, &a, json!({"task": t}));
    assert_eq!(p["deadline_ms"], 20 * 60_000, "tasked");
    fx.ok(Some(&b), "task_claim", json!({"task": t}));
    fx.sync_all(&b, "coord");
    fx.ok(Some(&b), "done", json!({"room": "coord", "task": t}));
    dead(&mut fx, &p, "wake_task_authority_changed");
}

#[test]
fn an_archived_room_or_a_reset_is_wake_room_authority_changed() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    let p = sent(&mut fx, &a, json!({}));
    fx.ok(None, "room_reset", json!({"room": "coord"}));
    dead(&mut fx, &p, "wake_room_authority_changed");
    let q = sent(&mut fx, &a, json!({}));
    assert_eq!(
        check(&mut fx, &q)["state"],
        "queued",
        "sealed after the reset"
    );
    fx.ok(None, "room_archive", json!({"room": "coord"}));
    dead(&mut fx, &q, "wake_room_authority_changed");
}

#[test]
fn a_circle_binds_the_obligation_it_re_raises_under_its_original_deadline() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    let first = sent(&mut fx, &a, json!({}));
    let obligation = first["obligation_ids"][0].as_str().unwrap().to_string();
    let _ = b;
    fx.sync_all(&a, "coord");
    let ev = fx.ok(
        Some(&a),
        "circle",
        json!({"room": "coord", "obligation": obligation, "text": "ping"}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string();
    let again = permit(&mut fx, &ev);
    assert_eq!(again["obligation_ids"], json!([obligation]));
    assert_eq!(
        again["not_after"], first["not_after"],
        "the original deadline"
    );
}
