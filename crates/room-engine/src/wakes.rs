//! Sealed wake permits. One permit per recipient of a waking turn, written to the queue as
//! `wakes/<room>/<agent>/<source_event>.json` after flush 2. The permit's 18 fields are bound by
//! `binding_sha256`; `not_after` counts from creation, so queue time consumes the deadline.
//! Dispatch (revalidating the five authority centres) is a later stage; here permits are sealed,
//! queued and listed. A permit is derived from the journal (its turn and items records), so it
//! trails the journal like the index does: written at once, fsynced in a batch with the next
//! index flush, and re-derived at start for every items record after the room's wakes mark.

use crate::event::{Items, Turn};
use crate::room::RoomHandle;
use crate::{Engine, Outcome, store_err};
use room_core::wake::{RoomAuthority, WAKE_SCHEMA, WakeBinding, WakePermit, rfc3339_ms};
use room_core::{Code, Refusal};
use room_store::index::EventRow;
use serde_json::{Value, json};

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
        let mut out = Vec::new();
        for recipient in &recipients {
            let agent = &recipient.name;
            let rel = format!("wakes/{}/{}/{}.json", h.name, agent, source.id);
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
                    .collect(),
                pulse_message: pulse.clone(),
                deadline_ms: t.plan.deadline_ms,
                created_at: rfc3339_ms(source.hlc_ms),
                not_after: rfc3339_ms(t.plan.not_after_ms),
                control_epoch: epoch,
                room_authority: RoomAuthority {
                    owner_grant: format!("grant:{}", room.graph_id),
                    revision: room.revision,
                    reset_at: room.reset_ms.map(rfc3339_ms),
                    session: self.state.instance_id.clone(),
                },
                registration_sha256: recipient.registration_sha256.clone(),
            };
            let permit = binding.seal();
            let path = self.state.root.join(&rel);
            let dir = path.parent().expect("wake path has a parent");
            if !dir.exists() {
                std::fs::create_dir_all(dir).map_err(Refusal::storage)?;
                // the queue's new directories must be durable before the permit in them
                for d in [
                    dir,
                    dir.parent().unwrap_or(dir),
                    self.state.wakes().as_path(),
                ] {
                    room_store::fs::sync_dir(d).map_err(Refusal::storage)?;
                }
            }
            let bytes = serde_json::to_vec_pretty(&permit).map_err(Refusal::storage)?;
            // Permits are derived from the journal: written now, synced with the next index
            // flush (`RoomHandle::sync_wakes`), re-derived at start for anything after the mark.
            if !room_store::fs::create_new_unsynced(&path, &bytes).map_err(Refusal::storage)? {
                // a permit already there (re-derivation) stays if it is whole and sealed
                let whole = std::fs::read(&path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<WakePermit>(&b).ok())
                    .is_some_and(|p| p.intact());
                if !whole {
                    tracing::warn!(path = %path.display(), "replacing a damaged wake permit");
                    room_store::fs::write_atomic(&path, &bytes).map_err(Refusal::storage)?;
                }
            }
            h.wakes_unsynced.push(path);
            out.push(permit);
        }
        Ok(out)
    }

    /// The wake queue, optionally for one room. Each permit is checked against its digest.
    pub fn wakes_view(&self, _owner: &crate::Owner, room: Option<&str>) -> Outcome<Value> {
        let base = self.state.wakes();
        let mut out = Vec::new();
        let rooms: Vec<String> = match room {
            Some(r) => {
                self.room_handle(r)?;
                vec![r.to_string()]
            }
            None => self
                .control()
                .rooms()
                .map_err(store_err)?
                .into_iter()
                .map(|r| r.name)
                .collect(),
        };
        for r in rooms {
            let Ok(agents) = std::fs::read_dir(base.join(&r)) else {
                continue;
            };
            for agent in agents.flatten() {
                let Ok(files) = std::fs::read_dir(agent.path()) else {
                    continue;
                };
                for f in files.flatten() {
                    let bytes = std::fs::read(f.path()).map_err(Refusal::storage)?;
                    match serde_json::from_slice::<WakePermit>(&bytes) {
                        Ok(p) => {
                            let intact = p.intact();
                            let mut v = serde_json::to_value(&p).expect("permits serialize");
                            v["intact"] = json!(intact);
                            out.push(v);
                        }
                        Err(e) => out.push(json!({"path": f.path().display().to_string(), "intact": false, "error": e.to_string()})),
                    }
                }
            }
        }
        out.sort_by(|a, b| {
            a["created_at"]
                .as_str()
                .cmp(&b["created_at"].as_str())
                .then(a["path"].as_str().cmp(&b["path"].as_str()))
        });
        Ok(json!({"wakes": out}))
    }
}
