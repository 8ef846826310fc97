//! `read_through`: confirming the page just read and acting in one call, the delta pages its
//! refusals carry, the turnstile that orders a busy room's turns, and the view a checkpoint is
//! stamped with, through the engine's public API.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests make real state dirs and config files

use room_core::env::{ManualClock, SeededEntropy};
use room_core::{Code, Tier, Verb};
use room_engine::principal::AgentCaller;
use room_engine::turnstile::TurnStep;
use room_engine::verbs::TurnArgs;
use room_engine::{Engine, EngineConfig, Env};
use room_store::fs::RealFs;
use room_store::statedir;
use room_store::{SqliteBackend, SqliteBackendConfig};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

struct Fixture {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    boot: PathBuf,
    clock: Arc<ManualClock>,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let state = root.join("state");
        let boot = root.join("boot.toml");
        statedir::init(&state, &boot, "inst").unwrap();
        Fixture {
            _tmp: tmp,
            state,
            boot,
            clock: Arc::new(ManualClock::new(1_790_000_000_000)),
        }
    }

    fn engine(&self, seed: u64) -> Engine {
        let s = statedir::validate(&self.state, &self.boot).unwrap();
        let env = Env {
            clock: self.clock.clone(),
            entropy: Arc::new(SeededEntropy::new(seed)),
            fs: Arc::new(RealFs),
            runner: Arc::new(room_core::env::NoRunner),
        };
        let store = Arc::new(SqliteBackend::new(&s, SqliteBackendConfig::default()));
        Engine::open(s, env, store, EngineConfig::default()).unwrap()
    }
}

fn owner(e: &Engine) -> room_engine::Owner {
    e.owner(&room_engine::Caller::Local(
        room_engine::Evidence::UnixPeer {
            uid: e.config().owner_uid,
            pid: std::process::id(),
        },
    ))
    .expect("the console is the owner")
}

fn agent(e: &Engine, name: &str) -> AgentCaller {
    let t = e
        .enroll(&owner(e), name, Tier::Member, "generic")
        .unwrap()
        .token;
    AgentCaller {
        token: t,
        conversation: "c1".into(),
        declared_tier: None,
        page_bytes_max: None,
    }
}

fn room(e: &Engine, names: &[&str]) -> Vec<AgentCaller> {
    let agents: Vec<AgentCaller> = names.iter().map(|n| agent(e, n)).collect();
    let members: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    e.room_create(&owner(e), "r", None, &members).unwrap();
    agents
}

fn say(text: &str, read_through: Option<&str>) -> TurnArgs {
    TurnArgs {
        room: "r".into(),
        text: Some(text.into()),
        read_through: read_through.map(String::from),
        ..Default::default()
    }
}

fn tip(e: &Engine) -> u64 {
    e.room_log(&owner(e), "r", 1, 1).unwrap()["tip_seq"]
        .as_u64()
        .unwrap()
}

fn receipt(page: &Value) -> String {
    page["receipt"].as_str().unwrap().to_string()
}

