//! A room's view through a real daemon: the owner closes and opens its admission (while
//! closed no agent writes, reading goes on), and the view a checkpoint is bound to follows
//! admission and the reader and participant sets (a revocation or a tier change moves it), so a
//! reader reads the room again under the view it now has.

mod common;
use common::*;
use serde_json::json;

#[test]
fn a_closed_admission_refuses_every_agent_write_and_changes_nothing() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    let t = fx.task(&a, "coord", Some("beta"));
    fx.tasks.push(t.clone());
    fx.sync_all(&a, "coord");
    fx.sync_all(&b, "coord");
    let closed = fx.ok(
        None,
        "room_admission",
        json!({"room": "coord", "open": false}),
    );
    assert_eq!(closed["admission_open"], false);
    fx.refuse(
        None,
        "room_admission",
        json!({"room": "coord", "open": false}),
        "invalid_argument",
    );
    fx.refuse(
        None,
        "room_admission",
        json!({"room": "nowhere", "open": true}),
        "room_not_found",
    );
    fx.refuse(
        None,
        "room_admission",
        json!({"room": "coord", "open": "no"}),
        "invalid_argument",
    );
    // reading goes on (and the closure is part of the view: the reader reads it again)
    fx.sync_all(&a, "coord");
    fx.sync_all(&b, "coord");
    let writes = [
        (a.as_str(), "say", json!({"room": "coord", "text": "hello"})),
        (
            a.as_str(),
            "note",
            json!({"room": "coord", "text": "status"}),
        ),
        (
            a.as_str(),
            "task_create",
            json!({"room": "coord", "title": "t"}),
        ),
        (b.as_str(), "task_claim", json!({"task": t})),
        (
            a.as_str(),
            "task_amend",
            json!({"task": t, "requirements": ["R2"]}),
        ),
        (
            a.as_str(),
            "evidence_register",
            json!({"room": "coord", "origin": "https://example.org/a"}),
        ),
    ];
    for (token, op, args) in writes {
        let r = fx.refuse(Some(token), op, args, "room_admission_closed");
        assert_eq!(r.detail["room"], "coord");
    }
    fx.ok(
        None,
        "room_admission",
        json!({"room": "coord", "open": true}),
    );
    fx.sync_all(&a, "coord");
    fx.ok(
        Some(&a),
        "say",
        json!({"room": "coord", "text": "hello again"}),
    );
    fx.ok(Some(&b), "task_claim", json!({"task": t}));
}

#[test]
fn the_view_follows_admission_readers_and_participants() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    fx.sync_all(&a, "coord");
    fx.sync_all(&b, "coord");
    let view = |fx: &mut Fx, token: &str| {
        let page = fx.ok(Some(token), "sync", json!({"room": "coord"}));
        page["view_changed"].as_bool().unwrap()
    };
    assert!(!view(&mut fx, &a), "caught up, same view");
    // a participant drops to observer: the participant set moves
    fx.ok(
        None,
        "agent_policy",
        json!({"name": "gamma", "max_tier": "observer"}),
    );
    assert!(view(&mut fx, &a), "the participants changed");
    fx.sync_all(&a, "coord");
    assert!(!view(&mut fx, &a));
    // a reader is revoked: the reader set moves
    fx.ok(None, "agent_revoke", json!({"name": "gamma"}));
    assert!(view(&mut fx, &a), "the readers changed");
    fx.sync_all(&a, "coord");
    // admission closes and opens: each moves the view
    fx.ok(
        None,
        "room_admission",
        json!({"room": "coord", "open": false}),
    );
    assert!(view(&mut fx, &a), "admission closed");
    fx.sync_all(&a, "coord");
    fx.ok(
        None,
        "room_admission",
        json!({"room": "coord", "open": true}),
    );
    assert!(view(&mut fx, &a), "admission opened");
    // a change that is not about the view does not move it
    fx.sync_all(&a, "coord");
    fx.ok(Some(&a), "say", json!({"room": "coord", "text": "x"}));
    assert!(!view(&mut fx, &a));
}
