//! Composition through a real daemon: several rooms read together in causal order, with the
//! intersection of their authority (a constituent that fails refuses the whole request,
//! `incomplete_source_set`), pages bound to a snapshot (`graph_page_snapshot_changed` when a
//! source moved), no execution authority (nothing is confirmed, the gate still holds), and
//! several rooms read only under the owner's grant (`composition_not_granted`).

mod common;
use common::*;
use serde_json::{Value, json};

/// alpha, beta and gamma in coordination rooms `one` and `two`; a few turns in each, in an
/// interleaved order.
fn rooms() -> (Fx, String, String, String) {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("one");
    fx.ok(
        None,
        "room_create",
        json!({"name": "two", "members": ["alpha", "beta", "gamma"]}),
    );
    for (i, room) in ["one", "two", "one", "two", "two"].iter().enumerate() {
        fx.sync_all(&a, room);
        fx.ok(
            Some(&a),
            "note",
            json!({"room": room, "text": format!("n{i}")}),
        );
    }
    // reading both composed is the owner's to grant (gamma holds no grant)
    for agent in ["alpha", "beta"] {
        fx.ok(
            None,
            "compose_grant",
            json!({"agent": agent, "rooms": ["one", "two"]}),
        );
    }
    (fx, a, b, g)
}

fn compose(fx: &mut Fx, token: &str, args: Value) -> Value {
    fx.ok(Some(token), "room_compose", args)
}

