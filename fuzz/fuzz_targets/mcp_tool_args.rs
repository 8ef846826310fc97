//! MCP tool calls with arbitrary arguments, through the real dispatch and engine as an agent:
//! every input gets a result or a refusal with a stable code, never a panic, and the room's
//! chain keeps verifying.
#![no_main]
use libfuzzer_sys::fuzz_target;
use room_engine::{Engine, EngineConfig};
use room_server::dispatch::{self, Transport};
use room_server::mcp::{ToolsMode, tools};
use room_server::wire::Request;
use serde_json::{Value, json};
use std::sync::OnceLock;

struct World {
    _tmp: tempfile::TempDir,
    engine: Engine,
    token: String,
    journal: std::path::PathBuf,
    graph: String,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
        let tmp = tempfile::tempdir_in(base).expect("temp dir");
        let root = std::fs::canonicalize(tmp.path()).expect("canonical");
        let state = room_store::statedir::init(&root.join("s"), &root.join("b.toml"), "fuzz").expect("init");
        let store = room_server::daemon::embedded_store(&state);
        let engine = Engine::open(state, room_server::daemon::real_env(), store, EngineConfig::default()).expect("engine");
        let owner = engine.owner(&room_engine::Caller::Local(room_engine::Evidence::UnixPeer { uid: engine.config().owner_uid, pid: std::process::id() })).expect("owner");
        let token = engine.enroll(&owner, "alpha", room_core::Tier::Operator, "codex").expect("enroll").token;
        engine.enroll(&owner, "beta", room_core::Tier::Member, "generic").expect("enroll");
        engine.room_create(&owner, "lobby", None, &["alpha".into(), "beta".into()]).expect("room");
        let shard = std::fs::read_dir(root.join("s/rooms")).expect("rooms").next().expect("a room").expect("entry").path();
        let graph = shard.file_name().and_then(|n| n.to_str()).expect("graph id").to_string();
        World { journal: shard.join("EVENTS.jsonl"), graph, _tmp: tmp, engine, token }
    })
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let w = world();
    let defs = tools::all();
    let def = &defs[data[0] as usize % defs.len()];
    let args: Value = serde_json::from_slice(&data[1..]).unwrap_or_else(|_| json!({"room": "lobby", "text": String::from_utf8_lossy(&data[1..])}));
    let meta = args.get("_meta").cloned();
    let req = Request { op: def.op.into(), token: None, conversation: Some("fuzz".into()), tier: None, args, meta, page_bytes_max: None };
    let resp = dispatch::handle(&w.engine, Transport::Http, req, Some(w.token.clone()));
    if let Some(r) = &resp.refusal {
        assert!(room_core::Code::parse(r.code.as_str()).is_some());
    }
    // keep the gate open for the next input so that writes are exercised too
    if resp.refusal.as_ref().is_some_and(|r| r.code == room_core::Code::RoomSyncRequired) {
        let mut confirm: Option<String> = None;
        for _ in 0..64 {
            let args = json!({"room": "lobby", "confirm": confirm});
            let req = Request { op: "sync".into(), token: None, conversation: Some("fuzz".into()), tier: None, args, meta: None, page_bytes_max: None };
            let page = dispatch::handle(&w.engine, Transport::Http, req, Some(w.token.clone()));
            let Some(p) = page.result else { break };
            if p["items"].as_array().is_none_or(Vec::is_empty) {
                break;
            }
            confirm = p["receipt"].as_str().map(String::from);
        }
    }
    let _ = ToolsMode::Full;
    room_store::journal::verify(&w.journal, &w.graph).expect("the chain verifies after any input");
});
