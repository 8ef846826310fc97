//! The session factory's ledger, as the owner reads it: every native session an adapter opened
//! or loaded for a launch, under its global id `sf_<host>_<native>`, with its lane (agent),
//! working directory, transport, proof cursor (the rung its newest launch reached), lease (its
//! newest launch), whether it can be resumed and whether the agent's wakes are bound to it.
//! The sessions are written with their launch's end (`Engine::launch_ended`), in the same
//! transaction.

use crate::{Engine, Outcome, store_err};
use room_core::{Code, Refusal};
use room_store::control::{SESSIONS_PAGE_MAX, SessionRow};
use serde_json::{Value, json};

/// A session as the owner reads it. `parent` is set only by a fork, which no adapter offers
/// (`room adapters list`): it is null, never inferred from an earlier session.
fn view(s: &SessionRow) -> Value {
    let model = s
        .model
        .as_deref()
        .map(|m| serde_json::from_str::<Value>(m).unwrap_or_else(|_| json!(m)));
    json!({"id": s.id, "agent": s.agent, "lane": s.agent, "host": s.host, "native": s.native, "cwd": s.cwd,
        "transport": s.transport, "model_profile": model, "proof": s.proof, "parent": s.parent,
        "lease": {"launch": s.launch}, "launches": s.launches, "loadable": s.loadable,
        "bound": s.bound, "tags": s.tags, "created_ms": s.created_ms, "updated_ms": s.updated_ms})
}

impl Engine {
    /// Sessions newest first, of one agent or all (at most `SESSIONS_PAGE_MAX`).
    pub fn sessions_view(&self, _owner: &crate::Owner, agent: Option<&str>) -> Outcome<Value> {
        if let Some(a) = agent {
            self.control()
                .agent(a)
                .map_err(store_err)?
                .ok_or_else(|| Refusal::new(Code::NotFound, format!("no agent {a}")))?;
        }
        let rows = self
            .control()
            .sessions(agent, SESSIONS_PAGE_MAX)
            .map_err(store_err)?;
        let truncated = rows.len() >= SESSIONS_PAGE_MAX;
        Ok(
            json!({"sessions": rows.iter().map(view).collect::<Vec<_>>(),
            "truncated": truncated}),
        )
    }

    /// One session, with its launches' outcomes.
    pub fn session_show(&self, _owner: &crate::Owner, id: &str) -> Outcome<Value> {
        let s = self
            .control()
            .session(id)
            .map_err(store_err)?
            .ok_or_else(|| {
                Refusal::new(Code::NotFound, format!("no session {id}"))
                    .hint("room sessions list shows the sessions Room keeps")
            })?;
        Ok(view(&s))
    }
}
