//! Engine-level tests for what the daemon cannot reach deterministically: the race between a
//! turn's preparation and its commit, the Fold Rule, page chunking, completion of an interrupted
//! second flush, HLC order under a clock that steps back, and an index upgraded from schema 1.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests edit real files

use room_core::env::{ManualClock, SeededEntropy};
use room_core::{Code, Tier, Verb};
use room_engine::principal::AgentCaller;
use room_engine::verbs::TurnArgs;
use room_engine::{Engine, EngineConfig, Env};
use room_store::fs::RealFs;
use room_store::shard::Shard;
use room_store::statedir;
use room_store::{SqliteBackend, SqliteBackendConfig};
use serde_json::{Value, json};
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
            runner: std::sync::Arc::new(room_core::env::NoRunner),
        };
        let store = Arc::new(SqliteBackend::new(&s, SqliteBackendConfig::default()));
        Engine::open(s, env, store, EngineConfig::default()).unwrap()
    }

    /// An engine whose appends each sync their own journal: what it writes is never in a
    /// commit log, so damage a test does to the journal after an unclean stop stays damage
    /// (a replay would put back the log's copy of what it damaged).
    fn engine_syncing_each_append(&self, seed: u64) -> Engine {
        let s = statedir::validate(&self.state, &self.boot).unwrap();
        let env = Env {
            clock: self.clock.clone(),
            entropy: Arc::new(SeededEntropy::new(seed)),
            fs: Arc::new(RealFs),
            runner: std::sync::Arc::new(room_core::env::NoRunner),
        };
        let config = SqliteBackendConfig {
            journal_sync: room_store::JournalSync::PerAppend,
            ..SqliteBackendConfig::default()
        };
        let store = Arc::new(SqliteBackend::new(&s, config));
        Engine::open(s, env, store, EngineConfig::default()).unwrap()
    }
}

