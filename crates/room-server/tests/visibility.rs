//! Visibility inside a room through a real daemon: a turn for an audience is withheld from every
//! other reader, and so is everything that descends from it (replies, citations, the items and
//! wakes it implies); a withheld event never holds anyone at the Work Gate, cannot be named by
//! a reader it is withheld from (refused exactly as an id that does not exist), and cannot be
//! addressed to anyone outside its audience (`audience_excludes_recipient`). Pages, composition
//! and an index rebuild all keep it withheld.

mod common;
use common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Every item `token` reads in `room` from its checkpoint on, confirming each page.
fn read(fx: &mut Fx, token: &str, room: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut page = fx.ok(Some(token), "sync", json!({"room": room}));
    for _ in 0..1_000 {
        items.extend(page["items"].as_array().unwrap().iter().cloned());
        let done = page["more"] == false;
        let next = fx.ok(
            Some(token),
            "sync",
            json!({"room": room, "confirm": page["receipt"]}),
        );
        if done {
            items.extend(next["items"].as_array().unwrap().iter().cloned());
            if next["more"] == false {
                return items;
            }
        }
        page = next;
    }
    panic!("{room} never caught up");
}

fn ids(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_string())
        .collect()
}

fn names(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect()
}

/// alpha, beta and gamma caught up in `r`; alpha says something for beta only.
fn secret() -> (Fx, [String; 3], String) {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("r");
    for t in [&a, &b, &g] {
        fx.sync_all(t, "r");
    }
    let said = fx.ok(
        Some(&a),
        "say",
        json!({"room": "r", "text": "only for beta", "audience": ["beta"]}),
    );
    assert_eq!(names(&said["audience"]), ["alpha", "beta"], "{said}");
    let id = said["event"].as_str().unwrap().to_string();
    (fx, [a, b, g], id)
}

#[test]
fn a_turn_for_an_audience_is_withheld_from_every_other_reader_and_so_is_every_descendant() {
    let (mut fx, [a, b, g], secret) = secret();
    // never owed: gamma acts without reading it
    let g_note = fx.ok(Some(&g), "note", json!({"room": "r", "text": "working"}));
    assert!(names(&g_note["audience"]).is_empty(), "{g_note}");
    // beta reads it, with who else does
    let seen = read(&mut fx, &b, "r");
    let item = seen.iter().find(|i| i["id"] == secret.as_str()).unwrap();
    assert_eq!(item["event"]["text"], "only for beta");
    assert_eq!(names(&item["event"]["audience"]), ["alpha", "beta"]);
    // a reply asks for nothing and is withheld as its parent is
    let reply = fx.ok(
        Some(&b),
        "say",
        json!({"room": "r", "text": "ack", "reply_to": secret}),
    );
    assert_eq!(names(&reply["audience"]), ["alpha", "beta"], "{reply}");
    let reply = reply["event"].as_str().unwrap().to_string();
    // a citation of the reply asks for gamma too, and is narrowed to its parent's audience
    read(&mut fx, &a, "r");
    let cite = fx.ok(
        Some(&a),
        "note",
        json!({"room": "r", "text": "noted", "parents": [reply], "audience": ["beta", "gamma"]}),
    );
    assert_eq!(names(&cite["audience"]), ["alpha", "beta"], "{cite}");
    let cite = cite["event"].as_str().unwrap().to_string();
    let open = fx.ok(Some(&a), "note", json!({"room": "r", "text": "for all"}));
    let open = open["event"].as_str().unwrap().to_string();

    // gamma's pages pass over all three, and still reach the tip
    let got = read(&mut fx, &g, "r");
    let got_ids = ids(&got);
    for hidden in [&secret, &reply, &cite] {
        assert!(!got_ids.contains(hidden), "{hidden} reached gamma: {got:?}");
    }
    assert!(got_ids.contains(&open), "the open note reaches gamma");
    let text = serde_json::to_string(&got).unwrap();
    for word in ["only for beta", "ack", "noted"] {
        assert!(!text.contains(word), "{word:?} leaked to gamma");
    }
    let page = fx.ok(Some(&g), "sync", json!({"room": "r"}));
    assert_eq!(page["to_seq"], fx.tip("r"), "gamma is caught up: {page}");
    // beta reads every one of them
    let b_ids = ids(&read(&mut fx, &b, "r"));
    assert!(b_ids.contains(&cite) && b_ids.contains(&open), "{b_ids:?}");

    // a composition reads as the reader does
    let c = fx.ok(
        Some(&g),
        "room_compose",
        json!({"rooms": ["r"], "limit": 200}),
    );
    assert_eq!(c["more"], false, "{c}");
    let c_ids = ids(c["items"].as_array().unwrap());
    assert!(c_ids.contains(&open));
    for hidden in [&secret, &reply, &cite] {
        assert!(!c_ids.contains(hidden), "{hidden} composed for gamma");
    }
    let c = fx.ok(
        Some(&b),
        "room_compose",
        json!({"rooms": ["r"], "limit": 200}),
    );
    assert!(ids(c["items"].as_array().unwrap()).contains(&secret));

    // the withholding is the journal's: a rebuilt index keeps it
    fx.ok(None, "index_rebuild", json!({"room": "r"}));
    fx.ok(
        Some(&a),
        "note",
        json!({"room": "r", "text": "after", "audience": ["beta"]}),
    );
    let fresh = fx.ok(Some(&g), "sync", json!({"room": "r"}));
    assert!(
        fresh["items"].as_array().unwrap().is_empty(),
        "after the rebuild, gamma still reads none of it: {fresh}"
    );
}

