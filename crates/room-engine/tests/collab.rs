//! The approval binding at the engine: a request is decided only on the digest shown, once; a
//! pass of the scheduler that read the queue before the person decided, and asks again for the
//! same run, finds the decision standing and makes no second request (found under CI load: a
//! second pending request for an approved run left the collaboration waiting).
#![allow(clippy::disallowed_methods)] // a real state dir

use room_core::Tier;
use room_core::env::{ManualClock, SeededEntropy};
use room_engine::collab::{CollabStart, Verdict};
use room_engine::principal::AgentCaller;
use room_engine::{Engine, EngineConfig, Env};
use room_store::fs::RealFs;
use room_store::statedir;
use room_store::{SqliteBackend, SqliteBackendConfig};
use serde_json::json;
use std::sync::Arc;

fn engine(tmp: &tempfile::TempDir) -> Engine {
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let (state, boot) = (root.join("state"), root.join("boot.toml"));
    statedir::init(&state, &boot, "inst").unwrap();
    let s = statedir::validate(&state, &boot).unwrap();
    let env = Env {
        clock: Arc::new(ManualClock::new(1_790_000_000_000)),
        entropy: Arc::new(SeededEntropy::new(3)),
        fs: Arc::new(RealFs),
        runner: Arc::new(room_core::env::NoRunner),
    };
    let store = Arc::new(SqliteBackend::new(&s, SqliteBackendConfig::default()));
    Engine::open(s, env, store, EngineConfig::default()).unwrap()
}

#[test]
fn a_decided_run_keeps_its_decision_and_gets_no_second_request() {
    let tmp = tempfile::tempdir().unwrap();
    let e = engine(&tmp);
    let o = e
        .owner(&room_engine::Caller::Local(
            room_engine::Evidence::UnixPeer {
                uid: e.config().owner_uid,
                pid: std::process::id(),
            },
        ))
        .unwrap();
    let minted = e
        .delegate_as_owner(
            &o,
            None,
            "c1-orch",
            &["session:read".into(), "session:dispatch".into()],
            Some(Tier::Coordinator),
        )
        .unwrap();
    let orch = AgentCaller {
        token: minted["token"].as_str().unwrap().into(),
        conversation: "s".into(),
        declared_tier: None,
        page_bytes_max: None,
    };
    e.room_create(&o, "c1", None, &["c1-orch".into()]).unwrap();
    e.collab_record(
        &o,
        CollabStart {
            id: "c1".into(),
            room: "c1".into(),
            project: None,
            goal: "g".into(),
            orchestrator: "c1-orch".into(),
            spec: json!({}),
            trees: None,
        },
    )
    .unwrap();
    let shown = json!({"phase": "spec", "prompt": "p"});
    let a = e.approval_request(&orch, "c1", "spec", 1, &shown).unwrap();
    // asked again with the same input: the same request
    assert_eq!(
        e.approval_request(&orch, "c1", "spec", 1, &shown).unwrap(),
        a
    );
    // a decision on another digest is stale and decides nothing
    let r = e
        .approval_decide(&o, &a.id, &"0".repeat(64), Verdict::Approve)
        .unwrap_err();
    assert_eq!(r.code.as_str(), "approval_stale");
    let decided = e
        .approval_decide(&o, &a.id, &a.digest, Verdict::Approve)
        .unwrap();
    assert_eq!(decided.state, "approved");
    // a pass that read the queue before the decision asks again, with the same input or a
    // changed one: the decision stands, nothing new is pending
    for input in [shown.clone(), json!({"phase": "spec", "prompt": "changed"})] {
        let again = e.approval_request(&orch, "c1", "spec", 1, &input).unwrap();
        assert_eq!(
            (again.id.as_str(), again.state.as_str()),
            (a.id.as_str(), "approved")
        );
    }
    let (_, _, queue) = e.collab_show(&o, "c1").unwrap();
    assert_eq!(queue.len(), 1, "{queue:?}");
    // decided once
    let r = e
        .approval_decide(&o, &a.id, &a.digest, Verdict::Reject)
        .unwrap_err();
    assert_eq!(r.code.as_str(), "approval_stale");
    // a later run of the phase is asked anew
    let next = e.approval_request(&orch, "c1", "spec", 2, &shown).unwrap();
    assert_ne!(next.id, a.id);
    assert_eq!(next.state, "pending");
}
