//! An agent orchestrator's steering (issue 42 item 1): when a pack's `orchestrator` role is
//! bound to a backend, the scheduler's pass stops dispatching ready phases itself. It tells
//! the orchestrator's child what changed (a `send` on the goal task: a sealed wake to its
//! route, made only when something it was not told yet happened, never polled) and the agent
//! steers with Room's collaboration tools, which the engine authorizes by its scopes
//! (`Engine::collab_steer`):
//!
//! - `status` (`collab_status`, `session:read`): each phase's state, the ready list, runs,
//!   the blackboard's index (never contents), guards, children's live state, flags;
//! - `dispatch` (`collab_dispatch`, `session:dispatch`): one ready phase, named or selected
//!   by a purpose tag, begun as the scheduler begins it (guards, approvals, plans, trees);
//!   with `approve`, `collab_request_approval`: the phase into the person's queue instead;
//! - `close` (`collab_close`, `session:dispatch`): the collaboration finishes once every
//!   phase is done (`collab_phases_open` otherwise).
//!
//! Each runs the scheduler's machinery as the collaboration's root, under one lock per
//! collaboration that its pass takes too (a pass and a tool call never interleave on one).

use crate::orchestrate::{self, RunState};
use crate::pack::{ORCHESTRATOR, Pack};
use crate::scheduler::{Cx, Host, Spec, all_done, caller, guards_view, load, run_view};
use room_core::{Code, Refusal, Verb};
use room_engine::Engine;
use room_engine::principal::AgentCaller;
use room_engine::verbs::TurnArgs;
use room_store::control::{CollabRow, CollabRunRow};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

/// How long an orchestrator told something to act on may leave it before it is told again.
pub const RETELL_MS: u64 = 10 * 60_000;
/// Times in a row it is told the same again, at most.
pub const RETELLS_MAX: u32 = 3;

/// The run rows that record each wake told to the orchestrator (`@`: no phase is so named).
pub const TELL: &str = "tell@orchestrator";

/// One lock per collaboration, taken by the scheduler's pass and by every steering call.
pub fn lock(id: &str) -> Arc<Mutex<()>> {
    static LOCKS: LazyLock<Mutex<HashMap<String, Arc<Mutex<()>>>>> =
        LazyLock::new(Default::default);
    LOCKS
        .lock()
        .expect("collaboration locks")
        .entry(id.to_string())
        .or_default()
        .clone()
}

/// What the scheduler's pass needs to act as `id`'s root for a steering call.
struct Steered {
    c: CollabRow,
    spec: Spec,
    pack: Pack,
    me: AgentCaller,
}

fn steered(
    engine: &Engine,
    caller: &AgentCaller,
    id: &str,
    scope: &str,
) -> Result<Steered, Refusal> {
    let c = engine.collab_steer(caller, id, scope)?;
    let spec: Spec = serde_json::from_str(&c.spec)
        .map_err(|e| Refusal::storage(format!("collaboration {id}: its spec: {e}")))?;
    let pack = load(&spec.pack, &spec.roles)?;
    let me = caller_of(engine.collab_orchestrator_token(id)?);
    Ok(Steered { c, spec, pack, me })
}

fn caller_of(token: String) -> AgentCaller {
    caller(token)
}