#[test]
fn a_reader_cannot_name_what_is_withheld_from_it_and_learns_nothing_from_trying() {
    let (mut fx, [_a, _b, g], secret) = secret();
    read(&mut fx, &g, "r");
    let ghost = ghost_of(&secret);
    for (field, value) in [("reply_to", json!(secret)), ("parents", json!([secret]))] {
        let mut args = json!({"room": "r", "text": "me too"});
        args[field] = value;
        let hidden = fx.refuse(Some(&g), "say", args.clone(), "invalid_argument");
        args[field] = if field == "parents" {
            json!([ghost])
        } else {
            json!(ghost)
        };
        let missing = fx.refuse(Some(&g), "say", args, "invalid_argument");
        assert_eq!(
            hidden.message.replace(&secret, "ID"),
            missing.message.replace(&ghost, "ID"),
            "a withheld event is refused as one that does not exist"
        );
        assert_eq!(hidden.detail, missing.detail);
    }
}

#[test]
fn a_turn_cannot_address_anyone_outside_its_audience() {
    let (mut fx, [a, b, g], secret) = secret();
    // named, mentioned, or reached through a withheld parent: refused, nothing written
    let r = fx.refuse(
        Some(&a),
        "send",
        json!({"room": "r", "text": "do it", "to": ["gamma"], "audience": ["beta"]}),
        "audience_excludes_recipient",
    );
    assert_eq!(names(&r.detail["outside"]), ["gamma"]);
    assert_eq!(names(&r.detail["audience"]), ["alpha", "beta"]);
    fx.refuse(
        Some(&a),
        "say",
        json!({"room": "r", "text": "@gamma look", "audience": ["beta"]}),
        "audience_excludes_recipient",
    );
    read(&mut fx, &b, "r");
    fx.refuse(
        Some(&b),
        "say",
        json!({"room": "r", "text": "gamma should see", "reply_to": secret, "to": ["gamma"]}),
        "audience_excludes_recipient",
    );
    // an audience names members, within a bound
    let r = fx.refuse(
        Some(&a),
        "say",
        json!({"room": "r", "text": "x", "audience": ["delta"]}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "audience", "{r}");
    let many: Vec<String> = (0..65).map(|i| format!("m{i}")).collect();
    let r = fx.refuse(
        Some(&a),
        "say",
        json!({"room": "r", "text": "x", "audience": many}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "audience", "{r}");

    // an assignment inside the audience: beta is obliged and woken, gamma sees none of it
    read(&mut fx, &a, "r");
    let sent = fx.ok(
        Some(&a),
        "send",
        json!({"room": "r", "text": "review this quietly", "to": ["beta"], "audience": ["beta"]}),
    );
    let sent_id = sent["event"].as_str().unwrap().to_string();
    assert_eq!(sent["obligations"].as_array().unwrap().len(), 1, "{sent}");
    let wakes = fx.ok(None, "wakes_list", json!({"room": "r"}));
    assert_eq!(wakes["wakes"].as_array().unwrap().len(), 1, "{wakes}");
    let log = fx.ok(None, "room_log", json!({"room": "r", "limit": 1000}));
    let items_rec = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "items" && e["event"]["source"] == sent_id.as_str())
        .expect("the send's items record")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let g_ids = ids(&read(&mut fx, &g, "r"));
    assert!(!g_ids.contains(&sent_id) && !g_ids.contains(&items_rec));
    let b_page = fx.ok(Some(&b), "sync", json!({"room": "r"}));
    let b_ids = ids(b_page["items"].as_array().unwrap());
    assert!(
        b_ids.contains(&sent_id) && b_ids.contains(&items_rec),
        "{b_page}"
    );
    assert_eq!(
        b_page["open_items_total"], 2,
        "a mention and an obligation: {b_page}"
    );
}

/// The same id with its last hex digit changed: one that never existed, of the same shape.
fn ghost_of(id: &str) -> String {
    let last = id.chars().last().unwrap();
    format!(
        "{}{}",
        &id[..id.len() - 1],
        if last == '0' { '1' } else { '0' }
    )
}

#[test]
fn evidence_for_an_audience_is_withheld_and_narrows_whatever_cites_it() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("r");
    for t in [&a, &b, &g] {
        fx.sync_all(t, "r");
    }
    let ev = fx.ok(
        Some(&a),
        "evidence_register",
        json!({"room": "r", "origin": "url:https://example.com/finding",
            "summary": "a confidential finding", "audience": ["beta"]}),
    );
    assert_eq!(names(&ev["audience"]), ["alpha", "beta"], "{ev}");
    let handle = ev["evidence"].as_str().unwrap().to_string();
    let event = ev["event"].as_str().unwrap().to_string();
    let got = read(&mut fx, &g, "r");
    assert!(
        !ids(&got).contains(&event),
        "the registration reached gamma"
    );
    assert!(
        !serde_json::to_string(&got)
            .unwrap()
            .contains("confidential")
    );

    // gamma names it (by handle, by event, as lineage): refused as what does not exist
    for (op, field, named) in [
        ("say", "evidence", handle.clone()),
        ("say", "evidence", event.clone()),
        ("evidence_register", "lineage", handle.clone()),
    ] {
        let args = |id: &str| {
            let mut v = json!({"room": "r"});
            if op == "say" {
                v["text"] = json!("see this");
            }
            v[field] = json!([id]);
            v
        };
        let hidden = fx.refuse(Some(&g), op, args(&named), "invalid_argument");
        let ghost = ghost_of(&named);
        let missing = fx.refuse(Some(&g), op, args(&ghost), "invalid_argument");
        assert_eq!(
            (hidden.message.replace(&named, "ID"), &hidden.detail),
            (missing.message.replace(&ghost, "ID"), &missing.detail),
            "{op} {field}: withheld evidence is refused as evidence that does not exist"
        );
    }

    // beta cites it: the turn is narrowed to it, and so is evidence derived from it
    read(&mut fx, &b, "r");
    let said = fx.ok(
        Some(&b),
        "say",
        json!({"room": "r", "text": "per the finding", "evidence": [handle]}),
    );
    assert_eq!(names(&said["audience"]), ["alpha", "beta"], "{said}");
    let derived = fx.ok(
        Some(&b),
        "evidence_register",
        json!({"room": "r", "lineage": [handle], "summary": "my reading of it"}),
    );
    assert_eq!(names(&derived["audience"]), ["alpha", "beta"], "{derived}");
    let got = ids(&read(&mut fx, &g, "r"));
    assert!(!got.contains(&said["event"].as_str().unwrap().to_string()));
    assert!(!got.contains(&derived["event"].as_str().unwrap().to_string()));

    // a task's evidence is part of its acceptance, which every reader sees: it has no audience
    let task = fx.task(&a, "r", Some("beta"));
    for args in [
        json!({"room": "r", "task": task, "origin": "url:https://example.com/t",
            "audience": ["beta"]}),
        json!({"room": "r", "task": task, "lineage": [handle]}),
    ] {
        let r = fx.refuse(Some(&b), "evidence_register", args, "invalid_argument");
        assert_eq!(r.detail["field"], "audience", "{r}");
    }
}

