//! Sealed wake permits. One permit per recipient of a waking turn, sealed after flush 2 and
//! queued in control.db's `wakes` table under its canonical path
//! `wakes/<room>/<agent>/<source_event>.json` (the path dispatch will give the worker's claim).
//! The permit's 18 fields are bound by `binding_sha256`; `not_after` is exactly creation plus
//! the deadline, so queue time consumes it. `dispatch` revalidates queued permits; here they
//! are sealed, queued and listed. A permit is derived from the journal
//! (its turn and items records), so it trails the journal like the index does: held by its room
//! until the next flush writes every room's new permits in one transaction
//! (`Engine::flush_wakes`), and re-derived at start for every items record after the room's
//! wakes mark. One transaction per flush instead of a file and an fsync per permit: creating a
//! file per waking turn cost the daemon about a tenth of its CPU under the swarm benchmark.

use crate::event::{Items, Turn};
use crate::room::RoomHandle;
use crate::{Engine, Outcome, store_err};
use room_core::wake::{RoomAuthority, WAKE_SCHEMA, WakeBinding, WakePermit, rfc3339_ms, wake_path};
use room_core::{Code, Refusal};
use room_store::control::WakeRow;
use room_store::index::EventRow;
use serde_json::{Value, json};

/// Queued permits `whoami` shows an agent (the oldest).
pub const WAKES_OF_AGENT_MAX: usize = 16;

