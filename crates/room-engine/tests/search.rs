//! Search over 10,000 events of which a subset is written for an audience: a reader outside
//! it never finds them, results come ranked in pages within the bound, searching confirms
//! nothing, and a rebuild of the index gives the same results.
#![allow(clippy::disallowed_methods)] // a real state dir

use room_core::env::{ManualClock, SeededEntropy};
use room_core::{Tier, Verb};
use room_engine::principal::AgentCaller;
use room_engine::search::{PAGE_MAX, SearchArgs};
use room_engine::verbs::TurnArgs;
use room_engine::{Engine, EngineConfig, Env};
use room_store::fs::RealFs;
use room_store::statedir;
use room_store::{SqliteBackend, SqliteBackendConfig};
use serde_json::Value;
use std::sync::Arc;

const EVENTS: usize = 10_000;
/// One event in this many is written for alpha and beta only.
const WITHHELD_EVERY: usize = 10;

fn engine(tmp: &tempfile::TempDir) -> Engine {
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let (state, boot) = (root.join("state"), root.join("boot.toml"));
    if !state.exists() {
        statedir::init(&state, &boot, "inst").unwrap();
    }
    let s = statedir::validate(&state, &boot).unwrap();
    let env = Env {
        clock: Arc::new(ManualClock::new(1_790_000_000_000)),
        entropy: Arc::new(SeededEntropy::new(7)),
        fs: Arc::new(RealFs),
        runner: Arc::new(room_core::env::NoRunner),
    };
    let store = Arc::new(SqliteBackend::new(&s, SqliteBackendConfig::default()));
    Engine::open(s, env, store, EngineConfig::default()).unwrap()
}

fn owner(e: &Engine) -> room_engine::Owner {
    e.owner(&room_engine::Caller::Local(
        room_engine::Evidence::UnixPeer {
            uid: e.config().owner_uid,
            pid: std::process::id(),
        },
    ))
    .unwrap()
}

fn caller(token: String) -> AgentCaller {
    AgentCaller {
        token,
        conversation: "c1".into(),
        declared_tier: None,
        page_bytes_max: None,
    }
}

fn search(e: &Engine, who: &AgentCaller, query: &str, cursor: Option<u64>) -> Value {
    e.search(
        who,
        SearchArgs {
            room: "r".into(),
            query: query.into(),
            cursor,
            limit: Some(PAGE_MAX),
            mode: None,
        },
        None,
    )
    .unwrap()
}

/// Every result of `query` for `who`, following the cursor; each page within the bound.
fn all(e: &Engine, who: &AgentCaller, query: &str) -> Vec<u64> {
    let mut out = Vec::new();
    let mut cursor = None;
    for _ in 0..10_000 {
        let page = search(e, who, query, cursor);
        let results = page["results"].as_array().unwrap();
        assert!(results.len() <= PAGE_MAX);
        // ranked: best (lowest rank) first within a page
        let ranks: Vec<f64> = results
            .iter()
            .map(|r| r["rank"].as_f64().unwrap())
            .collect();
        assert!(ranks.windows(2).all(|w| w[0] <= w[1]), "{ranks:?}");
        out.extend(results.iter().map(|r| r["seq"].as_u64().unwrap()));
        match page["next"].as_u64() {
            Some(n) => cursor = Some(n),
            None => return out,
        }
    }
    panic!("the pages never ended");
}