#[test]
fn what_a_task_or_a_refusal_shows_every_reader_never_carries_a_withheld_turn() {
    let (mut fx, [a, b, g], _) = secret();
    let task = fx.task(&a, "r", Some("gamma"));
    // a turn that moves a task is the task's: it names no audience
    read(&mut fx, &g, "r");
    let r = fx.refuse(
        Some(&g),
        "decline",
        json!({"room": "r", "task": task, "text": "no", "audience": ["alpha"]}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "audience", "{r}");
    // beta assigns gamma alpha's task quietly; gamma's decline resolves that obligation, stays
    // every reader's, and tells the owner (whom the quiet send left out)
    read(&mut fx, &b, "r");
    let sent = fx.ok(
        Some(&b),
        "send",
        json!({"room": "r", "text": "take this one", "to": ["gamma"], "task": task,
            "audience": ["gamma"]}),
    );
    assert_eq!(names(&sent["audience"]), ["beta", "gamma"], "{sent}");
    let obligation = sent["obligations"][0]["id"].as_str().unwrap().to_string();
    // alpha cannot answer an item raised by what it does not read: as if it did not exist
    read(&mut fx, &a, "r");
    let ghost = ghost_of(&obligation);
    let hidden = fx.refuse(
        Some(&a),
        "say",
        json!({"room": "r", "text": "re", "reply_to": obligation}),
        "invalid_argument",
    );
    let missing = fx.refuse(
        Some(&a),
        "say",
        json!({"room": "r", "text": "re", "reply_to": ghost}),
        "invalid_argument",
    );
    assert_eq!(
        hidden.message.replace(&obligation, "ID"),
        missing.message.replace(&ghost, "ID")
    );
    read(&mut fx, &g, "r");
    let declined = fx.ok(
        Some(&g),
        "decline",
        json!({"room": "r", "task": task, "text": "not mine"}),
    );
    assert!(names(&declined["audience"]).is_empty(), "{declined}");
    assert_eq!(
        declined["resolved"].as_array().unwrap().len(),
        2,
        "{declined}"
    );
    assert_eq!(fx.task_status(&task), "declined");

    // a repeated key's refusal names the first call: it is withheld wherever that call is
    read(&mut fx, &a, "r");
    let args = json!({"room": "r", "text": "once", "audience": ["beta"], "idempotency_key": "k-1"});
    fx.ok(Some(&a), "say", args.clone());
    let r = fx.refuse_violation(&a, "say", args, "r", "exactly_once");
    let record = r.detail["violation_event"].as_str().unwrap().to_string();
    assert!(!ids(&read(&mut fx, &g, "r")).contains(&record));
    assert!(ids(&read(&mut fx, &b, "r")).contains(&record));
}

/// `room_search` through the daemon: a member finds what it may read and nothing withheld
/// from it; a non-member, an empty query and the semantic mode are refused, changing nothing.
#[test]
fn search_through_the_daemon_keeps_to_what_its_reader_may_read() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("lobby");
    fx.sync_all(&a, "lobby");
    fx.ok(
        Some(&a),
        "note",
        json!({"room": "lobby", "text": "the parser plan", "audience": ["beta"]}),
    );
    fx.ok(
        Some(&a),
        "note",
        json!({"room": "lobby", "text": "the parser is done"}),
    );
    let found = |fx: &mut Fx, who: &str| -> Vec<String> {
        fx.ok(
            Some(who),
            "search",
            json!({"room": "lobby", "query": "parser"}),
        )["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["excerpt"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(found(&mut fx, &g), ["the parser is done"]);
    assert_eq!(found(&mut fx, &b).len(), 2);
    let owner = fx.ok(None, "search", json!({"room": "lobby", "query": "plan"}));
    assert_eq!(owner["results"][0]["excerpt"], "the parser plan");
    let outsider = fx.enroll("outsider", "member");
    fx.refuse(
        Some(&outsider),
        "search",
        json!({"room": "lobby", "query": "parser"}),
        "room_not_member",
    );
    for (args, field) in [
        (json!({"room": "lobby", "query": "  ?! "}), "query"),
        (
            json!({"room": "lobby", "query": "parser", "mode": "semantic"}),
            "mode",
        ),
        (
            json!({"room": "lobby", "query": "parser", "limit": 0, "extra": 1}),
            "args",
        ),
    ] {
        let r = fx.refuse(Some(&g), "search", args.clone(), "invalid_argument");
        if field != "args" {
            assert_eq!(r.detail["field"], field, "{args}: {r}");
        }
    }
}

/// The suite's local model API (tests/workers/openai_server.py), which also serves a
/// stand-in embeddings model; its log holds every request body.
struct ModelServer {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn model_server(fx: &Fx) -> ModelServer {
    use std::io::BufRead;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/openai_server.py");
    let log = fx.root.join("embeddings.jsonl");
    let mut child = std::process::Command::new("/usr/bin/python3")
        .arg(script)
        .arg("reply")
        .arg(&log)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    ModelServer {
        port: line.trim().parse().expect("the server prints its port"),
        child,
        log,
    }
}

/// Semantic search through the daemon against a real HTTP embeddings endpoint: the indexer
/// embeds each event's redacted text away from the writes (and keeps up with new ones), a
/// query finds by meaning what no word of it matches, within what its reader may read; an
/// endpoint that is down delays only the vectors (writes go on) and a semantic query then
/// is `embeddings_unavailable`, changing nothing.
#[test]
fn semantic_search_finds_by_meaning_through_the_owner_s_endpoint() {
    let mut fx = Fx::new();
    let (a, b, g) = fx.team("lobby");
    fx.sync_all(&a, "lobby");
    for (text, audience) in [
        ("the parser has a bug", json!([])),
        ("a secret fault in the lexer", json!(["beta"])),
        ("lunch at noon, the password is hunter2", json!([])),
    ] {
        fx.ok(
            Some(&a),
            "note",
            json!({"room": "lobby", "text": text, "audience": audience}),
        );
    }
    let server = model_server(&fx);
    fx.write_config(&format!(
        "[redaction]\npatterns = [\"hunter[0-9]\"]\n\n[search.embeddings]\nbase_url = \"http://127.0.0.1:{}/v1\"\nmodel = \"stand-in\"\nbatch_max = 2\n",
        server.port
    ));
    let semantic = |fx: &mut Fx, who: &str, q: &str| {
        fx.ok(
            Some(who),
            "search",
            json!({"room": "lobby", "query": q, "mode": "semantic"}),
        )
    };
    let settled = |fx: &mut Fx| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = semantic(fx, &g, "defect");
            // an agent learns only whether every event has its vector, never counts
            assert!(v["coverage"].get("embedded").is_none(), "{v:#}");
            if v["coverage"]["complete"] == true {
                return v;
            }
            assert!(Instant::now() < deadline, "never embedded: {v:#}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let v = settled(&mut fx);
    let excerpts: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["excerpt"].as_str().unwrap())
        .collect();
    assert_eq!(excerpts[0], "the parser has a bug", "{v:#}");
    assert!(
        !excerpts.iter().any(|e| e.contains("secret")),
        "withheld from gamma: {v:#}"
    );
    assert_eq!(v["model"], "stand-in");
    // no word of the query is in the event: text search finds nothing
    let text = fx.ok(
        Some(&g),
        "search",
        json!({"room": "lobby", "query": "defect"}),
    );
    assert_eq!(text["results"], json!([]), "{text:#}");
    // beta, in its audience, finds the lexer's fault first
    let v = semantic(&mut fx, &b, "lexer flaw");
    assert_eq!(
        v["results"][0]["excerpt"], "a secret fault in the lexer",
        "{v:#}"
    );
    // a new event gets its vector too; the endpoint saw only redacted text
    fx.ok(
        Some(&a),
        "note",
        json!({"room": "lobby", "text": "dinner is served"}),
    );
    settled(&mut fx);
    let owner = fx.ok(
        None,
        "search",
        json!({"room": "lobby", "query": "meal", "mode": "semantic"}),
    );
    assert_eq!(
        owner["coverage"]["embedded"], owner["coverage"]["events_with_text"],
        "{owner:#}"
    );
    let v = semantic(&mut fx, &g, "meal");
    assert_eq!(v["results"][0]["excerpt"], "dinner is served", "{v:#}");
    let sent = std::fs::read_to_string(&server.log).unwrap();
    assert!(sent.contains("/v1/embeddings"), "{sent}");
    assert!(
        !sent.contains("hunter2"),
        "unredacted text reached the endpoint: {sent}"
    );
    // the endpoint goes away: writes go on, a semantic query is refused and changes nothing
    drop(server);
    fx.ok(
        Some(&a),
        "note",
        json!({"room": "lobby", "text": "written while the endpoint is down"}),
    );
    let r = fx.refuse(
        Some(&g),
        "search",
        json!({"room": "lobby", "query": "defect", "mode": "semantic"}),
        "embeddings_unavailable",
    );
    assert!(r.hint.is_some(), "{r}");
    // a non-member is refused before any endpoint is asked
    let outsider = fx.enroll("outsider", "member");
    fx.refuse(
        Some(&outsider),
        "search",
        json!({"room": "lobby", "query": "defect", "mode": "semantic"}),
        "room_not_member",
    );
}