/// Prompts longer than this are cut in the permit; the full text stays in the room.
const PROMPT_BYTES_MAX: usize = 4096;
const PULSE_BYTES_MAX: usize = 160;

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl Engine {
    pub(crate) fn queue_wakes(
        &self,
        h: &mut RoomHandle,
        source: &EventRow,
        t: &Turn,
        items: &Items,
    ) -> Outcome<Vec<WakePermit>> {
        if items.wakes.is_empty() {
            return Ok(vec![]);
        }
        let redactor = self.policy();
        let redactor = redactor.redactor()?;
        // Copy what the permits need, then let go of the control lock before any fsync.
        let (room, epoch, recipients) = {
            let c = self.control();
            let room = c
                .room(&h.name)
                .map_err(store_err)?
                .ok_or_else(|| Refusal::new(Code::RoomNotFound, "room vanished"))?;
            let epoch = c.control_epoch().map_err(store_err)?;
            let mut recipients = Vec::new();
            for agent in &items.wakes {
                recipients.extend(c.agent(agent).map_err(store_err)?);
            }
            (room, epoch, recipients)
        };
        let text = t
            .text
            .clone()
            .or_else(|| t.text_blob.as_ref().map(|b| b.preview.clone()))
            .unwrap_or_default();
        let prompt = redactor.redact(&cut(&text, PROMPT_BYTES_MAX)).into_owned();
        let pulse = redactor.redact(&cut(&text, PULSE_BYTES_MAX)).into_owned();
        let owner_grant = self.room_grant(&room)?;
        // not_after is exactly created + deadline; a circle keeps its obligation's original
        // deadline, so its budget is what is left of it
        let deadline_ms = if t.verb == room_core::Verb::Circle {
            t.plan.not_after_ms.saturating_sub(source.hlc_ms)
        } else {
            t.plan.deadline_ms
        };
        let circled: Vec<String> = t.detail["obligation"]
            .as_str()
            .filter(|_| t.verb == room_core::Verb::Circle)
            .map(String::from)
            .into_iter()
            .collect();
        let mut out = Vec::new();
        for recipient in &recipients {
            let agent = &recipient.name;
            let rel = wake_path(&h.name, agent, &source.id);
            let binding = WakeBinding {
                schema: WAKE_SCHEMA.into(),
                room: h.name.clone(),
                agent: agent.clone(),
                from: t.actor.clone(),
                source_event: source.id.clone(),
                path: rel.clone(),
                prompt: prompt.clone(),
                task: t.task.clone(),
                evidence_refs: if t.evidence.is_empty() {
                    None
                } else {
                    Some(t.evidence.clone())
                },
                mention_ids: items
                    .mentions
                    .iter()
                    .filter(|m| &m.agent == agent)
                    .map(|m| m.id.clone())
                    .collect(),
                obligation_ids: items
                    .obligations
                    .iter()
                    .filter(|m| &m.agent == agent)
                    .map(|m| m.id.clone())
                    .chain(circled.iter().cloned())
                    .collect(),
                pulse_message: pulse.clone(),
                deadline_ms,
                created_at: rfc3339_ms(source.hlc_ms),
                not_after: rfc3339_ms(source.hlc_ms.saturating_add(deadline_ms)),
                control_epoch: epoch,
                room_authority: RoomAuthority {
                    owner_grant: owner_grant.clone(),
                    revision: room.revision,
                    reset_at: room.reset_ms.map(rfc3339_ms),
                    session: self.state.instance_id.clone(),
                },
                registration_sha256: recipient.registration_sha256.clone(),
            };
            let permit = binding.seal();
            h.wakes_pending.push(WakeRow {
                room: h.name.clone(),
                agent: agent.clone(),
                source_event: source.id.clone(),
                created_ms: source.hlc_ms,
                permit: serde_json::to_string(&permit).map_err(Refusal::storage)?,
                state: room_store::control::WAKE_QUEUED.into(),
                reason: None,
                detail: None,
            });
            out.push(permit);
        }
        Ok(out)
    }

    /// The wake queue, optionally for one room, oldest first. Permits sealed since the last
    /// flush are queued first, so the list is complete. Each is checked against its digest.
    pub fn wakes_view(&self, _owner: &crate::Owner, room: Option<&str>) -> Outcome<Value> {
        if let Some(r) = room {
            self.room_handle(r)?;
        }
        self.flush_wakes();
        let rows = self.control().wakes(room).map_err(store_err)?;
        let truncated = rows.len() >= room_store::control::WAKES_PAGE_MAX;
        let out: Vec<Value> = rows.iter().map(|w| self.wake_view(w)).collect();
        // the oldest WAKES_PAGE_MAX permits; say so rather than hide the rest
        Ok(json!({"wakes": out, "truncated": truncated}))
    }

    /// One permit `wakes list` prints, by the path it prints (`wakes/<room>/<agent>/<event>.json`).
    pub fn wake_show(&self, _owner: &crate::Owner, path: &str) -> Outcome<Value> {
        let parts = path
            .strip_prefix("wakes/")
            .and_then(|p| p.strip_suffix(".json"))
            .map(|p| p.split('/').collect::<Vec<_>>());
        let Some([room, agent, event]) = parts.as_deref() else {
            return Err(Refusal::invalid(
                "wake",
                "not a wake path (wakes/<room>/<agent>/<event>.json, as wakes list prints it)",
            ));
        };
        room_core::name::validate("wake", room)?;
        room_core::name::validate("wake", agent)?;
        self.room_handle(room)?;
        self.flush_wakes();
        let row = self.control().wake(room, agent, event).map_err(store_err)?;
        let w = row.ok_or_else(|| {
            Refusal::new(Code::NotFound, format!("no wake {path}"))
                .hint("room wakes list ROOM prints the permits there are")
        })?;
        Ok(json!({"wake": self.wake_view(&w)}))
    }

    /// A permit as the owner sees it: its sealed fields, whether they still match their
    /// digest, its dispatch state, launches, deferral and dead letter.
    fn wake_view(&self, w: &WakeRow) -> Value {
        match serde_json::from_str::<WakePermit>(&w.permit) {
            Ok(p) => {
                let intact = p.intact();
                let mut v = serde_json::to_value(&p).expect("permits serialize");
                v["intact"] = json!(intact);
                v["state"] = json!(w.state);
                v["launches"] = self.launches_view(w);
                if w.state == room_store::control::WAKE_QUEUED {
                    let d = self
                        .deferrals
                        .of(&wake_path(&w.room, &w.agent, &w.source_event));
                    v["deferred"] = json!(d.as_ref().map(|d| d.code));
                    if let Some(m) = d.and_then(|d| d.model_route) {
                        v["deferred_model_route"] = json!(m);
                    }
                }
                if w.state == room_store::control::WAKE_DEAD {
                    v["dead_letter"] = json!({"code": w.reason, "reason": w.detail,
                        "retry_allowed": false});
                }
                v
            }
            Err(e) => json!({
                "path": wake_path(&w.room, &w.agent, &w.source_event),
                "intact": false,
                "error": e.to_string(),
            }),
        }
    }

    /// The wakes waiting for `agent`, as it sees them itself (`whoami`): its queued permits,
    /// oldest first (an agent without a route takes them in its own session), and, for a
    /// worker's one-launch credential, the wake its launch delivers with the evidence
    /// receipt.
    pub(crate) fn wakes_of(&self, agent: &str, token: &str) -> Outcome<Value> {
        let view = |w: &WakeRow| -> Value {
            match serde_json::from_str::<WakePermit>(&w.permit) {
                Ok(p) => {
                    let b = &p.binding;
                    json!({"room": b.room, "from": b.from, "task": b.task,
                        "source_event": b.source_event, "prompt": b.prompt,
                        "mention_ids": b.mention_ids, "obligation_ids": b.obligation_ids,
                        "not_after": b.not_after, "state": w.state})
                }
                Err(_) => json!({"room": w.room, "source_event": w.source_event,
                    "state": w.state, "intact": false}),
            }
        };
        let queued = self
            .control()
            .wakes_queued_of(&[agent.to_string()], WAKES_OF_AGENT_MAX)
            .map_err(store_err)?;
        let mut out = json!({"queued": queued.iter().map(view).collect::<Vec<_>>()});
        if token.starts_with(crate::dispatch::WORKER_TOKEN_PREFIX) {
            let digest = room_core::sha256_hex(token.as_bytes());
            // bound first: the control store's guard must not live through the body
            let launch = self
                .control()
                .launch_by_secret(&digest)
                .map_err(store_err)?;
            if let Some(l) = launch {
                let w = self
                    .control()
                    .wake(&l.room, &l.agent, &l.source_event)
                    .map_err(store_err)?;
                let delivery = l
                    .delivery
                    .as_deref()
                    .and_then(|d| serde_json::from_str::<Value>(d).ok());
                out["this_launch"] = json!({"launch": l.id, "not_after_ms": l.not_after_ms,
                    "wake": w.as_ref().map(view), "evidence": delivery});
            }
        }
        Ok(out)
    }

    /// A permit's launches as the wakes view shows them: each attempt's proof rung and what
    /// its adapter reported. A store error is shown, not hidden.
    fn launches_view(&self, w: &room_store::control::WakeRow) -> Value {
        let rows = match self
            .control()
            .launches_of_wake(&w.room, &w.agent, &w.source_event)
        {
            Ok(rows) => rows,
            Err(e) => return json!({"error": e.to_string()}),
        };
        let mut out = Vec::new();
        for l in rows {
            // stored by `launch_ended` as {"adapter": …, "job": …}
            let detail: Value = l
                .detail
                .as_deref()
                .map(|d| serde_json::from_str(d).unwrap_or_else(|_| json!({"adapter": d})))
                .unwrap_or(Value::Null);
            out.push(json!({"launch": l.id, "state": l.state, "pid": l.pid,
                "created_ms": l.created_ms, "started_ms": l.started_ms, "ended_ms": l.ended_ms,
                "outcome": l.outcome,
                "proof": l.proof.as_deref().unwrap_or("dispatched"),
                "adapter": detail["adapter"], "job": detail["job"],
                "delivery": l.delivery.as_deref().and_then(|d| serde_json::from_str::<Value>(d).ok())}));
            if let Some(cut) = l.severed.as_deref() {
                let last = out.last_mut().expect("just pushed");
                last["severed_mid_response"] = serde_json::from_str(cut).unwrap_or(json!(cut));
            }
        }
        json!(out)
    }
}