#[test]
fn rooms_read_together_in_causal_order_page_by_page() {
    let (mut fx, _a, b, _) = rooms();
    let all = compose(&mut fx, &b, json!({"rooms": ["two", "one"], "limit": 200}));
    assert_eq!(all["read_only"], true);
    assert_eq!(all["confers_execution"], false);
    assert_eq!(all["more"], false);
    let items = all["items"].as_array().unwrap();
    let tips = fx.tip("one") + fx.tip("two");
    assert_eq!(items.len() as u64, tips, "every event of both rooms");
    let notes: Vec<(&str, &str)> = items
        .iter()
        .filter(|i| i["kind"] == "turn")
        .map(|i| {
            (
                i["room"].as_str().unwrap(),
                i["event"]["text"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        notes,
        [
            ("one", "n0"),
            ("two", "n1"),
            ("one", "n2"),
            ("two", "n3"),
            ("two", "n4")
        ]
    );
    let hlcs: Vec<(u64, u64)> = items
        .iter()
        .map(|i| {
            let (ms, c) = i["hlc"].as_str().unwrap().split_once('.').unwrap();
            (ms.parse().unwrap(), c.parse().unwrap())
        })
        .collect();
    assert!(hlcs.windows(2).all(|w| w[0] <= w[1]), "causal order");
    // the same, two at a time
    let mut paged = Vec::new();
    let mut cursor = Value::Null;
    loop {
        let mut args = json!({"rooms": ["one", "two"], "limit": 2});
        if !cursor.is_null() {
            args["cursor"] = cursor.clone();
        }
        let page = compose(&mut fx, &b, args);
        let got = page["items"].as_array().unwrap();
        assert!(got.len() <= 2);
        paged.extend(got.iter().map(|i| i["id"].clone()));
        if page["more"] == false {
            assert!(page["next"].is_null());
            break;
        }
        cursor = page["next"].clone();
    }
    let ids: Vec<Value> = items.iter().map(|i| i["id"].clone()).collect();
    assert_eq!(paged, ids, "pages never skip or repeat an event");
}

#[test]
fn a_composition_confers_no_authority_to_act() {
    let (mut fx, a, b, _) = rooms();
    fx.sync_all(&b, "one");
    fx.ok(Some(&a), "note", json!({"room": "one", "text": "new"}));
    compose(&mut fx, &b, json!({"rooms": ["one", "two"], "limit": 200}));
    // beta read alpha's note through the composition, yet its own reading did not move
    fx.refuse(
        Some(&b),
        "say",
        json!({"room": "one", "text": "seen it"}),
        "room_sync_required",
    );
}

#[test]
fn incomplete_source_set_names_every_constituent_that_fails() {
    let (mut fx, a, b, _) = rooms();
    fx.ok(
        None,
        "room_create",
        json!({"name": "private", "members": ["alpha"]}),
    );
    let r = fx.refuse(
        Some(&b),
        "room_compose",
        json!({"rooms": ["one", "private", "ghost"]}),
        "incomplete_source_set",
    );
    let failed: Vec<&str> = r.detail["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["room"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["ghost", "private"]);
    // a constituent whose admission is closed
    fx.ok(
        None,
        "room_admission",
        json!({"room": "two", "open": false}),
    );
    let r = fx.refuse(
        Some(&b),
        "room_compose",
        json!({"rooms": ["one", "two"]}),
        "incomplete_source_set",
    );
    assert_eq!(r.detail["failed"][0]["code"], "room_admission_closed");
    fx.ok(None, "room_admission", json!({"room": "two", "open": true}));
    // rooms of different projects (here: a project room and a coordination room)
    let (_, pid) = fx.open_project("p1");
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta"]}),
    );
    let r = fx.refuse(
        Some(&b),
        "room_compose",
        json!({"rooms": ["one", "build"]}),
        "incomplete_source_set",
    );
    assert_eq!(r.detail["failed"][0]["code"], "project");
    // a reader denied sync reads nothing composed either
    fx.ok(
        None,
        "agent_policy",
        json!({"name": "alpha", "deny": ["sync"]}),
    );
    fx.refuse(
        Some(&a),
        "room_compose",
        json!({"rooms": ["one", "two"]}),
        "verb_denied",
    );
}

#[test]
fn a_source_that_moves_between_pages_is_graph_page_snapshot_changed() {
    let (mut fx, a, b, _) = rooms();
    let first = compose(&mut fx, &b, json!({"rooms": ["one", "two"], "limit": 1}));
    let next = first["next"].clone();
    assert!(next.is_object());
    // a cursor belongs to its request
    fx.refuse(
        Some(&b),
        "room_compose",
        json!({"rooms": ["one", "two"], "limit": 2, "cursor": next}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&a),
        "room_compose",
        json!({"rooms": ["one", "two"], "limit": 1, "cursor": next}),
        "invalid_argument",
    );
    fx.refuse(
        Some(&b),
        "room_compose",
        json!({"rooms": ["one", "two"], "limit": 1, "cursor": {"forged": true}}),
        "invalid_argument",
    );
    fx.sync_all(&a, "two");
    fx.ok(Some(&a), "note", json!({"room": "two", "text": "later"}));
    let r = fx.refuse(
        Some(&b),
        "room_compose",
        json!({"rooms": ["one", "two"], "limit": 1, "cursor": next}),
        "graph_page_snapshot_changed",
    );
    assert_eq!(r.detail["changed"], json!(["two"]));
    // starting again reads the new generation
    let again = compose(&mut fx, &b, json!({"rooms": ["one", "two"], "limit": 1}));
    assert!(again["next"].is_object());
}

#[test]
fn malformed_compositions_name_their_field() {
    let (mut fx, _a, b, _) = rooms();
    let nine: Vec<String> = (0..9).map(|i| format!("r{i}")).collect();
    for (args, field) in [
        (json!({"rooms": []}), "rooms"),
        (json!({"rooms": nine}), "rooms"),
        (json!({"rooms": ["one", "one"]}), "rooms"),
        (json!({"rooms": ["../one"]}), "rooms"),
        (json!({"rooms": ["one"], "limit": 0}), "limit"),
        (json!({"rooms": ["one"], "limit": 201}), "limit"),
        (json!({"rooms": "one"}), "rooms"),
    ] {
        let r = fx.refuse(Some(&b), "room_compose", args.clone(), "invalid_argument");
        assert_eq!(r.detail["field"], field, "{args}: {r}");
    }
}

#[test]
fn several_rooms_are_read_composed_only_under_the_owners_grant() {
    let (mut fx, a, _b, g) = rooms();
    // gamma reads both rooms, yet holds no grant to read them composed; one room needs none
    let r = fx.refuse(
        Some(&g),
        "room_compose",
        json!({"rooms": ["one", "two"]}),
        "composition_not_granted",
    );
    assert_eq!(r.detail["rooms"], json!(["one", "two"]));
    let one = compose(&mut fx, &g, json!({"rooms": ["one"]}));
    assert!(one["grant"].is_null());
    // a grant of other rooms does not cover these
    fx.ok(
        None,
        "room_create",
        json!({"name": "three", "members": ["alpha", "beta", "gamma"]}),
    );
    fx.ok(
        None,
        "compose_grant",
        json!({"agent": "gamma", "rooms": ["one", "three"]}),
    );
    fx.refuse(
        Some(&g),
        "room_compose",
        json!({"rooms": ["one", "two"]}),
        "composition_not_granted",
    );
    let granted = fx.ok(
        None,
        "compose_grant",
        json!({"agent": "gamma", "rooms": ["two", "one"]}),
    );
    assert_eq!(granted["rooms"], json!(["one", "two"]));
    let id = granted["id"].as_str().unwrap().to_string();
    let first = compose(&mut fx, &g, json!({"rooms": ["one", "two"], "limit": 1}));
    assert_eq!(first["grant"], id.as_str());
    // revoked: the export ends at its next page
    let revoked = fx.ok(None, "compose_revoke", json!({"id": id}));
    assert_eq!(revoked["changed"], true);
    let r = fx.refuse(
        Some(&g),
        "room_compose",
        json!({"rooms": ["one", "two"], "limit": 1, "cursor": first["next"]}),
        "composition_not_granted",
    );
    assert!(
        r.hint
            .as_deref()
            .unwrap_or("")
            .contains("room composition grant gamma one two")
    );
    let again = fx.ok(None, "compose_revoke", json!({"id": id}));
    assert_eq!(again["changed"], false, "a revocation is said once");
    let listed = fx.ok(None, "compose_grants", json!({"agent": "gamma"}));
    let active: Vec<bool> = listed["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["active"].as_bool().unwrap())
        .collect();
    assert_eq!(active.iter().filter(|a| !**a).count(), 1, "{listed}");
    assert_eq!(active.len(), 2, "{listed}");
    // the grant widens nothing: a reader who left a room's roster... cannot be, so one who
    // never read it: a grant to read a room gamma is no member of is refused at the read
    fx.ok(
        None,
        "room_create",
        json!({"name": "private", "members": ["alpha"]}),
    );
    fx.ok(
        None,
        "compose_grant",
        json!({"agent": "gamma", "rooms": ["one", "private"]}),
    );
    fx.refuse(
        Some(&g),
        "room_compose",
        json!({"rooms": ["one", "private"]}),
        "incomplete_source_set",
    );
    // the grant's own refusals, each changing nothing
    fx.refuse(
        None,
        "compose_grant",
        json!({"agent": "nobody", "rooms": ["one", "two"]}),
        "not_found",
    );
    fx.refuse(
        None,
        "compose_grant",
        json!({"agent": "gamma", "rooms": ["one", "ghost"]}),
        "room_not_found",
    );
    let r = fx.refuse(
        None,
        "compose_grant",
        json!({"agent": "gamma", "rooms": ["one"]}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "rooms");
    let (_, pid) = fx.open_project("p1");
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "gamma"]}),
    );
    let r = fx.refuse(
        None,
        "compose_grant",
        json!({"agent": "gamma", "rooms": ["one", "build"]}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "rooms");
    fx.refuse(
        None,
        "compose_grant",
        json!({"agent": "gamma", "rooms": ["one", "two"], "extra": 1}),
        "invalid_argument",
    );
    fx.refuse(
        None,
        "compose_revoke",
        json!({"id": "cmp_0000000000000000"}),
        "not_found",
    );
    // an agent grants nothing, not even to itself
    fx.refuse(
        Some(&a),
        "compose_grant",
        json!({"agent": "alpha", "rooms": ["one", "three"]}),
        "owner_required",
    );
    fx.refuse(Some(&a), "compose_grants", json!({}), "owner_required");
    // at most 64 unrevoked grants an agent
    let held = |fx: &mut Fx| {
        fx.ok(None, "compose_grants", json!({"agent": "gamma"}))["grants"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["active"] == true)
            .count()
    };
    while held(&mut fx) < 64 {
        fx.ok(
            None,
            "compose_grant",
            json!({"agent": "gamma", "rooms": ["one", "three"]}),
        );
    }
    let r = fx.refuse(
        None,
        "compose_grant",
        json!({"agent": "gamma", "rooms": ["one", "three"]}),
        "quota_exceeded",
    );
    assert_eq!(r.detail["quota"], "compose_grants");
}