#[test]
fn search_sees_what_its_reader_may_read_in_bounded_ranked_pages() {
    let tmp = tempfile::tempdir().unwrap();
    let e = engine(&tmp);
    let o = owner(&e);
    let mut tok = std::collections::BTreeMap::new();
    for n in ["alpha", "beta", "gamma"] {
        tok.insert(
            n,
            caller(e.enroll(&o, n, Tier::Member, "generic").unwrap().token),
        );
    }
    e.room_create(
        &o,
        "r",
        None,
        &["alpha".into(), "beta".into(), "gamma".into()],
    )
    .unwrap();
    let alpha = &tok["alpha"];
    // alpha reads the room once; its own notes then never leave it behind
    let page = e.sync(alpha, "r", None).unwrap();
    e.sync(alpha, "r", page["receipt"].as_str()).unwrap();
    let mut withheld = Vec::new();
    for i in 0..EVENTS {
        let secret = i % WITHHELD_EVERY == 0;
        let text = if secret {
            format!("parser secret {i}")
        } else {
            format!("parser note {i} about the lexer")
        };
        let v = e
            .turn(
                alpha,
                Verb::Note,
                TurnArgs {
                    room: "r".into(),
                    text: Some(text),
                    audience: if secret { vec!["beta".into()] } else { vec![] },
                    ..TurnArgs::default()
                },
            )
            .unwrap();
        if secret {
            withheld.push(v["seq"].as_u64().unwrap());
        }
    }
    let gamma = &tok["gamma"];
    let before = e.sync(gamma, "r", None).unwrap()["from_seq"].clone();
    let seen = all(&e, gamma, "parser");
    assert_eq!(
        seen.len(),
        EVENTS - withheld.len(),
        "every event gamma may read"
    );
    assert!(
        !seen.iter().any(|s| withheld.contains(s)),
        "a reader outside an audience never finds what it withholds"
    );
    assert!(
        all(&e, gamma, "secret").is_empty(),
        "not even by its own words"
    );
    assert_eq!(all(&e, &tok["beta"], "secret").len(), withheld.len());
    // searching confirmed nothing: gamma's next page starts where it did
    assert_eq!(e.sync(gamma, "r", None).unwrap()["from_seq"], before);
    // every word must appear; a query is words, never syntax
    assert_eq!(all(&e, gamma, "lexer note").len(), seen.len());
    assert!(all(&e, gamma, "lexer secret").is_empty());
    assert_eq!(
        all(&e, gamma, "\"lexer\" OR NEAR(").len(),
        0,
        "OR, NEAR are words"
    );
    // the owner sees everything; a rebuild of the index gives the same results
    let owner_hits = |e: &Engine| {
        let mut out = Vec::new();
        let mut cursor = None;
        loop {
            let p = e
                .search_owner(
                    &owner(e),
                    SearchArgs {
                        room: "r".into(),
                        query: "parser".into(),
                        cursor,
                        limit: Some(PAGE_MAX),
                        mode: None,
                    },
                    None,
                )
                .unwrap();
            out.extend(
                p["results"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["seq"].as_u64().unwrap()),
            );
            match p["next"].as_u64() {
                Some(n) => cursor = Some(n),
                None => return out,
            }
        }
    };
    let before_rebuild = owner_hits(&e);
    assert_eq!(before_rebuild.len(), EVENTS);
    e.index_rebuild(&o, "r", false).unwrap();
    assert_eq!(owner_hits(&e), before_rebuild);
    assert_eq!(all(&e, gamma, "parser"), seen);
    // semantic search without an endpoint says so
    let r = e
        .search(
            gamma,
            SearchArgs {
                room: "r".into(),
                query: "parser".into(),
                mode: Some("semantic".into()),
                ..SearchArgs::default()
            },
            None,
        )
        .unwrap_err();
    assert_eq!(r.code.as_str(), "invalid_argument");
    assert_eq!(r.detail["field"], "mode");
}

/// A stand-in for an embeddings model: words to axes, a few words meaning the same.
struct Words;

fn words_vector(text: &str) -> Vec<f32> {
    let mut v = vec![0.0f32; 8];
    for w in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let axis = match w.to_lowercase().as_str() {
            "bug" | "defect" | "fault" => 0,
            "parser" | "lexer" => 1,
            "lunch" | "meal" => 2,
            "secret" => 3,
            _ => 4 + w.len() % 4,
        };
        v[axis] += 1.0;
    }
    v
}

impl room_engine::search::QueryEmbedder for Words {
    fn embed(&self, query: &str) -> room_engine::Outcome<(String, Vec<f32>)> {
        Ok(("words".into(), words_vector(query)))
    }
}