/// The shard of the fixture's one room.
fn only_shard(f: &Fixture) -> Shard {
    let mut all = room_store::shard::on_disk(&f.state.join("rooms")).unwrap();
    assert_eq!(all.len(), 1, "one room");
    all.remove(0).0
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

fn agent(e: &Engine, name: &str, tier: Tier) -> AgentCaller {
    let t = e.enroll(&owner(e), name, tier, "generic").unwrap().token;
    AgentCaller {
        token: t,
        conversation: "c1".into(),
        declared_tier: None,
        page_bytes_max: None,
    }
}

fn catch_up(e: &Engine, a: &AgentCaller, room: &str) -> Vec<Value> {
    let mut pages = vec![];
    let mut page = e.sync(a, room, None).unwrap();
    loop {
        let receipt = page["receipt"].as_str().unwrap().to_string();
        let more = page["more"] == true;
        pages.push(page);
        page = e.sync(a, room, Some(&receipt)).unwrap();
        if !more {
            break;
        }
    }
    pages
}

fn say(room: &str, text: &str) -> TurnArgs {
    TurnArgs {
        room: room.into(),
        text: Some(text.into()),
        ..Default::default()
    }
}

fn tip(e: &Engine, room: &str) -> u64 {
    e.room_log(&owner(e), room, 1, 1).unwrap()["tip_seq"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_foreign_arrival_between_prepare_and_commit_is_refused_and_writes_nothing() {
    let f = Fixture::new();
    let e = f.engine(1);
    let a = agent(&e, "alpha", Tier::Member);
    let b = agent(&e, "beta", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    catch_up(&e, &a, "r");
    catch_up(&e, &b, "r");
    let prepared = e.prepare_turn(&a, Verb::Say, say("r", "mine")).unwrap();
    e.turn(&b, Verb::Say, say("r", "theirs")).unwrap();
    let before = tip(&e, "r");
    let err = e.commit_turn(prepared).unwrap_err();
    assert_eq!(err.code, Code::RoomSyncConcurrentArrival);
    assert_eq!(tip(&e, "r"), before);
}

#[test]
fn the_fold_rule_lets_an_author_continue_over_its_own_turns_only() {
    let f = Fixture::new();
    let e = f.engine(2);
    let a = agent(&e, "alpha", Tier::Member);
    let b = agent(&e, "beta", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    catch_up(&e, &a, "r");
    e.turn(&a, Verb::Say, say("r", "one")).unwrap();
    e.turn(&a, Verb::Say, say("r", "two")).unwrap();
    catch_up(&e, &b, "r");
    e.turn(&b, Verb::Note, say("r", "status")).unwrap();
    let err = e.turn(&a, Verb::Say, say("r", "three")).unwrap_err();
    assert_eq!(err.code, Code::RoomSyncRequired);
    // the refusal hands over the unread page, and confirming it opens the gate
    let receipt = err.detail["next_page"]["receipt"]
        .as_str()
        .unwrap()
        .to_string();
    e.sync(&a, "r", Some(&receipt)).unwrap();
    e.turn(&a, Verb::Say, say("r", "three")).unwrap();
    // another conversation of the same agent has its own checkpoint
    let a2 = AgentCaller {
        conversation: "c2".into(),
        ..a.clone()
    };
    assert_eq!(
        e.turn(&a2, Verb::Say, say("r", "four")).unwrap_err().code,
        Code::RoomSyncRequired
    );
}

#[test]
fn oversized_events_arrive_in_utf8_safe_chunks_and_only_item_complete_advances() {
    let f = Fixture::new();
    let e = f.engine(3);
    let a = agent(&e, "alpha", Tier::Member);
    let b = agent(&e, "beta", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    catch_up(&e, &a, "r");
    let big: String = "é€x".repeat(12_000); // multi-byte characters across chunk edges, > 8 KiB: a blob
    let sent = e.turn(&a, Verb::Say, say("r", &big)).unwrap();
    let seq = sent["seq"].as_u64().unwrap();
    let mut page = e.sync(&b, "r", None).unwrap();
    let mut data = String::new();
    let mut pages = 0;
    let mut reassembler = room_core::chunk::Reassembler::new(1 << 22);
    let mut whole: Option<String> = None;
    loop {
        pages += 1;
        assert!(
            serde_json::to_vec(&page).unwrap().len() <= 24 * 1024,
            "a page is at most 24 KiB"
        );
        let mut complete = false;
        for item in page["items"].as_array().unwrap() {
            if item["seq"].as_u64() == Some(seq) {
                let frag = item["fragment"]
                    .as_str()
                    .expect("the big event arrives in fragments");
                assert!(item["data"].as_str().unwrap().len() <= 1024);
                data.push_str(item["data"].as_str().unwrap());
                let f: room_core::chunk::Fragment = serde_json::from_value(item.clone()).unwrap();
                if let Some(w) = reassembler.push(&f).unwrap() {
                    whole = Some(w);
                }
                complete = frag == "item_complete";
            }
        }
        let receipt = page["receipt"].as_str().unwrap().to_string();
        let more = page["more"] == true;
        page = e.sync(&b, "r", Some(&receipt)).unwrap();
        let confirmed = page["confirmed"]["confirmed_seq"].as_u64().unwrap();
        if complete {
            assert_eq!(confirmed, seq);
        } else if data.is_empty() {
            assert!(confirmed < seq);
        } else {
            assert_eq!(confirmed, seq - 1, "a chunk never advances past its event");
        }
        if !more {
            break;
        }
    }
    assert!(pages > 2);
    assert_eq!(
        whole.as_deref(),
        Some(data.as_str()),
        "the reassembler agrees"
    );
    let item: Value = serde_json::from_str(&data).unwrap();
    assert_eq!(item["event"]["text"].as_str().unwrap(), big);
}

#[test]
fn an_interrupted_second_flush_is_completed_at_open_with_the_same_ids() {
    let f = Fixture::new();
    let (room_dir, first) = {
        let e = f.engine(4);
        let a = agent(&e, "alpha", Tier::Member);
        agent(&e, "beta", Tier::Member);
        e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
            .unwrap();
        catch_up(&e, &a, "r");
        let sent = e
            .turn(
                &a,
                Verb::Send,
                TurnArgs {
                    to: vec!["beta".into()],
                    ..say("r", "please look")
                },
            )
            .unwrap();
        let shard = only_shard(&f);
        (shard, sent)
    };
    // Simulate a crash after flush 1: drop the last journal line (flush 2), the index and the wake.
    let journal = room_dir.journal();
    let text = std::fs::read_to_string(&journal).unwrap();
    // the records, without the preallocated zeros after them
    let text = text.trim_end_matches('\0');
    let mut lines: Vec<&str> = text.lines().collect();
    assert!(lines.last().unwrap().contains("\"kind\":\"items\""));
    lines.pop();
    std::fs::write(&journal, lines.join("\n") + "\n").unwrap();
    for f in room_dir.index_files() {
        let _ = std::fs::remove_file(f);
    }
    // the engine was dropped without a flush: its wake permit never reached the queue
    let wake = first["wakes"][0].as_str().unwrap().to_string();

    let e = f.engine(5);
    let log = e.room_log(&owner(&e), "r", 1, 100).unwrap();
    let ob: Vec<&Value> = log["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "obligation")
        .collect();
    assert_eq!(ob.len(), 1);
    assert_eq!(
        ob[0]["id"], first["obligations"][0]["id"],
        "completion re-derives the same obligation id"
    );
    let queued = e.wakes_view(&owner(&e), Some("r")).unwrap();
    let paths: Vec<&str> = queued["wakes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["intact"] == true)
        .map(|w| w["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [wake.as_str()],
        "the wake permit is re-sealed and queued"
    );
    // opening again completes nothing more
    drop(e);
    let e = f.engine(6);
    assert_eq!(
        e.room_log(&owner(&e), "r", 1, 100).unwrap()["tip_seq"],
        log["tip_seq"]
    );
}

#[test]
fn a_clock_that_steps_back_still_yields_a_verifying_chain() {
    let f = Fixture::new();
    let e = f.engine(7);
    let a = agent(&e, "alpha", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into()])
        .unwrap();
    catch_up(&e, &a, "r");
    for i in 0..20 {
        if i % 3 == 0 {
            f.clock.set(1_700_000_000_000 - i * 1000);
        }
        e.turn(&a, Verb::Note, say("r", &format!("n{i}"))).unwrap();
    }
    let shard = only_shard(&f);
    let graph = shard.read_manifest().unwrap().graph_id;
    let report = room_store::journal::verify(&shard.journal(), &graph).unwrap();
    assert_eq!(report.records, 21);
}

#[test]
fn a_policy_change_under_a_partly_read_chunked_event_is_refused_not_a_crash() {
    let f = Fixture::new();
    let e = f.engine(8);
    let a = agent(&e, "alpha", Tier::Member);
    let b = agent(&e, "beta", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    catch_up(&e, &a, "r");
    catch_up(&e, &b, "r");
    let big = format!("{}é", "secret-1 ".repeat(4000));
    e.turn(&a, Verb::Say, say("r", &big)).unwrap();
    let page = e.sync(&b, "r", None).unwrap();
    assert_eq!(page["items"][0]["fragment"], "item_chunk");
    let receipt = page["receipt"].as_str().unwrap().to_string();
    let cfg = f.state.join("config.toml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("patterns = []", "patterns = [\"(secret-1 )+\"]");
    std::fs::write(&cfg, text).unwrap();
    let err = e.sync(&b, "r", Some(&receipt)).unwrap_err();
    assert_eq!(err.code, Code::RoomSyncDeliveryPolicyChanged);
    // the room still works: a fresh read under the new policy goes through
    catch_up(&e, &b, "r");
}

/// Fails exactly the `n`-th append (counting from 1) with a write error.
#[derive(Debug)]
struct FailNth(std::sync::atomic::AtomicU64, u64);

impl room_store::journal::Faults for FailNth {
    fn on_append(&self, _: &std::path::Path, _: usize) -> Option<room_store::journal::Fault> {
        let k = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        (k == self.1).then_some(room_store::journal::Fault::WriteError(
            std::io::ErrorKind::StorageFull,
        ))
    }
}

#[test]
fn a_turn_whose_second_flush_fails_halts_the_room_and_is_completed_at_restart() {
    let f = Fixture::new();
    let (sent_ob, before) = {
        let e = f.engine(9);
        let a = agent(&e, "alpha", Tier::Member);
        agent(&e, "beta", Tier::Member);
        e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
            .unwrap();
        catch_up(&e, &a, "r");
        drop(e);
        // reopen with a fault on the second append from now: the send's flush 2
        let s = room_store::statedir::validate(&f.state, &f.boot).unwrap();
        let env = Env {
            clock: f.clock.clone(),
            entropy: Arc::new(SeededEntropy::new(10)),
            fs: Arc::new(RealFs),
            runner: std::sync::Arc::new(room_core::env::NoRunner),
        };
        let store = SqliteBackendConfig {
            faults: Some(Arc::new(FailNth(0.into(), 2))),
            ..SqliteBackendConfig::default()
        };
        let store = Arc::new(SqliteBackend::new(&s, store));
        let e = Engine::open(s, env, store, EngineConfig::default()).unwrap();
        let err = e
            .turn(
                &a,
                Verb::Send,
                TurnArgs {
                    to: vec!["beta".into()],
                    ..say("r", "please")
                },
            )
            .unwrap_err();
        assert_eq!(err.code, Code::StorageFailed);
        assert_eq!(err.detail["journal_committed"], true, "{err:?}");
        let source = err.detail["event"].as_str().unwrap().to_string();
        // nothing may land after the incomplete turn
        let again = e.turn(&a, Verb::Note, say("r", "later")).unwrap_err();
        assert_eq!(again.code, Code::StorageFailed);
        (room_engine_item_id("obl", &source, "beta"), tip(&e, "r"))
    };
    let e = f.engine(11);
    let log = e.room_log(&owner(&e), "r", 1, 100).unwrap();
    assert_eq!(
        log["tip_seq"].as_u64().unwrap(),
        before + 1,
        "flush 2 was completed at open"
    );
    assert!(
        log["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == sent_ob.as_str())
    );
}

fn room_engine_item_id(prefix: &str, source: &str, agent: &str) -> String {
    room_engine::event::item_id(prefix, source, agent)
}

#[test]
fn a_damaged_journal_is_quarantined_at_open_and_a_rebuild_refuses_to_write_over_it() {
    let f = Fixture::new();
    let e = f.engine_syncing_each_append(12);
    let a = agent(&e, "alpha", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into()])
        .unwrap();
    catch_up(&e, &a, "r");
    for i in 0..3 {
        e.turn(&a, Verb::Note, say("r", &format!("n{i}"))).unwrap();
    }
    drop(e);
    // corrupt a record in the middle, keeping the length (so reconciliation alone would pass;
    // the stop was unclean, so the open verifies the whole chain)
    let shard = only_shard(&f);
    let journal = shard.journal();
    let text = std::fs::read_to_string(&journal)
        .unwrap()
        .replacen("\"n0\"", "\"X0\"", 1);
    std::fs::write(&journal, text).unwrap();
    let e = f.engine(13);
    let refused = e.turn(&a, Verb::Note, say("r", "before")).unwrap_err();
    assert_eq!(refused.code, Code::RoomQuarantined, "{refused:?}");
    let before = std::fs::read(&journal).unwrap();
    let err = e.index_rebuild(&owner(&e), "r", false).unwrap_err();
    assert_eq!(err.code, Code::JournalLossUnaccepted, "{err:?}");
    assert_eq!(
        std::fs::read(&journal).unwrap(),
        before,
        "a refusal changes nothing"
    );
    let refused = e.turn(&a, Verb::Note, say("r", "after")).unwrap_err();
    assert_eq!(
        refused.code,
        Code::RoomQuarantined,
        "the journal is still not accepted"
    );
    // and the room is still listed, as quarantined (its lock was not poisoned)
    let listed = &e.rooms_view(&owner(&e)).unwrap()["rooms"][0];
    assert!(listed["read_only"].is_string());
    assert!(
        listed["quarantined"]["reason"]
            .as_str()
            .unwrap()
            .contains("record"),
        "{listed}"
    );
}

#[test]
fn the_audit_walks_every_causal_ancestor() {
    let f = Fixture::new();
    let e = f.engine(14);
    let a = agent(&e, "alpha", Tier::Member);
    let b = agent(&e, "beta", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    catch_up(&e, &a, "r");
    let sent = e
        .turn(
            &a,
            Verb::Send,
            TurnArgs {
                to: vec!["beta".into()],
                ..say("r", "look")
            },
        )
        .unwrap();
    let src = sent["event"].as_str().unwrap().to_string();
    catch_up(&e, &b, "r");
    let reply = e
        .turn(
            &b,
            Verb::Reply,
            TurnArgs {
                reply_to: Some(src.clone()),
                ..say("r", "done")
            },
        )
        .unwrap();
    catch_up(&e, &a, "r");
    let again = e
        .turn(
            &a,
            Verb::Say,
            TurnArgs {
                reply_to: Some(reply["event"].as_str().unwrap().into()),
                ..say("r", "thanks")
            },
        )
        .unwrap();
    let audit = e
        .room_audit(&owner(&e), "r", again["event"].as_str().unwrap())
        .unwrap();
    let ids: Vec<&str> = audit["ancestors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec![src.as_str(), reply["event"].as_str().unwrap()],
        "send, then the reply, in seq order"
    );
    assert_eq!(
        e.room_audit(&owner(&e), "r", "nonsense").unwrap_err().code,
        Code::InvalidArgument
    );
}

/// A state dir from before the invariants (sync index at schema 1, no lifecycles) opens with
/// its journal replayed into the new tables: a task claimed before the upgrade can be finished.
#[test]
fn an_upgraded_index_replays_claims_into_lifecycles() {
    let fx = Fixture::new();
    let (a, t) = {
        let e = fx.engine(1);
        let a = agent(&e, "alpha", Tier::Coordinator);
        e.room_create(&owner(&e), "r", None, &["alpha".into()])
            .unwrap();
        let t = e
            .task_create(
                &a,
                room_engine::verbs::TaskCreateArgs {
                    room: "r".into(),
                    title: "t".into(),
                    to: Some("alpha".into()),
                    ..Default::default()
                },
            )
            .unwrap()["task"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        e.task_claim(&a, &t, None).unwrap();
        e.flush_indexes();
        (a, t)
    };
    // turn the index back into schema 1 as an older build left it
    room_store::fixtures::index_back_to_schema_1(&only_shard(&fx).index()).unwrap();
    let e = fx.engine(2);
    let a = AgentCaller {
        token: a.token,
        ..a
    };
    catch_up(&e, &a, "r");
    let done = e.turn(
        &a,
        Verb::Done,
        TurnArgs {
            room: "r".into(),
            task: Some(t.clone()),
            ..Default::default()
        },
    );
    assert!(done.is_ok(), "done after the upgrade: {done:?}");
}

/// A state dir from before the wake queue moved into control.db (permits were files, control.db
/// at schema 2) queues every permit its journals imply when it first opens, and only then.
#[test]
fn permits_sealed_before_the_queue_existed_are_queued_at_the_upgrade() {
    let fx = Fixture::new();
    let paths = |e: &Engine| -> Vec<String> {
        e.wakes_view(&owner(e), None).unwrap()["wakes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["intact"] == true)
            .map(|w| w["path"].as_str().unwrap().to_string())
            .collect()
    };
    let before = {
        let e = fx.engine(1);
        let a = agent(&e, "alpha", Tier::Member);
        agent(&e, "beta", Tier::Member);
        e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
            .unwrap();
        for text in ["one", "two"] {
            catch_up(&e, &a, "r");
            e.turn(
                &a,
                Verb::Send,
                TurnArgs {
                    to: vec!["beta".into()],
                    ..say("r", text)
                },
            )
            .unwrap();
        }
        e.flush_indexes();
        paths(&e)
    };
    assert_eq!(before.len(), 2);
    // control.db back at schema 2, as an older build left it (its permits were files)
    room_store::fixtures::control_back_to_schema_2(&fx.state.join("control.db")).unwrap();
    // a policy under which no permit can be sealed: the re-queue fails; the daemon still opens,
    // the room with permits refuses writes, and the request stays for the next start
    let cfg = fx.state.join("config.toml");
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, good.replace("patterns = []", "patterns = [\"(\"]")).unwrap();
    {
        let e = fx.engine(2);
        let rooms = e.rooms_view(&owner(&e)).unwrap();
        assert!(
            rooms["rooms"][0]["read_only"]
                .as_str()
                .is_some_and(|why| why.contains("re-queueing")),
            "{rooms}"
        );
    }
    std::fs::write(&cfg, good).unwrap();
    let e = fx.engine(3);
    assert!(e.rooms_view(&owner(&e)).unwrap()["rooms"][0]["read_only"].is_null());
    assert_eq!(paths(&e), before, "every permit is queued at the upgrade");
    drop(e);
    // once: the request is gone after it was carried out
    assert!(
        !room_store::fixtures::control_meta_has(&fx.state.join("control.db"), "wakes_requeue")
            .unwrap()
    );
}

/// A sync page lists the oldest open items addressed to the reader, at most
/// `OPEN_ITEMS_PAGE_MAX`, without the fields every listed item shares, and the total; answering
/// the oldest brings the next one up.
#[test]
fn a_sync_page_lists_the_oldest_open_items_and_their_total() {
    let f = Fixture::new();
    let e = f.engine(7);
    let a = agent(&e, "alpha", Tier::Member);
    let b = agent(&e, "beta", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    let n = room_engine::verbs::OPEN_ITEMS_PAGE_MAX + 3;
    let mut sources = vec![];
    for k in 0..n {
        catch_up(&e, &a, "r");
        let args = TurnArgs {
            to: vec!["beta".into()],
            ..say("r", &format!("question {k}"))
        };
        let out = e.turn(&a, Verb::Say, args).unwrap();
        sources.push(out["event"].as_str().unwrap().to_string());
    }
    let pages = catch_up(&e, &b, "r");
    let last = pages.last().unwrap();
    assert_eq!(last["open_items_total"], n as u64);
    let open = last["open_items"].as_array().unwrap();
    assert_eq!(open.len(), room_engine::verbs::OPEN_ITEMS_PAGE_MAX);
    let listed: Vec<&str> = open.iter().map(|i| i["source"].as_str().unwrap()).collect();
    assert_eq!(
        listed,
        sources[..open.len()]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    for i in open {
        assert_eq!(i["kind"], "mention");
        assert_eq!(i["from"], "alpha");
        for shared in ["agent", "status", "resolved_by"] {
            assert!(i.get(shared).is_none(), "{shared} in {i}");
        }
    }
    // an untargeted say over items from more sources than a page lists is refused, naming the
    // oldest sources only, and writes nothing
    let before = tip(&e, "r");
    let err = e.turn(&b, Verb::Say, say("r", "which one?")).unwrap_err();
    assert_eq!(err.code, Code::SayReplyTargetAmbiguous);
    let named: Vec<&str> = err.detail["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(named, listed);
    assert_eq!(err.detail["sources_truncated"], true);
    assert_eq!(tip(&e, "r"), before);
    // answering the oldest brings the next one up
    let oldest = open[0]["id"].as_str().unwrap().to_string();
    let reply = TurnArgs {
        reply_to: Some(oldest.clone()),
        ..say("r", "answered")
    };
    e.turn(&b, Verb::Reply, reply).unwrap();
    let page = e.sync(&b, "r", None).unwrap();
    assert_eq!(page["open_items_total"], n as u64 - 1);
    assert_eq!(page["open_items"][0]["source"], sources[1].as_str());
    assert_eq!(
        page["open_items"].as_array().unwrap().last().unwrap()["source"],
        sources[room_engine::verbs::OPEN_ITEMS_PAGE_MAX].as_str()
    );
    // a reply may name the source event instead of the item
    catch_up(&e, &b, "r");
    let reply = TurnArgs {
        reply_to: Some(sources[1].clone()),
        ..say("r", "answered too")
    };
    let out = e.turn(&b, Verb::Reply, reply).unwrap();
    assert_eq!(out["resolved"].as_array().map(Vec::len), Some(1), "{out}");
    let page = e.sync(&b, "r", None).unwrap();
    assert_eq!(page["open_items_total"], n as u64 - 2);
}

#[test]
fn only_a_gated_verb_reaches_a_turn() {
    let f = Fixture::new();
    let e = f.engine(9);
    let a = agent(&e, "alpha", Tier::Coordinator);
    e.room_create(&owner(&e), "r", None, &["alpha".into()])
        .unwrap();
    catch_up(&e, &a, "r");
    let before = tip(&e, "r");
    for verb in Verb::ALL.into_iter().filter(|v| !v.is_gated()) {
        let err = e.turn(&a, verb, say("r", "hello")).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert_eq!(
            &*err.message,
            format!("verb: {verb} is not a contribution verb")
        );
    }
    assert_eq!(tip(&e, "r"), before);
}

/// A creation that fails at any step leaves nothing: no control row, no shard in the room
/// space (what it wrote is set aside, out of `verify`'s way), and the same name can be created
/// afterwards.
#[test]
fn a_failed_creation_leaves_no_room_behind() {
    let f = Fixture::new();
    let s = statedir::validate(&f.state, &f.boot).unwrap();
    let env = Env {
        clock: f.clock.clone(),
        entropy: Arc::new(SeededEntropy::new(21)),
        fs: Arc::new(RealFs),
        runner: std::sync::Arc::new(room_core::env::NoRunner),
    };
    // the first append from now is the new room's first record
    let store = SqliteBackendConfig {
        faults: Some(Arc::new(FailNth(0.into(), 1))),
        ..SqliteBackendConfig::default()
    };
    let store = Arc::new(SqliteBackend::new(&s, store));
    let e = Engine::open(s, env, store, EngineConfig::default()).unwrap();
    agent(&e, "alpha", Tier::Member);
    let err = e
        .room_create(&owner(&e), "r", None, &["alpha".into()])
        .unwrap_err();
    assert_eq!(err.code, Code::StorageFailed, "{err:?}");
    let rooms = e.rooms_view(&owner(&e)).unwrap();
    assert_eq!(rooms["rooms"].as_array().unwrap().len(), 0, "{rooms}");
    assert!(
        room_store::shard::on_disk(&f.state.join("rooms"))
            .unwrap()
            .is_empty(),
        "no shard in the room space"
    );
    assert_eq!(
        std::fs::read_dir(f.state.join("rooms")).unwrap().count(),
        0,
        "not even a staging directory"
    );
    // the fault was one-off: the same name now creates a whole room
    e.room_create(&owner(&e), "r", None, &["alpha".into()])
        .unwrap();
    assert_eq!(only_shard(&f).read_manifest().unwrap().room, "r");
}

/// A room that cannot be opened at start does not keep the daemon from starting: it is
/// reported as unusable and refused, and every other room works.
#[test]
fn an_unusable_room_at_start_is_reported_and_the_others_work() {
    let f = Fixture::new();
    let a = {
        let e = f.engine(22);
        let a = agent(&e, "alpha", Tier::Member);
        for r in ["bad", "good"] {
            e.room_create(&owner(&e), r, None, &["alpha".into()])
                .unwrap();
        }
        a
    };
    let bad = room_store::shard::on_disk(&f.state.join("rooms"))
        .unwrap()
        .into_iter()
        .find(|(_, m)| m.room == "bad")
        .unwrap()
        .0;
    std::fs::write(bad.binding(), b"not json").unwrap();
    let e = f.engine(23);
    let rooms = e.rooms_view(&owner(&e)).unwrap();
    let listed = rooms["rooms"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{rooms}");
    assert!(listed[0]["unusable"].as_str().unwrap().contains("binding"));
    assert!(listed[1]["unusable"].is_null());
    let err = e.sync(&a, "bad", None).unwrap_err();
    assert_eq!(err.code, Code::StorageFailed, "{err:?}");
    catch_up(&e, &a, "good");
    e.turn(&a, Verb::Note, say("good", "still here")).unwrap();
}

/// Leases have a fencing generation that only grows and a TTL: a lapsed claim's lease is
/// released (recorded in doubt), another claim may then take the scope, the lapsed holder's
/// `done` is refused until it claims afresh, and its fresh claim meets the new holder.
#[test]
fn a_lapsed_lease_is_released_by_generation_and_its_holder_must_claim_afresh() {
    let f = Fixture::new();
    let e = f.engine(7);
    let a = agent(&e, "alpha", Tier::Coordinator);
    let b = agent(&e, "beta", Tier::Member);
    let g = agent(&e, "gamma", Tier::Member);
    e.room_create(
        &owner(&e),
        "r",
        None,
        &["alpha".into(), "beta".into(), "gamma".into()],
    )
    .unwrap();
    let create = |to: &str| {
        e.task_create(
            &a,
            room_engine::verbs::TaskCreateArgs {
                room: "r".into(),
                title: format!("edit the parser for {to}"),
                to: Some(to.into()),
                scopes: vec!["file:src/parser".into()],
                ..Default::default()
            },
        )
        .unwrap()["task"]["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (tb, tg) = (create("beta"), create("gamma"));
    let claimed = e.task_claim(&b, &tb, Some(1_000)).unwrap();
    let first = claimed["lease"]["generation"].as_u64().unwrap();
    assert!(first >= 1);
    assert_eq!(claimed["lease"]["scopes"][0], "file:src/parser");
    // gamma's claim on the same scope conflicts while beta's lease is live
    let r = e.task_claim(&g, &tg, None).unwrap_err();
    assert_eq!(r.code, Code::LeaseConflict);
    assert_eq!(r.detail["invariant"], "exclusive");
    assert!(r.message.contains("beta"), "the holder is named: {r}");
    // the TTL runs out: the sweep records the lapse and releases the lease by its generation
    f.clock.advance(5_000);
    assert_eq!(e.sweep_invariants().unwrap(), 1);
    let shown = e.task_view_owner(&owner(&e), &tb).unwrap();
    assert!(shown["lease"].is_null(), "released: {shown}");
    assert_eq!(
        shown["task"]["status"], "claimed",
        "the task stays in doubt"
    );
    let log = e.room_log(&owner(&e), "r", 1, 1000).unwrap();
    let lapse = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|ev| ev["event"]["invariant"] == "resolution")
        .unwrap()
        .clone();
    assert_eq!(lapse["event"]["detail"]["lease_generation"], first);
    // now gamma may lease the scope, with a higher generation
    let second = e.task_claim(&g, &tg, None).unwrap()["lease"]["generation"]
        .as_u64()
        .unwrap();
    assert!(second > first);
    // beta's done on the lapsed claim is refused: its scope changed hands
    catch_up(&e, &b, "r");
    let r = e
        .turn(
            &b,
            Verb::Done,
            TurnArgs {
                room: "r".into(),
                task: Some(tb.clone()),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(r.code, Code::TaskStateInvalid, "{r}");
    assert_eq!(r.detail["fresh_claim_required"], true);
    // a fresh claim meets gamma's live lease
    let r = e.task_claim(&b, &tb, None).unwrap_err();
    assert_eq!(r.detail["invariant"], "exclusive");
    // once gamma is done, beta claims afresh (a third generation) and may finish
    catch_up(&e, &g, "r");
    e.turn(
        &g,
        Verb::Done,
        TurnArgs {
            room: "r".into(),
            task: Some(tg.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let third = e.task_claim(&b, &tb, None).unwrap()["lease"]["generation"]
        .as_u64()
        .unwrap();
    assert!(third > second);
    catch_up(&e, &b, "r");
    e.turn(
        &b,
        Verb::Done,
        TurnArgs {
            room: "r".into(),
            task: Some(tb),
            ..Default::default()
        },
    )
    .unwrap();
    // the generation survives a restart: the next one is higher still
    drop(e);
    let e = f.engine(8);
    let a = agent(&e, "delta", Tier::Coordinator);
    e.room_members_add(&owner(&e), "r", "delta").unwrap();
    let t = e
        .task_create(
            &a,
            room_engine::verbs::TaskCreateArgs {
                room: "r".into(),
                title: "again".into(),
                to: Some("delta".into()),
                scopes: vec!["file:src".into()],
                ..Default::default()
            },
        )
        .unwrap()["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let fourth = e.task_claim(&a, &t, None).unwrap()["lease"]["generation"]
        .as_u64()
        .unwrap();
    assert!(fourth > third);
}

/// The flood bound keeps a looping agent from filling the journal, yet every rejection is
/// accounted for: past 16 records per actor, room and minute the rest are counted, and one
/// aggregate record per window says how many were left out.
#[test]
fn rejections_past_the_flood_bound_leave_one_aggregate_record_per_window() {
    let f = Fixture::new();
    let e = f.engine(9);
    let a = agent(&e, "alpha", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into()])
        .unwrap();
    catch_up(&e, &a, "r");
    let keyed = TurnArgs {
        idempotency_key: Some("k-1".into()),
        ..say("r", "once")
    };
    e.turn(&a, Verb::Note, keyed.clone()).unwrap();
    let records = |e: &Engine| -> Vec<Value> {
        e.room_log(&owner(e), "r", 1, 1000).unwrap()["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|ev| ev["kind"] == "invariant_violation")
            .cloned()
            .collect()
    };
    let mut rate_limited = 0;
    for _ in 0..20 {
        let r = e.turn(&a, Verb::Note, keyed.clone()).unwrap_err();
        assert_eq!(r.detail["invariant"], "exactly_once");
        if r.detail["violation_recorded"] == "rate_limited" {
            rate_limited += 1;
        }
    }
    assert_eq!(rate_limited, 4);
    assert_eq!(records(&e).len(), 16, "16 records of their own");
    // within the window the sweep writes nothing yet
    e.sweep_invariants().unwrap();
    assert_eq!(records(&e).len(), 16);
    f.clock.advance(61_000);
    e.sweep_invariants().unwrap();
    let all = records(&e);
    assert_eq!(all.len(), 17);
    let agg = &all[16]["event"];
    assert_eq!(agg["act"], "suppressed");
    assert_eq!(agg["invariant"], "exactly_once");
    assert_eq!(agg["actor"], "alpha");
    assert_eq!(agg["detail"]["suppressed"], 4);
    e.sweep_invariants().unwrap();
    assert_eq!(records(&e).len(), 17, "once");
}

/// `resolution` for the destination ledger: an operation unresolved past its TTL is recorded
/// in doubt by the sweep (once), and a destination check then reads `in_doubt`, never success.
#[test]
fn an_operation_unresolved_past_its_ttl_is_in_doubt() {
    let f = Fixture::new();
    let e = f.engine(11);
    let a = agent(&e, "alpha", Tier::Coordinator);
    e.room_create(&owner(&e), "r", None, &["alpha".into()])
        .unwrap();
    let t = e
        .task_create(
            &a,
            room_engine::verbs::TaskCreateArgs {
                room: "r".into(),
                title: "call the api".into(),
                to: Some("alpha".into()),
                accept: vec![serde_json::json!({"kind": "destination"})],
                ..Default::default()
            },
        )
        .unwrap()["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    e.task_claim(&a, &t, None).unwrap();
    let op = e
        .op_begin(
            &a,
            room_engine::ledger::OpBeginArgs {
                room: "r".into(),
                task: t.clone(),
                destination: "api:billing".into(),
                ttl_ms: Some(1_000),
                ..Default::default()
            },
        )
        .unwrap()["op"]
        .as_str()
        .unwrap()
        .to_string();
    f.clock.advance(2_000);
    assert_eq!(e.sweep_invariants().unwrap(), 1);
    assert_eq!(e.sweep_invariants().unwrap(), 0, "once");
    let log = e.room_log(&owner(&e), "r", 1, 1000).unwrap();
    let rec = log["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(rec["event"]["invariant"], "resolution");
    assert_eq!(rec["event"]["severity"], "in_doubt");
    assert_eq!(rec["event"]["detail"]["op"], op.as_str());
    let ev = e.task_check_owner(&owner(&e), &t).unwrap();
    let d = &ev["acceptance_results"][0]["detail"];
    assert_eq!(d["status"], "in_doubt", "{ev}");
    assert_eq!(ev["acceptance_pass"], false);
    // the claim's own lifecycle is not the operation's: it is still begun
    catch_up(&e, &a, "r");
    let r = e
        .turn(
            &a,
            Verb::Done,
            TurnArgs {
                room: "r".into(),
                task: Some(t),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(r.code, Code::TaskAcceptanceFailed);
}

/// `room index rebuild` onto a shorter journal (an accepted loss) leaves control.db's tasks as
/// the journal says: a `done` the journal lost is undone there too, and the claim's lease is
/// held again; a task whose creation was lost is gone.
#[test]
fn a_rebuild_onto_a_shorter_journal_reconciles_tasks_and_leases() {
    let f = Fixture::new();
    let e = f.engine_syncing_each_append(21);
    let a = agent(&e, "alpha", Tier::Coordinator);
    e.room_create(&owner(&e), "r", None, &["alpha".into()])
        .unwrap();
    let create = |title: &str| {
        e.task_create(
            &a,
            room_engine::verbs::TaskCreateArgs {
                room: "r".into(),
                title: title.into(),
                to: Some("alpha".into()),
                scopes: vec![format!("file:{title}")],
                ..Default::default()
            },
        )
        .unwrap()["task"]["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let kept = create("kept");
    e.task_claim(&a, &kept, None).unwrap();
    catch_up(&e, &a, "r");
    e.flush_indexes();
    let shard = only_shard(&f);
    let journal = shard.journal();
    // the file is preallocated: the records so far end at the last newline
    let lines_kept = std::fs::read(&journal)
        .unwrap()
        .iter()
        .filter(|&&b| b == b'\n')
        .count();
    e.turn(
        &a,
        Verb::Done,
        TurnArgs {
            room: "r".into(),
            task: Some(kept.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let lost = create("lost");
    assert_eq!(
        e.task_view_owner(&owner(&e), &kept).unwrap()["task"]["status"],
        "done"
    );
    drop(e);
    // the journal loses everything after the claim
    let bytes = std::fs::read(&journal).unwrap();
    let cut = bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(lines_kept - 1)
        .unwrap()
        .0
        + 1;
    std::fs::write(&journal, &bytes[..cut]).unwrap();
    let e = f.engine(22);
    let r = e.index_rebuild(&owner(&e), "r", false).unwrap_err();
    assert_eq!(r.code, Code::JournalLossUnaccepted, "{r}");
    e.index_rebuild(&owner(&e), "r", true).unwrap();
    let shown = e.task_view_owner(&owner(&e), &kept).unwrap();
    assert_eq!(shown["task"]["status"], "claimed", "{shown}");
    assert_eq!(shown["lease"]["holder"], "alpha", "{shown}");
    let gone = e.task_view_owner(&owner(&e), &lost).unwrap_err();
    assert_eq!(gone.code, Code::TaskNotFound);
}

/// The seed's Exhibit 3: a permit whose deadline passes in the queue is dead-lettered
/// (`wake_job_expired`, queue time counts against the original deadline); one whose sealed
/// fields were altered is `wake_job_binding_changed`.
#[test]
fn permits_expire_in_the_queue_and_a_tampered_one_is_refused() {
    let f = Fixture::new();
    let e = f.engine(9);
    let a = agent(&e, "alpha", Tier::Member);
    agent(&e, "beta", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    catch_up(&e, &a, "r");
    let send = |text: &str| {
        e.turn(
            &a,
            Verb::Send,
            TurnArgs {
                to: vec!["beta".into()],
                ..say("r", text)
            },
        )
        .unwrap()
    };
    send("first");
    let states = |e: &Engine| -> Vec<(String, Value)> {
        e.wakes_view(&owner(e), None).unwrap()["wakes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                (
                    w["state"].as_str().unwrap().to_string(),
                    w["dead_letter"]["code"].clone(),
                )
            })
            .collect()
    };
    e.dispatch_sweep().unwrap();
    assert_eq!(states(&e)[0].0, "queued");
    // 59 s later it is still within its 60 s; past 60 s it is dead
    f.clock.advance(59_000);
    e.dispatch_sweep().unwrap();
    assert_eq!(states(&e)[0].0, "queued");
    f.clock.advance(2_000);
    let swept = e.dispatch_sweep().unwrap();
    assert_eq!(swept["dead"][0]["code"], "wake_job_expired");
    assert_eq!(states(&e)[0], ("dead".into(), json!("wake_job_expired")));
    // a permit altered in the queue no longer matches its digest
    catch_up(&e, &a, "r");
    send("second");
    e.flush_wakes();
    drop(e);
    room_store::fixtures::tamper_wake_permits(&f.state.join("control.db"), "second", "altered")
        .unwrap();
    let e = f.engine(10);
    e.dispatch_sweep().unwrap();
    assert_eq!(
        states(&e)[1],
        ("dead".into(), json!("wake_job_binding_changed"))
    );
}

#[test]
fn unanswered_obligations_fold_dead_past_their_deadline_and_circular_waits_surface() {
    let f = Fixture::new();
    let e = f.engine(11);
    let a = agent(&e, "alpha", Tier::Member);
    let b = agent(&e, "beta", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    let send = |who: &AgentCaller, to: &str, text: &str| {
        catch_up(&e, who, "r");
        e.turn(
            who,
            Verb::Send,
            TurnArgs {
                to: vec![to.into()],
                ..say("r", text)
            },
        )
        .unwrap()
    };
    send(&a, "beta", "review my patch");
    send(&b, "alpha", "first review mine");
    let view = |e: &Engine| e.obligations_view(&owner(e), "r").unwrap();
    let v = view(&e);
    let folds: Vec<&str> = v["obligations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["fold"].as_str().unwrap())
        .collect();
    assert_eq!(folds, ["pending", "pending"], "{v}");
    assert_eq!(v["circular_waits"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["circular_waits"][0]["agents"], json!(["alpha", "beta"]));
    // past the 60 s wake deadline and the 10 min fold age, nobody is woken for them: dead, and
    // still open (still listed, still answerable)
    f.clock.advance(60_000 + 600_000);
    assert_eq!(view(&e)["dead"], 0, "at the bound itself still pending");
    f.clock.advance(1);
    let v = view(&e);
    assert_eq!(v["dead"], 2, "{v}");
    // a late reply still resolves one; the cycle is gone with it
    let ob = v["obligations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["to"] == "beta")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    catch_up(&e, &b, "r");
    e.turn(
        &b,
        Verb::Reply,
        TurnArgs {
            reply_to: Some(ob),
            ..say("r", "done")
        },
    )
    .unwrap();
    let v = view(&e);
    assert_eq!(v["obligations"].as_array().unwrap().len(), 1, "{v}");
    assert!(v["circular_waits"].as_array().unwrap().is_empty());
}

/// An engine whose config routes beta's wakes (to `/bin/true`), with alpha and beta enrolled.
fn routed(f: &Fixture, seed: u64) -> (Engine, AgentCaller) {
    std::fs::write(
        f.state.join("config.toml"),
        "[routes.beta]\nadapter = \"command\"\ncommand = [\"/bin/true\"]\n",
    )
    .unwrap();
    let e = f.engine(seed);
    let a = agent(&e, "alpha", Tier::Member);
    agent(&e, "beta", Tier::Member);
    (e, a)
}

/// Control standing from the owner console (the daemon's own uid on its socket).
fn console_control(e: &Engine, room: Option<&str>) -> room_engine::lifecycle::Control {
    let console = room_engine::Caller::Local(room_engine::Evidence::UnixPeer {
        uid: e.config().owner_uid,
        pid: std::process::id(),
    });
    e.control_actor(&console, room).unwrap()
}

/// alpha reads `room`, then sends `text` to beta there.
fn wake_beta(e: &Engine, a: &AgentCaller, room: &str, text: &str) {
    catch_up(e, a, room);
    e.turn(
        a,
        Verb::Send,
        TurnArgs {
            to: vec!["beta".into()],
            ..say(room, text)
        },
    )
    .unwrap();
}

#[test]
fn a_stop_not_seen_empty_keeps_the_launch_live_and_its_credential_dead_until_a_start() {
    let f = Fixture::new();
    let (e, a) = routed(&f, 13);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    let send = |text: &str| {
        catch_up(&e, &a, "r");
        e.turn(
            &a,
            Verb::Send,
            TurnArgs {
                to: vec!["beta".into()],
                ..say("r", text)
            },
        )
        .unwrap();
    };
    send("first");
    let l = e.dispatch_take().unwrap().remove(0);
    e.launch_started(&l.id, Some(4242)).unwrap();
    let worker = AgentCaller {
        token: l.token.clone(),
        conversation: "ignored".into(),
        declared_tier: None,
        page_bytes_max: None,
    };
    assert!(
        e.whoami(&worker).is_ok(),
        "the credential works while it runs"
    );
    assert!(
        e.launch_unconfirmed(&l.id, json!({"confirmed_empty": false}))
            .unwrap()
    );
    assert_eq!(
        e.whoami(&worker).unwrap_err().code,
        room_core::Code::CredentialRevoked
    );
    // still live: its recipient is busy, however long after the cooldown
    send("second");
    f.clock.advance(10_000);
    assert!(e.dispatch_take().unwrap().is_empty(), "beta is still busy");
    let launches = e.wakes_view(&owner(&e), None).unwrap()["wakes"][0]["launches"].clone();
    assert_eq!(launches[0]["state"], "unconfirmed", "{launches}");
    // the next start (after its jobs are reaped) ends it; then beta may be woken again
    assert_eq!(e.recover_launches().unwrap(), 1);
    f.clock.advance(3_000);
    assert_eq!(e.dispatch_take().unwrap().len(), 1);
}

#[test]
fn a_running_worker_s_credential_stands_only_while_the_permit_it_was_claimed_with_does() {
    let f = Fixture::new();
    let (e, a) = routed(&f, 14);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    wake_beta(&e, &a, "r", "keep running");
    let l = e.dispatch_take().unwrap().remove(0);
    e.launch_started(&l.id, Some(4242)).unwrap();
    let worker = AgentCaller {
        token: l.token.clone(),
        conversation: "ignored".into(),
        declared_tier: None,
        page_bytes_max: None,
    };
    assert!(
        e.whoami(&worker).is_ok(),
        "the credential works while it runs"
    );
    assert!(e.launch_trips().unwrap().is_empty());
    // the queue's permit is altered under the running launch (control.db is the daemon's
    // alone while it runs: the store is closed to alter it)
    e.flush_wakes();
    drop(e);
    room_store::fixtures::tamper_wake_permits(
        &f.state.join("control.db"),
        "keep running",
        "keep walking",
    )
    .unwrap();
    let e = f.engine(15);
    let r = e.whoami(&worker).unwrap_err();
    assert_eq!(r.code, room_core::Code::CredentialRevoked, "{r}");
    assert_eq!(r.detail["reason"], "permit_changed", "{r}");
    let trips = e.launch_trips().unwrap();
    assert_eq!(trips.len(), 1, "{trips:?}");
    assert_eq!(trips[0].reason, "permit_changed");
    assert_eq!(trips[0].launch, l.id);
}

#[test]
fn a_running_launch_trips_when_the_control_epoch_moves_and_its_room_cannot_go() {
    let f = Fixture::new();
    let (e, a) = routed(&f, 16);
    for room in ["r1", "r2"] {
        e.room_create(&owner(&e), room, None, &["alpha".into(), "beta".into()])
            .unwrap();
        wake_beta(&e, &a, room, "keep running");
        let l = e.dispatch_take().unwrap().remove(0);
        e.launch_started(&l.id, Some(4242)).unwrap();
        // beta's next launch may start only once this one is out of the way
        e.launch_ended(&l.id, room_engine::dispatch::Exit::process(None, false))
            .unwrap();
        f.clock.advance(5_000);
    }
    // both ended: nothing trips; run the second again and leave it running
    assert!(e.launch_trips().unwrap().is_empty());
    wake_beta(&e, &a, "r2", "and again");
    let l = e.dispatch_take().unwrap().remove(0);
    e.launch_started(&l.id, Some(4242)).unwrap();
    // a break-glass engaged and released between two observer passes leaves only the moved epoch
    let c = console_control(&e, None);
    e.break_glass(&c, true).unwrap();
    e.break_glass(&c, false).unwrap();
    let trips = e.launch_trips().unwrap();
    assert_eq!(trips.len(), 1, "{trips:?}");
    assert_eq!(trips[0].reason, "control_epoch_changed");
    // a room is never gone under a running launch: archiving it is refused while one runs
    // (the observer's room_gone trip is a defence, not a path)
    let r = e.room_archive(&owner(&e), "r2").unwrap_err();
    assert_eq!(r.code, room_core::Code::RoomArchiveRefused, "{r}");
}

#[test]
fn a_permit_that_changes_between_dispatch_and_claim_is_refused_and_its_launch_dies() {
    let f = Fixture::new();
    std::fs::write(
        f.state.join("config.toml"),
        "[routes.beta]\nadapter = \"command\"\ncommand = [\"/bin/true\"]\n",
    )
    .unwrap();
    let e = f.engine(17);
    let a = agent(&e, "alpha", Tier::Member);
    agent(&e, "beta", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    let send = |text: &str| {
        catch_up(&e, &a, "r");
        e.turn(
            &a,
            Verb::Send,
            TurnArgs {
                to: vec!["beta".into()],
                ..say("r", text)
            },
        )
        .unwrap();
    };
    send("first");
    let l = e.dispatch_take().unwrap().remove(0);
    // a second permit for beta waits while the first launch lives: recipient_busy
    send("second");
    assert!(e.dispatch_take().unwrap().is_empty());
    let second = e.wakes_view(&owner(&e), None).unwrap()["wakes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["state"] == "queued")
        .unwrap()
        .clone();
    assert_eq!(second["deferred"], "recipient_busy", "{second}");
    // the recipient is re-registered after dispatch, before its worker's claim
    e.rotate(&owner(&e), "beta").unwrap();
    let r = e.launch_started(&l.id, Some(4242)).unwrap_err();
    assert_eq!(r.code, room_core::Code::WakeJobChangedDuringValidation);
    let first = e.wakes_view(&owner(&e), None).unwrap()["wakes"][0].clone();
    assert_eq!(first["state"], "dead", "{first}");
    assert_eq!(
        first["launches"][0]["outcome"],
        "wake_job_changed_during_validation"
    );
    let worker = AgentCaller {
        token: l.token.clone(),
        conversation: "c".into(),
        declared_tier: None,
        page_bytes_max: None,
    };
    assert!(e.whoami(&worker).is_err(), "its credential never worked");
}

#[test]
fn a_session_take_revalidates_like_dispatch_and_a_trip_ends_its_launch() {
    let f = Fixture::new();
    let e = f.engine(31);
    let a = agent(&e, "alpha", Tier::Member);
    let b = agent(&e, "beta", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    wake_beta(&e, &a, "r", "too late");
    let queued = e.wakes_view(&owner(&e), Some("r")).unwrap();
    let source = queued["wakes"][0]["source_event"]
        .as_str()
        .unwrap()
        .to_string();
    // queue time counts: past the sealed 60 s the permit no longer stands, named or not
    f.clock.advance(61_000);
    let named = room_engine::take::TakeArgs {
        room: Some("r".into()),
        source_event: Some(source.clone()),
    };
    let r = e.wake_take(&b, named.clone()).unwrap_err();
    assert_eq!(r.code, Code::WakeJobExpired, "{r}");
    let any = e.wake_take(&b, Default::default()).unwrap();
    assert_eq!(any["taken"], Value::Null, "{any}");
    assert_eq!(any["skipped"][0]["code"], "wake_job_expired", "{any}");
    let after = e.wakes_view(&owner(&e), Some("r")).unwrap();
    assert_eq!(
        after["wakes"][0]["state"], "queued",
        "a refused take changes nothing"
    );
    assert_eq!(after["wakes"][0]["launches"], json!([]));

    // a fresh one is taken; a cancel of the room then trips its session launch
    wake_beta(&e, &a, "r", "in time");
    let t = e.wake_take(&b, Default::default()).unwrap();
    assert_eq!(t["taken"]["prompt"], "in time", "{t}");
    assert!(
        e.settle_sessions(None).unwrap().is_empty(),
        "nothing settled yet"
    );
    let c = console_control(&e, Some("r"));
    e.room_cancel(&c, "r", None).unwrap();
    let ended = e.settle_sessions(None).unwrap();
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0]["outcome"], "stopped");
    let w = e.wakes_view(&owner(&e), Some("r")).unwrap();
    let taken = w["wakes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["launches"].as_array().is_some_and(|l| !l.is_empty()))
        .unwrap()
        .clone();
    assert_eq!(taken["state"], "dead", "{taken}");
    let l = &taken["launches"][0];
    assert_eq!(l["outcome"], "stopped");
    assert_eq!(l["proof"], "delivered_to_body");
}

#[test]
fn a_cancel_dead_letters_a_permit_dispatched_but_not_yet_claimed_and_keeps_its_reason() {
    let f = Fixture::new();
    let (e, a) = routed(&f, 32);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    wake_beta(&e, &a, "r", "start soon");
    let l = e.dispatch_take().unwrap().remove(0);
    let c = console_control(&e, Some("r"));
    let cancelled = e.room_cancel(&c, "r", None).unwrap();
    assert_eq!(cancelled["dead_lettered"], 1, "{cancelled}");
    let dead = |e: &Engine| e.wakes_view(&owner(e), Some("r")).unwrap()["wakes"][0].clone();
    let w = dead(&e);
    assert_eq!(w["state"], "dead", "{w}");
    assert_eq!(w["dead_letter"]["code"], "room_cancelled", "{w}");
    // the worker's claim comes too late: refused, and the dead letter keeps its reason
    let r = e.launch_started(&l.id, Some(4242)).unwrap_err();
    assert_eq!(r.code, Code::WakeJobChangedDuringValidation, "{r}");
    let w = dead(&e);
    assert_eq!(w["dead_letter"]["code"], "room_cancelled", "{w}");
    assert_eq!(
        w["launches"][0]["outcome"], "wake_job_changed_during_validation",
        "{w}"
    );
    // the launch is not live any more, so the observer does not see it; its trip still says
    // why it was stopped, for the stop outbox
    assert!(e.launch_trips().unwrap().is_empty());
    let t = e.launch_trip(&l.id).unwrap().expect("a trip");
    assert_eq!(
        (t.reason, t.launch.as_str()),
        ("room_cancelled", l.id.as_str())
    );
    assert!(e.launch_trip("lch_none").unwrap().is_none());
}

/// A reader far behind reads more than the room keeps rendered: every event arrives once, in
/// order, with the same rendering as a reader served from what is kept.
#[test]
fn a_reader_past_the_kept_renderings_reads_every_event_once_in_order() {
    let f = Fixture::new();
    let e = f.engine(7);
    let a = agent(&e, "alpha", Tier::Member);
    let b = agent(&e, "beta", Tier::Member);
    let c = agent(&e, "gamma", Tier::Member);
    e.room_create(
        &owner(&e),
        "r",
        None,
        &["alpha".into(), "beta".into(), "gamma".into()],
    )
    .unwrap();
    catch_up(&e, &a, "r");
    // about 1.2 MB of renderings, past what one room keeps (512 KiB of footprint)
    for i in 0..1_000 {
        let text = format!("note {i}: {}", "y".repeat(1_000));
        e.turn(&a, Verb::Note, say("r", &text)).unwrap();
    }
    let items = |pages: Vec<Value>| -> Vec<Value> {
        pages
            .into_iter()
            .flat_map(|p| p["items"].as_array().unwrap().clone())
            .collect()
    };
    // beta reads cold; gamma reads after it, partly from what beta's pages left kept
    let cold = items(catch_up(&e, &b, "r"));
    let warm = items(catch_up(&e, &c, "r"));
    let seqs: Vec<u64> = cold.iter().map(|i| i["seq"].as_u64().unwrap()).collect();
    let first = seqs[0];
    assert_eq!(
        seqs,
        (first..first + seqs.len() as u64).collect::<Vec<_>>(),
        "contiguous, none twice"
    );
    assert_eq!(*seqs.last().unwrap(), tip(&e, "r"));
    let notes: Vec<&str> = cold
        .iter()
        .filter_map(|i| i["event"]["text"].as_str())
        .filter(|t| t.starts_with("note "))
        .collect();
    assert_eq!(notes.len(), 1_000);
    assert!(notes[999].starts_with("note 999: "));
    assert_eq!(cold, warm, "kept and fresh renderings are the same items");
    // a page item carries the record as a reader acts on it: not the Fold Rule's bookkeeping
    let note = cold
        .iter()
        .find(|i| i["event"]["text"].is_string())
        .unwrap();
    assert_eq!(note["actor"], "alpha");
    for gone in ["conversation_key", "view_gen", "actor", "kind"] {
        assert!(
            note["event"].get(gone).is_none(),
            "{gone} is left out: {note}"
        );
    }
}

/// A `done` whose evaluation passed but whose commit was refused (a concurrent arrival) leaves
/// no passing `last_acceptance` on the still-claimed task: a passing evaluation becomes the
/// task's newest only with its commit.
#[test]
fn a_done_refused_after_its_plan_leaves_no_passing_evaluation() {
    let f = Fixture::new();
    let e = f.engine(41);
    let a = agent(&e, "alpha", Tier::Coordinator);
    let b = agent(&e, "beta", Tier::Member);
    let dir = f.state.parent().unwrap().join("proj");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("out.txt"), b"made").unwrap();
    let p = e
        .project_open(&owner(&e), dir.to_str().unwrap(), None)
        .unwrap();
    let pid = p["id"].as_str().unwrap().to_string();
    e.room_create(
        &owner(&e),
        "r",
        Some(&pid),
        &["alpha".into(), "beta".into()],
    )
    .unwrap();
    let t = e
        .task_create(
            &a,
            room_engine::verbs::TaskCreateArgs {
                room: "r".into(),
                title: "make out.txt".into(),
                to: Some("beta".into()),
                accept: vec![serde_json::json!({"kind": "file_exists", "path": "out.txt"})],
                ..Default::default()
            },
        )
        .unwrap()["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    e.task_claim(&b, &t, None).unwrap();
    catch_up(&e, &a, "r");
    catch_up(&e, &b, "r");
    let done = TurnArgs {
        room: "r".into(),
        task: Some(t.clone()),
        ..Default::default()
    };
    let prepared = e.prepare_turn(&b, Verb::Done, done.clone()).unwrap();
    e.turn(&a, Verb::Note, say("r", "meanwhile")).unwrap();
    let err = e.commit_turn(prepared).unwrap_err();
    assert_eq!(err.code, Code::RoomSyncConcurrentArrival);
    let shown = e.task_show(&b, &t).unwrap();
    assert_eq!(shown["task"]["status"], "claimed");
    assert_ne!(
        shown["last_acceptance"]["acceptance_pass"], true,
        "a refused done left a passing evaluation: {shown}"
    );
    // the done that lands keeps its evaluation
    catch_up(&e, &b, "r");
    e.turn(&b, Verb::Done, done).unwrap();
    let shown = e.task_show(&b, &t).unwrap();
    assert_eq!(shown["last_acceptance"]["acceptance_pass"], true, "{shown}");
}

/// The real file system, except that a file is written to right after each time it is hashed
/// (a writer racing the evaluation), and every hash is counted.
struct RacingFs {
    real: RealFs,
    hashed: std::sync::atomic::AtomicUsize,
}

impl room_core::Fs for RacingFs {
    fn stamp(&self, p: &std::path::Path) -> std::io::Result<room_core::FileStamp> {
        self.real.stamp(p)
    }
    fn read(&self, p: &std::path::Path) -> std::io::Result<Vec<u8>> {
        self.real.read(p)
    }
    fn list_dir(&self, p: &std::path::Path, limit: usize) -> std::io::Result<Vec<String>> {
        self.real.list_dir(p, limit)
    }
    fn write_atomic(&self, p: &std::path::Path, b: &[u8]) -> std::io::Result<()> {
        self.real.write_atomic(p, b)
    }
    fn append(&self, p: &std::path::Path, b: &[u8]) -> std::io::Result<()> {
        self.real.append(p, b)
    }
    fn canonicalize(&self, p: &std::path::Path) -> std::io::Result<PathBuf> {
        self.real.canonicalize(p)
    }
    fn object_id(&self, p: &std::path::Path) -> std::io::Result<room_core::ObjectId> {
        self.real.object_id(p)
    }
    fn is_dir_nofollow(&self, p: &std::path::Path) -> std::io::Result<bool> {
        self.real.is_dir_nofollow(p)
    }
    fn read_link(&self, p: &std::path::Path) -> std::io::Result<PathBuf> {
        self.real.read_link(p)
    }
    fn try_exists(&self, p: &std::path::Path) -> std::io::Result<bool> {
        self.real.try_exists(p)
    }
    fn sha256_beneath(
        &self,
        root: &std::path::Path,
        rel: &std::path::Path,
    ) -> std::io::Result<(String, u64)> {
        let r = self.real.sha256_beneath(root, rel);
        self.hashed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // a writer right behind the read: the file's stamp moves
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(root.join(rel))?;
        std::io::Write::write_all(&mut f, b"+")?;
        r
    }
    fn read_beneath(
        &self,
        root: &std::path::Path,
        rel: &std::path::Path,
        max: u64,
    ) -> std::io::Result<Vec<u8>> {
        self.real.read_beneath(root, rel, max)
    }
}

/// A `sha256` check's file is hashed outside the room's lock, once, and counts only while the
/// file holds the stamp it was hashed under: a file written while it was read is unconfirmed
/// (evaluate again), never judged on bytes it no longer holds, and never read again under the
/// lock.
#[test]
fn a_sha256_check_hashes_outside_the_lock_and_rechecks_the_stamp_inside() {
    let f = Fixture::new();
    let fs = Arc::new(RacingFs {
        real: RealFs,
        hashed: Default::default(),
    });
    let e = {
        let s = statedir::validate(&f.state, &f.boot).unwrap();
        let env = Env {
            clock: f.clock.clone(),
            entropy: Arc::new(SeededEntropy::new(43)),
            fs: fs.clone(),
            runner: Arc::new(room_core::env::NoRunner),
        };
        let store = Arc::new(SqliteBackend::new(&s, SqliteBackendConfig::default()));
        Engine::open(s, env, store, EngineConfig::default()).unwrap()
    };
    let a = agent(&e, "alpha", Tier::Coordinator);
    let b = agent(&e, "beta", Tier::Member);
    let dir = f.state.parent().unwrap().join("proj");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("out.bin"), b"made").unwrap();
    let pid = e
        .project_open(&owner(&e), dir.to_str().unwrap(), None)
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    e.room_create(
        &owner(&e),
        "r",
        Some(&pid),
        &["alpha".into(), "beta".into()],
    )
    .unwrap();
    let expected = room_core::sha256_hex(b"made");
    let t = e
        .task_create(
            &a,
            room_engine::verbs::TaskCreateArgs {
                room: "r".into(),
                title: "make out.bin".into(),
                to: Some("beta".into()),
                accept: vec![json!({"kind": "sha256", "path": "out.bin", "expected": expected})],
                ..Default::default()
            },
        )
        .unwrap()["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    e.task_claim(&b, &t, None).unwrap();
    let ev = e.task_check(&b, &t).unwrap();
    let d = &ev["acceptance_results"][0]["detail"];
    assert_eq!(d["observation"], "unconfirmed", "{ev}");
    assert_eq!(
        fs.hashed.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "hashed once, outside the lock, and never again under it"
    );
}

/// Every one of the fourteen authority keys a claim pins is compared at `done`: with any one
/// of them standing otherwise than the claim pinned it, `done` is refused naming exactly that
/// key (the terms' three with `task_acceptance_changed_before_completion`, the rest with
/// `task_authority_changed`) and writes nothing. The keys a person can move are moved for real
/// through the daemon elsewhere (an amendment, a reset, a source edit, a raised evidence
/// minimum: `room prove 04-C11`, tests/completion.rs, tests/source.rs, tests/evidence.rs); the
/// rest cannot move while a claim holds, so the pinned side stands in for the move here.
#[test]
fn every_authority_key_is_compared_at_done_and_named_when_it_moved() {
    let f = Fixture::new();
    let mut e = f.engine(13);
    let a = agent(&e, "alpha", Tier::Coordinator);
    let b = agent(&e, "beta", Tier::Member);
    e.room_create(&owner(&e), "r", None, &["alpha".into(), "beta".into()])
        .unwrap();
    for (n, key) in room_engine::completion::AUTHORITY_KEYS
        .into_iter()
        .enumerate()
    {
        let t = e
            .task_create(
                &a,
                room_engine::verbs::TaskCreateArgs {
                    room: "r".into(),
                    title: format!("moved: {key}"),
                    to: Some("beta".into()),
                    ..Default::default()
                },
            )
            .unwrap()["task"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        e.task_claim(&b, &t, None).unwrap();
        // the engine holds its control store alone: the pin is rewritten while it is closed
        drop(e);
        {
            use room_store::Backend;
            let s = statedir::validate(&f.state, &f.boot).unwrap();
            let side_store = SqliteBackend::new(&s, SqliteBackendConfig::default());
            let mut side = side_store.open_control().unwrap();
            let mut pin = side.task(&t).unwrap().unwrap().claim_pin.unwrap();
            let was = pin.get(key).cloned().unwrap_or_default();
            assert!(pin.contains_key(key), "the claim pinned {key}");
            pin.insert(
                key.to_string(),
                format!("{was} (as it stood at another time)"),
            );
            side.pin_claim(&t, &pin).unwrap();
        }
        // each engine draws its own ids (a seed of its own)
        e = f.engine(1_000_003 * (n as u64 + 1));
        catch_up(&e, &b, "r");
        let before = tip(&e, "r");
        let r = e
            .turn(
                &b,
                Verb::Done,
                TurnArgs {
                    room: "r".into(),
                    task: Some(t.clone()),
                    ..Default::default()
                },
            )
            .unwrap_err();
        let want = if matches!(key, "acceptance" | "requirements" | "evidence_manifest") {
            Code::TaskAcceptanceChangedBeforeCompletion
        } else {
            Code::TaskAuthorityChanged
        };
        assert_eq!(r.code, want, "{key}: {r}");
        assert_eq!(r.detail["changed"], json!([key]), "{key}: {r}");
        assert_eq!(tip(&e, "r"), before, "{key}: a refused done writes nothing");
        // a fresh claim takes the authority as it stands, and done then passes
        e.task_claim(&b, &t, None).unwrap();
        catch_up(&e, &b, "r");
        e.turn(
            &b,
            Verb::Done,
            TurnArgs {
                room: "r".into(),
                task: Some(t.clone()),
                ..Default::default()
            },
        )
        .unwrap();
    }
}
