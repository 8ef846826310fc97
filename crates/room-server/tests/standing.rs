//! The Unix socket hands the engine its peer's credentials and the engine decides: a peer of the
//! owner's uid is the owner console; a peer of another uid acts as an agent only (with a token),
//! and without one it has presented nothing.

use room_engine::{Engine, EngineConfig, Evidence};
use room_server::dispatch::{self, Transport};
use room_server::wire::{Request, Response};
use serde_json::json;

const OWNER_UID: u32 = 4242;

fn engine(tmp: &tempfile::TempDir) -> Engine {
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let state =
        room_store::statedir::init(&root.join("state"), &root.join("boot.toml"), "inst").unwrap();
    let config = EngineConfig {
        owner_uid: OWNER_UID,
        ..EngineConfig::default()
    };
    let store = room_server::daemon::embedded_store(&state);
    Engine::open(state, room_server::daemon::real_env(), store, config).unwrap()
}

fn socket(uid: u32) -> Transport {
    Transport::UnixSocket(Evidence::UnixPeer { uid, pid: 77 })
}

fn code(r: &Response) -> &str {
    r.refusal.as_ref().map_or("ok", |r| r.code.as_str())
}

#[test]
fn owner_uid_is_the_console_and_another_uid_is_agents_only() {
    let tmp = tempfile::tempdir().unwrap();
    let e = engine(&tmp);
    let owner =
        |op: &str, args| dispatch::handle(&e, socket(OWNER_UID), Request::new(op, args), None);
    let enrolled = owner("agent_enroll", json!({"name": "alpha"}));
    assert!(enrolled.ok, "{:?}", enrolled.refusal);
    let token = enrolled.result.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();

    // another uid without a token: no credential, as before
    let r = dispatch::handle(
        &e,
        socket(OWNER_UID + 1),
        Request::new("agent_list", json!({})),
        None,
    );
    assert_eq!(code(&r), "credential_invalid");
    assert_eq!(&*r.refusal.unwrap().message, "no credential presented");
    let r = dispatch::handle(&e, socket(0), Request::new("ping", json!({})), None);
    assert_eq!(code(&r), "credential_invalid");

    // with a token it is that agent, never the owner
    let as_agent = |op: &str| {
        dispatch::handle(
            &e,
            socket(OWNER_UID + 1),
            Request::new(op, json!({})).with_token(Some(&token)),
            None,
        )
    };
    assert_eq!(code(&as_agent("whoami")), "ok");
    assert_eq!(code(&as_agent("agent_list")), "owner_required");

    // the owner's uid still gets the owner console
    assert_eq!(code(&owner("agent_list", json!({}))), "ok");
}