/// Semantic search ranks by meaning over the vectors the indexer kept (found by a word the
/// event never says), filters by audience as text search does, pages, and says how much of
/// the room has vectors.
#[test]
fn semantic_search_ranks_by_meaning_within_what_its_reader_may_read() {
    let tmp = tempfile::tempdir().unwrap();
    let e = engine(&tmp);
    let o = owner(&e);
    let mut tok = std::collections::BTreeMap::new();
    for n in ["alpha", "beta", "gamma"] {
        tok.insert(
            n,
            caller(e.enroll(&o, n, Tier::Member, "generic").unwrap().token),
        );
    }
    e.room_create(
        &o,
        "r",
        None,
        &["alpha".into(), "beta".into(), "gamma".into()],
    )
    .unwrap();
    let alpha = &tok["alpha"];
    let page = e.sync(alpha, "r", None).unwrap();
    e.sync(alpha, "r", page["receipt"].as_str()).unwrap();
    let mut seqs = std::collections::BTreeMap::new();
    for (text, audience) in [
        ("the parser has a bug", vec![]),
        ("lunch at noon", vec![]),
        ("a secret fault in the lexer", vec!["beta".to_string()]),
        ("tests pass", vec![]),
    ] {
        let v = e
            .turn(
                alpha,
                Verb::Note,
                TurnArgs {
                    room: "r".into(),
                    text: Some(text.into()),
                    audience,
                    ..TurnArgs::default()
                },
            )
            .unwrap();
        seqs.insert(text, v["seq"].as_u64().unwrap());
    }
    let semantic = |who: &AgentCaller, q: &str, cursor: Option<u64>, limit: usize| {
        e.search(
            who,
            SearchArgs {
                room: "r".into(),
                query: q.into(),
                cursor,
                limit: Some(limit),
                mode: Some("semantic".into()),
            },
            Some(&Words),
        )
        .unwrap()
    };
    // nothing has a vector yet: nothing is found, and the answer says so (an agent learns
    // only whether the room is all embedded; the owner, how much)
    let none = semantic(alpha, "defect", None, 10);
    assert_eq!(none["results"], serde_json::json!([]));
    assert_eq!(none["coverage"], serde_json::json!({"complete": false}));
    let owners = e
        .search_owner(
            &o,
            SearchArgs {
                room: "r".into(),
                query: "defect".into(),
                mode: Some("semantic".into()),
                ..SearchArgs::default()
            },
            Some(&Words),
        )
        .unwrap();
    assert_eq!(owners["coverage"]["embedded"], 0);
    assert_eq!(owners["coverage"]["events_with_text"], 4);
    // the indexer's part: the texts (redacted), then their vectors
    let work = e.embedding_work("r", "words", 0, 100).unwrap();
    assert_eq!(work.len(), 4, "{work:?}");
    let rows = work
        .into_iter()
        .map(|w| {
            let v = words_vector(&w.text);
            (w, v)
        })
        .collect();
    assert_eq!(
        e.embeddings_put("r", "words", rows).unwrap(),
        Vec::<u64>::new()
    );
    assert!(e.embedding_work("r", "words", 0, 100).unwrap().is_empty());
    let gamma = &tok["gamma"];
    let hits = semantic(gamma, "defect", None, 10);
    let found: Vec<u64> = hits["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(found[0], seqs["the parser has a bug"], "{hits:#}");
    assert!(
        !found.contains(&seqs["a secret fault in the lexer"]),
        "withheld from gamma: {hits:#}"
    );
    assert_eq!(hits["coverage"]["complete"], true);
    // beta, in its audience, finds it first: both a fault and in the lexer
    let beta = semantic(&tok["beta"], "lexer defect", None, 10);
    assert_eq!(
        beta["results"][0]["seq"].as_u64(),
        Some(seqs["a secret fault in the lexer"]),
        "{beta:#}"
    );
    let scores: Vec<f64> = beta["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    // paged: one at a time, the same order
    let mut paged = Vec::new();
    let mut cursor = None;
    loop {
        let p = semantic(gamma, "defect", cursor, 1);
        paged.extend(
            p["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["seq"].as_u64().unwrap()),
        );
        match p["next"].as_u64() {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    assert_eq!(paged, found);
    // a vector that is none is skipped and named, the rest kept
    let work = e.embedding_work("r", "other", 0, 2).unwrap();
    let (first, second) = (work[0].clone(), work[1].clone());
    let skipped = e
        .embeddings_put(
            "r",
            "other",
            vec![(first.clone(), vec![0.0, 0.0]), (second, vec![1.0])],
        )
        .unwrap();
    assert_eq!(skipped, vec![first.seq]);
}
