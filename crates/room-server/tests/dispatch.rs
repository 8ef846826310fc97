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
fn a_roster_changed_after_sealing_is_wake_room_authority_changed() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    let p = sent(&mut fx, &a, json!({}));
    // a member joins: the room's authority revision moves past the sealed one
    fx.ok(
        None,
        "agent_enroll",
        json!({"name": "delta", "max_tier": "member"}),
    );
    fx.ok(
        None,
        "room_members_add",
        json!({"room": "coord", "agent": "delta"}),
    );
    dead(&mut fx, &p, "wake_room_authority_changed");
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

// ---------- a session takes its own wake (an agent without a route) ----------

fn in_conv(token: &str, conv: &str, op: &str, args: Value) -> room_server::wire::Request {
    room_server::wire::Request {
        conversation: Some(conv.into()),
        ..request(Some(token), op, args)
    }
}

#[track_caller]
fn ok_in(fx: &mut Fx, token: &str, conv: &str, op: &str, args: Value) -> Value {
    let r = fx.send(&in_conv(token, conv, op, args.clone()));
    assert!(r.ok, "{op} {args} in {conv}: {:?}", r.refusal);
    r.result.unwrap()
}

/// The Work Gate's loop in one conversation.
fn sync_in(fx: &mut Fx, token: &str, conv: &str, room: &str) {
    let mut page = ok_in(fx, token, conv, "sync", json!({"room": room}));
    for _ in 0..1_000 {
        let next = ok_in(
            fx,
            token,
            conv,
            "sync",
            json!({"room": room, "confirm": page["receipt"]}),
        );
        if next["more"] == false && next["items"].as_array().is_some_and(|a| a.is_empty()) {
            return;
        }
        page = next;
    }
    panic!("sync of {room} never caught up");
}