/// `collab_status` for a steering agent (`session:read`).
pub fn status(engine: &Engine, caller: &AgentCaller, id: &str) -> Result<Value, Refusal> {
    let host: Arc<dyn Host> = Arc::new(crate::scheduler::InlineHost);
    let s = steered(engine, caller, id, "session:read")?;
    let l = lock(id);
    let _held = l.lock().unwrap_or_else(|e| e.into_inner());
    let cx = Cx {
        engine,
        me: &s.me,
        c: &s.c,
        spec: &s.spec,
        pack: &s.pack,
        host: &host,
    };
    let versions = cx.versions()?;
    let runs = engine.collab_runs(&s.me, id)?;
    let ready = cx.ready(&runs, &versions);
    let phases: Vec<Value> = s
        .pack
        .phases
        .iter()
        .map(|p| {
            let newest = runs
                .iter()
                .filter(|r| r.phase == p.name)
                .max_by_key(|r| r.run);
            let state = if ready.contains(&p.name) {
                "ready"
            } else {
                newest.map_or("waiting", |r| r.state.as_str())
            };
            let purposes = p
                .role
                .as_deref()
                .and_then(|r| s.pack.profile.role(r))
                .map(|r| r.purposes.clone())
                .unwrap_or_default();
            json!({"phase": p.name, "kind": p.kind.as_str(), "role": p.role, "purposes": purposes,
                "reads": p.reads.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
                "writes": p.writes.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
                "approve": p.approve, "state": state,
                "run": newest.map(|r| r.run), "task": newest.and_then(|r| r.task.clone())})
        })
        .collect();
    let index = engine.artifact_index(
        &s.me,
        &s.c.room,
        None,
        room_engine::blackboard::INDEX_PAGE_MAX,
    )?;
    let cost = engine.collab_cost(&s.me, id)?;
    let approvals = engine.collab_approvals(&s.me, id)?;
    Ok(json!({
        "collab": id, "goal": s.c.goal, "state": s.c.state,
        "ready": ready,
        "all_done": all_done(&s.pack, &runs),
        "phases": phases,
        "runs": runs.iter().filter(|r| r.phase != TELL).map(run_view).collect::<Vec<_>>(),
        "artifacts": index["artifacts"], "artifacts_next_after": index["next_after"],
        "approvals": approvals.iter().filter(|a| a.state == "pending")
            .map(|a| json!({"approval": a.id, "phase": a.phase, "run": a.run, "state": a.state}))
            .collect::<Vec<_>>(),
        "guards": guards_view(&s.pack, &s.spec, &runs, &cost),
        "children": engine.collab_children(&s.me, id)?,
        "flags": flags(&runs),
        "cost": {"tokens_in": cost["tokens_in"], "tokens_out": cost["tokens_out"], "usd": cost["usd"]},
    }))
}

/// The flags recorded on a collaboration, oldest first.
pub fn flags(runs: &[CollabRunRow]) -> Vec<Value> {
    let mut out: Vec<&CollabRunRow> = runs
        .iter()
        .filter(|r| r.phase.starts_with("flag@"))
        .collect();
    out.sort_by_key(|r| (r.started_ms, r.run));
    out.iter()
        .map(|r| {
            let v: Value = serde_json::from_str(&r.reads).unwrap_or(Value::Null);
            json!({"code": r.phase.trim_start_matches("flag@"), "n": r.run, "agent": v["agent"],
                "detail": v["detail"], "at_ms": r.started_ms})
        })
        .collect()
}

/// `collab_dispatch` (and, with `approve`, `collab_request_approval`): one ready phase,
/// named or picked by purpose, begun as the scheduler begins it. The phase is recorded as
/// dispatched in the caller's turn.
pub fn dispatch(
    engine: &Engine,
    caller: &AgentCaller,
    id: &str,
    phase: Option<&str>,
    purpose: Option<&str>,
    approve: bool,
    host: &Arc<dyn Host>,
) -> Result<Value, Refusal> {
    let s = steered(engine, caller, id, "session:dispatch")?;
    let l = lock(id);
    let _held = l.lock().unwrap_or_else(|e| e.into_inner());
    let cx = Cx {
        engine,
        me: &s.me,
        c: &s.c,
        spec: &s.spec,
        pack: &s.pack,
        host,
    };
    let versions = cx.versions()?;
    let runs = engine.collab_runs(&s.me, id)?;
    let ready = cx.ready(&runs, &versions);
    let ready_refs: Vec<&str> = ready.iter().map(String::as_str).collect();
    let name = orchestrate::pick(&s.pack, &ready_refs, phase, purpose)?;
    let p = s.pack.phase(name).expect("pick names a phase of the pack");
    let run = runs
        .iter()
        .filter(|r| r.phase == name)
        .map(|r| r.run)
        .max()
        .unwrap_or(0)
        + 1;
    // a phase that plans first plans first, whichever way it is begun
    let planned = match p.plan {
        true => cx.plan(p)?,
        false => None,
    };
    let row = match (planned, approve) {
        (Some(plan), _) => plan,
        (None, true) => cx.begin_approval(p, run, &versions)?,
        (None, false) => cx.begin(p, run, &versions)?,
    };
    Ok(
        json!({"collab": id, "phase": name, "run": row.run, "state": row.state, "task": row.task,
        "note": match row.state.as_str() {
            "approval" => "waiting in the person's approval queue",
            "dispatching" => "held by a guard: it is dispatched when the guard lets it (collab_status says which)",
            _ => "dispatched",
        }}),
    )
}