fn seqs(page: &Value) -> Vec<u64> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["seq"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_read_through_turn_lands_in_one_call_and_a_refusal_carries_only_the_delta() {
    let f = Fixture::new();
    let e = f.engine(1);
    let ab = room(&e, &["alpha", "beta"]);
    let (a, b) = (&ab[0], &ab[1]);
    let page = e.sync(a, "r", None).unwrap();
    assert!(page["more"] == false);
    let first = receipt(&page);
    // without reading, alpha cannot act; with read_through, it can, in one call
    assert_eq!(
        e.turn(a, Verb::Say, say("hello", None)).unwrap_err().code,
        Code::RoomSyncRequired
    );
    let before = tip(&e);
    e.turn(a, Verb::Say, say("hello", Some(&first))).unwrap();
    assert_eq!(tip(&e), before + 1);
    // beta reads and writes twice; alpha's stale read_through is refused with a delta page
    let bp = e.sync(b, "r", None).unwrap();
    e.turn(b, Verb::Say, say("one", Some(&receipt(&bp))))
        .unwrap();
    e.turn(b, Verb::Say, say("two", None)).unwrap();
    let read = e.sync(a, "r", None).unwrap();
    let read_seqs = seqs(&read);
    e.turn(b, Verb::Say, say("three", None)).unwrap();
    let before = tip(&e);
    let err = e
        .turn(a, Verb::Say, say("reply", Some(&receipt(&read))))
        .unwrap_err()
        .materialized();
    assert_eq!(err.code, Code::RoomSyncRequired);
    assert_eq!(tip(&e), before, "a refused turn writes nothing");
    let delta = &err.detail["next_page"];
    assert_eq!(delta["continues"], receipt(&read).as_str());
    assert_eq!(seqs(delta), vec![before], "only beta's newest turn");
    assert_eq!(delta["from_seq"], *read_seqs.last().unwrap() + 1);
    // the delta's receipt confirms the chain: one more call lands
    e.turn(a, Verb::Say, say("reply", Some(&receipt(delta))))
        .unwrap();
    assert_eq!(tip(&e), before + 1);
    // and the checkpoint stands past it: alpha goes on without reading its own turn
    e.turn(a, Verb::Say, say("more", None)).unwrap();
}

#[test]
fn a_read_through_receipt_must_be_the_callers_own() {
    let f = Fixture::new();
    let e = f.engine(2);
    let ab = room(&e, &["alpha", "beta"]);
    let (a, b) = (&ab[0], &ab[1]);
    let theirs = receipt(&e.sync(b, "r", None).unwrap());
    let before = tip(&e);
    let err = e.turn(a, Verb::Say, say("x", Some(&theirs))).unwrap_err();
    assert_eq!(err.code, Code::ReceiptUnknown);
    // another conversation of the same agent has its own receipts
    let mine = receipt(&e.sync(a, "r", None).unwrap());
    let a2 = AgentCaller {
        conversation: "c2".into(),
        ..a.clone()
    };
    assert_eq!(
        e.turn(&a2, Verb::Say, say("x", Some(&mine)))
            .unwrap_err()
            .code,
        Code::ReceiptUnknown
    );
    let err = e
        .turn(a, Verb::Say, say("x", Some("rcpt_nope")))
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert_eq!(err.detail["field"], "read_through");
    assert_eq!(tip(&e), before, "no refused call wrote anything");
}

/// A small deterministic generator for the lockstep test.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Two identical rooms, driven by the same random schedule: in one the agents confirm their
/// receipt and then act (two calls), in the other they act with `read_through` (one call).
/// Each attempt is refused in one exactly when it is refused in the other, with the same code.
#[test]
fn read_through_is_refused_exactly_when_confirm_then_turn_would_be() {
    for seed in 1..=6u64 {
        let (fx, fy) = (Fixture::new(), Fixture::new());
        let (ex, ey) = (fx.engine(seed), fy.engine(seed));
        let names = ["alpha", "beta", "gamma"];
        let (ax, ay) = (room(&ex, &names), room(&ey, &names));
        // the receipt each agent would present next, in each world
        let mut rx: Vec<Option<String>> = vec![None; 3];
        let mut ry: Vec<Option<String>> = vec![None; 3];
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (mut landed, mut refused) = (0, 0);
        for step in 0..160 {
            let who = rng.next(3) as usize;
            match rng.next(4) {
                0 => {
                    rx[who] = Some(receipt(&ex.sync(&ax[who], "r", None).unwrap()));
                    ry[who] = Some(receipt(&ey.sync(&ay[who], "r", None).unwrap()));
                }
                _ => {
                    let text = format!("step {step}");
                    let x = match rx[who].take() {
                        Some(r) => ex
                            .sync(&ax[who], "r", Some(&r))
                            .and_then(|_| ex.turn(&ax[who], Verb::Say, say(&text, None))),
                        None => ex.turn(&ax[who], Verb::Say, say(&text, None)),
                    };
                    let y = ey.turn(&ay[who], Verb::Say, say(&text, ry[who].take().as_deref()));
                    match (&x, &y) {
                        (Ok(_), Ok(_)) => landed += 1,
                        (Err(p), Err(q)) => {
                            assert_eq!(p.code, q.code, "seed {seed} step {step}");
                            refused += 1;
                            if let Some(n) = p.detail.get("next_page") {
                                rx[who] = Some(receipt(n));
                            }
                            if let Some(n) = q.detail.get("next_page") {
                                ry[who] = Some(receipt(n));
                            }
                        }
                        _ => panic!(
                            "seed {seed} step {step}: confirm+turn {:?} but read_through {:?}",
                            x.as_ref().map(|_| ()).map_err(|r| r.code),
                            y.as_ref().map(|_| ()).map_err(|r| r.code)
                        ),
                    }
                }
            }
            assert_eq!(tip(&ex), tip(&ey), "seed {seed} step {step}");
        }
        assert!(
            landed > 10 && refused > 10,
            "seed {seed}: {landed} landed, {refused} refused"
        );
    }
}

/// A delta page never skips an event: following refusal after refusal, the pages an agent is
/// handed cover every seq from its first read to the tip exactly once, and a chain longer
/// than its bound starts over from the checkpoint.
#[test]
fn delta_pages_never_skip_an_event() {
    let f = Fixture::new();
    let e = f.engine(3);
    let ab = room(&e, &["alpha", "beta"]);
    let (a, b) = (&ab[0], &ab[1]);
    let first = e.sync(a, "r", None).unwrap();
    let mut seen: Vec<u64> = seqs(&first);
    let mut r = receipt(&first);
    let mut restarted = false;
    for n in 0..(room_engine::sync::RECEIPT_CHAIN_MAX + 3) {
        let bp = e.sync(b, "r", None).unwrap();
        e.turn(b, Verb::Say, say(&format!("b{n}"), Some(&receipt(&bp))))
            .unwrap();
        let err = e
            .turn(a, Verb::Say, say("a", Some(&r)))
            .unwrap_err()
            .materialized();
        assert_eq!(err.code, Code::RoomSyncRequired);
        let page = &err.detail["next_page"];
        if page.get("continues").is_none() {
            // the chain reached its bound: a full page from the (unmoved) checkpoint
            restarted = true;
            seen = seqs(page);
        } else {
            seen.extend(seqs(page));
        }
        r = receipt(page);
    }
    assert!(restarted, "a chain is bounded");
    let tip = tip(&e);
    assert_eq!(
        seen,
        (1..=tip).collect::<Vec<_>>(),
        "every event once, in order"
    );
    e.turn(a, Verb::Say, say("a", Some(&r))).unwrap();
}

fn step(e: &Engine, a: &AgentCaller, args: TurnArgs, ticket: Option<u64>) -> TurnStep<Value> {
    e.turn_step(a, Verb::Say, args, ticket).unwrap()
}

#[test]
fn the_turnstile_gives_a_refused_author_its_retry_and_keeps_the_order() {
    let f = Fixture::new();
    let e = f.engine(4);
    let abc = room(&e, &["alpha", "beta", "gamma"]);
    let (a, b, c) = (&abc[0], &abc[1], &abc[2]);
    let pa = e.sync(a, "r", None).unwrap();
    let pb = e.sync(b, "r", None).unwrap();
    let pc = e.sync(c, "r", None).unwrap();
    e.turn(c, Verb::Say, say("c first", Some(&receipt(&pc))))
        .unwrap();
    // alpha is sent back to read; the room's next slot is its own
    let err = e
        .turn_step(a, Verb::Say, say("a", Some(&receipt(&pa))), None)
        .unwrap_err();
    assert_eq!(err.code, Code::RoomSyncRequired);
    let delta = receipt(&err.detail["next_page"]);
    // beta's turn, though beta has not read c's, waits instead of being refused
    let TurnStep::Wait { ticket: tb, .. } = step(&e, b, say("b", Some(&receipt(&pb))), None) else {
        panic!("beta waits for alpha's slot")
    };
    let before = tip(&e);
    let TurnStep::Wait { ticket: tc, .. } = step(&e, c, say("c again", None), None) else {
        panic!("gamma waits behind beta")
    };
    assert_eq!(tip(&e), before, "waiting writes nothing");
    // alpha's retry lands; beta (the head) is woken, gamma is not
    let TurnStep::Done(v) = step(&e, a, say("a", Some(&delta)), None) else {
        panic!("alpha's retry runs in its slot")
    };
    assert!(v["event"].is_string());
    assert!(e.turn_waits().take(tb) && !e.turn_waits().take(tc));
    // gamma called again early: still behind beta
    assert!(matches!(
        step(&e, c, say("c again", None), Some(tc)),
        TurnStep::Wait { .. }
    ));
    // beta runs: sent back to read (alpha landed), with a slot of its own; its retry lands
    f.clock.advance(5);
    let err = e
        .turn_step(b, Verb::Say, say("b", Some(&receipt(&pb))), Some(tb))
        .unwrap_err();
    assert_eq!(err.code, Code::RoomSyncRequired);
    assert_eq!(err.detail["waited_ms"], 5, "the wait is reported");
    let delta = receipt(&err.detail["next_page"]);
    let TurnStep::Done(_) = step(&e, b, say("b", Some(&delta)), None) else {
        panic!("beta's retry runs in its slot")
    };
    assert!(e.turn_waits().take(tc), "gamma is next");
    let err = e
        .turn_step(c, Verb::Say, say("c again", None), Some(tc))
        .unwrap_err();
    assert_eq!(err.code, Code::RoomSyncRequired);
}

#[test]
fn a_full_turnstile_and_a_long_wait_are_refused_and_write_nothing() {
    let f = Fixture::new();
    std::fs::write(
        f.state.join("config.toml"),
        "[gate]\nturn_queue_max = 1\nturn_slot_ms = 60000\nturn_wait_ms_max = 1000\n",
    )
    .unwrap();
    let e = f.engine(5);
    let abc = room(&e, &["alpha", "beta", "gamma"]);
    let (a, b, c) = (&abc[0], &abc[1], &abc[2]);
    let pb = e.sync(b, "r", None).unwrap();
    e.turn(b, Verb::Say, say("b", Some(&receipt(&pb)))).unwrap();
    // alpha is refused and holds the slot; it never comes back
    assert!(e.turn_step(a, Verb::Say, say("a", None), None).is_err());
    let before = tip(&e);
    let TurnStep::Wait { ticket, .. } = step(&e, b, say("b2", None), None) else {
        panic!("beta waits")
    };
    let err = e.turn_step(c, Verb::Say, say("c", None), None).unwrap_err();
    assert_eq!(err.code, Code::RoomTurnQueueExceeded);
    assert_eq!(err.detail["reason"], "queue_full");
    f.clock.advance(1_001);
    let err = e
        .turn_step(b, Verb::Say, say("b2", None), Some(ticket))
        .unwrap_err();
    assert_eq!(err.code, Code::RoomTurnQueueExceeded);
    assert_eq!(err.detail["reason"], "waited");
    assert_eq!(tip(&e), before, "neither refusal wrote anything");
}

/// A transport's lower page ceiling (MCP's) holds for every page it is served, a refusal's
/// delta page included, and its receipts confirm under the ceiling they were served with.
#[test]
fn a_lower_page_ceiling_holds_for_every_page_and_its_receipts_confirm() {
    let f = Fixture::new();
    let e = f.engine(6);
    let ab = room(&e, &["alpha", "beta"]);
    let a = AgentCaller {
        page_bytes_max: Some(10 * 1024),
        ..ab[0].clone()
    };
    let b = &ab[1];
    let bp = e.sync(b, "r", None).unwrap();
    // an event larger than the ceiling arrives in fragments
    e.turn(b, Verb::Say, say(&"é".repeat(7_000), Some(&receipt(&bp))))
        .unwrap();
    e.turn(b, Verb::Say, say("small", None)).unwrap();
    let mut page = e.sync(&a, "r", None).unwrap();
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(page.to_string().len() <= 10 * 1024, "page {pages} fits");
        if page["more"] == false {
            break;
        }
        page = e.sync(&a, "r", Some(&receipt(&page))).unwrap();
    }
    assert!(pages > 2, "the big event took several pages");
    // the last page is read through; a refusal's delta respects the ceiling too
    e.turn(b, Verb::Say, say(&"ü".repeat(7_000), None)).unwrap();
    let err = e
        .turn(&a, Verb::Say, say("a", Some(&receipt(&page))))
        .unwrap_err()
        .materialized();
    assert_eq!(err.code, Code::RoomSyncRequired);
    let mut delta = err.detail["next_page"].clone();
    loop {
        assert!(delta.to_string().len() <= 10 * 1024);
        match e.turn(&a, Verb::Say, say("a", Some(&receipt(&delta)))) {
            Ok(_) => break,
            Err(r) => {
                assert_eq!(r.code, Code::RoomSyncRequired);
                delta = r.materialized().detail["next_page"].clone();
            }
        }
    }
}