/// The permit of `source` once its newest launch has ended (the observer settles session
/// launches once a second). The list reads the permit, then its launches: both must show it.
fn settled(fx: &mut Fx, source: &str) -> Value {
    for _ in 0..100 {
        let p = permit(fx, source);
        if p["state"] != "dispatched"
            && p["launches"]
                .as_array()
                .and_then(|l| l.last())
                .is_some_and(|l| l["state"] == "ended")
        {
            return p;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("the launch of {source} never ended: {}", permit(fx, source));
}

#[test]
fn a_session_takes_its_wake_and_only_its_own_reply_proves_it() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    let p = sent(&mut fx, &a, json!({}));
    let source = p["source_event"].as_str().unwrap().to_string();
    let obligation = p["obligation_ids"][0].as_str().unwrap().to_string();
    let t = ok_in(&mut fx, &b, "s1", "wake_take", json!({}));
    let taken = &t["taken"];
    assert_eq!(taken["source_event"], source.as_str(), "{t}");
    assert_eq!(taken["prompt"], "please look");
    assert_eq!(taken["obligation_ids"], json!([obligation]));
    assert_eq!(taken["binding_sha256"], p["binding_sha256"]);
    assert_eq!(taken["proof"], "delivered_to_body");
    let launch = taken["launch"].as_str().unwrap().to_string();
    let now = permit(&mut fx, &source);
    assert_eq!(now["state"], "dispatched");
    assert_eq!(now["launches"][0]["launch"], launch.as_str());
    assert_eq!(now["launches"][0]["state"], "running");
    assert_eq!(now["launches"][0]["pid"], Value::Null, "no process");

    // one launch per recipient, whichever session asks
    let r = fx.refuse_req(
        &in_conv(&b, "s2", "wake_take", json!({})),
        "wake_not_takeable",
    );
    assert!(r.message.contains(&launch), "{r}");

    // another session's reply resolves the obligation but proves nothing for this launch
    let p2 = sent(&mut fx, &a, json!({"text": "and this"}));
    let second = p2["obligation_ids"][0].as_str().unwrap().to_string();
    sync_in(&mut fx, &b, "s1", "coord");
    ok_in(
        &mut fx,
        &b,
        "s1",
        "reply",
        json!({"room": "coord", "reply_to": obligation, "text": "looked"}),
    );
    let p = settled(&mut fx, &source);
    assert_eq!(p["state"], "replied", "{p}");
    assert_eq!(p["launches"][0]["outcome"], "replied");
    assert_eq!(p["launches"][0]["proof"], "replied");
    let sessions = fx.ok(None, "sessions_list", json!({"agent": "beta"}));
    let s = &sessions["sessions"][0];
    assert_eq!(
        (&s["host"], &s["native"], &s["lane"]),
        (&json!("mcp"), &json!("s1"), &json!("beta")),
        "{sessions}"
    );
    // one id per agent and conversation, by their digest
    assert!(
        s["id"].as_str().unwrap().starts_with("sf_mcp_h"),
        "{sessions}"
    );

    // the next permit, taken in s2 and answered from s1: no credit
    let t2 = ok_in(&mut fx, &b, "s2", "wake_take", json!({"room": "coord"}));
    assert_eq!(t2["taken"]["obligation_ids"], json!([second]), "{t2}");
    sync_in(&mut fx, &b, "s1", "coord");
    ok_in(
        &mut fx,
        &b,
        "s1",
        "reply",
        json!({"room": "coord", "reply_to": second, "text": "from elsewhere"}),
    );
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    let p2 = permit(&mut fx, p2["source_event"].as_str().unwrap());
    assert_eq!(p2["launches"][0]["state"], "running", "{p2}");
}

#[test]
fn a_taken_wake_times_out_at_its_sealed_deadline_and_its_obligation_stays_open() {
    let mut fx = Fx::new();
    fx.write_config("[dispatch]\nuntasked_deadline_ms = 1500\n");
    let (a, b, _) = fx.team("coord");
    let p = sent(&mut fx, &a, json!({}));
    assert_eq!(p["deadline_ms"], 1500, "the configured deadline is sealed");
    let source = p["source_event"].as_str().unwrap().to_string();
    ok_in(&mut fx, &b, "s1", "wake_take", json!({}));
    let p = settled(&mut fx, &source);
    let l = &p["launches"][0];
    assert_eq!(
        (&l["outcome"], &l["proof"]),
        (&json!("timed_out"), &json!("delivered_to_body")),
        "{p}"
    );
    assert_eq!(p["state"], "failed");
    assert_eq!(
        beta_obligations(&mut fx, &b),
        1,
        "a timeout answers nothing"
    );
    // and the recipient is free again: nothing is queued, so nothing is taken
    let none = ok_in(&mut fx, &b, "s1", "wake_take", json!({}));
    assert_eq!(none["taken"], Value::Null, "{none}");
}

#[test]
fn a_take_is_refused_for_an_unknown_or_dead_wake_a_bare_event_and_a_foreign_room() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    let p = sent(&mut fx, &a, json!({}));
    let source = p["source_event"].as_str().unwrap().to_string();
    let r = fx.refuse(
        Some(&b),
        "wake_take",
        json!({"source_event": source}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "room", "{r}");
    fx.refuse(
        Some(&b),
        "wake_take",
        json!({"room": "coord", "source_event": "evt_00000000deadbeef"}),
        "not_found",
    );
    fx.refuse(
        Some(&b),
        "wake_take",
        json!({"room": "coord", "nope": 1}),
        "invalid_argument",
    );
    fx.ok(
        None,
        "room_create",
        json!({"name": "other", "members": ["alpha"]}),
    );
    fx.refuse(
        Some(&b),
        "wake_take",
        json!({"room": "other"}),
        "room_not_member",
    );
    // a dead-lettered permit is not taken
    let b2 = fx.ok(None, "agent_rotate", json!({"name": "beta"}))["token"]
        .as_str()
        .unwrap()
        .to_string();
    dead(&mut fx, &p, "wake_recipient_registration_changed");
    let r = fx.refuse(
        Some(&b2),
        "wake_take",
        json!({"room": "coord", "source_event": source}),
        "wake_not_takeable",
    );
    assert!(r.message.contains("dead"), "{r}");
    let none = fx.ok(Some(&b2), "wake_take", json!({}));
    assert_eq!(none["taken"], Value::Null);
}

#[test]
fn a_routed_agent_s_wakes_are_the_dispatcher_s_not_its_session_s() {
    let mut fx = Fx::new();
    let (_, b, _) = fx.team("coord");
    fx.write_config("[routes.beta]\nadapter = \"script\"\nsteps = [\"hang\"]\n");
    let r = fx.refuse(Some(&b), "wake_take", json!({}), "wake_not_takeable");
    assert!(r.message.contains("has a route"), "{r}");
}

#[test]
fn a_take_fits_its_page_ceiling_and_withholds_the_evidence_that_does_not_fit() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    let t = fx.ok(
        Some(&a),
        "task_create",
        json!({"room": "coord", "title": "review", "to": "beta"}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    // sixteen passages of about 1 KiB each: more than a 4 KiB page holds
    let evidence: Vec<String> = (0..16)
        .map(|i| {
            fx.ok(
                Some(&a),
                "evidence_register",
                json!({"room": "coord", "task": t, "origin": format!("url:https://example.test/{i}"),
                "summary": format!("{i} {}", "x".repeat(1_000))}),
            )["evidence"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let p = sent(&mut fx, &a, json!({"task": t, "evidence": evidence}));
    let source = p["source_event"].as_str().unwrap().to_string();
    let req = room_server::wire::Request {
        page_bytes_max: Some(4_096),
        ..in_conv(&b, "s1", "wake_take", json!({}))
    };
    let r = fx.send(&req);
    assert!(r.ok, "{:?}", r.refusal);
    let result = r.result.unwrap();
    assert!(
        result.to_string().len() <= 4_096,
        "{} bytes",
        result.to_string().len()
    );
    let e = &result["taken"]["evidence"];
    let (served, withheld) = (
        e["served"].as_array().unwrap(),
        e["withheld"].as_array().unwrap(),
    );
    assert_eq!(served.len() + withheld.len(), 16, "{e}");
    assert!(!served.is_empty() && !withheld.is_empty(), "{e}");
    assert!(withheld.iter().all(|w| w["reason"] == "page_budget"), "{e}");
    // the passages served come first, in the order cited
    assert_eq!(served[0]["evidence"], evidence[0].as_str());
    // the delivery receipt records what the session was handed, no more
    let now = permit(&mut fx, &source);
    assert_eq!(&now["launches"][0]["delivery"], e, "{now}");
}

#[test]
fn a_take_whose_prompt_alone_passes_the_page_ceiling_cuts_the_prompt_and_says_so() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    let text = "\"quoted\" ".repeat(450);
    sent(&mut fx, &a, json!({"text": text}));
    let req = room_server::wire::Request {
        page_bytes_max: Some(4_096),
        ..in_conv(&b, "s1", "wake_take", json!({}))
    };
    let r = fx.send(&req);
    assert!(r.ok, "{:?}", r.refusal);
    let result = r.result.unwrap();
    let len = result.to_string().len();
    assert!(len <= 4_096, "{len} bytes");
    let taken = &result["taken"];
    assert_eq!(taken["prompt_cut"], true, "{taken}");
    let prompt = taken["prompt"].as_str().unwrap();
    assert!(!prompt.is_empty() && text.starts_with(prompt), "{prompt}");
    // the socket's own ceiling holds the whole prompt
    let p = permit(&mut fx, taken["source_event"].as_str().unwrap());
    assert!(p["prompt"].as_str().unwrap().len() > prompt.len(), "{p}");
}