/// `collab_close`: every phase done, the goal task closes and the collaboration finishes;
/// otherwise `collab_phases_open` naming each phase not done.
pub fn close(
    engine: &Engine,
    caller: &AgentCaller,
    id: &str,
    host: &Arc<dyn Host>,
) -> Result<Value, Refusal> {
    let s = steered(engine, caller, id, "session:dispatch")?;
    let l = lock(id);
    let _held = l.lock().unwrap_or_else(|e| e.into_inner());
    let runs = engine.collab_runs(&s.me, id)?;
    if !all_done(&s.pack, &runs) {
        let open: Vec<Value> = s
            .pack
            .phases
            .iter()
            .filter_map(|p| {
                let newest = runs
                    .iter()
                    .filter(|r| r.phase == p.name)
                    .max_by_key(|r| r.run);
                let state = newest.map_or("waiting", |r| r.state.as_str());
                (state != "done").then(|| json!({"phase": p.name, "state": state}))
            })
            .collect();
        return Err(Refusal::new(
            Code::CollabPhasesOpen,
            format!("{} phases of collaboration {id} are not done", open.len()),
        )
        .detail(json!({"open": open}))
        .hint("dispatch what is ready (collab_status), or leave a failed phase to the person"));
    }
    let cx = Cx {
        engine,
        me: &s.me,
        c: &s.c,
        spec: &s.spec,
        pack: &s.pack,
        host,
    };
    cx.finish()?;
    Ok(json!({"collab": id, "state": "done"}))
}