fn catch_up(e: &Engine, a: &AgentCaller) -> u64 {
    let mut confirm: Option<String> = None;
    loop {
        let page = e.sync(a, "r", confirm.as_deref()).unwrap();
        if page["items"].as_array().unwrap().is_empty() {
            return page["confirmed_seq"].as_u64().unwrap();
        }
        confirm = Some(receipt(&page));
    }
}

#[test]
fn a_checkpoint_holds_again_when_its_view_comes_back_but_never_across_a_reset() {
    let f = Fixture::new();
    let e = f.engine(1);
    let agents = room(&e, &["alpha", "beta", "gamma"]);
    let (a, b) = (&agents[0], &agents[1]);
    catch_up(&e, b);
    e.turn(b, Verb::Say, say("one", None)).unwrap();
    let read = catch_up(&e, a);
    assert_eq!(read, tip(&e), "alpha read everything");

    // a reader leaves: the room's view moves, and alpha's checkpoint is not honoured under it
    e.revoke(&owner(&e), "gamma").unwrap();
    let page = e.sync(a, "r", None).unwrap();
    assert_eq!(page["view_changed"], true);
    assert_eq!(
        page["from_seq"], 1,
        "under a new view alpha reads from the start"
    );
    let before = tip(&e);
    let r = e.turn(a, Verb::Say, say("too soon", None)).unwrap_err();
    assert_eq!(r.code, Code::RoomSyncViewChanged);
    assert_eq!(tip(&e), before, "the refused turn wrote nothing");

    // the same reader comes back: the view is the one alpha read under, and so is its reading
    e.rotate(&owner(&e), "gamma").unwrap();
    let page = e.sync(a, "r", None).unwrap();
    assert_eq!(page["view_changed"], false);
    assert_eq!(
        page["confirmed_seq"], read,
        "alpha's checkpoint holds again"
    );
    e.turn(a, Verb::Say, say("two", Some(&receipt(&page))))
        .expect("what alpha read under this view still counts");

    // a reset never comes back: after it, alpha reads again before it acts
    catch_up(&e, a);
    e.room_reset(&owner(&e).control(), "r").unwrap();
    let before = tip(&e);
    let r = e
        .turn(a, Verb::Say, say("after the reset", None))
        .unwrap_err();
    assert_eq!(r.code, Code::RoomSyncViewChanged);
    assert_eq!(tip(&e), before, "the refused turn wrote nothing");
    let page = e.sync(a, "r", None).unwrap();
    assert_eq!(page["view_changed"], true);
}
