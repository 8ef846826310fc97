//! An agent orchestrator's turns (issue 42 item 1): each of the orchestrator's launches is one
//! turn. What it said (its turns' text, through `dispatch::handle_step`; an API model's own
//! words) and what it dispatched are kept in memory for the launch, and at its end a dispatch
//! its words announced but it did not make is flagged (`dispatch_announced_not_made`),
//! journaled in the collaboration's room and shown in its status. A daemon that dies
//! mid-turn loses that turn's record, and with it the check of a turn that never ended.
//! What the orchestrator's tools do is `room_collab::steer`.

use room_collab::orchestrate;
use room_collab::scheduler::{Spec, caller, load};
use room_core::Refusal;
use room_engine::Engine;
use room_engine::dispatch::Launch;
use room_engine::principal::AgentCaller;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

/// The flag an announced dispatch that was not made raises.
pub const ANNOUNCED_NOT_MADE: &str = "dispatch_announced_not_made";
/// Turns kept at once (one per live orchestrator launch); past it a new turn is not checked.
const TURNS_MAX: usize = 1024;
/// Texts one turn keeps (each bounded by `orchestrate::ANNOUNCE_TEXT_BYTES_MAX` when read).
const TURN_TEXTS_MAX: usize = 64;

/// `collab_dispatch` or `collab_request_approval` for an agent (`room_collab::steer`), the
/// phase it began recorded in the caller's turn.
pub fn dispatch(
    engine: &Engine,
    caller: &AgentCaller,
    id: &str,
    phase: Option<&str>,
    purpose: Option<&str>,
    approve: bool,
) -> Result<Value, Refusal> {
    let v = room_collab::steer::dispatch(
        engine,
        caller,
        id,
        phase,
        purpose,
        approve,
        &super::DaemonHost::for_tools(),
    )?;
    if let Some(p) = v["phase"].as_str() {
        turn_dispatched(&caller.token, p);
    }
    Ok(v)
}

/// One orchestrator launch's turn: what it said and what it dispatched.
struct Turn {
    collab: String,
    agent: String,
    said: Vec<String>,
    dispatched: Vec<String>,
}

fn turns() -> &'static Mutex<HashMap<String, Turn>> {
    static TURNS: LazyLock<Mutex<HashMap<String, Turn>>> = LazyLock::new(Default::default);
    &TURNS
}

/// A launch begins: when its recipient is a collaboration's orchestrator child, its turn is
/// kept (keyed by the launch's credential) until `turn_end`.
pub fn turn_begin(engine: &Engine, l: &Launch) {
    let Some(collab) = engine.collab_steered_by(&l.agent).ok().flatten() else {
        return;
    };
    let mut t = turns().lock().expect("turns lock");
    if t.len() >= TURNS_MAX {
        tracing::warn!(launch = %l.id, "{TURNS_MAX} orchestrator turns kept: this one is not checked");
        return;
    }
    t.insert(
        l.token.clone(),
        Turn {
            collab,
            agent: l.agent.clone(),
            said: Vec::new(),
            dispatched: Vec::new(),
        },
    );
}

/// Whether calls made with `token` are an orchestrator's turn being kept.
pub fn turn_kept(token: Option<&str>) -> bool {
    let Some(token) = token else { return false };
    let t = turns().lock().expect("turns lock");
    !t.is_empty() && t.contains_key(token)
}

/// Text the turn said (a turn's `text`, an API model's own words).
pub fn turn_said(token: &str, text: &str) {
    if text.is_empty() {
        return;
    }
    if let Some(turn) = turns().lock().expect("turns lock").get_mut(token)
        && turn.said.len() < TURN_TEXTS_MAX
    {
        turn.said.push(text.to_string());
    }
}

fn turn_dispatched(token: &str, phase: &str) {
    if let Some(turn) = turns().lock().expect("turns lock").get_mut(token) {
        turn.dispatched.push(phase.to_string());
    }
}

/// A launch ended: the phases its words announced and it did not dispatch are flagged.
pub fn turn_end(engine: &Engine, l: &Launch) {
    let Some(turn) = turns().lock().expect("turns lock").remove(&l.token) else {
        return;
    };
    if let Err(r) = check_turn(engine, l, &turn) {
        tracing::warn!(launch = %l.id, collab = %turn.collab, "the orchestrator's turn was not checked: {r}");
    }
}

fn check_turn(engine: &Engine, l: &Launch, turn: &Turn) -> Result<(), Refusal> {
    let Some(c) = engine
        .collabs_running()?
        .into_iter()
        .find(|c| c.id == turn.collab)
    else {
        return Ok(());
    };
    let spec: Spec = serde_json::from_str(&c.spec)
        .map_err(|e| Refusal::storage(format!("collaboration {}: its spec: {e}", c.id)))?;
    let pack = load(&spec.pack, &spec.roles)?;
    let mut missing: Vec<&str> = Vec::new();
    for text in &turn.said {
        for p in orchestrate::announced(&pack, text) {
            if !turn.dispatched.iter().any(|d| d == p) && !missing.contains(&p) {
                missing.push(p);
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let me = caller(engine.collab_orchestrator_token(&c.id)?);
    let said: String = turn.said.join("\n").chars().take(1024).collect();
    tracing::warn!(collab = %c.id, agent = %turn.agent, "{ANNOUNCED_NOT_MADE}: {missing:?}");
    // under the collaboration's lock: two turns ending together number their flags apart
    let lock = room_collab::steer::lock(&c.id);
    let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
    engine.collab_flag(
        &me,
        &c.id,
        ANNOUNCED_NOT_MADE,
        &turn.agent,
        json!({"launch": l.id, "announced": missing, "dispatched": turn.dispatched,
            "said": said}),
    )
}