impl Cx<'_> {
    /// Tell the orchestrator's child what it was not told yet (`orchestrate::news`): a send
    /// on the goal task, recorded first as a `tell@orchestrator` run (`telling`, then
    /// `told`), its idempotency key that run's, so a crash between sends it once.
    pub(crate) fn tell(&self, ready: &[String], runs: &[CollabRunRow]) -> Result<(), Refusal> {
        let Some(agent) = self.spec.agents.get(ORCHESTRATOR) else {
            return Ok(());
        };
        let states: Vec<RunState<'_>> = runs
            .iter()
            .filter(|r| self.pack.phase(&r.phase).is_some() || r.phase.starts_with("plan@"))
            .map(|r| RunState {
                phase: &r.phase,
                run: r.run,
                state: &r.state,
            })
            .collect();
        let ready_refs: Vec<&str> = ready.iter().map(String::as_str).collect();
        let now = orchestrate::news(self.pack, &ready_refs, &states);
        let newest = runs
            .iter()
            .filter(|r| r.phase == TELL)
            .max_by_key(|r| r.run);
        let told: Vec<String> = newest
            .and_then(|r| serde_json::from_str::<Value>(&r.reads).ok())
            .and_then(|v| serde_json::from_value(v["told"].clone()).ok())
            .unwrap_or_default();
        let mut row = match newest {
            Some(r) if r.state == "telling" => r.clone(),
            _ => {
                let new = orchestrate::untold(&told, &now);
                let retell = match newest {
                    Some(r) if new.is_empty() => self.retell(r, &now),
                    _ => Some(0),
                };
                let Some(retell) = retell.filter(|n| *n > 0 || !new.is_empty()) else {
                    return Ok(());
                };
                let row = CollabRunRow {
                    collab: self.c.id.clone(),
                    phase: TELL.into(),
                    run: newest.map_or(0, |r| r.run) + 1,
                    task: Some(self.spec.goal_task.clone()),
                    state: "telling".into(),
                    reads: json!({"told": now, "new": new, "ready": ready, "retell": retell})
                        .to_string(),
                    started_ms: self.engine.now_ms(),
                    ended_ms: None,
                };
                self.put(&row)?;
                row
            }
        };
        // the root holds the goal task: a send on it needs its lifecycle begun
        let goal = &self.spec.goal_task;
        if self.engine.task_show(self.me, goal)?["task"]["status"] == "open" {
            self.engine.task_claim(self.me, goal, None)?;
        }
        let v: Value = serde_json::from_str(&row.reads).unwrap_or(Value::Null);
        let text = self.news_text(&v);
        let key = format!("{}.tell.{}.send", self.c.id, row.run);
        let sent = self.act(|| {
            self.engine.turn(
                self.me,
                Verb::Send,
                TurnArgs {
                    room: self.c.room.clone(),
                    text: Some(text.clone()),
                    to: vec![agent.clone()],
                    task: Some(self.spec.goal_task.clone()),
                    idempotency_key: Some(key.clone()),
                    ..TurnArgs::default()
                },
            )
        });
        match sent {
            Ok(_) => {}
            Err(e) if crate::scheduler::is_repeat(&e) => {}
            Err(e) => return Err(e),
        }
        row.state = "told".into();
        row.ended_ms = Some(self.engine.now_ms());
        self.put(&row)
    }

    /// Nothing new, but something to act on (a phase ready, or every phase done) that the
    /// orchestrator was told `RETELL_MS` ago and has not acted on (its turn failed, or ended
    /// without a word): it is told again, at most `RETELLS_MAX` times in a row. The retell's
    /// number, if one is due.
    fn retell(&self, last: &CollabRunRow, now: &[String]) -> Option<u32> {
        let actionable = now
            .iter()
            .any(|i| i.starts_with("ready:") || i == "all_done");
        let since = self.engine.now_ms().saturating_sub(last.ended_ms?);
        let before: u32 = serde_json::from_str::<Value>(&last.reads)
            .ok()
            .and_then(|v| v["retell"].as_u64())
            .unwrap_or(0) as u32;
        (actionable && since >= RETELL_MS && before < RETELLS_MAX).then_some(before + 1)
    }

    /// What a wake tells the orchestrator: its choreography (the pack's prompt file), the
    /// collaboration, what is new, what is ready.
    fn news_text(&self, v: &Value) -> String {
        let prompt = self
            .pack
            .orchestrator_prompt
            .as_ref()
            .and_then(|p| self.spec.prompts.get(p))
            .cloned()
            .unwrap_or_default();
        let list = |k: &str| {
            let items: Vec<&str> = v[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if items.is_empty() {
                "nothing".to_string()
            } else {
                items.join(", ")
            }
        };
        let done = v["told"]
            .as_array()
            .is_some_and(|a| a.iter().any(|i| i == "all_done"));
        format!(
            "{prompt}\n\nCollaboration: {} (the id for the collab_* tools)\nGoal: {}\nNew since your last wake: {}\nReady now: {}{}",
            self.c.id,
            self.c.goal,
            match v["retell"].as_u64() {
                Some(n) if n > 0 => format!(
                    "nothing (reminder {n} of {RETELLS_MAX}: what is ready has waited since your last wake)"
                ),
                _ => list("new"),
            },
            list("ready"),
            if done {
                "\nEvery phase is done: close the collaboration with collab_close."
            } else {
                ""
            }
        )
    }
}
