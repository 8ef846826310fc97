//! Owner standing is the engine's decision, from the evidence a transport presents: a Unix
//! socket peer of the configured owner uid is the owner; a peer of any other uid is refused
//! exactly as an agent without owner standing is.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests make real state dirs
use room_core::env::{ManualClock, SeededEntropy};
use room_core::{Code, Tier};
use room_engine::principal::AgentCaller;
use room_engine::{Caller, Engine, EngineConfig, Env, Evidence};
use room_store::fs::RealFs;
use room_store::statedir;
use room_store::{SqliteBackend, SqliteBackendConfig};
use std::sync::Arc;

const OWNER_UID: u32 = 4242;

fn engine(tmp: &tempfile::TempDir) -> Engine {
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let state = statedir::init(&root.join("state"), &root.join("boot.toml"), "inst").unwrap();
    let env = Env {
        clock: Arc::new(ManualClock::new(1_790_000_000_000)),
        entropy: Arc::new(SeededEntropy::new(7)),
        fs: Arc::new(RealFs),
        runner: std::sync::Arc::new(room_core::env::NoRunner),
    };
    let config = EngineConfig {
        owner_uid: OWNER_UID,
        ..EngineConfig::default()
    };
    let store = Arc::new(SqliteBackend::new(&state, SqliteBackendConfig::default()));
    Engine::open(state, env, store, config).unwrap()
}

fn peer(uid: u32) -> Caller {
    Caller::Local(Evidence::UnixPeer { uid, pid: 1234 })
}

#[test]
fn a_unix_peer_of_the_owner_uid_has_owner_standing() {
    let tmp = tempfile::tempdir().unwrap();
    let e = engine(&tmp);
    let owner = e
        .owner(&peer(OWNER_UID))
        .expect("the owner's uid is the owner");
    e.enroll(&owner, "alpha", Tier::Member, "generic").unwrap();
}

#[test]
fn a_unix_peer_of_another_uid_is_refused_owner_standing_like_an_agent() {
    let tmp = tempfile::tempdir().unwrap();
    let e = engine(&tmp);
    let owner = e.owner(&peer(OWNER_UID)).unwrap();
    let token = e
        .enroll(&owner, "alpha", Tier::Operator, "generic")
        .unwrap()
        .token;

    let foreign = e
        .owner(&peer(OWNER_UID + 1))
        .expect_err("another uid is not the owner");
    let agent = e
        .owner(&Caller::Agent(AgentCaller {
            token,
            conversation: "c1".into(),
            declared_tier: None,
            page_bytes_max: None,
        }))
        .expect_err("an agent is not the owner, whatever its tier");
    assert_eq!(foreign.code, Code::OwnerRequired);
    assert_eq!(foreign.code, agent.code);
    assert_eq!(foreign.message, agent.message);
    // root is not the owner either unless it runs the daemon
    assert_eq!(e.owner(&peer(0)).unwrap_err().code, Code::OwnerRequired);
}

#[test]
fn an_engine_configured_with_no_owner_grants_no_peer_standing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let state = statedir::init(&root.join("state"), &root.join("boot.toml"), "inst").unwrap();
    let env = Env {
        clock: Arc::new(ManualClock::new(1_790_000_000_000)),
        entropy: Arc::new(SeededEntropy::new(7)),
        fs: Arc::new(RealFs),
        runner: std::sync::Arc::new(room_core::env::NoRunner),
    };
    let store = Arc::new(SqliteBackend::new(&state, SqliteBackendConfig::default()));
    let e = Engine::open(state, env, store, EngineConfig::default()).unwrap();
    for uid in [0, 1000, 65534] {
        assert_eq!(e.owner(&peer(uid)).unwrap_err().code, Code::OwnerRequired);
    }
}
